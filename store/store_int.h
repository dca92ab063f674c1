/* Private to store/: the stack accumulator and block codec (block.c), the per-tenant
 * dictionaries (dict.c), the in-memory tables that the store's lifecycle (store.c), writer
 * (write.c), readers (read.c) and retention (retention.c) share, and the write-ahead log
 * checks (wal.c). Nothing outside store/ includes this. */
#ifndef CP_STORE_INT_H
#define CP_STORE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <leveldb/c.h>

#include "check.h"
#include "error.h"
#include "format.h"
#include "pprof.h"
#include "profile.h"
#include "store.h"
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
/* Room for nrows rows in all (no rehash or growth until then); CP_ENOMEM. */
int cp_acc_reserve(cp_acc *a, uint32_t nrows);

static inline uint32_t cp_acc_hash(uint32_t id)
{
    return id * 2654435761u;
}

/* Appends a zero row for id, with room already reserved for it (no slot is set). */
static inline int64_t *cp_acc_append_zero(cp_acc *a, uint32_t id)
{
    a->ids.v[a->ids.n++] = id;
    int64_t *row = a->vals.v + a->vals.n;
    if (a->ntypes == 2) { /* the common width, without a call to memset per row */
        row[0] = 0;
        row[1] = 0;
    } else {
        for (uint32_t t = 0; t < a->ntypes; t++)
            row[t] = 0;
    }
    a->vals.n += a->ntypes;
    return row;
}

/* The probe and append of a row, with room already reserved for it. A slot holds the id
 * next to the row number, so a probe reads one word. */
static inline int64_t *cp_acc_row_reserved(cp_acc *a, uint32_t id)
{
    uint32_t mask = a->nslots - 1, h = cp_acc_hash(id) & mask;
    for (uint64_t sl; (sl = a->slots[h]); h = (h + 1) & mask)
        if ((uint32_t)(sl >> 32) == id) return a->vals.v + (size_t)((uint32_t)sl - 1) * a->ntypes;
    int64_t *row = cp_acc_append_zero(a, id);
    a->slots[h] = (uint64_t)id << 32 | a->ids.n;
    return row;
}

/* The row of stack id (a zero row is added if missing); NULL on out of memory. The pointer
 * is valid until the next call that adds a row. Inline: ingest calls it for every sample
 * of every window. */
static inline int64_t *cp_acc_row(cp_acc *a, uint32_t id)
{
    if (((a->ids.n + 1) * 2 > a->nslots || a->ids.n == a->ids.cap ||
         a->vals.n + a->ntypes > a->vals.cap) &&
        cp_acc_reserve(a, a->ids.n + 1))
        return NULL; /* (the arrays grow by doubling) */
    return cp_acc_row_reserved(a, id);
}
/* dst += factor * src (the columns both have). */
int cp_acc_add(cp_acc *dst, const cp_acc *src, int64_t factor);
/* dst += src, for a dst that is small and in cache (a stage): no prefetching. */
int cp_acc_add_hot(cp_acc *dst, const cp_acc *src);
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
/* What encoding keeps from one block to the next (a commit encodes hundreds): the lz4
 * stream, reset rather than cleared per block, and the sort and payload buffers. Starts
 * zeroed; the blocks are what cp_block_encode writes (the same payload bytes). */
typedef struct cp_block_enc {
    void *lz4; /* LZ4_stream_t */
    void *raw, *ord, *tmp;
    size_t rawcap, ordcap, tmpcap;
} cp_block_enc;
int cp_block_encode_with(cp_block_enc *e, cp_acc *a, cp_buf *out);
void cp_block_enc_close(cp_block_enc *e);

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
/* --- the writer's per-series stack cache (wcache.c, store/README.md) ---------------------
 * Writer only (no lock). Its dictionary ids are the tenant's, committed or in the open
 * batch: a batch that is dropped leaves the store broken until cp_store_reopen, which frees
 * every series and so every cache. */
typedef struct cp_wcache cp_wcache;

/* The hash of a sample's packed location ids, the cache's key (in memory only: nothing
 * stored depends on it). cp_hash_bytes' folded multiply (model/vec.c) with one lane, inline:
 * it runs for every sample of every window (~70 bytes), where the call and the cases for
 * long strings were a third of its cost. */
static inline uint64_t cp_wcache_hash(const uint8_t *s, uint32_t n)
{
    return cp_hash_finish(s, n, n, cp_hash_fold(CP_HASH_K0, (uint64_t)n ^ CP_HASH_K1));
}

/* How many locations of p (decoded with lazy locations into lz) the cache's location ids
 * hold for: c's tables are a prefix of p's, entry for entry (mappings, functions and the
 * strings they name, compared as decoded; location messages, compared as bytes), or 0 (no
 * cache, no lazy locations, or another table: p takes the full path). */
uint32_t cp_wcache_match(const cp_wcache *c, const cp_profile *p, const cp_pprof_lazy *lz);
/* Bytes of the matched location messages (where the next one starts in the window's). */
size_t cp_wcache_locbytes(const cp_wcache *c);
/* Location index -> dictionary location id for the matched locations. */
const uint32_t *cp_wcache_locmap(const cp_wcache *c);
/* The dictionary stacks of n samples whose packed location ids are ids[i] (hash h[i] =
 * cp_wcache_hash of them; 0: skip the sample), valid for a p that cp_wcache_match matched:
 * sid[i] = the stack, or 0 when c does not know it (or c is NULL). */
void cp_wcache_find_all(const cp_wcache *c, uint32_t n, const cp_pprof_ids *ids, const uint64_t *h,
                        uint32_t *sid);
/* Makes *c follow p (lazy locations in lz), whose location i + 1 is dictionary location
 * locmap[i + 1]: keep = 1 after cp_wcache_match(*c, p, lz) succeeded (p's new entries are
 * appended), 0 to start over from p's tables (the stacks are forgotten). Creates *c if
 * NULL. On CP_ENOMEM, or CP_ELIMIT for tables over 4 MiB, *c is freed and NULL. */
int cp_wcache_follow(cp_wcache **c, const cp_profile *p, const cp_pprof_lazy *lz,
                     const uint32_t *locmap, int keep);
/* Remembers that a sample of the followed tables with ids b[0..len) (hash h) is stack sid.
 * Past the series' bounds it remembers nothing and returns 0; CP_ENOMEM. */
int cp_wcache_put(cp_wcache *c, const uint8_t *b, uint32_t len, uint64_t h, uint32_t sid);
/* Memory held by c (0 for NULL). */
size_t cp_wcache_bytes(const cp_wcache *c);
void cp_wcache_free(cp_wcache *c);

/* --- the in-memory tables (store.c: open, load, close, reopen) ------------------------ */

#define TIME_LIMIT (1LL << 62) /* times beyond +-2^62 ns (year 2116) are refused */

typedef struct cp_ser cp_ser;
typedef struct tenant tenant;

/* A bucket the writer has open: loaded or new, dirty until committed. */
typedef struct bucket {
    cp_ser *ser;
    int level;
    int64_t start;
    int dirty;
    cp_acc acc;
} bucket;

struct cp_ser {
    uint32_t id;
    uint8_t idkey[4]; /* id, be32: the series' key in tenant.by_id */
    uint32_t pos;     /* index in tenant.series */
    cp_kind kind;
    tenant *t;
    cp_labels labels;
    char *key; /* identity: kind, then name \0 value \0 ... */
    size_t keylen;
    uint32_t ntypes;
    /* the sample types' names: ntypes each, one allocation (unit = type + ntypes); the
     * strings, like the period's, are the tenant's words (cp_tenant_word), shared */
    const char **type, **unit;
    const char *period_type, *period_unit;
    int64_t period;
    int64_t first_ns, last_ns; /* window starts; first > last while empty */
    uint64_t windows;
    int meta_dirty;
    /* writer: the last cumulative input (alloc, cumulative=true) of one producer */
    char *cum_producer;
    cp_acc cum;
    int cum_valid, cum_dirty;
    /* writer, cpu and alloc only: the sum of this batch's windows of one 1-minute bucket
     * (stage.time_ns the earliest start, stage.windows their count), not yet added to
     * levels 1-4, and stage10 the sum of this batch's minutes of one 10-minute bucket not
     * yet added to levels 2-4; staged says which holds any (CP_STAGED_*, 0 = neither).
     * Added on when a window of another minute (10 minutes) comes and at commit (write.c:
     * stage_flush, stage10_flush), which also frees their memory. */
    cp_acc stage, stage10;
    int64_t stage_start, stage10_start;
    int staged;
    /* writer: what this series' windows share (wcache.c); NULL when none */
    cp_wcache *wc;
    /* writer: per level, no block of the series starts before this (retention.c skips a
     * level whose floor is past its cut without a seek): INT64_MIN when not known (a series
     * read at open), INT64_MAX when it has none; lowered by every bucket the writer opens,
     * raised by retention to the oldest block it leaves */
    int64_t mt_floor[CP_NLEVELS];
};

enum { CP_STAGED_MIN = 1, CP_STAGED_10MIN = 2 };

typedef struct prod {
    char *key; /* producer \0 be32 scope */
    size_t keylen;
    int exists, dirty;
    uint64_t hwm, bits[4];
    int64_t last_seen;
} prod;

/* string -> pointer hash */
typedef struct strmap {
    struct sm_slot {
        const char *k;
        size_t len;
        void *v;
    } * s;
    uint32_t n, cap;
} strmap;

struct tenant {
    char *name;
    size_t len;
    cp_dict dict;
    /* Series ids only grow; retention forgets a series whose windows are all gone
     * (retention.c), so ids have gaps: find one by id in by_id, never by position. */
    CP_VEC(cp_ser *) series; /* every series in id order (cp_ser.pos); NULL: forgotten */
    uint32_t holes;          /* the NULLs in series (gone at the end of a retention pass) */
    strmap by_key;           /* series key -> cp_ser */
    strmap by_id;            /* cp_ser.idkey -> cp_ser */
    uint32_t next_id;        /* the id of the next series (1 + the highest ever loaded or made) */
    strmap prods;            /* writer: producer records */
    strmap words;            /* sample type, unit and period names: each string once */
};

/* The readers as a cp_reader (read.c), copied into every store at open. */
extern const cp_reader cp_store_reader_fns;

struct cp_store {
    cp_reader reader;           /* cp_store_reader: this store's readers behind the interface */
    struct cp_metrics *metrics; /* where the store's statistics are registered; NULL = nowhere */
    cp_thread_owner writer;     /* the writer's thread (checked in debug builds) */
    leveldb_t *db;
    leveldb_options_t *opts;
    leveldb_cache_t *cache;
    leveldb_filterpolicy_t *filter;
    leveldb_readoptions_t *ropts;
    leveldb_writeoptions_t *wsync, *wnosync;
    char *path;
    pthread_rwlock_t lock;
    /* Guards db itself: readers hold it for reading for as long as they use db (snapshot,
     * iterators), cp_store_reopen holds it for writing while it closes and reopens db. */
    pthread_rwlock_t dblock;
    CP_VEC(tenant *) tenants;
    int64_t retention[CP_NLEVELS];
    /* The latest level-0 cut retention has applied (windows starting at or before it may be
     * gone); readers take the later of it and now - retention[0] (read.c raw_cut). */
    atomic_int_fast64_t raw_cut;
    atomic_uint_fast64_t windows;
    int broken;
    uint32_t format; /* the store's format version (CP_STORE_FORMAT_OLDEST..VERSION) */
    /* writer state */
    CP_VEC(bucket *) buckets; /* open buckets (hash below) */
    CP_VEC(bucket *) dirty;   /* the open buckets with dirty set: what a commit writes */
    uint32_t *bslots, nbslots;
    size_t bucket_rows, bucket_rows_max;
    size_t bucket_bytes, bucket_bytes_max;   /* the open buckets' heap bytes (bucket_bytes()) */
    atomic_uint_fast64_t bucket_drops;       /* all dropped past a budget after a commit */
    uint32_t mt_tenant, mt_series, mt_level; /* maintenance cursor */
    /* series retention forgot (out of every table) that a query may still hold: freed once
     * no query runs, waited for past forgotten_wait of them (1,024; retention.c) */
    CP_VEC(cp_ser *) forgotten;
    uint32_t forgotten_wait;
    atomic_uint_fast64_t series_forgotten;
    int64_t mt_capture_ns; /* when retention last read the capture records (retention.c) */
    /* retention's producer-record cursor: a tenant, and the last key read in it (empty: its
     * first); prod_scan records read a pass (4,096) */
    uint32_t mt_prod_tenant, prod_scan;
    cp_buf mt_prod;
    atomic_uint_fast64_t capture_gen; /* cp_store_captures_gen */
    /* the series' stack caches: bytes held, the budget, and counters (read by stats) */
    size_t wcache_bytes, wcache_budget;
    atomic_uint_fast64_t wcache_hits, wcache_misses, wcache_flushes;
    /* the first damage LevelDB reported ("Corruption", cp_ldb_fail), for /healthz until
     * the process ends (a reopen does not mend a table; --repair does) */
    pthread_mutex_t damage_mu;
    char damage[512];
};

/* --- small helpers and key builders (format.h) ----------------------------------------- */

static inline char *xstrndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static inline int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static inline int64_t now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Key builders (format.h). All return the length written into k (>= 96 + tenant bytes). */
static inline size_t key_tenant(uint8_t *k, const tenant *t, uint8_t type)
{
    memcpy(k, t->name, t->len);
    k[t->len] = 0;
    k[t->len + 1] = type;
    return t->len + 2;
}

static inline size_t key_block(uint8_t *k, const cp_ser *s, int level, int64_t start)
{
    size_t n = key_tenant(k, s->t, CP_K_BLOCK);
    cp_put_be32(k + n, s->id);
    k[n + 4] = (uint8_t)level;
    cp_put_be64(k + n + 5, cp_time_key(start));
    return n + 13;
}

static inline size_t key_series(uint8_t *k, const cp_ser *s)
{
    size_t n = key_tenant(k, s->t, CP_K_SERIES);
    cp_put_be32(k + n, s->id);
    return n + 4;
}

static inline size_t key_offset(uint8_t *k, size_t cap, const char *topic, int32_t partition)
{
    size_t tl = strlen(topic);
    if (tl + 8 > cap) tl = cap - 8;
    k[0] = 0;
    k[1] = CP_K_OFFSET;
    memcpy(k + 2, topic, tl);
    k[2 + tl] = 0;
    cp_put_be32(k + 3 + tl, (uint32_t)partition);
    return tl + 7;
}

/* Bucket start of time t at level (level 0: t itself). */
static inline int64_t bucket_of(int level, int64_t t)
{
    return level ? floor_div(t, cp_level_ns[level]) * cp_level_ns[level] : t;
}

/* string -> pointer hash (strmap): the value or NULL. */
void *cp_strmap_get(const strmap *m, const char *k, size_t len);
/* Adds k -> v (k not present); k must stay valid as long as the entry (it is owned by the
 * value). CP_ENOMEM. */
int cp_strmap_put(strmap *m, const char *k, size_t len, void *v);

/* Removes k (present or not); the other keys stay found (backward-shift deletion). */
void cp_strmap_del(strmap *m, const char *k, size_t len);

/* Frees a series and what it owns; NULL is fine. */
void cp_ser_free(cp_ser *s);
/* t's copy of s[0..n) (kept until t is freed), or NULL on out of memory. The writer, or
 * open. */
const char *cp_tenant_word(tenant *t, const char *s, size_t n);
/* Room for ser's ntypes sample type names (ser->type, ser->unit, NULL each); CP_ENOMEM. */
int cp_ser_types_alloc(cp_ser *ser, uint32_t ntypes);
/* Adds ser to t's tables under its id (the writer, under s->lock for writing, or at open).
 * CP_ENOMEM. */
int cp_ser_add(tenant *t, cp_ser *ser);
/* Frees the series retention forgot (s->forgotten): the caller holds s->dblock for writing
 * (no query holds one), or closes the store. */
void cp_forgotten_free(cp_store *s);
/* t's series with id, or NULL (none, or forgotten). Caller holds s->lock or is the writer. */
static inline cp_ser *cp_ser_by_id(const tenant *t, uint32_t id)
{
    uint8_t k[4];
    cp_put_be32(k, id);
    return cp_strmap_get(&t->by_id, (const char *)k, 4);
}
/* The tenant named name[0..len), or NULL. Caller holds s->lock (either way) or is the writer. */
tenant *cp_tenant_find(cp_store *s, const char *name, size_t len);
/* Adds an empty tenant (the writer, under s->lock for writing); NULL on out of memory. */
tenant *cp_tenant_add(cp_store *s, const char *name, size_t len);
/* A series' identity key (kind, then name \0 value \0 ...) into out. CP_ENOMEM. */
int cp_ser_identity(cp_kind kind, const cp_labels *l, cp_buf *out);
/* A LevelDB error e as CP_ESTORE naming the store and what was being done; damage found by
 * LevelDB (a "Corruption" status) also names the table and the way out. */
int cp_ldb_fail(const cp_store *s, cp_err *err, const char *e, const char *what);
/* A tenant or label name: 1 to max bytes, no control characters. */
int cp_name_valid(const char *s, size_t max);

/* --- the writer's open buckets (write.c) -------------------------------------------- */

/* Drops the writer's open buckets (all, or only the clean ones: keep_dirty). Called by the
 * writer's thread only (ingest: batches, maintenance, reopen, close). */
void cp_buckets_drop(cp_store *s, int keep_dirty);
/* The open-bucket cache's invariant (tests): every bucket found by its key in the table, the
 * table holding no other. 0 when it holds, else the index of the first bucket lost + 1. */
uint32_t cp_buckets_check(const cp_store *s);

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
