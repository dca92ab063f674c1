/* The store's readers: merged profiles (cp_store_query), per-step totals (_timeline), series
 * lists, label names and values, and the statistics; each query runs on a LevelDB snapshot.
 *
 * Locking: a query holds s->dblock for reading from its snapshot to its last read (so a
 * reopen waits for it, and series pointers stay valid meanwhile: retention frees a series
 * it forgot only when no query holds dblock), and takes s->lock for
 * reading only to match series and to resolve dictionary ids while building its output,
 * never while reading blocks. Nothing here changes the tables. */
#include "store.h"
#include "store_int.h"
#include "times.h"
#include "log.h"

#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------------------------
 * Reading
 * --------------------------------------------------------------------------------- */

int cp_store_kind_types(cp_kind kind, cp_profile *p)
{
    int rc;
    uint32_t a, b;
    switch (kind) {
    case CP_KIND_CPU:
        if ((rc = cp_profile_add_sample_type(p, "samples", "count")) ||
            (rc = cp_profile_add_sample_type(p, "cpu", "nanoseconds")) ||
            (rc = cp_profile_intern_cstr(p, "cpu", &a)) ||
            (rc = cp_profile_intern_cstr(p, "nanoseconds", &b)))
            return rc;
        break;
    case CP_KIND_ALLOC:
    case CP_KIND_INUSE: {
        int al = kind == CP_KIND_ALLOC;
        if ((rc = cp_profile_add_sample_type(p, al ? "alloc_objects" : "inuse_objects", "count")) ||
            (rc = cp_profile_add_sample_type(p, al ? "alloc_space" : "inuse_space", "bytes")) ||
            (rc = cp_profile_intern_cstr(p, "space", &a)) ||
            (rc = cp_profile_intern_cstr(p, "bytes", &b)))
            return rc;
        break;
    }
    case CP_KIND_WALL:
        if ((rc = cp_profile_add_sample_type(p, "samples", "count")) ||
            (rc = cp_profile_add_sample_type(p, "wall", "nanoseconds")) ||
            (rc = cp_profile_intern_cstr(p, "wall", &a)) ||
            (rc = cp_profile_intern_cstr(p, "nanoseconds", &b)))
            return rc;
        break;
    case CP_KIND_MUTEX:
    case CP_KIND_BLOCK:
        if ((rc = cp_profile_add_sample_type(p, "contentions", "count")) ||
            (rc = cp_profile_add_sample_type(p, "delay", "nanoseconds")) ||
            (rc = cp_profile_intern_cstr(p, "contentions", &a)) ||
            (rc = cp_profile_intern_cstr(p, "count", &b)))
            return rc;
        break;
    case CP_KIND_HEAP:
        if ((rc = cp_profile_add_sample_type(p, "retained_objects", "count")) ||
            (rc = cp_profile_add_sample_type(p, "retained_space", "bytes")) ||
            (rc = cp_profile_intern_cstr(p, "space", &a)) ||
            (rc = cp_profile_intern_cstr(p, "bytes", &b)))
            return rc;
        break;
    case CP_KIND_GOROUTINES:
        if ((rc = cp_profile_add_sample_type(p, "goroutine", "count")) ||
            (rc = cp_profile_intern_cstr(p, "goroutine", &a)) ||
            (rc = cp_profile_intern_cstr(p, "count", &b)))
            return rc;
        break;
    default:
        return CP_EINVAL;
    }
    p->period_type.type = a;
    p->period_type.unit = b;
    return 0;
}

typedef struct range {
    int level;
    int64_t a, b;
} range;

/* Splits [a, b) into the fewest aligned buckets, coarsest level first, in time order. */
static void decompose(int level, int64_t a, int64_t b, range *out, int *n)
{
    if (a >= b) return;
    if (level == 0) {
        out[(*n)++] = (range){0, a, b};
        return;
    }
    int64_t sz = cp_level_ns[level];
    int64_t first = -floor_div(-a, sz) * sz, last = floor_div(b, sz) * sz;
    if (first >= last) {
        decompose(level - 1, a, b, out, n);
        return;
    }
    decompose(level - 1, a, first, out, n);
    out[(*n)++] = (range){level, first, last};
    decompose(level - 1, last, b, out, n);
}

typedef struct qctx {
    cp_store *s;
    int64_t raw_from; /* level 0 is read for windows starting here or later (raw_cut) */
    const leveldb_snapshot_t *snap;
    leveldb_readoptions_t *ro;
    leveldb_iterator_t *it;
    const cp_query_limits *lim;
    uint64_t blocks;
    cp_buf scratch;
    cp_err *err;
    int locked; /* holds s->dblock for reading */
} qctx;

/* Where level 0 can be trusted: windows starting at or before the cut of raw retention
 * (the one applied, or the one due now, whichever is later: an answer does not change when
 * retention runs) may be gone, so the minute whose start follows the cut is the first read
 * from level 0. INT64_MIN when raw windows are kept forever. */
static int64_t raw_from(cp_store *s)
{
    if (s->retention[0] <= 0) return INT64_MIN;
    int64_t cut = cp_now_ns() - s->retention[0], applied = atomic_load(&s->raw_cut);
    if (applied > cut) cut = applied;
    return floor_div(cut, cp_level_ns[1]) * cp_level_ns[1] + cp_level_ns[1];
}

static int qctx_init(qctx *q, cp_store *s, const cp_query_limits *lim, cp_err *err)
{
    memset(q, 0, sizeof *q);
    q->s = s;
    q->raw_from = raw_from(s);
    q->lim = lim;
    q->err = err;
    pthread_rwlock_rdlock(&s->dblock);
    q->locked = 1;
    if (!s->db)
        return cp_err_set(err, CP_ESTORE,
                          "store %s is not open: an earlier write failed and "
                          "reopening it has not succeeded yet",
                          s->path);
    q->snap = leveldb_create_snapshot(s->db);
    q->ro = leveldb_readoptions_create();
    leveldb_readoptions_set_verify_checksums(q->ro, 1);
    leveldb_readoptions_set_snapshot(q->ro, q->snap);
    q->it = leveldb_create_iterator(s->db, q->ro);
    return 0;
}

static void qctx_close(qctx *q)
{
    if (q->it) leveldb_iter_destroy(q->it);
    if (q->ro) leveldb_readoptions_destroy(q->ro);
    if (q->snap) leveldb_release_snapshot(q->s->db, q->snap);
    cp_buf_close(&q->scratch);
    if (q->locked) pthread_rwlock_unlock(&q->s->dblock);
    q->locked = 0;
}

static int q_check(qctx *q)
{
    q->blocks++;
    if (q->lim && q->lim->max_blocks && q->blocks > q->lim->max_blocks)
        return cp_err_set(q->err, CP_ELIMIT, "query reads more than %llu blocks",
                          (unsigned long long)q->lim->max_blocks);
    if (q->lim && q->lim->deadline_ns && (q->blocks & 7) == 0 && now_mono() > q->lim->deadline_ns)
        return cp_err_set(q->err, CP_ELIMIT, "query ran past its time limit");
    return 0;
}

/* Calls fn for every block of ser in r (time order). fn returns 0 to go on, 1 to stop. */
typedef int (*block_fn)(qctx *q, void *arg, const uint8_t *v, size_t len);

static int scan_range(qctx *q, const cp_ser *ser, const range *r, block_fn fn, void *arg)
{
    uint8_t k0[CP_TENANT_KEY_MAX + 16], k1[CP_TENANT_KEY_MAX + 16];
    size_t n = key_block(k0, ser, r->level, r->a);
    key_block(k1, ser, r->level, r->b);
    for (leveldb_iter_seek(q->it, (const char *)k0, n); leveldb_iter_valid(q->it);
         leveldb_iter_next(q->it)) {
        size_t kl, vl;
        const char *key = leveldb_iter_key(q->it, &kl);
        if (kl != n || memcmp(key, k1, n) >= 0) break;
        int rc = q_check(q);
        if (rc) return rc;
        const char *v = leveldb_iter_value(q->it, &vl);
        if ((rc = fn(q, arg, (const uint8_t *)v, vl))) return rc;
    }
    char *e = NULL;
    leveldb_iter_get_error(q->it, &e);
    if (e) {
        int rc = cp_ldb_fail(q->s, q->err, e, "reading blocks");
        leveldb_free(e);
        return rc;
    }
    return 0;
}

static int keep_last(qctx *q, void *arg, const uint8_t *v, size_t len)
{
    cp_buf *b = arg;
    b->len = 0;
    if (cp_buf_append(b, v, len)) return cp_err_set(q->err, CP_ENOMEM, "query");
    return 0;
}

/* Level-0 pieces (under a minute, at the range's ragged ends) older than q->raw_from are
 * read from the 1-minute rollup instead: the minutes whose start lies in the piece. Each
 * minute then belongs to exactly one of any ranges that tile a period, so the steps of a
 * timeline add up to the profile of their whole range at every step size, before and
 * after retention. (Newer than raw_from, a window belongs to the range its start is in.) */
static void past_raw(const qctx *q, range *rs, int *n)
{
    range out[4 * CP_NLEVELS];
    int m = 0;
    for (int i = 0; i < *n; i++) {
        range r = rs[i];
        if (r.level != 0 || r.a >= q->raw_from) {
            out[m++] = r;
            continue;
        }
        int64_t split = r.b < q->raw_from ? r.b : q->raw_from;
        out[m++] = (range){1, r.a, split};
        if (split < r.b) out[m++] = (range){0, split, r.b};
    }
    memcpy(rs, out, sizeof(range) * (size_t)m);
    *n = m;
}

/* Visits the blocks of ser that make up [from, to): every one (sum kinds), or only the
 * last existing one (inuse: the latest snapshot). */
static int visit(qctx *q, const cp_ser *ser, int64_t from, int64_t to, block_fn fn, void *arg)
{
    range rs[4 * CP_NLEVELS];
    int n = 0;
    decompose(CP_NLEVELS - 1, from, to, rs, &n);
    past_raw(q, rs, &n);
    if (!cp_kind_is_gauge(ser->kind)) {
        for (int i = 0; i < n; i++) {
            int rc = scan_range(q, ser, &rs[i], fn, arg);
            if (rc) return rc < 0 ? rc : 0;
        }
        return 0;
    }
    /* inuse: the last block of the last range that has one */
    cp_buf last = {0};
    int rc = 0;
    for (int i = n - 1; i >= 0 && rc == 0; i--) {
        last.len = 0;
        rc = scan_range(q, ser, &rs[i], keep_last, &last);
        if (rc == 0 && last.len) {
            rc = fn(q, arg, last.data, last.len);
            break;
        }
    }
    cp_buf_close(&last);
    return rc < 0 ? rc : 0;
}

typedef CP_VEC(cp_ser *) servec;

/* Selector semantics of model/selector.h (an absent label matches as ""), evaluated here
 * on the parsed matchers so the store does not depend on the parser's module. */
static int sel_match(const cp_selector *sel, const cp_labels *l)
{
    /* The capture rule (store.h, cp_store_series), decided here for every reader: a
     * capture's series only for a selector that names the capture label. */
    if (cp_labels_get(l, CP_CAPTURE_LABEL)) {
        int named = 0;
        for (uint32_t i = 0; sel && i < sel->n && !named; i++)
            named = strcmp(sel->m[i].name, CP_CAPTURE_LABEL) == 0;
        if (!named) return 0;
    }
    for (uint32_t i = 0; sel && i < sel->n; i++) {
        const cp_matcher *m = &sel->m[i];
        const char *v = cp_labels_get(l, m->name);
        if (!v) v = "";
        int hit;
        switch (m->op) {
        case CP_MATCH_EQ:
            hit = strcmp(v, m->value) == 0;
            break;
        case CP_MATCH_NE:
            hit = strcmp(v, m->value) != 0;
            break;
        case CP_MATCH_RE:
        case CP_MATCH_NRE:
            hit = m->has_re ? regexec(&m->re, v, 0, NULL, 0) == 0 : strcmp(v, m->value) == 0;
            if (m->op == CP_MATCH_NRE) hit = !hit;
            break;
        default:
            hit = 0;
        }
        if (!hit) return 0;
    }
    return 1;
}

/* Series of t of kind (0 = any) matched by sel, in id order (the order they were made).
 * Uses the label index for the first non-empty equality matcher, then checks every
 * matcher. Caller holds the read lock. */
static int match_series(qctx *q, tenant *t, int kind, const cp_selector *sel, servec *out)
{
    out->n = 0;
    const cp_matcher *eq = NULL;
    for (uint32_t i = 0; sel && i < sel->n && !eq; i++)
        if (sel->m[i].op == CP_MATCH_EQ && sel->m[i].value[0]) eq = &sel->m[i];
    if (!eq) {
        for (uint32_t i = 0; i < t->series.n; i++) {
            cp_ser *s = t->series.v[i];
            if (!s || (kind && (int)s->kind != kind) || !sel_match(sel, &s->labels)) continue;
            if (cp_vec_push(out, s)) return cp_err_set(q->err, CP_ENOMEM, "query");
        }
        return 0;
    }
    cp_buf k = {0};
    uint8_t pre[CP_TENANT_KEY_MAX + 2];
    size_t n = key_tenant(pre, t, CP_K_LABEL);
    if (cp_buf_append(&k, pre, n) || cp_buf_append(&k, eq->name, strlen(eq->name) + 1) ||
        cp_buf_append(&k, eq->value, strlen(eq->value) + 1)) {
        cp_buf_close(&k);
        return cp_err_set(q->err, CP_ENOMEM, "query");
    }
    int rc = 0;
    for (leveldb_iter_seek(q->it, (const char *)k.data, k.len); leveldb_iter_valid(q->it);
         leveldb_iter_next(q->it)) {
        size_t kl;
        const char *key = leveldb_iter_key(q->it, &kl);
        if (kl != k.len + 4 || memcmp(key, k.data, k.len)) break;
        uint32_t id = cp_get_be32((const uint8_t *)key + k.len);
        cp_ser *s = cp_ser_by_id(t, id);
        if (!s) continue; /* forgotten since this query's snapshot */
        if ((kind && (int)s->kind != kind) || !sel_match(sel, &s->labels)) continue;
        if (cp_vec_push(out, s)) {
            rc = cp_err_set(q->err, CP_ENOMEM, "query");
            break;
        }
    }
    cp_buf_close(&k);
    return rc;
}

static int check_range(int64_t from, int64_t to, const cp_query_limits *lim, cp_err *err)
{
    if (from <= -TIME_LIMIT || from >= TIME_LIMIT || to <= -TIME_LIMIT || to >= TIME_LIMIT)
        return cp_err_set(err, CP_EINVAL, "time range [%lld, %lld) out of bounds", (long long)from,
                          (long long)to);
    if (from > to)
        return cp_err_set(err, CP_EINVAL, "from (%lld) is after to (%lld)", (long long)from,
                          (long long)to);
    if (lim && lim->max_range_ns && to - from > lim->max_range_ns)
        return cp_err_set(err, CP_ELIMIT, "time range of %llds exceeds the limit of %llds",
                          (long long)((to - from) / 1000000000),
                          (long long)(lim->max_range_ns / 1000000000));
    return 0;
}

/* Output columns: the first series' types; other series map theirs by name. */
typedef struct qtypes {
    uint32_t n;
    const char *type[CP_MAX_TYPES], *unit[CP_MAX_TYPES];
} qtypes;

static void ser_colmap(const qtypes *qt, const cp_ser *s, int *colmap)
{
    for (uint32_t c = 0; c < s->ntypes; c++) {
        colmap[c] = -1;
        for (uint32_t j = 0; j < qt->n; j++)
            if (!strcmp(qt->type[j], s->type[c]) && !strcmp(qt->unit[j], s->unit[c]))
                colmap[c] = (int)j;
    }
}

typedef struct addctx {
    cp_acc *acc;
    const int *colmap;
    int64_t *totals; /* timeline: per output column */
    /* format-1 stores: stack id -> the first equal stack (cp_dict.stk_alias; fixed at open) */
    const uint32_t *stk_alias;
    uint32_t nstk_alias;
    int64_t snap_ns; /* the time_ns of the last block added (inuse: its snapshot's start) */
} addctx;

static int add_block(qctx *q, void *arg, const uint8_t *v, size_t len)
{
    addctx *a = arg;
    cp_block_it it;
    int rc = cp_block_it_init(&it, v, len, &q->scratch, q->err);
    if (rc) return rc;
    a->snap_ns = it.time_ns;
    if (a->totals) {
        for (uint32_t t = 0; t < it.ntypes; t++)
            if (a->colmap[t] >= 0)
                a->totals[a->colmap[t]] = cp_add_wrap(a->totals[a->colmap[t]], it.total[t]);
        return 0;
    }
    int64_t vals[CP_MAX_TYPES];
    uint32_t id;
    while ((rc = cp_block_it_next(&it, &id, vals)) == 1) {
        if (id < a->nstk_alias) id = a->stk_alias[id];
        int64_t *row = cp_acc_row(a->acc, id);
        if (!row) return cp_err_set(q->err, CP_ENOMEM, "query");
        for (uint32_t t = 0; t < it.ntypes; t++)
            if (a->colmap[t] >= 0) row[a->colmap[t]] = cp_add_wrap(row[a->colmap[t]], vals[t]);
    }
    if (rc < 0) return cp_err_set(q->err, CP_ESTORE, "store: corrupt block entry");
    return 0;
}

/* --- building the output profile from dictionary ids (read lock held) --------------- */

typedef struct outmap {
    const cp_dict *d;
    cp_profile *p;
    uint32_t *s, *f, *m, *l; /* dict id -> output id + 1 (strings) or output id */
} outmap;

static int out_str(outmap *o, uint32_t id, uint32_t *out)
{
    if (id == 0 || id + 1 >= o->d->soff.n) {
        *out = 0;
        return 0;
    }
    if (!o->s[id]) {
        size_t len;
        const char *str = cp_dict_str(o->d, id, &len);
        uint32_t oid;
        if (cp_profile_intern(o->p, str, len, &oid)) return CP_ENOMEM;
        o->s[id] = oid + 1;
    }
    *out = o->s[id] - 1;
    return 0;
}

static int out_loc(outmap *o, uint32_t lid, uint32_t *out)
{
    const cp_dict *d = o->d;
    if (lid == 0 || lid > d->loc.n) return CP_ESTORE;
    if (o->l[lid]) {
        *out = o->l[lid];
        return 0;
    }
    const cp_location *l = &d->loc.v[lid - 1];
    uint32_t mid = 0;
    if (l->mapping_id && l->mapping_id <= d->map.n) {
        if (!o->m[l->mapping_id]) {
            cp_mapping m = d->map.v[l->mapping_id - 1];
            if (out_str(o, m.filename, &m.filename) || out_str(o, m.build_id, &m.build_id) ||
                cp_profile_add_mapping(o->p, &m, &o->m[l->mapping_id]))
                return CP_ENOMEM;
        }
        mid = o->m[l->mapping_id];
    }
    cp_line lines[64], *lp = l->nlines <= 64 ? lines : malloc(sizeof(cp_line) * l->nlines);
    if (!lp) return CP_ENOMEM;
    int rc = 0;
    for (uint32_t i = 0; i < l->nlines && !rc; i++) {
        cp_line ln = l->line_off + i < d->lines.n ? d->lines.v[l->line_off + i] : (cp_line){0, 0};
        uint32_t fid = ln.function_id;
        ln.function_id = 0;
        if (fid && fid <= d->fn.n) {
            if (!o->f[fid]) {
                cp_function f = d->fn.v[fid - 1];
                if (out_str(o, f.name, &f.name) || out_str(o, f.system_name, &f.system_name) ||
                    out_str(o, f.filename, &f.filename) ||
                    cp_profile_add_function(o->p, &f, &o->f[fid])) {
                    rc = CP_ENOMEM;
                    break;
                }
            }
            ln.function_id = o->f[fid];
        }
        lp[i] = ln;
    }
    if (!rc) rc = cp_profile_add_location(o->p, l->address, mid, lp, l->nlines, &o->l[lid]);
    if (lp != lines) free(lp);
    if (!rc) *out = o->l[lid];
    return rc;
}

/* Adds the nonzero rows of acc to o->p as samples, each with its stack's labels and then
 * extra[0..nextra) (already in o->p's strings). 0, CP_ENOMEM or CP_ESTORE. */
static int add_rows(outmap *o, const cp_acc *acc, const cp_label *extra, uint32_t nextra)
{
    const cp_dict *d = o->d;
    CP_VEC(uint32_t) locs = {0};
    CP_VEC(cp_label) labels = {0};
    int rc = 0;
    for (uint32_t i = 0; i < acc->ids.n && !rc; i++) {
        const int64_t *row = acc->vals.v + (size_t)i * acc->ntypes;
        int nz = 0;
        for (uint32_t c = 0; c < acc->ntypes; c++)
            nz |= row[c] != 0;
        if (!nz) continue;
        uint32_t sid = acc->ids.v[i];
        if (sid == 0 || sid > d->stk.n) {
            rc = CP_ESTORE;
            break;
        }
        const cp_sample *st = &d->stk.v[sid - 1];
        locs.n = labels.n = 0;
        if (cp_vec_reserve(&locs, st->nlocs + 1) ||
            cp_vec_reserve(&labels, st->nlabels + nextra + 1)) {
            rc = CP_ENOMEM;
            break;
        }
        for (uint32_t j = 0; j < st->nlocs && !rc; j++) {
            uint32_t lid = st->loc_off + j < d->stk_locs.n ? d->stk_locs.v[st->loc_off + j] : 0;
            rc = out_loc(o, lid, &locs.v[locs.n++]);
        }
        for (uint32_t j = 0; j < st->nlabels && !rc && st->label_off + j < d->stk_labels.n; j++) {
            cp_label lb = d->stk_labels.v[st->label_off + j];
            if (out_str(o, lb.key, &lb.key) || out_str(o, lb.str, &lb.str) ||
                out_str(o, lb.num_unit, &lb.num_unit))
                rc = CP_ENOMEM;
            labels.v[labels.n++] = lb;
        }
        for (uint32_t j = 0; j < nextra; j++)
            labels.v[labels.n++] = extra[j];
        if (!rc) rc = cp_profile_add_sample(o->p, locs.v, locs.n, row, labels.v, labels.n);
    }
    free(locs.v);
    free(labels.v);
    return rc;
}

static int outmap_init(outmap *o, const tenant *t, cp_profile *p)
{
    const cp_dict *d = &t->dict;
    *o = (outmap){d,
                  p,
                  calloc(d->soff.n + 1, 4),
                  calloc(d->fn.n + 1, 4),
                  calloc(d->map.n + 1, 4),
                  calloc(d->loc.n + 1, 4)};
    return !o->s || !o->f || !o->m || !o->l ? CP_ENOMEM : 0;
}

static void outmap_close(outmap *o)
{
    free(o->s);
    free(o->f);
    free(o->m);
    free(o->l);
}

static int build_error(const tenant *t, int rc, cp_err *err)
{
    if (rc == CP_ESTORE)
        return cp_err_set(err, rc,
                          "tenant %s: a block refers to a stack or location missing "
                          "from the dictionary",
                          t->name);
    if (rc) return cp_err_set(err, rc, "query: building the profile");
    return 0;
}

static int build_profile(const tenant *t, const cp_acc *acc, cp_profile *p, cp_err *err)
{
    outmap o;
    int rc = outmap_init(&o, t, p);
    if (!rc) rc = add_rows(&o, acc, NULL, 0);
    outmap_close(&o);
    return build_error(t, rc, err);
}

/* Output sample types and period from the matched series (read lock held). */
static int set_types(cp_profile *p, cp_kind kind, const servec *ss, qtypes *qt)
{
    memset(qt, 0, sizeof *qt);
    if (!ss->n) {
        int rc = cp_store_kind_types(kind, p);
        if (rc) return rc;
        qt->n = p->sample_types.n;
        for (uint32_t i = 0; i < qt->n; i++) {
            qt->type[i] = cp_profile_str(p, p->sample_types.v[i].type);
            qt->unit[i] = cp_profile_str(p, p->sample_types.v[i].unit);
        }
        return 0;
    }
    const cp_ser *f = ss->v[0];
    qt->n = f->ntypes;
    for (uint32_t i = 0; i < f->ntypes; i++) {
        qt->type[i] = f->type[i];
        qt->unit[i] = f->unit[i];
        int rc = cp_profile_add_sample_type(p, f->type[i], f->unit[i]);
        if (rc) return rc;
    }
    int64_t period = 0;
    for (uint32_t i = 0; i < ss->n; i++)
        if (ss->v[i]->period > period) period = ss->v[i]->period;
    p->period = period;
    int rc = cp_profile_intern_cstr(p, f->period_type, &p->period_type.type);
    if (!rc) rc = cp_profile_intern_cstr(p, f->period_unit, &p->period_type.unit);
    return rc;
}

/* The labels that mark each series' own samples: its labels formatted, and the start of its
 * snapshot's window. */
static int series_marks(cp_profile *p, const cp_ser *ser, int64_t snap_ns, cp_buf *tmp, cp_label *m)
{
    tmp->len = 0;
    memset(m, 0, 2 * sizeof *m);
    m[1].num = snap_ns;
    int rc = cp_labels_format(&ser->labels, tmp);
    if (!rc) rc = cp_profile_intern(p, (const char *)tmp->data, tmp->len, &m[0].str);
    if (!rc) rc = cp_profile_intern_cstr(p, CP_STORE_SERIES_LABEL, &m[0].key);
    if (!rc) rc = cp_profile_intern_cstr(p, CP_STORE_SNAPSHOT_LABEL, &m[1].key);
    if (!rc) rc = cp_profile_intern_cstr(p, "nanoseconds", &m[1].num_unit);
    return rc ? CP_ENOMEM : 0;
}

/* inuse, per series: each series' last snapshot in the range as samples of their own,
 * marked (series_marks). Caller holds no lock; q is open. */
static int query_per_series(qctx *q, const cp_query *qr, tenant *t, const servec *ss,
                            const qtypes *qt, cp_profile *p)
{
    cp_store *s = q->s;
    cp_err *err = q->err;
    int64_t from_ns = qr->from_ns, to_ns = qr->to_ns;
    cp_acc accv, *acc = &accv;
    cp_acc_init(acc, 0);
    outmap o;
    /* the dictionary now holds every id the snapshot's blocks refer to (ingest adds to it
     * before it writes a block) */
    pthread_rwlock_rdlock(&s->lock);
    int rc = outmap_init(&o, t, p);
    pthread_rwlock_unlock(&s->lock);
    cp_buf tmp = {0};
    for (uint32_t i = 0; i < ss->n && !rc && from_ns < to_ns; i++) {
        int colmap[CP_MAX_TYPES];
        ser_colmap(qt, ss->v[i], colmap);
        cp_acc_reset(acc, qt->n);
        addctx a = {acc, colmap, NULL, t->dict.stk_alias, t->dict.nstk_alias, INT64_MIN};
        rc = visit(q, ss->v[i], from_ns, to_ns, add_block, &a);
        if (rc || a.snap_ns == INT64_MIN) continue; /* no snapshot in the range */
        cp_label m[2];
        pthread_rwlock_rdlock(&s->lock);
        rc = series_marks(p, ss->v[i], a.snap_ns, &tmp, m);
        uint32_t before = p->samples.n;
        if (!rc) rc = add_rows(&o, acc, m, 2);
        /* a snapshot of nothing in use still is the series' latest: one empty sample says so */
        int64_t zero[CP_MAX_TYPES] = {0};
        uint32_t none = 0;
        if (!rc && p->samples.n == before) rc = cp_profile_add_sample(p, &none, 0, zero, m, 2);
        pthread_rwlock_unlock(&s->lock);
        if (rc) rc = build_error(t, rc, err);
    }
    outmap_close(&o);
    cp_buf_close(&tmp);
    cp_acc_close(acc);
    if (rc == CP_ENOMEM && (!err || err->code != rc)) cp_err_set(err, rc, "query");
    return rc;
}

int cp_store_query(cp_store *s, const cp_query *qr, cp_profile **out, cp_err *err)
{
    const char *tenant_name = qr->tenant;
    cp_kind kind = qr->kind;
    const cp_selector *sel = &qr->sel;
    int64_t from_ns = qr->from_ns, to_ns = qr->to_ns;
    const cp_query_limits *lim = &qr->lim;
    *out = NULL;
    if (!cp_kind_name((int)kind)) return cp_err_set(err, CP_EINVAL, "unknown kind %d", (int)kind);
    int rc = check_range(from_ns, to_ns, lim, err);
    if (rc) return rc;
    cp_profile *p = cp_profile_create();
    if (!p) return cp_err_set(err, CP_ENOMEM, "query");
    qctx q;
    rc = qctx_init(&q, s, lim, err);
    servec ss = {0};
    cp_acc acc;
    cp_acc_init(&acc, 0);
    qtypes qt;
    pthread_rwlock_rdlock(&s->lock);
    tenant *t = tenant_name && !rc ? cp_tenant_find(s, tenant_name, strlen(tenant_name)) : NULL;
    if (t) rc = match_series(&q, t, (int)kind, sel, &ss);
    if (!rc) rc = set_types(p, kind, &ss, &qt);
    pthread_rwlock_unlock(&s->lock);
    if (rc) {
        if (rc != CP_ENOMEM && err && err->code == rc) goto done;
        cp_err_set(err, rc, "query: %s", cp_strerror(rc));
        goto done;
    }
    if (qr->by_series && cp_kind_is_gauge(kind) && t) {
        rc = query_per_series(&q, qr, t, &ss, &qt, p);
        goto window;
    }
    cp_acc_reset(&acc, qt.n);
    for (uint32_t i = 0; i < ss.n && !rc && from_ns < to_ns; i++) {
        int colmap[CP_MAX_TYPES];
        ser_colmap(&qt, ss.v[i], colmap);
        addctx a = {&acc, colmap, NULL, t->dict.stk_alias, t->dict.nstk_alias, 0};
        rc = visit(&q, ss.v[i], from_ns, to_ns, add_block, &a);
    }
    if (!rc && acc.ids.n) {
        pthread_rwlock_rdlock(&s->lock);
        rc = build_profile(t, &acc, p, err);
        pthread_rwlock_unlock(&s->lock);
    }
window:
    p->time_nanos = from_ns;
    p->duration_nanos = to_ns - from_ns;
done:
    qctx_close(&q);
    free(ss.v);
    cp_acc_close(&acc);
    if (rc) {
        cp_profile_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

int cp_store_timeline(cp_store *s, const cp_query *qr, cp_timeline *out, cp_err *err)
{
    const char *tenant_name = qr->tenant;
    cp_kind kind = qr->kind;
    const cp_selector *sel = &qr->sel;
    int64_t from_ns = qr->from_ns, to_ns = qr->to_ns, step_ns = qr->step_ns;
    const cp_query_limits *lim = &qr->lim;
    memset(out, 0, sizeof *out);
    if (!cp_kind_name((int)kind)) return cp_err_set(err, CP_EINVAL, "unknown kind %d", (int)kind);
    int rc = check_range(from_ns, to_ns, lim, err);
    if (rc) return rc;
    if (step_ns <= 0) return cp_err_set(err, CP_EINVAL, "step must be positive");
    uint64_t n = (uint64_t)((to_ns - from_ns) / step_ns) + ((to_ns - from_ns) % step_ns != 0);
    if (n > 1000000)
        return cp_err_set(err, CP_ELIMIT, "timeline of %llu steps (at most 1000000)",
                          (unsigned long long)n);
    cp_profile *p = cp_profile_create();
    if (!p) return cp_err_set(err, CP_ENOMEM, "timeline");
    qctx q;
    rc = qctx_init(&q, s, lim, err);
    servec ss = {0};
    qtypes qt;
    pthread_rwlock_rdlock(&s->lock);
    tenant *t = tenant_name && !rc ? cp_tenant_find(s, tenant_name, strlen(tenant_name)) : NULL;
    if (t) rc = match_series(&q, t, (int)kind, sel, &ss);
    if (!rc) rc = set_types(p, kind, &ss, &qt);
    int64_t *span = rc ? NULL : malloc(sizeof(int64_t) * 2 * (ss.n + 1));
    if (!rc && !span) rc = CP_ENOMEM;
    for (uint32_t i = 0; !rc && i < ss.n; i++) {
        span[2 * i] = ss.v[i]->first_ns;
        span[2 * i + 1] = ss.v[i]->last_ns;
    }
    pthread_rwlock_unlock(&s->lock);
    int64_t *res = NULL;
    if (rc) {
        if (!err || err->code != rc) cp_err_set(err, rc, "timeline: %s", cp_strerror(rc));
        goto done;
    }
    res = calloc(n * qt.n + 1, sizeof(int64_t));
    if (!res) {
        rc = cp_err_set(err, CP_ENOMEM, "timeline");
        goto done;
    }
    for (uint32_t i = 0; i < ss.n && !rc; i++) {
        int colmap[CP_MAX_TYPES];
        ser_colmap(&qt, ss.v[i], colmap);
        for (uint64_t k = 0; k < n && !rc; k++) {
            int64_t a = from_ns + (int64_t)k * step_ns;
            int64_t b = a + step_ns < to_ns ? a + step_ns : to_ns;
            /* past raw retention a step holds whole minutes, which may reach past b */
            int64_t reach = b < q.raw_from ? b + cp_level_ns[1] : b;
            if (reach <= span[2 * i] || a > span[2 * i + 1]) continue;
            addctx ac = {NULL, colmap, res + k * qt.n, NULL, 0, 0};
            rc = visit(&q, ss.v[i], a, b, add_block, &ac);
        }
    }
done:
    qctx_close(&q);
    free(ss.v);
    free(span);
    cp_profile_destroy(p);
    if (rc) {
        free(res);
        return rc;
    }
    out->v = res;
    out->nsteps = (uint32_t)n;
    out->ntypes = qt.n;
    return 0;
}

static int exists_block(qctx *q, void *arg, const uint8_t *v, size_t len)
{
    (void)q, (void)v, (void)len;
    *(int *)arg = 1;
    return 1;
}

void cp_series_list_close(cp_series_list *l)
{
    if (!l) return;
    for (uint32_t i = 0; i < l->n; i++) {
        cp_labels_close(&l->v[i].labels);
        free(l->v[i].cap_engine);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

void cp_string_list_close(cp_string_list *l)
{
    if (!l) return;
    for (uint32_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* A capture series' window records ('W', format.h) summed into si's cap_* fields. */
static int capture_info(qctx *q, const cp_ser *x, cp_series_info *si)
{
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    size_t n = key_tenant(k, x->t, CP_K_CAPWIN);
    cp_put_be32(k + n, x->id);
    n += 4;
    int64_t last_start = INT64_MIN;
    for (leveldb_iter_seek(q->it, (const char *)k, n); leveldb_iter_valid(q->it);
         leveldb_iter_next(q->it)) {
        size_t kl, vl;
        const uint8_t *key = (const uint8_t *)leveldb_iter_key(q->it, &kl);
        if (kl != n + 8 || memcmp(key, k, n)) break;
        const uint8_t *v = (const uint8_t *)leveldb_iter_value(q->it, &vl);
        cp_rd r = {v, v + vl, 0};
        int64_t start = cp_time_unkey(cp_get_be64(key + n));
        int64_t dur = cp_get_sv(&r);
        uint64_t samples = cp_get_uv(&r);
        size_t elen;
        const uint8_t *eng = cp_get_str(&r, &elen);
        if (r.bad)
            return cp_err_set(q->err, CP_ESTORE, "store: corrupt capture window of series %u",
                              x->id);
        si->cap_windows++;
        si->cap_samples += samples;
        if (start + dur > si->cap_end_ns) si->cap_end_ns = start + dur;
        if (start >= last_start) {
            last_start = start;
            free(si->cap_engine);
            if (!(si->cap_engine = xstrndup((const char *)eng, elen)))
                return cp_err_set(q->err, CP_ENOMEM, "series");
        }
    }
    return 0;
}

int cp_store_series(cp_store *s, const cp_query *qr, cp_series_list *out, cp_err *err)
{
    const char *tenant_name = qr->tenant;
    const cp_selector *sel = &qr->sel;
    int64_t from_ns = qr->from_ns, to_ns = qr->to_ns;
    memset(out, 0, sizeof *out);
    int rc = check_range(from_ns, to_ns, NULL, err);
    if (rc) return rc;
    qctx q;
    rc = qctx_init(&q, s, NULL, err);
    servec ss = {0};
    pthread_rwlock_rdlock(&s->lock);
    tenant *t = tenant_name && !rc ? cp_tenant_find(s, tenant_name, strlen(tenant_name)) : NULL;
    if (t) rc = match_series(&q, t, 0, sel, &ss);
    for (uint32_t i = 0; i < ss.n && !rc; i++) {
        cp_ser *x = ss.v[i];
        if (x->first_ns > x->last_ns || to_ns <= x->first_ns || from_ns > x->last_ns) continue;
        int found = from_ns <= x->first_ns && x->last_ns < to_ns;
        if (!found) rc = visit(&q, x, from_ns, to_ns, exists_block, &found);
        if (rc || !found) continue;
        cp_series_info si = {{{0}}, x->kind, x->first_ns, x->last_ns, 0, 0, 0, NULL};
        if (cp_labels_get(&x->labels, CP_CAPTURE_LABEL) && (rc = capture_info(&q, x, &si))) break;
        if (cp_labels_copy(&si.labels, &x->labels) || cp_vec_push(out, si)) {
            cp_labels_close(&si.labels);
            free(si.cap_engine);
            rc = cp_err_set(err, CP_ENOMEM, "series");
        }
    }
    pthread_rwlock_unlock(&s->lock);
    qctx_close(&q);
    free(ss.v);
    if (rc) cp_series_list_close(out);
    return rc;
}

/* Walks the label index of a tenant: distinct names (name == NULL) or the distinct values
 * of one name, in byte order, of the series the capture rule leaves in (sel_match with no
 * selector): a part is listed once a key of it names such a series. The values of the
 * capture label itself are the capture ids, all listed. */
static int label_walk(cp_store *s, const char *tenant_name, const char *name, cp_string_list *out,
                      cp_err *err)
{
    memset(out, 0, sizeof *out);
    if (!tenant_name || !cp_name_valid(tenant_name, CP_TENANT_KEY_MAX)) return 0;
    size_t tl = strlen(tenant_name);
    int all = name && strcmp(name, CP_CAPTURE_LABEL) == 0;
    cp_buf pre = {0}, k = {0};
    uint8_t z = 0, type = CP_K_LABEL;
    int rc = 0;
    if (cp_buf_append(&pre, tenant_name, tl) || cp_buf_append(&pre, &z, 1) ||
        cp_buf_append(&pre, &type, 1) || (name && cp_buf_append(&pre, name, strlen(name) + 1))) {
        rc = cp_err_set(err, CP_ENOMEM, "labels");
        goto done;
    }
    pthread_rwlock_rdlock(&s->dblock);
    if (!s->db) {
        pthread_rwlock_unlock(&s->dblock);
        rc = cp_err_set(err, CP_ESTORE,
                        "store %s is not open: an earlier write failed and "
                        "reopening it has not succeeded yet",
                        s->path);
        goto done;
    }
    pthread_rwlock_rdlock(&s->lock);
    tenant *t = cp_tenant_find(s, tenant_name, tl);
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    leveldb_iter_seek(it, (const char *)pre.data, pre.len);
    while (t && leveldb_iter_valid(it)) {
        size_t kl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl < pre.len + 4 || memcmp(key, pre.data, pre.len)) break;
        const char *part = key + pre.len;
        const char *nul = memchr(part, 0, kl - pre.len);
        if (!nul) break;
        size_t pl = (size_t)(nul - part);
        uint32_t id = cp_get_be32((const uint8_t *)key + kl - 4);
        const cp_ser *ser = all ? NULL : cp_ser_by_id(t, id);
        if (!all && (!ser || !sel_match(NULL, &ser->labels))) {
            leveldb_iter_next(it); /* this key's series is left out: the next key */
            continue;
        }
        char *str = xstrndup(part, pl);
        if (!str || cp_vec_push(out, str)) {
            free(str);
            rc = cp_err_set(err, CP_ENOMEM, "labels");
            break;
        }
        /* skip every key sharing this part */
        k.len = 0;
        uint8_t one = 1;
        if (cp_buf_append(&k, pre.data, pre.len) || cp_buf_append(&k, part, pl) ||
            cp_buf_append(&k, &one, 1)) {
            rc = cp_err_set(err, CP_ENOMEM, "labels");
            break;
        }
        leveldb_iter_seek(it, (const char *)k.data, k.len);
    }
    leveldb_iter_destroy(it);
    pthread_rwlock_unlock(&s->lock);
    pthread_rwlock_unlock(&s->dblock);
done:
    cp_buf_close(&pre);
    cp_buf_close(&k);
    if (rc) cp_string_list_close(out);
    return rc;
}

int cp_store_label_names(cp_store *s, const cp_query *q, cp_string_list *out, cp_err *err)
{
    return label_walk(s, q->tenant, NULL, out, err);
}

int cp_store_label_values(cp_store *s, const cp_query *q, cp_string_list *out, cp_err *err)
{
    if (!q->label) return cp_err_set(err, CP_EINVAL, "label name missing");
    return label_walk(s, q->tenant, q->label, out, err);
}

/* ---- the readers as a cp_reader (store.h) ------------------------------------------- */

static cp_store *store_of(cp_reader *r)
{
    return (cp_store *)((char *)r - offsetof(cp_store, reader));
}

static int r_profile(cp_reader *r, const cp_query *q, cp_profile **out, cp_err *err)
{
    return cp_store_query(store_of(r), q, out, err);
}

static int r_timeline(cp_reader *r, const cp_query *q, cp_timeline *out, cp_err *err)
{
    return cp_store_timeline(store_of(r), q, out, err);
}

static int r_series(cp_reader *r, const cp_query *q, cp_series_list *out, cp_err *err)
{
    return cp_store_series(store_of(r), q, out, err);
}

static int r_labels(cp_reader *r, const cp_query *q, cp_string_list *out, cp_err *err)
{
    return cp_store_label_names(store_of(r), q, out, err);
}

static int r_values(cp_reader *r, const cp_query *q, cp_string_list *out, cp_err *err)
{
    return cp_store_label_values(store_of(r), q, out, err);
}

const cp_reader cp_store_reader_fns = {r_profile, r_timeline, r_series, r_labels, r_values};

cp_reader *cp_store_reader(cp_store *s)
{
    return s ? &s->reader : NULL;
}

void cp_store_get_stats(cp_store *s, cp_store_stats *out)
{
    memset(out, 0, sizeof *out);
    out->windows = atomic_load(&s->windows);
    out->stack_cache_hits = atomic_load(&s->wcache_hits);
    out->stack_cache_misses = atomic_load(&s->wcache_misses);
    out->stack_cache_flushes = atomic_load(&s->wcache_flushes);
    out->series_forgotten = atomic_load(&s->series_forgotten);
    pthread_rwlock_rdlock(&s->lock);
    out->stack_cache_bytes = s->wcache_bytes;
    out->bucket_bytes = s->bucket_bytes;
    out->bucket_drops = atomic_load(&s->bucket_drops);
    for (uint32_t i = 0; i < s->tenants.n; i++)
        out->series += s->tenants.v[i]->series.n - s->tenants.v[i]->holes;
    pthread_rwlock_unlock(&s->lock);
    DIR *d = opendir(s->path);
    if (!d) return;
    struct dirent *de;
    char p[4352];
    while ((de = readdir(d))) {
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", s->path, de->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) out->disk_bytes += (uint64_t)st.st_size;
    }
    closedir(d);
}
