// The web UI in a real browser: contprofd on a store filled through `contprof import` with
// profiles of known functions and values; the page is loaded in Debian's chromium and
// checked: the hot function's share, hover, click-to-zoom, keyboard, search, table sort and
// focus, the sandwich, language frames only / collapse modules on a mixed native + JS
// profile, the page-wide layout and keys, diff of two versions, group-by a label, the pprof
// download, shareable URLs, capture with a rate and its compare link, no request leaving the
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
// A Worker's mixed stacks as the agent's perf-map path gives them: workerd's and libc's
// native frames (NAME@M: mapped) around the JS frames (no mapping).
const MIXED = {
  'start_thread@2;workerd::main@1;kj::run@1;v8::Function::Call@1;fetchHandler;JSON.stringify': 3 * G,
  'start_thread@2;workerd::main@1;kj::run@1;v8::Function::Call@1;fetchHandler;render;v8::Object::Get@1;memcpy@2': 2 * G,
  'start_thread@2;workerd::main@1;kj::poll@1': 1 * G,
};
// One function at two lines (NAME:LINE), for the line view.
const LINES = { 'main;work:10;hot:3': 2 * G, 'main;work:12;hot:3': 1 * G, 'main;work:12': 2 * G };
const MIXED_MAPS = [{ file: '/usr/bin/workerd', start: 0x555500000000, limit: 0x555508000000, offset: 0 },
                    { file: '/usr/lib/x86_64-linux-gnu/libc.so.6', start: 0x7f0000028000, limit: 0x7f00001bd000, offset: 0x28000 }];
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
    h.importCpu(bindir, dir, d.url, MIXED, { service: 'mixed', version: '1' }, now - 400, MIXED_MAPS);
    h.importCpu(bindir, dir, d.url, LINES, { service: 'lines', version: '1' }, now - 350);
    await h.waitTotal(d.url, '{service="shop",version="1.0"}', now - 3600, now, 3 * sum(V10));
    await h.waitTotal(d.url, '{service="shop",version="1.1"}', now - 3600, now, 3 * sum(V11));
    await h.waitTotal(d.url, '{service="big"}', now - 3600, now, sum(big));
    await h.waitTotal(d.url, '{service="fleet"}', now - 3600, now, 4 * G);
    await h.waitTotal(d.url, '{service="mixed"}', now - 3600, now, sum(MIXED));
    await h.waitTotal(d.url, '{service="lines"}', now - 3600, now, sum(LINES));

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
      assert.deepEqual(opts, ['', 'big', 'fleet', 'lines', 'mixed', 'shop']);
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

    // [depth, name, total] of a flamegraph's frames in preorder.
    const treeOf = which => page.evaluate(w => {
      const f = cp.app[w], out = [];
      for (let i = 0; i < f.n; i++) out.push([f.depth[i], f.name[i], f.total[i]]);
      return out;
    }, which);

    await step('sandwich: callers above, callees below, from the flamegraph and the table', async () => {
      // json.Marshal, a leaf reached from two handlers: shift+click opens its sandwich
      const r = await rectOf('json.Marshal');
      await page.keyboard.down('Shift');
      await page.mouse.click(r.x, r.y);
      await page.keyboard.up('Shift');
      await page.waitForSelector('#sandwichbox:not([hidden])');
      assert.equal(await page.textContent('#swname'), 'json.Marshal');
      assert.match(page.url(), /sandwich=json\.Marshal/);
      assert.equal(await page.evaluate(() => cp.app.flame.zoom), 0, 'shift+click does not zoom');
      assert.deepEqual(await treeOf('swCallers'), [[0, 'json.Marshal', 16.5 * G],
        [1, 'shop.handleOrder', 12 * G], [2, 'http.serve', 12 * G], [3, 'main', 12 * G],
        [1, 'shop.handleSearch', 4.5 * G], [2, 'http.serve', 4.5 * G], [3, 'main', 4.5 * G]]);
      assert.deepEqual(await treeOf('swCallees'), [[0, 'json.Marshal', 16.5 * G]]);
      assert.equal(await page.textContent('#swtotal'), 'total 16.5s (55.0%) · self 16.5s (55.0%)');
      // callers drawn upwards (the function's row at the bottom), at their share of it
      const geo = await page.evaluate(() => {
        const f = cp.app.swCallers;
        return { root: f.rect(0), order: f.rect(1), main: f.rect(3), w: f.cssW, flameW: cp.app.flame.cssW };
      });
      assert.ok(geo.order.y < geo.root.y && geo.main.y < geo.order.y, JSON.stringify(geo));
      assert.ok(Math.abs(geo.order.w / geo.w - 12 / 16.5) < 0.01, `handleOrder ${geo.order.w} of ${geo.w}`);
      await page.mouse.move(1, 1);
      await shot('8-sandwich-flame');
      // from the table's row: shop.handleSearch, a caller of two functions
      await page.click('#table tbody tr[data-name="shop.handleSearch"] button.sw');
      await page.waitForFunction(() => document.getElementById('swname').textContent === 'shop.handleSearch');
      assert.deepEqual(await treeOf('swCallers'), [[0, 'shop.handleSearch', 7.5 * G], [1, 'http.serve', 7.5 * G], [2, 'main', 7.5 * G]]);
      assert.deepEqual(await treeOf('swCallees'), [[0, 'shop.handleSearch', 7.5 * G],
        [1, 'json.Marshal', 4.5 * G], [1, 'regexp.Match', 3 * G]]);
      assert.equal(await page.evaluate(() => cp.app.flame.zoom), 0, 'the sandwich button does not focus the row');
      await shot('9-sandwich-table');
      // in a callee flame, shift+click re-centres the sandwich on that function
      const c = await page.evaluate(() => {
        const f = cp.app.swCallees, r = f.rect(f.heaviest('regexp.Match')), b = f.canvas.getBoundingClientRect();
        return { x: b.left + r.x + r.w / 2, y: b.top + r.y + 8 };
      });
      await page.keyboard.down('Shift');
      await page.mouse.click(c.x, c.y);
      await page.keyboard.up('Shift');
      await page.waitForFunction(() => document.getElementById('swname').textContent === 'regexp.Match');
      // the URL reopens it
      const p2 = await ctx.newPage();
      await p2.goto(page.url());
      await p2.waitForFunction(() => document.body.dataset.ready === '1');
      assert.equal(await p2.isVisible('#sandwichbox'), true);
      assert.equal(await p2.textContent('#swname'), 'regexp.Match');
      await p2.close();
      await page.click('#swclose');
      assert.equal(await page.isVisible('#sandwichbox'), false);
      assert.doesNotMatch(page.url(), /sandwich=/);
    });

    await step('layout: flamegraph and table take the page width, names whole; keys / Escape r', async () => {
      const g = await page.evaluate(() => {
        const w = document.documentElement.clientWidth;
        const fl = document.getElementById('flame').getBoundingClientRect();
        const tb = document.getElementById('table').getBoundingClientRect();
        const cut = [...document.querySelectorAll('#table td.fn')].filter(td => td.scrollWidth > td.clientWidth).map(td => td.textContent);
        return { w, flame: fl.width, table: tb.width, cut, scroll: document.documentElement.scrollWidth };
      });
      assert.ok(g.flame >= g.w - 40 && g.table >= g.w - 40, JSON.stringify(g));
      assert.equal(g.scroll, g.w, 'nothing wider than the page');
      assert.deepEqual(g.cut, [], 'names cut in the table');
      await page.mouse.click(5, 5); // the page, not a control
      await page.keyboard.press('/');
      assert.equal(await page.evaluate(() => document.activeElement.id), 'search');
      await page.keyboard.type('regexp');
      await page.waitForFunction(() => document.getElementById('matches').textContent !== '');
      await page.keyboard.press('Escape');
      assert.notEqual(await page.evaluate(() => document.activeElement.id), 'search');
      await page.fill('#search', '');
      await page.waitForFunction(() => !document.getElementById('matches').textContent);
      const r = await rectOf('regexp.Match');
      await page.mouse.click(r.x, r.y);
      await page.waitForFunction(() => cp.app.flame.name[cp.app.flame.zoom] === 'regexp.Match');
      await page.waitForTimeout(250);
      await page.mouse.click(5, 5);
      await page.keyboard.press('Escape');
      await page.waitForFunction(() => cp.app.flame.name[cp.app.flame.zoom] === 'shop.handleSearch');
      await page.waitForTimeout(250);
      await page.keyboard.press('r');
      await page.waitForFunction(() => cp.app.flame.zoom === 0);
      await page.waitForTimeout(250);
      await shot('8c-layout');
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
      // the sandwich of a diff carries both sides
      await page.evaluate(() => cp.app.openSandwich('regexp.Match'));
      const sw = await page.evaluate(() => [cp.app.swCallers, cp.app.swCallees].map(f => [f.diff, f.total[0], f.baseRoot, f.n]));
      assert.deepEqual(sw, [[true, 12 * G, 3 * G, 4], [true, 12 * G, 3 * G, 1]]);
      await page.click('#swclose');
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

    await step('group by a label: stacked timeline and totals table, a click focuses the group', async () => {
      await page.goto(d.url + `/?select=${encodeURIComponent('{service="shop"}')}&from=${now - 3600}&to=${now}&group=version`);
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      const groupsDone = () => page.waitForFunction(() => document.getElementById('groupbox').dataset.loaded === document.body.dataset.loaded);
      await groupsDone();
      assert.equal(await page.inputValue('#groupby'), 'version');
      // versions of other services (9, 0, 1) have nothing under {service="shop"}: no group
      const rows = await page.$$eval('#grouptable tbody tr', r => r.map(x => [...x.cells].map(c => c.textContent)));
      assert.deepEqual(rows, [['1.1', '39.0s', '56.5%'], ['1.0', '30.0s', '43.5%']]);
      // the stack: each 1.0 window's bar is version 1.0's colour; hit-testing finds it
      const bar = await page.evaluate(t => {
        const g = cp.app.groups, b = g.bars.find(x => x.g.value === '1.0' && x.t <= t && t < x.t + g.step);
        const c = g.canvas.getBoundingClientRect();
        return b && { x: c.left + b.x + b.w / 2, y: c.top + b.y + b.h / 2, color: b.g.color, n: g.bars.length };
      }, t10[0]);
      assert.ok(bar, 'no bar for the first 1.0 window');
      assert.equal(bar.n, 6, 'one bar per window (three each)');
      await shot('13-group-by');
      await loaded(() => page.mouse.click(bar.x, bar.y));
      assert.equal(await page.inputValue('#select'), '{service="shop",version="1.0"}');
      assert.equal(await page.evaluate(() => cp.app.flame.total[0]), 3 * sum(V10));
      await groupsDone();
      assert.deepEqual(await page.$$eval('#grouptable tbody tr td:first-child', r => r.map(x => x.textContent)), ['1.0']);
      // a table row focuses too; group by service over everything
      await page.goto(d.url + `/?from=${now - 3600}&to=${now}`);
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      assert.equal(await page.isVisible('#groupbox'), false);
      await loaded(() => page.selectOption('#groupby', 'service'));
      await groupsDone();
      assert.match(page.url(), /group=service/);
      const names = await page.$$eval('#grouptable tbody tr td:first-child', r => r.map(x => x.textContent));
      assert.deepEqual(names, ['big', 'shop', 'mixed', 'lines', 'fleet']); // 6, 5, 4 s
      await loaded(() => page.click('#grouptable tbody tr[data-value="mixed"]'));
      assert.equal(await page.inputValue('#select'), '{service="mixed"}');
      assert.equal(await page.evaluate(() => cp.app.flame.total[0]), sum(MIXED));
    });

    await step('20,000-node flamegraph draws and zooms', async () => {
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
      // Its speed is bench/ui's (`sh bench/ui/run.sh`, floors there): a timed assertion here
      // failed on a loaded machine. Here: every node drawn, and the zoom animates.
      assert.ok(m.n >= m.nodes, `${m.n} of ${m.nodes} nodes drawn`);
      assert.ok(m.zoomFrames > 2, `${m.zoomFrames} zoom frames`);
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

    await step('language frames only and collapse modules change the drawing, kept in the URL', async () => {
      const url = d.url + `/?select=${encodeURIComponent('{service="mixed"}')}&from=${now - 3600}&to=${now}`;
      await page.goto(url);
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      const frames = () => page.evaluate(() => {
        const f = cp.app.flame, out = [];
        for (let i = 1; i < f.n; i++) out.push([f.depth[i], f.name[i], f.total[i] / 1e9, f.module[i]]);
        return out;
      });
      const stored = await frames();
      assert.equal(stored.length, 10);
      assert.deepEqual(stored.slice(0, 5), [[1, 'start_thread', 6, 'libc.so.6'], [2, 'workerd::main', 6, 'workerd'],
        [3, 'kj::poll', 1, 'workerd'], [3, 'kj::run', 5, 'workerd'], [4, 'v8::Function::Call', 5, 'workerd']]);
      await shot('10-mixed-stored');
      await page.check('#lang');
      assert.match(page.url(), /lang=1/);
      assert.deepEqual(await frames(), [[1, 'fetchHandler', 5, ''], [2, 'JSON.stringify', 3, ''], [2, 'render', 2, '']]);
      assert.equal(await page.evaluate(() => cp.app.flame.total[0]), sum(MIXED), 'the total is kept');
      assert.equal(await page.textContent('#viewnote'), 'drawn: 3 of 10 frames · 1.00s (16.7%) in stacks without a language frame');
      // native time goes to the language frame that called it: render's self is its callees'
      const render = await page.$$eval('#table tbody tr[data-name="render"] td', t => t.map(x => x.textContent));
      assert.match(render[1], /^2\.00s33\.3%$/);
      await shot('11-language-only');
      await page.uncheck('#lang');
      await page.check('#collapse');
      assert.match(page.url(), /collapse=1/);
      assert.equal(await page.textContent('#viewnote'), 'drawn: 7 of 10 frames');
      assert.doesNotMatch(page.url(), /lang=/);
      assert.deepEqual(await frames(), [[1, 'libc.so.6', 6, 'libc.so.6'], [2, 'workerd', 6, 'workerd'],
        [3, 'fetchHandler', 5, ''], [4, 'JSON.stringify', 3, ''], [4, 'render', 2, ''],
        [5, 'workerd', 2, 'workerd'], [6, 'libc.so.6', 2, 'libc.so.6']]);
      await shot('12-collapse-modules');
      // both: the same as language frames only
      await page.check('#lang');
      assert.deepEqual((await frames()).map(x => x[1]), ['fetchHandler', 'JSON.stringify', 'render']);
      // a shared URL draws the same; the API's answer (the stored data) is untouched
      const p2 = await ctx.newPage();
      await p2.goto(page.url());
      await p2.waitForFunction(() => document.body.dataset.ready === '1');
      assert.equal(await p2.evaluate(() => cp.app.flame.n), 4);
      assert.equal(await p2.isChecked('#lang'), true);
      assert.equal(await p2.isChecked('#collapse'), true);
      await p2.close();
      const api = await (await fetch(d.url + '/api/v1/profile?' + new URLSearchParams({ select: '{service="mixed"}', from: String(now - 3600), to: String(now), format: 'json' }))).json();
      assert.equal(api.nodes, 10);
      await page.uncheck('#lang');
      await page.uncheck('#collapse');
      assert.equal(await page.evaluate(() => cp.app.flame.n), 11);
      assert.doesNotMatch(page.url(), /lang=|collapse=/);
      assert.equal(await page.textContent('#viewnote'), '');
    });

    await step('line view: the sandwich function\'s time by source line, the hottest marked', async () => {
      await page.goto(d.url + `/?select=${encodeURIComponent('{service="lines"}')}&from=${now - 3600}&to=${now}&sandwich=work`);
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      // the flamegraph and table know functions only: work is one frame
      assert.equal(await page.evaluate(() => cp.app.flame.total[cp.app.flame.heaviest('work')]), 5 * G);
      await page.click('#swlines');
      await page.waitForSelector('#linebox[data-name="work"]:not([hidden])');
      assert.match(page.url(), /lines=1/);
      const rows = () => page.$$eval('#linetable tbody tr', r => r.map(x => [...x.cells].map(c => c.textContent)));
      assert.deepEqual(await rows(), [['10', '0 0.00%', '2.00s 40.0%', ''], ['12', '2.00s 40.0%', '3.00s 60.0%', 'hottest #1']]);
      assert.equal(await page.textContent('#linetitle'), 'Lines of work in main.go (2 lines known; the hottest marked)');
      await shot('14-lines');
      // another function (from the callee flame): its lines
      await page.evaluate(() => cp.app.openSandwich('hot'));
      await page.waitForSelector('#linebox[data-name="hot"]');
      assert.deepEqual(await rows(), [['3', '3.00s 100.0%', '3.00s 100.0%', 'hottest #1']]); // shares of the function's total
      // the URL reopens the view
      const p2 = await ctx.newPage();
      await p2.goto(page.url());
      await p2.waitForSelector('#linebox[data-name="hot"]:not([hidden])');
      await p2.close();
      await page.click('#swlines');
      assert.equal(await page.isVisible('#linebox'), false);
      // the page's pprof reader on cut and damaged bytes: an error naming the problem
      const errs = await page.evaluate(async () => {
        const q = { select: cp.app.state.select, from: cp.app.state.from, to: cp.app.state.to, format: 'pprof' };
        const gz = new Uint8Array(await cp.get('api/v1/profile', q, true));
        const raw = new Uint8Array(await new Response(new Blob([gz]).stream().pipeThrough(new DecompressionStream('gzip'))).arrayBuffer());
        const out = [];
        for (const b of [raw.slice(0, raw.length >> 1), Uint8Array.of(0x0b, 1, 2), Uint8Array.of(0x12, 0x7f, 1)])
          out.push(await cp.lines.decode(b).then(() => 'decoded', e => e.message));
        return out;
      });
      assert.match(errs[0], /^pprof: (field \d+ of \d+ bytes past the end|truncated varint) at byte \d+$/);
      assert.deepEqual(errs.slice(1), ['pprof: wire type 3 at byte 1', 'pprof: field 2 of 127 bytes past the end at byte 2']);
    });

    await step('real node under the agent: language frames only, collapse modules, sandwich of hotJson', async () => {
      if (process.env.CP_SANITIZED) {
        // a sanitized libcontprof.so cannot be preloaded; the normal build runs this step
        console.log('     (the sanitizer build: this step runs in the normal build)');
        return;
      }
      // tests/collector/js/hot.js for 1.5 s: hotJson calls JSON.stringify (V8's C++ under it)
      const script = path.join(__dirname, '..', 'collector', 'js', 'hot.js');
      const ndir = fs.mkdtempSync(path.join(dir, 'node-'));
      try {
        execFileSync(path.join(bindir, 'query', 'contprof'), ['run', '--server', d.url, '--service', 'nodejs', '--window', '1s', '--',
          process.execPath, '--perf-basic-prof', '--interpreted-frames-native-stack', script, '1.5'],
        { cwd: ndir, stdio: ['ignore', 'pipe', 'pipe'] });
      } catch (e) {
        throw new Error(`contprof run node: ${e.stderr || e.message}`);
      }
      // every window in: the total stops changing
      let last = -1;
      for (let i = 0, same = 0; same < 5; i++) {
        assert.ok(i < 300, 'node\'s windows did not settle');
        const r = await fetch(d.url + '/api/v1/profile?' + new URLSearchParams({ select: '{service="nodejs"}', from: String(now - 3600), to: String(now + 600), format: 'json', max_nodes: '1' }));
        const t = (await r.json()).total;
        same = t > 0 && t === last ? same + 1 : 0;
        last = t;
        await new Promise(res => setTimeout(res, 200));
      }
      const url = d.url + `/?select=${encodeURIComponent('{service="nodejs"}')}&from=${now - 3600}&to=${now + 600}`;
      await page.goto(url);
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      const look = () => page.evaluate(() => {
        const f = cp.app.flame, mods = new Set();
        let sameRun = 0, hot = f.heaviest('hotJson'), nativeUnderHot = 0;
        for (let i = 1; i < f.n; i++) {
          if (f.module[i]) mods.add(f.module[i]);
          if (f.module[i] && f.module[i] === f.module[f.parent[i]]) sameRun++;
        }
        for (let i = hot + 1; hot > 0 && i < hot + f.size[hot]; i++) if (f.module[i]) nativeUnderHot++;
        return { total: f.total[0], n: f.n, mods: [...mods].sort(), sameRun, hot: hot > 0 ? f.total[hot] : 0, nativeUnderHot };
      });
      const stored = await look();
      assert.equal(stored.total, last);
      assert.ok(stored.mods.includes('node'), `modules ${stored.mods}`);
      assert.ok(stored.hot > 0 && stored.nativeUnderHot > 0, JSON.stringify(stored));
      await shot('15-node-stored');
      await page.check('#lang');
      const lang = await look();
      assert.deepEqual([lang.total, lang.mods, lang.nativeUnderHot], [last, [], 0]);
      assert.ok(lang.hot >= stored.hot && lang.n < stored.n / 2, JSON.stringify({ stored, lang }));
      await shot('15-node-language-only');
      await page.uncheck('#lang');
      await page.check('#collapse');
      const col = await look();
      assert.equal(col.sameRun, 0, 'a module run drawn as one frame');
      assert.ok(stored.sameRun > 0 && col.n < stored.n, JSON.stringify({ stored, col }));
      assert.ok(await page.evaluate(() => cp.app.flame.heaviest('node') > 0));
      await shot('15-node-collapsed');
      await page.uncheck('#collapse');
      // the sandwich of hotJson: called from loop
      await page.evaluate(() => cp.app.openSandwich('hotJson'));
      const callers = await page.evaluate(() => { const f = cp.app.swCallers; return [...f.name].slice(1, f.n); });
      assert.ok(callers.includes('loop'), `callers of hotJson: ${callers.slice(0, 10)}`);
      await shot('15-node-sandwich');
      await page.click('#swclose');
    });

    await step('Capture: starts a capture of the selection, shows progress, then its flamegraph and download', async () => {
      await page.goto(d.url + `/?select=${encodeURIComponent('{service="shop",version="1.0"}')}&from=${now - 3600}&to=${now}`);
      await page.waitForFunction(() => document.body.dataset.ready === '1');
      await page.fill('#capdur', '3s');
      assert.equal(await page.textContent('#caprateunit'), 'Hz');
      await page.fill('#caprate', '250');
      const [res] = await Promise.all([
        page.waitForResponse(r => r.url().includes('/api/v1/captures') && r.request().method() === 'POST'),
        page.click('#capture'),
      ]);
      assert.equal(res.status(), 201);
      const cap = await res.json();
      assert.equal(cap.select, '{service="shop",version="1.0"}');
      assert.equal(cap.type, 'cpu');
      assert.equal(cap.end_ns - cap.start_ns, 3e9);
      assert.equal(cap.hz, 250, 'the rate asked');
      assert.match(res.url(), /[?&]hz=250(&|$)/);
      // the agent's side: one boosted window of the captured isolate, labelled capture=ID
      const CAP = { 'main;http.serve;shop.handleOrder;json.Marshal': 0.75 * G, 'main;runtime.gcBgMarkWorker': 0.25 * G };
      h.importCpu(bindir, dir, d.url, CAP, { service: 'shop', version: '1.0', capture: cap.id }, Math.ceil(cap.start_ns / 1e9));
      // and its always-on window of the same minutes, at the always-on rate
      const ON = { 'main;http.serve;shop.handleOrder;json.Marshal': 0.02 * G, 'main;http.serve;shop.handleOrder;db.Query': 0.02 * G };
      h.importCpu(bindir, dir, d.url, ON, { service: 'shop', version: '1.0' }, Math.ceil(cap.start_ns / 1e9));
      await page.waitForFunction(() => /Capture \S+: \d+ of 3 s · 1 isolate · /.test(document.getElementById('capturetext').textContent), null, { timeout: 10000 });
      await shot('capture-progress');
      await page.waitForFunction(id => document.getElementById('capturebox').dataset.id === id && document.body.dataset.loaded, cap.id, { timeout: 20000 });
      await page.waitForFunction(() => !document.body.classList.contains('loading') && cp.app.flame.n > 1);
      assert.equal(await page.inputValue('#select'), `{capture="${cap.id}"}`);
      assert.equal(await page.evaluate(() => cp.app.flame.total[0]), sum(CAP));
      assert.equal(await page.evaluate(() => cp.app.flame.total[cp.app.flame.heaviest('json.Marshal')]), 0.75 * G);
      // imported windows do not say the rate they ran at: the verdict says so
      assert.match(await page.textContent('#capturetext'), /1 isolate\(s\) matched; .*do not say the rate/);
      assert.match(await page.textContent('#capturetext'), /\(250 Hz\)/);
      await shot('capture-done');
      // compare with always-on: the capture (target) against the selector's always-on
      // series over the same minutes (base)
      assert.equal(await page.isVisible('#capturecompare'), true);
      const cmpUrl = await page.$eval('#capturecompare', a => a.href);
      const p4 = await ctx.newPage();
      p4.on('pageerror', e => errors.push(String(e)));
      await p4.goto(cmpUrl);
      await p4.waitForFunction(() => document.body.dataset.ready === '1');
      assert.equal(await p4.inputValue('#select'), `{capture="${cap.id}"}`);
      assert.equal(await p4.inputValue('#baseselect'), '{service="shop",version="1.0"}');
      assert.equal(await p4.isChecked('#diff'), true);
      const cmp = await p4.evaluate(() => {
        const f = cp.app.flame;
        return { diff: f.diff, total: f.total[0], base: f.baseRoot, db: f.btotal[f.heaviest('db.Query')], gc: f.total[f.heaviest('runtime.gcBgMarkWorker')] };
      });
      assert.deepEqual(cmp, { diff: true, total: sum(CAP), base: sum(ON), db: 0.02 * G, gc: 0.25 * G });
      await p4.screenshot({ path: path.join(artifacts, 'capture-compare.png'), fullPage: true });
      await p4.close();
      const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#capturedownload')]);
      const file = path.join(artifacts, 'capture.pb.gz');
      await dl.saveAs(file);
      const p = pprof.decode(fs.readFileSync(file));
      assert.equal(p.samples.reduce((a, s) => a + s.values[1], 0), sum(CAP));
      // the always-on view is unchanged by the capture
      const r = await fetch(d.url + '/api/v1/profile?' + new URLSearchParams({ select: '{service="shop",version="1.0"}', from: String(now - 3600), to: String(now + 60), format: 'json', max_nodes: '1' }));
      assert.equal((await r.json()).total, 3 * sum(V10) + sum(ON), 'the capture\'s window is in no always-on answer');
      // a capture over a limit: the refusal is shown
      const nerr = errors.length;
      await page.evaluate(() => { cp.app.state.select = '{service="shop"}'; });
      await page.fill('#capdur', '1h');
      await page.click('#capture');
      await page.waitForFunction(() => /Capture refused: .*captures\.max_duration/.test(document.getElementById('capturetext').textContent));
      // the browser logs the refused request itself (asynchronously): that one, nothing else
      for (let i = 0; i < 50 && errors.length === nerr; i++) await new Promise(r => setTimeout(r, 50));
      assert.deepEqual(errors.splice(nerr), ['Failed to load resource: the server responded with a status of 400 (Bad Request)']);
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
