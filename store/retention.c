/* The store's retention: deletes the blocks of each level older than its retention, a
 * bounded number per call, and compacts the range so the disk space is given back.
 *
 * Locking: cp_store_maintain runs on the writer's thread between batches (it drops the
 * writer's clean buckets); it reads the tables without a lock like the writer, and takes
 * s->lock for writing only to narrow a series' span once its level-0 blocks are gone. */
#include "store.h"
#include "store_int.h"
#include "check.h"
#include "log.h"

#include <string.h>

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

int cp_store_maintain(cp_store *s, int64_t now_ns, uint32_t max_keys, uint32_t *deleted,
                      cp_err *err)
{
    CP_ASSERT_THREAD(&s->writer, "writer thread only");
    uint32_t done = 0, visits = 0, total = 0;
    if (deleted) *deleted = 0;
    if (s->broken || !s->db)
        return cp_err_set(err, CP_ESTORE, "store %s: an earlier write failed; reopen the store",
                          s->path);
    for (uint32_t i = 0; i < s->tenants.n; i++)
        total += s->tenants.v[i]->series.n;
    int rc = 0;
    leveldb_writebatch_t *wb = leveldb_writebatch_create();
    uint8_t k0[CP_TENANT_KEY_MAX + 16], k1[CP_TENANT_KEY_MAX + 16];
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
        size_t n0 = key_block(k0, ser, l, INT64_MIN);
        key_block(k1, ser, l, cut + (l ? 0 : 1));
        leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
        uint32_t here = 0;
        size_t lastlen = 0;
        uint8_t last[CP_TENANT_KEY_MAX + 16];
        for (leveldb_iter_seek(it, (const char *)k0, n0); leveldb_iter_valid(it) && done < max_keys;
             leveldb_iter_next(it)) {
            size_t kl;
            const char *key = leveldb_iter_key(it, &kl);
            if (kl != n0 || memcmp(key, k1, n0) >= 0) break;
            leveldb_writebatch_delete(wb, key, kl);
            memcpy(last, key, kl);
            lastlen = kl;
            here++;
            done++;
        }
        leveldb_iter_destroy(it);
        if (!here) continue;
        char *e = NULL;
        leveldb_write(s->db, s->wnosync, wb, &e);
        leveldb_writebatch_clear(wb);
        if (e) {
            rc = cp_err_set(err, CP_ESTORE, "store: retention delete failed: %s", e);
            leveldb_free(e);
            break;
        }
        /* give the space back: rewrite the files holding the deleted range */
        leveldb_compact_range(s->db, (const char *)k0, n0, (const char *)last, lastlen);
        if (l == keeps_longest(s)) {
            /* no level holds a window starting before this any more */
            int64_t gone = l ? cut : cut + 1;
            pthread_rwlock_wrlock(&s->lock);
            if (ser->first_ns < gone) ser->first_ns = gone;
            if (ser->first_ns > ser->last_ns) ser->first_ns = INT64_MAX, ser->last_ns = INT64_MIN;
            pthread_rwlock_unlock(&s->lock);
        }
        cp_buckets_drop(s, 1);
    }
    leveldb_writebatch_destroy(wb);
    if (deleted) *deleted = done;
    return rc;
}
