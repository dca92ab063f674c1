// The page: holds the view's state, mirrors it in the URL (so a view can be shared), loads
// labels, the timeline and the merged profile (or diff) from the API, and wires the
// pickers, timeline, flamegraph, table, search and download together.
'use strict';

(function () {
  const $ = id => document.getElementById(id);
  const DEFAULTS = {
    type: 'cpu', sample_type: '', select: '', from: '-1h', to: 'now', span: '6h', diff: '',
    base_select: '', base_from: '', base_to: '', zoom: '', search: '', sort: 'self', dir: 'desc',
    sandwich: '', lines: '', lang: '', collapse: '', group: '',
  };
  const SPANS = { '1h': 3600, '6h': 21600, '24h': 86400, '7d': 604800 };
  const TARGET = '#ea580c', BASE = '#2563eb';

  const state = { ...DEFAULTS };
  let labelNames = [];
  let loaded = null;   // {from, to, base_from, base_to} of the profile on screen, unix seconds
  let loadSeq = 0;
  let lastJson = null; // the API's answer on screen, before the drawing toggles

  // ---- state <-> URL ------------------------------------------------------------------

  function readURL() {
    const q = new URLSearchParams(location.search);
    for (const k of Object.keys(DEFAULTS)) state[k] = q.has(k) ? q.get(k) : DEFAULTS[k];
    if (!SPANS[state.span]) state.span = DEFAULTS.span;
  }

  function writeURL() {
    const q = new URLSearchParams();
    for (const k of Object.keys(DEFAULTS)) if (state[k] !== DEFAULTS[k]) q.set(k, state[k]);
    const url = location.pathname + (q.toString() ? '?' + q : '');
    if (url !== location.pathname + location.search) history.replaceState(null, '', url);
  }

  function status(msg, isError) {
    const s = $('status');
    s.textContent = msg;
    s.className = isError ? 'error' : '';
  }

  // ---- label pickers ------------------------------------------------------------------

  async function loadLabels() {
    try {
      labelNames = (await cp.get('api/v1/labels')).labels || [];
    } catch (e) {
      status('labels: ' + e.message, true);
      labelNames = [];
    }
    const values = {};
    await Promise.all(labelNames.map(async n => {
      try { values[n] = (await cp.get('api/v1/labels/' + encodeURIComponent(n) + '/values')).values || []; }
      catch (e) { values[n] = []; }
    }));
    const gb = $('groupby');
    gb.length = 1;
    for (const n of labelNames) gb.add(new Option(n, n));
    buildPickers($('pickers'), values, 'select');
    buildPickers($('basepickers'), values, 'base_select');
  }

  // One <select> per label name; each sets or clears name="value" in the selector field.
  function buildPickers(box, values, key) {
    box.textContent = '';
    for (const name of labelNames) {
      const vals = values[name] || [];
      if (!vals.length || vals.length > 500) continue;
      const label = document.createElement('label');
      label.textContent = name + ' ';
      const sel = document.createElement('select');
      sel.dataset.label = name;
      sel.add(new Option('any', ''));
      for (const v of vals) sel.add(new Option(v, v));
      sel.addEventListener('change', () => {
        state[key] = cp.setEq(currentSelect(key), name, sel.value);
        syncInputs();
        reload();
      });
      label.appendChild(sel);
      box.appendChild(label);
    }
  }

  function currentSelect(key) {
    return key === 'base_select' ? (state.base_select || state.select) : state.select;
  }

  // Puts the state into the form controls.
  function syncInputs() {
    $('type').value = state.type;
    captureRateField();
    $('span').value = state.span;
    $('select').value = state.select;
    $('baseselect').value = state.base_select;
    $('baseselect').placeholder = state.select || 'same as target';
    $('search').value = state.search;
    $('diff').checked = !!state.diff;
    $('lang').checked = !!state.lang;
    if (state.group && ![...$('groupby').options].some(o => o.value === state.group)) $('groupby').add(new Option(state.group, state.group));
    $('groupby').value = state.group;
    $('collapse').checked = !!state.collapse;
    $('diffcontrols').hidden = !state.diff;
    for (const [box, key] of [['pickers', 'select'], ['basepickers', 'base_select']]) {
      const eq = cp.parseEq(currentSelect(key));
      for (const s of $(box).querySelectorAll('select')) {
        const v = eq[s.dataset.label] || '';
        if (v && ![...s.options].some(o => o.value === v)) s.add(new Option(v, v));
        s.value = v;
      }
    }
  }

  // ---- timeline -----------------------------------------------------------------------

  const timeline = new cp.Timeline($('timeline'), {
    select(which, from, to) {
      if (which === 'base') { state.base_from = String(from); state.base_to = String(to); }
      else { state.from = String(from); state.to = String(to); }
      reload();
    },
  });

  // The timeline's span: the last `span` up to now, or one around the window if it is older.
  function spanOf(nowSec, from, to) {
    const len = SPANS[state.span];
    if (to > nowSec - len && from >= nowSec - len) return [nowSec - len, nowSec];
    const w = Math.max(len, (to - from) * 1.2);
    const end = Math.min(nowSec, to + (w - (to - from)) / 2);
    return [end - w, end];
  }

  // A round step giving at most ~240 bars (stored windows are 10 s).
  function stepOf(span) {
    const want = (span[1] - span[0]) / 240;
    const steps = [10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
    return steps.find(s => s >= want) || 86400;
  }

  // Fills the Value menu from the timeline's sample types; returns the chosen index.
  function sampleTypes(st) {
    const sel = $('sampletype');
    const names = st.map(t => t.type);
    if (sel.options.length !== names.length || names.some((n, i) => sel.options[i].value !== n)) {
      sel.textContent = '';
      for (const t of st) sel.add(new Option(`${t.type} (${t.unit})`, t.type));
    }
    let i = names.indexOf(state.sample_type);
    if (i < 0) i = names.length - 1; // the API's default: the last
    sel.value = names[i] || '';
    return i;
  }

  async function loadTimeline(nowSec, from, to, seq) {
    const span = spanOf(nowSec, from, to);
    try {
      const t = await cp.get('api/v1/timeline', {
        type: state.type, select: state.select, from: Math.floor(span[0]), to: Math.ceil(span[1]),
        step: stepOf(span) + 's',
      });
      if (seq !== loadSeq) return;
      const st = t.sample_types || [];
      const col = sampleTypes(st);
      const points = (t.points || []).map(p => [p[0], p[1 + col] || 0]);
      timeline.setData(points, span, st.length ? st[col].unit : '');
    } catch (e) {
      if (seq === loadSeq) { timeline.setData([], span, ''); status('timeline: ' + e.message, true); }
    }
    if (seq !== loadSeq) return;
    timeline.setWindow('target', from, to, TARGET);
    if (state.diff && state.base_from) timeline.setWindow('base', loaded.base_from, loaded.base_to, BASE);
    else timeline.clearWindow('base');
    timeline.active = state.diff ? $('brush').value : 'target';
  }

  // ---- group-by a label ------------------------------------------------------------------

  const groups = new cp.Groups($('groupcanvas'), $('grouptable'), {
    focus(value) {
      state.select = cp.setEq(state.select, state.group, value);
      state.zoom = '';
      reload();
    },
  });

  async function loadGroups(nowSec, from, to, seq) {
    const box = $('groupbox');
    box.hidden = !state.group;
    if (!state.group) return;
    const span = spanOf(nowSec, from, to);
    try {
      await groups.load({ label: state.group, type: state.type, select: state.select, sample_type: state.sample_type,
        from: Math.floor(span[0]), to: Math.ceil(span[1]), step: stepOf(span) + 's' }, () => seq === loadSeq);
    } catch (e) {
      if (seq === loadSeq) status('group by ' + state.group + ': ' + e.message, true);
    }
    if (seq === loadSeq) box.dataset.loaded = String(seq);
  }

  // ---- flamegraph, table, search --------------------------------------------------------

  const flame = new cp.Flame($('flame'), $('tip'), {
    zoom(i) {
      state.zoom = i > 0 ? flame.pathOf(i).slice(1).map(j => flame.name[j]).join(';') : '';
      crumbs();
      writeURL();
    },
    sandwich(i) { openSandwich(flame.name[i]); },
  });

  // ---- sandwich: a function's callers above, its callees below ---------------------------

  const swCallers = new cp.Flame($('swcallers'), $('swtip1'), { sandwich(i) { openSandwich(swCallers.name[i]); } }, true);
  const swCallees = new cp.Flame($('swcallees'), $('swtip2'), { sandwich(i) { openSandwich(swCallees.name[i]); } });

  function openSandwich(name) {
    if (!name || name === flame.name[0]) return;
    state.sandwich = name;
    writeURL();
    drawSandwich(true);
  }

  // Draws the sandwich of state.sandwich from the flamegraph's arrays (hidden when unset).
  function drawSandwich(scroll) {
    const box = $('sandwichbox');
    box.hidden = !state.sandwich || !flame.n;
    if (box.hidden) return;
    const t0 = performance.now();
    const s = cp.views.sandwich(flame, state.sandwich);
    swCallers.setData(s.callers);
    swCallees.setData(s.callees);
    box.dataset.ms = (performance.now() - t0).toFixed(2);
    $('swname').textContent = state.sandwich;
    $('swtotal').textContent = s.total
      ? `total ${cp.fmt(s.total, flame.unit)} (${cp.pct(s.total, flame.total[0])}) · self ${cp.fmt(s.self, flame.unit)} (${cp.pct(s.self, flame.total[0])})`
      : 'not in this profile';
    box.dataset.total = String(s.total);
    if (scroll) box.scrollIntoView({ block: 'nearest' });
    drawLines();
  }

  // ---- line view of the sandwich's function ----------------------------------------------

  let pprofCache = null; // {key, p}: the window's decoded pprof
  async function drawLines() {
    const box = $('linebox');
    box.hidden = !state.lines || !state.sandwich || !loaded;
    if (box.hidden) return;
    const name = state.sandwich;
    const q = { type: state.type, select: state.select, from: loaded.from, to: loaded.to, format: 'pprof' };
    const key = JSON.stringify(q);
    try {
      if (!pprofCache || pprofCache.key !== key) pprofCache = { key, p: await cp.lines.decode(await cp.get('api/v1/profile', q, true)) };
    } catch (e) {
      $('linetitle').textContent = 'Lines: ' + e.message;
      return;
    }
    if (name !== state.sandwich) return;
    const p = pprofCache.p;
    let vi = p.types.findIndex(t => t[0] === state.sample_type);
    if (vi < 0) vi = p.types.length - 1;
    const r = cp.lines.byLine(p, name, vi);
    const unit = p.types[vi] ? p.types[vi][1] : '';
    const hot = [...r.rows].sort((a, b) => b.self - a.self || b.total - a.total).slice(0, 3).filter(x => x.self > 0).map(x => x.line);
    $('linetitle').textContent = r.rows.length
      ? `Lines of ${name}${r.file ? ' in ' + r.file : ''} (${r.rows.length} line${r.rows.length === 1 ? '' : 's'} known; the hottest marked)`
      : `No line of ${name} in this window's profile.`;
    $('linetable').tBodies[0].innerHTML = r.rows.map(x => {
      const h = hot.indexOf(x.line);
      return `<tr data-line="${x.line}"${h >= 0 ? ' class="hot"' : ''}><td class="num">${x.line || '?'}</td>` +
        `<td class="num">${cp.fmt(x.self, unit)} <span class="pct">${cp.pct(x.self, r.total)}</span></td>` +
        `<td class="num">${cp.fmt(x.total, unit)} <span class="pct">${cp.pct(x.total, r.total)}</span></td>` +
        `<td class="mark">${h >= 0 ? 'hottest #' + (h + 1) : ''}</td></tr>`;
    }).join('');
    box.dataset.name = name;
  }
  $('swlines').addEventListener('click', () => {
    state.lines = state.lines ? '' : '1';
    writeURL();
    drawLines();
  });

  $('swclose').addEventListener('click', () => {
    state.sandwich = '';
    state.lines = '';
    writeURL();
    drawSandwich();
  });
  $('sandwichbtn').addEventListener('click', () => {
    const i = flame.sel > 0 ? flame.sel : flame.zoom;
    if (i > 0) openSandwich(flame.name[i]);
    else status('Select a frame first (click, or arrow keys in the flamegraph), then Sandwich.', true);
  });

  const table = new cp.Table($('table'), {
    pick(name) {
      const i = flame.heaviest(name);
      if (i < 0) return;
      state.search = '^' + name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') + '$';
      $('search').value = state.search;
      applySearch();
      flame.sel = i;
      flame.zoomTo(i);
      $('flame').scrollIntoView({ block: 'nearest' });
    },
    sandwich(name) { openSandwich(name); },
    sort(key, dir) {
      state.sort = key;
      state.dir = dir > 0 ? 'asc' : 'desc';
      writeURL();
    },
  });

  function crumbs() {
    const nav = $('crumbs');
    nav.textContent = '';
    const path = flame.n ? flame.pathOf(flame.zoom) : [0];
    path.forEach((i, k) => {
      if (k) nav.append(' › ');
      const b = document.createElement('button');
      b.type = 'button';
      b.textContent = k ? flame.name[i] : 'all';
      b.title = k ? flame.name[i] : 'Reset zoom';
      if (k === path.length - 1) b.setAttribute('aria-current', 'true');
      b.addEventListener('click', () => flame.zoomTo(i));
      nav.appendChild(b);
    });
    if (path.length > 1) {
      const r = document.createElement('button');
      r.type = 'button';
      r.className = 'reset';
      r.textContent = 'Reset zoom';
      r.addEventListener('click', () => flame.zoomTo(0));
      nav.appendChild(r);
    }
  }

  function applySearch() {
    const q = state.search;
    let re = null;
    if (q) {
      try { re = new RegExp(q, 'i'); } catch (e) { re = new RegExp(q.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'i'); }
    }
    const r = flame.search(re);
    $('matches').textContent = r ? `${r.functions} function${r.functions === 1 ? '' : 's'} · ${cp.pct(r.total, flame.total[0])} of total` : '';
    $('matches').dataset.share = r && flame.total[0] ? String(r.total / flame.total[0]) : '';
  }

  let searchTimer = 0;
  // 'search': chromium's Escape empties a search field without an 'input' event.
  for (const ev of ['input', 'search']) {
    $('search').addEventListener(ev, () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(() => { state.search = $('search').value; applySearch(); writeURL(); }, 120);
    });
  }

  // ---- loading --------------------------------------------------------------------------

  function profileRequest(format) {
    const q = { type: state.type, select: state.select, from: loaded.from, to: loaded.to, format };
    if (format !== 'pprof') q.sample_type = state.sample_type;
    if (!state.diff) return ['api/v1/profile', q];
    q.base_select = state.base_select || state.select;
    q.base_from = loaded.base_from;
    q.base_to = loaded.base_to;
    return ['api/v1/diff', q];
  }

  // ---- partial answers --------------------------------------------------------------------

  // Cluster nodes that did not answer during the current load: a banner names them, since
  // every total and frame on screen then lacks their part.
  let missingPeers = new Set();
  function showPartial() {
    const b = $('partial');
    b.hidden = !missingPeers.size;
    b.textContent = missingPeers.size
      ? `Partial answer: no data from ${[...missingPeers].join(', ')} (cluster node${missingPeers.size > 1 ? 's' : ''} not answering). What is shown lacks ${missingPeers.size > 1 ? 'their' : 'its'} part.`
      : '';
  }
  cp.onPartial = peers => {
    for (const p of peers) missingPeers.add(p);
    showPartial();
  };

  async function reload() {
    const seq = ++loadSeq;
    missingPeers = new Set();
    showPartial();
    writeURL();
    syncInputs();
    const nowSec = Math.floor(Date.now() / 1000);
    const from = Math.floor(cp.toSec(state.from, nowSec)), to = Math.ceil(cp.toSec(state.to, nowSec));
    loaded = { from, to };
    loaded.base_from = state.base_from ? Math.floor(cp.toSec(state.base_from, nowSec)) : from;
    loaded.base_to = state.base_to ? Math.ceil(cp.toSec(state.base_to, nowSec)) : to;
    let text = `${cp.timeText(from)} → ${cp.timeText(to)} (${cp.durText(to - from)})`;
    if (state.diff) text += ` vs base ${cp.timeText(loaded.base_from)} → ${cp.timeText(loaded.base_to)}` +
      (state.base_select && state.base_select !== state.select ? ' ' + state.base_select : '');
    $('window').textContent = text;
    loadTimeline(nowSec, from, to, seq);
    loadGroups(nowSec, from, to, seq);
    status('Loading…');
    document.body.classList.add('loading');
    try {
      const [path, q] = profileRequest('json');
      const t0 = performance.now();
      const json = await cp.get(path, q);
      if (seq !== loadSeq) return;
      const fetched = performance.now() - t0;
      lastJson = json;
      show();
      const u = flame.unit;
      let msg = `Total ${cp.fmt(json.total, u)}`;
      if (flame.diff) msg += ` (base ${cp.fmt(json.base_total, u)})`;
      msg += ` · ${json.nodes} of ${json.total_nodes} frames · fetched in ${fetched.toFixed(0)} ms, drawn in ${flame.lastDrawMs.toFixed(1)} ms`;
      status(json.total || json.base_total ? msg : 'No data in this window for this selection.');
    } catch (e) {
      if (seq === loadSeq) status(e.message, true);
    } finally {
      if (seq === loadSeq) {
        document.body.classList.remove('loading');
        document.body.dataset.loaded = String(seq);
      }
    }
  }

  // Draws lastJson through the drawing toggles: flamegraph (zoom path kept), search, table,
  // sandwich.
  function show() {
    if (!lastJson) return;
    flame.setData(cp.views.transform(lastJson, { lang: !!state.lang, collapse: !!state.collapse }));
    // What the toggles leave out of sight: native stacks with no language frame at all.
    const note = $('viewnote');
    note.textContent = state.lang || state.collapse ? `drawn: ${flame.n - 1} of ${lastJson.nodes} frames` +
      (state.lang && flame.self[0] ? ` · ${cp.fmt(flame.self[0], flame.unit)} (${cp.pct(flame.self[0], flame.total[0])}) in stacks without a language frame` : '') : '';
    const z = state.zoom ? flame.findPath(state.zoom.split(';')) : 0;
    if (z) flame.zoomTo(z, true);
    crumbs();
    applySearch();
    table.setSort(state.sort, state.dir === 'asc' ? 1 : -1);
    table.setData(flame);
    drawSandwich();
  }

  // ---- controls -------------------------------------------------------------------------

  for (const key of ['lang', 'collapse']) {
    $(key).addEventListener('change', () => {
      state[key] = $(key).checked ? '1' : '';
      writeURL();
      show();
    });
  }

  $('type').addEventListener('change', () => {
    state.type = $('type').value;
    state.sample_type = '';
    state.zoom = '';
    reload();
  });
  $('sampletype').addEventListener('change', () => { state.sample_type = $('sampletype').value; reload(); });
  $('span').addEventListener('change', () => { state.span = $('span').value; reload(); });
  $('groupby').addEventListener('change', () => { state.group = $('groupby').value; reload(); });
  $('select').addEventListener('change', () => { state.select = $('select').value.trim(); reload(); });
  $('baseselect').addEventListener('change', () => { state.base_select = $('baseselect').value.trim(); reload(); });
  $('diff').addEventListener('change', () => { state.diff = $('diff').checked ? '1' : ''; reload(); });
  $('brush').addEventListener('change', () => { timeline.active = $('brush').value; timeline.draw(); });
  for (const f of document.querySelectorAll('header form')) f.addEventListener('submit', e => e.preventDefault());

  $('download').addEventListener('click', async e => {
    e.preventDefault();
    if (!loaded) return;
    const [path, q] = profileRequest('pprof');
    try {
      const buf = await cp.get(path, q, true);
      const a = document.createElement('a');
      a.href = URL.createObjectURL(new Blob([buf], { type: 'application/octet-stream' }));
      a.download = `${state.type}${state.diff ? '-diff' : ''}-${loaded.from}-${loaded.to}.pb.gz`;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    } catch (err) {
      status('download: ' + err.message, true);
    }
  });

  // ---- capture (issue 29): a high-resolution capture of the selection's isolates --------

  // Starts a capture of the selector for the duration given, follows it (isolates reached,
  // samples, time left), and then shows its flamegraph ({capture="ID"} over its range) with
  // a download link. The verdict (every isolate whole at the rate asked, or who was not)
  // stays in the box.
  async function capture() {
    const box = $('capturebox'), text = $('capturetext');
    box.hidden = false;
    $('capturedownload').hidden = true;
    $('capturecompare').hidden = true;
    // heap: one V8 heap snapshot of each matched isolate (no rate)
    const type = state.type === 'alloc' || state.type === 'heap' ? state.type : 'cpu';
    const q = { select: state.select, type, duration: $('capdur').value.trim() };
    if (type !== 'heap') q[type === 'alloc' ? 'alloc_rate' : 'hz'] = $('caprate').value.trim(); // '': the server's default
    let cap;
    try {
      cap = await cp.get('api/v1/captures', q, false, 'POST');
    } catch (e) {
      text.textContent = 'Capture refused: ' + e.message;
      box.className = 'error';
      return;
    }
    box.className = '';
    $('capture').disabled = true;
    const endMs = cap.end_ns / 1e6, total = (cap.end_ns - cap.start_ns) / 1e9;
    let c = cap;
    for (;;) {
      try { c = await cp.get('api/v1/captures/' + encodeURIComponent(cap.id)); } catch (e) { text.textContent = e.message; }
      const iso = (c.isolates || []).filter(i => i.reached);
      const samples = iso.reduce((a, i) => a + (i.samples || 0), 0);
      const left = Math.max(0, (endMs - Date.now()) / 1000);
      const allIn = Date.now() >= endMs && iso.length && iso.every(i => i.last_end_ns >= cap.end_ns - 250e6);
      text.textContent = `Capture ${cap.id}: ${Math.min(total, total - left).toFixed(0)} of ${total.toFixed(0)} s · ` +
        `${iso.length} isolate${iso.length === 1 ? '' : 's'} · ${samples.toLocaleString('en')} samples` +
        (left > 0 ? '' : ' · waiting for the last windows');
      box.dataset.progress = String(Math.min(1, (total - left) / total));
      if (allIn || Date.now() >= endMs + 4000) break;
      await new Promise(r => setTimeout(r, 500));
    }
    $('capture').disabled = false;
    const bad = (c.isolates || []).filter(i => !i.ok)
      .map(i => '{' + Object.entries(i.labels).map(([k, v]) => `${k}="${v}"`).join(',') + '}: ' + (i.reason || 'not reached'));
    const rate = type === 'alloc' ? `one sample per ${cp.fmt(cap.alloc_rate, 'bytes')}` : `${cap.hz} Hz`;
    text.textContent = `Capture ${cap.id} ${c.state} (${rate}): ${(c.isolates || []).length} isolate(s) matched` +
      (!(c.isolates || []).length ? ' (the selector matched nothing)' : c.complete ? ', every one whole at the rate asked.' : '; ' + bad.join('; '));
    box.dataset.id = cap.id;
    box.dataset.complete = c.complete ? '1' : '0';
    state.type = type;
    state.select = `{capture="${cap.id}"}`;
    state.from = String(Math.floor(cap.start_ns / 1e9));
    state.to = String(Math.ceil(cap.end_ns / 1e9) + 1);
    state.diff = '';
    state.zoom = '';
    $('capturedownload').hidden = false;
    // The diff of the capture against the always-on series its selector names, same minutes.
    const cmp = new URLSearchParams({ type, select: state.select, from: state.from, to: state.to, diff: '1',
      base_select: cap.select, base_from: state.from, base_to: state.to });
    $('capturecompare').href = location.pathname + '?' + cmp;
    $('capturecompare').hidden = false;
    await reload();
  }
  $('capture').addEventListener('click', () => capture());
  // The rate field: Hz for CPU, bytes between samples for allocations.
  function captureRateField() {
    const alloc = state.type === 'alloc';
    $('caprateword').textContent = alloc ? 'every' : 'at';
    $('caprateunit').textContent = alloc ? 'bytes' : 'Hz';
    $('caprate').placeholder = alloc ? '4096' : '1000';
  }
  $('capturedownload').addEventListener('click', e => { e.preventDefault(); $('download').click(); });

  // Page keys (not while typing): / search, Escape zoom out one level, r reset the zoom.
  // Escape in the search field leaves it; canvases handle their own Escape.
  document.addEventListener('keydown', e => {
    if (e.ctrlKey || e.metaKey || e.altKey || e.defaultPrevented) return;
    const t = e.target;
    if (t.closest && t.closest('input, select, textarea, dialog')) {
      if (e.key === 'Escape' && t.id === 'search') t.blur();
      return;
    }
    if (e.key === '/') {
      e.preventDefault();
      $('search').focus();
      $('search').select();
    } else if (e.key === 'Escape' && t.tagName !== 'CANVAS') {
      if (flame.zoom > 0) flame.zoomTo(Math.max(0, flame.parent[flame.zoom]));
    } else if (e.key === 'r' || e.key === 'R') {
      if (flame.n) flame.zoomTo(0);
    }
  });

  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => { timeline.resize(); if (state.group) groups.resize(); if (flame.n) flame.resize(); if (swCallers.n) { swCallers.resize(); swCallees.resize(); } }, 100);
  });

  // Tests and benchmarks reach the parts through here.
  cp.app = { state, flame, table, timeline, reload, swCallers, swCallees, openSandwich, groups };

  readURL();
  syncInputs();
  loadLabels().then(() => { syncInputs(); return reload(); }).then(() => { document.body.dataset.ready = '1'; });
})();
