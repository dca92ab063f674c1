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

  // Builder of a tree of {name, module, self, bself, kids} merged by key; nodes are created
  // after their parent, so totals come out of one backward pass (finish).
  class Builder {
    constructor(name, module) {
      this.nodes = [];
      this.par = [];
      this.root = this.add(-1, name, module);
    }

    add(p, name, module) {
      const n = { name, self: 0, bself: 0, total: 0, btotal: 0, kids: null, children: null };
      if (module) n.module = module;
      this.nodes.push(n);
      this.par.push(p);
      return this.nodes.length - 1;
    }

    // The child of node p under key (created with name and module when missing).
    child(p, key, name, module) {
      const pn = this.nodes[p];
      if (!pn.kids) pn.kids = new Map();
      let c = pn.kids.get(key);
      if (c === undefined) { c = this.add(p, name, module); pn.kids.set(key, c); }
      return c;
    }

    // The JSON tree ({name, module, self, total[, base_self, base_total], children}) with
    // totals summed from selves, children by name as the API sends them.
    finish(diff) {
      const { nodes, par } = this;
      for (let i = nodes.length - 1; i >= 0; i--) {
        const n = nodes[i];
        n.total += n.self;
        n.btotal += n.bself;
        if (par[i] >= 0) {
          const p = nodes[par[i]];
          p.total += n.total;
          p.btotal += n.btotal;
          (p.children || (p.children = [])).push(n);
        }
      }
      for (const n of nodes) {
        if (n.children) n.children.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
        else delete n.children;
        if (diff) { n.base_self = n.bself; n.base_total = n.btotal; }
        delete n.kids; delete n.bself; delete n.btotal;
      }
      return nodes[0];
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
    const stack = [[json.root, -1]];
    while (stack.length) {
      const [node, p] = stack.pop();
      let me;
      if (p < 0) me = b.root;
      else if (opts.lang && !isLanguage(node)) me = p;
      else if (opts.collapse && node.module) {
        me = b.nodes[p].collapsed === node.module ? p : b.child(p, '\u0000' + node.module, node.module, node.module);
        b.nodes[me].collapsed = node.module;
      } else {
        me = b.child(p, node.name, node.name, node.module);
      }
      const mn = b.nodes[me];
      mn.self += node.self || 0;
      mn.bself += node.base_self || 0;
      if (node.children) for (let k = node.children.length - 1; k >= 0; k--) stack.push([node.children[k], me]);
    }
    for (const n of b.nodes) delete n.collapsed;
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
      for (a = f.parent[i]; a > 0; a = f.parent[a]) c = up.child(c, f.name[a], f.name[a]);
      up.nodes[c].self += f.total[i];
      up.nodes[c].bself += f.btotal[i];
      // callees
      map[i] = down.root;
      for (let j = i, e = i + f.size[i]; j < e; j++) {
        if (j > i) map[j] = down.child(map[f.parent[j]], f.name[j], f.name[j]);
        const n = down.nodes[map[j]];
        n.self += f.self[j];
        n.bself += f.bself[j];
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
