/* The store's writer: batches of windows (duplicate detection per producer, interning into
 * the dictionaries, cumulative deltas), the open rollup buckets of every level and the
 * commit that writes them all in one synced LevelDB write.
 *
 * Locking: there is one writer thread (ingest's), the only one that changes the tables, so
 * it reads them without a lock. It takes s->lock for writing around what readers can see
 * change (a new tenant or series, the interning of a window into the dictionaries, a
 * series' span), and never takes s->dblock: cp_store_reopen runs on the writer's thread
 * too, between batches. The open buckets (s->buckets), the producer records and the
 * cumulative snapshots are the writer's alone. */
#include "store.h"
#include "store_int.h"
#include "check.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

typedef struct lazy_res {
    uint32_t sid, off, n;
} lazy_res;

struct cp_store_batch {
    cp_store *s;
    leveldb_writebatch_t *wb;
    uint32_t windows;
    CP_VEC(cp_ser *) dirty_series;
    CP_VEC(prod *) dirty_prods;
    cp_acc win, prev;
    cp_buf scratch, vbuf, kbuf;
    CP_VEC(uint32_t) locmap; /* profile location id -> dict location id */
    CP_VEC(uint32_t) stack;  /* one sample's dict locations */
    CP_VEC(cp_label) labels; /* one sample's labels, dict string ids */
    CP_VEC(uint32_t) strmap; /* profile string id -> dict string id (0 = not yet) */
    CP_VEC(uint32_t) fnmap, mapmap;
    CP_VEC(uint64_t) mapdelta; /* profile mapping id -> add to an address: canonical form */
    /* lazy samples (cp_store_batch_add_lazy), per sample: the stack the series' cache knows
     * (sid, 0 = not known), else where its decoded ids are in ids */
    CP_VEC(lazy_res) res;
    CP_VEC(uint32_t) ids;
    CP_VEC(uint64_t) hs; /* per sample: the hash of its ids' bytes, 0 = not looked up */
    CP_VEC(uint32_t) sids;
    CP_VEC(uint32_t) todo; /* the samples lazy_resolve left to profile_to_acc */
    /* stack id -> row + 1 of win that holds it: a sparse set, never cleared, a value
     * trusted only when win's row names that id (win_row); sized for the largest id seen */
    CP_VEC(uint32_t) rowof;
};
static void put_str(cp_buf *b, const char *s)
{
    size_t n = strlen(s);
    uint8_t tmp[10];
    uint8_t *e = cp_put_uv(tmp, n);
    cp_buf_append(b, tmp, (size_t)(e - tmp));
    cp_buf_append(b, s, n);
}

static void put_uv(cp_buf *b, uint64_t v)
{
    uint8_t tmp[10];
    uint8_t *e = cp_put_uv(tmp, v);
    cp_buf_append(b, tmp, (size_t)(e - tmp));
}

static int ser_encode(const cp_ser *s, cp_buf *b)
{
    b->len = 0;
    if (cp_buf_reserve(b, 256)) return CP_ENOMEM;
    put_uv(b, (uint64_t)s->kind);
    put_uv(b, s->labels.p.n);
    for (uint32_t i = 0; i < s->labels.p.n; i++) {
        put_str(b, s->labels.p.v[i].name);
        put_str(b, s->labels.p.v[i].value);
    }
    put_uv(b, s->ntypes);
    for (uint32_t i = 0; i < s->ntypes; i++) {
        put_str(b, s->type[i]);
        put_str(b, s->unit[i]);
    }
    put_str(b, s->period_type);
    put_str(b, s->period_unit);
    put_uv(b, cp_zz(s->period));
    put_uv(b, cp_zz(s->first_ns));
    put_uv(b, cp_zz(s->last_ns));
    put_uv(b, s->windows);
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Writer: open buckets
 * --------------------------------------------------------------------------------- */

static uint64_t bkt_hash(const cp_ser *ser, int level, int64_t start)
{
    return cp_hash_u64(cp_hash_u64((uint64_t)(uintptr_t)ser, (uint64_t)level), (uint64_t)start);
}

static void bslots_rebuild(cp_store *s)
{
    memset(s->bslots, 0, sizeof(uint32_t) * s->nbslots);
    for (uint32_t i = 0; i < s->buckets.n; i++) {
        bucket *b = s->buckets.v[i];
        uint32_t h = (uint32_t)bkt_hash(b->ser, b->level, b->start) & (s->nbslots - 1);
        while (s->bslots[h])
            h = (h + 1) & (s->nbslots - 1);
        s->bslots[h] = i + 1;
    }
}

/* The heap bytes an open bucket holds: its struct and arrays at their capacity, with
 * glibc's 16 bytes per allocation, and its two slots in s->buckets and s->bslots (at most
 * half full). What store.memory_budget counts. */
static size_t bucket_bytes(const bucket *b)
{
    const cp_acc *a = &b->acc;
    return sizeof *b + 16 + (a->ids.cap ? (size_t)a->ids.cap * 4 + 16 : 0) +
           (a->vals.cap ? (size_t)a->vals.cap * 8 + 16 : 0) +
           (a->nslots ? (size_t)a->nslots * 8 + 16 : 0) + 8 + 2 * 4;
}

/* Drops open buckets (all, or only the clean ones). */
void cp_buckets_drop(cp_store *s, int keep_dirty)
{
    if (!keep_dirty) s->dirty.n = 0;
    uint32_t w = 0;
    for (uint32_t i = 0; i < s->buckets.n; i++) {
        bucket *b = s->buckets.v[i];
        if (keep_dirty && b->dirty) {
            s->buckets.v[w++] = b;
            continue;
        }
        s->bucket_rows -= b->acc.ids.n;
        s->bucket_bytes -= bucket_bytes(b);
        cp_acc_close(&b->acc);
        free(b);
    }
    uint32_t dropped = s->buckets.n - w;
    s->buckets.n = w;
    CP_ASSERT(w || (s->bucket_bytes == 0 && s->bucket_rows == 0));
    /* nothing dropped, nothing to rebuild: retention calls this after every cut and every
     * series it forgets, mostly with the cache already empty */
    if (dropped && s->nbslots) bslots_rebuild(s);
}

/* Takes b (a level-0 bucket, committed) out of the cache: its slot by backward shift (the
 * probe runs of the others stay whole), its place in s->buckets by the last bucket. A
 * commit's cost is its own buckets', not the cache's. */
static void bucket_remove(cp_store *s, bucket *b)
{
    uint32_t mask = s->nbslots - 1;
    uint32_t i = (uint32_t)bkt_hash(b->ser, b->level, b->start) & mask;
    while (CP_ASSERT(s->bslots[i]), s->buckets.v[s->bslots[i] - 1] != b)
        i = (i + 1) & mask;
    uint32_t at = s->bslots[i] - 1;
    for (uint32_t j = i;;) {
        s->bslots[i] = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (!s->bslots[j]) goto shifted;
            bucket *c = s->buckets.v[s->bslots[j] - 1];
            uint32_t home = (uint32_t)bkt_hash(c->ser, c->level, c->start) & mask;
            /* c may fill the hole at i unless its home lies cyclically in (i, j] */
            if (i <= j ? home <= i || home > j : home <= i && home > j) break;
        }
        s->bslots[i] = s->bslots[j];
        i = j;
    }
shifted:;
    uint32_t last = s->buckets.n - 1;
    if (at != last) {
        bucket *m = s->buckets.v[last];
        uint32_t h = (uint32_t)bkt_hash(m->ser, m->level, m->start) & mask;
        while (s->bslots[h] != last + 1)
            h = (h + 1) & mask;
        s->bslots[h] = at + 1;
        s->buckets.v[at] = m;
    }
    s->buckets.n = last;
}

/* Marks b changed by this batch: 0, or CP_ENOMEM with err set. */
static int bucket_dirty(cp_store *s, bucket *b, cp_err *err)
{
    if (b->dirty) return 0;
    if (cp_vec_push(&s->dirty, b)) return cp_err_set(err, CP_ENOMEM, "store");
    b->dirty = 1;
    return 0;
}

static bucket *bucket_find(const cp_store *s, const cp_ser *ser, int level, int64_t start)
{
    if (!s->nbslots) return NULL;
    uint32_t h = (uint32_t)bkt_hash(ser, level, start) & (s->nbslots - 1);
    while (s->bslots[h]) {
        bucket *b = s->buckets.v[s->bslots[h] - 1];
        if (b->ser == ser && b->level == level && b->start == start) return b;
        h = (h + 1) & (s->nbslots - 1);
    }
    return NULL;
}

uint32_t cp_buckets_check(const cp_store *s)
{
    uint32_t used = 0;
    for (uint32_t h = 0; h < s->nbslots; h++)
        used += s->bslots[h] != 0;
    for (uint32_t i = 0; i < s->buckets.n; i++) {
        const bucket *b = s->buckets.v[i];
        if (bucket_find(s, b->ser, b->level, b->start) != b) return i + 1;
    }
    return used == s->buckets.n ? 0 : s->buckets.n + 1;
}

/* The open bucket (ser, level, start): cached, else read from disk when it may exist,
 * else new and empty. */
static int bucket_get(cp_store_batch *B, cp_ser *ser, int level, int64_t start, bucket **out,
                      cp_err *err)
{
    cp_store *s = B->s;
    if (start < ser->mt_floor[level]) ser->mt_floor[level] = start;
    bucket *b = bucket_find(s, ser, level, start);
    if (b) {
        *out = b;
        return 0;
    }
    if ((s->buckets.n + 1) * 2 > s->nbslots) {
        uint32_t n = s->nbslots ? s->nbslots * 2 : 1024;
        uint32_t *ns = calloc(n, sizeof *ns);
        if (!ns) return cp_err_set(err, CP_ENOMEM, "store: bucket cache");
        free(s->bslots);
        s->bslots = ns;
        s->nbslots = n;
        bslots_rebuild(s);
    }
    b = calloc(1, sizeof *b);
    if (!b || cp_vec_push(&s->buckets, b)) {
        free(b);
        return cp_err_set(err, CP_ENOMEM, "store: bucket cache");
    }
    b->ser = ser;
    b->level = level;
    b->start = start;
    cp_acc_init(&b->acc, ser->ntypes);
    uint32_t h = (uint32_t)bkt_hash(ser, level, start) & (s->nbslots - 1);
    while (s->bslots[h])
        h = (h + 1) & (s->nbslots - 1);
    s->bslots[h] = s->buckets.n;
    s->bucket_bytes += bucket_bytes(b);
    *out = b;
    /* may it exist on disk? only if a committed window started inside it */
    int64_t end = level ? start + cp_level_ns[level] : start + 1;
    if (ser->first_ns > ser->last_ns || end <= ser->first_ns || start > ser->last_ns) return 0;
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    size_t kl = key_block(k, ser, level, start);
    char *e = NULL;
    size_t vl;
    char *v = leveldb_get(s->db, s->ropts, (const char *)k, kl, &vl, &e);
    if (e) {
        int rc = cp_ldb_fail(s, err, e, "reading a block");
        leveldb_free(e);
        return rc;
    }
    if (!v) return 0;
    int rc = cp_block_load(&b->acc, (const uint8_t *)v, vl, &B->scratch, err);
    leveldb_free(v);
    if (rc == 0 && b->acc.ntypes != ser->ntypes)
        rc =
            cp_err_set(err, CP_ESTORE, "series %u of tenant %s: block with %u types, series has %u",
                       ser->id, ser->t->name, b->acc.ntypes, ser->ntypes);
    if (rc) cp_acc_reset(&b->acc, ser->ntypes); /* a damaged block is replaced */
    s->bucket_rows += b->acc.ids.n;
    s->bucket_bytes += bucket_bytes(b) - bucket_bytes(&(bucket){0});
    return rc == CP_ENOMEM ? rc : 0;
}

/* ---------------------------------------------------------------------------------
 * Writer: batches
 * --------------------------------------------------------------------------------- */

cp_store_batch *cp_store_batch_create(cp_store *s)
{
    cp_store_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->s = s;
    b->wb = leveldb_writebatch_create();
    cp_acc_init(&b->win, 0);
    cp_acc_init(&b->prev, 0);
    return b;
}

void cp_store_batch_destroy(cp_store_batch *b)
{
    if (!b) return;
    if (b->windows) {
        /* uncommitted changes live in the writer's caches: refuse further writes */
        b->s->broken = 1;
        cp_buckets_drop(b->s, 0);
    }
    for (uint32_t i = 0; i < b->dirty_series.n; i++)
        b->dirty_series.v[i]->staged = 0;
    leveldb_writebatch_destroy(b->wb);
    free(b->dirty_series.v);
    free(b->dirty_prods.v);
    cp_acc_close(&b->win);
    cp_acc_close(&b->prev);
    cp_buf_close(&b->scratch);
    cp_buf_close(&b->vbuf);
    cp_buf_close(&b->kbuf);
    free(b->locmap.v);
    free(b->stack.v);
    free(b->labels.v);
    free(b->strmap.v);
    free(b->fnmap.v);
    free(b->mapmap.v);
    free(b->mapdelta.v);
    free(b->res.v);
    free(b->ids.v);
    free(b->hs.v);
    free(b->sids.v);
    free(b->todo.v);
    free(b->rowof.v);
    free(b);
}

void cp_store_batch_reset(cp_store_batch *b)
{
    CP_ASSERT_THREAD(&b->s->writer, "writer thread only");
    if (b->windows) {
        b->s->broken = 1;
        cp_buckets_drop(b->s, 0);
    }
    for (uint32_t i = 0; i < b->dirty_series.n; i++)
        b->dirty_series.v[i]->staged = 0;
    leveldb_writebatch_clear(b->wb);
    b->windows = 0;
    b->dirty_series.n = 0;
    b->dirty_prods.n = 0;
}

uint32_t cp_store_batch_windows(const cp_store_batch *b)
{
    return b->windows;
}

int cp_store_batch_set_offset(cp_store_batch *b, const char *topic, int32_t partition,
                              int64_t next_offset)
{
    CP_ASSERT_THREAD(&b->s->writer, "writer thread only");
    CP_ASSERT(topic && partition >= 0 && next_offset >= 0);
    uint8_t k[300], v[8];
    size_t kl = key_offset(k, sizeof k, topic, partition);
    cp_put_be64(v, (uint64_t)next_offset);
    leveldb_writebatch_put(b->wb, (const char *)k, kl, (const char *)v, 8);
    return 0;
}

int cp_store_get_offset(cp_store *s, const char *topic, int32_t partition, int64_t *next_offset,
                        cp_err *err)
{
    uint8_t k[300];
    size_t kl = key_offset(k, sizeof k, topic, partition);
    char *e = NULL;
    size_t vl;
    if (!s->db) return cp_err_set(err, CP_ESTORE, "store %s is not open (reopen failed)", s->path);
    char *v = leveldb_get(s->db, s->ropts, (const char *)k, kl, &vl, &e);
    if (e) {
        char what[300];
        snprintf(what, sizeof what, "reading the offset of %.200s/%d", topic, partition);
        int rc = cp_ldb_fail(s, err, e, what);
        leveldb_free(e);
        return rc;
    }
    if (!v) return CP_ENOTFOUND;
    int rc = 0;
    if (vl != 8)
        rc = cp_err_set(err, CP_ESTORE, "store: offset record of %s/%d is corrupt", topic,
                        partition);
    else
        *next_offset = (int64_t)cp_get_be64((const uint8_t *)v);
    leveldb_free(v);
    return rc;
}

/* --- producers (duplicate detection) ----------------------------------------------- */

/* How many producer records a tenant keeps in memory: past it, after a commit, the clean
 * ones are freed and read again from LevelDB when next needed. contprof import names
 * each window a producer of its own (ingest/import.c), so the count follows the windows
 * imported, not the agents. */
#define PRODUCERS_CACHED 65536

static void prods_trim(tenant *t)
{
    if (t->prods.n <= PRODUCERS_CACHED) return;
    for (uint32_t i = 0; i < t->prods.cap; i++) {
        prod *p = t->prods.s[i].v;
        if (p && p->dirty) return; /* never while a batch holds one (commit clears them) */
    }
    for (uint32_t i = 0; i < t->prods.cap; i++) {
        prod *p = t->prods.s[i].v;
        if (p) {
            free(p->key);
            free(p);
        }
    }
    memset(t->prods.s, 0, t->prods.cap * sizeof *t->prods.s);
    t->prods.n = 0;
}

int cp_store_producer_last(cp_store *s, const char *tenant_name, const char *producer,
                           uint64_t *last, cp_err *err)
{
    CP_ASSERT_THREAD(&s->writer, "writer thread only");
    tenant *t = cp_tenant_find(s, tenant_name, strlen(tenant_name));
    size_t pl = strlen(producer);
    if (!t || pl > CP_STORE_PRODUCER_MAX) return CP_ENOTFOUND;
    uint8_t k[CP_TENANT_KEY_MAX + CP_STORE_PRODUCER_MAX + 16];
    size_t n = key_tenant(k, t, CP_K_PRODUCER);
    memcpy(k + n, producer, pl);
    k[n + pl] = 0; /* producer \0 be32 scope */
    size_t kl = n + pl + 1;
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    int found = 0;
    *last = 0;
    for (leveldb_iter_seek(it, (const char *)k, kl); leveldb_iter_valid(it);
         leveldb_iter_next(it)) {
        size_t l, vl;
        const char *key = leveldb_iter_key(it, &l);
        if (l != kl + 4 || memcmp(key, k, kl)) break;
        const char *v = leveldb_iter_value(it, &vl);
        cp_rd r = {(const uint8_t *)v, (const uint8_t *)v + vl, 0};
        uint64_t hwm = cp_get_uv(&r);
        if (r.bad) continue; /* a damaged record counts as none, as in prod_get */
        if (!found || hwm > *last) *last = hwm;
        found = 1;
    }
    char *e = NULL;
    leveldb_iter_get_error(it, &e);
    leveldb_iter_destroy(it);
    if (e) {
        int rc = cp_ldb_fail(s, err, e, "reading producer records");
        leveldb_free(e);
        return rc;
    }
    return found ? 0 : CP_ENOTFOUND;
}

static int prod_get(cp_store_batch *B, tenant *t, const char *producer, int32_t scope, prod **out,
                    cp_err *err)
{
    size_t pl = strlen(producer);
    char kbuf[600];
    if (pl > CP_STORE_PRODUCER_MAX) pl = CP_STORE_PRODUCER_MAX;
    memcpy(kbuf, producer, pl);
    kbuf[pl] = 0;
    cp_put_be32((uint8_t *)kbuf + pl + 1, (uint32_t)scope);
    size_t kl = pl + 5;
    prod *p = cp_strmap_get(&t->prods, kbuf, kl);
    if (p) {
        *out = p;
        return 0;
    }
    p = calloc(1, sizeof *p);
    if (!p || !(p->key = xstrndup(kbuf, kl)) || cp_strmap_put(&t->prods, p->key, kl, p)) {
        if (p) free(p->key);
        free(p);
        return cp_err_set(err, CP_ENOMEM, "store: producers");
    }
    p->keylen = kl;
    /* load the stored record */
    uint8_t k[CP_TENANT_KEY_MAX + 620];
    size_t n = key_tenant(k, t, CP_K_PRODUCER);
    memcpy(k + n, kbuf, kl);
    char *e = NULL;
    size_t vl;
    char *v = leveldb_get(B->s->db, B->s->ropts, (const char *)k, n + kl, &vl, &e);
    if (e) {
        int rc = cp_ldb_fail(B->s, err, e, "reading a producer record");
        leveldb_free(e);
        return rc;
    }
    if (v) {
        cp_rd r = {(const uint8_t *)v, (const uint8_t *)v + vl, 0};
        p->hwm = cp_get_uv(&r);
        for (int i = 0; i < 4; i++) {
            uint64_t w = 0;
            for (int j = 0; j < 8; j++) {
                if (r.p >= r.end)
                    r.bad = 1;
                else
                    w |= (uint64_t)*r.p++ << (8 * j);
            }
            p->bits[i] = w;
        }
        p->last_seen = cp_get_sv(&r);
        p->exists = !r.bad; /* a damaged record counts as none */
        leveldb_free(v);
    }
    *out = p;
    return 0;
}

static int prod_seen(const prod *p, uint64_t seq)
{
    if (!p->exists || seq > p->hwm) return 0;
    if (seq == p->hwm) return 1;
    uint64_t d = p->hwm - seq;
    if (d > 256) return 1; /* too far behind to tell: treated as already seen */
    return (int)((p->bits[(d - 1) / 64] >> ((d - 1) % 64)) & 1);
}

static void bits_shift(uint64_t *b, uint64_t n)
{
    if (n >= 256) {
        b[0] = b[1] = b[2] = b[3] = 0;
        return;
    }
    uint32_t w = (uint32_t)(n / 64), s = (uint32_t)(n % 64);
    for (int i = 3; i >= 0; i--) {
        uint64_t v = i - (int)w >= 0 ? b[i - w] << s : 0;
        if (s && i - (int)w - 1 >= 0) v |= b[i - w - 1] >> (64 - s);
        b[i] = v;
    }
}

static void prod_mark(prod *p, uint64_t seq, int64_t now)
{
    if (!p->exists) {
        p->exists = 1;
        p->hwm = seq;
        memset(p->bits, 0, sizeof p->bits);
    } else if (seq > p->hwm) {
        uint64_t n = seq - p->hwm;
        bits_shift(p->bits, n);
        if (n <= 256) p->bits[(n - 1) / 64] |= 1ULL << ((n - 1) % 64);
        p->hwm = seq;
    } else {
        uint64_t d = p->hwm - seq;
        if (d >= 1 && d <= 256) p->bits[(d - 1) / 64] |= 1ULL << ((d - 1) % 64);
    }
    if (now > p->last_seen) p->last_seen = now;
}

/* --- converting a profile to (stack id, values) ------------------------------------ */

static int map_str(cp_store_batch *B, cp_dict *d, const cp_profile *p, uint32_t sid, uint32_t *out)
{
    if (sid == 0 || sid >= B->strmap.n) {
        *out = 0;
        return 0;
    }
    if (!B->strmap.v[sid]) {
        const char *str = cp_profile_str(p, sid);
        uint32_t len = p->strs.off.n > sid + 1 ? p->strs.off.v[sid + 1] - p->strs.off.v[sid] - 1
                                               : (uint32_t)strlen(str);
        uint32_t id;
        if (cp_dict_string(d, str, len, &id)) return CP_ENOMEM;
        B->strmap.v[sid] = id + 1;
    }
    *out = B->strmap.v[sid] - 1;
    return 0;
}

static int vec_zero(void *vecp, size_t n)
{
    CP_VEC(uint32_t) *v = vecp;
    if (cp_vec_reserve(v, n)) return CP_ENOMEM;
    memset(v->v, 0, n * sizeof(uint32_t));
    v->n = (uint32_t)n;
    return 0;
}

/* Interns the stack in B->stack (dictionary locations) with sample sm's labels into d:
 * its id in *sid. Returns 0 or CP_ENOMEM (err set). */
static int intern_stack(cp_store_batch *B, cp_dict *d, const cp_profile *p, const cp_sample *sm,
                        uint32_t *sid, cp_err *err)
{
    B->labels.n = 0;
    for (uint32_t j = 0; j < sm->nlabels && sm->label_off + j < p->labels.n; j++) {
        cp_label lb = p->labels.v[sm->label_off + j];
        if (map_str(B, d, p, lb.key, &lb.key) || map_str(B, d, p, lb.str, &lb.str) ||
            map_str(B, d, p, lb.num_unit, &lb.num_unit))
            return cp_err_set(err, CP_ENOMEM, "store");
        B->labels.v[B->labels.n++] = lb;
    }
    if (cp_dict_stack(d, B->stack.v, B->stack.n, B->labels.v, B->labels.n, sid))
        return cp_err_set(err, CP_ENOMEM, "store: interning stacks");
    return 0;
}

/* Makes B->rowof hold stack id sid (zeroed past what it held). */
static int rowof_grow(cp_store_batch *B, uint32_t sid)
{
    size_t n = (size_t)sid + 1, was = B->rowof.n;
    if (n < (size_t)B->rowof.cap) n = B->rowof.cap;
    if (cp_vec_reserve(&B->rowof, n)) return CP_ENOMEM;
    memset(B->rowof.v + was, 0, (n - was) * sizeof *B->rowof.v);
    B->rowof.n = (uint32_t)n;
    return 0;
}

/* The row of stack sid in B->win (a zero row is added if missing; room for it is reserved),
 * NULL on out of memory. A window's rows are found through B->rowof, not a slot table: no
 * hashing, and nothing to clear per window (a window's table was 16 KB for 567 rows). */
static inline int64_t *win_row(cp_store_batch *B, uint32_t sid)
{
    cp_acc *w = &B->win;
    if (sid >= B->rowof.n && rowof_grow(B, sid)) return NULL;
    uint32_t r = B->rowof.v[sid];
    if (r && r <= w->ids.n && w->ids.v[r - 1] == sid)
        return w->vals.v + (size_t)(r - 1) * w->ntypes;
    int64_t *row = cp_acc_append_zero(w, sid);
    B->rowof.v[sid] = w->ids.n;
    return row;
}

/* Empties B->win for a window of nsamples samples of width ntypes into t: room for every
 * row, and B->rowof for every stack t has (a cumulative window's delta left win a slot
 * table: win_row does not keep one). */
static int win_begin(cp_store_batch *B, const tenant *t, uint32_t ntypes, uint32_t nsamples)
{
    cp_acc_reset(&B->win, ntypes);
    free(B->win.slots);
    B->win.slots = NULL;
    B->win.nslots = 0;
    if (cp_vec_reserve(&B->win.ids, nsamples) ||
        cp_vec_reserve(&B->win.vals, (size_t)nsamples * ntypes) ||
        (nsamples && B->rowof.n <= t->dict.stk.n && rowof_grow(B, t->dict.stk.n)))
        return CP_ENOMEM;
    return 0;
}

/* Resolves p's lazy samples before the batch changes: each is found in the series' stack
 * cache c (matched against p; NULL: none) or its ids are decoded and checked into B->ids.
 * B->win (scratch until apply_window) is begun here for a window of t of width ntypes, and
 * takes the samples the cache knows (mapped by colmap) on the way: one pass over them.
 * Returns 0, CP_ENOMEM, or CP_EPPROF naming a bad id. */
static int lazy_resolve(cp_store_batch *B, const tenant *t, const cp_profile *p,
                        const cp_pprof_lazy *lz, const cp_wcache *c, const int *colmap,
                        uint32_t ntypes, cp_err *err)
{
    uint32_t n = p->samples.n, nin = p->sample_types.n;
    B->res.n = B->ids.n = B->hs.n = B->sids.n = B->todo.n = 0;
    if (cp_vec_reserve(&B->res, n) || cp_vec_reserve(&B->hs, n) || cp_vec_reserve(&B->sids, n) ||
        cp_vec_reserve(&B->todo, n) || win_begin(B, t, ntypes, n))
        return cp_err_set(err, CP_ENOMEM, "store");
    /* the cache holds stacks without labels: a labelled sample (hash 0) is always decoded */
    for (uint32_t i = 0; i < n; i++) {
        const cp_pprof_ids *ids = &lz->ids.v[i];
        B->hs.v[i] = ids->p && p->samples.v[i].nlabels == 0 ? cp_wcache_hash(ids->p, ids->len) : 0;
    }
    cp_wcache_find_all(c, n, lz->ids.v, B->hs.v, B->sids.v);
    uint64_t hits = 0;
    int same2 = nin == 2 && colmap[0] == 0 && colmap[1] == 1; /* the common mapping */
    for (uint32_t i = 0; i < n; i++) {
        lazy_res *r = &B->res.v[i];
        const cp_pprof_ids *ids = &lz->ids.v[i];
        uint32_t sid = B->sids.v[i];
        *r = (lazy_res){sid, 0, 0};
        if (sid && ids->p) { /* its row now; profile_to_acc skips it */
            int64_t *row = win_row(B, sid);
            if (!row) return cp_err_set(err, CP_ENOMEM, "store");
            const int64_t *v = p->values.v + (size_t)i * nin;
            if (same2) {
                row[0] = cp_add_wrap(row[0], v[0]);
                row[1] = cp_add_wrap(row[1], v[1]);
            } else {
                for (uint32_t k = 0; k < nin; k++)
                    if (colmap[k] >= 0) row[colmap[k]] = cp_add_wrap(row[colmap[k]], v[k]);
            }
            hits++;
            continue;
        }
        B->todo.v[B->todo.n++] = i;
        if (!ids->p) continue;
        if (cp_vec_reserve(&B->ids, (size_t)B->ids.n + ids->len + 8))
            return cp_err_set(err, CP_ENOMEM, "store");
        uint32_t got;
        if (cp_pprof_lazy_ids(p, lz, i, B->ids.v + B->ids.n, &got, err)) return CP_EPPROF;
        r->off = B->ids.n;
        r->n = got;
        B->ids.n += got;
    }
    B->res.n = n;
    atomic_fetch_add(&B->s->wcache_hits, hits);
    atomic_fetch_add(&B->s->wcache_misses, lz->nlazy - hits);
    return 0;
}

/* Drops every series' stack cache (the budget is spent). Caller holds the write lock. */
static void wcache_flush(cp_store *s)
{
    for (uint32_t i = 0; i < s->tenants.n; i++) {
        tenant *t = s->tenants.v[i];
        for (uint32_t j = 0; j < t->series.n; j++) {
            if (!t->series.v[j]) continue; /* forgotten (none between retention passes) */
            cp_wcache_free(t->series.v[j]->wc);
            t->series.v[j]->wc = NULL;
        }
    }
    s->wcache_bytes = 0;
    atomic_fetch_add(&s->wcache_flushes, 1);
}

/* Interns p's stacks into t's dictionaries and sums its samples into B->win (width =
 * the series' types, mapped by colmap). With lazy ids (lz, resolved into B->res), the
 * first `cached` locations are known from ser's stack cache, which then follows p and
 * learns the stacks it did not know; B->win was begun by lazy_resolve (begun), and holds
 * the samples the cache knew already. Caller holds the write lock. */
static int profile_to_acc(cp_store_batch *B, tenant *t, cp_ser *ser, const cp_profile *p,
                          const cp_pprof_lazy *lz, uint32_t cached, const int *colmap,
                          uint32_t ntypes, int begun, cp_err *err)
{
    cp_dict *d = &t->dict;
    if (vec_zero(&B->strmap, p->strs.off.n) || vec_zero(&B->fnmap, p->functions.n + 1) ||
        vec_zero(&B->mapmap, p->mappings.n + 1) ||
        cp_vec_reserve(&B->locmap, (size_t)p->locations.n + 1) ||
        cp_vec_reserve(&B->mapdelta, (size_t)p->mappings.n + 1))
        return cp_err_set(err, CP_ENOMEM, "store");
    if (!begun && win_begin(B, t, ntypes, p->samples.n)) return cp_err_set(err, CP_ENOMEM, "store");
    CP_VEC(cp_line) lines = {0};
    int rc = 0;
    /* locmap: 0 (no location), the cached locations' ids, then zeroes for the rest (each set
     * below): only what the cache does not give is cleared */
    B->locmap.n = p->locations.n + 1;
    B->locmap.v[0] = 0;
    if (cached) memcpy(B->locmap.v + 1, cp_wcache_locmap(ser->wc), (size_t)cached * 4);
    memset(B->locmap.v + 1 + cached, 0, (size_t)(p->locations.n - cached) * 4);
    for (uint32_t i = cached; i < p->locations.n && !rc; i++) {
        const cp_location *l = &p->locations.v[i];
        cp_location nl = *l;
        nl.mapping_id = 0;
        if (l->mapping_id && l->mapping_id <= p->mappings.n) {
            /* frames are stored by object and file offset: an object's mapping in its
             * canonical form (profile.h), so every process of a binary shares its entries */
            uint32_t *mm = &B->mapmap.v[l->mapping_id];
            if (!*mm) {
                cp_mapping m = p->mappings.v[l->mapping_id - 1];
                const char *file = cp_profile_str(p, m.filename);
                const char *bid = cp_profile_str(p, m.build_id);
                B->mapdelta.v[l->mapping_id] =
                    cp_mapping_names_object(file, strlen(file), strlen(bid))
                        ? cp_mapping_canonicalize(&m)
                        : 0;
                if ((rc = map_str(B, d, p, m.filename, &m.filename)) ||
                    (rc = map_str(B, d, p, m.build_id, &m.build_id)) ||
                    (rc = cp_dict_mapping(d, &m, mm)))
                    break;
            }
            nl.mapping_id = *mm;
            if (nl.address) nl.address += B->mapdelta.v[l->mapping_id]; /* 0: none given */
        }
        if (cp_dict_location_known(d, p, l, nl.mapping_id, nl.address, B->strmap.v, B->fnmap.v,
                                   &B->locmap.v[i + 1]))
            continue;
        lines.n = 0;
        if (cp_vec_reserve(&lines, l->nlines ? l->nlines : 1)) {
            rc = CP_ENOMEM;
            break;
        }
        for (uint32_t j = 0; j < l->nlines && l->line_off + j < p->lines.n; j++) {
            cp_line ln = p->lines.v[l->line_off + j];
            uint32_t fid = ln.function_id;
            if (fid && fid <= p->functions.n) {
                if (!B->fnmap.v[fid]) {
                    cp_function f = p->functions.v[fid - 1];
                    if ((rc = map_str(B, d, p, f.name, &f.name)) ||
                        (rc = map_str(B, d, p, f.system_name, &f.system_name)) ||
                        (rc = map_str(B, d, p, f.filename, &f.filename)) ||
                        (rc = cp_dict_function(d, &f, &B->fnmap.v[fid])))
                        break;
                }
                ln.function_id = B->fnmap.v[fid];
            } else {
                ln.function_id = 0;
            }
            lines.v[lines.n++] = ln;
        }
        if (rc) break;
        nl.nlines = lines.n;
        rc = cp_dict_location(d, &nl, lines.v, &B->locmap.v[i + 1]);
    }
    free(lines.v);
    if (rc) return cp_err_set(err, rc, "store: interning locations");
    /* the series' cache follows p's tables (from scratch when they did not match) */
    size_t wc_before = cp_wcache_bytes(ser->wc);
    int lazy = lz && lz->nloc && B->s->wcache_budget > 0;
    if (lazy && cp_wcache_follow(&ser->wc, p, lz, B->locmap.v, cached > 0)) lazy = 0;
    uint32_t nin = p->sample_types.n;
    /* begun: only the samples lazy_resolve did not add (B->todo) */
    uint32_t nsm = begun ? B->todo.n : p->samples.n;
    for (uint32_t k = 0; k < nsm; k++) {
        uint32_t i = begun ? B->todo.v[k] : k;
        const cp_sample *sm = &p->samples.v[i];
        const int64_t *v = p->values.v + (size_t)i * nin;
        const lazy_res *lr =
            lz && lz->nlazy && i < B->res.n && lz->ids.v[i].p ? &B->res.v[i] : NULL;
        uint32_t sid;
        if (lr) { /* decoded by lazy_resolve: map and intern as below, then remember */
            if (cp_vec_reserve(&B->stack, lr->n + 1) || cp_vec_reserve(&B->labels, sm->nlabels + 1))
                return cp_err_set(err, CP_ENOMEM, "store");
            const uint32_t *src = B->ids.v + lr->off, *lm = B->locmap.v;
            uint32_t *dst = B->stack.v;
            for (uint32_t j = 0; j < lr->n; j++)
                dst[j] = lm[src[j]];
            B->stack.n = lr->n;
            if (intern_stack(B, d, p, sm, &sid, err)) return CP_ENOMEM;
            if (lazy && B->hs.v[i]) {
                const cp_pprof_ids *ids = &lz->ids.v[i];
                if (cp_wcache_put(ser->wc, ids->p, ids->len, B->hs.v[i], sid)) {
                    cp_wcache_free(ser->wc); /* out of memory: no cache, nothing lost */
                    ser->wc = NULL;
                    lazy = 0;
                }
            }
            goto add;
        }
        B->stack.n = 0;
        B->labels.n = 0;
        if (cp_vec_reserve(&B->stack, sm->nlocs + 1) || cp_vec_reserve(&B->labels, sm->nlabels + 1))
            return cp_err_set(err, CP_ENOMEM, "store");
        /* the hot loop (tens of thousands of ids per window): locals only, so nothing
         * is reloaded through the batch's pointers; an id out of range maps to 0 */
        uint32_t have = sm->loc_off >= p->stack.n              ? 0
                        : p->stack.n - sm->loc_off < sm->nlocs ? p->stack.n - sm->loc_off
                                                               : sm->nlocs;
        const uint32_t *src = p->stack.v + sm->loc_off, *lm = B->locmap.v;
        uint32_t *dst = B->stack.v, nloc = p->locations.n;
        for (uint32_t j = 0; j < have; j++) /* lm[0] is 0: ids out of range read it */
            dst[j] = lm[src[j] <= nloc ? src[j] : 0];
        for (uint32_t j = have; j < sm->nlocs; j++)
            dst[j] = 0;
        B->stack.n = sm->nlocs;
        if (intern_stack(B, d, p, sm, &sid, err)) return CP_ENOMEM;
    add:;
        int64_t *row = win_row(B, sid);
        if (!row) return cp_err_set(err, CP_ENOMEM, "store");
        for (uint32_t c = 0; c < nin; c++)
            if (colmap[c] >= 0) row[colmap[c]] = cp_add_wrap(row[colmap[c]], v[c]);
    }
    /* the budget counts every series' cache; spent, all are dropped and start again */
    B->s->wcache_bytes += cp_wcache_bytes(ser->wc);
    B->s->wcache_bytes -= wc_before < B->s->wcache_bytes ? wc_before : B->s->wcache_bytes;
    if (B->s->wcache_bytes > B->s->wcache_budget) wcache_flush(B->s);
    return 0;
}

/* --- series lookup/creation -------------------------------------------------------- */

static int ser_create(cp_store_batch *B, tenant *t, const cp_envelope *e, const cp_profile *p,
                      const cp_buf *ident, cp_ser **out, cp_err *err)
{
    cp_ser *s = calloc(1, sizeof *s);
    if (!s) return cp_err_set(err, CP_ENOMEM, "store: series");
    s->t = t;
    s->kind = e->kind;
    s->id = t->next_id;
    s->first_ns = INT64_MAX;
    s->last_ns = INT64_MIN;
    for (int l = 0; l < CP_NLEVELS; l++)
        s->mt_floor[l] = INT64_MAX; /* new: no block anywhere */
    int bad = cp_labels_copy(&s->labels, &e->labels) || cp_ser_types_alloc(s, p->sample_types.n);
    for (uint32_t i = 0; i < s->ntypes && !bad; i++) {
        const char *ty = cp_profile_str(p, p->sample_types.v[i].type);
        const char *un = cp_profile_str(p, p->sample_types.v[i].unit);
        s->type[i] = cp_tenant_word(t, ty, strlen(ty));
        s->unit[i] = cp_tenant_word(t, un, strlen(un));
        bad |= !s->type[i] || !s->unit[i];
    }
    const char *pt = cp_profile_str(p, p->period_type.type);
    const char *pu = cp_profile_str(p, p->period_type.unit);
    s->period_type = cp_tenant_word(t, pt, strlen(pt));
    s->period_unit = cp_tenant_word(t, pu, strlen(pu));
    s->period = p->period;
    s->keylen = ident->len;
    s->key = xstrndup((const char *)ident->data, ident->len);
    if (bad || !s->period_type || !s->period_unit || !s->key || cp_ser_add(t, s)) {
        cp_ser_free(s);
        return cp_err_set(err, CP_ENOMEM, "store: series");
    }
    /* label index */
    cp_buf *k = &B->kbuf;
    for (uint32_t i = 0; i < s->labels.p.n; i++) {
        k->len = 0;
        uint8_t pre[CP_TENANT_KEY_MAX + 2], id[4];
        size_t n = key_tenant(pre, t, CP_K_LABEL);
        cp_put_be32(id, s->id);
        if (cp_buf_append(k, pre, n) ||
            cp_buf_append(k, s->labels.p.v[i].name, strlen(s->labels.p.v[i].name) + 1) ||
            cp_buf_append(k, s->labels.p.v[i].value, strlen(s->labels.p.v[i].value) + 1) ||
            cp_buf_append(k, id, 4))
            return cp_err_set(err, CP_ENOMEM, "store: series");
        leveldb_writebatch_put(B->wb, (const char *)k->data, k->len, "", 0);
    }
    s->meta_dirty = 1;
    if (cp_vec_push(&B->dirty_series, s)) return cp_err_set(err, CP_ENOMEM, "store");
    *out = s;
    return 0;
}

int cp_name_valid(const char *s, size_t max)
{
    size_t n = 0;
    for (; s[n]; n++)
        if ((unsigned char)s[n] < 0x20 || s[n] == 0x7f) return 0;
    return n > 0 && n <= max;
}

/* --- applying a window to its buckets ---------------------------------------------- */

/* A series' windows reach levels 1-4 through two stages (cp_ser.stage, .stage10): a
 * window is added to the 1-minute stage; a minute's stage to its 1-minute bucket and to
 * the 10-minute stage; a 10-minute stage to its buckets at levels 2-4. A stage is added
 * when a window of another minute (10 minutes) comes, and at commit. So each window is
 * added to one small, cache-hot accumulator, a minute of windows to two, and only ten
 * minutes of them (or a batch's, if less) to the large day and hour buckets: about 1.5
 * adds of a minute's rows per minute where four were (one per level). */

/* dst (a bucket or a stage) += the stage src: rows, earliest start, window count. A
 * bucket (large, cold: its adds prefetch), when empty, takes the rows without a copy if
 * src will not be read again (take: a new 1- or 10-minute bucket; src is left empty). */
static int stage_into(cp_acc *dst, cp_acc *src, int bucket, int take)
{
    if (take && dst->windows == 0 && dst->ids.n == 0) {
        cp_acc_take(dst, src);
        return 0;
    }
    if (dst->windows == 0 || src->time_ns < dst->time_ns) dst->time_ns = src->time_ns;
    dst->windows += src->windows;
    return bucket ? cp_acc_add(dst, src, 1) : cp_acc_add_hot(dst, src);
}

/* stage10 into its buckets at levels 2-4, coarsest first (level 2's may take its rows). */
static int stage10_flush(cp_store_batch *B, cp_ser *ser, cp_err *err)
{
    if (!(ser->staged & CP_STAGED_10MIN)) return 0;
    for (int l = CP_NLEVELS - 1; l >= 2; l--) {
        bucket *b = NULL;
        int rc = bucket_get(B, ser, l, bucket_of(l, ser->stage10_start), &b, err);
        if (rc) return rc;
        size_t before = b->acc.ids.n, bytes = bucket_bytes(b);
        if (stage_into(&b->acc, &ser->stage10, 1, l == 2))
            return cp_err_set(err, CP_ENOMEM, "store");
        B->s->bucket_rows += b->acc.ids.n - before;
        B->s->bucket_bytes += bucket_bytes(b) - bytes;
        if ((rc = bucket_dirty(B->s, b, err))) return rc;
    }
    ser->staged &= ~CP_STAGED_10MIN;
    return 0;
}

/* The 1-minute stage into stage10 (flushed first if it holds another 10 minutes) and into
 * its 1-minute bucket (which, new, takes the rows). */
static int stage_flush(cp_store_batch *B, cp_ser *ser, cp_err *err)
{
    if (!(ser->staged & CP_STAGED_MIN)) return 0;
    int64_t ten = bucket_of(2, ser->stage_start);
    int rc;
    if ((ser->staged & CP_STAGED_10MIN) && ser->stage10_start != ten &&
        (rc = stage10_flush(B, ser, err)))
        return rc;
    if (!(ser->staged & CP_STAGED_10MIN)) {
        cp_acc_reset(&ser->stage10, ser->ntypes);
        ser->stage10_start = ten;
        ser->staged |= CP_STAGED_10MIN;
    }
    if (stage_into(&ser->stage10, &ser->stage, 0, 0)) return cp_err_set(err, CP_ENOMEM, "store");
    bucket *b = NULL;
    if ((rc = bucket_get(B, ser, 1, ser->stage_start, &b, err))) return rc;
    size_t before = b->acc.ids.n, bytes = bucket_bytes(b);
    if (stage_into(&b->acc, &ser->stage, 1, 1)) return cp_err_set(err, CP_ENOMEM, "store");
    B->s->bucket_rows += b->acc.ids.n - before;
    B->s->bucket_bytes += bucket_bytes(b) - bytes;
    if ((rc = bucket_dirty(B->s, b, err))) return rc;
    ser->staged &= ~CP_STAGED_MIN;
    return 0;
}

/* Adds B->win (a window of ser starting at start) to its buckets: level 0 (its own) now;
 * levels 1-4 through the series' stage for cpu and alloc, directly for inuse (a bucket
 * there is the latest snapshot, not a sum). */
static int apply_window(cp_store_batch *B, cp_ser *ser, int64_t start, cp_err *err)
{
    cp_acc *w = &B->win;
    w->time_ns = start;
    w->windows = 1;
    int top = CP_NLEVELS - 1;
    if (!cp_kind_is_gauge(ser->kind)) {
        int64_t minute = bucket_of(1, start);
        int rc;
        if ((ser->staged & CP_STAGED_MIN) && ser->stage_start != minute &&
            (rc = stage_flush(B, ser, err)))
            return rc;
        if (!(ser->staged & CP_STAGED_MIN)) {
            cp_acc_reset(&ser->stage, ser->ntypes);
            ser->stage.time_ns = start;
            ser->stage_start = minute;
            ser->staged |= CP_STAGED_MIN;
        }
        if (start < ser->stage.time_ns) ser->stage.time_ns = start;
        ser->stage.windows++;
        if (cp_acc_add_hot(&ser->stage, w)) return cp_err_set(err, CP_ENOMEM, "store");
        top = 0;
    }
    /* coarsest first: level 0, the window's own bucket, is usually new and then simply
     * takes B->win's rows (no copy; B->win has no slot table to clear); B->win is refilled next */
    for (int l = top; l >= 0; l--) {
        bucket *b = NULL;
        int rc = bucket_get(B, ser, l, bucket_of(l, start), &b, err);
        if (rc) return rc;
        size_t before = b->acc.ids.n, bytes = bucket_bytes(b);
        if (l == 0 && b->acc.windows == 0 && b->acc.ids.n == 0) {
            cp_acc_take(&b->acc, w);
        } else if (cp_kind_is_gauge(ser->kind)) {
            if (b->acc.windows == 0 || start >= b->acc.time_ns) {
                uint64_t nw = b->acc.windows + 1;
                if (cp_acc_copy(&b->acc, w)) return cp_err_set(err, CP_ENOMEM, "store");
                b->acc.windows = nw;
            } else {
                b->acc.windows++;
            }
        } else {
            if (b->acc.windows == 0 || start < b->acc.time_ns) b->acc.time_ns = start;
            b->acc.windows++;
            if (cp_acc_add(&b->acc, w, 1)) return cp_err_set(err, CP_ENOMEM, "store");
        }
        B->s->bucket_rows += b->acc.ids.n - before;
        B->s->bucket_bytes += bucket_bytes(b) - bytes;
        if ((rc = bucket_dirty(B->s, b, err))) return rc;
    }
    return 0;
}

/* Turns B->win (a cumulative input of ser from producer) into the delta from the previous
 * cumulative input of the same series and producer, and remembers it. */
static int cumulative_delta(cp_store_batch *B, cp_ser *ser, const char *producer, cp_err *err)
{
    cp_store *s = B->s;
    if (!ser->cum_valid || strcmp(ser->cum_producer, producer)) {
        free(ser->cum_producer);
        ser->cum_producer = xstrndup(producer, strlen(producer));
        if (!ser->cum_producer) return cp_err_set(err, CP_ENOMEM, "store");
        cp_acc_reset(&ser->cum, ser->ntypes);
        ser->cum_valid = 1;
        ser->cum_dirty = 0;
        cp_buf *k = &B->kbuf;
        k->len = 0;
        uint8_t pre[CP_TENANT_KEY_MAX + 8];
        size_t n = key_tenant(pre, ser->t, CP_K_CUMUL);
        cp_put_be32(pre + n, ser->id);
        if (cp_buf_append(k, pre, n + 4) || cp_buf_append(k, producer, strlen(producer)))
            return cp_err_set(err, CP_ENOMEM, "store");
        char *e = NULL;
        size_t vl;
        char *v = leveldb_get(s->db, s->ropts, (const char *)k->data, k->len, &vl, &e);
        if (e) {
            int rc = cp_ldb_fail(s, err, e, "reading a cumulative input");
            leveldb_free(e);
            ser->cum_valid = 0;
            return rc;
        }
        if (v) {
            int rc = cp_block_load(&ser->cum, (const uint8_t *)v, vl, &B->scratch, err);
            leveldb_free(v);
            if (rc || ser->cum.ntypes != ser->ntypes) cp_acc_reset(&ser->cum, ser->ntypes);
        }
    }
    /* prev = cum; cum = win; win = win - prev */
    if (cp_acc_copy(&B->prev, &ser->cum) || cp_acc_copy(&ser->cum, &B->win) ||
        cp_acc_add(&B->win, &B->prev, -1))
        return cp_err_set(err, CP_ENOMEM, "store");
    /* A counter since process start never goes down: a value that did is a new process
     * (a restart) or a snapshot older than the last, so the input starts a new stream and
     * counts in full; never a negative window (issue 36). */
    int reset = 0;
    for (size_t i = 0; i < B->win.vals.n && !reset; i++)
        reset = B->win.vals.v[i] < 0;
    if (reset) {
        if (cp_acc_copy(&B->win, &ser->cum)) return cp_err_set(err, CP_ENOMEM, "store");
        cp_log_info("store %s: cumulative stream %s of series %u went down: a new stream "
                    "(counted in full)",
                    s->path, producer, ser->id);
    }
    if (!ser->cum_dirty) {
        ser->cum_dirty = 1;
        int dup = 0;
        for (uint32_t i = 0; i < B->dirty_series.n; i++)
            dup |= B->dirty_series.v[i] == ser;
        if (!dup && cp_vec_push(&B->dirty_series, ser)) return cp_err_set(err, CP_ENOMEM, "store");
    }
    return 0;
}

/* A window of a capture's series: its record ('W', format.h) in the window's batch, so the
 * capture's answer counts each stored window exactly once. */
static int capture_window(cp_store_batch *B, cp_ser *ser, const cp_envelope *e, const cp_profile *p,
                          cp_err *err)
{
    uint64_t samples = 0;
    for (uint32_t i = 0; p->sample_types.n && i < p->samples.n; i++) {
        int64_t v = cp_profile_sample_values(p, i)[0];
        if (v > 0) samples += (uint64_t)v;
    }
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    size_t n = key_tenant(k, ser->t, CP_K_CAPWIN);
    cp_put_be32(k + n, ser->id);
    cp_put_be64(k + n + 4, cp_time_key(e->window_start_ns));
    const char *engine = e->engine ? e->engine : "";
    B->vbuf.len = 0;
    /* reserved whole, so the puts below cannot fail */
    if (cp_buf_reserve(&B->vbuf, strlen(engine) + 40))
        return cp_err_set(err, CP_ENOMEM, "store: capture window");
    put_uv(&B->vbuf, cp_zz(e->window_duration_ns));
    put_uv(&B->vbuf, samples);
    put_str(&B->vbuf, engine);
    leveldb_writebatch_put(B->wb, (const char *)k, n + 12, (const char *)B->vbuf.data, B->vbuf.len);
    return 0;
}

int cp_store_batch_add(cp_store_batch *B, const cp_envelope *e, const cp_profile *p,
                       int32_t dedup_scope, cp_err *err)
{
    /* without lz nothing writes to p */
    return cp_store_batch_add_lazy(B, e, (cp_profile *)(uintptr_t)p, NULL, dedup_scope, err);
}

int cp_store_batch_add_lazy(cp_store_batch *B, const cp_envelope *e, cp_profile *p,
                            cp_pprof_lazy *lz, int32_t dedup_scope, cp_err *err)
{
    cp_store *s = B->s;
    CP_ASSERT_THREAD(&s->writer, "writer thread only");
    CP_ASSERT(e && p);
    if (s->broken)
        return cp_err_set(err, CP_ESTORE, "store %s: an earlier write failed; reopen the store",
                          s->path);
    /* --- checks that leave everything unchanged --- */
    if (!e->tenant || !cp_name_valid(e->tenant, CP_TENANT_KEY_MAX))
        return cp_err_set(err, CP_EINVAL, "envelope: tenant must be 1..%d printable bytes",
                          CP_TENANT_KEY_MAX);
    if (!cp_kind_name((int)e->kind))
        return cp_err_set(err, CP_EINVAL, "envelope: unknown kind %d", (int)e->kind);
    if (e->window_start_ns <= -TIME_LIMIT || e->window_start_ns >= TIME_LIMIT)
        return cp_err_set(err, CP_EINVAL, "envelope: window_start_ns %lld out of range",
                          (long long)e->window_start_ns);
    if (!e->producer_id || strlen(e->producer_id) > CP_STORE_PRODUCER_MAX)
        return cp_err_set(err, CP_EINVAL, "envelope: producer_id missing or over %d bytes",
                          CP_STORE_PRODUCER_MAX);
    if (p->sample_types.n == 0 || p->sample_types.n > CP_MAX_TYPES)
        return cp_err_set(err, CP_ELIMIT, "profile: %u sample types (1..%d allowed)",
                          p->sample_types.n, CP_MAX_TYPES);
    for (uint32_t i = 0; i < e->labels.p.n; i++)
        if (!cp_name_valid(e->labels.p.v[i].name, CP_LABEL_NAME_MAX) ||
            strlen(e->labels.p.v[i].value) > CP_LABEL_VALUE_MAX)
            return cp_err_set(err, CP_EINVAL, "envelope: label %u has a bad name or value", i);
    if (e->cumulative && cp_kind_is_gauge(e->kind))
        return cp_err_set(err, CP_EINVAL, "envelope: cumulative is meaningless for %s, a gauge",
                          cp_kind_name(e->kind));

    size_t tl = strlen(e->tenant);
    tenant *t = cp_tenant_find(s, e->tenant, tl);
    if (!t) {
        pthread_rwlock_wrlock(&s->lock);
        t = cp_tenant_add(s, e->tenant, tl);
        pthread_rwlock_unlock(&s->lock);
        if (!t) return cp_err_set(err, CP_ENOMEM, "store: tenant");
    }
    prod *pr = NULL;
    int rc = prod_get(B, t, e->producer_id, dedup_scope, &pr, err);
    if (rc) return rc;
    if (prod_seen(pr, e->sequence)) return CP_STORE_DUPLICATE;

    if ((rc = cp_ser_identity(e->kind, &e->labels, &B->kbuf))) return cp_err_set(err, rc, "store");
    cp_ser *ser = cp_strmap_get(&t->by_key, (const char *)B->kbuf.data, B->kbuf.len);
    int colmap[CP_MAX_TYPES];
    if (ser) {
        /* map the input's types onto the series' types by name */
        for (uint32_t c = 0; c < p->sample_types.n; c++) {
            const char *ty = cp_profile_str(p, p->sample_types.v[c].type);
            const char *un = cp_profile_str(p, p->sample_types.v[c].unit);
            colmap[c] = -1;
            for (uint32_t j = 0; j < ser->ntypes; j++)
                if (!strcmp(ser->type[j], ty) && !strcmp(ser->unit[j], un)) colmap[c] = (int)j;
            if (colmap[c] < 0)
                return cp_err_set(
                    err, CP_EINCOMPAT,
                    "profile: sample type %s/%s is not one of series %u's types (first is %s/%s)",
                    ty, un, ser->id, ser->type[0], ser->unit[0]);
        }
    } else {
        for (uint32_t c = 0; c < p->sample_types.n; c++)
            colmap[c] = (int)c;
    }

    /* lazy ids: found in the series' stack cache, or decoded and checked now, while a bad
     * one still leaves everything unchanged */
    uint32_t cached = 0;
    if (lz && lz->nloc) { /* parsed here, after the ones the series' cache knows */
        if (ser) cached = cp_wcache_match(ser->wc, p, lz);
        if ((rc = cp_pprof_lazy_locations(p, lz, cached, cached ? cp_wcache_locbytes(ser->wc) : 0,
                                          err)))
            return rc;
        if (!lz->nloc) cached = 0; /* decoded in full after all (model/pprof.h) */
    }
    int begun = lz && lz->nlazy;
    if (begun && (rc = lazy_resolve(B, t, p, lz, cached ? ser->wc : NULL, colmap,
                                    ser ? ser->ntypes : p->sample_types.n, err)))
        return rc;

    /* --- from here on the batch changes --- */
    pthread_rwlock_wrlock(&s->lock);
    t->dict.wb = B->wb;
    if (!ser) {
        cp_buf ident = {0};
        rc = cp_buf_append(&ident, B->kbuf.data, B->kbuf.len);
        if (!rc)
            rc = ser_create(B, t, e, p, &ident, &ser, err);
        else
            cp_err_set(err, rc, "store");
        cp_buf_close(&ident);
    }
    if (!rc) rc = profile_to_acc(B, t, ser, p, lz, cached, colmap, ser->ntypes, begun, err);
    t->dict.wb = NULL;
    pthread_rwlock_unlock(&s->lock);
    if (rc) goto broken;

    if (e->cumulative) {
        /* the cumulative stream: the producer id up to its first '#' (store.h) */
        char stream[CP_STORE_PRODUCER_MAX + 1];
        snprintf(stream, sizeof stream, "%.*s", (int)strcspn(e->producer_id, "#"), e->producer_id);
        if ((rc = cumulative_delta(B, ser, stream, err))) goto broken;
    }
    if ((rc = apply_window(B, ser, e->window_start_ns, err))) goto broken;
    if (cp_labels_get(&e->labels, CP_CAPTURE_LABEL) && (rc = capture_window(B, ser, e, p, err)))
        goto broken;

    pthread_rwlock_wrlock(&s->lock);
    if (e->window_start_ns < ser->first_ns) ser->first_ns = e->window_start_ns;
    if (e->window_start_ns > ser->last_ns) ser->last_ns = e->window_start_ns;
    if (p->period > ser->period) ser->period = p->period;
    ser->windows++;
    pthread_rwlock_unlock(&s->lock);
    if (!ser->meta_dirty) {
        ser->meta_dirty = 1;
        int dup = 0;
        for (uint32_t i = 0; i < B->dirty_series.n; i++)
            dup |= B->dirty_series.v[i] == ser;
        if (!dup && cp_vec_push(&B->dirty_series, ser)) {
            rc = cp_err_set(err, CP_ENOMEM, "store");
            goto broken;
        }
    }
    prod_mark(pr, e->sequence, e->window_start_ns);
    if (!pr->dirty) {
        pr->dirty = 1;
        if (cp_vec_push(&B->dirty_prods, pr)) {
            rc = cp_err_set(err, CP_ENOMEM, "store");
            goto broken;
        }
    }
    B->windows++;
    return 0;
broken:
    /* a failure half-way through leaves caches ahead of the batch: no more writes */
    s->broken = 1;
    return rc;
}

int cp_store_batch_commit(cp_store_batch *B, cp_err *err)
{
    cp_store *s = B->s;
    CP_ASSERT_THREAD(&s->writer, "writer thread only");
    int rc = 0;
    cp_block_enc enc = {0}; /* for this commit's blocks; its buffers are per commit */
    if (s->broken) {
        rc = cp_err_set(err, CP_ESTORE, "store %s: an earlier write failed; reopen the store",
                        s->path);
        goto out;
    }
    uint8_t k[CP_TENANT_KEY_MAX + 640];
    /* the staged windows into their rollups (every series with a window is dirty); a stage
     * holds up to a minute of a series' stacks, so its memory is given back once per batch
     * rather than kept for every series the store has seen */
    for (uint32_t i = 0; i < B->dirty_series.n; i++) {
        cp_ser *ser = B->dirty_series.v[i];
        if ((rc = stage_flush(B, ser, err)) || (rc = stage10_flush(B, ser, err))) goto fail;
        cp_acc_close(&ser->stage);
        cp_acc_close(&ser->stage10);
    }
    /* buckets */
    for (uint32_t i = 0; i < s->dirty.n; i++) {
        bucket *b = s->dirty.v[i];
        B->vbuf.len = 0;
        if ((rc = cp_block_encode_with(&enc, &b->acc, &B->vbuf))) goto fail;
        size_t kl = key_block(k, b->ser, b->level, b->start);
        leveldb_writebatch_put(B->wb, (const char *)k, kl, (const char *)B->vbuf.data, B->vbuf.len);
    }
    /* series records and cumulative inputs */
    for (uint32_t i = 0; i < B->dirty_series.n; i++) {
        cp_ser *ser = B->dirty_series.v[i];
        if (ser->meta_dirty) {
            pthread_rwlock_rdlock(&s->lock);
            rc = ser_encode(ser, &B->vbuf);
            pthread_rwlock_unlock(&s->lock);
            if (rc) goto fail;
            size_t kl = key_series(k, ser);
            leveldb_writebatch_put(B->wb, (const char *)k, kl, (const char *)B->vbuf.data,
                                   B->vbuf.len);
        }
        if (ser->cum_dirty) {
            B->vbuf.len = 0;
            if ((rc = cp_block_encode_with(&enc, &ser->cum, &B->vbuf))) goto fail;
            size_t n = key_tenant(k, ser->t, CP_K_CUMUL);
            cp_put_be32(k + n, ser->id);
            size_t pl = strlen(ser->cum_producer);
            if (pl > CP_STORE_PRODUCER_MAX) pl = CP_STORE_PRODUCER_MAX;
            memcpy(k + n + 4, ser->cum_producer, pl);
            leveldb_writebatch_put(B->wb, (const char *)k, n + 4 + pl, (const char *)B->vbuf.data,
                                   B->vbuf.len);
        }
    }
    /* producers */
    for (uint32_t i = 0; i < B->dirty_prods.n; i++) {
        prod *p = B->dirty_prods.v[i];
        tenant *t = NULL;
        for (uint32_t j = 0; j < s->tenants.n && !t; j++)
            if (cp_strmap_get(&s->tenants.v[j]->prods, p->key, p->keylen) == p) t = s->tenants.v[j];
        if (!t) continue;
        size_t n = key_tenant(k, t, CP_K_PRODUCER);
        memcpy(k + n, p->key, p->keylen);
        uint8_t v[64], *q = v;
        q = cp_put_uv(q, p->hwm);
        for (int w = 0; w < 4; w++)
            for (int j = 0; j < 8; j++)
                *q++ = (uint8_t)(p->bits[w] >> (8 * j));
        q = cp_put_uv(q, cp_zz(p->last_seen));
        leveldb_writebatch_put(B->wb, (const char *)k, n + p->keylen, (const char *)v,
                               (size_t)(q - v));
    }
    char *e = NULL;
    leveldb_write(s->db, s->wsync, B->wb, &e);
    if (e) {
        rc = cp_err_set(err, CP_ESTORE, "store %s: synced write of %u windows failed: %s", s->path,
                        B->windows, e);
        leveldb_free(e);
        goto fail;
    }
    atomic_fetch_add(&s->windows, B->windows);
    for (uint32_t i = 0; i < s->dirty.n; i++)
        s->dirty.v[i]->dirty = 0;
    for (uint32_t i = 0; i < B->dirty_series.n; i++)
        B->dirty_series.v[i]->meta_dirty = B->dirty_series.v[i]->cum_dirty = 0;
    for (uint32_t i = 0; i < B->dirty_prods.n; i++)
        B->dirty_prods.v[i]->dirty = 0;
    B->dirty_prods.n = 0;
    for (uint32_t i = 0; i < s->tenants.n; i++)
        prods_trim(s->tenants.v[i]);
    /* keep the cache bounded: raw windows rarely come back; rollups do */
    if (s->bucket_rows > s->bucket_rows_max || s->bucket_bytes > s->bucket_bytes_max) {
        cp_buckets_drop(s, 0);
        atomic_fetch_add(&s->bucket_drops, 1);
#ifdef __GLIBC__
        malloc_trim(0); /* give the freed buckets back: the budget is about resident bytes */
#endif
    } else {
        /* level 0 (a window's own bucket) is never written twice: every one is in this
         * commit's dirty list */
        for (uint32_t i = 0; i < s->dirty.n; i++) {
            bucket *b = s->dirty.v[i];
            if (b->level) continue;
            bucket_remove(s, b);
            s->bucket_rows -= b->acc.ids.n;
            s->bucket_bytes -= bucket_bytes(b);
            cp_acc_close(&b->acc);
            free(b);
        }
    }
    s->dirty.n = 0;
    goto out;
fail:
    s->broken = 1;
    cp_buckets_drop(s, 0);
    for (uint32_t i = 0; i < B->dirty_series.n; i++)
        B->dirty_series.v[i]->staged = 0;
out:
    cp_block_enc_close(&enc);
    leveldb_writebatch_clear(B->wb);
    B->windows = 0;
    B->dirty_series.n = 0;
    B->dirty_prods.n = 0;
    return rc;
}
