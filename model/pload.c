/* Parallel decode and merge (see pload.h). Worker w takes the contiguous block
 * [w*n/T, (w+1)*n/T) of the inputs, decodes each with its own reusable decoder into one
 * reusable profile and merges it into its own merger; the caller then merges the T partial
 * results in worker order. Merging is order-independent in content, and the fixed
 * partition makes the ids in the output the same from run to run. Memory is bounded by T
 * decoders, T profiles and T partial results. */
#include "pload.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_THREADS 8

typedef struct worker {
    pthread_t tid;
    size_t begin, end; /* inputs [begin, end) */
    cp_pload_read_fn read;
    void *ctx;
    const cp_pprof_limits *lim;
    cp_profile *result; /* partial merge */
    int rc;
    size_t failed; /* index of the failing input */
    cp_err err;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    cp_pprof_decoder *d = cp_pprof_decoder_create(w->lim);
    cp_profile *p = cp_profile_create();
    cp_merger *m = cp_merger_create();
    cp_buf in = {0};
    if (!d || !p || !m) {
        w->rc = cp_err_set(&w->err, CP_ENOMEM, "out of memory starting a decoder");
        w->failed = w->begin;
        goto done;
    }
    for (size_t i = w->begin; i < w->end; i++) {
        in.len = 0;
        if ((w->rc = w->read(w->ctx, i, &in, &w->err)) ||
            (w->rc = cp_pprof_decoder_decode(d, in.data, in.len, p, &w->err)) ||
            (w->rc = cp_merger_add(m, p, &w->err))) {
            w->failed = i;
            goto done;
        }
    }
    if (!(w->result = cp_merger_finish(m))) {
        w->rc = cp_err_set(&w->err, CP_ENOMEM, "out of memory finishing a merge");
        w->failed = w->begin;
    }
done:
    cp_buf_close(&in);
    cp_merger_destroy(m);
    cp_profile_destroy(p);
    cp_pprof_decoder_destroy(d);
    return NULL;
}

int cp_pload_merge(size_t n, cp_pload_read_fn read, void *ctx, const cp_pprof_limits *lim,
                   int threads, cp_merger *m, size_t *failed_index, cp_err *err)
{
    worker ws[MAX_THREADS];
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c < 1 ? 1 : (int)(c > MAX_THREADS ? MAX_THREADS : c);
    }
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if ((size_t)threads > n) threads = n ? (int)n : 1;
    memset(ws, 0, sizeof ws);
    for (int t = 0; t < threads; t++) {
        ws[t] = (worker){.begin = n * (size_t)t / (size_t)threads,
                         .end = n * (size_t)(t + 1) / (size_t)threads,
                         .read = read,
                         .ctx = ctx,
                         .lim = lim};
    }
    /* worker 0 runs on the calling thread; the others on their own */
    int started = 1;
    for (; started < threads; started++)
        if (pthread_create(&ws[started].tid, NULL, work, &ws[started])) break;
    for (int t = started; t < threads; t++)
        work(&ws[t]); /* could not start: do it here */
    work(&ws[0]);
    for (int t = 1; t < started; t++)
        pthread_join(ws[t].tid, NULL);

    int rc = 0;
    for (int t = 0; t < threads && !rc; t++) {
        if ((rc = ws[t].rc)) { /* the first failure in input order */
            if (err) *err = ws[t].err;
            if (failed_index) *failed_index = ws[t].failed;
        }
    }
    for (int t = 0; t < threads; t++) {
        if (!rc && (rc = cp_merger_add(m, ws[t].result, err)) && failed_index)
            *failed_index = ws[t].begin;
        cp_profile_destroy(ws[t].result);
    }
    return rc;
}

int cp_pload_read_file(void *ctx, size_t i, cp_buf *out, cp_err *err)
{
    const char *const *paths = ctx;
    return cp_read_file(paths[i], out, err);
}
