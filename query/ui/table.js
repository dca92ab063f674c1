// The function table: self and total per function, computed from the flamegraph's arrays
// (a recursive function's total counts each stack once), sortable by any column; a click or
// Enter on a row focuses that function in the flamegraph.
'use strict';

(function () {
  const MAX_ROWS = 400;

  class Table {
    // table: the <table>; on.pick(name) when a row is chosen; on.sort(key, dir) on sorting;
    // on.sandwich(name) from a row's ⇅ button or S.
    constructor(table, on) {
      this.table = table;
      this.body = table.tBodies[0];
      this.on = on;
      this.key = 'self';
      this.dir = -1;
      this.rows = [];
      for (const th of table.tHead.rows[0].cells) {
        if (!th.dataset.key) continue;
        th.querySelector('button').addEventListener('click', () => {
          const k = th.dataset.key;
          if (this.key === k) this.dir = -this.dir;
          else { this.key = k; this.dir = k === 'name' ? 1 : -1; }
          this.render();
          if (this.on.sort) this.on.sort(this.key, this.dir);
        });
      }
      const pick = tr => tr && tr.dataset.name !== undefined && this.on.pick(tr.dataset.name);
      this.body.addEventListener('click', e => {
        const sw = e.target.closest('button.sw'), tr = e.target.closest('tr');
        if (sw && tr && this.on.sandwich) this.on.sandwich(tr.dataset.name);
        else pick(tr);
      });
      this.body.addEventListener('keydown', e => {
        const tr = e.target.closest('tr');
        if (e.target.closest('button')) return;
        if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); pick(tr); }
        else if ((e.key === 's' || e.key === 'S') && tr && tr.dataset.name !== undefined && this.on.sandwich) { e.preventDefault(); this.on.sandwich(tr.dataset.name); }
        else if (e.key === 'ArrowDown' && tr && tr.nextElementSibling) { e.preventDefault(); tr.nextElementSibling.focus(); }
        else if (e.key === 'ArrowUp' && tr && tr.previousElementSibling) { e.preventDefault(); tr.previousElementSibling.focus(); }
      });
    }

    setSort(key, dir) {
      if (key) this.key = key;
      if (dir) this.dir = dir;
    }

    // Aggregates the flamegraph f by function name.
    setData(f) {
      const by = new Map();
      const onStack = new Map(); // name -> how many times it is on the current path
      const path = [];
      const get = name => {
        let r = by.get(name);
        if (!r) { r = { name, self: 0, total: 0, bself: 0, btotal: 0 }; by.set(name, r); }
        return r;
      };
      for (let i = 1; i < f.n; i++) {
        while (path.length && path[path.length - 1] !== f.parent[i]) {
          const j = path.pop();
          onStack.set(f.name[j], onStack.get(f.name[j]) - 1);
        }
        const r = get(f.name[i]);
        r.self += f.self[i];
        r.bself += f.bself[i];
        if (!onStack.get(f.name[i])) { r.total += f.total[i]; r.btotal += f.btotal[i]; }
        onStack.set(f.name[i], (onStack.get(f.name[i]) || 0) + 1);
        path.push(i);
      }
      this.rows = [...by.values()];
      for (const r of this.rows)
        r.delta = (f.total[0] ? r.total / f.total[0] : 0) - (f.baseRoot ? r.btotal / f.baseRoot : 0);
      this.all = f.total[0];
      this.unit = f.unit;
      this.diff = f.diff;
      this.render();
    }

    render() {
      const k = this.key, d = this.dir;
      this.rows.sort((a, b) => (k === 'name' ? a.name.localeCompare(b.name) : a[k] - b[k]) * d ||
        a.name.localeCompare(b.name));
      if (!this.diff && k === 'delta') { this.key = 'self'; return this.render(); }
      for (const th of this.table.tHead.rows[0].cells) {
        if (!th.dataset.key) continue;
        if (th.dataset.key === 'delta') th.hidden = !this.diff;
        th.setAttribute('aria-sort', th.dataset.key === k ? (d > 0 ? 'ascending' : 'descending') : 'none');
      }
      const u = this.unit, all = this.all;
      const cell = v => `<td class="num">${cp.fmt(v, u)}<span class="pct">${cp.pct(v, all)}</span></td>`;
      const change = r => {
        if (!this.diff) return '';
        const pts = (r.delta * 100).toFixed(2);
        const cls = r.delta > 0.0005 ? 'up' : r.delta < -0.0005 ? 'down' : '';
        return `<td class="num ${cls}">${r.delta > 0 ? '+' : ''}${pts} pts</td>`;
      };
      const html = [];
      for (const r of this.rows.slice(0, MAX_ROWS))
        html.push(`<tr tabindex="0" data-name="${cp.esc(r.name)}"><td class="fn" title="${cp.esc(r.name)}">${cp.esc(r.name)}</td>${cell(r.self)}${cell(r.total)}${change(r)}<td class="swcol"><button type="button" class="sw" tabindex="-1" title="Sandwich: callers and callees of ${cp.esc(r.name)} (S)">⇅</button></td></tr>`);
      if (this.rows.length > MAX_ROWS)
        html.push(`<tr class="more"><td colspan="5">${this.rows.length - MAX_ROWS} more functions; search to find them</td></tr>`);
      this.body.innerHTML = html.join('');
    }
  }

  cp.Table = Table;
})();
