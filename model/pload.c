/* Parallel decode, ordered merge (see pload.h). Workers claim input indices in order and
 * park each decoded profile in a ring slot; the caller merges slot after slot. The ring
 * bounds memory to a few decoded profiles per worker. */
#include "pload.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct slot {
    int state; /* 0 empty, 1 ready */
    int rc;
    cp_profile *p;
    cp_err err;
} slot;

typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t n, next, merged, nslots;
    int stop;
    slot *slots;
    cp_pload_read_fn read;
    void *ctx;
    const cp_pprof_limits *lim;
} pool;

static void *worker(void *arg)
{
    pool *pl = arg;
    cp_buf in = {0};
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        /* claim the next index once its slot is free (the ring bounds memory) */
        while (!pl->stop && pl->next < pl->n && pl->next >= pl->merged + pl->nslots)
            pthread_cond_wait(&pl->cv, &pl->mu);
        if (pl->stop || pl->next >= pl->n) break;
        size_t i = pl->next++;
        pthread_mutex_unlock(&pl->mu);

        slot r = {1, 0, NULL, {0, ""}};
        in.len = 0;
        r.rc = pl->read(pl->ctx, i, &in, &r.err);
        if (!r.rc) r.rc = cp_pprof_decode(in.data, in.len, pl->lim, &r.p, &r.err);

        pthread_mutex_lock(&pl->mu);
        pl->slots[i % pl->nslots] = r;
        pthread_cond_broadcast(&pl->cv);
    }
    pthread_mutex_unlock(&pl->mu);
    cp_buf_close(&in);
    return NULL;
}

int cp_pload_merge(size_t n, cp_pload_read_fn read, void *ctx, const cp_pprof_limits *lim,
                   int threads, cp_merger *m, size_t *failed_index, cp_err *err)
{
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c < 1 ? 1 : c > 8 ? 8 : (int)c;
    }
    if ((size_t)threads > n) threads = n ? (int)n : 1;
    pool pl = {.n = n, .nslots = (size_t)threads * 4, .read = read, .ctx = ctx, .lim = lim};
    pthread_t tids[8];
    int started = 0, rc = 0;
    pl.slots = calloc(pl.nslots, sizeof *pl.slots);
    if (!pl.slots) return cp_err_set(err, CP_ENOMEM, "out of memory");
    pthread_mutex_init(&pl.mu, NULL);
    pthread_cond_init(&pl.cv, NULL);
    for (; started < threads && started < 8; started++)
        if (pthread_create(&tids[started], NULL, worker, &pl)) break;
    if (!started) {
        rc = cp_err_set(err, CP_ENOMEM, "cannot start decoder threads");
        goto done;
    }
    for (size_t i = 0; i < n && !rc; i++) {
        slot *s = &pl.slots[i % pl.nslots];
        pthread_mutex_lock(&pl.mu);
        while (!s->state) pthread_cond_wait(&pl.cv, &pl.mu);
        slot r = *s;
        memset(s, 0, sizeof *s);
        pthread_mutex_unlock(&pl.mu);
        if (!r.rc) r.rc = cp_merger_add(m, r.p, &r.err);
        cp_profile_destroy(r.p);
        pthread_mutex_lock(&pl.mu);
        pl.merged = i + 1;
        pthread_cond_broadcast(&pl.cv);
        pthread_mutex_unlock(&pl.mu);
        if (r.rc) {
            rc = r.rc;
            if (err) *err = r.err;
            if (failed_index) *failed_index = i;
        }
    }
done:
    pthread_mutex_lock(&pl.mu);
    pl.stop = 1;
    pthread_cond_broadcast(&pl.cv);
    pthread_mutex_unlock(&pl.mu);
    for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
    for (size_t i = 0; i < pl.nslots; i++) cp_profile_destroy(pl.slots[i].p);
    free(pl.slots);
    pthread_mutex_destroy(&pl.mu);
    pthread_cond_destroy(&pl.cv);
    return rc;
}

int cp_pload_read_file(void *ctx, size_t i, cp_buf *out, cp_err *err)
{
    const char *const *paths = ctx;
    int rc = cp_read_file(paths[i], out);
    if (rc) return cp_err_set(err, rc, "cannot read %s", paths[i]);
    return 0;
}
