/* Function names from an object's ELF symbol table, without libdw: the function symbols of
 * the separate debug file's .symtab (/usr/lib/debug/.build-id/xx/yyyy.debug), else the
 * object's .symtab, else its .dynsym, kept as one sorted array searched per address, by the
 * rules the server's tables share (model/elfread.h, model/README.md "ELF symbols"). Files
 * are read with pread into memory and every read is bounds-checked: a truncated, shrinking
 * or hostile file gives no table, never a fault. Agent thread only. */
#ifndef CP_ELFNAMES_H
#define CP_ELFNAMES_H

#include <stddef.h>
#include <stdint.h>

/* Where the names of a table came from. */
enum { CP_ELFNAMES_DEBUG_SYMTAB = 1, CP_ELFNAMES_SYMTAB = 2, CP_ELFNAMES_DYNSYM = 3 };

/* A symbol table bigger than this is not read (the next source is tried): it bounds what
 * one object can cost the host. */
#define CP_ELFNAMES_MAX_SECTION ((uint64_t)64 << 20)

typedef struct cp_elfnames cp_elfnames;

/* Reads the function symbols of the object at path. debug_dir (may be NULL: none) is the
 * root of the separate debug files by build id ("/usr/lib/debug"): with build_id (len
 * bytes, may be 0), debug_dir/.build-id/xx/yyyy.debug is tried first. Returns 0 with *out
 * (free with cp_elfnames_destroy), CP_ENOTFOUND when no source has a function symbol,
 * CP_EPARSE for a file that is not a 64-bit little-endian ELF or is damaged, CP_ENOMEM. */
int cp_elfnames_create(const char *path, const uint8_t *build_id, uint32_t build_id_len,
                       const char *debug_dir, cp_elfnames **out);

/* The name of the function holding vaddr (an address of the object's own numbering: a
 * run-time pc minus the load bias), or NULL. The name is the first *len bytes (a symbol
 * version, "@@GLIBC_2.34", follows it when there is one). Valid until
 * cp_elfnames_destroy. */
const char *cp_elfnames_lookup(const cp_elfnames *t, uint64_t vaddr, size_t *len);

/* Names the n addresses vaddrs (strictly ascending, the object's own numbering) from the
 * same source as cp_elfnames_create would use, with one pass over its symbols and no table
 * kept: cheaper than a table for a few addresses of a process that names them once.
 * Writes names[i], malloc'd (the caller frees) or NULL where no function holds the
 * address; the same names a table gives; *source (may be NULL) the CP_ELFNAMES_* they came
 * from. Returns 0, CP_EINVAL (not ascending), or as cp_elfnames_create (then every
 * names[i] is NULL). */
int cp_elfnames_scan(const char *path, const uint8_t *build_id, uint32_t build_id_len,
                     const char *debug_dir, const uint64_t *vaddrs, uint32_t n, char **names,
                     int *source);

/* The number of PLT stub entries of t (contiguous stubs of one name, a run of "[plt]",
 * count once). */
uint32_t cp_elfnames_plt_count(const cp_elfnames *t);

/* Entry i of t's functions (plt 0: i < cp_elfnames_count, by start) or PLT stubs (plt 1):
 * [*lo, *hi) and the name cp_elfnames_lookup gives for an address in it (the first *len
 * bytes of *name). Returns 0, or CP_EINVAL for i past the end. Valid until
 * cp_elfnames_destroy. */
int cp_elfnames_entry(const cp_elfnames *t, int plt, uint32_t i, uint64_t *lo, uint64_t *hi,
                      const char **name, size_t *len);

/* Which source the names came from (CP_ELFNAMES_*), the number of functions, and the bytes
 * the table holds. */
int cp_elfnames_source(const cp_elfnames *t);
uint32_t cp_elfnames_count(const cp_elfnames *t);
size_t cp_elfnames_bytes(const cp_elfnames *t);

/* Frees t (may be NULL). */
void cp_elfnames_destroy(cp_elfnames *t);

#endif
