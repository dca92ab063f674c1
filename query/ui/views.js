// Trees derived in the page from the merged profile the API sent: the drawing toggles
// (language frames only, collapse module) and a function's sandwich (its callers above, its
// callees below). They change what is drawn, never what is fetched or stored.
'use strict';

(function () {
  // A language frame: JS, Python... code (no "module": no mapped object), not a pseudo-frame
  // such as [jit] or a bare address.
  function isLanguage(node) {
    return !node.module && !/^(\[|0x[0-9a-f]+$)/.test(node.name);
  }

  // Builder of a tree merged by key, in flat arrays (a 20,000-node tree builds in a few ms:
  // no object or Map per node). Nodes are created after their parent, so totals come out of
  // one backward pass (finish).
  class Builder {
    constructor(name, module) {
      this.name = [];
      this.module = [];
      this.self = [];
      this.bself = [];
      this.par = [];
      this.kids = new Map();  // parent * 2^22 + key id -> child
      this.keys = new Map();  // key -> key id
      this.root = this.add(-1, name, module);
    }

    add(p, name, module) {
      this.name.push(name);
      this.module.push(module || '');
      this.self.push(0);
      this.bself.push(0);
      this.par.push(p);
      return this.par.length - 1;
    }

    // The child of node p under key (created with name and module when missing).
    child(p, key, name, module) {
      let k = this.keys.get(key);
      if (k === undefined) { k = this.keys.size; this.keys.set(key, k); }
      const id = p * 4194304 + k;
      let c = this.kids.get(id);
      if (c === undefined) { c = this.add(p, name, module); this.kids.set(id, c); }
      return c;
    }

    // The JSON tree ({name, module, self, total[, base_self, base_total], children}) with
    // totals summed from selves, children by name as the API sends them.
    finish(diff) {
      const n = this.par.length, par = this.par;
      const total = Float64Array.from(this.self), btotal = Float64Array.from(this.bself);
      for (let i = n - 1; i > 0; i--) { total[par[i]] += total[i]; btotal[par[i]] += btotal[i]; }
      const out = new Array(n);
      for (let i = 0; i < n; i++) {
        const o = out[i] = { name: this.name[i], module: this.module[i], self: this.self[i], total: total[i], children: null };
        if (diff) { o.base_self = this.bself[i]; o.base_total = btotal[i]; }
        if (i) { const p = out[par[i]]; (p.children || (p.children = [])).push(o); }
      }
      const byName = (a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
      for (let i = 0; i < n; i++) if (out[i].children && out[i].children.length > 1) out[i].children.sort(byName);
      return out[0];
    }
  }

  // The API's JSON answer with its tree redrawn: opts.lang keeps language frames only (the
  // others' self goes to the nearest kept caller), opts.collapse draws each run of
  // consecutive frames of one module (workerd, libnode, libc) as one frame named after it.
  // Totals stay those of the answer. Returns json itself when neither is asked.
  function transform(json, opts) {
    if (!opts.lang && !opts.collapse) return json;
    const diff = json.base_total !== undefined;
    const b = new Builder(json.root.name);
    const collapsed = []; // per built node: the module it collapses, if any
    const stack = [json.root], ps = [-1]; // parallel stacks: no pair allocated per node
    while (stack.length) {
      const node = stack.pop(), p = ps.pop();
      let me;
      if (p < 0) me = b.root;
      else if (opts.lang && !isLanguage(node)) me = p;
      else if (opts.collapse && node.module) {
        me = collapsed[p] === node.module ? p : b.child(p, '\u0000' + node.module, node.module, node.module);
        collapsed[me] = node.module;
      } else {
        me = b.child(p, node.name, node.name, node.module);
      }
      b.self[me] += node.self || 0;
      b.bself[me] += node.base_self || 0;
      if (node.children) for (let k = node.children.length - 1; k >= 0; k--) { stack.push(node.children[k]); ps.push(me); }
    }
    const root = b.finish(diff);
    return { ...json, root };
  }

  // The sandwich of function name over flame f's arrays: {callers, callees, total, self},
  // each tree rooted at the function. Each stack counts once (at its outermost call of the
  // function), so both roots' totals are the function's total as the table gives it.
  // Callers: the chain of calling frames from the function up to the root; callees: the
  // function's subtrees merged.
  function sandwich(f, name) {
    const up = new Builder(name), down = new Builder(name);
    const map = new Int32Array(f.n);
    let self = 0;
    for (let i = 1; i < f.n; i++) {
      if (f.name[i] !== name) continue;
      let a = f.parent[i];
      while (a > 0 && f.name[a] !== name) a = f.parent[a];
      if (a > 0) continue; // inside an outer call: counted there
      // callers
      let c = up.root;
      for (a = f.parent[i]; a > 0; a = f.parent[a]) c = up.child(c, f.name[a], f.name[a], f.module[a]);
      up.self[c] += f.total[i];
      up.bself[c] += f.btotal[i];
      // callees
      map[i] = down.root;
      for (let j = i, e = i + f.size[i]; j < e; j++) {
        if (j > i) map[j] = down.child(map[f.parent[j]], f.name[j], f.name[j], f.module[j]);
        down.self[map[j]] += f.self[j];
        down.bself[map[j]] += f.bself[j];
      }
    }
    const callers = up.finish(f.diff), callees = down.finish(f.diff);
    // The callers tree's own self: calls from the top of the stack; for the page, the
    // function's self is its callees root's self.
    self = callees.self;
    const wrap = root => {
      const j = { sample_type: { unit: f.unit }, total: root.total, root, function: true };
      if (f.diff) j.base_total = root.base_total;
      return j;
    };
    return { callers: wrap(callers), callees: wrap(callees), total: callees.total, self };
  }

  cp.views = { isLanguage, transform, sandwich };
})();
