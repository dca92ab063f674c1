/* Private to store/: the stack accumulator and block codec (block.c) and the per-tenant
 * dictionaries (dict.c) that store.c builds on. Nothing outside store/ includes this. */
#ifndef CP_STORE_INT_H
#define CP_STORE_INT_H

#include <stdint.h>
#include <leveldb/c.h>

#include "error.h"
#include "format.h"
#include "profile.h"
#include "vec.h"

#define CP_MAX_TYPES 16 /* sample types per series */

/* --- accumulator: stack id -> one row of ntypes values ------------------------------ */
typedef struct cp_acc {
    uint32_t ntypes;
    CP_VEC(uint32_t) ids; /* stack ids in insertion order */
    CP_VEC(int64_t) vals; /* ids.n * ntypes */
    uint64_t *slots;      /* open addressing: stack id << 32 | (row + 1), 0 = empty */
    uint32_t nslots;
    int64_t time_ns; /* see the block format */
    uint64_t windows;
} cp_acc;

void cp_acc_init(cp_acc *a, uint32_t ntypes);
void cp_acc_close(cp_acc *a);
/* Empties a, keeping its memory, and sets its width. */
void cp_acc_reset(cp_acc *a, uint32_t ntypes);
/* The row of stack id (a zero row is added if missing); NULL on out of memory. The pointer
 * is valid until the next call that adds a row. */
int64_t *cp_acc_row(cp_acc *a, uint32_t id);
/* Room for nrows rows in all (no rehash or growth until then); CP_ENOMEM. */
int cp_acc_reserve(cp_acc *a, uint32_t nrows);
/* dst += factor * src (the columns both have). */
int cp_acc_add(cp_acc *dst, const cp_acc *src, int64_t factor);
/* dst = copy of src. */
int cp_acc_copy(cp_acc *dst, const cp_acc *src);
/* Exchanges the contents (rows, memory, width, time, windows) of a and b. */
void cp_acc_swap(cp_acc *a, cp_acc *b);
/* dst, which holds no rows, takes src's rows (their memory, width, time, windows) without
 * a copy; src is left empty, keeping its slot table (zeroed) for the next rows. dst gets
 * no slot table: the next cp_acc_row/_add/_reserve on it builds one from its rows. */
void cp_acc_take(cp_acc *dst, cp_acc *src);

static inline int64_t cp_add_wrap(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

/* Encodes a as a block (entries sorted by stack id, lz4'd) appended to out. */
int cp_block_encode(cp_acc *a, cp_buf *out);

/* Iterates the entries of a stored block; scratch holds the decompressed payload. */
typedef struct cp_block_it {
    cp_rd r;
    int64_t time_ns;
    uint64_t windows;
    uint32_t ntypes;
    uint64_t div[CP_MAX_TYPES];
    int64_t total[CP_MAX_TYPES];
    uint64_t left;
    uint32_t id;
} cp_block_it;

/* Returns 0, or CP_ESTORE (err says what is corrupt) for a damaged block. */
int cp_block_it_init(cp_block_it *it, const uint8_t *v, size_t len, cp_buf *scratch, cp_err *err);
/* 1 and the next entry (vals gets ntypes values), 0 at the end, CP_ESTORE if corrupt. */
int cp_block_it_next(cp_block_it *it, uint32_t *id, int64_t *vals);
/* Decodes a whole block into a (reset to the block's width). */
int cp_block_load(cp_acc *a, const uint8_t *v, size_t len, cp_buf *scratch, cp_err *err);

/* --- dictionaries -------------------------------------------------------------------- */

/* An id hash: slots hold id (nonzero), hashes kept alongside to skip most compares. */
typedef struct cp_idx {
    uint32_t *ids;
    uint64_t *hs;
    uint32_t nslots, n;
} cp_idx;

/* Per-tenant dictionaries: ids are index + 1 (strings: index, with 0 = ""). Append-only;
 * the writer appends under the store's write lock, readers read under its read lock. */
typedef struct cp_dict {
    char *sbuf;
    size_t slen, scap;
    CP_VEC(uint32_t) soff; /* string i is sbuf[soff[i] .. soff[i+1]-1), NUL after it */
    CP_VEC(cp_function) fn;
    CP_VEC(cp_mapping) map;
    CP_VEC(cp_location) loc;
    CP_VEC(cp_line) lines;
    CP_VEC(cp_sample) stk; /* loc_off/nlocs into stk_locs, label_off/nlabels into stk_labels */
    CP_VEC(uint32_t) stk_locs;
    CP_VEC(cp_label) stk_labels;
    cp_idx si, fi, mi, li, ki;
    cp_idx ai; /* (mapping, address) -> locations, for cp_dict_location_known */
    /* Format-1 stores only (cp_dict_canonicalize): stack id -> the first stack equal to it
     * once its locations are canonical, for ids < nstk_alias. Set at open, then read
     * without the lock (never changed or moved while the store is open). */
    uint32_t *stk_alias, nstk_alias;
    /* Where new entries are written (set by the writer for the current batch). */
    leveldb_writebatch_t *wb;
    const char *tenant;
    size_t tenant_len;
} cp_dict;

int cp_dict_init(cp_dict *d);
void cp_dict_close(cp_dict *d);

static inline const char *cp_dict_str(const cp_dict *d, uint32_t id, size_t *len)
{
    if ((size_t)id + 1 >= d->soff.n) { /* (a corrupt id may be UINT32_MAX) */
        *len = 0;
        return "";
    }
    *len = d->soff.v[id + 1] - d->soff.v[id] - 1;
    return d->sbuf + d->soff.v[id];
}

/* Intern functions: find or add (writing the new entry to d->wb); id through *id. */
int cp_dict_string(cp_dict *d, const char *s, size_t len, uint32_t *id);
int cp_dict_function(cp_dict *d, const cp_function *f, uint32_t *id);
int cp_dict_mapping(cp_dict *d, const cp_mapping *m, uint32_t *id);
int cp_dict_location(cp_dict *d, const cp_location *l, const cp_line *lines, uint32_t *id);
int cp_dict_stack(cp_dict *d, const uint32_t *locs, uint32_t nlocs, const cp_label *labels,
                  uint32_t nlabels, uint32_t *id);

/* The fast path for a location of profile p whose mapping is dict mapping mid and whose
 * canonical address is address: a dict location with the same mapping and address whose lines and
 * functions have the same content (compared, not hashed). smap (profile string id -> dict id + 1,
 * sized for p's strings) and fmap (profile function id -> dict id, sized functions + 1) cache what
 * is known equal, as the interning path does. Returns 1 and *id, or 0 (intern it normally). */
int cp_dict_location_known(const cp_dict *d, const cp_profile *p, const cp_location *l,
                           uint32_t mid, uint64_t address, uint32_t *smap, uint32_t *fmap,
                           uint32_t *id);

/* Loads one stored entry ('D' key after the tenant prefix: kind, be32 id) at open. Entries
 * must come in id order per kind. */
int cp_dict_load(cp_dict *d, uint8_t kind, uint32_t id, const uint8_t *v, size_t len, cp_err *err);

/* After loading a format-1 store's dictionary (whose mappings and locations may hold
 * run-time addresses): puts every mapping and location in canonical form (profile.h),
 * points locations at the first of equal mappings and stacks at the first of equal
 * locations, rebuilds the indexes so new windows find those, and sets stk_alias for the
 * stacks that became equal to an earlier one. Idempotent. Returns 0 or
 * CP_ENOMEM (the dictionary is then unusable: close it). */
int cp_dict_canonicalize(cp_dict *d);
/* --- write-ahead logs (wal.c) --------------------------------------------------------- */

#define WAL_BLOCK_BYTES 32768 /* LevelDB's log block */

/* What a scan of one LevelDB log found. */
typedef struct cp_wal_report {
    char file[32];    /* "000123.log" */
    uint64_t size;    /* bytes */
    uint64_t records; /* complete writes (one per committed batch) before any damage */
    int corrupt;      /* a damaged record at bad_at: what says how */
    uint64_t bad_at;
    char what[48];
    uint64_t tail; /* bytes of an unfinished write at the end (dropped by LevelDB) */
} cp_wal_report;

/* Scans every NNNNNN.log in dir (at most max) into out; *n gets the count. A missing
 * directory is no log. CP_EIO if a file cannot be read. */
int cp_wal_scan(const char *dir, cp_wal_report *out, uint32_t max, uint32_t *n, cp_err *err);

/* Before opening: CP_ESTORE naming the log, the place and the fix (`contprofd --repair`) if a
 * log holds a damaged record; a warning in the log with the bytes dropped if one ends inside
 * a write. 0 otherwise. */
int cp_wal_check(const char *dir, cp_err *err);

typedef struct cp_wal_salvage_stats {
    uint64_t writes_kept, writes_dropped; /* writes dropped whole (known to be lost) */
    uint64_t damaged;                     /* damaged fragments (each loses its block's rest) */
    uint64_t bytes_dropped;
} cp_wal_salvage_stats;

/* Rewrites log file (in dir) with only its intact writes, each whole, and moves the
 * original to dir/lost/FILE.damaged. LevelDB's repair reads logs without checksums: a
 * byte-flipped write would be replayed as it is, so repair salvages first. */
int cp_wal_salvage(const char *dir, const char *file, cp_wal_salvage_stats *st, cp_err *err);

#endif
