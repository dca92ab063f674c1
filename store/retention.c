/* The store's retention: deletes the blocks of each level older than its retention, a
 * bounded number per call, and compacts the range so the disk space is given back; forgets
 * the series left with nothing.
 *
 * Locking: cp_store_maintain runs on the writer's thread between batches (it drops the
 * writer's clean buckets); it reads the tables without a lock like the writer, and takes
 * s->lock for writing to narrow a series' span once its level-0 blocks are gone and to take
 * a forgotten series out of the tables; s->dblock for writing only to free those (tried,
 * and waited for past s->forgotten_wait of them). */
#include "store.h"
#include "store_int.h"
#include "check.h"
#include "log.h"

#include <string.h>

#include "capture.h"

/* ---------------------------------------------------------------------------------
 * Retention
 * --------------------------------------------------------------------------------- */

/* The level whose retention reaches furthest back (its windows are the last to go
 * entirely), or -1 when some level keeps everything. A series' first window moves only
 * when that level is cut: a rollup still answers for windows that level 0 dropped. */
static int keeps_longest(const cp_store *s)
{
    int best = -1;
    for (int l = 0; l < CP_NLEVELS; l++) {
        if (s->retention[l] <= 0) return -1;
        if (best < 0 || s->retention[l] + cp_level_ns[l] > s->retention[best] + cp_level_ns[best])
            best = l;
    }
    return best;
}

/* How far back the store answers at now_ns: the start of the oldest window the longest-kept
 * level may still hold, or INT64_MIN when some level keeps everything. */
static int64_t oldest_kept(const cp_store *s, int64_t now_ns)
{
    int l = keeps_longest(s);
    return l < 0 ? INT64_MIN : now_ns - s->retention[l] - cp_level_ns[l];
}

/* A capture series' window records ('W', format.h) that start before cut, into wb. */
static uint32_t drop_capture_windows(const cp_store *s, const cp_ser *ser, int64_t cut,
                                     leveldb_writebatch_t *wb)
{
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    size_t n = key_tenant(k, ser->t, CP_K_CAPWIN);
    cp_put_be32(k + n, ser->id);
    n += 4;
    uint32_t gone = 0;
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    for (leveldb_iter_seek(it, (const char *)k, n); leveldb_iter_valid(it); leveldb_iter_next(it)) {
        size_t kl;
        const uint8_t *key = (const uint8_t *)leveldb_iter_key(it, &kl);
        if (kl != n + 8 || memcmp(key, k, n) || cp_time_unkey(cp_get_be64(key + n)) >= cut) break;
        leveldb_writebatch_delete(wb, (const char *)key, kl);
        gone++;
    }
    leveldb_iter_destroy(it);
    return gone;
}

/* Capture records ('K') of captures that ended before cut: their windows are gone, so
 * GET /api/v1/captures/ID answers 404 and a restart no longer re-publishes them. One pass
 * a minute at most (one record a capture: few). Returns the count deleted, or -1. */
static int drop_capture_records(cp_store *s, int64_t now_ns, int64_t cut, cp_err *err)
{
    if (cut == INT64_MIN || now_ns - s->mt_capture_ns < 60 * 1000000000LL) return 0;
    s->mt_capture_ns = now_ns;
    const uint8_t pre[2] = {0, CP_K_CAPTURE};
    int gone = 0;
    leveldb_writebatch_t *wb = leveldb_writebatch_create();
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    for (leveldb_iter_seek(it, (const char *)pre, 2); leveldb_iter_valid(it);
         leveldb_iter_next(it)) {
        size_t kl, vl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl < 2 || memcmp(key, pre, 2)) break;
        const char *v = leveldb_iter_value(it, &vl);
        cp_capture c;
        cp_err e = {0};
        if (cp_capture_decode((const uint8_t *)v, vl, &c, &e)) continue; /* readers warn */
        if (c.end_ns < cut) {
            leveldb_writebatch_delete(wb, key, kl);
            gone++;
        }
        cp_capture_close(&c);
    }
    leveldb_iter_destroy(it);
    char *e = NULL;
    if (gone) leveldb_write(s->db, s->wnosync, wb, &e);
    leveldb_writebatch_destroy(wb);
    if (e) {
        cp_err_set(err, CP_ESTORE, "store: retention of capture records failed: %s", e);
        leveldb_free(e);
        return -1;
    }
    if (gone) {
        atomic_fetch_add(&s->capture_gen, 1);
        cp_log_info("store %s: retention removed %d capture records", s->path, gone);
    }
    return gone;
}

/* Writes and clears wb: 0, or CP_ESTORE with err set. */
static int write_deletes(cp_store *s, leveldb_writebatch_t *wb, cp_err *err)
{
    char *e = NULL;
    leveldb_write(s->db, s->wnosync, wb, &e);
    leveldb_writebatch_clear(wb);
    if (!e) return 0;
    cp_err_set(err, CP_ESTORE, "store: retention delete failed: %s", e);
    leveldb_free(e);
    return CP_ESTORE;
}

/* ---------------------------------------------------------------------------------
 * Forgetting series
 *
 * A host's short processes make a series each (`instance` is host:pid): kept forever, the
 * series table grew with every process ever profiled (~840 bytes each). A series whose
 * windows are all past every level's retention answers nothing any more; it is forgotten:
 * its keys go in one write, then it leaves the tables. A later window with its labels
 * makes a new series under a new id (ids only grow while the store is open; one freed at
 * the top may be taken again after a restart, its keys all gone). Queries may hold the
 * series (they read blocks without s->lock, under s->dblock): it is freed once none runs.
 * --------------------------------------------------------------------------------- */

/* Every level keeps windows for a while, ser has none left in its span, and no level holds
 * a block of it: nothing of it answers a query any more. */
static int forgettable(const cp_store *s, const cp_ser *ser)
{
    if (ser->first_ns <= ser->last_ns || keeps_longest(s) < 0) return 0;
    for (int l = 0; l < CP_NLEVELS; l++)
        if (ser->mt_floor[l] != INT64_MAX) return 0;
    return 1;
}

/* Deletes, into wb, the keys of type whose next bytes are ser's id. */
static void drop_series_keys(const cp_store *s, const cp_ser *ser, uint8_t type,
                             leveldb_writebatch_t *wb)
{
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    size_t n = key_tenant(k, ser->t, type);
    memcpy(k + n, ser->idkey, 4);
    n += 4;
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    for (leveldb_iter_seek(it, (const char *)k, n); leveldb_iter_valid(it); leveldb_iter_next(it)) {
        size_t kl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl < n || memcmp(key, k, n)) break;
        leveldb_writebatch_delete(wb, key, kl);
    }
    leveldb_iter_destroy(it);
}

/* Removes ser (forgettable, of t) from the disk and then from the tables (its place left
 * NULL until series_close_up); the retention cursor goes on with the next series. Between
 * batches only (every open bucket is clean). 0, CP_ENOMEM or CP_ESTORE. */
static int forget_series(cp_store *s, tenant *t, cp_ser *ser, leveldb_writebatch_t *wb, cp_err *err)
{
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    cp_buf lk = {0};
    int rc = cp_vec_reserve(&s->forgotten, (size_t)s->forgotten.n + 1) ? CP_ENOMEM : 0;
    size_t n = key_tenant(k, t, CP_K_LABEL);
    for (uint32_t i = 0; i < ser->labels.p.n && !rc; i++) {
        const cp_label_pair *lp = &ser->labels.p.v[i];
        lk.len = 0;
        if (cp_buf_append(&lk, k, n) || cp_buf_append(&lk, lp->name, strlen(lp->name) + 1) ||
            cp_buf_append(&lk, lp->value, strlen(lp->value) + 1) ||
            cp_buf_append(&lk, ser->idkey, 4))
            rc = CP_ENOMEM;
        else
            leveldb_writebatch_delete(wb, (const char *)lk.data, lk.len);
    }
    cp_buf_close(&lk);
    if (rc) {
        leveldb_writebatch_clear(wb);
        return cp_err_set(err, rc, "store: forgetting a series");
    }
    leveldb_writebatch_delete(wb, (const char *)k, key_series(k, ser));
    drop_series_keys(s, ser, CP_K_CUMUL, wb);
    drop_series_keys(s, ser, CP_K_CAPWIN, wb);
    drop_series_keys(s, ser, CP_K_BLOCK, wb); /* none, by the floors; a seek to be sure */
    if ((rc = write_deletes(s, wb, err))) return rc;
    cp_buckets_drop(s, 1); /* no open bucket points at ser any more */
    pthread_rwlock_wrlock(&s->lock);
    cp_strmap_del(&t->by_key, ser->key, ser->keylen);
    cp_strmap_del(&t->by_id, (const char *)ser->idkey, 4);
    t->series.v[ser->pos] = NULL; /* closed up at the end of the pass (series_close_up) */
    t->holes++;
    size_t wc = cp_wcache_bytes(ser->wc);
    s->wcache_bytes -= wc < s->wcache_bytes ? wc : s->wcache_bytes;
    pthread_rwlock_unlock(&s->lock);
    cp_wcache_free(ser->wc);
    ser->wc = NULL;
    s->forgotten.v[s->forgotten.n++] = ser;
    if (s->mt_series == ser->pos) s->mt_series++, s->mt_level = 0; /* on with the next */
    atomic_fetch_add(&s->series_forgotten, 1);
    return 0;
}

/* Takes the places of the series forgotten this pass out of every tenant's table, keeping
 * the order: the cursor walks series in id order, so the tombstones of those it cut lie
 * behind it, never in the way of a seek or a scan past a series' last key (LevelDB steps
 * over each; walked from the end, a cut crossed every tombstone of the ones before). */
static void series_close_up(cp_store *s)
{
    for (uint32_t k = 0; k < s->tenants.n; k++) {
        tenant *t = s->tenants.v[k];
        if (!t->holes) continue;
        pthread_rwlock_wrlock(&s->lock);
        uint32_t w = 0, cursor = s->mt_series;
        for (uint32_t i = 0; i < t->series.n; i++) {
            if (k == s->mt_tenant && i == s->mt_series) cursor = w;
            if (!t->series.v[i]) continue;
            t->series.v[i]->pos = w;
            t->series.v[w++] = t->series.v[i];
        }
        if (k == s->mt_tenant && s->mt_series >= t->series.n) cursor = w;
        if (k == s->mt_tenant) s->mt_series = cursor;
        t->series.n = w;
        t->holes = 0;
        pthread_rwlock_unlock(&s->lock);
    }
}

/* ---------------------------------------------------------------------------------
 * Producer records
 *
 * A producer record ('P') is one producer's duplicate check, and every process is a
 * producer: kept for ever, they grew on disk with every process ever profiled. A record
 * whose last window started before every level's cut goes: a copy of anything that
 * producer sent would start no later, so past retention too. A pass reads at most
 * s->prod_scan records, from a cursor that goes round every tenant's.
 * --------------------------------------------------------------------------------- */

/* The last window start a producer record holds; INT64_MAX when it cannot be read (kept). */
static int64_t prod_last_seen(const char *v, size_t vl)
{
    cp_rd r = {(const uint8_t *)v, (const uint8_t *)v + vl, 0};
    cp_get_uv(&r); /* high-water sequence */
    if (r.bad || r.end - r.p < 32) return INT64_MAX;
    r.p += 32; /* the bitmap */
    int64_t last = cp_get_sv(&r);
    return r.bad ? INT64_MAX : last;
}

/* Takes the record of key (in t, of type 'P', n bytes of prefix) out of the writer's cache. */
static void prod_forget(tenant *t, const char *key, size_t kl, size_t n)
{
    prod *p = cp_strmap_get(&t->prods, key + n, kl - n);
    if (!p || p->dirty) return; /* none between batches; a dirty one is written again */
    cp_strmap_del(&t->prods, key + n, kl - n);
    free(p->key);
    free(p);
}

/* Deletes up to s->prod_scan records' worth of stale producer records; the count in *gone. */
static int drop_producers(cp_store *s, int64_t cut, uint32_t *gone, cp_err *err)
{
    *gone = 0;
    if (cut == INT64_MIN) return 0;
    uint32_t read = 0, tenants = 0;
    leveldb_writebatch_t *wb = leveldb_writebatch_create();
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    while (read < s->prod_scan && tenants++ <= s->tenants.n) {
        if (s->mt_prod_tenant >= s->tenants.n) s->mt_prod_tenant = 0, s->mt_prod.len = 0;
        if (!s->tenants.n) break;
        tenant *t = s->tenants.v[s->mt_prod_tenant];
        uint8_t pre[CP_TENANT_KEY_MAX + 2];
        size_t n = key_tenant(pre, t, CP_K_PRODUCER);
        if (s->mt_prod.len)
            leveldb_iter_seek(it, (const char *)s->mt_prod.data, s->mt_prod.len);
        else
            leveldb_iter_seek(it, (const char *)pre, n);
        int more = 0;
        for (; leveldb_iter_valid(it); leveldb_iter_next(it)) {
            size_t kl, vl;
            const char *key = leveldb_iter_key(it, &kl);
            if (kl <= n || memcmp(key, pre, n)) break;
            if (s->mt_prod.len == kl && !memcmp(key, s->mt_prod.data, kl)) continue; /* read */
            if (read == s->prod_scan) {
                more = 1;
                break;
            }
            read++;
            s->mt_prod.len = 0;
            if (cp_buf_append(&s->mt_prod, key, kl)) {
                s->mt_prod.len = 0;
                more = 1;
                break;
            }
            const char *v = leveldb_iter_value(it, &vl);
            if (prod_last_seen(v, vl) >= cut) continue;
            leveldb_writebatch_delete(wb, key, kl);
            prod_forget(t, key, kl, n);
            (*gone)++;
        }
        if (more) break;
        s->mt_prod_tenant++; /* every record of t read: the next tenant */
        s->mt_prod.len = 0;
    }
    leveldb_iter_destroy(it);
    int rc = *gone ? write_deletes(s, wb, err) : 0;
    leveldb_writebatch_destroy(wb);
    return rc;
}

/* Bytes of one series and level deleted at once that are worth a CompactRange (a day of a
 * long-lived series' windows is megabytes; a short process's few blocks, kilobytes). */
#define COMPACT_MIN_BYTES (64 << 10)

/* Deletes, into wb and then the store, the blocks of ser's level l older than cut, at most
 * max_keys - *done of them (added to *done), and records the oldest block left. */
static int cut_level(cp_store *s, cp_ser *ser, int l, int64_t cut, uint32_t max_keys,
                     uint32_t *done, leveldb_writebatch_t *wb, cp_err *err)
{
    uint8_t k0[CP_TENANT_KEY_MAX + 16], k1[CP_TENANT_KEY_MAX + 16];
    size_t n0 = key_block(k0, ser, l, INT64_MIN);
    key_block(k1, ser, l, cut + (l ? 0 : 1));
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    uint32_t here = 0;
    size_t lastlen = 0, bytes = 0;
    uint8_t last[CP_TENANT_KEY_MAX + 16];
    int64_t floor = INT64_MAX; /* the oldest block left; INT64_MAX: none */
    for (leveldb_iter_seek(it, (const char *)k0, n0); leveldb_iter_valid(it);
         leveldb_iter_next(it)) {
        size_t kl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl != n0 || memcmp(key, k0, n0 - 8)) break; /* past the level's blocks */
        if (memcmp(key, k1, n0) >= 0 || *done >= max_keys) {
            floor = cp_time_unkey(cp_get_be64((const uint8_t *)key + n0 - 8));
            break;
        }
        leveldb_writebatch_delete(wb, key, kl);
        size_t vl;
        leveldb_iter_value(it, &vl);
        bytes += kl + vl;
        memcpy(last, key, kl);
        lastlen = kl;
        here++;
        (*done)++;
    }
    leveldb_iter_destroy(it);
    int rc = here ? write_deletes(s, wb, err) : 0;
    if (rc) return rc;
    ser->mt_floor[l] = floor;
    if (!here) return 0;
    /* Give the space back at once where it is much (a long-lived series' windows): rewrite
     * the files holding the range. A short process's few blocks are left to LevelDB's own
     * compactions (its tombstones go down with the next ones): a CompactRange flushes the
     * memtable and rewrites a file per level, and one per series and level made a host's
     * processes cost a compaction each (bench/store: forget). */
    if (bytes >= COMPACT_MIN_BYTES)
        leveldb_compact_range(s->db, (const char *)k0, n0, (const char *)last, lastlen);
    if (l == keeps_longest(s)) {
        /* no level holds a window starting before this any more */
        int64_t gone = l ? cut : cut + 1;
        if (drop_capture_windows(s, ser, gone, wb) && (rc = write_deletes(s, wb, err))) return rc;
        pthread_rwlock_wrlock(&s->lock);
        if (ser->first_ns < gone) ser->first_ns = gone;
        if (ser->first_ns > ser->last_ns) ser->first_ns = INT64_MAX, ser->last_ns = INT64_MIN;
        pthread_rwlock_unlock(&s->lock);
    }
    cp_buckets_drop(s, 1);
    return 0;
}

int cp_store_maintain(cp_store *s, int64_t now_ns, uint32_t max_keys, uint32_t *deleted,
                      cp_err *err)
{
    CP_ASSERT_THREAD(&s->writer, "writer thread only");
    uint32_t done = 0, visits = 0, total = 0, forgot = 0;
    if (deleted) *deleted = 0;
    if (s->broken || !s->db)
        return cp_err_set(err, CP_ESTORE, "store %s: an earlier write failed; reopen the store",
                          s->path);
    for (uint32_t i = 0; i < s->tenants.n; i++)
        total += s->tenants.v[i]->series.n;
    int rc = 0;
    leveldb_writebatch_t *wb = leveldb_writebatch_create();
    while (done < max_keys && visits < total * CP_NLEVELS && rc == 0) {
        if (s->mt_tenant >= s->tenants.n) {
            s->mt_tenant = s->mt_series = s->mt_level = 0;
            if (!s->tenants.n) break;
        }
        tenant *t = s->tenants.v[s->mt_tenant];
        if (s->mt_series >= t->series.n) {
            s->mt_tenant++;
            s->mt_series = s->mt_level = 0;
            continue;
        }
        cp_ser *ser = t->series.v[s->mt_series];
        if (!ser) { /* forgotten in this pass: a visit, so a pass that forgot all ends */
            s->mt_series++;
            s->mt_level = 0;
            visits += CP_NLEVELS;
            continue;
        }
        int l = (int)s->mt_level;
        if (++s->mt_level >= CP_NLEVELS) {
            s->mt_level = 0;
            s->mt_series++;
        }
        visits++;
        if (s->retention[l] <= 0) continue;
        /* a bucket goes once all of it is older than the cut */
        int64_t cut = now_ns - s->retention[l] - cp_level_ns[l];
        if (l == 0 && cut > atomic_load(&s->raw_cut)) atomic_store(&s->raw_cut, cut);
        /* Deleted: l ? start < cut : start <= cut. A level whose oldest block starts past
         * the cut has nothing to give: no seek (a host's short processes make a series
         * each, and a seek per series and level every pass grew with them). */
        if (ser->mt_floor[l] <= cut) rc = cut_level(s, ser, l, cut, max_keys, &done, wb, err);
        if (!rc && forgettable(s, ser) && !(rc = forget_series(s, t, ser, wb, err))) forgot++;
    }
    leveldb_writebatch_destroy(wb);
    series_close_up(s);
    if (!rc && drop_capture_records(s, now_ns, oldest_kept(s, now_ns), err) < 0) rc = CP_ESTORE;
    uint32_t prods = 0;
    if (!rc) rc = drop_producers(s, oldest_kept(s, now_ns), &prods, err);
    if (prods)
        cp_log_info("store %s: retention removed %u producer records (their last windows past "
                    "retention)",
                    s->path, prods);
    if (forgot)
        cp_log_info("store %s: retention forgot %u series (their windows all past retention)",
                    s->path, forgot);
    /* The series forgotten are freed once no query holds one (a query holds s->dblock for
     * reading throughout): by the first pass that finds none running; past
     * s->forgotten_wait kept, a pass waits for the running ones (as a reopen does; new
     * queries wait behind it), so queries that never pause cannot keep them for ever. */
    if (s->forgotten.n) {
        int held = pthread_rwlock_trywrlock(&s->dblock) == 0;
        if (!held && s->forgotten.n >= s->forgotten_wait)
            held = pthread_rwlock_wrlock(&s->dblock) == 0;
        if (held) {
            cp_forgotten_free(s);
            pthread_rwlock_unlock(&s->dblock);
        }
    }
    if (deleted) *deleted = done;
    return rc;
}
