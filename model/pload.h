/* Parallel loading: decode and merge many pprof inputs on several threads, each merging a
 * fixed share of the inputs, then merge the shares. The result's content is what a
 * one-by-one merge gives; its ids do not depend on timing. */
#ifndef CP_PLOAD_H
#define CP_PLOAD_H

#include "merge.h"
#include "pprof.h"

/* Reads input i into out (appending); returns 0 or an error code with err filled. Called
 * from worker threads, several at once, for distinct i. */
typedef int (*cp_pload_read_fn)(void *ctx, size_t i, cp_buf *out, cp_err *err);

/* Decodes inputs 0..n-1 with `threads` threads (0 = one per CPU, at most 8; the caller's
 * thread is one of them) and adds their merge to m. On failure the code is returned, err
 * says why and *failed_index names the first failing input in input order; when an input
 * fails, m is unchanged. */
int cp_pload_merge(size_t n, cp_pload_read_fn read, void *ctx, const cp_pprof_limits *lim,
                   int threads, cp_merger *m, size_t *failed_index, cp_err *err);

/* A cp_pload_read_fn over an array of file paths (ctx is const char *const *). */
int cp_pload_read_file(void *ctx, size_t i, cp_buf *out, cp_err *err);

#endif
