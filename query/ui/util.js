// Shared helpers of the contprof page: value formatting, API requests (with an optional
// bearer token), selector parsing for the label pickers, and colours.
'use strict';

const cp = window.cp = {};

// Formats v in unit the way pprof does: 1.20s, 10ms, 3.50MB, 42.
cp.fmt = function (v, unit) {
  const a = Math.abs(v);
  if (!v) return '0';
  const f = (x, s) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2)) + s;
  if (unit === 'nanoseconds') {
    if (a >= 3600e9) return f(v / 3600e9, 'h');
    if (a >= 60e9) return f(v / 60e9, 'min');
    if (a >= 1e9) return f(v / 1e9, 's');
    if (a >= 1e6) return f(v / 1e6, 'ms');
    if (a >= 1e3) return f(v / 1e3, 'µs');
    return v + 'ns';
  }
  if (unit === 'bytes') {
    const u = ['B', 'kB', 'MB', 'GB', 'TB'];
    let i = 0, x = v;
    while (Math.abs(x) >= 1024 && i < u.length - 1) { x /= 1024; i++; }
    return i ? f(x, u[i]) : v + 'B';
  }
  if (a >= 1e9) return f(v / 1e9, 'G');
  if (a >= 1e6) return f(v / 1e6, 'M');
  if (a >= 1e4) return f(v / 1e3, 'k');
  return String(v);
};

cp.pct = function (part, whole) {
  if (!whole) return '0%';
  const p = 100 * part / whole;
  return (Math.abs(p) >= 10 ? p.toFixed(1) : p.toFixed(2)) + '%';
};

cp.esc = function (s) {
  return String(s).replace(/[&<>"']/g, c => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
};

// Unix seconds of a time parameter as the API reads it ("-1h", "now-15m", "now", unix
// seconds, RFC 3339), relative to nowSec.
cp.toSec = function (t, nowSec) {
  if (t === undefined || t === null || t === '' || t === 'now') return nowSec;
  if (/^-?\d+(\.\d+)?$/.test(t) && t[0] !== '-') return Number(t);
  const m = /^(now)?-(\d+(?:\.\d+)?)(s|m|h|d|w)$/.exec(t);
  if (m) return nowSec - Number(m[2]) * { s: 1, m: 60, h: 3600, d: 86400, w: 604800 }[m[3]];
  const d = Date.parse(t);
  return isNaN(d) ? nowSec : d / 1000;
};

cp.timeText = function (sec) {
  const d = new Date(sec * 1000);
  const p = n => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
};

cp.durText = function (s) {
  if (s >= 86400) return (s / 86400).toFixed(s % 86400 ? 1 : 0) + ' d';
  if (s >= 3600) return (s / 3600).toFixed(s % 3600 ? 1 : 0) + ' h';
  if (s >= 60) return (s / 60).toFixed(s % 60 ? 1 : 0) + ' min';
  return Math.round(s) + ' s';
};

// ---- API --------------------------------------------------------------------------------

cp.token = sessionStorage.getItem('contprof.token') || '';

// GETs (or method) path?params (path relative to the page, so a proxy may serve it under a prefix); resolves to parsed JSON (or an ArrayBuffer if binary). A 401 asks for a
// token once and retries. Errors carry the server's {"error": ...} message. An answer a
// cluster gave without some nodes' parts (the Contprof-Partial header, which every format
// carries; JSON adds "partial": true) is passed to cp.onPartial with the missing peers.
cp.get = async function (path, params, binary, method) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== '') qs.set(k, v);
  const url = path + (qs.toString() ? '?' + qs : '');
  for (let attempt = 0; ; attempt++) {
    const headers = cp.token ? { Authorization: 'Bearer ' + cp.token } : {};
    const r = await fetch(url, { headers, method: method || 'GET' });
    if (r.status === 401 && attempt === 0 && await cp.askToken()) continue;
    if (!r.ok) {
      let msg = r.status + ' ' + r.statusText;
      try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    const missing = (r.headers.get('Contprof-Partial') || '').split(',').filter(Boolean);
    const body = await (binary ? r.arrayBuffer() : r.json());
    if (!binary && body && body.partial === true && Array.isArray(body.missing_peers)) {
      for (const p of body.missing_peers) if (!missing.includes(p)) missing.push(p);
    }
    if (missing.length && cp.onPartial) cp.onPartial(missing);
    return body;
  }
};

// Shows the token dialog (once, however many requests are waiting); resolves to whether a
// token was entered.
let asking = null;
cp.askToken = function () {
  const dlg = document.getElementById('tokendialog');
  if (!asking) {
    asking = new Promise(resolve => {
      dlg.addEventListener('close', () => {
        cp.token = document.getElementById('token').value.trim();
        sessionStorage.setItem('contprof.token', cp.token);
        asking = null;
        resolve(!!cp.token);
      }, { once: true });
      dlg.showModal();
    });
  }
  return asking;
};

// ---- selectors --------------------------------------------------------------------------

// The name="value" matchers of a selector, as {name: value}; other matchers are kept out.
cp.parseEq = function (sel) {
  const out = {};
  const re = /([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"/g;
  let m;
  while ((m = re.exec(sel || ''))) if (m[2] === '=') out[m[1]] = m[3].replace(/\\(.)/g, '$1');
  return out;
};

// Sets (or with value '' removes) the name="value" matcher of a selector, keeping the rest.
cp.setEq = function (sel, name, value) {
  const parts = [];
  const re = /([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"/g;
  let m, found = false;
  while ((m = re.exec(sel || ''))) {
    if (m[1] === name && m[2] === '=') {
      found = true;
      if (value !== '') parts.push(`${name}="${value.replace(/["\\]/g, '\\$&')}"`);
    } else {
      parts.push(`${m[1]}${m[2]}"${m[3]}"`);
    }
  }
  if (!found && value !== '') parts.push(`${name}="${value.replace(/["\\]/g, '\\$&')}"`);
  return parts.length ? '{' + parts.join(',') + '}' : '';
};

// ---- colours ----------------------------------------------------------------------------

function hash(s) {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return h >>> 0;
}

// A warm, light colour per package (the name up to its last '.' or '::' before any '('),
// so dark text stays readable and one library's frames share a hue. From a fixed palette,
// so colouring 20,000 frames allocates nothing.
const PALETTE = [];
for (let k = 0; k < 64; k++)
  PALETTE.push(`hsl(${10 + (k * 7) % 45},${70 + (k * 13) % 20}%,${62 + (k * 5) % 14}%)`);
const pkgColor = new Map();
cp.nameColor = function (name) {
  let end = name.indexOf('(');
  if (end < 0) end = name.length;
  const cut = Math.max(name.lastIndexOf('.', end - 1), name.lastIndexOf('::', end - 1));
  const pkg = cut > 0 ? name.slice(0, cut) : name.slice(0, end);
  let c = pkgColor.get(pkg);
  if (!c) {
    c = PALETTE[hash(pkg) % PALETTE.length];
    if (pkgColor.size < 100000) pkgColor.set(pkg, c);
  }
  return c;
};

// Diff colour for a relative change r in [-1, 1]: red for growth, blue for shrinkage,
// grey when unchanged; always light enough for dark text.
cp.diffColor = function (r) {
  const a = Math.min(1, Math.abs(r));
  if (a < 0.02) return 'hsl(220,8%,82%)';
  return r > 0 ? `hsl(0,${35 + 55 * a}%,${85 - 25 * a}%)` : `hsl(215,${35 + 55 * a}%,${85 - 20 * a}%)`;
};
