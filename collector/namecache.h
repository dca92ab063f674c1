/* The host's name cache (collector/relay/README.md "Names"): one file per object and
 * debug-file choice in the relay's DIR/names/, holding the function names elfnames.c would
 * give for that build id as one sorted table, so a process names its frames with a binary
 * search in a read-only mapping instead of reading ELF symbol tables. The relay writes the
 * files (cp_namecache_encode, cp_namecache_write); the agent maps and reads them
 * (cp_namecache_dir_open, cp_namecache_open, cp_namecache_lookup).
 *
 * File (little-endian), never modified once renamed into place:
 *   header (96 bytes): magic "CPNAMES\0", u32 version (1), u8 build id length, u8 flags
 *     (CP_NAMECACHE_DEBUG: names as read with the separate debug directory), u8 source
 *     (CP_ELFNAMES_*), u8 0, u32 functions, u32 PLT stubs, u32 bytes of names, u32 0,
 *     build id (64 bytes, zero padded);
 *   entries, 16 bytes each, the functions then the PLT stubs, each run sorted by start:
 *     u64 start, u32 size (CP_NAMECACHE_TO_NEXT: up to the next entry's start, the end of
 *     the address space for the last), u32 offset of its name;
 *   names: NUL-terminated, the last byte of the file a NUL.
 * A name is what cp_elfnames_lookup gives (its *len bytes: no symbol version; a stub's
 * "func@plt"). A PLT stub holding an address wins over a function, as in elfnames.c. */
#ifndef CP_NAMECACHE_H
#define CP_NAMECACHE_H

#include <stddef.h>
#include <stdint.h>

#include "elfnames.h"
#include "error.h"
#include "vec.h"

#define CP_NAMECACHE_DIR "names"
#define CP_NAMECACHE_VERSION 1u
#define CP_NAMECACHE_HEADER 96u
#define CP_NAMECACHE_ENTRY 16u
#define CP_NAMECACHE_ID_MAX 64u
#define CP_NAMECACHE_TO_NEXT UINT32_MAX
/* Flags of a file (and of an 'N' frame): the debug directory (CP_NAMECACHE_DEBUG_DIR) was
 * looked in for a separate debug file, as the agent does unless CONTPROF_DEBUGINFO=0. */
#define CP_NAMECACHE_DEBUG 1u
#define CP_NAMECACHE_DEBUG_DIR "/usr/lib/debug"
/* A file bigger than this is neither written nor mapped. */
#define CP_NAMECACHE_FILE_MAX ((size_t)64 << 20)
/* The longest file name cp_namecache_key writes, with its NUL. */
#define CP_NAMECACHE_KEY_MAX (2 * CP_NAMECACHE_ID_MAX + 16)

/* A cache file mapped (or any validated bytes: cp_namecache_parse). */
typedef struct cp_namecache {
    const uint8_t *base; /* the whole file */
    size_t size;
    int mapped; /* base is an mmap of size bytes (cp_namecache_close unmaps) */
    uint32_t nfunc, nplt, strs_len;
    int source; /* CP_ELFNAMES_* of the names */
} cp_namecache;

/* The file name of an object's names: the build id in hex, "-nodebug" after it when flags
 * lack CP_NAMECACHE_DEBUG. Returns 0, or CP_EINVAL for a build id under 2 or over
 * CP_NAMECACHE_ID_MAX bytes (such objects are not cached). out holds CP_NAMECACHE_KEY_MAX. */
int cp_namecache_key(const uint8_t *build_id, uint32_t len, unsigned flags, char *out);

/* Checks n bytes at p as a cache file for build_id (len bytes) and flags: the header, the
 * sizes adding up to n, the build id and flags equal, the last byte a NUL, every entry's
 * name offset inside the names, the starts of each run ascending (an entry with an empty
 * name names nothing: cp_namecache_lookup). Returns 0 with
 * *out (pointing into p, not owning it), or CP_EPARSE (the file is not used at all). */
int cp_namecache_parse(const uint8_t *p, size_t n, const uint8_t *build_id, uint32_t len,
                       unsigned flags, cp_namecache *out);

/* The name of the function (or PLT stub) holding vaddr (the object's own numbering), or
 * NULL: the first *len bytes at the result (NUL-terminated there). Valid until
 * cp_namecache_close. Async-signal-safe, no allocation. */
const char *cp_namecache_lookup(const cp_namecache *c, uint64_t vaddr, size_t *len);

/* ------------------------------------------------------------------------------------
 * The agent's side */

/* Opens DIR/names (relay_dir: the relay's directory) for reading, O_NOFOLLOW, and refuses
 * (CP_EIO, err naming the reason) a link, something not a directory, one owned by neither
 * root nor the effective user, and one its group or others may write. Returns 0 with *dfd
 * (close-on-exec; the caller closes it). */
int cp_namecache_dir_open(const char *relay_dir, int *dfd, cp_err *err);

/* Checks DIR/names (relay_dir: the relay's directory) as cp_namecache_dir_open does, with
 * one lstat and no fd. Returns 0, CP_ENOTFOUND (no such path) or CP_EIO (refused, err naming
 * why). */
int cp_namecache_dir_check(const char *relay_dir, cp_err *err);

/* cp_namecache_open of the file in DIR/names (a directory cp_namecache_dir_check took) by
 * its path: one open instead of two (only root or the relay may change DIR/names). */
int cp_namecache_open_path(const char *relay_dir, const uint8_t *build_id, uint32_t len,
                           unsigned flags, cp_namecache *out);

/* Maps the file of build_id/flags in the names directory dfd read-only and checks it as
 * cp_namecache_parse does; the file must be regular, not a link, owned by root or the
 * effective user, writable by neither group nor others. Returns 0 with *out
 * (cp_namecache_close), CP_ENOTFOUND (no file), CP_EPARSE (a file refused) or CP_EIO. */
int cp_namecache_open(int dfd, const uint8_t *build_id, uint32_t len, unsigned flags,
                      cp_namecache *out);

/* Unmaps c (if mapped) and zeroes it; a zeroed one is fine. */
void cp_namecache_close(cp_namecache *c);

/* ------------------------------------------------------------------------------------
 * The relay's side */

/* Appends to out the file for table t (cp_elfnames_create of the object with build_id and
 * flags). Returns 0, CP_EINVAL (a build id not cacheable), CP_ELIMIT (a function over 4 GiB
 * that does not reach the next one, or a file over CP_NAMECACHE_FILE_MAX) or CP_ENOMEM. */
int cp_namecache_encode(const cp_elfnames *t, const uint8_t *build_id, uint32_t len, unsigned flags,
                        cp_buf *out);

/* Writes data (len bytes) as the file name in the names directory dfd: a `.tmp-*` file
 * (0644) renamed into place, so a reader maps the old file or the whole new one. Returns 0 or
 * CP_EIO with err naming the file. */
int cp_namecache_write(int dfd, const char *name, const uint8_t *data, size_t len, cp_err *err);

/* Reads the GNU build id of the ELF file fd (size fsize) from its note segments into out
 * (CP_NAMECACHE_ID_MAX bytes): 0 with *len, or CP_ENOTFOUND / CP_EPARSE. */
int cp_namecache_file_build_id(int fd, uint64_t fsize, uint8_t *out, uint32_t *len);

#endif
