// Runs the esbuild bundle of the TypeScript Worker (tests/v8/install.sh: smap/worker.js) in
// node: imports it and calls its fetch handler on "/" for SECONDS, so tsMain and tsSide
// burn CPU under their minified names. usage: node ts_driver.mjs BUNDLE SECONDS
import { pathToFileURL } from "node:url";

const worker = (await import(pathToFileURL(process.argv[2]).href)).default;
const end = Date.now() + Number(process.argv[3]) * 1000;
let n = 0;
while (Date.now() < end) {
  await worker.fetch(new Request("http://localhost/"), {});
  n++;
}
console.log(`ts_driver: ${n} requests`);
