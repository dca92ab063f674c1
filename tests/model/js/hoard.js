// A module-scope table held by a variable a closure keeps (as a Worker's start-up data),
// and the heap's growth it caused, measured by V8 after collections; then a heap snapshot
// into argv[2] (test_heapsnap.c). Run with --expose-gc.
const v8 = require('v8');
gc();
gc();
const h0 = process.memoryUsage().heapUsed;
const HOARD = [];
for (let i = 0; i < 100000; i++) HOARD.push({ id: i, name: 'item' + i, tags: [i, i + 1] });
globalThis.keep = () => HOARD.length;
setTimeout(() => {
  gc();
  gc();
  const h1 = process.memoryUsage().heapUsed;
  v8.writeHeapSnapshot(process.argv[2]);
  console.log(h1 - h0);
}, 10);
