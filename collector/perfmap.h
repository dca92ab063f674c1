/* Names of JIT code from the process's perf map (/tmp/perf-PID.map, written by V8's
 * --perf-basic-prof and other JITs): read incrementally on the agent thread, bounded. A
 * leaf: it parses and looks up; window.c turns what it finds into language frames. */
#ifndef CP_PERFMAP_H
#define CP_PERFMAP_H

#include <stddef.h>
#include <stdint.h>

/* Bounds: entries kept, name bytes kept, and bytes read from the file per refresh. */
#define CP_PERFMAP_MAX_ENTRIES (1u << 19)
#define CP_PERFMAP_MAX_NAMES (32u << 20)
#define CP_PERFMAP_READ_MAX (4u << 20)

/* One map line's name, split as a JS frame: V8's "JS:~hotJson worker.js:4:17" gives
 * function "hotJson", file "worker.js", line 4 (the tier marker after "JS:" dropped;
 * "JS:~ a.js:1:2" gives "(anonymous)"). Any other name (builtins, stubs, other JITs) is
 * the function as written, no file, line 0. */
typedef struct cp_perfmap_name {
    char function[256];
    char file[256];
    int64_t line;
} cp_perfmap_name;

/* Splits name[0..len) into out. Always succeeds (a name longer than the buffers is cut). */
void cp_perfmap_split(const char *name, size_t len, cp_perfmap_name *out);

/* Reads what was appended to path since the last call (at most CP_PERFMAP_READ_MAX bytes,
 * complete lines only; a line cut mid-write is read again next time), opening it read-only
 * and closing it before returning. path NULL: /tmp/perf-<getpid()>.map. Returns 0,
 * CP_ENOTFOUND (no file yet) or CP_ENOMEM. Agent thread only; allocates. */
int cp_perfmap_refresh(const char *path);

/* The entry covering addr, newest first for overlapping ranges: sets *name and *len (valid until
 * the next refresh) and *slot (an index for cp_perfmap_get_tag and _set_tag). Returns 0 or
 * CP_ENOTFOUND. */
int cp_perfmap_lookup(uint64_t addr, const char **name, size_t *len, uint32_t *slot);
/* A caller's value kept per entry (window.c: its language frame id + 1; 0: none yet). */
uint64_t cp_perfmap_get_tag(uint32_t slot);
void cp_perfmap_set_tag(uint32_t slot, uint64_t tag);

/* Whether a map was ever found in this process; lines read, lines refused (malformed),
 * lines dropped over the bounds. */
typedef struct cp_perfmap_stats {
    int found;
    uint64_t entries, bad, dropped, bytes;
} cp_perfmap_stats;
void cp_perfmap_get_stats(cp_perfmap_stats *st);

/* The V8 flags behind a perf map, read from a command line (args: len bytes of
 * NUL-separated arguments, as /proc/self/cmdline) and from NODE_OPTIONS (space-separated,
 * may be NULL): 1 when the map is asked for (--perf-basic-prof, -only-functions,
 * --perf-prof) without --interpreted-frames-native-stack (V8 takes '_' for '-' too), when
 * interpreted functions have no frame of their own; else 0. */
int cp_perfmap_needs_native_stack(const char *args, size_t len, const char *node_options);

/* Frees everything (stop). */
void cp_perfmap_reset(void);
/* Fork child: forgets the parent's map without touching it (the child's pid has its own). */
void cp_perfmap_abandon(void);

#endif
