// Group-by a label: the selection's totals per value of one label over the timeline's span,
// drawn as stacked bars, with a table of each group's total; a click on a group (row or bar)
// focuses it (adds name="value" to the selector). The API has no group-by: the page asks one
// timeline per value (at most MAX_VALUES values, PARALLEL at a time), keeps the TOP heaviest
// and draws the rest as "other" (the selection's own timeline minus the groups shown, so
// the stack always adds up to the selection).
'use strict';

(function () {
  const TOP = 10, MAX_VALUES = 50, PARALLEL = 4, H = 120, PAD_B = 18;
  // Distinct, light enough for the page, the last for "other".
  const COLORS = ['#f97316', '#3b82f6', '#10b981', '#a855f7', '#eab308', '#ef4444', '#06b6d4',
    '#84cc16', '#ec4899', '#6366f1'];
  const OTHER = '#a8a29e';

  class Groups {
    // canvas: the stacked timeline; table: the groups' <table>; on.focus(value) on a click.
    constructor(canvas, table, on) {
      this.canvas = canvas;
      this.table = table;
      this.on = on;
      this.groups = [];
      this.bars = [];
      canvas.addEventListener('click', e => {
        const g = this.hit(e.offsetX, e.offsetY);
        if (g && !g.other) this.on.focus(g.value);
      });
      table.tBodies[0].addEventListener('click', e => {
        const tr = e.target.closest('tr');
        if (tr && tr.dataset.value !== undefined) this.on.focus(tr.dataset.value);
      });
      table.tBodies[0].addEventListener('keydown', e => {
        const tr = e.target.closest('tr');
        if ((e.key === 'Enter' || e.key === ' ') && tr && tr.dataset.value !== undefined) {
          e.preventDefault();
          this.on.focus(tr.dataset.value);
        }
      });
    }

    // Loads the groups of q.label for q = {type, select, from, to, step, sample_type}, the
    // timeline's span; resolves to false if current() turned false meanwhile (a newer load).
    async load(q, current) {
      const label = q.label;
      const values = (await cp.get('api/v1/labels/' + encodeURIComponent(label) + '/values')).values || [];
      if (!current()) return false;
      const base = { type: q.type, from: q.from, to: q.to, step: q.step };
      const col = t => {
        const names = (t.sample_types || []).map(s => s.type);
        let i = names.indexOf(q.sample_type);
        if (i < 0) i = names.length - 1;
        return { i, unit: i >= 0 ? t.sample_types[i].unit : '' };
      };
      const all = await cp.get('api/v1/timeline', { ...base, select: q.select });
      if (!current()) return false;
      const c = col(all);
      // A selector already naming label="v" has one group: v (setEq would replace it).
      const pinned = cp.parseEq(q.select)[label];
      const asked = pinned !== undefined ? [pinned] : values.slice(0, MAX_VALUES);
      const series = [];
      let next = 0;
      await Promise.all(Array.from({ length: Math.min(PARALLEL, asked.length) }, async () => {
        while (next < asked.length) {
          const value = asked[next++];
          const t = await cp.get('api/v1/timeline', { ...base, select: cp.setEq(q.select, label, value) });
          const k = col(t).i;
          const pts = new Map();
          let total = 0;
          for (const p of t.points || []) { const v = p[1 + k] || 0; if (v) { pts.set(p[0], v); total += v; } }
          if (total) series.push({ value, pts, total });
        }
      }));
      if (!current()) return false;
      series.sort((a, b) => b.total - a.total || (a.value < b.value ? -1 : 1));
      const top = series.slice(0, TOP);
      const times = (all.points || []).map(p => p[0]);
      const allPts = new Map((all.points || []).map(p => [p[0], p[1 + c.i] || 0]));
      const other = { value: 'other', other: true, pts: new Map(), total: 0 };
      for (const t of times) {
        let rest = allPts.get(t) || 0;
        for (const g of top) rest -= g.pts.get(t) || 0;
        if (rest > 0) { other.pts.set(t, rest); other.total += rest; }
      }
      this.groups = top.map((g, k) => ({ ...g, color: COLORS[k % COLORS.length] }));
      if (other.total > 0) { other.color = OTHER; this.groups.push(other); }
      this.label = label;
      this.times = times;
      this.span = [q.from, q.to];
      this.step = parseInt(q.step, 10) || 10;
      this.unit = c.unit;
      this.all = [...allPts.values()].reduce((a, b) => a + b, 0);
      this.truncated = pinned === undefined && values.length > asked.length ? values.length : 0;
      this.render();
      this.resize();
      return true;
    }

    render() {
      const rows = this.groups.map(g => {
        const attrs = g.other ? 'class="other"' : `tabindex="0" data-value="${cp.esc(g.value)}"`;
        const name = g.other ? `<em>other${this.truncated ? ` (of ${this.truncated} values, the first ${MAX_VALUES} ranked)` : ''}</em>` : cp.esc(g.value);
        return `<tr ${attrs}><td><span class="swatch" data-color="${g.color}"></span>${name}</td>` +
          `<td class="num">${cp.fmt(g.total, this.unit)}</td><td class="num">${cp.pct(g.total, this.all)}</td></tr>`;
      });
      if (!rows.length) rows.push(`<tr class="other"><td colspan="3">No data for any value of ${cp.esc(this.label)} in this span.</td></tr>`);
      this.table.tBodies[0].innerHTML = rows.join('');
      // the page's CSP allows no style attribute in markup; the CSSOM is fine
      for (const sw of this.table.querySelectorAll('.swatch[data-color]')) sw.style.background = sw.dataset.color;
      this.table.tHead.rows[0].cells[0].textContent = this.label;
    }

    resize() {
      const dpr = window.devicePixelRatio || 1;
      this.w = this.canvas.parentElement.clientWidth;
      this.canvas.style.width = this.w + 'px';
      this.canvas.style.height = H + 'px';
      this.canvas.width = Math.round(this.w * dpr);
      this.canvas.height = Math.round(H * dpr);
      this.dpr = dpr;
      this.draw();
    }

    pxAt(sec) { return (sec - this.span[0]) * this.w / Math.max(1, this.span[1] - this.span[0]); }

    // Stacked bars, the heaviest group at the bottom; remembers each segment for hit().
    draw() {
      if (!this.span) return;
      const ctx = this.canvas.getContext('2d'), W = this.w, plotH = H - PAD_B;
      ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
      ctx.clearRect(0, 0, W, H);
      ctx.fillStyle = '#fafaf9';
      ctx.fillRect(0, 0, W, plotH);
      let max = 0;
      for (const t of this.times) {
        let s = 0;
        for (const g of this.groups) s += g.pts.get(t) || 0;
        max = Math.max(max, s);
      }
      const bw = Math.max(1, this.step * W / Math.max(1, this.span[1] - this.span[0]));
      const bars = this.bars = [];
      for (const t of this.times) {
        let y = plotH;
        const x = this.pxAt(t), w = Math.max(1, bw - (bw > 3 ? 1 : 0));
        for (const g of this.groups) {
          const v = g.pts.get(t) || 0;
          if (!v) continue;
          const h = Math.max(1, (plotH - 14) * v / (max || 1));
          ctx.fillStyle = g.color;
          ctx.fillRect(x, y - h, w, h);
          bars.push({ x, y: y - h, w, h, g, t });
          y -= h;
        }
      }
      ctx.fillStyle = '#57534e';
      ctx.font = '11px system-ui, sans-serif';
      ctx.textBaseline = 'top';
      ctx.fillText(`by ${this.label} · max ${cp.fmt(max, this.unit)} per ${cp.durText(this.step)}`, 4, 2);
      const ticks = Math.max(2, Math.floor(W / 160));
      for (let k = 0; k <= ticks; k++) {
        const s = this.span[0] + (this.span[1] - this.span[0]) * k / ticks;
        const txt = cp.timeText(s).slice(5, 16);
        ctx.fillText(txt, Math.min(W - ctx.measureText(txt).width - 2, Math.max(2, this.pxAt(s) - 30)), plotH + 4);
      }
    }

    // The group drawn at (x, y) (canvas CSS pixels), or null.
    hit(x, y) {
      for (const b of this.bars) if (x >= b.x && x < b.x + Math.max(b.w, 2) && y >= b.y && y < b.y + b.h) return b.g;
      return null;
    }
  }

  cp.Groups = Groups;
})();
