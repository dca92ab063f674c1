// Cold code, as a large program's start-up or rarely run paths: thousands of distinct
// functions, each run once, so V8 interprets them (no baseline or optimized code) for
// argv[2] seconds. Under the perf map without --interpreted-frames-native-stack their time
// sits in V8's one InterpreterEntryTrampoline (tests/collector/test_js.c).
const end = Date.now() + Number(process.argv[2] || 2) * 1000;
let k = 0, s = 0;
while (Date.now() < end) {
  const f = new Function('n', `let x = ${k++}; for (let i = 0; i < n; i++) x += (i * ${k}) % 7; return x;`);
  s += f(3000);
}
console.log('functions', k, s > 0);
