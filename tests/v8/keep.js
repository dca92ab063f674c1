// The in-use estimate against V8's own accounting: keepAtStartup() keeps argv[3] records
// (150,000: ~50 MB) in objects of the sizes a service keeps (records of short strings, small arrays and
// dates, a Map index, the arrays that hold them) and throws away about as much on the way;
// main prints heapUsed's growth over it, both read after a full GC, then idles argv[2]
// seconds. The last inuse window must put that growth under keepAtStartup (tests/v8/
// test_v8.c, node_inuse_matches_retained_growth).
const v8 = require('node:v8');
const vm = require('node:vm');
v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc');

const KEPT = [];
const INDEX = new Map();

function keepAtStartup(n) {
  let garbage = 0;
  for (let i = 0; i < n; i++) {
    const rec = {
      id: i,
      name: 'user' + i,
      email: `u${i}@example.com`,
      tags: [i % 7, i % 13, i % 31],
      created: new Date(1700000000000 + i),
    };
    KEPT.push(rec);
    if (i % 4 === 0) INDEX.set(rec.email, rec);
    // a string thrown away per record; not of rec itself: serializing its email would
    // flatten that concatenated string, and V8's sampler then keeps the sample of the
    // string's pieces as well (collector/v8/README.md "Heap": +50% for such strings)
    garbage += JSON.stringify({ id: i, tags: rec.tags }).length;
    const tmp = { a: [i, i, i, i], b: 'x' + i }; // and an object
    garbage += tmp.a.length;
  }
  return garbage;
}

const seconds = Number(process.argv[2] || 8);
const n = Number(process.argv[3] || 150000);
gc();
const h0 = process.memoryUsage().heapUsed;
keepAtStartup(n);
gc();
console.log(`kept ${process.memoryUsage().heapUsed - h0} bytes in ${KEPT.length} records`);
const t = setInterval(() => KEPT.length, 100);
setTimeout(() => clearInterval(t), seconds * 1000);
