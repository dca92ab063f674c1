/* Text views of a profile: a flat/cum table like `pprof -top` and folded stacks (the
 * input format of flamegraph tools). Used offline by `contprof merge` and by the HTTP API. */
#ifndef CP_RENDER_H
#define CP_RENDER_H

#include "profile.h"

/* The sample type shown by default: default_sample_type if set, else the last (pprof). */
int cp_render_default_index(const cp_profile *p);

/* Resolves a sample type name (or NULL for the default) to its index; -1 if absent. */
int cp_render_find_index(const cp_profile *p, const char *type);

/* Appends the table: a header with the type and total, then one row per function
 * (flat, flat%, sum%, cum, cum%, name), by flat descending, at most max_rows (0 = all). */
int cp_render_top(const cp_profile *p, int index, uint32_t max_rows, cp_buf *out);

/* Appends one "root;caller;leaf value" line per distinct stack with a nonzero value. */
int cp_render_folded(const cp_profile *p, int index, cp_buf *out);

/* Formats v in the unit (nanoseconds -> ms/s, bytes -> kB/MB/GB, else a plain number). */
void cp_render_value(int64_t v, const char *unit, char *buf, size_t len);

#endif
