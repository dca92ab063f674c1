// A minimal pprof (profile.proto) writer and reader for the browser tests: profiles with
// known functions and values, gzip'd as contprof import expects; and a decoder to check
// the page's download. Only the fields the tests need.
'use strict';

const zlib = require('zlib');

// ---- writer -------------------------------------------------------------------------------

function varint(out, v) {
  v = BigInt(v);
  if (v < 0n) v += 1n << 64n;
  while (v >= 0x80n) { out.push(Number(v & 0x7fn) | 0x80); v >>= 7n; }
  out.push(Number(v));
}
function key(out, field, wire) { varint(out, (field << 3) | wire); }
function bytesField(out, field, bytes) { key(out, field, 2); varint(out, bytes.length); for (const b of bytes) out.push(b); }
function intField(out, field, v) { if (v) { key(out, field, 0); varint(out, v); } }
function packed(out, field, vals) { const b = []; for (const v of vals) varint(b, v); bytesField(out, field, b); }

// Encodes {types: [[type, unit]...], period: [type, unit, value], samples: [{stack: [leaf..root
// names], values: [...]}], timeNanos, durationNanos, mappings: [{file, start, limit, offset}]}
// and returns the gzip'd bytes. A stack name "@M+0xADDR" is an unsymbolized location at
// run-time address ADDR of mapping M (1-based), with no function; "NAME@M" is function NAME
// (no source file) at an address of mapping M: a symbolized native frame; "NAME:LINE" is
// function NAME (main.go) at line LINE, one location per line (else line 1).
function encode(p) {
  const strings = [''], sidx = new Map([['', 0]]);
  const s = x => { if (!sidx.has(x)) { sidx.set(x, strings.length); strings.push(x); } return sidx.get(x); };
  const funcs = new Map();    // stack name -> location id
  const fnIds = new Map();    // function name -> [id, native]
  const out = [];
  for (const [t, u] of p.types) { const b = []; intField(b, 1, s(t)); intField(b, 2, s(u)); bytesField(out, 1, b); }
  (p.mappings || []).forEach((m, i) => {
    const b = []; intField(b, 1, i + 1); intField(b, 2, m.start); intField(b, 3, m.limit);
    intField(b, 4, m.offset); intField(b, 5, s(m.file)); bytesField(out, 3, b);
  });
  for (const smp of p.samples) {
    const ids = smp.stack.map(n => { if (!funcs.has(n)) funcs.set(n, funcs.size + 1); return funcs.get(n); });
    const b = [];
    packed(b, 1, ids);
    packed(b, 2, smp.values);
    bytesField(out, 2, b);
  }
  const unsym = name => /^@(\d+)\+0x([0-9a-f]+)$/.exec(name);
  const native = name => /^(.+)@(\d+)$/.exec(name);
  const atLine = name => /^(.+):(\d+)$/.exec(name);
  const fnId = (fname, nat) => { if (!fnIds.has(fname)) fnIds.set(fname, [fnIds.size + 1, nat]); return fnIds.get(fname)[0]; };
  for (const [name, id] of funcs) {
    const u = unsym(name), nat = native(name), at = !nat && atLine(name), loc = []; intField(loc, 1, id);
    if (u) { intField(loc, 2, Number(u[1])); intField(loc, 3, BigInt('0x' + u[2])); }
    else {
      const line = []; intField(line, 1, fnId(nat ? nat[1] : at ? at[1] : name, !!nat)); intField(line, 2, at ? Number(at[2]) : 1);
      if (nat) { intField(loc, 2, Number(nat[2])); intField(loc, 3, p.mappings[Number(nat[2]) - 1].start + id * 16); }
      else intField(loc, 3, 0x1000 + id * 16);
      bytesField(loc, 4, line);
    }
    bytesField(out, 4, loc);
  }
  for (const [fname, [id, nat]] of fnIds) {
    const f = []; intField(f, 1, id); intField(f, 2, s(fname)); intField(f, 3, s(fname)); intField(f, 4, s(nat ? '' : 'main.go'));
    bytesField(out, 5, f);
  }
  const pt = p.period ? (() => { const b = []; intField(b, 1, s(p.period[0])); intField(b, 2, s(p.period[1])); return b; })() : null;
  for (const str of strings) bytesField(out, 6, Buffer.from(str, 'utf8'));
  intField(out, 9, p.timeNanos || 0);
  intField(out, 10, p.durationNanos || 0);
  if (pt) { bytesField(out, 11, pt); intField(out, 12, p.period[2]); }
  return zlib.gzipSync(Buffer.from(out));
}

// A CPU profile (samples/count, cpu/nanoseconds at 10 ms) from {"a;b;c": ns, ...} folded
// stacks (root first), with mappings for "@M+0xADDR" frames (see encode).
function cpuProfile(folded, mappings) {
  const samples = Object.entries(folded).map(([stack, ns]) => ({
    stack: stack.split(';').reverse(), values: [Math.round(ns / 1e7), ns],
  }));
  return encode({ types: [['samples', 'count'], ['cpu', 'nanoseconds']], period: ['cpu', 'nanoseconds', 1e7], samples, mappings });
}

// ---- reader -------------------------------------------------------------------------------

function fields(buf) {
  const out = [];
  let i = 0;
  const rv = () => { let v = 0n, sh = 0n, b; do { b = buf[i++]; v |= BigInt(b & 0x7f) << sh; sh += 7n; } while (b & 0x80); return v; };
  while (i < buf.length) {
    const k = Number(rv()), f = k >> 3, w = k & 7;
    if (w === 0) out.push([f, rv()]);
    else if (w === 2) { const n = Number(rv()); out.push([f, buf.subarray(i, i + n)]); i += n; }
    else if (w === 1) { out.push([f, buf.readBigUInt64LE(i)]); i += 8; }
    else if (w === 5) { out.push([f, BigInt(buf.readUInt32LE(i))]); i += 4; }
    else throw new Error('bad wire type ' + w);
  }
  return out;
}
const signed = v => Number(BigInt.asIntN(64, v));
function unpack(v) {
  if (typeof v === 'bigint') return [signed(v)];
  let i = 0; const out = []; // packed varints const out = [];
  while (i < v.length) { let x = 0n, sh = 0n, b; do { b = v[i++]; x |= BigInt(b & 0x7f) << sh; sh += 7n; } while (b & 0x80); out.push(signed(x)); }
  return out;
}

// Decodes gzip'd (or raw) pprof into {types, samples: [{stack: [names leaf first], values}],
// timeNanos, durationNanos}.
function decode(bytes) {
  let buf = Buffer.from(bytes);
  if (buf[0] === 0x1f && buf[1] === 0x8b) buf = zlib.gunzipSync(buf);
  const top = fields(buf);
  const strings = top.filter(([f]) => f === 6).map(([, v]) => v.toString('utf8'));
  const funcs = new Map(), locs = new Map();
  const p = { types: [], samples: [], timeNanos: 0, durationNanos: 0 };
  for (const [f, v] of top) {
    if (f === 5) { const m = new Map(fields(v)); funcs.set(Number(m.get(1) || 0n), strings[Number(m.get(2) || 0n)]); }
    if (f === 9) p.timeNanos = signed(v);
    if (f === 10) p.durationNanos = signed(v);
    if (f === 1) { const m = new Map(fields(v)); p.types.push([strings[Number(m.get(1) || 0n)], strings[Number(m.get(2) || 0n)]]); }
  }
  for (const [f, v] of top) {
    if (f !== 4) continue;
    const fl = fields(v);
    const id = Number((fl.find(([k]) => k === 1) || [0, 0n])[1]);
    const lines = fl.filter(([k]) => k === 4).map(([, l]) => funcs.get(Number(new Map(fields(l)).get(1) || 0n)));
    locs.set(id, lines);
  }
  for (const [f, v] of top) {
    if (f !== 2) continue;
    const fl = fields(v);
    const ids = [].concat(...fl.filter(([k]) => k === 1).map(([, x]) => unpack(x)));
    const values = [].concat(...fl.filter(([k]) => k === 2).map(([, x]) => unpack(x)));
    p.samples.push({ stack: [].concat(...ids.map(id => locs.get(id) || ['?'])), values });
  }
  return p;
}

module.exports = { encode, cpuProfile, decode };
