/* pprof wire format: strict decoding (raw or gzip'd) into a cp_profile, and encoding. */
#ifndef CP_PPROF_H
#define CP_PPROF_H

#include "profile.h"

/* Bounds applied while decoding; anything beyond them is rejected with CP_ELIMIT. */
typedef struct cp_pprof_limits {
    size_t max_bytes; /* encoded size after gunzip */
    uint32_t max_samples;
    uint32_t max_locations; /* also bounds functions and mappings */
    uint32_t max_depth;     /* locations in one sample */
    uint32_t max_strings;
    size_t max_string_bytes; /* all strings together */
} cp_pprof_limits;

/* Generous defaults suitable for windows of a real service (64 MiB, 4M samples, ...). */
void cp_pprof_limits_default(cp_pprof_limits *lim);

/* True if buf starts with the gzip magic bytes. */
int cp_is_gzip(const uint8_t *buf, size_t len);

/* gunzips src into out, refusing to produce more than max_out bytes (CP_ELIMIT). */
int cp_gunzip(const uint8_t *src, size_t len, size_t max_out, cp_buf *out, cp_err *err);
/* A profile's time_nanos (field 9) without decoding it: buf (raw or gzip'd, at most 64 MiB
 * unzipped) is scanned field by field at its top level, the tables skipped. Returns 0 with
 * *out (0 when the field is absent), or CP_EPPROF / CP_EGZIP / CP_ELIMIT / CP_ENOMEM. For
 * ordering many files cheaply (contprof import). */
int cp_pprof_peek_time(const uint8_t *buf, size_t len, int64_t *out);

/* gzips src, appending to out, at the given zlib level (1..9). Returns 0 or CP_ENOMEM. */
int cp_gzip(const uint8_t *src, size_t len, int level, cp_buf *out);

/* A gzip compressor kept for many buffers: creating one allocates and clears libdeflate's
 * tables (about 300 KiB at level 1, so a fresh mmap and its page faults each time), which
 * costs more than compressing a small profile. One caller at a time. */
typedef struct cp_gzipper cp_gzipper;
/* Creates a compressor at the given zlib level (1..9; 0: deflate's stored blocks, no
 * compression, still gzip) into *out (NULL on failure); the
 * caller frees it with cp_gzipper_destroy. Returns 0 or CP_ENOMEM. */
int cp_gzipper_create(int level, cp_gzipper **out);
/* gzips src, appending to out; the same bytes as cp_gzip at the compressor's level.
 * Returns 0 or CP_ENOMEM. */
int cp_gzipper_run(cp_gzipper *g, const uint8_t *src, size_t len, cp_buf *out);
/* Frees g (NULL is fine). */
void cp_gzipper_destroy(cp_gzipper *g);

/* Decodes a pprof profile (gzip'd or raw, detected by magic) and validates it: every id
 * and index in range, unique nonzero ids, string 0 empty, one value per sample type, and
 * the limits (lim may be NULL for the defaults). On success *out is a new profile owned by
 * the caller, whose ids are dense (input ids are renumbered). On failure *out is NULL, the
 * code is CP_EPPROF, CP_ELIMIT, CP_EGZIP or CP_ENOMEM, and err names the field and index. */
int cp_pprof_decode(const uint8_t *buf, size_t len, const cp_pprof_limits *lim, cp_profile **out,
                    cp_err *err);

/* A reusable decoder: the same checks as cp_pprof_decode, with its scratch memory (gunzip
 * buffer, field tables) kept between calls, so a stream of windows decodes without
 * allocating once warm. One decoder per thread. */
typedef struct cp_pprof_decoder cp_pprof_decoder;
/* A new decoder with limits lim (copied; NULL: the defaults), or NULL on out of memory
 * (the NULL-or-object constructor: error.h, "Exceptions"). */
cp_pprof_decoder *cp_pprof_decoder_create(const cp_pprof_limits *lim);
/* Frees d and its scratch memory (NULL is fine). */
void cp_pprof_decoder_destroy(cp_pprof_decoder *d);
/* Decodes into p, which is reset first and keeps its allocations; on failure p is empty. */
int cp_pprof_decoder_decode(cp_pprof_decoder *d, const uint8_t *buf, size_t len, cp_profile *p,
                            cp_err *err);

/* Lazy location ids, for a caller that keeps stacks by their bytes (ingest's per-series
 * cache, store/README.md): a sample's packed location ids are left undecoded, as the
 * bytes they came in, when the input is raw (not gzip'd), its location ids are dense
 * (1..n in order, as cp_profile numbers them), the sample's ids came as one packed run and
 * that run has no more bytes than the depth limit (so the depth cannot exceed it). Such a
 * sample has nlocs 0 in the profile and ids.v[i] = its bytes, which point into the
 * caller's input: valid as long as it is. Every other check is made as usual. */
typedef struct cp_pprof_ids {
    const uint8_t *p; /* NULL: the sample's ids were decoded into the profile */
    uint32_t len;
} cp_pprof_ids;

typedef struct cp_pprof_lazy {
    CP_VEC(cp_pprof_ids) ids; /* one per sample of the last decode */
    uint32_t nlazy;           /* how many are lazy */
    /* Lazy locations: when, besides, the location messages are one run of bytes, their
     * ids 1..n in order, and mapping and function ids dense, the locations are not parsed:
     * the profile has none (p->locations.n == 0) and locs[0..locs_len) holds the nloc
     * messages (keys and lengths included); cp_pprof_lazy_locations parses them. */
    const uint8_t *locs;
    size_t locs_len;
    uint32_t nloc;
    /* the input and the decoder's limits, for cp_pprof_lazy_locations */
    const uint8_t *buf;
    size_t len;
    cp_pprof_limits lim;
} cp_pprof_lazy;

/* cp_pprof_decoder_decode with lazy ids and locations into lz (reused; lz NULL: as
 * cp_pprof_decoder_decode). */
int cp_pprof_decoder_decode_lazy(cp_pprof_decoder *d, const uint8_t *buf, size_t len, cp_profile *p,
                                 cp_pprof_lazy *lz, cp_err *err);
/* Decodes sample i's lazy ids lz->ids.v[i] (of profile p) into dst, which must have room
 * for their length + 8 ids, each checked to be one of p's locations (lz->nloc when they are
 * lazy) as the decoder checks them (the same message). Returns 0 with *n the count, or
 * CP_EPPROF with err naming the id. */
int cp_pprof_lazy_ids(const cp_profile *p, const cp_pprof_lazy *lz, uint32_t i, uint32_t *dst,
                      uint32_t *n, cp_err *err);
/* Parses the lazy locations of p (lz->nloc of them; nothing to do when there are none or p
 * has its locations) from the from'th on, which starts from_at bytes into lz->locs (0 and 0:
 * all of them), checked as the decoder checks them (the same messages), so that p has
 * lz->nloc locations, of which [0, from) are not written (whatever p's memory held there:
 * the caller must not read them): for a caller that knows them otherwise (ingest's stack
 * cache, which checked them in an earlier window, reads only [from, nloc)). The decoder
 * chose lazy locations by each message's first field; if a parsed message's id turns out
 * other than its place (an id repeated later in it), the input is decoded again in full
 * into p and lz is left with nothing lazy. Returns 0, CP_EPPROF or CP_ENOMEM (p then has
 * no locations). */
int cp_pprof_lazy_locations(cp_profile *p, cp_pprof_lazy *lz, uint32_t from, size_t from_at,
                            cp_err *err);
/* Frees what lz holds. */
void cp_pprof_lazy_close(cp_pprof_lazy *lz);

/* Encodes p as pprof and appends it to out: gzip'd when gzip_level > 0 (1..9), else raw.
 * p must be well formed (as cp_pprof_decode and the builders leave it). Returns 0 or
 * CP_ENOMEM (CP_EINVAL only if the encoder's sizing pass and its writing pass disagree, a
 * bug). */
int cp_pprof_encode(const cp_profile *p, int gzip_level, cp_buf *out);

#endif
