// The line view: where in one function the time goes, by source line. The JSON tree names
// functions only, so the page reads the window's pprof (the download's bytes) and sums, per
// line of the function, its self (the function at the leaf) and total (each stack once per
// line). Lines are what the data carries: native code symbolized with `lines`, the V8
// source's and perf-map frames (today one line per function: its start).
'use strict';

(function () {
  // ---- a pprof reader: only the fields the view needs -----------------------------------

  async function gunzip(buf) {
    const b = new Uint8Array(buf);
    if (b[0] !== 0x1f || b[1] !== 0x8b) return b;
    const s = new Blob([b]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Uint8Array(await new Response(s).arrayBuffer());
  }

  // Calls fn(field, wire, value, start, end) for each field of b[start, end): value is the
  // varint for wire 0, else the payload's [start, end) as value = {s, e}.
  function fields(b, start, end, fn) {
    let i = start;
    const varint = () => {
      let v = 0, mul = 1, x;
      do {
        if (i >= end) throw new Error('pprof: truncated varint at byte ' + i);
        x = b[i++];
        v += (x & 0x7f) * mul;
        mul *= 128;
      } while (x & 0x80);
      return v >= 2 ** 63 ? v - 2 ** 64 : v; // int64 two's complement (values only)
    };
    while (i < end) {
      const k = varint(), f = Math.floor(k / 8), w = k % 8;
      if (w === 0) fn(f, 0, varint());
      else if (w === 2) {
        const n = varint();
        if (n > end - i) throw new Error(`pprof: field ${f} of ${n} bytes past the end at byte ${i}`);
        fn(f, 2, { s: i, e: i + n });
        i += n;
      } else if (w === 1) i += 8;
      else if (w === 5) i += 4;
      else throw new Error(`pprof: wire type ${w} at byte ${i}`);
    }
  }

  // Packed (or single) varints of a field into out.
  function ints(b, w, v, out) {
    if (w === 0) { out.push(v); return; }
    let i = v.s;
    while (i < v.e) {
      let x = 0, mul = 1, c;
      do { c = b[i++]; x += (c & 0x7f) * mul; mul *= 128; } while ((c & 0x80) && i < v.e);
      out.push(x >= 2 ** 63 ? x - 2 ** 64 : x);
    }
  }

  // {types: [[type, unit]], funcs: Map id -> {name, file}, locs: Map id -> [[fn id, line]]
  // (innermost first), samples: [{locs, values}]} of pprof bytes (gzip'd or not).
  async function decode(buf) {
    const b = await gunzip(buf);
    const strings = [], types = [], funcs = new Map(), locs = new Map(), samples = [];
    const text = new TextDecoder();
    const raw = { types: [], funcs: [], locs: [], samples: [] };
    fields(b, 0, b.length, (f, w, v) => {
      if (w !== 2) return;
      if (f === 6) strings.push(text.decode(b.subarray(v.s, v.e)));
      else if (f === 1) raw.types.push(v);
      else if (f === 5) raw.funcs.push(v);
      else if (f === 4) raw.locs.push(v);
      else if (f === 2) raw.samples.push(v);
    });
    const str = i => strings[i] || '';
    for (const v of raw.types) {
      const t = [0, 0];
      fields(b, v.s, v.e, (f, w, x) => { if (w === 0 && (f === 1 || f === 2)) t[f - 1] = x; });
      types.push([str(t[0]), str(t[1])]);
    }
    for (const v of raw.funcs) {
      let id = 0, name = 0, sys = 0, file = 0;
      fields(b, v.s, v.e, (f, w, x) => {
        if (w !== 0) return;
        if (f === 1) id = x; else if (f === 2) name = x; else if (f === 3) sys = x; else if (f === 4) file = x;
      });
      funcs.set(id, { name: str(name) || str(sys), file: str(file) });
    }
    for (const v of raw.locs) {
      let id = 0;
      const lines = [];
      fields(b, v.s, v.e, (f, w, x) => {
        if (f === 1 && w === 0) id = x;
        else if (f === 4 && w === 2) {
          const l = [0, 0];
          fields(b, x.s, x.e, (g, w2, y) => { if (w2 === 0 && (g === 1 || g === 2)) l[g - 1] = y; });
          lines.push(l);
        }
      });
      locs.set(id, lines);
    }
    for (const v of raw.samples) {
      const s = { locs: [], values: [] };
      fields(b, v.s, v.e, (f, w, x) => {
        if (f === 1) ints(b, w, x, s.locs);
        else if (f === 2) ints(b, w, x, s.values);
      });
      samples.push(s);
    }
    return { types, funcs, locs, samples };
  }

  // Per line of function name in p (value column vi): {file, total, rows: [{line, self,
  // total}] by line}. self: the function is the leaf (its innermost line there); total: each
  // stack once per line of the function in it.
  function byLine(p, name, vi) {
    const rows = new Map(), files = new Set();
    let total = 0;
    const row = l => { let r = rows.get(l); if (!r) { r = { line: l, self: 0, total: 0 }; rows.set(l, r); } return r; };
    for (const s of p.samples) {
      const v = s.values[vi] || 0;
      if (!v) continue;
      const seen = new Set();
      let leaf = true, any = false;
      for (const id of s.locs) {
        for (const [fid, line] of p.locs.get(id) || []) {
          const fn = p.funcs.get(fid);
          if (fn && fn.name === name) {
            if (leaf) row(line).self += v;
            if (!seen.has(line)) { seen.add(line); row(line).total += v; }
            if (fn.file) files.add(fn.file);
            any = true;
          }
          leaf = false;
        }
      }
      if (any) total += v;
    }
    return { file: [...files].join(', '), total, rows: [...rows.values()].sort((a, b) => a.line - b.line) };
  }

  cp.lines = { decode, byLine };
})();
