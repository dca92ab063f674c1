/* The one ELF symbol layer: a bounds-checked walk of 64-bit little-endian ELF files (header,
 * section headers, string tables, the GNU build-id note, function symbols and which of
 * several aliases names an address, x86-64 PLT stubs and their relocations) over a reader
 * with two back ends, pread on a file descriptor (the agent: no mmap of the host's files,
 * reads bounded and chunked) and a memory buffer (contprofd's uploaded bytes). Used by
 * collector/elfnames.c and query/symtab.c, so the agent and the server give one address
 * the same name. libc only; no global state. A truncated, shrinking or hostile file gives
 * an error, never a fault. */
#ifndef CP_ELFREAD_H
#define CP_ELFREAD_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

enum {
    CP_SHT_PROGBITS = 1,
    CP_SHT_SYMTAB = 2,
    CP_SHT_STRTAB = 3,
    CP_SHT_RELA = 4,
    CP_SHT_NOTE = 7,
    CP_SHT_NOBITS = 8,
    CP_SHT_DYNSYM = 11,
};

/* One section header, decoded. */
typedef struct cp_elf_sec {
    uint32_t name, type, link;
    uint64_t addr, off, size, entsize;
} cp_elf_sec;

/* An open ELF file: its header and section headers, read once. Caller-allocated
 * (cp_elf_open_fd / cp_elf_open_mem, then cp_elf_close). */
typedef struct cp_elf {
    int fd;             /* the fd back end (not owned), or -1 */
    const uint8_t *mem; /* the memory back end (not owned, must outlive e), or NULL */
    uint64_t size;      /* the file's bytes */
    uint16_t machine, shnum, shstrndx, phnum;
    uint64_t phoff;
    cp_elf_sec *sec; /* shnum headers, malloc'd */
    char *names;     /* the section name table, NUL-terminated, malloc'd; NULL: unreadable */
    uint64_t names_len;
} cp_elf;

/* Opens the ELF of size bytes read with pread on fd (which stays the caller's), or the
 * bytes mem[0..len) (not copied: they must stay valid until cp_elf_close). Checks the
 * header (magic, 64-bit, little-endian, header sizes) and reads the section headers.
 * Returns 0, CP_EPARSE (err names the defect), CP_EIO, CP_ENOMEM. */
int cp_elf_open_fd(cp_elf *e, int fd, uint64_t size, cp_err *err);
int cp_elf_open_mem(cp_elf *e, const uint8_t *mem, size_t len, cp_err *err);

/* Frees what e holds (e may be half-open or closed). */
void cp_elf_close(cp_elf *e);

/* Copies len bytes at off into out; CP_EPARSE past the end, CP_EIO on a short read (a file
 * that shrank). */
int cp_elf_read(const cp_elf *e, uint64_t off, uint64_t len, void *out);

/* len bytes at off: a pointer into the buffer (memory back end) or into scratch (at least
 * len bytes), read with pread. NULL past the end or on a short read. */
const uint8_t *cp_elf_view(const cp_elf *e, uint64_t off, uint64_t len, void *scratch);

/* The whole section s as a NUL-terminated string table: *owned is malloc'd (the caller
 * frees; NULL when it points into the memory back end's bytes, already ending in a NUL).
 * Returns the table or NULL (empty, out of bounds, unreadable, out of memory: *rc says). */
const char *cp_elf_strtab(const cp_elf *e, const cp_elf_sec *s, char **owned, int *rc);

/* The name of section i ("" when unknown). */
const char *cp_elf_sec_name(const cp_elf *e, uint32_t i);

/* The server's strict check: a section name table, every section with bytes inside the
 * file, at least one program header. err names the first defect. 0 or CP_EPARSE. */
int cp_elf_check(const cp_elf *e, cp_err *err);

/* The GNU build ID (the first NT_GNU_BUILD_ID note of a SHT_NOTE section; the fd back end
 * reads a section's first 4 KiB), at most max bytes into out; *len its length. 0,
 * CP_ENOTFOUND, CP_ELIMIT (longer than max). */
int cp_elf_build_id(const cp_elf *e, uint8_t *out, uint32_t max, uint32_t *len);

/* The same from the PT_NOTE segments of the ELF file fd of size bytes, without reading its
 * section headers (the relay keys a running object's names by it): 0, CP_ENOTFOUND,
 * CP_ELIMIT, CP_EPARSE (not a 64-bit little-endian ELF, bad program headers). */
int cp_elf_build_id_fd(int fd, uint64_t size, uint8_t *out, uint32_t max, uint32_t *len);

/* ------------------------------------------------------------------------------------
 * Function symbols. Rules shared by the agent and the server (model/README.md "ELF
 * symbols"): STT_FUNC and STT_GNU_IFUNC symbols defined in a section, with a non-zero
 * address and a non-empty name; at one address the best names it: global, then weak, then
 * local; sized before sizeless; then the first in the symbol table. A sizeless symbol
 * reaches the next symbol's start (the last: to the top of the address space); a sized
 * one ends at its size or the next start, whichever comes first. A name's symbol version
 * ("memcpy@@GLIBC_2.14") is not part of it. */

/* A symbol section and its string section, checked. */
typedef struct cp_elf_symsec {
    cp_elf_sec sym, str;
} cp_elf_symsec;

/* Finds the first section of type (CP_SHT_SYMTAB or CP_SHT_DYNSYM) and its strings:
 * 0, CP_ENOTFOUND (none, or empty), CP_EPARSE (bad link, entry size, or outside the file),
 * CP_ELIMIT (bigger than max bytes). */
int cp_elf_symsec_find(const cp_elf *e, uint32_t type, uint64_t max, cp_elf_symsec *out);

/* One function symbol: [lo, hi) once finished (hi == lo + size while reading), its name's
 * offset in the string section, its rank (2 global, 1 weak, 0 local), sized. */
typedef struct cp_elf_func {
    uint64_t lo, hi;
    uint32_t name;
    uint8_t rank, sized;
} cp_elf_func;

/* Reads the function symbols of s in chunks of chunk symbols (a buffer of chunk * 24
 * bytes: the fd back end never holds the section whole) and calls fn(arg, &f) for each
 * eligible one starting at or below max_lo, in table order; fn returning non-zero stops
 * with that code. 0, or as cp_elf_read, CP_ENOMEM. */
int cp_elf_funcs_each(const cp_elf *e, const cp_elf_symsec *s, uint32_t chunk, uint64_t max_lo,
                      int (*fn)(void *arg, const cp_elf_func *f), void *arg);

/* 1 if a names an address better than b (same start), by the rules above. */
int cp_elf_func_better(const cp_elf_func *a, const cp_elf_func *b);

/* Reads every function of s into *out (malloc'd, the caller frees), sorted by start, one
 * per start (the best), with their final extents; strs is s's string table
 * (cp_elf_strtab), used to drop empty names. 0, CP_ENOTFOUND (no function), or as
 * cp_elf_funcs_each. */
int cp_elf_funcs_read(const cp_elf *e, const cp_elf_symsec *s, const char *strs, cp_elf_func **out,
                      uint32_t *n);

/* The length of a terminated name without its version ("memcpy@@GLIBC_2.14" -> 6; a
 * leading '@' is part of the name). */
size_t cp_elf_name_len(const char *nm);

/* The name at off of string section strs, read on its own (its end found within 64 KiB;
 * the section's last byte ends it, as in cp_elf_strtab), without its version: malloc'd
 * (the caller frees), or NULL (empty, unterminated, unreadable, out of memory). */
char *cp_elf_str_dup(const cp_elf *e, const cp_elf_sec *strs, uint64_t off);

/* ------------------------------------------------------------------------------------
 * x86-64 PLT stubs (model/elfplt.h), named `func@plt` as binutils does: the stub's `jmp
 * *GOT` slot, the JUMP_SLOT or GLOB_DAT relocation of that slot, its .dynsym symbol. */

#define CP_ELF_PLT_SECS 4

typedef struct cp_elf_plt_slot {
    uint64_t got;
    uint32_t sym;
} cp_elf_plt_slot;

/* The stub sections of an object and what names their stubs. */
typedef struct cp_elf_plt {
    const cp_elf *e;
    struct {
        uint64_t addr, off, size;
        uint32_t ent;
        int nobits; /* no bytes in this file (a debug file's): one unnamed range */
    } sec[CP_ELF_PLT_SECS];
    uint32_t nsec;
    cp_elf_sec rela[2], dynsym, dynstr; /* .rela.plt, .rela.dyn (type 0: none) */
    cp_elf_plt_slot *slot;              /* GOT slots with a symbol, sorted by slot */
    uint32_t nslot;
    int relocs_read;
    const uint8_t *dynsym_bytes; /* read whole when small (a pread per stub cost 10x) */
    const char *dynstr_bytes;
    uint8_t *dynsym_owned;
    char *dynstr_owned;
} cp_elf_plt;

/* Finds the stub sections of e (x86-64 only): 0, or CP_ENOTFOUND (none). p keeps e. */
int cp_elf_plt_open(cp_elf_plt *p, const cp_elf *e);

/* The longest stub name kept, with its NUL: a longer symbol name is cut (both readers
 * cut it alike). */
#define CP_ELF_PLT_NAME_MAX 4096

/* The name of the stub whose bytes are stub[0..n) at addr: writes "func@plt" into out
 * (cap bytes, at most CP_ELF_PLT_NAME_MAX; a longer name is cut) and returns 1; 0 when unknown
 * (CP_PLT_UNNAMED); CP_ENOMEM. Relocations are read at the first call. */
int cp_elf_plt_name(cp_elf_plt *p, const uint8_t *stub, size_t n, uint64_t addr, char *out,
                    size_t cap);

/* Frees what p holds (p may be half-open). */
void cp_elf_plt_close(cp_elf_plt *p);

/* The stubs of an object, alike in both readers: a section is cut into stubs of its entry
 * size (a partial stub at its end is none); a section is instead one unnamed stub over its
 * whole range when it is NOBITS, larger than CP_ELF_PLT_BYTES_MAX, has bytes past the end
 * of the file, or would bring the object past CP_ELF_PLT_STUBS_MAX stubs (sections in
 * table order). The last two bound what a hostile file costs (a stub is 24 bytes of
 * table, three times that while cp_elf_plt_partition runs). */
#define CP_ELF_PLT_BYTES_MAX ((uint64_t)4 << 20)
#define CP_ELF_PLT_STUBS_MAX (1u << 17)

/* 1 when stub section k of p is one unnamed stub over its range (see above). */
int cp_elf_plt_sec_whole(const cp_elf_plt *p, uint32_t k);

/* One stub for cp_elf_plt_partition: [lo, hi), a name of the caller's (any tag), and its
 * rank at one start (CP_ELF_PLT_RANK: lower wins). */
typedef struct cp_elf_plt_range {
    uint64_t lo, hi;
    uint32_t name, rank;
} cp_elf_plt_range;
#define CP_ELF_PLT_RANK(named, sec) ((named) ? 0u : 1u << 31 | (uint32_t)(sec))

/* Stub sections overlap only in a damaged or hostile file; then an address is the stub's
 * that starts last at or below it among the stubs covering it, and at one start the lower
 * rank's (a named stub before "[plt]", then the earlier section). Sorts v[0..n) and writes
 * to *out (malloc'd, *nout entries, at most 2n) the partition that rule makes of what the
 * stubs cover: sorted, no two overlapping, each piece one stub's name and rank. Returns 0
 * or CP_ENOMEM. */
int cp_elf_plt_partition(cp_elf_plt_range *v, uint32_t n, cp_elf_plt_range **out, uint32_t *nout);

#endif
