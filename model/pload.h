/* Parallel loading: decode many pprof inputs on worker threads while the calling thread
 * merges them, in input order (so the result does not depend on timing). Decoding
 * (gunzip + parse) costs more than merging, and it is independent per input. */
#ifndef CP_PLOAD_H
#define CP_PLOAD_H

#include "merge.h"
#include "pprof.h"

/* Reads input i into out (appending); returns 0 or an error code with err filled. Called
 * from worker threads, several at once, for distinct i. */
typedef int (*cp_pload_read_fn)(void *ctx, size_t i, cp_buf *out, cp_err *err);

/* Decodes inputs 0..n-1 with `threads` workers (0 = one per CPU, at most 8) and adds each to
 * m in order. Stops at the first failure: the code is returned and err says which input
 * (its index is in *failed_index) and why. */
int cp_pload_merge(size_t n, cp_pload_read_fn read, void *ctx, const cp_pprof_limits *lim,
                   int threads, cp_merger *m, size_t *failed_index, cp_err *err);

/* A cp_pload_read_fn over an array of file paths (ctx is const char *const *). */
int cp_pload_read_file(void *ctx, size_t i, cp_buf *out, cp_err *err);

#endif
