// The main thread burns CPU for argv[2] seconds (wall clock), then idles argv[3] seconds
// before exiting: while it idles, its CPU in /proc/PID/stat is final (tests/v8/test_v8.c,
// node_cpu_under_competitors).
function burn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x += Math.sqrt(i * x + 1);
  return x;
}
function burnMain() { return burn(200000); }
const seconds = Number(process.argv[2] || 5), idle = Number(process.argv[3] || 2);
const end = Date.now() + seconds * 1000;
let sink = 0;
while (Date.now() < end) sink += burnMain();
console.log('burned', sink > 0);
setTimeout(() => process.exit(0), idle * 1000);
