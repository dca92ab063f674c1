/* The store's whole on-disk format: every LevelDB key and value the store writes, in one
 * place, with its version. Change anything here and bump CP_STORE_FORMAT_VERSION; a store
 * written with another version is refused at open with a message that says so.
 *
 * Keys are built for LevelDB's byte order. Every tenant key starts with the tenant name
 * and a NUL byte, so nothing of one tenant sits between keys of another and a tenant's
 * data is one contiguous key range. Global keys start with a NUL byte (the empty tenant,
 * which no envelope may carry).
 *
 *   \0 'V'                                  -> format record      (global)
 *   \0 'O' topic \0 partition:be32          -> next offset        (global, ingest)
 *   \0 'K' tenant \0 capture id             -> capture record     (global, the API)
 *   T \0 'B' series:be32 level:u8 start:be64b -> block             (time buckets)
 *   T \0 'C' series:be32 producer           -> block               (last cumulative input)
 *   T \0 'D' kind:u8 id:be32                -> dictionary entry    (kind 'f','k','l','m','s')
 *   T \0 'L' name \0 value \0 series:be32   -> empty               (label index)
 *   T \0 'P' producer                       -> producer record     (duplicate detection)
 *   T \0 'S' series:be32                    -> series record
 *   T \0 'W' series:be32 start:be64b         -> capture window     (series with `capture`)
 *   T \0 'Y' build_id (lowercase hex)       -> symbol table        (uploaded symbols)
 *   T \0 'Y' "js:" script basename          -> source map JSON     (uploaded source maps)
 *
 * be32/be64 are big-endian; be64b is a signed time in unix nanoseconds with the sign bit
 * flipped, so byte order is time order. Values use LEB128 varints ("uv"), zigzag varints
 * for signed numbers ("sv") and length-prefixed byte strings ("str" = uv len, bytes). */
#ifndef CP_STORE_FORMAT_H
#define CP_STORE_FORMAT_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "wire.h" /* the one varint reader and writer */

#define CP_STORE_FORMAT_VERSION 2
/* The oldest version still read. Version 1 stored mappings and locations with the run-time
 * addresses of the process that sent them; from 2 on, a mapping of an object (build ID or
 * file, model/profile.h) is stored in canonical form, start = file offset, and its
 * locations' addresses are file offsets. A version-1 store is read both ways: its entries
 * are canonicalized in memory at every open (store/dict.c, cp_dict_canonicalize), new
 * entries are written canonical, and the record stays 1 (the old entries stay on disk). */
#define CP_STORE_FORMAT_OLDEST 1
#define CP_STORE_FORMAT_MAGIC "contprof-store"
#define CP_TENANT_KEY_MAX 64 /* bytes of tenant name in a key (= CP_TENANT_MAX) */

/* Format record value: MAGIC (14 bytes), then be32 version. */

/* --- key types ---------------------------------------------------------------------- */
#define CP_K_VERSION 'V'
#define CP_K_OFFSET 'O'
#define CP_K_BLOCK 'B'
#define CP_K_CUMUL 'C'
#define CP_K_DICT 'D'
#define CP_K_LABEL 'L'
#define CP_K_PRODUCER 'P'
#define CP_K_SERIES 'S'
#define CP_K_SYMBOLS 'Y'
#define CP_K_CAPTURE 'K'
#define CP_K_CAPWIN 'W'

/* Capture record ('K', global so that a restart finds every tenant's): the Capture message
 * of model/capture.h as cp_capture_encode writes it, unsigned; its latest state (a cancel
 * rewrites it). Written by the API (POST/DELETE /api/v1/captures) as one synced put.
 * Capture window ('W'): one per stored window of a series carrying the `capture` label,
 * written by the writer in the batch of the window itself (so exactly once):
 *   sv window duration ns, uv samples (the sum of the first sample type), str engine.
 * Both added without a version bump: older code ignores key types it does not seek.
 * Retention (retention.c) removes a series' 'W' records with its windows in the longest-kept
 * level, and a 'K' record once its capture ended before that level's oldest window. */

/* Symbol table ('Y'): the compact table of one ELF object, as query/symtab.c writes and
 * reads it (the layout is described there; it starts with the magic "CPSYMT01"). Written
 * by `POST /api/v1/symbols` as one synced put, replaced by a new upload of the same build
 * ID, never written by ingest. Added without a version bump: older code ignores the key
 * type (it only seeks to the types it knows). At most symbols.max_table_bytes each.
 * A source map is kept as uploaded (its JSON, starting with '{') under the id "js:" and
 * the basename of the script it maps (query/symbols.h); ids never clash (':' is no hex). */
#define CP_SYMBOLS_ID_MAX 128 /* hex digits of a build ID in a key */

/* Dictionary kinds (the byte after 'D'). Ids start at 1 in each kind; string id 0 is ""
 * and is never stored.
 *   's' string:   the bytes
 *   'f' function: uv name, uv system_name, uv filename (string ids), sv start_line
 *   'm' mapping:  uv start, uv limit, uv offset, uv filename, uv build_id, uv flags
 *                 (an object's: start = offset, limit = offset + size; see the version)
 *   'l' location: uv mapping id (0 none), uv address (file offset in an object's mapping),
 *                 uv is_folded, uv nlines,
 *                 nlines x (uv function id, sv line)     -- leaf (inlined) line first
 *   'k' stack:    uv nlocs, nlocs x uv location id (leaf first), uv nlabels,
 *                 nlabels x (uv key, uv str, sv num, uv num_unit)  -- pprof sample labels
 * A stack is a distinct (locations, sample labels) pair: a block refers to it by id. */
#define CP_D_STRING 's'
#define CP_D_FUNCTION 'f'
#define CP_D_MAPPING 'm'
#define CP_D_LOCATION 'l'
#define CP_D_STACK 'k'

/* Series ids start at 1 and grow; retention deletes every key of a series whose windows are
 * all past retention (record, label index, 'C', 'W') in one write, so ids have gaps. Added
 * without a version bump: code before it (which wanted ids without gaps) refuses such a
 * store at open, naming the series ("series N where M expected").
 * Series record ('S'): uv kind, uv nlabels, nlabels x (str name, str value),
 * uv ntypes, ntypes x (str type, str unit), str period_type, str period_unit, sv period,
 * sv first_ns, sv last_ns (window starts), uv windows (count ingested). */

/* Producer record ('P'): uv high-water sequence, 4 x u64le bitmap of the 256 sequences
 * below it (bit i set = hwm-1-i seen), sv last_seen_ns (the latest window start). Absent =
 * nothing seen yet, or retention deleted it (last_seen_ns before every level's cut). */

/* Block value ('B', 'C'): u8 codec (CP_BLOCK_RAW or CP_BLOCK_LZ4), uv raw length, then the
 * (compressed) payload:
 *   sv time_ns      inuse: start of the snapshot's window; cpu/alloc: earliest start
 *   uv windows      windows merged into it
 *   uv ntypes, ntypes x (uv divisor (every value of the column is a multiple of it),
 *                        sv total of the column)
 *   uv nentries, nentries x (uv stack id delta from the previous entry, ntypes x sv value/divisor)
 * Entries are sorted by stack id. Values of cpu/alloc blocks are sums; of inuse blocks the
 * snapshot itself. */
#define CP_BLOCK_RAW 0
#define CP_BLOCK_LZ4 1
#define CP_BLOCK_MAX_RAW (256u << 20)

/* --- levels ------------------------------------------------------------------------
 * Level 0 holds each ingested window under its exact start. Level L>0 holds one block per
 * aligned bucket of cp_level_ns[L] (UTC-aligned): the sum (cpu, alloc) or the latest
 * snapshot (inuse) of the windows whose start lies in the bucket. */
#define CP_NLEVELS 5
static const int64_t cp_level_ns[CP_NLEVELS] = {0, 60LL * 1000000000, 600LL * 1000000000,
                                                3600LL * 1000000000, 86400LL * 1000000000};

/* --- encoding helpers ------------------------------------------------------------- */
static inline void cp_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}
static inline uint32_t cp_get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline void cp_put_be64(uint8_t *p, uint64_t v)
{
    cp_put_be32(p, (uint32_t)(v >> 32));
    cp_put_be32(p + 4, (uint32_t)v);
}
static inline uint64_t cp_get_be64(const uint8_t *p)
{
    return (uint64_t)cp_get_be32(p) << 32 | cp_get_be32(p + 4);
}
/* Signed time -> order-preserving unsigned. */
static inline uint64_t cp_time_key(int64_t t)
{
    return (uint64_t)t ^ (1ULL << 63);
}
static inline int64_t cp_time_unkey(uint64_t k)
{
    return (int64_t)(k ^ (1ULL << 63));
}

static inline uint64_t cp_zz(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}
static inline int64_t cp_unzz(uint64_t v)
{
    return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}

/* Appends a varint at p (room for 10 bytes); returns the new end. */
static inline uint8_t *cp_put_uv(uint8_t *p, uint64_t v)
{
    return wr_varint(p, v);
}

/* A bounds-checked reader: every get sets r->bad instead of reading past the end. */
typedef struct cp_rd {
    const uint8_t *p, *end;
    int bad;
} cp_rd;

static inline uint64_t cp_get_uv(cp_rd *r)
{
    rd w = {r->p, r->end};
    uint64_t v;
    if (rd_varint(&w, &v)) {
        r->bad = 1;
        return 0;
    }
    r->p = w.p;
    return v;
}
static inline int64_t cp_get_sv(cp_rd *r)
{
    return cp_unzz(cp_get_uv(r));
}
/* Reads a length-prefixed string; returns a pointer into the buffer (not NUL-terminated). */
static inline const uint8_t *cp_get_str(cp_rd *r, size_t *len)
{
    uint64_t n = cp_get_uv(r);
    if (r->bad || n > (uint64_t)(r->end - r->p)) {
        r->bad = 1;
        *len = 0;
        return NULL;
    }
    const uint8_t *s = r->p;
    r->p += n;
    *len = (size_t)n;
    return s;
}

#endif
