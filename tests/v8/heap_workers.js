// Two worker_threads: alpha builds a 100,000-object table at start-up, held by a module
// variable a closure keeps (as a Worker's module scope holds its start-up data), and prints
// the heap it grew by; beta holds nothing of the kind. Both then idle for argv[2] seconds. A
// heap capture of alpha must put the table under its variable; beta's must not hold it
// (tests/v8/test_v8.c, node_heap_capture). Run with --expose-gc.
const { Worker, isMainThread, workerData } = require('node:worker_threads');
// module scope: V8 names a module's variables in its snapshots (a block's `let` it does not)
const HOARD = [];

if (isMainThread) {
  const seconds = Number(process.argv[2] || 20);
  const workers = ['alpha', 'beta'].map((name) => new Worker(__filename, { name, workerData: { name, seconds } }));
  let left = workers.length;
  for (const w of workers) w.on('exit', () => { if (--left === 0) process.exit(0); });
} else {
  const { name, seconds } = workerData;
  if (name === 'alpha') {
    gc();
    const h0 = process.memoryUsage().heapUsed;
    for (let i = 0; i < 100000; i++) HOARD.push({ id: i, name: 'item' + i, tags: [i, i + 1] });
    gc();
    console.log(`alpha grew ${process.memoryUsage().heapUsed - h0}`);
  }
  globalThis.keep = () => HOARD.length;
  const t = setInterval(() => {}, 100);
  setTimeout(() => clearInterval(t), seconds * 1000);
}
