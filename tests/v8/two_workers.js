// Two worker_threads, each its own V8 isolate, burning CPU in named functions at 3:1, and a
// main thread that builds and keeps a large structure at start-up (inuse by its builder).
const { Worker, isMainThread, workerData } = require('node:worker_threads');

function burnFor(ms) {
  let x = 0;
  const end = Date.now() + ms;
  while (Date.now() < end) for (let i = 0; i < 1000; i++) x += Math.sqrt(i * x + 1);
  return x;
}
// Slices of tens of ms: a scheduler's preemption (a few ms, charged by V8's wall-clock
// sampler to the function it interrupts) is small beside each, so the 3:1 holds under load.
function hotAlpha() { return burnFor(30); } // 3 parts
function hotBeta() { return burnFor(10); }  // 1 part

if (isMainThread) {
  function buildBigTable() {
    const t = [];
    for (let i = 0; i < 300000; i++) t.push({ id: i, name: 'row' + i, tags: [i, i + 1] });
    return t;
  }
  globalThis.kept = buildBigTable();
  const seconds = Number(process.argv[2] || 8);
  const workers = ['alpha', 'beta'].map((name) => new Worker(__filename, { name, workerData: { name, seconds } }));
  let left = workers.length;
  for (const w of workers) w.on('exit', () => { if (--left === 0) process.exit(0); });
} else {
  const { name, seconds } = workerData;
  const end = Date.now() + seconds * 1000;
  // both workers run both functions, each its own mix: alpha hotAlpha:hotBeta 3:1 (30 ms,
  // 10 ms), beta hotBeta:hotAlpha 3:1 (9 x 10 ms, 30 ms)
  while (Date.now() < end) {
    if (name === 'alpha') {
      hotAlpha(); hotBeta();
    } else {
      for (let i = 0; i < 9; i++) hotBeta();
      hotAlpha();
    }
  }
}
