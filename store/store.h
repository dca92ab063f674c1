/* The profile store: a LevelDB-backed, time-indexed, per-tenant store of profile windows
 * with rollups. This header is the contract between ingest (writer) and query (readers).
 * All functions are safe to call from several threads at once (one writer, many readers).
 * The readers (cp_store_query, _timeline, _series, _label_names, _label_values,
 * _get_stats, _get_symbols) are what query/ builds on: a change to one of them changes
 * query/ in the same commit. */
#ifndef CP_STORE_H
#define CP_STORE_H

#include <stdint.h>
#include <stdio.h>
#include "capture.h"
#include "envelope.h"
#include "metrics.h"
#include "pprof.h"
#include "profile.h"
#include "query.h"

typedef struct cp_store cp_store;

typedef struct cp_store_options {
    const char *path;            /* directory; created if missing */
    int64_t retention_raw_ns;    /* raw windows kept this long (0 = forever) */
    int64_t retention_rollup_ns; /* rollup levels kept this long (0 = forever) */
    /* further tuning fields may be added by the store's owner */
    size_t cache_bytes;          /* LevelDB block cache; 0 = 64 MiB */
    size_t bucket_cache_entries; /* writer's cache of open rollup buckets (stack rows);
                                    0 = 2 Mi rows, about 60 MB */
    size_t stack_cache_bytes;    /* writer's per-series stack caches, all together (README:
                                    "The stack cache"); 0 = 64 MiB; past it all are dropped */
    size_t memory_budget;        /* bytes the open rollup buckets may hold (store/README.md
                                    "Memory"); 0 = 256 MiB; past it, after a commit, all are
                                    dropped and read back from LevelDB when next needed */
} cp_store_options;

int cp_store_open(const cp_store_options *opt, cp_store **out, cp_err *err);
void cp_store_close(cp_store *s); /* NULL is fine */

/* --- reading (query/) -------------------------------------------------------------
 * Every reader takes one cp_query (model/query.h): tenant, kind, selector, window, step,
 * label and limits. Fields a reader does not name are ignored. An unknown tenant reads as
 * empty. */

/* The merged profile of q->kind over every window whose start lies in [from, to), of every
 * series of q->tenant matched by q->sel, within q->lim. cpu/alloc: summed. inuse: per
 * instance the last snapshot within the range, summed over instances. *out is a new
 * profile (owned by the caller) carrying time_nanos = from, duration = to - from, the
 * stored sample types, period type and period. No match gives an empty profile with the
 * kind's sample types.
 * With q->by_series and kind inuse, each series' last snapshot in the range stays apart (a
 * cluster merges the parts of several nodes and keeps, per series, only the latest
 * snapshot of any node: a series handed over between nodes is on both). Every sample of a
 * series then carries two more pprof labels: CP_STORE_SERIES_LABEL (the series' labels as
 * {a="b"}) and CP_STORE_SNAPSHOT_LABEL (numeric: the snapshot's window start, in ns). The
 * profile is then up to one set of stacks per series, not one merged set; a series whose
 * last snapshot holds nothing in use has one sample with no stack and zero values (it still
 * is that series' latest). by_series changes nothing for cpu and alloc. */
#define CP_STORE_SERIES_LABEL "contprof_series"
#define CP_STORE_SNAPSHOT_LABEL "contprof_snapshot_ns"
int cp_store_query(cp_store *s, const cp_query *q, cp_profile **out, cp_err *err);

/* One series: its labels, its kind and the time span of its stored windows. */
typedef struct cp_series_info {
    cp_labels labels;
    cp_kind kind;
    int64_t first_ns, last_ns;
    /* A series carrying the `capture` label (model/capture.h): its windows' records
     * (format.h 'W'), 0/NULL for any other series. */
    uint32_t cap_windows;
    uint64_t cap_samples; /* the first sample type summed (cpu: samples) */
    int64_t cap_end_ns;   /* end of its latest window (start + duration) */
    char *cap_engine;     /* the latest window's engine text; owned, may be NULL */
} cp_series_info;
typedef CP_VEC(cp_series_info) cp_series_list;
void cp_series_list_close(cp_series_list *l);

/* Series of q->tenant matched by q->sel with at least one window starting in [from, to),
 * of every kind (q->kind and q->lim are not applied). Series carrying the `capture` label
 * come with their cap_* fields.
 *
 * The capture rule, for every reader (profile, timeline, series, labels, values): a series
 * carrying the label CP_CAPTURE_LABEL is left out of a query whose selector has no matcher
 * on that label, so a capture's extra samples never add to the always-on view;
 * {capture="ID"} selects exactly one capture's series. Label names never list `capture`;
 * the values of `capture` are the capture ids; other names and values are those of the
 * series the rule leaves in. */
int cp_store_series(cp_store *s, const cp_query *q, cp_series_list *out, cp_err *err);

typedef CP_VEC(char *) cp_string_list; /* owned strings */
void cp_string_list_close(cp_string_list *l);

/* Sorted label names / values of the name q->label, over all series of q->tenant (only
 * these two fields are read). cp_store_label_values without q->label is CP_EINVAL. */
int cp_store_label_names(cp_store *s, const cp_query *q, cp_string_list *out, cp_err *err);
int cp_store_label_values(cp_store *s, const cp_query *q, cp_string_list *out, cp_err *err);

/* A timeline: v[i * ntypes + t] is the total of sample type t over the windows starting in
 * [from + i*step, from + (i+1)*step). v is malloc'ed, owned by the caller. */
typedef struct cp_timeline {
    int64_t *v;
    uint32_t nsteps; /* ceil((to - from) / step) */
    uint32_t ntypes; /* from the kind */
} cp_timeline;

/* The timeline of q->kind over [from, to) in steps of q->step_ns, within q->lim. inuse
 * steps use cp_store_query's rule within each step. */
int cp_store_timeline(cp_store *s, const cp_query *q, cp_timeline *out, cp_err *err);

/* --- one interface for every reader ------------------------------------------------
 * The readers as a table of functions, so that whatever answers a query -- this store, or
 * query/'s fan-out across a cluster, which wraps one -- is called the same way (as
 * SQLite's sqlite3_vfs for every file system). Each function is the cp_store_* reader of
 * the same name with the reader in place of the store; labels is cp_store_label_names,
 * values cp_store_label_values. */
typedef struct cp_reader cp_reader;
struct cp_reader {
    int (*profile)(cp_reader *r, const cp_query *q, cp_profile **out, cp_err *err);
    int (*timeline)(cp_reader *r, const cp_query *q, cp_timeline *out, cp_err *err);
    int (*series)(cp_reader *r, const cp_query *q, cp_series_list *out, cp_err *err);
    int (*labels)(cp_reader *r, const cp_query *q, cp_string_list *out, cp_err *err);
    int (*values)(cp_reader *r, const cp_query *q, cp_string_list *out, cp_err *err);
};

/* s's readers behind the interface (NULL for NULL); the reader is s's own and lives as long
 * as s. */
cp_reader *cp_store_reader(cp_store *s);

typedef struct cp_store_stats {
    uint64_t disk_bytes; /* approximate size of the LevelDB files */
    uint64_t windows;    /* windows stored since open (this process) */
    uint64_t series;     /* distinct series known */
    /* series forgotten by retention since open: every window of theirs past every level's
     * retention (store/README.md, "Retention") */
    uint64_t series_forgotten;
    /* the writer's stack caches: samples found / not found (lazy ids only), times all
     * were dropped for the budget, bytes held */
    uint64_t stack_cache_hits, stack_cache_misses, stack_cache_flushes, stack_cache_bytes;
    /* the open rollup buckets' bytes, and times all were dropped for store.memory_budget */
    uint64_t bucket_bytes, bucket_drops;
} cp_store_stats;
void cp_store_get_stats(cp_store *s, cp_store_stats *out);
/* Registers the store's statistics (the contprof_store_* families of /metrics, read
 * through cp_store_get_stats at each print) in r; cp_store_close ends the registration.
 * Once per store. Returns 0, CP_ENOMEM or CP_EINVAL (already registered there). */
int cp_store_register_metrics(cp_store *s, cp_metrics *r);

/* --- writing (ingest/) -------------------------------------------------------------
 * One writer at a time (ingest's thread): windows and the Kafka offsets (topic, partition,
 * next offset) that produced them go into one batch, written by cp_store_batch_commit as a
 * single atomic, synced LevelDB write. Readers never see half a batch. A failed commit
 * leaves the store refusing further writes (CP_ESTORE): reopen it. */

typedef struct cp_store_batch cp_store_batch;

/* A reusable batch for the writer; NULL on out of memory (the NULL-or-object constructor: error.h,
 * "Exceptions"). */
cp_store_batch *cp_store_batch_create(cp_store *s);
/* Frees b; anything added and not committed is dropped (the store must then be reopened
 * before writing again, as with a failed commit). NULL is fine. */
void cp_store_batch_destroy(cp_store_batch *b);

/* cp_store_batch_add: (producer, sequence) already stored, nothing added. A success, not an
 * error, hence positive: the one exception to "0 or a negative code" in the store
 * (error.h), so that a caller counts it and goes on, and no CP_E* code is taken for it. */
#define CP_STORE_DUPLICATE 1
#define CP_STORE_PRODUCER_MAX 512 /* bytes of a producer id the store takes (keys hold it) */

/* Adds one window: the envelope's tenant, kind, labels, window, producer and sequence, and
 * its decoded profile p (not retained). Duplicates are detected per (tenant, producer,
 * dedup_scope) -- ingest passes the Kafka partition -- and return CP_STORE_DUPLICATE with
 * nothing stored. Cumulative alloc inputs (e->cumulative) are stored as the delta from the
 * previous input of the same series and cumulative stream: the producer id up to its first
 * '#' (contprof import names each window "import:STREAM#WINDOW", ingest/import.c), all of
 * it when it has none. Returns 0; CP_EINVAL / CP_EINCOMPAT /
 * CP_ELIMIT for an input the store cannot take (err names the field; the batch is
 * unchanged and usable); CP_ENOMEM or CP_ESTORE otherwise. */
int cp_store_batch_add(cp_store_batch *b, const cp_envelope *e, const cp_profile *p,
                       int32_t dedup_scope, cp_err *err);
/* cp_store_batch_add for a profile decoded with lazy ids and locations into lz
 * (model/pprof.h; lz NULL: none), whose bytes must still be valid. What the series' stack
 * cache knows is taken from it; the rest is parsed into p (its lazy locations) and checked
 * here: a bad id or location returns CP_EPPROF (err names it, as the decoder would) with
 * the batch unchanged and usable. */
int cp_store_batch_add_lazy(cp_store_batch *b, const cp_envelope *e, cp_profile *p,
                            cp_pprof_lazy *lz, int32_t dedup_scope, cp_err *err);

/* The highest sequence stored for (tenant, producer) over every dedup scope, from the
 * committed producer records (writer thread; nothing the open batch added). 0 with *last
 * set; CP_ENOTFOUND when nothing of the producer is stored; CP_ESTORE on a read error
 * (err says which). Ingest estimates from it what died with the broker at a crash. */
int cp_store_producer_last(cp_store *s, const char *tenant, const char *producer, uint64_t *last,
                           cp_err *err);

/* The store's retention (cp_store_options: 0 = forever), fixed at open. Any thread. */
void cp_store_get_retention(const cp_store *s, int64_t *raw_ns, int64_t *rollup_ns);

/* 1 if LevelDB has reported damage (a "Corruption" status) in this process, with the first
 * such message (naming the table when it can, and the repair) in out; else 0 and "". Any
 * thread. The message stays until the process ends: only `contprofd --repair` mends it. */
int cp_store_damage(cp_store *s, char *out, size_t len);

/* Records that topic/partition continues at next_offset once this batch is committed. */
int cp_store_batch_set_offset(cp_store_batch *b, const char *topic, int32_t partition,
                              int64_t next_offset);

/* Windows added since the last commit. */
uint32_t cp_store_batch_windows(const cp_store_batch *b);

/* Drops everything added to b and not committed (after a failed add or commit), so b can
 * be used again once the store is reopened. If windows had been added, the store refuses
 * writes until cp_store_reopen. */
void cp_store_batch_reset(cp_store_batch *b);

/* Writes everything added (and the offsets) in one synced LevelDB write, then empties b
 * for reuse. An empty batch with offsets still writes them. */
int cp_store_batch_commit(cp_store_batch *b, cp_err *err);

/* The batch functions above, cp_store_maintain and cp_store_reopen are the writer's: one
 * thread calls them (debug builds check it: CP_ASSERT_THREAD, model/check.h; the first
 * thread to call one is the writer). A writer that stops (ingest's thread as it ends) calls
 * this, so that another thread may write after it. A no-op in release builds. */
void cp_store_writer_release(cp_store *s);

/* The stored next offset of topic/partition: 0, or CP_ENOTFOUND when none is stored. */
int cp_store_get_offset(cp_store *s, const char *topic, int32_t partition, int64_t *next_offset,
                        cp_err *err);

/* One bounded step of retention: deletes at most max_keys blocks older than their level's
 * retention at now_ns and compacts the deleted key ranges so the disk space is given
 * back. Call it from the writer's thread, between batches, every few seconds; a cursor
 * makes successive calls cover every series. *deleted (may be NULL) gets the count. */
int cp_store_maintain(cp_store *s, int64_t now_ns, uint32_t max_keys, uint32_t *deleted,
                      cp_err *err);

/* --- symbol tables (query/'s side input: uploads; see format.h 'Y') ---------------
 * Stores (replacing) the symbol table of build_id (lowercase hex) for tenant, as one synced
 * LevelDB put, independent of the writer's batches. Returns 0, CP_EINVAL (bad names) or
 * CP_ESTORE (err names the I/O failure). table is copied. */
int cp_store_put_symbols(cp_store *s, const char *tenant, const char *build_id, const void *table,
                         size_t len, cp_err *err);
/* The stored table of build_id for tenant: 0 with *out malloc'ed (the caller frees it),
 * CP_ENOTFOUND, CP_ESTORE or CP_ENOMEM. */
int cp_store_get_symbols(cp_store *s, const char *tenant, const char *build_id, uint8_t **out,
                         size_t *len, cp_err *err);
/* --- captures (the API's side input, model/capture.h; format.h 'K') ---------------
 * Stores (replacing) c's record as one synced put, independent of the writer's batches.
 * Returns 0, CP_EINVAL (c does not validate) or CP_ESTORE. */
int cp_store_put_capture(cp_store *s, const cp_capture *c, cp_err *err);
/* The record of capture id of tenant into *out (cp_capture_close frees it): 0,
 * CP_ENOTFOUND, CP_ESTORE or CP_ENOMEM. */
int cp_store_get_capture(cp_store *s, const char *tenant, const char *id, cp_capture *out,
                         cp_err *err);
/* Removes the record of capture id of tenant (none is fine): 0, or CP_ESTORE with err.
 * The API prunes ended and cancelled records with it (query/README.md "Captures"). */
int cp_store_delete_capture(cp_store *s, const char *tenant, const char *id, cp_err *err);
typedef CP_VEC(cp_capture) cp_store_capture_list;
void cp_store_capture_list_close(cp_store_capture_list *l);
/* Every capture record of tenant (NULL: of every tenant), by tenant then id. A record that
 * no longer decodes is logged and skipped. 0, CP_ESTORE or CP_ENOMEM. */
int cp_store_captures(cp_store *s, const char *tenant, cp_store_capture_list *out, cp_err *err);
/* Changes whenever a capture record is written or removed, and differs between stores of
 * one process: a copy of the records read after it returned a value is current while it
 * returns the same. Any thread. */
uint64_t cp_store_captures_gen(cp_store *s);

/* --- recovery ---------------------------------------------------------------------- */

/* Closes and reopens the LevelDB database and reloads every in-memory table from disk, so
 * the store is exactly at its last commit again. LevelDB keeps a failed write's error
 * (ENOSPC, EIO) and fails every later write until reopened: this is the way back. Call it
 * from the writer's thread, with its batch reset (cp_store_batch_reset). Readers are held
 * off while it runs (they wait, then see the reloaded tables). Returns 0, or CP_ESTORE with
 * err saying why (the disk still full, ...); the store then answers queries and writes
 * with CP_ESTORE until a later call succeeds. */
int cp_store_reopen(cp_store *s, cp_err *err);

/* What cp_store_repair found and did (totals over every tenant). */
typedef struct cp_store_repair_stats {
    uint64_t log_bytes_dropped; /* write-ahead log bytes LevelDB's repair could not keep */
    uint64_t dict_missing;      /* dictionary ids absent (lost records) */
    uint64_t dict_dropped;      /* entries dropped: they referred to lost entries */
    uint64_t dict_kept;         /* entries kept (renumbered densely) */
    uint64_t series_missing;    /* series ids without a record */
    uint64_t series_kept;
    uint64_t blocks_dropped;   /* blocks of lost series, or undecodable */
    uint64_t blocks_rewritten; /* blocks whose stack ids or series id changed */
    uint64_t rows_dropped;     /* (stack, values) rows naming a lost stack */
    uint64_t rollups_rebuilt;  /* rollup buckets recomputed from their level-0 windows */
    uint64_t keys_dropped;     /* other keys that no longer made sense (labels, ...) */
    uint64_t windows_lost;     /* in 1-minute rollups but gone from level 0 */
} cp_store_repair_stats;

/* Repairs the store at opt->path, which no process may have open (its LOCK is held
 * meanwhile; CP_ESTORE if another process holds it): LevelDB's own repair
 * (leveldb_repair_db: every table and log record still readable is kept), then a check and
 * rebuild of what the store derives: dictionaries renumbered densely, entries that refer
 * to lost ones dropped (and what refers to those), series without records dropped with
 * their blocks, block rows of lost stacks dropped, the label index rebuilt from the series
 * records, rollup buckets whose window count disagrees with their level-0 windows
 * recomputed from them (dropped when none is left) -- only buckets that
 * opt->retention_raw_ns cannot have emptied, as level 0 past it is gone by design. One
 * line per finding is written to out (may be NULL). Returns 0 when the store then opens,
 * or an error naming what is still wrong. */
int cp_store_repair(const cp_store_options *opt, FILE *out, cp_store_repair_stats *st, cp_err *err);

/* The default sample types of a kind, as an empty profile would carry them:
 * cpu samples/count + cpu/nanoseconds, alloc alloc_objects/count + alloc_space/bytes,
 * inuse inuse_objects/count + inuse_space/bytes. */
int cp_store_kind_types(cp_kind kind, cp_profile *p);

#endif
