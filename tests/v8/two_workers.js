// Two worker_threads, each its own V8 isolate, burning CPU in named functions at 3:1, and a
// main thread that builds and keeps a large structure at start-up (inuse by its builder).
const { Worker, isMainThread, workerData } = require('node:worker_threads');

function burn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x += Math.sqrt(i * x + 1);
  return x;
}
// 3:1 by work, not by clock (a wall-clock slice gets less CPU the more its thread waits for
// one): ~28 and ~9 ms of CPU here, 3.00 timed with process.cpuUsage.
function hotAlpha() { return burn(3000000); } // 3 parts
function hotBeta() { return burn(1000000); }  // 1 part

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
  // both workers run both functions, each its own mix: alpha hotAlpha:hotBeta 3:1, beta
  // hotBeta:hotAlpha 3:1 (9 calls of hotBeta, 3 parts of hotAlpha)
  while (Date.now() < end) {
    if (name === 'alpha') {
      hotAlpha(); hotBeta();
    } else {
      for (let i = 0; i < 9; i++) hotBeta();
      hotAlpha();
    }
  }
}
