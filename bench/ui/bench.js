// Draw times of a 20,000-node flamegraph (and its sandwich and drawing toggles) in chromium: contprofd serves a store holding the
// profile (imported through the embedded broker), the page loads it, and performance.now()
// is taken around the flamegraph's draw calls. Prints "name | value | floor | ok" rows.
// usage: node bench.js BUILD_DIR
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const h = require('../../tests/ui/harness');

function row(name, ms, floor) {
  const ok = floor === undefined ? '-' : ms <= floor ? 'ok' : 'FAIL';
  const fl = floor === undefined ? '-' : '<= ' + floor + ' ms';
  console.log(`${name.padEnd(44)} | ${(ms.toFixed(3) + ' ms').padStart(13)} | ${fl.padStart(12)} | ${ok}`);
  return ok !== 'FAIL';
}

async function main() {
  const bindir = process.argv[2];
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cpui-bench-'));
  const now = Math.floor(Date.now() / 1000);
  const d = await h.startDaemon(bindir, dir);
  let ctx = null, good = true;
  try {
    const big = h.importBig(bindir, dir, d.url, 20000, now - 600);
    const want = Object.values(big).reduce((a, b) => a + b, 0);
    await h.waitTotal(d.url, '{service="big"}', now - 3600, now, want);
    ctx = await h.launch(dir);
    const page = await ctx.newPage();
    await page.goto(d.url + `/?select=${encodeURIComponent('{service="big"}')}&from=${now - 3600}&to=${now}`);
    await page.waitForFunction(() => document.body.dataset.ready === '1');
    const m = await page.evaluate(async () => {
      const f = cp.app.flame, draws = [], loads = [], frames = [];
      const json = await cp.get('/api/v1/profile', { select: '{service="big"}', from: cp.app.state.from, to: cp.app.state.to, format: 'json' });
      for (let k = 0; k < 10; k++) {
        const t0 = performance.now();
        f.setData(json);
        loads.push(performance.now() - t0);
      }
      for (let k = 0; k < 50; k++) {
        const t0 = performance.now();
        f.draw();
        draws.push(performance.now() - t0);
      }
      // Zoom in and out of deep frames, recording the draw of every animation frame.
      const deep = [];
      for (let i = 1; i < f.n && deep.length < 5; i += 997) if (f.depth[i] > 3) deep.push(i);
      const zoom = i => new Promise(res => {
        f.zoomTo(i);
        const start = performance.now();
        const tick = () => { frames.push(f.lastDrawMs); if (performance.now() - start < 250) requestAnimationFrame(tick); else res(); };
        requestAnimationFrame(tick);
      });
      for (const i of deep) { await zoom(i); await zoom(0); }
      // Sandwich of main (its callees: the whole tree merged again) and of a deep frame;
      // computed from the arrays and both flamegraphs set and drawn, as on a click.
      const app = cp.app, sw = [], swDeep = [], tr = [];
      f.setData(json);
      let deepest = 1;
      for (let i = 1; i < f.n; i++) if (f.depth[i] > f.depth[deepest]) deepest = i;
      const sandwichOf = name => {
        const t0 = performance.now();
        const s = cp.views.sandwich(f, name);
        app.swCallers.setData(s.callers);
        app.swCallees.setData(s.callees);
        return performance.now() - t0;
      };
      document.getElementById('sandwichbox').hidden = false;
      for (let k = 0; k < 10; k++) { sw.push(sandwichOf('main')); swDeep.push(sandwichOf(f.name[f.parent[deepest]])); }
      document.getElementById('sandwichbox').hidden = true;
      // The drawing toggles: the tree rebuilt (language only + collapse), set and drawn.
      for (let k = 0; k < 10; k++) {
        const t0 = performance.now();
        f.setData(cp.views.transform(json, { lang: true, collapse: true }));
        tr.push(performance.now() - t0);
      }
      const q = (a, p) => { const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };
      return { swMed: q(sw, 0.5), swMax: q(sw, 1), swDeepMed: q(swDeep, 0.5), trMed: q(tr, 0.5), trMax: q(tr, 1), nodes: f.n - 1, drawMed: q(draws, 0.5), drawMax: q(draws, 1), loadMed: q(loads, 0.5), zoomP50: q(frames, 0.5), zoomMax: q(frames, 1), zoomFrames: frames.length };
    });
    if (m.nodes < 20000) throw new Error(`only ${m.nodes} nodes drawn`);
    good = row(`flamegraph draw, ${m.nodes} nodes, median`, m.drawMed, 100) && good;
    good = row(`flamegraph draw, ${m.nodes} nodes, max of 50`, m.drawMax, 100) && good;
    good = row(`flamegraph setData + first draw, median`, m.loadMed, 100) && good;
    good = row(`zoom animation frame draw, p50 (${m.zoomFrames} frames)`, m.zoomP50, 16) && good;
    good = row(`zoom animation frame draw, max`, m.zoomMax, 100) && good;
    good = row(`sandwich of main (20k callees), median`, m.swMed, 100) && good;
    good = row(`sandwich of main, max of 10`, m.swMax, 200) && good;
    good = row(`sandwich of a deep frame, median`, m.swDeepMed, 100) && good;
    good = row(`lang-only + collapse rebuild + draw, median`, m.trMed, 100) && good;
    good = row(`lang-only + collapse rebuild + draw, max`, m.trMax, 200) && good;
  } finally {
    if (ctx) await ctx.close();
    await d.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
  if (!good) process.exitCode = 1;
}

main().catch(e => { console.error(e.stack || String(e)); process.exit(1); });
