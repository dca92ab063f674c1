/* Capture records (format.h 'K'): the API's captures kept in the store so that a restart
 * finds them (resumed or reported), as symbol uploads are kept (store.c). One synced put
 * per state change; readers take dblock like every reader. */
#include "store.h"
#include "store_int.h"
#include "log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* \0 'K' tenant \0 id; 0 for names that do not fit. */
static size_t key_capture(uint8_t *k, size_t cap, const char *tenant, const char *id)
{
    size_t tl = tenant ? strlen(tenant) : 0, il = id ? strlen(id) : 0;
    if (tl > CP_TENANT_KEY_MAX || il > CP_CAPTURE_ID_MAX || tl + il + 3 > cap) return 0;
    k[0] = 0;
    k[1] = CP_K_CAPTURE;
    memcpy(k + 2, tenant, tl);
    k[2 + tl] = 0;
    memcpy(k + 3 + tl, id, il);
    return tl + il + 3;
}

static int closed(const cp_store *s, cp_err *err)
{
    return cp_err_set(err, CP_ESTORE,
                      "store %s is not open: an earlier write failed and reopening it has not "
                      "succeeded yet",
                      s->path);
}

int cp_store_put_capture(cp_store *s, const cp_capture *c, cp_err *err)
{
    if (cp_capture_validate(c, err)) return CP_EINVAL;
    uint8_t k[CP_TENANT_KEY_MAX + CP_CAPTURE_ID_MAX + 4];
    size_t kl = key_capture(k, sizeof k, c->tenant, c->id);
    if (!kl) return cp_err_set(err, CP_EINVAL, "capture: bad tenant or id");
    cp_buf v = {0};
    if (cp_capture_encode(c, NULL, &v)) return cp_err_set(err, CP_ENOMEM, "capture record");
    char *lerr = NULL;
    pthread_rwlock_rdlock(&s->dblock);
    if (s->db)
        leveldb_put(s->db, s->wsync, (const char *)k, kl, (const char *)v.data, v.len, &lerr);
    int open = s->db != NULL;
    pthread_rwlock_unlock(&s->dblock);
    cp_buf_close(&v);
    if (!open) return closed(s, err);
    if (lerr) {
        cp_err_set(err, CP_ESTORE, "store %s: writing capture %s: %s", s->path, c->id, lerr);
        leveldb_free(lerr);
        return CP_ESTORE;
    }
    atomic_fetch_add(&s->capture_gen, 1);
    return 0;
}

int cp_store_delete_capture(cp_store *s, const char *tenant, const char *id, cp_err *err)
{
    uint8_t k[CP_TENANT_KEY_MAX + CP_CAPTURE_ID_MAX + 4];
    size_t kl = key_capture(k, sizeof k, tenant, id);
    if (!kl) return 0;
    char *lerr = NULL;
    pthread_rwlock_rdlock(&s->dblock);
    if (s->db) leveldb_delete(s->db, s->wnosync, (const char *)k, kl, &lerr);
    int open = s->db != NULL;
    pthread_rwlock_unlock(&s->dblock);
    if (!open) return closed(s, err);
    if (lerr) {
        cp_err_set(err, CP_ESTORE, "store %s: removing capture %s: %s", s->path, id, lerr);
        leveldb_free(lerr);
        return CP_ESTORE;
    }
    atomic_fetch_add(&s->capture_gen, 1);
    return 0;
}

uint64_t cp_store_captures_gen(cp_store *s)
{
    return atomic_load(&s->capture_gen);
}

int cp_store_get_capture(cp_store *s, const char *tenant, const char *id, cp_capture *out,
                         cp_err *err)
{
    memset(out, 0, sizeof *out);
    uint8_t k[CP_TENANT_KEY_MAX + CP_CAPTURE_ID_MAX + 4];
    size_t kl = key_capture(k, sizeof k, tenant, id);
    if (!kl) return CP_ENOTFOUND;
    char *lerr = NULL;
    size_t vl = 0;
    pthread_rwlock_rdlock(&s->dblock);
    char *v = s->db ? leveldb_get(s->db, s->ropts, (const char *)k, kl, &vl, &lerr) : NULL;
    int open = s->db != NULL;
    pthread_rwlock_unlock(&s->dblock);
    if (!open) return closed(s, err);
    if (lerr) {
        cp_err_set(err, CP_ESTORE, "store %s: reading capture %s: %s", s->path, id, lerr);
        leveldb_free(lerr);
        return CP_ESTORE;
    }
    if (!v) return CP_ENOTFOUND;
    int rc = cp_capture_decode((const uint8_t *)v, vl, out, err);
    leveldb_free(v);
    if (rc) return cp_err_set(err, CP_ESTORE, "store %s: capture %s: %s", s->path, id, err->msg);
    return 0;
}

void cp_store_capture_list_close(cp_store_capture_list *l)
{
    if (!l) return;
    for (uint32_t i = 0; i < l->n; i++)
        cp_capture_close(&l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

int cp_store_captures(cp_store *s, const char *tenant, cp_store_capture_list *out, cp_err *err)
{
    memset(out, 0, sizeof *out);
    uint8_t pre[CP_TENANT_KEY_MAX + 4];
    size_t pl = 2;
    pre[0] = 0;
    pre[1] = CP_K_CAPTURE;
    if (tenant) {
        size_t tl = strlen(tenant);
        if (tl > CP_TENANT_KEY_MAX) return 0;
        memcpy(pre + 2, tenant, tl);
        pre[2 + tl] = 0;
        pl = tl + 3;
    }
    int rc = 0;
    pthread_rwlock_rdlock(&s->dblock);
    if (!s->db) {
        pthread_rwlock_unlock(&s->dblock);
        return closed(s, err);
    }
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    for (leveldb_iter_seek(it, (const char *)pre, pl); leveldb_iter_valid(it) && !rc;
         leveldb_iter_next(it)) {
        size_t kl, vl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl < pl || memcmp(key, pre, pl)) break;
        const char *v = leveldb_iter_value(it, &vl);
        cp_capture c;
        cp_err e = {0};
        if (cp_capture_decode((const uint8_t *)v, vl, &c, &e)) {
            cp_log_warn("store %s: a capture record does not decode (skipped): %s", s->path, e.msg);
            continue;
        }
        if (cp_vec_push(out, c)) {
            cp_capture_close(&c);
            rc = cp_err_set(err, CP_ENOMEM, "captures");
        }
    }
    leveldb_iter_destroy(it);
    pthread_rwlock_unlock(&s->dblock);
    if (rc) cp_store_capture_list_close(out);
    return rc;
}
