// A workload that keeps compiling new code (bench/collector/perfmap.sh): COUNT rounds, each
// making a new function from source text, warming it up until V8 compiles it, and calling
// it; V8 appends each new code object to the perf map. A fixed amount of work, so CPU time
// compares across runs. Usage: node compile.js [COUNT]
const count = parseInt(process.argv[2] || '4000', 10);
let acc = 0;
for (let n = 0; n < count; n++) {
  const f = new Function('x', `let s = ${n}; for (let i = 0; i < x; i++) s += (i * ${n}) % 7; return s;`);
  for (let k = 0; k < 200; k++) acc += f(200);
}
console.log(count, acc > 0);
