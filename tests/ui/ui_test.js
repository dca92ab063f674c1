// The web UI in a real browser: contprofd on a store filled through `contprof import` with
// profiles of known functions and values; the page is loaded in Debian's chromium and
// checked: the hot function's share, hover, click-to-zoom, keyboard, search, table sort and
// focus, diff of two versions, the pprof download, shareable URLs, no request leaving the
// origin, the draw time of a 20,000-node flamegraph, and the partial-answer banner of a
// 2-node cluster with one node stopped. Screenshots go to ARTIFACTS.
// usage: node ui_test.js BUILD_DIR ARTIFACTS_DIR
'use strict';

const assert = require('assert/strict');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync } = require('child_process');
const h = require('./harness');
const pprof = require('./pprof');

const [bindir, artifacts] = process.argv.slice(2);
if (!bindir || !artifacts) { console.error('usage: node ui_test.js BUILD_DIR ARTIFACTS_DIR'); process.exit(2); }
fs.mkdirSync(artifacts, { recursive: true });

const G = 1e9;
const V10 = {   // version 1.0, per 10 s window (ns)
  'main;http.serve;shop.handleOrder;json.Marshal': 4 * G,
  'main;http.serve;shop.handleOrder;db.Query': 2 * G,
  'main;http.serve;shop.handleSearch;regexp.Match': 1 * G,
  'main;http.serve;shop.handleSearch;json.Marshal': 1.5 * G,
  'main;runtime.gcBgMarkWorker': 1.5 * G,
};
const V11 = { ...V10, 'main;http.serve;shop.handleSearch;regexp.Match': 4 * G }; // regexp got slower
const sum = o => Object.values(o).reduce((a, b) => a + b, 0);

const results = [];
async function step(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    results.push(['ok', name]);
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    results.push(['FAIL', name]);
    console.log(`FAIL ${name}: ${e.stack || e}`);
    throw e;
  }
}

async function main() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cpui-'));
  const now = Math.floor(Date.now() / 1000);
  const d = await h.startDaemon(bindir, dir);
  let ctx = null;
  try {
    // ---- data: three windows of each version inside the last hour, and a 20,000-frame
    // profile of another service.
    const t10 = [now - 3000, now - 2700, now - 2400], t11 = [now - 1500, now - 1200, now - 900];
    for (const t of t10) h.importCpu(bindir, dir, d.url, V10, { service: 'shop', version: '1.0' }, t);
    for (const t of t11) h.importCpu(bindir, dir, d.url, V11, { service: 'shop', version: '1.1' }, t);
    const big = h.importBig(bindir, dir, d.url, 20000, now - 600);
    // two processes of one stripped program (no function names), each binary at its own
    // ASLR base: libc's clone3 <- start_thread <- the program's worker
    const fleetProc = (exe, libc) => {
      const at = (base, off) => '+0x' + (base + off).toString(16);
      return {
        folded: { [`@2${at(libc, 0x1098eb)};@2${at(libc, 0x891f4)};@1${at(exe, 0x12ba)}`]: 2 * G },
        mappings: [{ file: '/usr/local/bin/fleet_work', start: exe + 0x1000, limit: exe + 0x2000, offset: 0x1000 },
                   { file: '/usr/lib/x86_64-linux-gnu/libc.so.6', start: libc + 0x28000, limit: libc + 0x1bd000, offset: 0x28000 }],
      };
    };
    const fleet = [fleetProc(0x555555554000, 0x7f0000000000), fleetProc(0x563200000000, 0x7fcc00000000)];
    fleet.forEach((f, i) => h.importCpu(bindir, dir, d.url, f.folded, { service: 'fleet', version: String(i) }, now - 500, f.mappings));
    await h.waitTotal(d.url, '{service="shop",version="1.0"}', now - 3600, now, 3 * sum(V10));
    await h.waitTotal(d.url, '{service="shop",version="1.1"}', now - 3600, now, 3 * sum(V11));
    await h.waitTotal(d.url, '{service="big"}', now - 3600, now, sum(big));
    await h.waitTotal(d.url, '{service="fleet"}', now - 3600, now, 4 * G);

    ctx = await h.launch(dir);
    const page = await ctx.newPage();
    const errors = [], foreign = [];
    page.on('pageerror', e => errors.push(String(e)));
    page.on('console', m => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('request', r => { if (!r.url().startsWith(d.url) && !/^(blob|data):/.test(r.url())) foreign.push(r.url()); });
    const shot = name => page.screenshot({ path: path.join(artifacts, name + '.png'), fullPage: true });
    let loads = 0;
    // Waits for the page to finish the load that the action starts.
    const loaded = async action => {
      const before = await page.evaluate(() => document.body.dataset.loaded || '0');
      await action();
      await page.waitForFunction(b => (document.body.dataset.loaded || '0') !== b, before);
      loads++;
    };
    const status = () => page.textContent('#status');
    const nodeOf = name => page.evaluate(n => cp.app.flame.heaviest(n), name);
    const rectOf = name => page.evaluate(n => {
      const f = cp.app.flame, i = f.heaviest(n), r = i >= 0 && f.rect(i);
      const c = f.canvas.getBoundingClientRect();
      return r ? { x: c.left + r.x + r.w / 2, y: c.top + r.y + 8, w: r.w, cw: f.cssW } : null;
    }, name);

    await step('page loads from contprofd with its pickers and default window', async () => {
      const r = await fetch(d.url + '/');
      assert.equal(r.status, 200);
      assert.match(r.headers.get('content-type'), /text\/html/);
      assert.equal((await fetch(d.url + '/ui/nope.js')).status, 404);
      await page.goto(d.url + '/');
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      const opts = await page.$$eval('#pickers select[data-label=service] option', o => o.map(x => x.value));
      assert.deepEqual(opts, ['', 'big', 'fleet', 'shop']);
      assert.match(await page.textContent('#window'), /\(1 h\)/);
      // All data of the hour: every service.
      assert.match(await status(), /^Total /);
    });

    await step('the hot function has the right share (pickers, table, search)', async () => {
      await loaded(() => page.selectOption('#pickers select[data-label=service]', 'shop'));
      await loaded(() => page.selectOption('#pickers select[data-label=version]', '1.0'));
      assert.equal(await page.inputValue('#select'), '{service="shop",version="1.0"}');
      const total = await page.evaluate(() => cp.app.flame.total[0]);
      assert.equal(total, 3 * sum(V10));
      // Table sorted by self: json.Marshal first with 55% (40% + 15%).
      const first = await page.$$eval('#table tbody tr:first-child td', t => t.map(x => x.textContent));
      assert.equal(first[0], 'json.Marshal');
      assert.match(first[1], /55\.0%$/);
      assert.match(first[2], /55\.0%$/);
      await page.fill('#search', 'json\\.Marshal');
      await page.waitForFunction(() => document.getElementById('matches').textContent !== '');
      assert.equal(await page.textContent('#matches'), '1 function · 55.0% of total');
      await shot('1-search');
      await page.fill('#search', '');
      await page.waitForFunction(() => document.getElementById('matches').textContent === '');
      // The other value column: samples (count) instead of cpu (nanoseconds).
      const opts = await page.$$eval('#sampletype option', o => o.map(x => x.value));
      assert.deepEqual(opts, ['samples', 'cpu']);
      assert.equal(await page.inputValue('#sampletype'), 'cpu');
      await loaded(() => page.selectOption('#sampletype', 'samples'));
      assert.deepEqual(await page.evaluate(() => [cp.app.flame.total[0], cp.app.flame.unit]), [3 * sum(V10) / 1e7, 'count']);
      assert.match(page.url(), /sample_type=samples/);
      await loaded(() => page.selectOption('#sampletype', 'cpu'));
    });

    await step('hover shows name, self, total and share', async () => {
      const r = await rectOf('db.Query');
      await page.mouse.move(r.x, r.y);
      await page.waitForSelector('#tip:not([hidden])');
      const tip = await page.textContent('#tip');
      assert.match(tip, /db\.Query/);
      assert.match(tip, /self6\.00s \(20\.0%\)/);
      assert.match(tip, /total6\.00s \(20\.0%\)/);
      await shot('2-hover');
      await page.mouse.move(1, 1);
    });

    await step('click zooms, breadcrumbs lead back, reset', async () => {
      const r = await rectOf('shop.handleSearch');
      await page.mouse.click(r.x, r.y);
      await page.waitForFunction(() => cp.app.flame.name[cp.app.flame.zoom] === 'shop.handleSearch');
      await page.waitForTimeout(250); // the zoom animation
      const crumbs = await page.$$eval('#crumbs button', b => b.map(x => x.textContent));
      assert.deepEqual(crumbs, ['all', 'main', 'http.serve', 'shop.handleSearch', 'Reset zoom']);
      // regexp.Match is 1/2.5 of handleSearch: 40% of the width now.
      const m = await rectOf('regexp.Match');
      assert.ok(Math.abs(m.w / m.cw - 0.4) < 0.01, `regexp.Match width ${m.w} of ${m.cw}`);
      assert.match(page.url(), /zoom=main%3Bhttp\.serve%3Bshop\.handleSearch/);
      await shot('3-zoomed');
      await page.click('#crumbs button:text-is("http.serve")');
      await page.waitForFunction(() => cp.app.flame.name[cp.app.flame.zoom] === 'http.serve');
      await page.click('#crumbs button.reset');
      await page.waitForFunction(() => cp.app.flame.zoom === 0);
    });

    await step('keyboard: arrows select frames, Enter zooms, Escape zooms out', async () => {
      await page.focus('#flame');
      await page.keyboard.press('ArrowDown'); // main
      await page.keyboard.press('ArrowDown'); // http.serve (the widest child)
      await page.keyboard.press('Enter');
      await page.waitForFunction(() => cp.app.flame.name[cp.app.flame.zoom] === 'http.serve');
      await page.waitForTimeout(250);
      await page.keyboard.press('Escape');
      await page.waitForFunction(() => cp.app.flame.name[cp.app.flame.zoom] === 'main');
      await page.waitForTimeout(250);
      await page.keyboard.press('Escape');
      await page.waitForFunction(() => cp.app.flame.zoom === 0);
    });

    await step('table sorts by each column and a row focuses the flamegraph', async () => {
      const col = i => page.$$eval(`#table tbody tr td:nth-child(${i})`, t => t.map(x => x.textContent));
      await page.click('#table th[data-key=total] button');
      assert.deepEqual((await col(1)).slice(0, 3), ['main', 'http.serve', 'shop.handleOrder']);
      assert.equal(await page.getAttribute('#table th[data-key=total]', 'aria-sort'), 'descending');
      assert.match(page.url(), /sort=total/);
      await page.click('#table th[data-key=name] button');
      assert.deepEqual(await col(1), ['db.Query', 'http.serve', 'json.Marshal', 'main', 'regexp.Match',
        'runtime.gcBgMarkWorker', 'shop.handleOrder', 'shop.handleSearch']);
      await page.click('#table th[data-key=name] button');
      assert.equal((await col(1))[0], 'shop.handleSearch');
      await page.click('#table th[data-key=self] button');
      assert.equal((await col(1))[0], 'json.Marshal');
      assert.doesNotMatch(page.url(), /sort=/); // self, descending: the default
      await page.click('#table tbody tr[data-name="regexp.Match"]');
      await page.waitForFunction(() => cp.app.flame.name[cp.app.flame.zoom] === 'regexp.Match');
      assert.equal(await page.inputValue('#search'), '^regexp\\.Match$');
      assert.equal(await page.textContent('#matches'), '1 function · 10.0% of total');
      await page.waitForTimeout(250);
      await shot('4-table-focus');
    });

    await step('the URL holds the state and can be shared', async () => {
      const url = page.url();
      const p2 = await ctx.newPage();
      await p2.goto(url);
      await p2.waitForFunction(() => document.body.dataset.ready === '1');
      assert.equal(await p2.inputValue('#select'), '{service="shop",version="1.0"}');
      assert.equal(await p2.inputValue('#search'), '^regexp\\.Match$');
      assert.equal(await p2.evaluate(() => cp.app.flame.name[cp.app.flame.zoom]), 'regexp.Match');
      assert.equal(await p2.$eval('#pickers select[data-label=version]', s => s.value), '1.0');
      await p2.close();
      await page.click('#crumbs button.reset');
      await page.fill('#search', '');
      await page.waitForFunction(() => cp.app.flame.zoom === 0 && !document.getElementById('matches').textContent);
    });

    await step('download is a valid pprof of what is shown', async () => {
      const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#download')]);
      const file = path.join(artifacts, 'download.pb.gz');
      await dl.saveAs(file);
      const p = pprof.decode(fs.readFileSync(file));
      assert.deepEqual(p.types, [['samples', 'count'], ['cpu', 'nanoseconds']]);
      const cpu = p.samples.reduce((a, s) => a + s.values[1], 0);
      assert.equal(cpu, 3 * sum(V10));
      const json = p.samples.filter(s => s.stack[0] === 'json.Marshal').reduce((a, s) => a + s.values[1], 0);
      assert.equal(json, 3 * 5.5 * G);
      assert.ok(p.durationNanos >= 3600e9 - 2e9, 'the window is in the profile');
      const top = execFileSync('go', ['tool', 'pprof', '-top', file], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
      fs.writeFileSync(path.join(artifacts, 'download-top.txt'), top);
      assert.match(top, /16\.50s\s+55\.00%\s+55\.00%\s+16\.50s\s+55\.00%\s+json\.Marshal/);
    });

    await step('diff of two versions: widths from the target, colour by change', async () => {
      await loaded(() => page.check('#diff'));
      assert.equal(await page.isVisible('#diffcontrols'), true);
      await loaded(() => page.selectOption('#pickers select[data-label=version]', '1.1'));
      await loaded(() => page.selectOption('#basepickers select[data-label=version]', '1.0'));
      assert.equal(await page.inputValue('#baseselect'), '{service="shop",version="1.0"}');
      const f = await page.evaluate(() => {
        const f = cp.app.flame, c = n => f.colors[f.heaviest(n)];
        return { diff: f.diff, total: f.total[0], base: f.baseRoot, re: c('regexp.Match'), db: c('db.Query'), gc: c('runtime.gcBgMarkWorker') };
      });
      assert.equal(f.diff, true);
      assert.equal(f.total, 3 * sum(V11));
      assert.equal(f.base, 3 * sum(V10));
      assert.match(f.re, /^hsl\(0,/, 'regexp.Match grew: red');
      assert.match(f.db, /^hsl\(215,/, 'db.Query lost share: blue');
      const r = await rectOf('regexp.Match');
      assert.ok(Math.abs(r.w / r.cw - 4 / 13) < 0.01, 'width from the target');
      await page.mouse.move(r.x, r.y);
      await page.waitForSelector('#tip:not([hidden])');
      assert.match(await page.textContent('#tip'), /base total3\.00s \(10\.0%\).*change\+20\.77 pts/);
      await page.click('#table th[data-key=delta] button');
      const first = await page.$$eval('#table tbody tr:first-child td', t => t.map(x => x.textContent));
      assert.deepEqual([first[0], first[3]], ['regexp.Match', '+20.77 pts']);
      await shot('5-diff');
      await page.mouse.move(1, 1);
      const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#download')]);
      const file = path.join(artifacts, 'diff.pb.gz');
      await dl.saveAs(file);
      const p = pprof.decode(fs.readFileSync(file));
      const cpu = p.samples.reduce((a, s) => a + s.values[1], 0);
      assert.equal(cpu, 3 * (sum(V11) - sum(V10)));
      // Two windows: base = the first v1.0 window dragged on the timeline.
      await page.selectOption('#brush', 'base');
      await loaded(() => page.evaluate(t => {
        const tl = cp.app.timeline;
        tl.on.select('base', t - 5, t + 15);
      }, t10[0]));
      assert.equal(await page.evaluate(() => cp.app.flame.baseRoot), sum(V10));
      assert.match(page.url(), /base_from=/);
    });

    await step('timeline drag selects the window', async () => {
      await loaded(() => page.uncheck('#diff'));
      await loaded(() => page.selectOption('#pickers select[data-label=version]', ''));
      const box = await page.$eval('#timeline', c => { const r = c.getBoundingClientRect(); return { x: r.left, y: r.top, w: r.width, h: r.height }; });
      const pxOf = t => page.evaluate(s => cp.app.timeline.pxAt(s), t);
      const a = box.x + await pxOf(t11[0] - 60), b = box.x + await pxOf(t11[2] + 60);
      await loaded(async () => {
        await page.mouse.move(a, box.y + 40);
        await page.mouse.down();
        await page.mouse.move((a + b) / 2, box.y + 40, { steps: 4 });
        await page.mouse.move(b, box.y + 40, { steps: 4 });
        await page.mouse.up();
      });
      // Only the v1.1 windows are inside.
      assert.equal(await page.evaluate(() => cp.app.flame.total[0]), 3 * sum(V11));
      await shot('6-timeline-window');
    });

    await step('20,000-node flamegraph draws in <= 100 ms and zooms smoothly', async () => {
      await page.goto(d.url + `/?select=${encodeURIComponent('{service="big"}')}&from=${now - 3600}&to=${now}`);
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      const m = await page.evaluate(async () => {
        const f = cp.app.flame, times = [];
        for (let k = 0; k < 30; k++) {
          const t0 = performance.now();
          f.draw();
          times.push(performance.now() - t0);
        }
        // setData + first draw, as when a profile arrives.
        const t1 = performance.now();
        const json = await cp.get('/api/v1/profile', { select: '{service="big"}', from: cp.app.state.from, to: cp.app.state.to, format: 'json' });
        const t2 = performance.now(), sets = [];
        let firstDrawMs = 0;
        for (let k = 0; k < 5; k++) {
          const t3 = performance.now();
          f.setData(json);
          sets.push(performance.now() - t3);
          firstDrawMs = Math.max(firstDrawMs, f.lastDrawMs);
        }
        sets.sort((a, b) => a - b);
        const setMs = sets[2];
        // Zoom animation: frame times while zooming into a deep frame and back.
        let deep = 1;
        for (let i = 1; i < f.n; i++) if (f.depth[i] > f.depth[deep] && f.total[i] > f.total[0] / 2000) deep = i;
        const frames = [];
        const zoom = i => new Promise(res => {
          f.zoomTo(i);
          const start = performance.now();
          const tick = () => { frames.push(f.lastDrawMs); if (performance.now() - start < 400) requestAnimationFrame(tick); else res(); };
          requestAnimationFrame(tick);
        });
        await zoom(f.parent[f.parent[deep]]);
        await zoom(0);
        times.sort((a, b) => a - b);
        return { nodes: json.nodes, n: f.n, median: times[15], max: times[29], setMs, firstDrawMs, fetchMs: t2 - t1, zoomMax: Math.max(...frames), zoomP90: frames.sort((a, b) => a - b)[Math.floor(frames.length * 0.9)], zoomFrames: frames.length };
      });
      console.log(`     nodes ${m.nodes}: draw median ${m.median.toFixed(1)} ms, max ${m.max.toFixed(1)} ms; ` +
        `setData+draw median ${m.setMs.toFixed(1)} ms (its draw at most ${m.firstDrawMs.toFixed(1)} ms); fetch ${m.fetchMs.toFixed(0)} ms; zoom frames ${m.zoomFrames}, p90 ${m.zoomP90.toFixed(1)} ms, slowest ${m.zoomMax.toFixed(1)} ms`);
      fs.writeFileSync(path.join(artifacts, 'draw.json'), JSON.stringify(m, null, 1));
      assert.equal(m.nodes, 20000);
      // Medians: the machine running the tests may be busy; bench/ui reports the maxima.
      assert.ok(m.median <= 100, `draw median ${m.median} ms`);
      assert.ok(m.setMs <= 100, `setData + first draw, median of 5: ${m.setMs} ms`);
      // Smooth: 90% of animation frames drawn within 50 ms even on a loaded CI machine.
      assert.ok(m.zoomP90 <= 50, `zoom frames: 90% within ${m.zoomP90} ms`);
      await shot('7-big');
    });

    await step('unsymbolized frames read module+0xOFFSET, one frame for the whole fleet', async () => {
      await page.goto(d.url + `/?select=${encodeURIComponent('{service="fleet"}')}&from=${now - 3600}&to=${now}`);
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      const f = await page.evaluate(() => {
        const fl = cp.app.flame, out = [];
        for (let i = 1; i < fl.n; i++) out.push([fl.depth[i], fl.name[i], fl.total[i]]);
        return out;
      });
      assert.deepEqual(f, [[1, 'libc.so.6+0x1098eb', 4 * G], [2, 'libc.so.6+0x891f4', 4 * G],
                           [3, 'fleet_work+0x12ba', 4 * G]]);
      await shot('fleet');
    });

    await step('Capture: starts a capture of the selection, shows progress, then its flamegraph and download', async () => {
      await page.goto(d.url + `/?select=${encodeURIComponent('{service="shop",version="1.0"}')}&from=${now - 3600}&to=${now}`);
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      await page.fill('#capdur', '3s');
      await page.fill('#caprate', '1000');
      const [res] = await Promise.all([
        page.waitForResponse(r => r.url().includes('/api/v1/captures') && r.request().method() === 'POST'),
        page.click('#capture'),
      ]);
      assert.equal(res.status(), 201);
      const cap = await res.json();
      assert.equal(cap.select, '{service="shop",version="1.0"}');
      assert.equal(cap.type, 'cpu');
      assert.equal(cap.end_ns - cap.start_ns, 3e9);
      assert.equal(cap.hz, 1000); // the rate field (issue 35)
      assert.equal(cap.max_overhead_permille, 1000); // 3 s of the default budget (20 over 5 min)
      // the agent's side: one boosted window of the captured isolate, labelled capture=ID
      const CAP = { 'main;http.serve;shop.handleOrder;json.Marshal': 0.75 * G, 'main;runtime.gcBgMarkWorker': 0.25 * G };
      h.importCpu(bindir, dir, d.url, CAP, { service: 'shop', version: '1.0', capture: cap.id }, Math.ceil(cap.start_ns / 1e9));
      await page.waitForFunction(() => /Capture \S+: \d+ of 3 s · 1 isolate · /.test(document.getElementById('capturetext').textContent), null, { timeout: 10000 });
      await shot('capture-progress');
      await page.waitForFunction(id => document.getElementById('capturebox').dataset.id === id && document.body.dataset.loaded, cap.id, { timeout: 20000 });
      await page.waitForFunction(() => !document.body.classList.contains('loading') && cp.app.flame.n > 1);
      assert.equal(await page.inputValue('#select'), `{capture="${cap.id}"}`);
      assert.equal(await page.evaluate(() => cp.app.flame.total[0]), sum(CAP));
      assert.equal(await page.evaluate(() => cp.app.flame.total[cp.app.flame.heaviest('json.Marshal')]), 0.75 * G);
      // imported windows do not say the rate they ran at: the verdict says so
      assert.match(await page.textContent('#capturetext'), /1 isolate\(s\) matched; .*do not say the rate/);
      await shot('capture-done');
      const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#capturedownload')]);
      const file = path.join(artifacts, 'capture.pb.gz');
      await dl.saveAs(file);
      const p = pprof.decode(fs.readFileSync(file));
      assert.equal(p.samples.reduce((a, s) => a + s.values[1], 0), sum(CAP));
      // the always-on view is unchanged by the capture
      const r = await fetch(d.url + '/api/v1/profile?' + new URLSearchParams({ select: '{service="shop",version="1.0"}', from: String(now - 3600), to: String(now + 60), format: 'json', max_nodes: '1' }));
      assert.equal((await r.json()).total, 3 * sum(V10));
      // a capture over a limit: the refusal is shown
      const nerr = errors.length;
      await page.evaluate(() => { cp.app.state.select = '{service="shop"}'; });
      await page.fill('#capdur', '3s');
      await page.fill('#caprate', '5000');
      await page.click('#capture');
      await page.waitForFunction(() => /Capture refused: .*captures\.max_hz/.test(document.getElementById('capturetext').textContent));
      await page.fill('#caprate', '');
      await page.fill('#capdur', '1h');
      await page.click('#capture');
      await page.waitForFunction(() => /Capture refused: .*captures\.max_duration/.test(document.getElementById('capturetext').textContent));
      // the browser logs the refused requests itself (asynchronously): those two, nothing else
      for (let i = 0; i < 50 && errors.length < nerr + 2; i++) await new Promise(r => setTimeout(r, 50));
      assert.deepEqual(errors.splice(nerr), Array(2).fill('Failed to load resource: the server responded with a status of 400 (Bad Request)'));
    });

    await step('a server with tokens: the page asks for one and uses it', async () => {
      const tdir = path.join(dir, 'tokens');
      fs.mkdirSync(tdir);
      const conf = path.join(tdir, 'contprofd.conf');
      fs.writeFileSync(conf, "listen = 127.0.0.1:0\nbrokers = 127.0.0.1:9\ntoken.alpha = 'alpha-secret-1'\n");
      const t = await h.startDaemon(bindir, tdir, ['--config', conf]);
      try {
        assert.equal((await fetch(t.url + '/api/v1/labels')).status, 401);
        const p2 = await ctx.newPage();
        p2.on('pageerror', e => errors.push(String(e)));
        await p2.goto(t.url + '/');
        await p2.waitForSelector('#tokendialog[open]');
        await p2.fill('#token', 'alpha-secret-1');
        await p2.click('#tokendialog button');
        await p2.waitForFunction(() => document.body.dataset.ready === '1', null, { timeout: 5000 })
          .catch(async e => { await p2.screenshot({ path: path.join(artifacts, 'token-fail.png') }); throw new Error(e.message + ' status: ' + await p2.textContent('#status')); });
        assert.equal(await p2.textContent('#status'), 'No data in this window for this selection.');
        await p2.close();
      } finally {
        await t.stop();
      }
    });

    await step('a cluster node stopped: a banner names it (none while all answer)', async () => {
      const cdir = path.join(dir, 'cluster');
      fs.mkdirSync(cdir);
      const [n1, n2] = await h.startCluster(bindir, cdir);
      try {
        // two services: their keys may land on either node's partition
        h.importCpu(bindir, cdir, n1.url, V10, { service: 'shop', version: '1.0' }, now - 300);
        h.importCpu(bindir, cdir, n1.url, V11, { service: 'shop', version: '1.1' }, now - 300);
        await h.waitTotal(n1.url, '{service="shop"}', now - 3600, now, sum(V10) + sum(V11));
        const p3 = await ctx.newPage();
        p3.on('pageerror', e => errors.push(String(e)));
        const open = async () => {
          await p3.goto(n1.url + `/?select=${encodeURIComponent('{service="shop"}')}&from=${now - 3600}&to=${now}`);
          await p3.waitForFunction(() => document.body.dataset.ready === '1');
        };
        await open();
        assert.equal(await p3.isVisible('#partial'), false, 'banner shown while every node answers');
        assert.match(await p3.textContent('#status'), /^Total /);
        assert.equal(await n2.stop(), 0);
        await open();
        assert.equal(await p3.isVisible('#partial'), true, 'no banner with node 2 stopped');
        const text = await p3.textContent('#partial');
        assert.ok(text.includes(n2.url), `banner "${text}" does not name ${n2.url}`);
        assert.match(text, /^Partial answer: no data from /);
        assert.equal(await p3.getAttribute('#partial', 'role'), 'alert');
        await p3.screenshot({ path: path.join(artifacts, 'cluster-partial.png'), fullPage: true });
        await p3.close();
      } finally {
        await n2.stop();
        await n1.stop();
      }
    });

    await step('no request left the origin and no script errors', async () => {
      assert.deepEqual(foreign, []);
      assert.deepEqual(errors, []);
    });
  } finally {
    if (ctx) await ctx.close();
    const code = await d.stop();
    if (code !== 0) console.log('contprofd exit status ' + code + '\n' + fs.readFileSync(d.log, 'utf8'));
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

main().then(() => {
  console.log(`all ${results.length} browser checks passed; screenshots in ${artifacts}`);
}, e => {
  if (!results.length || results[results.length - 1][0] !== 'FAIL') console.log(e.stack || String(e));
  console.log(`browser test failed; screenshots in ${artifacts}`);
  process.exit(1);
});
