// Worker beta: per request betaMain and betaSide at 3:1 (by work).
function burn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x += Math.sqrt(i * x + 1);
  return x;
}
function betaSide() { return burn(1000000); }
function betaMain() { return burn(3000000); }
export default {
  async fetch() {
    return new Response(String(betaSide() + betaMain()));
  },
};
