// Worker alpha: per request alphaMain and alphaSide at 3:1 (by work, not by clock: workerd's
// clock stands still while a request computes). Builds and keeps a table at start-up.
function burn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x += Math.sqrt(i * x + 1);
  return x;
}
function alphaMain() { return burn(3000000); }
function alphaSide() { return burn(1000000); }
function buildStartupTable() {
  const t = [];
  for (let i = 0; i < 300000; i++) t.push({ id: i, name: 'row' + i });
  return t;
}
const kept = buildStartupTable();
export default {
  async fetch() {
    return new Response(String(alphaMain() + alphaSide() + kept.length));
  },
};
