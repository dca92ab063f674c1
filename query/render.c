/* Renderers of merged profiles: frame naming, the call-tree (a trie of frame names built from
 * every sample's stack), and the top, folded and JSON views on top of it. */
#include "render.h"

#include <inttypes.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "times.h"
#include "selector.h" /* cp_regex_check */

/* ---- frame names -------------------------------------------------------------------- */

/* Distinct frame names, interned by content across one or two profiles. */
typedef struct names {
    CP_VEC(const char *) s;
    uint32_t *slots; /* index + 1 */
    uint32_t nslots;
    CP_VEC(char *) owned; /* synthesized names ("libc.so.6+0x29d8f") */
    CP_VEC(const char *)
    mod; /* per name: its object's base name, from the first mapped
            location seen with it; NULL: none (language frames) */
} names;

static void names_close(names *n)
{
    free(n->s.v);
    free(n->slots);
    for (uint32_t i = 0; i < n->owned.n; i++)
        free(n->owned.v[i]);
    free(n->owned.v);
    free(n->mod.v);
    memset(n, 0, sizeof *n);
}

static int names_grow(names *n)
{
    uint32_t ns = n->nslots ? n->nslots * 2 : 1024;
    uint32_t *sl = calloc(ns, sizeof *sl);
    if (!sl) return CP_ENOMEM;
    for (uint32_t i = 0; i < n->s.n; i++) {
        uint64_t h = cp_hash_bytes(n->s.v[i], strlen(n->s.v[i]), 7);
        uint32_t j = (uint32_t)h & (ns - 1);
        while (sl[j])
            j = (j + 1) & (ns - 1);
        sl[j] = i + 1;
    }
    free(n->slots);
    n->slots = sl;
    n->nslots = ns;
    return 0;
}

static int names_intern(names *n, const char *s, uint32_t *id)
{
    if ((size_t)(n->s.n + 1) * 2 > n->nslots && names_grow(n)) return CP_ENOMEM;
    size_t len = strlen(s);
    uint32_t j = (uint32_t)cp_hash_bytes(s, len, 7) & (n->nslots - 1);
    while (n->slots[j]) {
        const char *o = n->s.v[n->slots[j] - 1];
        if (strcmp(o, s) == 0) {
            *id = n->slots[j] - 1;
            return 0;
        }
        j = (j + 1) & (n->nslots - 1);
    }
    if (cp_vec_push(&n->s, s) || cp_vec_push(&n->mod, (const char *)NULL)) return CP_ENOMEM;
    n->slots[j] = n->s.n;
    *id = n->s.n - 1;
    return 0;
}

/* Per location of one profile: its frames (name ids), leaf first. */
typedef struct frames {
    CP_VEC(uint32_t) off; /* per location: offset into ids; off[nlocs] = end */
    CP_VEC(uint32_t) ids;
} frames;

static void frames_close(frames *f)
{
    free(f->off.v);
    free(f->ids.v);
}

/* The base name of the object a location's code is in ("workerd", "libc.so.6"), pointing
 * into p's strings; NULL when it has no mapping naming an object (language frames: perf-map
 * JIT code, the V8 source's and Python's frames). */
static const char *location_module(const cp_profile *p, const cp_location *loc)
{
    if (!loc->mapping_id || loc->mapping_id > p->mappings.n) return NULL;
    const cp_mapping *m = &p->mappings.v[loc->mapping_id - 1];
    const char *file = cp_profile_str(p, m->filename), *bid = cp_profile_str(p, m->build_id);
    if (!cp_mapping_names_object(file, strlen(file), strlen(bid))) return NULL;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    return *base ? base : *bid ? bid : NULL;
}

static int frames_build(const cp_profile *p, names *nm, frames *f)
{
    if (cp_vec_reserve(&f->off, (size_t)p->locations.n + 1)) return CP_ENOMEM;
    for (uint32_t i = 0; i < p->locations.n; i++) {
        const cp_location *loc = &p->locations.v[i];
        f->off.v[f->off.n++] = f->ids.n;
        const char *mod = location_module(p, loc);
        uint32_t id, first = f->ids.n;
        int any = 0;
        for (uint32_t k = 0; k < loc->nlines; k++) {
            if (loc->line_off + k >= p->lines.n) break;
            uint32_t fid = p->lines.v[loc->line_off + k].function_id;
            if (fid == 0 || fid > p->functions.n) continue;
            const cp_function *fn = &p->functions.v[fid - 1];
            const char *name = cp_profile_str(p, fn->name);
            if (!*name) name = cp_profile_str(p, fn->system_name);
            if (!*name) continue;
            if (names_intern(nm, name, &id) || cp_vec_push(&f->ids, id)) return CP_ENOMEM;
            any = 1;
        }
        if (!any) {
            /* unsymbolized: module+0xOFFSET, the same in every process (0xADDRESS only
             * where no object is known) */
            char buf[300];
            cp_location_label(p, loc, buf, sizeof buf);
            char *d = strdup(buf);
            if (!d || cp_vec_push(&nm->owned, d)) {
                free(d);
                return CP_ENOMEM;
            }
            if (names_intern(nm, d, &id) || cp_vec_push(&f->ids, id)) return CP_ENOMEM;
        }
        for (uint32_t k = first; mod && k < f->ids.n; k++)
            if (!nm->mod.v[f->ids.v[k]]) nm->mod.v[f->ids.v[k]] = mod;
    }
    f->off.v[f->off.n] = f->ids.n;
    return 0;
}

/* ---- the call tree ------------------------------------------------------------------ */

typedef struct tnode {
    uint32_t name, parent, depth;
    int64_t self[2], total[2];
} tnode;

typedef struct tree {
    CP_VEC(tnode) n; /* node 0 is the root */
    uint32_t *slots; /* (parent, name) -> node index + 1 */
    uint32_t nslots;
} tree;

static void tree_close(tree *t)
{
    free(t->n.v);
    free(t->slots);
}

static uint32_t tree_hash(uint32_t parent, uint32_t name)
{
    return (uint32_t)cp_hash_u64(((uint64_t)parent << 32) | name, 0x51);
}

static int tree_grow(tree *t)
{
    uint32_t ns = t->nslots ? t->nslots * 2 : 4096;
    uint32_t *sl = calloc(ns, sizeof *sl);
    if (!sl) return CP_ENOMEM;
    for (uint32_t i = 1; i < t->n.n; i++) {
        uint32_t j = tree_hash(t->n.v[i].parent, t->n.v[i].name) & (ns - 1);
        while (sl[j])
            j = (j + 1) & (ns - 1);
        sl[j] = i + 1;
    }
    free(t->slots);
    t->slots = sl;
    t->nslots = ns;
    return 0;
}

static int tree_init(tree *t)
{
    memset(t, 0, sizeof *t);
    tnode root = {.name = UINT32_MAX};
    if (cp_vec_push(&t->n, root)) return CP_ENOMEM;
    return tree_grow(t);
}

static int tree_child(tree *t, uint32_t parent, uint32_t name, uint32_t *out)
{
    if ((size_t)(t->n.n + 1) * 2 > t->nslots && tree_grow(t)) return CP_ENOMEM;
    uint32_t j = tree_hash(parent, name) & (t->nslots - 1);
    while (t->slots[j]) {
        tnode *o = &t->n.v[t->slots[j] - 1];
        if (o->parent == parent && o->name == name) {
            *out = t->slots[j] - 1;
            return 0;
        }
        j = (j + 1) & (t->nslots - 1);
    }
    tnode nn = {.name = name, .parent = parent, .depth = t->n.v[parent].depth + 1};
    if (cp_vec_push(&t->n, nn)) return CP_ENOMEM;
    t->slots[j] = t->n.n;
    *out = t->n.n - 1;
    return 0;
}

/* Adds every sample of p (value column vi) to slot of t. */
static int tree_add(tree *t, const cp_profile *p, int vi, const frames *f, int slot)
{
    CP_VEC(uint32_t) path = {0};
    int rc = 0;
    uint32_t nt = p->sample_types.n;
    for (uint32_t s = 0; s < p->samples.n; s++) {
        const cp_sample *sm = &p->samples.v[s];
        int64_t v = p->values.v[(size_t)s * nt + (uint32_t)vi];
        if (v == 0) continue;
        path.n = 0;
        /* Stack is leaf first; walk it backwards to go root -> leaf. */
        for (uint32_t k = sm->nlocs; k-- > 0;) {
            uint32_t lid = p->stack.v[sm->loc_off + k];
            if (lid == 0 || lid > p->locations.n) continue;
            uint32_t a = f->off.v[lid - 1], b = f->off.v[lid];
            for (uint32_t q = b; q-- > a;) {
                if (cp_vec_push(&path, f->ids.v[q])) {
                    rc = CP_ENOMEM;
                    goto out;
                }
            }
        }
        uint32_t node = 0;
        t->n.v[0].total[slot] += v;
        for (uint32_t k = 0; k < path.n; k++) {
            if ((rc = tree_child(t, node, path.v[k], &node))) goto out;
            t->n.v[node].total[slot] += v;
        }
        t->n.v[node].self[slot] += v;
    }
out:
    free(path.v);
    return rc;
}

/* Children of each node in CSR form, sorted by name. */
typedef struct kids {
    uint32_t *off; /* n + 1 */
    uint32_t *ids;
} kids;

static int cmp_name_ptr(const void *a, const void *b, void *arg)
{
    const names *nm = arg;
    return strcmp(nm->s.v[*(const uint32_t *)a], nm->s.v[*(const uint32_t *)b]);
}

static int cmp_child(const void *a, const void *b, void *arg)
{
    const uint32_t *order = arg; /* node -> rank of its name */
    uint32_t x = order[*(const uint32_t *)a], y = order[*(const uint32_t *)b];
    return x < y ? -1 : x > y;
}

/* keep may be NULL (all). Children are sorted by name: the distinct names are sorted once
 * and children compare by their name's rank. */
static int kids_build(const tree *t, const names *nm, const uint8_t *keep, kids *k)
{
    uint32_t n = t->n.n;
    k->off = calloc((size_t)n + 1, sizeof *k->off);
    k->ids = malloc(((size_t)n + 1) * sizeof *k->ids);
    uint32_t *fill = malloc(((size_t)n + 1) * sizeof *fill);
    uint32_t *byname = malloc(((size_t)nm->s.n + 1) * sizeof *byname);
    uint32_t *name_rank = malloc(((size_t)nm->s.n + 1) * sizeof *name_rank);
    uint32_t *node_rank = malloc(((size_t)n + 1) * sizeof *node_rank);
    int rc = 0;
    if (!k->off || !k->ids || !fill || !byname || !name_rank || !node_rank) {
        rc = CP_ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < nm->s.n; i++)
        byname[i] = i;
    qsort_r(byname, nm->s.n, sizeof *byname, cmp_name_ptr, (void *)nm);
    for (uint32_t i = 0; i < nm->s.n; i++)
        name_rank[byname[i]] = i;
    node_rank[0] = 0;
    for (uint32_t i = 1; i < n; i++)
        node_rank[i] = name_rank[t->n.v[i].name];
    for (uint32_t i = 1; i < n; i++)
        if (!keep || keep[i]) k->off[t->n.v[i].parent + 1]++;
    for (uint32_t i = 0; i < n; i++)
        k->off[i + 1] += k->off[i];
    memcpy(fill, k->off, ((size_t)n + 1) * sizeof *fill);
    for (uint32_t i = 1; i < n; i++)
        if (!keep || keep[i]) k->ids[fill[t->n.v[i].parent]++] = i;
    for (uint32_t i = 0; i < n; i++)
        if (k->off[i + 1] - k->off[i] > 1)
            qsort_r(k->ids + k->off[i], k->off[i + 1] - k->off[i], sizeof *k->ids, cmp_child,
                    node_rank);
out:
    free(fill);
    free(byname);
    free(name_rank);
    free(node_rank);
    return rc;
}

static void kids_close(kids *k)
{
    free(k->off);
    free(k->ids);
}

/* ---- value columns and units -------------------------------------------------------- */

int cp_render_value_index(const cp_profile *p, const char *name, int *vi, cp_err *err)
{
    if (p->sample_types.n == 0) {
        *vi = 0;
        return name && *name
                   ? cp_err_set(err, CP_EINVAL, "sample type '%.64s' not in an empty profile", name)
                   : 0;
    }
    if (!name || !*name) {
        *vi = (int)p->sample_types.n - 1;
        if (p->default_sample_type) {
            const char *d = cp_profile_str(p, p->default_sample_type);
            int i = cp_profile_find_type(p, d);
            if (i >= 0) *vi = i;
        }
        return 0;
    }
    int i = cp_profile_find_type(p, name);
    if (i >= 0) {
        *vi = i;
        return 0;
    }
    char list[200] = "";
    size_t l = 0;
    for (uint32_t t = 0; t < p->sample_types.n && l < sizeof list - 70; t++)
        l += (size_t)snprintf(list + l, sizeof list - l, "%s%.60s", t ? ", " : "",
                              cp_profile_str(p, p->sample_types.v[t].type));
    return cp_err_set(err, CP_EINVAL, "unknown sample type '%.64s' (profile has: %s)", name, list);
}

int cp_render_default_index(const cp_profile *p)
{
    int vi = 0;
    cp_render_value_index(p, NULL, &vi, NULL);
    return vi;
}

int cp_render_find_index(const cp_profile *p, const char *type)
{
    int vi;
    return cp_render_value_index(p, type, &vi, NULL) ? -1 : vi;
}

void cp_render_value(int64_t v, const char *unit, char *buf, size_t len)
{
    static const struct {
        const char *unit;
        const char *sfx[6];
        double step[6];
    } scales[] = {
        {"nanoseconds", {"ns", "us", "ms", "s", NULL}, {1, 1e3, 1e6, 1e9}},
        {"microseconds", {"us", "ms", "s", NULL}, {1, 1e3, 1e6}},
        {"milliseconds", {"ms", "s", NULL}, {1, 1e3}},
        {"seconds", {"s", NULL}, {1}},
        {"bytes",
         {"B", "kB", "MB", "GB", "TB", NULL},
         {1, 1024., 1048576., 1073741824., 1099511627776.}},
    };
    if (v == 0) {
        snprintf(buf, len, "0");
        return;
    }
    for (size_t i = 0; unit && i < sizeof scales / sizeof scales[0]; i++) {
        if (strcmp(unit, scales[i].unit) != 0) continue;
        double a = v < 0 ? -(double)v : (double)v;
        int k = 0;
        while (scales[i].sfx[k + 1] && a >= scales[i].step[k + 1])
            k++;
        double x = (double)v / scales[i].step[k];
        if (x == (double)(int64_t)x)
            snprintf(buf, len, "%" PRId64 "%s", (int64_t)x, scales[i].sfx[k]);
        else
            snprintf(buf, len, "%.2f%s", x, scales[i].sfx[k]);
        return;
    }
    snprintf(buf, len, "%" PRId64, v);
}

/* ---- filter ------------------------------------------------------------------------- */

/* The expansion budget of focus/ignore regexes: at 600, the slowest forms measured here
 * (".{0,60}" x8, "(.{0,23}){0,23}") take 0.25 s on a 4 KB name and 60 ms on a 1 KB one, so
 * the deadline, read between names, is overshot by at most that. */
#define CP_RENDER_FILTER_MAX_COST 600

int cp_render_filter(cp_profile *p, const char *focus, const char *ignore, cp_err *err)
{
    return cp_render_filter_until(p, focus, ignore, 0, err);
}

static int past(int64_t deadline_ns)
{
    return deadline_ns && cp_mono_ns() >= deadline_ns;
}

int cp_render_filter_until(cp_profile *p, const char *focus, const char *ignore,
                           int64_t deadline_ns, cp_err *err)
{
    int has_f = focus && *focus, has_i = ignore && *ignore;
    if (!has_f && !has_i) return 0;
    regex_t fre, ire;
    int rc;
    cp_err gerr = {0};
    if (has_f && cp_regex_check_cost(focus, CP_RENDER_FILTER_MAX_COST, &gerr))
        return cp_err_set(err, CP_EPARSE, "bad focus regex '%.64s': %s", focus, gerr.msg);
    if (has_i && cp_regex_check_cost(ignore, CP_RENDER_FILTER_MAX_COST, &gerr))
        return cp_err_set(err, CP_EPARSE, "bad ignore regex '%.64s': %s", ignore, gerr.msg);
    if (has_f && (rc = regcomp(&fre, focus, REG_EXTENDED | REG_NOSUB))) {
        char m[128];
        regerror(rc, &fre, m, sizeof m);
        return cp_err_set(err, CP_EPARSE, "bad focus regex '%.64s': %s", focus, m);
    }
    if (has_i && (rc = regcomp(&ire, ignore, REG_EXTENDED | REG_NOSUB))) {
        char m[128];
        regerror(rc, &ire, m, sizeof m);
        if (has_f) regfree(&fre);
        return cp_err_set(err, CP_EPARSE, "bad ignore regex '%.64s': %s", ignore, m);
    }
    names nm = {0};
    frames fr = {0};
    uint8_t *nmatch = NULL, *lmatch = NULL; /* bit 1 focus, bit 2 ignore */
    rc = frames_build(p, &nm, &fr);
    if (rc) goto out;
    nmatch = calloc((size_t)nm.s.n + 1, 1);
    lmatch = calloc((size_t)p->locations.n + 1, 1);
    if (!nmatch || !lmatch) {
        rc = CP_ENOMEM;
        goto out;
    }
    /* A regex that passed the complexity guard can still take milliseconds per name:
     * once per distinct name, and never past the deadline. */
    for (uint32_t i = 0; i < nm.s.n; i++) {
        if (past(deadline_ns)) {
            rc = CP_ELIMIT;
            goto out;
        }
        if (has_f && regexec(&fre, nm.s.v[i], 0, NULL, 0) == 0) nmatch[i] |= 1;
        if (has_i && regexec(&ire, nm.s.v[i], 0, NULL, 0) == 0) nmatch[i] |= 2;
    }
    for (uint32_t l = 0; l < p->locations.n; l++)
        for (uint32_t q = fr.off.v[l]; q < fr.off.v[l + 1]; q++)
            lmatch[l + 1] |= nmatch[fr.ids.v[q]];
    uint32_t nt = p->sample_types.n, w = 0;
    for (uint32_t s = 0; s < p->samples.n; s++) {
        if ((s & 4095) == 0 && past(deadline_ns) && w == s) {
            rc = CP_ELIMIT; /* nothing moved yet: p is unchanged */
            goto out;
        }
        const cp_sample *sm = &p->samples.v[s];
        uint8_t m = 0;
        for (uint32_t k = 0; k < sm->nlocs; k++) {
            uint32_t lid = p->stack.v[sm->loc_off + k];
            if (lid <= p->locations.n) m |= lmatch[lid];
        }
        if ((m & 2) || (has_f && !(m & 1))) continue;
        if (w != s) {
            p->samples.v[w] = *sm;
            memmove(p->values.v + (size_t)w * nt, p->values.v + (size_t)s * nt,
                    nt * sizeof *p->values.v);
        }
        w++;
    }
    p->samples.n = w;
    p->values.n = w * nt;
out:
    if (has_f) regfree(&fre);
    if (has_i) regfree(&ire);
    free(nmatch);
    free(lmatch);
    uint32_t nnames = nm.s.n;
    frames_close(&fr);
    names_close(&nm);
    if (rc == CP_ELIMIT)
        return cp_err_set(err, rc, "deadline passed while filtering with focus/ignore (%u names)",
                          nnames);
    return rc ? cp_err_set(err, rc, "out of memory while filtering") : 0;
}

/* ---- top ---------------------------------------------------------------------------- */

typedef struct toprow {
    uint32_t name;
    int64_t flat, cum;
} toprow;

static int cmp_top(const void *a, const void *b, void *arg)
{
    const toprow *x = a, *y = b;
    const names *nm = arg;
    if (x->flat != y->flat) return x->flat > y->flat ? -1 : 1;
    if (x->cum != y->cum) return x->cum > y->cum ? -1 : 1;
    return strcmp(nm->s.v[x->name], nm->s.v[y->name]);
}

int cp_render_top(const cp_profile *p, int vi, uint32_t max_rows, cp_buf *out)
{
    names nm = {0};
    frames fr = {0};
    toprow *rows = NULL;
    uint32_t *seen = NULL;
    CP_VEC(uint32_t) path = {0};
    int rc = frames_build(p, &nm, &fr);
    if (rc) goto out;
    rows = calloc((size_t)nm.s.n + 1, sizeof *rows);
    seen = calloc((size_t)nm.s.n + 1, sizeof *seen);
    if (!rows || !seen) {
        rc = CP_ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < nm.s.n; i++)
        rows[i].name = i;
    uint32_t nt = p->sample_types.n;
    int64_t total = 0;
    for (uint32_t s = 0; nt && s < p->samples.n; s++) {
        const cp_sample *sm = &p->samples.v[s];
        int64_t v = p->values.v[(size_t)s * nt + (uint32_t)vi];
        if (!v) continue;
        total += v;
        int leaf = 1;
        for (uint32_t k = 0; k < sm->nlocs; k++) {
            uint32_t lid = p->stack.v[sm->loc_off + k];
            if (lid == 0 || lid > p->locations.n) continue;
            for (uint32_t q = fr.off.v[lid - 1]; q < fr.off.v[lid]; q++) {
                uint32_t id = fr.ids.v[q];
                if (leaf) rows[id].flat += v;
                leaf = 0;
                if (seen[id] != s + 1) {
                    seen[id] = s + 1;
                    rows[id].cum += v;
                }
            }
        }
    }
    uint32_t nrows = 0;
    for (uint32_t i = 0; i < nm.s.n; i++)
        if (rows[i].flat || rows[i].cum) rows[nrows++] = rows[i];
    qsort_r(rows, nrows, sizeof *rows, cmp_top, &nm);
    const char *unit = nt ? cp_profile_str(p, p->sample_types.v[vi].unit) : "";
    uint32_t shown = max_rows && max_rows < nrows ? max_rows : nrows;
    int64_t shown_flat = 0;
    for (uint32_t i = 0; i < shown; i++)
        shown_flat += rows[i].flat;
    char a[32], b[32], c[32];
    cp_render_value(shown_flat, unit, a, sizeof a);
    cp_render_value(total, unit, b, sizeof b);
    double pct = total ? 100.0 * (double)shown_flat / (double)total : 0;
    rc = cp_buf_printf(out, "Type: %s\nShowing nodes accounting for %s, %.2f%% of %s total\n",
                       nt ? cp_profile_str(p, p->sample_types.v[vi].type) : "(empty)", a, pct, b);
    if (!rc && shown < nrows)
        rc = cp_buf_printf(out, "Showing top %u nodes out of %u\n", shown, nrows);
    if (!rc)
        rc = cp_buf_printf(out, "%10s %6s %6s %10s %6s\n", "flat", "flat%", "sum%", "cum", "cum%");
    int64_t sum = 0;
    for (uint32_t i = 0; !rc && i < shown; i++) {
        sum += rows[i].flat;
        cp_render_value(rows[i].flat, unit, a, sizeof a);
        cp_render_value(rows[i].cum, unit, c, sizeof c);
        double t = total ? (double)total : 1;
        rc = cp_buf_printf(out, "%10s %5.2f%% %5.2f%% %10s %5.2f%%  %s\n", a,
                           100.0 * (double)rows[i].flat / t, 100.0 * (double)sum / t, c,
                           100.0 * (double)rows[i].cum / t, nm.s.v[rows[i].name]);
    }
out:
    free(path.v);
    free(rows);
    free(seen);
    frames_close(&fr);
    names_close(&nm);
    return rc;
}

/* ---- folded ------------------------------------------------------------------------- */

static int append_frame_name(cp_buf *b, const char *s)
{
    size_t n = strlen(s);
    if (cp_buf_reserve(b, n)) return CP_ENOMEM;
    /* Copy runs; ';' and line breaks would break the format and become '_'. */
    while (n) {
        size_t run = strcspn(s, ";\n\r");
        memcpy(b->data + b->len, s, run);
        b->len += run;
        if (run == n) break;
        b->data[b->len++] = '_';
        s += run + 1;
        n -= run + 1;
    }
    return 0;
}

int cp_render_folded(const cp_profile *p, int vi, cp_buf *out)
{
    names nm = {0};
    frames fr = {0};
    tree t = {0};
    kids k = {0};
    uint32_t *stack = NULL, *pos = NULL;
    int rc = frames_build(p, &nm, &fr);
    if (!rc) rc = tree_init(&t);
    if (!rc && p->sample_types.n) rc = tree_add(&t, p, vi, &fr, 0);
    if (!rc) rc = kids_build(&t, &nm, NULL, &k);
    if (rc) goto out;
    /* Depth-first, in name order; each node with self != 0 prints its path. */
    stack = malloc(((size_t)t.n.n + 1) * sizeof *stack);
    pos = malloc(((size_t)t.n.n + 1) * sizeof *pos);
    if (!stack || !pos) {
        rc = CP_ENOMEM;
        goto out;
    }
    uint32_t sp = 0;
    stack[0] = 0;
    pos[0] = k.off[0];
    sp = 1;
    while (sp) {
        uint32_t node = stack[sp - 1];
        if (pos[sp - 1] == k.off[node]) {
            const tnode *tn = &t.n.v[node];
            if (node && tn->self[0]) {
                for (uint32_t d = 1; d < sp && !rc; d++) {
                    if (d > 1) rc = cp_buf_append(out, ";", 1);
                    if (!rc) rc = append_frame_name(out, nm.s.v[t.n.v[stack[d]].name]);
                }
                if (!rc) rc = cp_buf_printf(out, " %" PRId64 "\n", tn->self[0]);
                if (rc) goto out;
            }
        }
        if (pos[sp - 1] < k.off[node + 1]) {
            uint32_t child = k.ids[pos[sp - 1]++];
            stack[sp] = child;
            pos[sp] = k.off[child];
            sp++;
        } else {
            sp--;
        }
    }
out:
    free(stack);
    free(pos);
    kids_close(&k);
    tree_close(&t);
    frames_close(&fr);
    names_close(&nm);
    return rc;
}

/* ---- JSON tree ---------------------------------------------------------------------- */

/* Pruning order: heaviest first; at equal weight parents (shallower) first, so that the kept
 * set stays connected. */
typedef struct rank {
    int64_t key;
    uint32_t depth, id;
} rank;

static int cmp_rank(const void *a, const void *b)
{
    const rank *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    if (x->depth != y->depth) return x->depth < y->depth ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Appends a decimal integer (faster than printf on the hot path). */
static int put_i64(cp_buf *b, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) tmp[n++] = '-';
    if (cp_buf_reserve(b, (size_t)n)) return CP_ENOMEM;
    while (n)
        b->data[b->len++] = (uint8_t)tmp[--n];
    return 0;
}

/* Keeps (keep[i] = 1) the root plus the max_nodes heaviest nodes of t whose parents are
 * kept, folding each pruned subtree's total into its kept parent's self; *kept counts
 * them. Returns 0 or CP_ENOMEM. */
static int tree_prune(tree *t, uint32_t max_nodes, uint8_t *keep, uint32_t *kept)
{
    uint32_t n = t->n.n;
    rank *order = malloc((size_t)n * sizeof *order);
    if (!order) return CP_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        const tnode *x = &t->n.v[i];
        int64_t a0 = llabs(x->total[0]), a1 = llabs(x->total[1]);
        order[i] = (rank){a0 > a1 ? a0 : a1, x->depth, i};
    }
    qsort(order, n, sizeof *order, cmp_rank);
    memset(keep, 0, n);
    keep[0] = 1;
    *kept = 1;
    for (uint32_t i = 0; i < n && *kept <= max_nodes; i++) {
        uint32_t id = order[i].id;
        if (id == 0 || !keep[t->n.v[id].parent]) continue;
        keep[id] = 1;
        (*kept)++;
    }
    for (uint32_t i = 1; i < n; i++) {
        if (keep[i] || !keep[t->n.v[i].parent]) continue;
        tnode *par = &t->n.v[t->n.v[i].parent];
        par->self[0] += t->n.v[i].total[0];
        par->self[1] += t->n.v[i].total[1];
    }
    free(order);
    return 0;
}

/* Every distinct name of nm JSON-escaped once into esc; name i is at
 * [(*off)[i], (*off)[i + 1]). *off is the caller's to free. Returns 0 or CP_ENOMEM. */
static int names_escape(const names *nm, cp_buf *esc, uint32_t **off)
{
    int rc = 0;
    uint32_t *o = *off = malloc(((size_t)nm->s.n + 1) * sizeof *o);
    if (!o) return CP_ENOMEM;
    for (uint32_t i = 0; i < nm->s.n && !rc; i++) {
        o[i] = (uint32_t)esc->len;
        rc = cp_json_escape(esc, nm->s.v[i], strlen(nm->s.v[i]));
    }
    o[nm->s.n] = (uint32_t)esc->len;
    return rc || esc->len > UINT32_MAX / 2 ? CP_ENOMEM : 0;
}

/* The answer's fields before the root: extra_json, the sample type (of p, or of base when
 * p has none), totals and node counts. */
static int put_tree_header(cp_buf *out, const cp_profile *p, int vi, const cp_profile *base,
                           int base_vi, const char *extra_json, const tree *t, uint32_t kept)
{
    const cp_profile *tp = p->sample_types.n ? p : base;
    int tvi = p->sample_types.n ? vi : base_vi;
    int rc = cp_buf_printf(out, "{%s\"sample_type\":{\"type\":\"", extra_json ? extra_json : "");
    if (!rc && tp && tp->sample_types.n) {
        const char *ty = cp_profile_str(tp, tp->sample_types.v[tvi].type);
        const char *un = cp_profile_str(tp, tp->sample_types.v[tvi].unit);
        rc = cp_json_escape(out, ty, strlen(ty));
        if (!rc) rc = cp_buf_printf(out, "\",\"unit\":\"");
        if (!rc) rc = cp_json_escape(out, un, strlen(un));
    } else if (!rc) {
        rc = cp_buf_printf(out, "\",\"unit\":\"");
    }
    if (!rc) rc = cp_buf_printf(out, "\"},\"total\":%" PRId64 ",", t->n.v[0].total[0]);
    if (!rc && base) rc = cp_buf_printf(out, "\"base_total\":%" PRId64 ",", t->n.v[0].total[1]);
    if (!rc)
        rc = cp_buf_printf(out, "\"nodes\":%u,\"total_nodes\":%u,\"root\":", kept - 1, t->n.n - 1);
    return rc;
}

/* Node `node` of the tree opened: its name (escaped names in esc at esc_off), module,
 * values and, when it has children, the start of their list. */
static int put_node_open(cp_buf *out, const tnode *tn, uint32_t node, const names *nm,
                         const cp_buf *esc, const uint32_t *esc_off, int base, int has_kids)
{
    int rc = cp_buf_append(out, "{\"name\":\"", 9);
    if (!rc && node)
        rc = cp_buf_append(out, esc->data + esc_off[tn->name],
                           esc_off[tn->name + 1] - esc_off[tn->name]);
    else if (!rc)
        rc = cp_buf_append(out, "total", 5);
    if (!rc && node && nm->mod.v[tn->name]) {
        const char *m = nm->mod.v[tn->name];
        rc = cp_buf_append(out, "\",\"module\":\"", 12);
        if (!rc) rc = cp_json_escape(out, m, strlen(m));
    }
    if (!rc) rc = cp_buf_append(out, "\",\"self\":", 9);
    if (!rc) rc = put_i64(out, tn->self[0]);
    if (!rc) rc = cp_buf_append(out, ",\"total\":", 9);
    if (!rc) rc = put_i64(out, tn->total[0]);
    if (!rc && base) {
        rc = cp_buf_append(out, ",\"base_self\":", 13);
        if (!rc) rc = put_i64(out, tn->self[1]);
        if (!rc) rc = cp_buf_append(out, ",\"base_total\":", 14);
        if (!rc) rc = put_i64(out, tn->total[1]);
    }
    if (!rc && has_kids) rc = cp_buf_append(out, ",\"children\":[", 13);
    return rc;
}

int cp_render_tree_json(const cp_profile *p, int vi, const cp_profile *base, int base_vi,
                        const cp_render_tree_opts *o, cp_buf *out)
{
    uint32_t max_nodes = o ? o->max_nodes : 0;
    const char *extra_json = o ? o->extra_json : NULL;
    names nm = {0};
    frames fr = {0}, fb = {0};
    tree t = {0};
    kids k = {0};
    uint32_t *stack = NULL, *pos = NULL, *esc_off = NULL;
    cp_buf esc = {0}; /* every distinct name JSON-escaped once */
    uint8_t *keep = NULL;
    int rc = frames_build(p, &nm, &fr);
    if (!rc && base) rc = frames_build(base, &nm, &fb);
    if (!rc) rc = tree_init(&t);
    if (!rc && p->sample_types.n) rc = tree_add(&t, p, vi, &fr, 0);
    if (!rc && base && base->sample_types.n) rc = tree_add(&t, base, base_vi, &fb, 1);
    if (rc) goto out;
    uint32_t n = t.n.n, kept = n;
    keep = malloc(n);
    if (!keep) {
        rc = CP_ENOMEM;
        goto out;
    }
    memset(keep, 1, n);
    if (max_nodes && n - 1 > max_nodes && (rc = tree_prune(&t, max_nodes, keep, &kept))) goto out;
    if ((rc = kids_build(&t, &nm, keep, &k)) || (rc = names_escape(&nm, &esc, &esc_off)) ||
        (rc = put_tree_header(out, p, vi, base, base_vi, extra_json, &t, kept)))
        goto out;
    stack = malloc(((size_t)n + 1) * sizeof *stack);
    pos = malloc(((size_t)n + 1) * sizeof *pos);
    if (!stack || !pos) {
        rc = CP_ENOMEM;
        goto out;
    }
    /* depth first, without recursion: stack holds the open nodes, pos each one's next
     * child */
    uint32_t sp = 1;
    stack[0] = 0;
    pos[0] = k.off[0];
    int opened = 0; /* whether stack top's object has been opened */
    while (sp && !rc) {
        uint32_t node = stack[sp - 1];
        int has_kids = k.off[node + 1] > k.off[node];
        if (!opened) {
            rc = put_node_open(out, &t.n.v[node], node, &nm, &esc, esc_off, base != NULL, has_kids);
            opened = 1;
        }
        if (rc) break;
        if (pos[sp - 1] < k.off[node + 1]) {
            if (pos[sp - 1] > k.off[node]) rc = cp_buf_append(out, ",", 1);
            uint32_t child = k.ids[pos[sp - 1]++];
            stack[sp] = child;
            pos[sp] = k.off[child];
            sp++;
            opened = 0;
        } else {
            rc = has_kids ? cp_buf_append(out, "]}", 2) : cp_buf_append(out, "}", 1);
            sp--;
        }
    }
    if (!rc) rc = cp_buf_append(out, "}", 1);
out:
    free(esc_off);
    cp_buf_close(&esc);
    free(stack);
    free(pos);
    free(keep);
    kids_close(&k);
    tree_close(&t);
    frames_close(&fr);
    frames_close(&fb);
    names_close(&nm);
    return rc;
}
