// A Node program instrumented with Grafana Pyroscope's own SDK (@pyroscope/nodejs, pinned in
// package.json), pointed at contprofd: burns CPU in two named functions for SECONDS, flushing
// every second, then stops the SDK (which uploads the last profiles) and exits.
// usage: node sdk_app.js SERVER_URL APP_NAME SECONDS [TOKEN]
'use strict';
const Pyroscope = require('@pyroscope/nodejs').default;

const [server, app, seconds, token] = process.argv.slice(2);
Pyroscope.init({
  serverAddress: server,
  appName: app,
  authToken: token || undefined,
  flushIntervalMs: 1000,
  tags: { region: 'test' },
  wall: { samplingDurationMs: 1000 },
});
Pyroscope.start();

function pyroHotLoop(ms) {
  const end = Date.now() + ms;
  let x = 0;
  while (Date.now() < end) x += Math.sqrt(x + 1);
  return x;
}

function pyroColdLoop(ms) {
  const end = Date.now() + ms;
  let x = 0;
  while (Date.now() < end) x += Math.sin(x);
  return x;
}

const keep = [];
const until = Date.now() + Number(seconds) * 1000;
(function tick() {
  pyroHotLoop(30);
  pyroColdLoop(10);
  keep.push(new Array(1000).fill(keep.length)); // something for the heap profile
  if (Date.now() < until) return setImmediate(tick);
  Pyroscope.stop().then(() => process.exit(0));
})();
