// Two worker_threads, alpha and beta, each burning CPU without pause in a function of its
// own (alphaOnly, betaOnly) for argv[2] seconds: a capture of one isolate must hold that
// isolate's function alone (tests/v8/test_v8.c, node_capture).
const { Worker, isMainThread, workerData } = require('node:worker_threads');

function burnFor(ms) {
  let x = 0;
  const end = Date.now() + ms;
  while (Date.now() < end) for (let i = 0; i < 1000; i++) x += Math.sqrt(i * x + 1);
  return x;
}
// alpha keeps its last 64 tables (~2 MB): an alloc capture has live samples to show
const kept = [];
function alphaTable() { return Array.from({ length: 1000 }, (_, i) => ({ i, s: 'r' + i })); }
function alphaOnly() { kept.push(alphaTable()); if (kept.length > 64) kept.shift(); return burnFor(20); }
function betaOnly() { return burnFor(20); }

if (isMainThread) {
  const seconds = Number(process.argv[2] || 8);
  const workers = ['alpha', 'beta'].map((name) => new Worker(__filename, { name, workerData: { name, seconds } }));
  let left = workers.length;
  for (const w of workers) w.on('exit', () => { if (--left === 0) process.exit(0); });
} else {
  const { name, seconds } = workerData;
  const end = Date.now() + seconds * 1000;
  while (Date.now() < end) (name === 'alpha' ? alphaOnly : betaOnly)();
}
