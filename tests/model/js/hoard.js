// A module-scope table held by a variable a closure keeps (as a Worker's start-up data),
// and the heap's growth it caused, measured by V8 after collections; then a heap snapshot
// into argv[2] (test_heapsnap.c, test_heap). Run with --expose-gc; HOARD_N objects (100,000).
const v8 = require('v8');
gc();
gc();
const h0 = process.memoryUsage().heapUsed;
const HOARD = [];
const n = Number(process.env.HOARD_N || 100000);
for (let i = 0; i < n; i++) HOARD.push({ id: i, name: 'item' + i, tags: [i, i + 1] });
globalThis.keep = () => HOARD.length;
setTimeout(() => {
  gc();
  gc();
  const h1 = process.memoryUsage().heapUsed;
  v8.writeHeapSnapshot(process.argv[2]);
  console.log(h1 - h0);
}, 10);
