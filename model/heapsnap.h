/* V8 heap snapshots (the .heapsnapshot JSON that HeapProfiler.takeHeapSnapshot streams and
 * v8.writeHeapSnapshot writes) into a retainer profile: every live object's bytes under the
 * path of the dominator tree that keeps it alive, each frame named as a JS developer reads
 * it (README.md "Heap snapshots"). The text is fed in chunks of any size; only the graph
 * is held (13 bytes a node, 9 an edge, the strings), within a limit. */
#ifndef CP_HEAPSNAP_H
#define CP_HEAPSNAP_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "profile.h"

typedef struct cp_heapsnap_limits {
    uint64_t max_bytes;     /* the graph, its strings and the dominator pass's arrays */
    uint32_t max_depth;     /* frames in a path: deeper objects sit under "(deeper)" */
    uint32_t max_frames;    /* distinct paths: past them, objects count in their parent */
    uint32_t max_children;  /* distinct names under one path: past them, "(other)" */
    const char *limit_name; /* how the caller's users set max_bytes, named in its error */
} cp_heapsnap_limits;

/* 512 MiB (a 128 MB Worker's heap is ~3M nodes and ~8M edges: ~300 MB with the dominator
 * pass), 64 frames, 200,000 paths, 1,000 names under one path. */
void cp_heapsnap_limits_default(cp_heapsnap_limits *lim);

typedef struct cp_heapsnap_stats {
    uint64_t nodes, edges, strings;
    uint64_t reachable;   /* nodes the root reaches (itself not counted): the objects */
    uint64_t total_bytes; /* their self sizes: the profile's total */
    uint64_t held_bytes;  /* the parser's peak memory, counted against max_bytes */
    uint32_t passes;      /* of the dominator computation */
    uint32_t frames;      /* paths in the profile */
} cp_heapsnap_stats;

typedef struct cp_heapsnap cp_heapsnap;

/* A parser with lim (NULL: the defaults; limit_name is borrowed). Returns 0 or CP_ENOMEM. */
int cp_heapsnap_create(const cp_heapsnap_limits *lim, cp_heapsnap **out);
/* Parses the next len bytes of the snapshot. CP_EPARSE (the byte offset named) for text that
 * is not a snapshot, CP_ELIMIT when the graph would pass max_bytes (the limit and its name
 * in err), CP_ENOMEM. After an error every further call fails the same way. */
int cp_heapsnap_feed(cp_heapsnap *h, const char *buf, size_t len, cp_err *err);
/* Ends the input and builds the retainer profile into out (which must be empty): sample
 * types retained_objects/count and retained_space/bytes, one sample per path. CP_EPARSE for
 * a truncated or inconsistent snapshot (counts, edge targets, names out of range),
 * CP_ELIMIT, CP_ENOMEM. st (may be NULL) is filled either way. */
int cp_heapsnap_finish(cp_heapsnap *h, cp_profile *out, cp_heapsnap_stats *st, cp_err *err);
/* Frees h; NULL is fine. */
void cp_heapsnap_destroy(cp_heapsnap *h);

/* Whether head (a file's first n bytes) starts like a snapshot: {"snapshot" after any
 * whitespace. */
int cp_heapsnap_looks_like(const void *head, size_t n);
/* The snapshot in file path as a retainer profile into out (empty), streamed in 1 MiB
 * reads; time_nanos is the file's modification time. Errors as above, and CP_EIO (the
 * caller names the file). */
int cp_heapsnap_read_file(const char *path, const cp_heapsnap_limits *lim, cp_profile *out,
                          cp_heapsnap_stats *st, cp_err *err);

#endif
