/* V8 inspector profiles (CPU and sampling heap) into pprof profiles of the shared model:
 * one location per distinct call frame, stacks from the node tree, weights from the
 * samples. Everything read from the message is checked before it is used. */
#include "v8conv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

typedef CP_VEC(uint32_t) u32vec;

/* One node of a V8 tree, flattened: its id, its call frame, its parent's index. */
typedef struct node {
    int64_t id;
    const cp_json *frame;
    uint32_t parent;
    uint32_t loc; /* location id, 0 until needed; NONE for a frame left out of stacks */
} node;

typedef struct idx_pair {
    int64_t id;
    uint32_t idx;
} idx_pair;

typedef struct tree {
    node *n;
    idx_pair *by_id; /* sorted by id */
    uint32_t len;
    u32vec loc_of_str;  /* system_name string id -> location id */
    uint64_t *line_key; /* (function id << 32 | line) + 1 of line_loc's locations, 0 = free */
    uint32_t *line_lid, line_cap, line_n;
    char *key;
    size_t key_cap;
} tree;

static void tree_close(tree *t)
{
    free(t->line_key);
    free(t->line_lid);
    free(t->n);
    free(t->by_id);
    free(t->loc_of_str.v);
    free(t->key);
    memset(t, 0, sizeof(*t));
}

static int cmp_pair(const void *a, const void *b)
{
    const idx_pair *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static uint32_t find_node(const tree *t, int64_t id)
{
    size_t lo = 0, hi = t->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->by_id[mid].id == id) return t->by_id[mid].idx;
        if (t->by_id[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NONE;
}

/* Sorts the id index and refuses duplicates. */
static int index_ids(tree *t, cp_err *err)
{
    t->by_id = malloc((size_t)(t->len ? t->len : 1) * sizeof(idx_pair));
    if (!t->by_id) return CP_ENOMEM;
    for (uint32_t i = 0; i < t->len; i++)
        t->by_id[i] = (idx_pair){t->n[i].id, i};
    qsort(t->by_id, t->len, sizeof(idx_pair), cmp_pair);
    for (uint32_t i = 1; i < t->len; i++)
        if (t->by_id[i].id == t->by_id[i - 1].id)
            return cp_err_set(err, CP_EPARSE, "node id %lld appears twice",
                              (long long)t->by_id[i].id);
    return 0;
}

/* An integer member; missing gives def. Returns 0 or CP_EPARSE naming what. */
static int get_int(const cp_json *o, const char *name, int64_t def, int64_t lo, int64_t hi,
                   int64_t *out, const char *what, cp_err *err)
{
    const cp_json *v = cp_json_get(o, name);
    *out = def; /* also on an error: -O3 cannot tell cp_err_set's result is not 0 */
    if (!v) return 0;
    if (!cp_json_is(v, CP_JSON_NUMBER))
        return cp_err_set(err, CP_EPARSE, "%s: %s is not a number", what, name);
    double d = cp_json_num(v, 0);
    if (!(d >= (double)lo && d <= (double)hi))
        return cp_err_set(err, CP_EPARSE, "%s: %s %g out of range [%lld, %lld]", what, name, d,
                          (long long)lo, (long long)hi);
    *out = cp_json_is_int(v) ? (int64_t)cp_json_int(v, 0) : (int64_t)d;
    return 0;
}

static const char *get_str(const cp_json *o, const char *name)
{
    return cp_json_str(cp_json_get(o, name), NULL);
}

/* Checks a node's fields and records them at t->n[i]. */
static int read_node(tree *t, uint32_t i, const cp_json *nd, uint32_t parent, cp_err *err)
{
    if (!cp_json_is(nd, CP_JSON_OBJECT))
        return cp_err_set(err, CP_EPARSE, "node %u is not an object", i);
    int64_t id;
    int rc = get_int(nd, "id", -1, 0, INT64_MAX / 2, &id, "node", err);
    if (rc) return rc;
    if (!cp_json_get(nd, "id")) return cp_err_set(err, CP_EPARSE, "node %u has no id", i);
    const cp_json *cf = cp_json_get(nd, "callFrame");
    if (!cp_json_is(cf, CP_JSON_OBJECT))
        return cp_err_set(err, CP_EPARSE, "node %lld has no callFrame object", (long long)id);
    if (!get_str(cf, "functionName") || !get_str(cf, "url"))
        return cp_err_set(err, CP_EPARSE,
                          "node %lld: callFrame.functionName or .url is not a string",
                          (long long)id);
    t->n[i] = (node){.id = id, .frame = cf, .parent = parent};
    return 0;
}

/* The location id of node i's frame (made once per distinct frame), or NONE for "(root)". */
static int node_loc(cp_profile *p, tree *t, uint32_t i, uint32_t *out, cp_err *err)
{
    node *nd = &t->n[i];
    if (nd->loc) {
        *out = nd->loc;
        return 0;
    }
    const char *fn = get_str(nd->frame, "functionName"), *url = get_str(nd->frame, "url");
    if (!strcmp(fn, "(root)") && !url[0]) {
        *out = nd->loc = NONE;
        return 0;
    }
    int64_t line, col;
    int rc = get_int(nd->frame, "lineNumber", -1, -1, INT32_MAX, &line, "callFrame", err);
    if (!rc) rc = get_int(nd->frame, "columnNumber", -1, -1, INT32_MAX, &col, "callFrame", err);
    if (rc) return rc;
    const char *name = fn[0] ? fn : "(anonymous)";
    size_t need = strlen(name) + strlen(url) + 48;
    if (need > t->key_cap) {
        char *k = realloc(t->key, need);
        if (!k) return CP_ENOMEM;
        t->key = k;
        t->key_cap = need;
    }
    int kl = snprintf(t->key, need, "%s %s:%lld:%lld", name, url, (long long)line + 1,
                      (long long)col + 1);
    uint32_t sid, name_id, file_id, fid, lid;
    if (cp_profile_intern(p, t->key, (size_t)kl, &sid)) return CP_ENOMEM;
    if (sid < t->loc_of_str.n && t->loc_of_str.v[sid]) {
        *out = nd->loc = t->loc_of_str.v[sid];
        return 0;
    }
    if (cp_profile_intern_cstr(p, name, &name_id) || cp_profile_intern_cstr(p, url, &file_id))
        return CP_ENOMEM;
    cp_function f = {
        .name = name_id, .system_name = sid, .filename = file_id, .start_line = line + 1};
    if (cp_profile_add_function(p, &f, &fid)) return CP_ENOMEM;
    cp_line ln = {.function_id = fid, .line = line + 1};
    if (cp_profile_add_location(p, 0, 0, &ln, 1, &lid)) return CP_ENOMEM;
    if (cp_vec_reserve(&t->loc_of_str, (size_t)sid + 1)) return CP_ENOMEM;
    while (t->loc_of_str.n <= sid)
        t->loc_of_str.v[t->loc_of_str.n++] = 0;
    t->loc_of_str.v[sid] = lid;
    *out = nd->loc = lid;
    return 0;
}

/* The slot of key in the line table (open addressing, grown at half full): its location id
 * is t->line_lid[slot] when t->line_key[slot] == key. -1 out of memory. */
static int64_t line_slot(tree *t, uint64_t key)
{
    if ((t->line_n + 1) * 2 > t->line_cap) {
        uint32_t cap = t->line_cap ? t->line_cap * 2 : 256;
        uint64_t *k = calloc(cap, sizeof(*k));
        uint32_t *v = calloc(cap, sizeof(*v));
        if (!k || !v) {
            free(k);
            free(v);
            return -1;
        }
        for (uint32_t i = 0; i < t->line_cap; i++) {
            if (!t->line_key[i]) continue;
            uint32_t j = (uint32_t)(t->line_key[i] * 0x9e3779b97f4a7c15ULL >> 40) & (cap - 1);
            while (k[j])
                j = (j + 1) & (cap - 1);
            k[j] = t->line_key[i];
            v[j] = t->line_lid[i];
        }
        free(t->line_key);
        free(t->line_lid);
        t->line_key = k;
        t->line_lid = v;
        t->line_cap = cap;
    }
    uint32_t j = (uint32_t)(key * 0x9e3779b97f4a7c15ULL >> 40) & (t->line_cap - 1);
    while (t->line_key[j] && t->line_key[j] != key)
        j = (j + 1) & (t->line_cap - 1);
    return j;
}

/* The location of node i's function at source line `line` (1-based, from positionTicks):
 * the node's function, its own line (made once per function and line). */
static int line_loc(cp_profile *p, tree *t, uint32_t i, int64_t line, uint32_t *out, cp_err *err)
{
    uint32_t loc;
    int rc = node_loc(p, t, i, &loc, err);
    if (rc || loc == NONE) {
        *out = loc;
        return rc;
    }
    uint32_t fid = p->lines.v[p->locations.v[loc - 1].line_off].function_id, lid;
    uint64_t key = ((uint64_t)fid << 32 | (uint32_t)line) + 1;
    int64_t slot = line_slot(t, key);
    if (slot < 0) return CP_ENOMEM;
    if (t->line_key[slot] == key) {
        *out = t->line_lid[slot];
        return 0;
    }
    cp_line ln = {.function_id = fid, .line = line};
    if (cp_profile_add_location(p, 0, 0, &ln, 1, &lid)) return CP_ENOMEM;
    t->line_key[slot] = key;
    t->line_lid[slot] = lid;
    t->line_n++;
    *out = lid;
    return 0;
}

/* Adds one sample for node i (its stack walked to the root; leaf: the location of its
 * leaf frame instead of node i's own, 0 for that) with values vals. */
static int add_stack_at(cp_profile *p, tree *t, uint32_t i, uint32_t leaf, const int64_t *vals,
                        u32vec *stk, cp_err *err)
{
    stk->n = 0;
    uint32_t steps = 0;
    if (leaf && leaf != NONE) {
        if (cp_vec_push(stk, leaf)) return CP_ENOMEM;
        i = t->n[i].parent;
    }
    for (uint32_t at = i; at != NONE; at = t->n[at].parent) {
        if (++steps > t->len)
            return cp_err_set(err, CP_EPARSE, "the parents of node %lld form a cycle",
                              (long long)t->n[i].id);
        uint32_t loc;
        int rc = node_loc(p, t, at, &loc, err);
        if (rc) return rc;
        if (loc != NONE && cp_vec_push(stk, loc)) return CP_ENOMEM;
    }
    if (!stk->n) return 0;
    return cp_profile_add_sample(p, stk->v, stk->n, vals, NULL, 0);
}

static int add_stack(cp_profile *p, tree *t, uint32_t i, const int64_t *vals, u32vec *stk,
                     cp_err *err)
{
    return add_stack_at(p, t, i, 0, vals, stk, err);
}

/* Node i's cnt samples, split over the source lines V8 counted in it (positionTicks:
 * [{line, ticks}], line 1-based) in proportion to their ticks, by cumulative rounding (the
 * parts add up to cnt), each under a leaf location at its line; without positionTicks, one
 * sample at the function's line. */
static int add_node_samples(cp_profile *p, tree *t, uint32_t i, const cp_json *nd, int64_t cnt,
                            int64_t ns_per_sample, u32vec *stk, cp_err *err)
{
    const cp_json *pt = cp_json_get(nd, "positionTicks");
    size_t n = cp_json_len(pt);
    if (pt && !cp_json_is(pt, CP_JSON_ARRAY))
        return cp_err_set(err, CP_EPARSE, "node %lld: positionTicks is not an array",
                          (long long)t->n[i].id);
    if (n > 100000)
        return cp_err_set(err, CP_ELIMIT, "node %lld: %zu positionTicks: too many",
                          (long long)t->n[i].id, n);
    int64_t *lt = malloc((n ? n : 1) * 2 * sizeof(int64_t)), sum = 0;
    if (!lt) return CP_ENOMEM;
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        const cp_json *e = cp_json_at(pt, k);
        if (!cp_json_is(e, CP_JSON_OBJECT))
            rc = cp_err_set(err, CP_EPARSE, "node %lld: positionTicks[%zu] is not an object",
                            (long long)t->n[i].id, k);
        else if (!(rc = get_int(e, "line", -1, 1, INT32_MAX, &lt[2 * k], "positionTicks", err)) &&
                 !(rc = get_int(e, "ticks", -1, 0, INT32_MAX, &lt[2 * k + 1], "positionTicks",
                                err)) &&
                 lt[2 * k] < 1)
            rc = cp_err_set(err, CP_EPARSE, "node %lld: positionTicks[%zu] has no line",
                            (long long)t->n[i].id, k);
        if (!rc) sum += lt[2 * k + 1] > 0 ? lt[2 * k + 1] : 0;
    }
    if (!rc && !sum) {
        int64_t vals[2] = {cnt, cnt * ns_per_sample};
        rc = add_stack(p, t, i, vals, stk, err);
    }
    int64_t cum = 0, before = 0;
    for (size_t k = 0; !rc && sum && k < n; k++) {
        cum += lt[2 * k + 1] > 0 ? lt[2 * k + 1] : 0;
        int64_t upto = (int64_t)((__int128)cnt * cum / sum), c = upto - before;
        before = upto;
        if (!c) continue;
        uint32_t leaf;
        if ((rc = line_loc(p, t, i, lt[2 * k], &leaf, err))) break;
        int64_t vals[2] = {c, c * ns_per_sample};
        rc = add_stack_at(p, t, i, leaf, vals, stk, err);
    }
    free(lt);
    return rc;
}

static int start_profile(cp_profile **out, const char *t0, const char *u0, const char *t1,
                         const char *u1, const char *period_type, const char *period_unit,
                         const char *dflt)
{
    cp_profile *p = cp_profile_create();
    if (!p) return CP_ENOMEM;
    if (cp_profile_add_sample_type(p, t0, u0) || cp_profile_add_sample_type(p, t1, u1) ||
        cp_profile_intern_cstr(p, period_type, &p->period_type.type) ||
        cp_profile_intern_cstr(p, period_unit, &p->period_type.unit) ||
        cp_profile_intern_cstr(p, dflt, &p->default_sample_type)) {
        cp_profile_destroy(p);
        return CP_ENOMEM;
    }
    *out = p;
    return 0;
}

int cp_v8_cpu_profile(const cp_json *profile, int64_t interval_us, cp_profile **out,
                      int64_t *span_us, cp_err *err)
{
    *out = NULL;
    tree t = {0};
    cp_profile *p = NULL;
    int64_t *cnt = NULL;
    u32vec stk = {0};
    int rc;
    if (!cp_json_is(profile, CP_JSON_OBJECT))
        return cp_err_set(err, CP_EPARSE, "CPU profile: not an object");
    const cp_json *nodes = cp_json_get(profile, "nodes");
    const cp_json *samples = cp_json_get(profile, "samples");
    const cp_json *deltas = cp_json_get(profile, "timeDeltas");
    if (!cp_json_is(nodes, CP_JSON_ARRAY))
        return cp_err_set(err, CP_EPARSE, "CPU profile: no nodes array");
    if (samples && !cp_json_is(samples, CP_JSON_ARRAY))
        return cp_err_set(err, CP_EPARSE, "CPU profile: samples is not an array");
    if (deltas && !cp_json_is(deltas, CP_JSON_ARRAY))
        return cp_err_set(err, CP_EPARSE, "CPU profile: timeDeltas is not an array");
    size_t nn = cp_json_len(nodes), ns_ = cp_json_len(samples);
    if (nn > CP_V8_MAX_NODES || ns_ > (1u << 28))
        return cp_err_set(err, CP_ELIMIT, "CPU profile: %zu nodes, %zu samples: too many", nn, ns_);
    if (cp_json_len(deltas) != ns_)
        return cp_err_set(err, CP_EPARSE, "CPU profile: %zu samples but %zu timeDeltas", ns_,
                          cp_json_len(deltas));
    int64_t start, end;
    if ((rc = get_int(profile, "startTime", 0, 0, INT64_MAX / 4, &start, "CPU profile", err)) ||
        (rc = get_int(profile, "endTime", start, 0, INT64_MAX / 4, &end, "CPU profile", err)))
        return rc;
    if (span_us) *span_us = end >= start ? end - start : 0;

    rc = CP_ENOMEM;
    t.len = (uint32_t)nn;
    t.n = calloc(nn ? nn : 1, sizeof(node));
    cnt = calloc(nn ? nn : 1, sizeof(int64_t));
    if (!t.n || !cnt) goto fail;
    for (uint32_t i = 0; i < nn; i++)
        if ((rc = read_node(&t, i, cp_json_at(nodes, i), NONE, err))) goto fail;
    if ((rc = index_ids(&t, err))) goto fail;
    for (uint32_t i = 0; i < nn; i++) {
        const cp_json *ch = cp_json_get(cp_json_at(nodes, i), "children");
        if (!ch) continue;
        if (!cp_json_is(ch, CP_JSON_ARRAY)) {
            rc = cp_err_set(err, CP_EPARSE, "node %lld: children is not an array",
                            (long long)t.n[i].id);
            goto fail;
        }
        for (size_t k = 0; k < cp_json_len(ch); k++) {
            const cp_json *c = cp_json_at(ch, k);
            uint32_t ci = cp_json_is_int(c) ? find_node(&t, cp_json_int(c, 0)) : NONE;
            if (ci == NONE) {
                rc = cp_err_set(err, CP_EPARSE, "node %lld: child %zu is not a node id",
                                (long long)t.n[i].id, k);
                goto fail;
            }
            if (t.n[ci].parent != NONE || ci == i) {
                rc = cp_err_set(err, CP_EPARSE, "node %lld is the child of two nodes",
                                (long long)t.n[ci].id);
                goto fail;
            }
            t.n[ci].parent = i;
        }
    }
    /* the deltas are checked, though only the counts are used (see the contract) */
    int64_t ts = start;
    for (size_t i = 0; i <= ns_; i++) {
        int64_t next = end;
        if (i < ns_) {
            const cp_json *d = cp_json_at(deltas, i);
            if (!cp_json_is_int(d) || cp_json_int(d, 0) < -(INT64_C(1) << 40) ||
                cp_json_int(d, 0) > (INT64_C(1) << 40)) {
                rc = cp_err_set(err, CP_EPARSE,
                                "CPU profile: timeDeltas[%zu] is not a sane "
                                "integer",
                                i);
                goto fail;
            }
            next = ts + cp_json_int(d, 0);
        }
        if (i == ns_) break;
        const cp_json *s = cp_json_at(samples, i);
        uint32_t si = cp_json_is_int(s) ? find_node(&t, cp_json_int(s, 0)) : NONE;
        if (si == NONE) {
            rc = cp_err_set(err, CP_EPARSE, "CPU profile: samples[%zu] is not a node id", i);
            goto fail;
        }
        cnt[si]++;
        ts = next;
    }
    if ((rc = start_profile(&p, "samples", "count", "cpu", "nanoseconds", "cpu", "nanoseconds",
                            "cpu")))
        goto fail;
    for (uint32_t i = 0; i < nn; i++) {
        if (!cnt[i]) continue;
        if (!strcmp(get_str(t.n[i].frame, "functionName"), "(idle)")) continue;
        if ((rc = add_node_samples(p, &t, i, cp_json_at(nodes, i), cnt[i], interval_us * 1000, &stk,
                                   err)))
            goto fail;
    }
    p->duration_nanos = (end > start ? end - start : 0) * 1000;
    *out = p;
    p = NULL;
    rc = 0;
fail:
    cp_profile_destroy(p);
    tree_close(&t);
    free(cnt);
    free(stk.v);
    return rc;
}

/* V8's count for one sampled object of size bytes at interval (sampling-heap-profiler.cc,
 * ScaleSample): the objects of that size its sample stands for, 1 / (1 - e^(-size/interval)),
 * rounded. */
static uint64_t v8_count(uint64_t size, int64_t interval)
{
    return (uint64_t)(1.0 / (1.0 - exp(-(double)size / (double)interval)) + 0.5);
}

/* The objects a sample of the protocol stands for. Its `size` S is not the object's size
 * but V8's estimate of the bytes it stands for, the object's size s times v8_count(s) (the
 * inspector multiplies them, v8-heap-profiler-agent-impl.cc): the bytes are taken as they
 * are, and the count is recovered as the largest c with s = S / c a whole multiple of 4
 * (V8's smallest object alignment) and v8_count(s) == c, that is the smallest object size
 * consistent with S (sizes sharing one S, such as 32 and 40 bytes at 512 KiB, read as the
 * smaller). Since c = round(1/x + 1/2 + x/12 ...) with x = s / interval, S - interval < s
 * (1 + x/12): c is searched from S / (S - interval), plus slack, down. 1 when none fits. */
static uint64_t sample_objects(uint64_t S, int64_t interval)
{
    uint64_t r = (uint64_t)interval;
    if (S <= r) return 1; /* V8's S is never below the interval */
    uint64_t cmax = (uint64_t)((double)S / (double)(S - r) * 1.01) + 10;
    if (cmax > S / 4) cmax = S / 4;
    if (cmax > r / 8 + 2) cmax = r / 8 + 2; /* no object is below 8 bytes */
    for (uint64_t c = cmax; c > 1; c--)
        if (S % c == 0 && (S / c) % 4 == 0 && v8_count(S / c, interval) == c) return c;
    return 1;
}

int cp_v8_heap_profile(const cp_json *profile, int64_t interval_bytes, int alloc,
                       uint64_t *watermark, cp_profile **out, cp_err *err)
{
    *out = NULL;
    tree t = {0};
    cp_profile *p = NULL;
    double *objs = NULL, *bytes = NULL;
    const cp_json **js = NULL;
    u32vec stk = {0};
    int rc;
    if (interval_bytes <= 0) interval_bytes = 1;
    if (!cp_json_is(profile, CP_JSON_OBJECT))
        return cp_err_set(err, CP_EPARSE, "heap profile: not an object");
    const cp_json *head = cp_json_get(profile, "head");
    const cp_json *samples = cp_json_get(profile, "samples");
    if (!cp_json_is(head, CP_JSON_OBJECT))
        return cp_err_set(err, CP_EPARSE, "heap profile: no head node");
    if (samples && !cp_json_is(samples, CP_JSON_ARRAY))
        return cp_err_set(err, CP_EPARSE, "heap profile: samples is not an array");
    /* flatten the tree breadth first: js[i] the node, t.n[i] its fields */
    uint32_t cap = 256;
    rc = CP_ENOMEM;
    t.n = malloc(cap * sizeof(node));
    js = malloc(cap * sizeof(*js));
    if (!t.n || !js) goto fail;
    js[0] = head;
    t.n[0].parent = NONE;
    t.len = 1;
    for (uint32_t i = 0; i < t.len; i++) {
        if ((rc = read_node(&t, i, js[i], t.n[i].parent, err))) goto fail;
        const cp_json *ch = cp_json_get(js[i], "children");
        if (ch && !cp_json_is(ch, CP_JSON_ARRAY)) {
            rc = cp_err_set(err, CP_EPARSE, "heap node %lld: children is not an array",
                            (long long)t.n[i].id);
            goto fail;
        }
        size_t nc = cp_json_len(ch);
        if ((size_t)t.len + nc > CP_V8_MAX_NODES) {
            rc = cp_err_set(err, CP_ELIMIT, "heap profile: more than %u nodes", CP_V8_MAX_NODES);
            goto fail;
        }
        while (t.len + nc > cap) {
            cap *= 2;
            node *nn = realloc(t.n, cap * sizeof(node));
            if (!nn) goto fail_nomem;
            t.n = nn;
            const cp_json **nj = realloc(js, cap * sizeof(*js));
            if (!nj) goto fail_nomem;
            js = nj;
        }
        for (size_t k = 0; k < nc; k++) {
            js[t.len] = cp_json_at(ch, k);
            t.n[t.len].parent = i;
            t.len++;
        }
    }
    if ((rc = index_ids(&t, err))) goto fail;
    objs = calloc(t.len, sizeof(double));
    bytes = calloc(t.len, sizeof(double));
    if (!objs || !bytes) goto fail_nomem;
    uint64_t high = watermark ? *watermark : 0, low = high;
    for (size_t i = 0; i < cp_json_len(samples); i++) {
        const cp_json *s = cp_json_at(samples, i);
        int64_t size, nid, ord;
        if (!cp_json_is(s, CP_JSON_OBJECT)) {
            rc = cp_err_set(err, CP_EPARSE, "heap profile: samples[%zu] is not an object", i);
            goto fail;
        }
        if ((rc = get_int(s, "size", 0, 0, INT64_C(1) << 40, &size, "heap sample", err)) ||
            (rc = get_int(s, "nodeId", -1, 0, INT64_MAX / 2, &nid, "heap sample", err)) ||
            (rc = get_int(s, "ordinal", 0, 0, INT64_MAX / 2, &ord, "heap sample", err)))
            goto fail;
        uint32_t ni = find_node(&t, nid);
        if (ni == NONE) {
            rc = cp_err_set(err, CP_EPARSE, "heap profile: samples[%zu].nodeId %lld is no node", i,
                            (long long)nid);
            goto fail;
        }
        if ((uint64_t)ord > high) high = (uint64_t)ord;
        if (alloc && (uint64_t)ord <= low) continue;
        objs[ni] += (double)sample_objects((uint64_t)size, interval_bytes);
        bytes[ni] += (double)size; /* V8's estimate already (sample_objects) */
    }
    if (watermark) *watermark = high;
    if ((rc = start_profile(&p, alloc ? "alloc_objects" : "inuse_objects", "count",
                            alloc ? "alloc_space" : "inuse_space", "bytes", "space", "bytes",
                            alloc ? "alloc_space" : "inuse_space")))
        goto fail;
    p->period = interval_bytes;
    for (uint32_t i = 0; i < t.len; i++) {
        if (bytes[i] <= 0) continue;
        int64_t vals[2] = {llround(objs[i]), llround(bytes[i])};
        if ((rc = add_stack(p, &t, i, vals, &stk, err))) goto fail;
    }
    *out = p;
    p = NULL;
    rc = 0;
    goto fail;
fail_nomem:
    rc = CP_ENOMEM;
fail:
    cp_profile_destroy(p);
    tree_close(&t);
    free(js);
    free(objs);
    free(bytes);
    free(stk.v);
    return rc;
}

/* ------------------------------------------------------------------------------------
 * Inspector discovery and messages. */

#define MAX_TARGETS 4096

int cp_v8_targets_parse(const char *body, size_t len, cp_v8_target **out, size_t *n, cp_err *err)
{
    *out = NULL;
    *n = 0;
    cp_json *list = NULL;
    cp_err je = {0};
    if (cp_json_parse_flags(body, len, CP_JSON_UTF8, &list, &je) == CP_ENOMEM) return CP_ENOMEM;
    if (!cp_json_is(list, CP_JSON_ARRAY)) {
        int rc = cp_err_set(err, CP_EPARSE, "/json/list is not a JSON array: %s",
                            list ? "another value" : je.msg);
        cp_json_free(list);
        return rc;
    }
    size_t k = cp_json_len(list);
    if (k > MAX_TARGETS) {
        cp_json_free(list);
        return cp_err_set(err, CP_ELIMIT, "/json/list: %zu targets: over %d", k, MAX_TARGETS);
    }
    cp_v8_target *v = calloc(k ? k : 1, sizeof(*v));
    if (!v) {
        cp_json_free(list);
        return CP_ENOMEM;
    }
    for (size_t i = 0; i < k; i++) {
        const cp_json *t = cp_json_at(list, i);
        const char *id = get_str(t, "id"), *title = get_str(t, "title");
        const char *ws = get_str(t, "webSocketDebuggerUrl");
        /* ws://HOST:PORT/PATH: only the path is used; the host is the one we were given */
        const char *p = ws && !strncmp(ws, "ws://", 5) ? strchr(ws + 5, '/') : NULL;
        if (!id || !id[0] || strlen(id) >= sizeof(v->id) || !p || strlen(p) >= sizeof(v->path))
            continue;
        cp_v8_target *o = &v[(*n)++];
        snprintf(o->id, sizeof(o->id), "%s", id);
        snprintf(o->title, sizeof(o->title), "%s", title ? title : "");
        snprintf(o->path, sizeof(o->path), "%s", p);
    }
    cp_json_free(list);
    *out = v;
    return 0;
}

void cp_v8_isolate_of(const char *title, char *out, size_t cap)
{
    const char *wd = "workerd: worker ";
    if (!strncmp(title, wd, strlen(wd)) && title[strlen(wd)])
        snprintf(out, cap, "%.100s", title + strlen(wd));
    else if (!strncmp(title, "workerd", 7))
        snprintf(out, cap, "%.100s", title);
    else
        snprintf(out, cap, "main");
}

void cp_v8_worker_isolate(const char *title, char *out, size_t cap)
{
    const char *cut = title && title[0] == '[' ? strstr(title, "] ") : NULL;
    if (cut && cut[2]) title = cut + 2;
    snprintf(out, cap, "%.100s", title && title[0] ? title : "worker");
}

int cp_v8_message_parse(const char *data, size_t len, cp_json **out, cp_err *err)
{
    cp_json *m = NULL;
    cp_err je = {0};
    *out = NULL;
    int rc = cp_json_parse_flags(data, len, CP_JSON_UTF8, &m, &je);
    if (rc == CP_ENOMEM) return rc;
    if (rc) return cp_err_set(err, CP_EPARSE, "malformed JSON message: %s", je.msg);
    if (!cp_json_is(m, CP_JSON_OBJECT)) {
        cp_json_free(m);
        return cp_err_set(err, CP_EPARSE, "malformed message: not a JSON object");
    }
    *out = m;
    return 0;
}

int cp_v8_worker_message(const cp_json *params, const char **sid, cp_json **inner, cp_err *err)
{
    const char *ws = get_str(params, "sessionId"), *text = get_str(params, "message");
    *sid = NULL;
    *inner = NULL;
    if (!ws || !text)
        return cp_err_set(err, CP_EPARSE, "malformed worker message (no sessionId/message)");
    cp_json *m = NULL;
    cp_err je = {0};
    int rc = cp_json_parse_flags(text, strlen(text), CP_JSON_UTF8, &m, &je);
    if (rc == CP_ENOMEM) return rc;
    if (rc) return cp_err_set(err, CP_EPARSE, "malformed worker message (%s)", je.msg);
    if (!cp_json_is(m, CP_JSON_OBJECT)) {
        cp_json_free(m);
        return cp_err_set(err, CP_EPARSE, "malformed worker message (not an object)");
    }
    *sid = ws;
    *inner = m;
    return 0;
}

/* ------------------------------------------------------------------------------------
 * /proc texts: the host's threads and their CPU. */

/* A decimal in [0, max] at *s; advances *s past it. 0 or -1. */
static int read_dec(const char **s, int64_t max, int64_t *out)
{
    const char *p = *s;
    int64_t v = 0;
    if (*p < '0' || *p > '9') return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (max - (*p - '0')) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    *s = p;
    *out = v;
    return 0;
}

int cp_v8_thread_self_parse(const char *text, int *pid, int *tid, cp_err *err)
{
    const char *p = text ? text : "";
    int64_t a, b;
    if (read_dec(&p, INT32_MAX, &a) || strncmp(p, "/task/", 6) ||
        (p += 6, read_dec(&p, INT32_MAX, &b)) || *p || !a || !b)
        return cp_err_set(err, CP_EPARSE, "thread-self %.60s: not PID/task/TID",
                          text ? text : "(none)");
    *pid = (int)a;
    *tid = (int)b;
    return 0;
}

int cp_v8_tcp_listener(const char *line, unsigned port, uint64_t *inode)
{
    /* "  0: 0100007F:2405 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000  0 INODE
     * ..." */
    const char *p = line;
    while (*p == ' ')
        p++;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p++ != ':') return 0;
    while (*p == ' ')
        p++;
    const char *colon = p;
    while (*colon && *colon != ':' && *colon != ' ')
        colon++;
    if (*colon != ':') return 0;
    char *end;
    unsigned long lp = strtoul(colon + 1, &end, 16);
    if (end == colon + 1 || *end != ' ' || lp != port) return 0;
    /* remote address, then the state */
    p = end;
    while (*p == ' ')
        p++;
    while (*p && *p != ' ')
        p++;
    while (*p == ' ')
        p++;
    if (strncmp(p, "0A ", 3)) return 0;
    /* tx:rx, tr:when, retrnsmt, uid, timeout, inode: the 6th field after the state */
    p += 3;
    for (int f = 0; f < 5; f++) {
        while (*p == ' ')
            p++;
        if (!*p) return 0;
        while (*p && *p != ' ')
            p++;
    }
    while (*p == ' ')
        p++;
    int64_t ino;
    if (read_dec(&p, INT64_MAX, &ino) || (*p && *p != ' ' && *p != '\n') || !ino) return 0;
    *inode = (uint64_t)ino;
    return 1;
}

int cp_v8_schedstat_ns(const char *text, int64_t *ns)
{
    const char *p = text ? text : "";
    return read_dec(&p, INT64_MAX, ns) || (*p != ' ' && *p != '\n' && *p) ? CP_EPARSE : 0;
}

int cp_v8_stat_ticks(const char *text, int64_t *ticks)
{
    const char *p = text ? strrchr(text, ')') : NULL;
    if (!p) return CP_EPARSE;
    p++;
    /* after ')': state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
     * utime stime: utime is the 12th field */
    int64_t v[2];
    for (int f = 1; f <= 13; f++) {
        if (*p++ != ' ') return CP_EPARSE;
        if (f < 12) {
            if (!*p) return CP_EPARSE;
            while (*p && *p != ' ')
                p++;
        } else if (read_dec(&p, INT64_MAX / 4, &v[f - 12])) {
            return CP_EPARSE;
        }
    }
    *ticks = v[0] + v[1];
    return 0;
}
