/* Source maps (version 3, the format esbuild, tsc and every bundler write): the mappings'
 * base64 VLQ segments decoded into a table, looked up by generated line and column, and
 * applied to a V8 frame so that a bundled, minified script's frames read as its original
 * files, lines and function names. Pure: no I/O, no global state; every index is checked,
 * so a malformed map is an error naming the problem. Used by the V8 source as it converts
 * (collector/v8) and by the query side on stored windows (query/symbols.c); its own
 * library (cpsourcemap), never linked into the agent. */
#ifndef CP_V8_SOURCEMAP_H
#define CP_V8_SOURCEMAP_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "json.h"
#include "vec.h"

/* The largest map read (esbuild's map of a 10 MB bundle is ~30 MB), the most segments,
 * sources and names. A decoded map holds at most CP_V8_SMAP_MAX_RATIO times its text plus
 * CP_V8_SMAP_MIN_BUDGET bytes (a segment, 20 bytes, is 2-8 characters of mappings; a
 * string its own length plus a NUL and a 4-byte offset), checked before each allocation. */
#define CP_V8_SMAP_MAX_BYTES ((size_t)64 << 20)
#define CP_V8_SMAP_MAX_SEGMENTS (1u << 24)
#define CP_V8_SMAP_MAX_SOURCES (1u << 20)
#define CP_V8_SMAP_MAX_NAMES (1u << 22)
#define CP_V8_SMAP_MAX_RATIO 8
#define CP_V8_SMAP_MIN_BUDGET ((size_t)64 << 10)

typedef struct cp_v8_smap cp_v8_smap;

/* One original position: source (sourceRoot + sources[i]) and name (names[i] or NULL)
 * stay valid as long as the map; line and column are 0-based. */
typedef struct cp_v8_smap_pos {
    const char *source;
    const char *name;
    uint32_t line, column;
    uint32_t gen_column;   /* the generated column where the matching segment starts */
    uint32_t source_index; /* of source in the map's sources */
} cp_v8_smap_pos;

/* Parses a source map's JSON text (len bytes, need not end in NUL; not retained). On
 * success *out is a new map the caller frees with cp_v8_smap_destroy. Returns 0, CP_EPARSE
 * (err naming the problem: not JSON at byte N, version, a bad VLQ digit at mappings offset
 * N, an index out of range), CP_ELIMIT (err naming the limit: bytes, segments, sources,
 * names, the decoded size) or CP_ENOMEM. Index maps ("sections") are refused with
 * CP_EPARSE. No JSON tree is built: what it allocates is what the map holds. */
int cp_v8_smap_create(const char *text, size_t len, cp_v8_smap **out, cp_err *err);

/* What one parse may take: max_bytes held once decoded (0 = only the built-in ratio), and
 * a CLOCK_MONOTONIC deadline (cp_mono_ns; 0 = none), read as it goes: past it, CP_ELIMIT
 * "past the deadline". */
typedef struct cp_v8_smap_limits {
    size_t max_bytes;
    const char *max_bytes_name; /* what errors call max_bytes (a config key); may be NULL */
    int64_t deadline_ns;
} cp_v8_smap_limits;

/* cp_v8_smap_create within lim (may be NULL). */
int cp_v8_smap_create_within(const char *text, size_t len, const cp_v8_smap_limits *lim,
                             cp_v8_smap **out, cp_err *err);

/* The bytes m holds (every allocation of it, exactly as counted against max_bytes). */
size_t cp_v8_smap_bytes(const cp_v8_smap *m);

/* Frees m; NULL is fine. */
void cp_v8_smap_destroy(cp_v8_smap *m);

/* The segment of generated (line, column) (0-based): the one with the greatest column
 * not after column on that line that maps to a source. Returns 0 with *out, or -1 when
 * the position maps to nothing. */
int cp_v8_smap_lookup(const cp_v8_smap *m, uint32_t line, uint32_t column, cp_v8_smap_pos *out);

/* What a map says of a V8 frame: the original source (valid as long as the map), its
 * 0-based line and column, and the original function name ("" = keep V8's). */
typedef struct cp_v8_smap_frame {
    const char *source;
    uint32_t line, column;
    char name[512];
} cp_v8_smap_frame;

/* The original of a V8 frame: function fn (V8's name, "" for anonymous) placed at
 * generated 0-based (line, column), as V8 places a function (its parameter list); the
 * naming rules are cp_v8_smap_apply's. Returns 1 with *out, 0 when m maps nothing there. */
int cp_v8_smap_resolve(const cp_v8_smap *m, const char *fn, uint32_t line, uint32_t column,
                       cp_v8_smap_frame *out);

/* The map's "file" member (the generated script it maps), "" when absent. */
const char *cp_v8_smap_file(const cp_v8_smap *m);

/* The map's number of sources and of mapping segments. */
void cp_v8_smap_counts(const cp_v8_smap *m, uint32_t *sources, uint32_t *segments);

/* Rewrites an inspector call frame ({functionName, url, lineNumber, columnNumber}, as in
 * CPU and heap profiles) through m: url becomes the original source, lineNumber and
 * columnNumber the original position, and functionName the original name when the map
 * names the identifier just before V8's function position (V8 puts a function at its
 * parameter list; minifiers map the renamed identifier before it). A method of a class in
 * a source whose content the map holds (sourcesContent) reads as Class.name: the class is
 * found by the source's layout, the nearest line above indented less when it is a class
 * header. Returns 1 when the frame was rewritten, 0 when m maps nothing there (frame
 * untouched), CP_ENOMEM (the frame may then be partly rewritten). */
int cp_v8_smap_apply(const cp_v8_smap *m, cp_json *frame);

/* Decodes a data: URL (`data:[MEDIA][;base64],DATA`, percent-encoding in DATA when not
 * base64) into out (appended). Returns 0, CP_EPARSE (err naming the problem), CP_ELIMIT
 * (over CP_V8_SMAP_MAX_BYTES) or CP_ENOMEM. */
int cp_v8_data_url_decode(const char *url, cp_buf *out, cp_err *err);

#endif
