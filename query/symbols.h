/* Server-side symbolization: symbol tables uploaded per tenant and build ID (kept in the
 * store), or found in configured debug directories, name the frames that agents left
 * unsymbolized, and JavaScript source maps uploaded per script name V8 frames, when a
 * profile is read. Profiles are stored as they arrived; naming happens
 * on every query, so windows stored before an upload are named once it is there. */
#ifndef CP_QUERY_SYMBOLS_H
#define CP_QUERY_SYMBOLS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "metrics.h"
#include "profile.h"
#include "store.h"
#include "symtab.h"

typedef struct cp_symbols_options {
    cp_store *store;         /* where uploads are kept; not owned; may be NULL (dirs only) */
    const char *dirs;        /* ':'-separated .build-id directories (xx/yyyy.debug); copied */
    size_t max_upload_bytes; /* largest ELF accepted; default 512 MiB */
    size_t max_table_bytes;  /* largest table kept per build ID; default 64 MiB */
    size_t cache_bytes;      /* tables held in memory; default 256 MiB */
} cp_symbols_options;

typedef struct cp_symbols cp_symbols;

/* Fills o with the defaults written beside each field. */
void cp_symbols_options_default(cp_symbols_options *o);
/* A new symbolizer (NULL on out of memory (the NULL-or-object constructor: error.h, "Exceptions"));
 * thread-safe. */
cp_symbols *cp_symbols_create(const cp_symbols_options *o);
void cp_symbols_destroy(cp_symbols *sy); /* NULL is fine */

/* What an upload produced. */
typedef struct cp_symbols_result {
    char build_id[CP_BUILD_ID_HEX_MAX + 1];
    cp_symtab_info info;
    size_t table_bytes;
} cp_symbols_result;

/* Reads the ELF image elf[0..len) (not retained) and stores its table for tenant, replacing
 * any earlier one of the same build ID. Returns 0; CP_EPARSE (err names what is wrong with
 * the file), CP_ELIMIT (a size limit, named), CP_ESTORE or CP_ENOMEM. */
int cp_symbols_upload(cp_symbols *sy, const char *tenant, const uint8_t *elf, size_t len,
                      cp_symbols_result *out, cp_err *err);

/* Source maps (model/sourcemap.h) are kept beside the tables, per tenant and generated
 * script: key "js:" + the script's basename (store/format.h 'Y'). */
#define CP_SYMBOLS_SCRIPT_MAX 120 /* bytes of a script's basename */

/* What a source map upload produced. */
typedef struct cp_symbols_map_result {
    char script[CP_SYMBOLS_SCRIPT_MAX + 1]; /* the basename of the generated script it maps */
    uint32_t sources, segments;
    size_t map_bytes;  /* its JSON's */
    size_t held_bytes; /* decoded, as the cache holds and counts it (cp_v8_smap_bytes) */
} cp_symbols_map_result;

/* An uploaded source map: text[0..len) (not retained), for tenant; name is the uploaded
 * file's name (may be NULL). */
typedef struct cp_symbols_map_upload {
    const char *tenant;
    const char *text;
    size_t len;
    const char *name;
} cp_symbols_map_upload;

/* Checks the source map up->text and stores it for up->tenant, keyed by the basename of its
 * "file" member, else of up->name less a ".map" suffix; it replaces any earlier map of that
 * script. Returns 0; CP_EPARSE (err names the problem: not JSON, version, a mappings
 * offset, no script to key it by), CP_ELIMIT (symbols.max_upload_bytes,
 * symbols.max_table_bytes, or the decoder's limits), CP_EINVAL (no store), CP_ESTORE or
 * CP_ENOMEM. */
int cp_symbols_upload_map(cp_symbols *sy, const cp_symbols_map_upload *up,
                          cp_symbols_map_result *out, cp_err *err);

/* Whether an upload's body is a source map rather than an ELF file: its first byte that is
 * not white space is '{'. */
int cp_symbols_is_map(const uint8_t *body, size_t len);

/* Names, in place, every location of p that has no lines and whose mapping has a build ID:
 * the tenant's uploaded table of that build ID first, then the configured directories.
 * Functions and lines are added; named mappings get the has-functions flags. Then rewrites
 * every V8 frame (a location with no mapping whose function's system_name is the V8
 * source's "NAME URL:LINE:COLUMN", URL its filename) through the tenant's source map of
 * URL's basename: original source, line and name (new functions; the system_name kept).
 * Tables and maps that cannot be read are skipped (logged). Returns 0 or CP_ENOMEM; *named (may be
 * NULL) gets the number of locations named. */
int cp_symbols_name(cp_symbols *sy, const char *tenant, cp_profile *p, uint32_t *named);

/* cp_symbols_name until deadline_ns (CLOCK_MONOTONIC, cp_mono_ns; 0 = none): a source map
 * read for it stops there, and past it the pass returns CP_ELIMIT (the frames named so far
 * stay named). */
int cp_symbols_name_until(cp_symbols *sy, const char *tenant, cp_profile *p, int64_t deadline_ns,
                          uint32_t *named);

/* Counters for /metrics (since create). */
typedef struct cp_symbols_stats {
    uint64_t uploads, uploads_refused; /* accepted uploads; refused ones (bad file, limit) */
    uint64_t locations_named;          /* locations named by query-time passes */
    uint64_t tables_cached, cache_bytes;
} cp_symbols_stats;
/* Copies the counters into out (a consistent snapshot, taken under the symbolizer's lock). */
void cp_symbols_get_stats(cp_symbols *sy, cp_symbols_stats *out);
/* Registers the contprof_symbols_* families of /metrics in r; cp_symbols_destroy ends
 * the registration. Once. Returns 0, CP_ENOMEM or CP_EINVAL (already registered). */
int cp_symbols_register_metrics(cp_symbols *sy, cp_metrics *r);

#endif
