// The flamegraph: a canvas icicle chart (root on top) of the API's JSON call tree. The tree
// is flattened once into preorder arrays so that a subtree is a contiguous index range: a
// draw walks the zoomed subtree and skips whole subtrees narrower than a pixel, which keeps
// a 20,000-node profile well under 100 ms. Zoom animates between views.
'use strict';

(function () {
  const ROW = 18;      // px per frame row
  const FONT = '12px ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace';

  class Flame {
    // canvas: the <canvas>; tip: the tooltip element; on: {zoom(i), select(i), sandwich(i)}
    // callbacks (sandwich: shift+click, the context menu or S on a frame); inverted draws the
    // root at the bottom (a sandwich's callers).
    constructor(canvas, tip, on, inverted) {
      this.canvas = canvas;
      this.inverted = !!inverted;
      this.maxd = 0;
      this.tip = tip;
      this.on = on || {};
      this.n = 0;
      this.zoom = 0;
      this.sel = -1;
      this.hover = -1;
      this.match = null;
      this.view = { x0: 0, w: 1 };
      this.lastDrawMs = 0;
      this.rows = [];
      canvas.addEventListener('mousemove', e => this.onMove(e));
      canvas.addEventListener('mouseleave', () => { this.hover = -1; this.hideTip(); });
      canvas.addEventListener('click', e => {
        const i = this.hit(e.offsetX, e.offsetY);
        if (i >= 0 && e.shiftKey && this.on.sandwich) { this.sel = i; this.draw(); this.on.sandwich(i); }
        else if (i >= 0) { this.sel = i; this.zoomTo(i); }
      });
      canvas.addEventListener('contextmenu', e => {
        const i = this.hit(e.offsetX, e.offsetY);
        if (i > 0 && this.on.sandwich) { e.preventDefault(); this.sel = i; this.draw(); this.on.sandwich(i); }
      });
      canvas.addEventListener('keydown', e => this.onKey(e));
      canvas.addEventListener('focus', () => { if (this.sel < 0 && this.n) this.sel = this.zoom; this.draw(); });
      canvas.addEventListener('blur', () => { this.hideTip(); this.draw(); });
    }

    // Loads a tree {sample_type, total, root}; diff trees also carry base_total/base_self.
    setData(json) {
      // Preorder with explicit stacks (trees can be deeper than the JS call stack).
      const objs = [], par = [], dep = [];
      const stack = [json.root], sp = [-1], sd = [0];
      while (stack.length) {
        const node = stack.pop(), p = sp.pop(), d = sd.pop();
        const me = objs.length;
        objs.push(node); par.push(p); dep.push(d);
        const kids = node.children;
        if (kids) for (let k = kids.length - 1; k >= 0; k--) { stack.push(kids[k]); sp.push(me); sd.push(d + 1); }
      }
      const n = this.n = objs.length;
      this.name = new Array(n);
      this.module = new Array(n);
      this.self = new Float64Array(n);
      this.total = new Float64Array(n);
      this.bself = new Float64Array(n);
      this.btotal = new Float64Array(n);
      this.x = new Float64Array(n);
      this.parent = Int32Array.from(par);
      this.depth = Int32Array.from(dep);
      this.size = new Int32Array(n).fill(1);
      const cursor = new Float64Array(n); // next free x inside each node
      for (let i = 0; i < n; i++) {
        const node = objs[i], p = par[i];
        this.name[i] = node.name;
        this.module[i] = node.module || '';
        this.self[i] = node.self;
        this.total[i] = node.total;
        this.bself[i] = node.base_self || 0;
        this.btotal[i] = node.base_total || 0;
        if (p >= 0) { this.x[i] = cursor[p]; cursor[p] += node.total; }
        cursor[i] = this.x[i];
      }
      for (let i = n - 1; i > 0; i--) this.size[this.parent[i]] += this.size[i];
      this.unit = (json.sample_type && json.sample_type.unit) || '';
      this.diff = json.base_total !== undefined;
      this.baseRoot = json.base_total || 0;
      this.colors = new Array(n);
      for (let i = 0; i < n; i++) {
        if (this.diff) {
          const p = this.total[0] ? this.total[i] / this.total[0] : 0;
          const q = this.baseRoot ? this.btotal[i] / this.baseRoot : 0;
          this.colors[i] = cp.diffColor(Math.max(p, q) ? (p - q) / Math.max(p, q) : 0);
        } else {
          this.colors[i] = cp.nameColor(this.name[i]);
        }
      }
      // The root is the whole profile (grey), or a sandwich's function (json.function).
      if (!this.diff && !json.function) this.colors[0] = 'hsl(30,10%,80%)';
      this.zoom = 0;
      this.sel = -1;
      this.match = null;
      this.view = { x0: 0, w: this.total[0] || 1 };
      this.resize();
    }

    // ---- layout and drawing -------------------------------------------------------------

    resize() {
      const w = this.canvas.parentElement.clientWidth;
      let maxd = 0;
      const z = this.zoom;
      for (let i = z, e = z + this.size[z]; i < e; i++) if (this.depth[i] > maxd) maxd = this.depth[i];
      this.maxd = maxd;
      const h = Math.max(1, maxd + 1) * ROW + 2;
      const dpr = window.devicePixelRatio || 1;
      this.cssW = w;
      this.canvas.style.width = w + 'px';
      this.canvas.style.height = h + 'px';
      this.canvas.width = Math.round(w * dpr);
      this.canvas.height = Math.round(h * dpr);
      this.dpr = dpr;
      this.draw();
    }

    // Draws the current view; returns (and keeps in lastDrawMs) the time it took.
    draw() {
      const t0 = performance.now();
      const ctx = this.canvas.getContext('2d');
      const W = this.cssW;
      ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
      ctx.clearRect(0, 0, W, this.canvas.height);
      if (!this.n) return 0;
      ctx.font = FONT;
      ctx.textBaseline = 'middle';
      if (!this.charW) this.charW = ctx.measureText('m').width;
      const rows = this.rows = [];
      const { x0, w } = this.view;
      const scale = W / w;
      const box = (i, px, pw) => {
        const d = this.depth[i];
        const y = this.rowY(d);
        const m = this.match;
        ctx.fillStyle = m && !m[i] ? '#e4e4e7' : m ? 'hsl(290,60%,74%)' : this.colors[i];
        ctx.fillRect(px, y, Math.max(pw - 1, 0.5), ROW - 1);
        (rows[d] || (rows[d] = [])).push(i, px, pw);
        if (pw > 3 * this.charW + 8) {
          const fit = Math.floor((pw - 8) / this.charW);
          let s = this.name[i];
          if (s.length > fit) s = s.slice(0, fit - 1) + '…';
          ctx.fillStyle = m && !m[i] ? '#71717a' : '#1c1917';
          ctx.fillText(s, px + 4, y + ROW / 2);
        }
      };
      // Ancestors of the zoomed frame span the width, dimmed.
      ctx.globalAlpha = 0.65;
      for (let a = this.parent[this.zoom]; a >= 0; a = this.parent[a]) box(a, 0, W);
      ctx.globalAlpha = 1;
      const xe = x0 + w;
      for (let i = this.zoom, e = this.zoom + this.size[this.zoom]; i < e;) {
        const xi = this.x[i], ti = this.total[i];
        const pw = ti * scale;
        if (pw < 0.35 || xi + ti <= x0 || xi >= xe) { i += this.size[i]; continue; }
        let px = (xi - x0) * scale, right = px + pw;
        if (px < 0) px = 0;
        if (right > W) right = W;
        box(i, px, right - px);
        i++;
      }
      if (this.sel >= 0 && document.activeElement === this.canvas) {
        const r = this.rect(this.sel);
        if (r) {
          ctx.strokeStyle = '#1d4ed8';
          ctx.lineWidth = 2;
          ctx.strokeRect(r.x + 1, r.y + 1, Math.max(r.w - 3, 2), ROW - 3);
        }
      }
      this.lastDrawMs = performance.now() - t0;
      return this.lastDrawMs;
    }

    // The top of depth d's row on the canvas.
    rowY(d) { return (this.inverted ? this.maxd - d : d) * ROW; }

    // Where frame i was drawn, or null.
    rect(i) {
      const row = this.rows[this.depth[i]];
      for (let k = 0; row && k < row.length; k += 3)
        if (row[k] === i) return { x: row[k + 1], y: this.rowY(this.depth[i]), w: row[k + 2] };
      return null;
    }

    hit(x, y) {
      const r = Math.floor(y / ROW);
      const row = this.rows[this.inverted ? this.maxd - r : r];
      for (let k = 0; row && k < row.length; k += 3)
        if (x >= row[k + 1] && x < row[k + 1] + row[k + 2]) return row[k];
      return -1;
    }

    // ---- zoom, search, focus ------------------------------------------------------------

    // Zooms to frame i (0 = reset), animating the view over ~150 ms.
    zoomTo(i, instant) {
      if (i < 0 || i >= this.n) return;
      this.sel = i;
      const from = { ...this.view };
      const to = { x0: this.x[i], w: this.total[i] || 1 };
      const growing = this.size[i] > this.size[this.zoom];
      // Zooming out, draw the new (larger) subtree during the animation; zooming in, the
      // old one, so nothing pops out before it has moved out of view.
      if (growing || instant) this.zoom = i;
      this.resize();
      const done = () => {
        this.zoom = i;
        this.view = to;
        this.resize();
        if (this.on.zoom) this.on.zoom(i);
      };
      if (instant || !window.requestAnimationFrame) return done();
      const start = performance.now();
      const step = now => {
        const t = Math.min(1, (now - start) / 150);
        const e = t * (2 - t);
        this.view = { x0: from.x0 + (to.x0 - from.x0) * e, w: from.w + (to.w - from.w) * e };
        if (t < 1) { this.draw(); requestAnimationFrame(step); } else done();
      };
      requestAnimationFrame(step);
    }

    // Frames from the root to i (inclusive).
    pathOf(i) {
      const p = [];
      for (; i >= 0; i = this.parent[i]) p.unshift(i);
      return p;
    }

    // The frame reached by following names from the root; the deepest match.
    findPath(names) {
      let i = 0;
      for (const name of names) {
        let found = -1;
        for (let c = i + 1, e = i + this.size[i]; c < e; c += this.size[c])
          if (this.name[c] === name) { found = c; break; }
        if (found < 0) break;
        i = found;
      }
      return i;
    }

    // Highlights frames whose name matches re (null clears). Returns the matched frames'
    // combined total (nested matches counted once) and the number of distinct functions.
    search(re) {
      if (!re) { this.match = null; this.draw(); return null; }
      const m = this.match = new Uint8Array(this.n);
      const names = new Set();
      let sum = 0;
      for (let i = 1, end = 0; i < this.n; i++) {
        if (!re.test(this.name[i])) continue;
        m[i] = 1;
        names.add(this.name[i]);
        if (i >= end) { sum += this.total[i]; end = i + this.size[i]; }
      }
      this.draw();
      return { total: sum, functions: names.size };
    }

    // The heaviest frame of function name, or -1.
    heaviest(name) {
      let best = -1;
      for (let i = 1; i < this.n; i++)
        if (this.name[i] === name && (best < 0 || this.total[i] > this.total[best])) best = i;
      return best;
    }

    // ---- tooltip and keyboard -----------------------------------------------------------

    describe(i) {
      const u = this.unit, all = this.total[0];
      const rows = [
        ['self', cp.fmt(this.self[i], u) + ' (' + cp.pct(this.self[i], all) + ')'],
        ['total', cp.fmt(this.total[i], u) + ' (' + cp.pct(this.total[i], all) + ')'],
      ];
      if (this.zoom > 0) rows.push(['of zoomed', cp.pct(this.total[i], this.total[this.zoom])]);
      if (this.module[i]) rows.push(['module', cp.esc(this.module[i])]);
      if (this.diff) {
        const p = all ? this.total[i] / all : 0, q = this.baseRoot ? this.btotal[i] / this.baseRoot : 0;
        rows.push(['base total', cp.fmt(this.btotal[i], u) + ' (' + cp.pct(this.btotal[i], this.baseRoot) + ')']);
        rows.push(['change', (p >= q ? '+' : '') + ((p - q) * 100).toFixed(2) + ' pts of share']);
      }
      return '<strong>' + cp.esc(this.name[i]) + '</strong><table>' +
        rows.map(r => `<tr><th>${r[0]}</th><td>${r[1]}</td></tr>`).join('') + '</table>';
    }

    showTip(i, x, y) {
      this.tip.innerHTML = this.describe(i);
      this.tip.hidden = false;
      const W = this.cssW, tw = this.tip.offsetWidth;
      this.tip.style.left = Math.max(0, Math.min(x + 12, W - tw - 4)) + 'px';
      this.tip.style.top = (y + 16) + 'px';
    }

    hideTip() { this.tip.hidden = true; }

    onMove(e) {
      const i = this.hit(e.offsetX, e.offsetY);
      this.canvas.style.cursor = i >= 0 ? 'pointer' : 'default';
      if (i < 0) { this.hover = -1; return this.hideTip(); }
      this.hover = i;
      this.showTip(i, e.offsetX, e.offsetY);
    }

    onKey(e) {
      let i = this.sel < 0 ? this.zoom : this.sel;
      const row = this.rows[this.depth[i]] || [];
      const k = row.indexOf(i);
      let key = e.key;
      if (this.inverted && (key === 'ArrowUp' || key === 'ArrowDown')) key = key === 'ArrowUp' ? 'ArrowDown' : 'ArrowUp';
      switch (key) {
        case 'ArrowUp': if (this.parent[i] >= 0) i = this.parent[i]; break;
        case 'ArrowDown': {
          // The widest visible child.
          let best = -1;
          for (let c = i + 1, end = i + this.size[i]; c < end; c += this.size[c])
            if (this.rect(c) && (best < 0 || this.total[c] > this.total[best])) best = c;
          if (best >= 0) i = best;
          break;
        }
        case 'ArrowLeft': if (k >= 3) i = row[k - 3]; break;
        case 'ArrowRight': if (k >= 0 && k + 3 < row.length) i = row[k + 3]; break;
        case 'Enter': case ' ': this.zoomTo(i); break;
        case 'Escape': this.zoomTo(Math.max(0, this.parent[this.zoom])); break;
        case 's': case 'S': if (this.on.sandwich && i > 0) this.on.sandwich(i); break;
        default: return;
      }
      e.preventDefault();
      this.sel = i;
      this.draw();
      const r = this.rect(i);
      if (r) this.showTip(i, r.x + Math.min(r.w / 2, 40), r.y);
      if (this.on.select) this.on.select(i);
    }
  }

  cp.Flame = Flame;
  cp.FLAME_ROW = ROW;
})();
