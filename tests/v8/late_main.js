// node late_main.js SECONDS: burns a second, then requires late.js (a minified bundle with an
// inline source map, loaded after contprof v8 attached) and runs it for the rest.
'use strict';
const secs = Number(process.argv[2] || 4);
function early(ms) {
  const end = Date.now() + ms;
  let x = 0;
  while (Date.now() < end) x++;
  return x;
}
early(1000);
const late = require('./late.js');
console.log(late.lateRun((secs - 1) * 1000));
