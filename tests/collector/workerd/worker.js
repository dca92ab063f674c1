// The Worker of the workerd tests (tests/collector/test_js, tests/e2e/test_e2e) and
// bench/collector/workerd.sh: fetch builds a tree and serializes it with a replacer
// (hotJson, V8's JsonStringifier under it), does arithmetic (hotMath), and burns two
// functions of one body at a known ratio, weighThree 3 parts to weighOne's 1; every other
// request goes to a Durable Object whose method (tally) burns CPU.
function buildTree(n) {
  const o = [];
  for (let i = 0; i < n; i++) o.push({ id: i, name: 'n' + i, tags: ['a', 'b'], v: i * 1.5 });
  return o;
}
function hotJson(t) {
  let s = 0;
  for (let i = 0; i < 30; i++) s += JSON.stringify(t, (k, v) => v).length;
  return s;
}
function hotMath(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x += Math.sqrt(i) * Math.sin(i);
  return x;
}
function weighThree(n) {
  let y = 0;
  for (let i = 0; i < 3 * n; i++) y = (y * 31 + i) % 1000003;
  return y;
}
function weighOne(n) {
  let y = 0;
  for (let i = 0; i < n; i++) y = (y * 31 + i) % 1000003;
  return y;
}
export class Counter {
  constructor(state, env) {
    this.n = 0;
  }
  tally(k) {
    let y = 0;
    for (let i = 0; i < k; i++) y = (y * 31 + i) % 1000003;
    return y;
  }
  async fetch(req) {
    this.n++;
    return new Response(String(this.tally(1000000) + this.n));
  }
}
export default {
  async fetch(req, env) {
    if (new URL(req.url).pathname === '/do') return env.COUNTER.get(env.COUNTER.idFromName('a')).fetch(req);
    const t = buildTree(300);
    return new Response(String(hotJson(t) + hotMath(100000) + weighThree(400000) + weighOne(400000)));
  },
};
