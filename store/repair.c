/* The store's repair (`contprofd --repair`): LevelDB's own repair, then a rebuild of what
 * the store derives, so that a store which lost records in the middle (a damaged log record
 * or table) opens again and answers consistently. What references something lost is
 * dropped, never guessed; every drop is counted and reported. */
#include "store.h"
#include "store_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------
 * Id maps: old id -> new dense id (0 = dropped or absent)
 * --------------------------------------------------------------------------------- */

typedef struct entry {
    uint32_t old, neu;
    int same;   /* kept with the same id and bytes: nothing to write */
    uint8_t *v; /* value as stored (dictionary) or re-encoded (series) */
    size_t len;
} entry;

typedef CP_VEC(entry) entries;

static void entries_close(entries *e)
{
    for (uint32_t i = 0; i < e->n; i++)
        free(e->v[i].v);
    free(e->v);
    memset(e, 0, sizeof *e);
}

/* Entries come in key order, so old ids ascend: binary search. */
static uint32_t map_id(const entries *e, uint32_t old)
{
    uint32_t lo = 0, hi = e->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (e->v[mid].old < old)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < e->n && e->v[lo].old == old ? e->v[lo].neu : 0;
}

/* 0 stays 0 (no reference); anything else must map. Sets *bad on a lost reference. */
static uint64_t ref(const entries *e, uint64_t old, int *bad)
{
    if (old == 0) return 0;
    uint32_t n = old > UINT32_MAX ? 0 : map_id(e, (uint32_t)old);
    if (!n) *bad = 1;
    return n;
}

/* ---------------------------------------------------------------------------------
 * State of one tenant's repair
 * --------------------------------------------------------------------------------- */

typedef struct rser {
    uint32_t old, neu;
    uint64_t kind, ntypes;
    cp_labels labels;
    uint8_t *mid; /* ntypes .. period, as stored */
    size_t midlen;
    int64_t first, last;
    uint64_t windows;
    int64_t l0_min, l0_max; /* level-0 window starts found */
    int changed;
} rser;

typedef struct rep {
    leveldb_t *db;
    leveldb_readoptions_t *ro; /* on a snapshot taken before any write */
    leveldb_writebatch_t *del, *put;
    const char *t;
    size_t tl;
    entries d[5]; /* s, f, m, l, k */
    CP_VEC(rser) ser;
    cp_buf k, v, scratch;
    cp_acc a, b, c;
    cp_store_repair_stats st; /* this tenant */
    cp_err *err;
    FILE *out;
    int renumbered;       /* remap_acc changed a stack id */
    int64_t raw_ret, now; /* raw retention and the time it applies at */
} rep;

static void say(rep *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(rep *r, const char *fmt, ...)
{
    if (!r->out) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(r->out, "tenant %.*s: ", (int)r->tl, r->t);
    vfprintf(r->out, fmt, ap);
    fputc('\n', r->out);
    va_end(ap);
}

static const uint8_t kinds[5] = {CP_D_STRING, CP_D_FUNCTION, CP_D_MAPPING, CP_D_LOCATION,
                                 CP_D_STACK};
static const char *const kind_names[5] = {"strings", "functions", "mappings", "locations",
                                          "stacks"};

static size_t tkey(rep *r, uint8_t *k, uint8_t type)
{
    memcpy(k, r->t, r->tl);
    k[r->tl] = 0;
    k[r->tl + 1] = type;
    return r->tl + 2;
}

static void putv(cp_buf *b, uint64_t v)
{
    uint8_t tmp[10];
    cp_buf_append(b, tmp, (size_t)(cp_put_uv(tmp, v) - tmp));
}

static rser *ser_of(rep *r, uint32_t old)
{
    uint32_t lo = 0, hi = r->ser.n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (r->ser.v[mid].old < old)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < r->ser.n && r->ser.v[lo].old == old ? &r->ser.v[lo] : NULL;
}

/* ---------------------------------------------------------------------------------
 * Dictionaries
 * --------------------------------------------------------------------------------- */

/* Re-encodes entry value v of kind with references mapped; *bad if one is lost. */
static int dict_remap(rep *r, uint8_t kind, const uint8_t *v, size_t len, cp_buf *out, int *bad)
{
    cp_rd rd = {v, v + len, 0};
    out->len = 0;
    const entries *S = &r->d[0], *F = &r->d[1], *M = &r->d[2], *L = &r->d[3];
    switch (kind) {
    case CP_D_STRING:
        return cp_buf_append(out, v, len);
    case CP_D_FUNCTION:
        for (int i = 0; i < 3; i++)
            putv(out, ref(S, cp_get_uv(&rd), bad));
        putv(out, cp_get_uv(&rd)); /* start line (zigzag, kept as is) */
        break;
    case CP_D_MAPPING:
        for (int i = 0; i < 3; i++)
            putv(out, cp_get_uv(&rd));
        putv(out, ref(S, cp_get_uv(&rd), bad));
        putv(out, ref(S, cp_get_uv(&rd), bad));
        putv(out, cp_get_uv(&rd));
        break;
    case CP_D_LOCATION: {
        putv(out, ref(M, cp_get_uv(&rd), bad));
        putv(out, cp_get_uv(&rd));
        putv(out, cp_get_uv(&rd));
        uint64_t n = cp_get_uv(&rd);
        if (n > len) rd.bad = 1;
        putv(out, n);
        for (uint64_t i = 0; i < n && !rd.bad; i++) {
            putv(out, ref(F, cp_get_uv(&rd), bad));
            putv(out, cp_get_uv(&rd));
        }
        break;
    }
    case CP_D_STACK: {
        uint64_t n = cp_get_uv(&rd);
        if (n > len) rd.bad = 1;
        putv(out, n);
        for (uint64_t i = 0; i < n && !rd.bad; i++)
            putv(out, ref(L, cp_get_uv(&rd), bad));
        n = cp_get_uv(&rd);
        if (n > len) rd.bad = 1;
        putv(out, n);
        for (uint64_t i = 0; i < n && !rd.bad; i++) {
            putv(out, ref(S, cp_get_uv(&rd), bad));
            putv(out, ref(S, cp_get_uv(&rd), bad));
            putv(out, cp_get_uv(&rd));
            putv(out, ref(S, cp_get_uv(&rd), bad));
        }
        break;
    }
    }
    if (rd.bad) *bad = 1; /* undecodable: dropped like a lost reference */
    return out->data || !out->len ? 0 : CP_ENOMEM;
}

static int repair_dicts(rep *r, leveldb_iterator_t *it)
{
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    for (int ki = 0; ki < 5; ki++) {
        entries *E = &r->d[ki];
        size_t n = tkey(r, k, CP_K_DICT);
        k[n] = kinds[ki];
        uint32_t next = 1;
        uint64_t dropped = 0, missing = 0;
        for (leveldb_iter_seek(it, (const char *)k, n + 1); leveldb_iter_valid(it);
             leveldb_iter_next(it)) {
            size_t kl, vl;
            const char *key = leveldb_iter_key(it, &kl);
            if (kl < n + 1 || memcmp(key, k, n + 1)) break;
            const char *v = leveldb_iter_value(it, &vl);
            if (kl != n + 5) { /* not a dictionary key: drop it */
                leveldb_writebatch_delete(r->del, key, kl);
                r->st.keys_dropped++;
                continue;
            }
            uint32_t old = cp_get_be32((const uint8_t *)key + n + 1);
            int bad = 0;
            if (old == 0) bad = 1; /* ids start at 1 */
            if (dict_remap(r, kinds[ki], (const uint8_t *)v, vl, &r->v, &bad))
                return cp_err_set(r->err, CP_ENOMEM, "repair");
            entry e = {old, bad ? 0 : next, 0, NULL, 0};
            e.same = !bad && next == old && r->v.len == vl && !memcmp(r->v.data, v, vl);
            if (!bad) {
                e.v = malloc(r->v.len ? r->v.len : 1);
                if (!e.v) return cp_err_set(r->err, CP_ENOMEM, "repair");
                memcpy(e.v, r->v.data, r->v.len);
                e.len = r->v.len;
                next++;
            } else {
                dropped++;
            }
            if (cp_vec_push(E, e)) {
                free(e.v);
                return cp_err_set(r->err, CP_ENOMEM, "repair");
            }
            if (!e.same) leveldb_writebatch_delete(r->del, key, kl);
        }
        uint32_t maxold = E->n ? E->v[E->n - 1].old : 0;
        missing = maxold > E->n ? maxold - E->n : 0;
        uint64_t kept = next - 1;
        for (uint32_t i = 0; i < E->n; i++) {
            if (!E->v[i].neu || E->v[i].same) continue;
            uint8_t nk[CP_TENANT_KEY_MAX + 16];
            size_t m = tkey(r, nk, CP_K_DICT);
            nk[m] = kinds[ki];
            cp_put_be32(nk + m + 1, E->v[i].neu);
            leveldb_writebatch_put(r->put, (const char *)nk, m + 5, (const char *)E->v[i].v,
                                   E->v[i].len);
        }
        r->st.dict_missing += missing;
        r->st.dict_dropped += dropped;
        r->st.dict_kept += kept;
        if (missing || dropped)
            say(r,
                "dictionary of %s: %llu ids missing (lost records), %llu entries "
                "dropped (they referred to lost entries), %llu kept",
                kind_names[ki], (unsigned long long)missing, (unsigned long long)dropped,
                (unsigned long long)kept);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Series and label index
 * --------------------------------------------------------------------------------- */

static char *rd_cstr(cp_rd *rd)
{
    size_t n;
    const uint8_t *p = cp_get_str(rd, &n);
    if (!p) return NULL;
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static void rser_close(rser *x)
{
    cp_labels_close(&x->labels);
    free(x->mid);
}

/* Decodes a series record (format.h); 0, or -1 if it is damaged. */
static int ser_parse(rser *x, const uint8_t *v, size_t len)
{
    cp_rd rd = {v, v + len, 0};
    x->kind = cp_get_uv(&rd);
    uint64_t nl = cp_get_uv(&rd);
    for (uint64_t i = 0; i < nl && !rd.bad; i++) {
        char *n = rd_cstr(&rd), *val = n ? rd_cstr(&rd) : NULL;
        if (!n || !val || cp_labels_set(&x->labels, n, val)) rd.bad = 1;
        free(n);
        free(val);
    }
    const uint8_t *mid = rd.p;
    x->ntypes = cp_get_uv(&rd);
    if (x->ntypes == 0 || x->ntypes > CP_MAX_TYPES) rd.bad = 1;
    size_t sl;
    for (uint64_t i = 0; i < 2 * x->ntypes + 2 && !rd.bad; i++)
        cp_get_str(&rd, &sl);
    cp_get_sv(&rd); /* period */
    if (rd.bad || !cp_kind_name((int)x->kind)) return -1;
    x->midlen = (size_t)(rd.p - mid);
    x->mid = malloc(x->midlen);
    if (!x->mid) return -1;
    memcpy(x->mid, mid, x->midlen);
    x->first = cp_get_sv(&rd);
    x->last = cp_get_sv(&rd);
    x->windows = cp_get_uv(&rd);
    x->l0_min = INT64_MAX;
    x->l0_max = INT64_MIN;
    return rd.bad ? -1 : 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Series ids with no usable record: the damaged records' and those the label index names
 * (written with every series) that no record has. A series retention forgot left no key
 * at all: its id is a gap, not a loss. */
static uint64_t series_lost(rep *r, uint32_t *ids, uint32_t n, uint32_t unnamed)
{
    if (n) qsort(ids, n, sizeof *ids, cmp_u32);
    uint64_t lost = unnamed;
    for (uint32_t i = 0; i < n; i++)
        lost += (i == 0 || ids[i] != ids[i - 1]) && !ser_of(r, ids[i]);
    return lost;
}

static int repair_series(rep *r, leveldb_iterator_t *it)
{
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    size_t n = tkey(r, k, CP_K_SERIES);
    uint32_t next = 1, unnamed = 0;
    CP_VEC(uint32_t) gone = {0}; /* ids of damaged records, then of index keys unrecorded */
    int rc = 0;
    for (leveldb_iter_seek(it, (const char *)k, n); leveldb_iter_valid(it); leveldb_iter_next(it)) {
        size_t kl, vl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl < n || memcmp(key, k, n)) break;
        const char *v = leveldb_iter_value(it, &vl);
        leveldb_writebatch_delete(r->del, key, kl);
        rser x = {0};
        x.old = kl == n + 4 ? cp_get_be32((const uint8_t *)key + n) : 0;
        if (x.old == 0 || ser_parse(&x, (const uint8_t *)v, vl)) {
            if (x.old == 0)
                unnamed++;
            else if (cp_vec_push(&gone, x.old))
                rc = CP_ENOMEM;
            rser_close(&x);
            continue;
        }
        x.neu = next++;
        if (cp_vec_push(&r->ser, x)) {
            rser_close(&x);
            rc = CP_ENOMEM;
            break;
        }
    }
    /* the label index is rebuilt from the records kept */
    n = tkey(r, k, CP_K_LABEL);
    for (leveldb_iter_seek(it, (const char *)k, n); leveldb_iter_valid(it) && !rc;
         leveldb_iter_next(it)) {
        size_t kl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl < n || memcmp(key, k, n)) break;
        leveldb_writebatch_delete(r->del, key, kl);
        uint32_t id = kl >= n + 4 ? cp_get_be32((const uint8_t *)key + kl - 4) : 0;
        if (id && !ser_of(r, id) && cp_vec_push(&gone, id)) rc = CP_ENOMEM;
    }
    uint64_t missing = rc ? 0 : series_lost(r, gone.v, gone.n, unnamed);
    free(gone.v);
    if (rc) return cp_err_set(r->err, CP_ENOMEM, "repair");
    r->st.series_missing += missing;
    r->st.series_kept += r->ser.n;
    if (missing)
        say(r, "series: %llu without a usable record (their blocks are dropped), %u kept",
            (unsigned long long)missing, r->ser.n);
    for (uint32_t i = 0; i < r->ser.n; i++) {
        const rser *x = &r->ser.v[i];
        for (uint32_t j = 0; j < x->labels.p.n; j++) {
            r->k.len = 0;
            uint8_t id[4];
            cp_put_be32(id, x->neu);
            const char *ln = x->labels.p.v[j].name, *lv = x->labels.p.v[j].value;
            if (cp_buf_append(&r->k, k, n) || cp_buf_append(&r->k, ln, strlen(ln) + 1) ||
                cp_buf_append(&r->k, lv, strlen(lv) + 1) || cp_buf_append(&r->k, id, 4))
                return cp_err_set(r->err, CP_ENOMEM, "repair");
            leveldb_writebatch_put(r->put, (const char *)r->k.data, r->k.len, "", 0);
        }
    }
    return 0;
}

/* Writes the series records kept, under their new ids, with the window span widened to
 * the level-0 windows found. */
static int put_series(rep *r)
{
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    size_t n = tkey(r, k, CP_K_SERIES);
    for (uint32_t i = 0; i < r->ser.n; i++) {
        rser *x = &r->ser.v[i];
        if (x->l0_min < x->first || x->first > x->last) x->first = x->l0_min;
        if (x->l0_max > x->last || x->first > x->last) x->last = x->l0_max;
        cp_buf *b = &r->v;
        b->len = 0;
        putv(b, x->kind);
        putv(b, x->labels.p.n);
        for (uint32_t j = 0; j < x->labels.p.n; j++)
            for (int h = 0; h < 2; h++) {
                const char *s = h ? x->labels.p.v[j].value : x->labels.p.v[j].name;
                putv(b, strlen(s));
                cp_buf_append(b, s, strlen(s));
            }
        cp_buf_append(b, x->mid, x->midlen);
        putv(b, cp_zz(x->first));
        putv(b, cp_zz(x->last));
        putv(b, x->windows);
        if (!b->data) return cp_err_set(r->err, CP_ENOMEM, "repair");
        cp_put_be32(k + n, x->neu);
        leveldb_writebatch_put(r->put, (const char *)k, n + 4, (const char *)b->data, b->len);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Blocks
 * --------------------------------------------------------------------------------- */

/* dst = src with stack ids renumbered; rows of lost stacks dropped (counted). */
static int remap_acc(rep *r, const cp_acc *src, cp_acc *dst, uint64_t *dropped)
{
    cp_acc_reset(dst, src->ntypes);
    dst->time_ns = src->time_ns;
    dst->windows = src->windows;
    for (uint32_t i = 0; i < src->ids.n; i++) {
        uint32_t nid = map_id(&r->d[4], src->ids.v[i]);
        if (!nid) {
            (*dropped)++;
            continue;
        }
        r->renumbered |= nid != src->ids.v[i];
        int64_t *row = cp_acc_row(dst, nid);
        if (!row) return CP_ENOMEM;
        memcpy(row, src->vals.v + (size_t)i * src->ntypes, sizeof(int64_t) * src->ntypes);
    }
    return 0;
}

static size_t bkey(rep *r, uint8_t *k, uint32_t ser, int level, int64_t start)
{
    size_t n = tkey(r, k, CP_K_BLOCK);
    cp_put_be32(k + n, ser);
    k[n + 4] = (uint8_t)level;
    cp_put_be64(k + n + 5, cp_time_key(start));
    return n + 13;
}

/* The level-0 windows of series old in [a, b): their count, and with rebuild, their sum
 * (cpu, alloc) or latest snapshot (inuse) in r->b, renumbered. */
static int level0(rep *r, leveldb_iterator_t *it, const rser *x, int64_t a, int64_t b, int rebuild,
                  uint64_t *count)
{
    uint8_t k0[CP_TENANT_KEY_MAX + 16], k1[CP_TENANT_KEY_MAX + 16];
    size_t n = bkey(r, k0, x->old, 0, a);
    bkey(r, k1, x->old, 0, b);
    *count = 0;
    if (rebuild) cp_acc_reset(&r->b, (uint32_t)x->ntypes);
    int64_t first = INT64_MAX;
    for (leveldb_iter_seek(it, (const char *)k0, n); leveldb_iter_valid(it);
         leveldb_iter_next(it)) {
        size_t kl, vl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl != n || memcmp(key, k1, n) >= 0) break;
        const uint8_t *v = (const uint8_t *)leveldb_iter_value(it, &vl);
        if (!rebuild) {
            cp_block_it bi;
            if (cp_block_it_init(&bi, v, vl, &r->scratch, NULL) || bi.ntypes != x->ntypes) continue;
            *count += bi.windows;
            continue;
        }
        uint64_t dropped = 0;
        if (cp_block_load(&r->c, v, vl, &r->scratch, NULL) || r->c.ntypes != x->ntypes) continue;
        if (remap_acc(r, &r->c, &r->a, &dropped)) return CP_ENOMEM;
        *count += r->c.windows;
        if (r->c.time_ns < first) first = r->c.time_ns;
        if (cp_kind_is_gauge((int)x->kind)) {
            if (cp_acc_copy(&r->b, &r->a)) return CP_ENOMEM;
        } else if (cp_acc_add(&r->b, &r->a, 1)) {
            return CP_ENOMEM;
        }
    }
    if (rebuild) {
        r->b.windows = *count;
        if (!cp_kind_is_gauge((int)x->kind)) r->b.time_ns = first;
    }
    return 0;
}

static int64_t bucket_start(int level, int64_t t)
{
    int64_t len = cp_level_ns[level], q = t / len;
    if (t % len && t < 0) q--;
    return q * len;
}

/* Rollup buckets that are missing although level-0 windows lie in them (lost with a
 * damaged table): computed from those windows. */
static int missing_rollups(rep *r, leveldb_iterator_t *it)
{
    uint8_t k0[CP_TENANT_KEY_MAX + 16], k1[CP_TENANT_KEY_MAX + 16], rk[CP_TENANT_KEY_MAX + 16];
    leveldb_iterator_t *it3 = leveldb_create_iterator(r->db, r->ro);
    int rc = 0;
    for (uint32_t i = 0; i < r->ser.n && !rc; i++) {
        rser *x = &r->ser.v[i];
        if (x->l0_min > x->l0_max) continue;
        size_t n = bkey(r, k0, x->old, 0, INT64_MIN);
        bkey(r, k1, x->old, 1, INT64_MIN);
        for (int level = 1; level < CP_NLEVELS && !rc; level++) {
            int64_t last = 0;
            int have = 0;
            for (leveldb_iter_seek(it, (const char *)k0, n); leveldb_iter_valid(it) && !rc;
                 leveldb_iter_next(it)) {
                size_t kl;
                const char *key = leveldb_iter_key(it, &kl);
                if (kl != n || memcmp(key, k1, n) >= 0) break;
                int64_t b =
                    bucket_start(level, cp_time_unkey(cp_get_be64((const uint8_t *)key + n - 8)));
                if (have && b == last) continue;
                have = 1;
                last = b;
                size_t rl = bkey(r, rk, x->old, level, b), vl = 0;
                char *e = NULL;
                char *v = leveldb_get(r->db, r->ro, (const char *)rk, rl, &vl, &e);
                int missing = !v && !e;
                leveldb_free(v);
                leveldb_free(e);
                if (!missing) continue;
                uint64_t cnt = 0;
                if (level0(r, it3, x, b, b + cp_level_ns[level], 1, &cnt)) {
                    rc = CP_ENOMEM;
                    break;
                }
                r->v.len = 0;
                if (cp_block_encode(&r->b, &r->v)) {
                    rc = CP_ENOMEM;
                    break;
                }
                rl = bkey(r, rk, x->neu, level, b);
                leveldb_writebatch_put(r->put, (const char *)rk, rl, (const char *)r->v.data,
                                       r->v.len);
                r->st.rollups_rebuilt++;
            }
        }
    }
    leveldb_iter_destroy(it3);
    return rc;
}

static int repair_blocks(rep *r, leveldb_iterator_t *it, leveldb_iterator_t *it2)
{
    uint8_t k[CP_TENANT_KEY_MAX + 16], nk[CP_TENANT_KEY_MAX + 16];
    size_t n = tkey(r, k, CP_K_BLOCK);
    for (leveldb_iter_seek(it, (const char *)k, n); leveldb_iter_valid(it); leveldb_iter_next(it)) {
        size_t kl, vl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl < n || memcmp(key, k, n)) break;
        const uint8_t *v = (const uint8_t *)leveldb_iter_value(it, &vl);
        rser *x = kl == n + 13 ? ser_of(r, cp_get_be32((const uint8_t *)key + n)) : NULL;
        int level = kl == n + 13 ? (uint8_t)key[n + 4] : CP_NLEVELS;
        if (!x || level >= CP_NLEVELS || cp_block_load(&r->a, v, vl, &r->scratch, NULL) ||
            r->a.ntypes != x->ntypes) {
            leveldb_writebatch_delete(r->del, key, kl);
            r->st.blocks_dropped++;
            continue;
        }
        int64_t start = cp_time_unkey(cp_get_be64((const uint8_t *)key + n + 5));
        uint64_t dropped = 0;
        r->renumbered = 0;
        if (remap_acc(r, &r->a, &r->b, &dropped)) return cp_err_set(r->err, CP_ENOMEM, "repair");
        int changed = dropped > 0 || r->renumbered;
        r->st.rows_dropped += dropped;
        if (level == 0) {
            if (start < x->l0_min) x->l0_min = start;
            if (start > x->l0_max) x->l0_max = start;
        } else {
            uint64_t cnt = 0, windows = r->a.windows;
            int64_t end = start + cp_level_ns[level];
            /* a bucket that raw retention may have emptied cannot be checked */
            int checkable = r->raw_ret <= 0 || end > r->now - r->raw_ret;
            if (checkable && level0(r, it2, x, start, end, 0, &cnt))
                return cp_err_set(r->err, CP_ENOMEM, "repair");
            if (checkable && !cnt) { /* every window of it is lost */
                if (level == 1) r->st.windows_lost += windows;
                leveldb_writebatch_delete(r->del, key, kl);
                r->st.blocks_dropped++;
                continue;
            }
            if (checkable && cnt != windows) {
                if (level0(r, it2, x, start, end, 1, &cnt))
                    return cp_err_set(r->err, CP_ENOMEM, "repair");
                if (level == 1 && windows > cnt) r->st.windows_lost += windows - cnt;
                changed = 1;
                r->st.rollups_rebuilt++;
            }
        }
        size_t nl = bkey(r, nk, x->neu, level, start);
        if (!changed && x->neu == x->old) continue;
        if (x->neu != x->old) leveldb_writebatch_delete(r->del, key, kl);
        if (changed) {
            r->v.len = 0;
            if (cp_block_encode(&r->b, &r->v)) return cp_err_set(r->err, CP_ENOMEM, "repair");
            leveldb_writebatch_put(r->put, (const char *)nk, nl, (const char *)r->v.data, r->v.len);
        } else {
            leveldb_writebatch_put(r->put, (const char *)nk, nl, (const char *)v, vl);
        }
        r->st.blocks_rewritten++;
    }
    if (missing_rollups(r, it2)) return cp_err_set(r->err, CP_ENOMEM, "repair");
    /* the last cumulative input of each (series, producer): the same renumbering */
    n = tkey(r, k, CP_K_CUMUL);
    for (leveldb_iter_seek(it, (const char *)k, n); leveldb_iter_valid(it); leveldb_iter_next(it)) {
        size_t kl, vl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl < n || memcmp(key, k, n)) break;
        const uint8_t *v = (const uint8_t *)leveldb_iter_value(it, &vl);
        rser *x = kl >= n + 4 ? ser_of(r, cp_get_be32((const uint8_t *)key + n)) : NULL;
        uint64_t dropped = 0;
        leveldb_writebatch_delete(r->del, key, kl);
        if (!x || cp_block_load(&r->a, v, vl, &r->scratch, NULL) || r->a.ntypes != x->ntypes ||
            remap_acc(r, &r->a, &r->b, &dropped)) {
            r->st.blocks_dropped++;
            continue;
        }
        r->st.rows_dropped += dropped;
        r->k.len = 0;
        uint8_t id[4];
        cp_put_be32(id, x->neu);
        r->v.len = 0;
        if (cp_buf_append(&r->k, k, n) || cp_buf_append(&r->k, id, 4) ||
            cp_buf_append(&r->k, key + n + 4, kl - n - 4) || cp_block_encode(&r->b, &r->v))
            return cp_err_set(r->err, CP_ENOMEM, "repair");
        leveldb_writebatch_put(r->put, (const char *)r->k.data, r->k.len, (const char *)r->v.data,
                               r->v.len);
    }
    if (r->st.blocks_dropped || r->st.rows_dropped || r->st.rollups_rebuilt)
        say(r,
            "blocks: %llu dropped (lost series or undecodable), %llu rewritten; %llu rows of "
            "lost stacks dropped; %llu rollup buckets recomputed from their level-0 windows "
            "(%llu windows lost: counted in 1-minute rollups, gone from level 0)",
            (unsigned long long)r->st.blocks_dropped, (unsigned long long)r->st.blocks_rewritten,
            (unsigned long long)r->st.rows_dropped, (unsigned long long)r->st.rollups_rebuilt,
            (unsigned long long)r->st.windows_lost);
    return 0;
}

/* ---------------------------------------------------------------------------------
 * The whole repair
 * --------------------------------------------------------------------------------- */

static int repair_locked(const cp_store_options *opt, FILE *out, cp_store_repair_stats *st,
                         cp_err *err);

static void sum_stats(cp_store_repair_stats *d, const cp_store_repair_stats *s)
{
    uint64_t *a = (uint64_t *)d;
    const uint64_t *b = (const uint64_t *)s;
    for (size_t i = 0; i < sizeof *d / sizeof(uint64_t); i++)
        a[i] += b[i];
}

/* Rebuilds one tenant (every key under t \0) in one synced write. */
static int repair_tenant(leveldb_t *db, leveldb_readoptions_t *ro, const char *t, size_t tl,
                         int64_t raw_ret, FILE *out, cp_store_repair_stats *st, cp_err *err)
{
    rep r;
    memset(&r, 0, sizeof r);
    r.db = db;
    r.ro = ro;
    r.t = t;
    r.tl = tl;
    r.err = err;
    r.out = out;
    r.raw_ret = raw_ret;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r.now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    r.del = leveldb_writebatch_create();
    r.put = leveldb_writebatch_create();
    cp_acc_init(&r.a, 0);
    cp_acc_init(&r.b, 0);
    cp_acc_init(&r.c, 0);
    leveldb_iterator_t *it = leveldb_create_iterator(db, ro);
    leveldb_iterator_t *it2 = leveldb_create_iterator(db, ro);
    int rc = repair_dicts(&r, it);
    if (!rc) rc = repair_series(&r, it);
    if (!rc) rc = repair_blocks(&r, it, it2);
    if (!rc) rc = put_series(&r);
    char *e = NULL;
    leveldb_iter_get_error(it, &e);
    if (!e) leveldb_iter_get_error(it2, &e);
    if (e && !rc) rc = cp_err_set(err, CP_ESTORE, "repair: reading tenant %.*s: %s", (int)tl, t, e);
    leveldb_free(e);
    e = NULL;
    if (!rc) {
        leveldb_writebatch_append(r.del, r.put);
        leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
        leveldb_writeoptions_set_sync(wo, 1);
        leveldb_write(db, wo, r.del, &e);
        leveldb_writeoptions_destroy(wo);
        if (e) {
            rc = cp_err_set(err, CP_ESTORE, "repair: writing tenant %.*s: %s", (int)tl, t, e);
            leveldb_free(e);
        }
    }
    if (!rc) {
        say(&r, "%llu dictionary entries, %llu series%s", (unsigned long long)r.st.dict_kept,
            (unsigned long long)r.st.series_kept,
            r.st.dict_missing || r.st.dict_dropped || r.st.series_missing || r.st.blocks_dropped ||
                    r.st.rows_dropped || r.st.rollups_rebuilt
                ? " kept after the losses above"
                : ", nothing lost");
        sum_stats(st, &r.st);
    }
    leveldb_iter_destroy(it);
    leveldb_iter_destroy(it2);
    leveldb_writebatch_destroy(r.del);
    leveldb_writebatch_destroy(r.put);
    for (int i = 0; i < 5; i++)
        entries_close(&r.d[i]);
    for (uint32_t i = 0; i < r.ser.n; i++)
        rser_close(&r.ser.v[i]);
    free(r.ser.v);
    cp_buf_close(&r.k);
    cp_buf_close(&r.v);
    cp_buf_close(&r.scratch);
    cp_acc_close(&r.a);
    cp_acc_close(&r.b);
    cp_acc_close(&r.c);
    return rc;
}

/* LevelDB's repair takes no lock: hold the database's LOCK file (the fcntl lock LevelDB
 * takes at open) so a running contprofd is not repaired under its feet. Returns the fd to
 * keep open, or -1 with err set. */
static int lock_store(const char *path, cp_err *err)
{
    char lk[4352];
    snprintf(lk, sizeof lk, "%s/LOCK", path);
    int fd = open(lk, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        cp_err_set(err, CP_EIO, "store %s: cannot open its LOCK file: %s", path, strerror(errno));
        return -1;
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLK, &fl)) {
        cp_err_set(err, CP_ESTORE,
                   "store %s is open in another process (its LOCK is held): stop contprofd "
                   "before repairing",
                   path);
        close(fd);
        return -1;
    }
    return fd;
}

int cp_store_repair(const cp_store_options *opt, FILE *out, cp_store_repair_stats *st, cp_err *err)
{
    if (!opt || !opt->path || !*opt->path) return cp_err_set(err, CP_EINVAL, "repair: no path");
    int lockfd = lock_store(opt->path, err);
    if (lockfd < 0) return err ? err->code : CP_ESTORE;
    int rc = repair_locked(opt, out, st, err);
    close(lockfd);
    return rc;
}

static int repair_locked(const cp_store_options *opt, FILE *out, cp_store_repair_stats *st,
                         cp_err *err)
{
    const char *path = opt->path;
    cp_store_repair_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    /* what LevelDB's repair is about to drop from the logs, which it does not report */
    cp_wal_report w[16];
    uint32_t nw = 0;
    int rc = cp_wal_scan(path, w, 16, &nw, err);
    if (rc) return rc;
    for (uint32_t i = 0; i < nw; i++) {
        if (!w[i].corrupt && !w[i].tail) continue;
        /* LevelDB's repair replays logs without checking their checksums: a damaged write
         * would go into the store as it is. Keep only the intact writes. */
        cp_wal_salvage_stats ws;
        if ((rc = cp_wal_salvage(path, w[i].file, &ws, err))) return rc;
        st->log_bytes_dropped += ws.bytes_dropped;
        if (out) {
            if (w[i].corrupt)
                fprintf(out, "write-ahead log %s: %s at byte %llu\n", w[i].file, w[i].what,
                        (unsigned long long)w[i].bad_at);
            fprintf(out,
                    "write-ahead log %s: %llu intact writes kept; %llu bytes dropped (%llu "
                    "damaged places, each to the end of its 32 KiB block, and %llu unfinished "
                    "writes); the original is kept as lost/%s.damaged\n",
                    w[i].file, (unsigned long long)ws.writes_kept,
                    (unsigned long long)ws.bytes_dropped, (unsigned long long)ws.damaged,
                    (unsigned long long)ws.writes_dropped, w[i].file);
        }
    }
    leveldb_options_t *opts = leveldb_options_create();
    /* with paranoid checks LevelDB's repair verifies each table block's checksum: a damaged
     * block is left out (its table rewritten with the rest) instead of copied */
    leveldb_options_set_paranoid_checks(opts, 1);
    char *e = NULL;
    leveldb_repair_db(opts, path, &e);
    if (e) {
        rc = cp_err_set(err, CP_ESTORE, "store %s: LevelDB's repair failed: %s", path, e);
        leveldb_free(e);
        leveldb_options_destroy(opts);
        return rc;
    }
    leveldb_t *db = leveldb_open(opts, path, &e);
    if (e) {
        rc =
            cp_err_set(err, CP_ESTORE, "store %s: cannot open after LevelDB's repair: %s", path, e);
        leveldb_free(e);
        leveldb_options_destroy(opts);
        return rc;
    }
    leveldb_readoptions_t *ro = leveldb_readoptions_create();
    leveldb_readoptions_set_verify_checksums(ro, 1);
    const leveldb_snapshot_t *snap = leveldb_create_snapshot(db);
    leveldb_readoptions_set_snapshot(ro, snap);
    static const char vkey[2] = {0, CP_K_VERSION};
    size_t vl = 0;
    char *v = leveldb_get(db, ro, vkey, 2, &vl, &e);
    if (e) {
        rc = cp_err_set(err, CP_ESTORE,
                        "store %s: reading the format record after LevelDB's "
                        "repair: %s",
                        path, e);
    } else if (!v) {
        /* lost with a damaged table (the store's own keys are checked by the open at the
         * end): written again */
        leveldb_iterator_t *it = leveldb_create_iterator(db, ro);
        leveldb_iter_seek_to_first(it);
        int empty = !leveldb_iter_valid(it);
        leveldb_iter_destroy(it);
        if (empty && out)
            fprintf(out,
                    "nothing could be read back: the store is empty now (the damaged files "
                    "are kept in %s/lost/)\n",
                    path);
        {
            uint8_t rec[32];
            size_t ml = strlen(CP_STORE_FORMAT_MAGIC);
            memcpy(rec, CP_STORE_FORMAT_MAGIC, ml);
            cp_put_be32(rec + ml, CP_STORE_FORMAT_VERSION);
            leveldb_writeoptions_t *wo = leveldb_writeoptions_create();
            leveldb_writeoptions_set_sync(wo, 1);
            leveldb_put(db, wo, vkey, 2, (const char *)rec, ml + 4, &e);
            leveldb_writeoptions_destroy(wo);
            if (e)
                rc = cp_err_set(err, CP_ESTORE, "store %s: writing the format record: %s", path, e);
            else if (out)
                fprintf(out, "format record lost; written again (version %d)\n",
                        CP_STORE_FORMAT_VERSION);
        }
    }
    leveldb_free(e);
    e = NULL;
    leveldb_free(v);
    /* every tenant: its keys sort between "name\0" and "name\1" */
    leveldb_iterator_t *it = leveldb_create_iterator(db, ro);
    leveldb_iter_seek(it, "\x01", 1);
    char name[CP_TENANT_KEY_MAX + 2];
    while (!rc && leveldb_iter_valid(it)) {
        size_t kl;
        const char *key = leveldb_iter_key(it, &kl);
        const char *nul = memchr(key, 0, kl);
        size_t tl = nul ? (size_t)(nul - key) : kl;
        if (!nul || tl == 0 || tl > CP_TENANT_KEY_MAX) {
            /* not a tenant key: LevelDB's repair cannot produce one from our writes */
            rc = cp_err_set(err, CP_ESTORE, "store %s: a key without a tenant prefix", path);
            break;
        }
        memcpy(name, key, tl);
        rc = repair_tenant(db, ro, name, tl, opt->retention_raw_ns, out, st, err);
        name[tl] = 1;
        leveldb_iter_seek(it, name, tl + 1);
    }
    leveldb_iter_destroy(it);
    leveldb_release_snapshot(db, snap);
    leveldb_readoptions_destroy(ro);
    leveldb_close(db);
    leveldb_options_destroy(opts);
    if (rc) return rc;
    /* the proof: the store opens */
    cp_store *s = NULL;
    if ((rc = cp_store_open(opt, &s, err))) return rc;
    cp_store_close(s);
    return 0;
}
