// The workload of test_js: a named hot function that calls JSON.stringify (V8's C++
// serializer under it), another that does arithmetic, an anonymous one, a class method,
// on the main thread and in two worker_threads. Usage: node hot.js [SECONDS]
const { Worker, isMainThread } = require('worker_threads');
const secs = parseFloat(process.argv[2] || '3');
function makeTree(n) {
  const o = [];
  for (let i = 0; i < n; i++) o.push({ id: i, name: 'n' + i, tags: ['a', 'b'], v: i * 1.5 });
  return o;
}
function hotJson(t) {
  let s = 0;
  for (let i = 0; i < 20; i++) s += JSON.stringify(t).length;
  return s;
}
function hotMath(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x += Math.sqrt(i) * Math.sin(i);
  return x;
}
class Shape {
  area(n) {
    let a = 0;
    for (let i = 0; i < n; i++) a += (i % 7) * (i % 11);
    return a;
  }
}
const anon = [function (n) { let y = 0; for (let i = 0; i < n; i++) y ^= i * 31; return y; }];
function loop(until) {
  const t = makeTree(200), sh = new Shape();
  let r = 0;
  while (Date.now() < until) {
    r += hotJson(t);
    r += hotMath(20000);
    r += sh.area(20000);
    r += anon[0](20000);
  }
  return r;
}
const until = Date.now() + secs * 1000;
if (isMainThread) {
  for (let i = 0; i < 2; i++) new Worker(__filename, { argv: [String(secs)], name: 'w' + i });
  setTimeout(() => loop(until), 100);
} else {
  loop(until);
}
