/* Symbol tables for server-side symbolization: an ELF binary or separate debug file (read
 * with model/elfread.h, the agent's symbol layer, then libdw for lines and inlines) becomes one
 * compact, self-contained table keyed by the file's GNU build ID, which names any file offset of
 * that object: function, source line and inlined calls. The table is a flat byte string,
 * so the store keeps it as one value and a reader answers lookups from it in place. */
#ifndef CP_QUERY_SYMTAB_H
#define CP_QUERY_SYMTAB_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "vec.h"

#define CP_BUILD_ID_HEX_MAX 128 /* hex digits of the longest build ID accepted (64 bytes) */
#define CP_SYMTAB_MAX_FRAMES 16 /* frames of one address: the function and its inlines */

/* Reads the ELF image elf[0..len) (the caller's bytes, not retained; libdw may rewrite a
 * compressed section's header in them, so build once per copy) and
 * appends its table to out; build_id gets the lowercase hex build ID. Returns 0;
 * CP_EPARSE when the input is not usable, err naming the problem ("not an ELF file",
 * "truncated ELF: ...", "no GNU build ID note", "no function symbols"); CP_ELIMIT when the
 * table would exceed max_table bytes (err says how large it got); CP_ENOMEM. */
int cp_symtab_build(const uint8_t *elf, size_t len, size_t max_table, cp_buf *out,
                    char build_id[CP_BUILD_ID_HEX_MAX + 1], cp_err *err);

/* 1 if id is a build ID as cp_symtab_build writes it: 2..CP_BUILD_ID_HEX_MAX lowercase hex
 * digits, an even count. Anything else (a profile's mapping says what it likes) is never
 * looked up, and never becomes part of a path (issue 36: "../../tmp/x/evil"). */
int cp_symtab_build_id_valid(const char *id);

/* A table opened in place over its bytes (which must stay valid while it is used). */
typedef struct cp_symtab {
    const uint8_t *segs, *funcs, *inls, *lines;
    const char *strs;
    uint32_t nseg, nfunc, ninl, nline, strbytes;
} cp_symtab;

/* Checks blob (as stored) and opens it. Returns 0 or CP_ESTORE (err says what is wrong). */
int cp_symtab_open(cp_symtab *t, const uint8_t *blob, size_t len, cp_err *err);

/* Counts of what a table holds, for answers and logs. */
typedef struct cp_symtab_info {
    uint32_t functions, inlines, lines, segments;
} cp_symtab_info;
/* Fills out with the counts of table t. */
void cp_symtab_info_get(const cp_symtab *t, cp_symtab_info *out);

/* One frame of an address: name, source file ("" if unknown) and line (0 if unknown);
 * pointers into the table. */
typedef struct cp_symframe {
    const char *name, *file;
    int64_t line;
} cp_symframe;

/* Names the instruction at file_offset of the object (address - mapping start + mapping
 * offset): fills out[0..max) leaf (innermost inlined call) first and returns the count;
 * 0 when the offset lies in no loadable segment or no function. */
uint32_t cp_symtab_lookup(const cp_symtab *t, uint64_t file_offset, cp_symframe *out, uint32_t max);

/* The name of the function whose range holds va, an address as the object's symbols give
 * it (no segment applied: what the agent's tables are searched by), or NULL. */
const char *cp_symtab_function_at(const cp_symtab *t, uint64_t va);

#endif
