// The timeline: totals per step over the timeline's span as filled bars on a canvas, the
// selected window (and in diff mode the base window) drawn over it. Dragging selects a
// window; arrow keys move the active one by a tenth of its width.
'use strict';

(function () {
  const H = 96, PAD_B = 18;

  class Timeline {
    // on.select(which, fromSec, toSec) is called when the user picks a window.
    constructor(canvas, on) {
      this.canvas = canvas;
      this.on = on;
      this.points = [];
      this.windows = {};     // name -> {from, to, color}
      this.active = 'target';
      this.drag = null;
      canvas.addEventListener('pointerdown', e => {
        canvas.setPointerCapture(e.pointerId);
        this.drag = { a: this.secAt(e.offsetX), b: this.secAt(e.offsetX) };
        this.draw();
      });
      canvas.addEventListener('pointermove', e => {
        if (!this.drag) return;
        this.drag.b = this.secAt(e.offsetX);
        this.draw();
      });
      canvas.addEventListener('pointerup', e => {
        if (!this.drag) return;
        let a = Math.min(this.drag.a, this.drag.b), b = Math.max(this.drag.a, this.drag.b);
        this.drag = null;
        if ((b - a) * this.pxPerSec() < 3) {
          // A click: centre the active window's width on the point.
          const w = this.windows[this.active], half = w ? (w.to - w.from) / 2 : 300;
          const c = this.secAt(e.offsetX);
          a = c - half; b = c + half;
        }
        this.on.select(this.active, Math.round(a), Math.round(b));
      });
      canvas.addEventListener('keydown', e => {
        const w = this.windows[this.active];
        if (!w || (e.key !== 'ArrowLeft' && e.key !== 'ArrowRight')) return;
        e.preventDefault();
        const d = Math.max(10, Math.round((w.to - w.from) / 10)) * (e.key === 'ArrowLeft' ? -1 : 1);
        this.on.select(this.active, w.from + d, w.to + d);
      });
    }

    // points: [[unixSec, v...], ...]; the last column is drawn. span: [fromSec, toSec].
    setData(points, span, unit) {
      this.points = points;
      this.span = span;
      this.unit = unit;
      this.resize();
    }

    setWindow(name, from, to, color) {
      this.windows[name] = { from, to, color };
      this.draw();
    }

    clearWindow(name) { delete this.windows[name]; this.draw(); }

    pxPerSec() { return this.w / Math.max(1, this.span[1] - this.span[0]); }
    secAt(px) { return this.span[0] + Math.max(0, Math.min(this.w, px)) / this.pxPerSec(); }
    pxAt(sec) { return (sec - this.span[0]) * this.pxPerSec(); }

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

    draw() {
      if (!this.span) return;
      const ctx = this.canvas.getContext('2d');
      const W = this.w, plotH = H - PAD_B;
      ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
      ctx.clearRect(0, 0, W, H);
      ctx.fillStyle = '#fafaf9';
      ctx.fillRect(0, 0, W, plotH);
      let max = 0;
      for (const p of this.points) max = Math.max(max, p[p.length - 1]);
      const step = this.points.length > 1 ? this.points[1][0] - this.points[0][0] : 10;
      const bw = Math.max(1, step * this.pxPerSec());
      ctx.fillStyle = '#ea580c';
      for (const p of this.points) {
        const v = p[p.length - 1];
        if (!v) continue;
        const h = Math.max(1, (plotH - 14) * v / (max || 1));
        ctx.fillRect(this.pxAt(p[0]), plotH - h, Math.max(1, bw - (bw > 3 ? 1 : 0)), h);
      }
      // Axis: a few time ticks.
      ctx.fillStyle = '#57534e';
      ctx.font = '11px system-ui, sans-serif';
      ctx.textBaseline = 'top';
      const ticks = Math.max(2, Math.floor(W / 160));
      for (let k = 0; k <= ticks; k++) {
        const s = this.span[0] + (this.span[1] - this.span[0]) * k / ticks;
        const t = cp.timeText(s).slice(5, 16);
        const x = Math.min(W - ctx.measureText(t).width - 2, Math.max(2, this.pxAt(s) - 30));
        ctx.fillText(t, x, plotH + 4);
      }
      ctx.textBaseline = 'top';
      ctx.fillText('max ' + cp.fmt(max, this.unit) + ' per ' + cp.durText(step), 4, 2);
      for (const [name, w] of Object.entries(this.windows)) this.band(ctx, w, plotH, name === this.active);
      if (this.drag) {
        const a = Math.min(this.drag.a, this.drag.b), b = Math.max(this.drag.a, this.drag.b);
        this.band(ctx, { from: a, to: b, color: this.windows[this.active] ? this.windows[this.active].color : '#2563eb' }, plotH, true);
      }
    }

    band(ctx, w, plotH, strong) {
      const x0 = this.pxAt(w.from), x1 = Math.max(x0 + 2, this.pxAt(w.to));
      ctx.globalAlpha = strong ? 0.22 : 0.14;
      ctx.fillStyle = w.color;
      ctx.fillRect(x0, 0, x1 - x0, plotH);
      ctx.globalAlpha = 1;
      ctx.strokeStyle = w.color;
      ctx.lineWidth = strong ? 2 : 1;
      ctx.strokeRect(x0 + 0.5, 0.5, x1 - x0 - 1, plotH - 1);
    }
  }

  cp.Timeline = Timeline;
})();
