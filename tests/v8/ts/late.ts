// A module node requires seconds after contprof v8 attached: bundled by install.sh into
// late/late.js (minified, inline source map). Its frames must read as these functions.
export function lateHotLoop(n: number): number {
  let x = 0;
  for (let i = 0; i < n; i++) x = (x * 31 + i) % 1000003;
  return x;
}

export function lateRun(ms: number): number {
  const end = Date.now() + ms;
  let s = 0;
  while (Date.now() < end) s += lateHotLoop(100000);
  return s;
}
