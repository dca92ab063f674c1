// The Worker of test_js's workerd test: fetch builds a tree and serializes it with a
// replacer (hotJson, V8's JsonStringifier under it) and does arithmetic (hotMath).
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
export default {
  async fetch(req) {
    const t = buildTree(300);
    return new Response(String(hotJson(t) + hotMath(100000)));
  },
};
