/* Views of a merged profile: the `top` table (like `pprof -top`), folded stacks, and the
 * JSON call tree flamegraphs are drawn from (with honest max_nodes pruning and a two-profile
 * diff form). Used by the HTTP API and offline by the CLI. Frames are functions: a location
 * with inlined lines contributes one frame per line; a location without lines is named by
 * its address. */
#ifndef CP_QUERY_RENDER_H
#define CP_QUERY_RENDER_H

#include <stdint.h>

#include "error.h"
#include "profile.h"
#include "vec.h"

/* Picks the value column: name NULL or "" means the profile's default_sample_type, or its
 * last sample type (pprof's rule). Otherwise the sample type whose type is name ("cpu",
 * "samples", "alloc_space"...). CP_EINVAL with err listing the types if there is none. */
int cp_render_value_index(const cp_profile *p, const char *name, int *vi, cp_err *err);

/* The sample type shown by default: default_sample_type if set, else the last (pprof). */
int cp_render_default_index(const cp_profile *p);
/* Resolves a sample type name (or NULL for the default) to its index; -1 if absent. */
int cp_render_find_index(const cp_profile *p, const char *type);

/* Drops, in place, every sample with a frame matching ignore, and, if focus is given, every
 * sample with no frame matching focus (POSIX extended regexes, unanchored, matched against
 * function names; NULL or "" = no filter). CP_EPARSE naming the bad regex. */
int cp_render_filter(cp_profile *p, const char *focus, const char *ignore, cp_err *err);
/* The same with a deadline (CLOCK_MONOTONIC ns, 0 = none): each regex runs once per distinct
 * frame name, and the clock is read between names and every few thousand samples; past the
 * deadline CP_ELIMIT, with p left unchanged. */
int cp_render_filter_until(cp_profile *p, const char *focus, const char *ignore,
                           int64_t deadline_ns, cp_err *err);

/* Appends the top table: header lines, then one row per function sorted by flat value:
 * flat, flat%, sum%, cum, cum%, name. max_rows 0 = all. Returns 0 or CP_ENOMEM (out may
 * then hold part of the table). */
int cp_render_top(const cp_profile *p, int vi, uint32_t max_rows, cp_buf *out);

/* Appends folded stacks, one line per distinct stack: "root;caller;leaf value\n", sorted.
 * Stacks whose value is zero are left out. Returns 0 or CP_ENOMEM. */
int cp_render_folded(const cp_profile *p, int vi, cp_buf *out);

/* How a JSON tree is cut and framed (cp_render_tree_json). */
typedef struct cp_render_tree_opts {
    uint32_t max_nodes;     /* > 0: keep the max_nodes nodes with the largest totals */
    const char *extra_json; /* inserted verbatim after the opening brace, ending with a
                               comma; NULL: nothing */
} cp_render_tree_opts;

/* Appends a JSON object {<extra_json>"sample_type":{...},"total":N,"nodes":K,
 * "total_nodes":M,"root":{"name":"total","self":..,"total":..,"children":[...]}}.
 * Children are sorted by name; a node without children has no "children" member. A frame
 * of native code carries "module" after its name: the base name of the object its
 * location is mapped to ("workerd", "libc.so.6"; the first seen for a name); language
 * frames (locations without such a mapping) carry none.
 * max_nodes > 0 keeps the max_nodes nodes with the largest totals and folds each pruned
 * subtree into its parent's self, so totals stay exact. If base is not NULL (a diff),
 * every node also carries "base_self" and "base_total" from base (value column base_vi),
 * and the tree is the union of both. o may be NULL (no pruning, no extra members).
 * Returns 0 or CP_ENOMEM. */
int cp_render_tree_json(const cp_profile *p, int vi, const cp_profile *base, int base_vi,
                        const cp_render_tree_opts *o, cp_buf *out);

/* Formats v in unit ("nanoseconds", "bytes", "count"...) the way pprof does: 1.20s, 10ms,
 * 3.50MB, 42. */
void cp_render_value(int64_t v, const char *unit, char *buf, size_t len);

#endif
