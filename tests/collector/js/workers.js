// The workload of test_js's worker test: two named worker_threads ("alpha", "beta"), one
// unnamed, and the main thread, each burning its own named function for SECONDS (each
// function loops itself, so no JIT inlining can fold it into a shared caller).
// Usage: node workers.js [SECONDS]
const { Worker, isMainThread, workerData } = require('worker_threads');
const secs = parseFloat(process.argv[2] || '1.5');
const until = Date.now() + secs * 1000;
// one line each: the bodies differ only in their constants
function alphaWork() { let y = 0; while (Date.now() < until) for (let i = 0; i < 1e5; i++) y = (y * 31 + i) % 1000003; return y; }
function betaWork() { let y = 0; while (Date.now() < until) for (let i = 0; i < 1e5; i++) y = (y * 37 + i) % 1000033; return y; }
function thirdWork() { let y = 0; while (Date.now() < until) for (let i = 0; i < 1e5; i++) y = (y * 41 + i) % 1000037; return y; }
function mainWork() { let y = 0; while (Date.now() < until) for (let i = 0; i < 1e5; i++) y = (y * 43 + i) % 1000039; return y; }
if (isMainThread) {
  const argv = [String(secs)];
  new Worker(__filename, { argv, name: 'alpha', workerData: 'alpha' });
  new Worker(__filename, { argv, name: 'beta', workerData: 'beta' });
  new Worker(__filename, { argv, workerData: 'third' });
  mainWork();
} else if (workerData === 'alpha') {
  alphaWork();
} else if (workerData === 'beta') {
  betaWork();
} else {
  thirdWork();
}
