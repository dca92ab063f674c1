/* pprof decoding with strict validation, and encoding, through protoc-c's generated code.
 * protobuf-c allocates every submessage separately; an arena allocator makes that a bump
 * of a pointer and lets one free release a whole decoded profile. */
#include "pprof.h"
#include "profile.pb-c.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef Perftools__Profiles__Profile PbProfile;

/* ===== arena ======================================================================== */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, size;
    max_align_t data[];
} arena_chunk;

typedef struct arena {
    arena_chunk *head;
    size_t budget; /* bytes we may still allocate; bounds memory on hostile input */
} arena;

static void *arena_alloc(void *ud, size_t n)
{
    arena *a = ud;
    n = (n + 15) & ~(size_t)15;
    arena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = c ? c->size * 2 : 64 * 1024;
        if (size < n) size = n;
        if (size > a->budget) {
            if (n > a->budget) return NULL;
            size = n;
        }
        c = malloc(sizeof *c + size);
        if (!c) return NULL;
        a->budget -= size;
        c->next = a->head;
        c->used = 0;
        c->size = size;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

static void arena_free_one(void *ud, void *p)
{
    (void)ud;
    (void)p; /* released with the arena */
}

static void arena_release(arena *a)
{
    while (a->head) {
        arena_chunk *n = a->head->next;
        free(a->head);
        a->head = n;
    }
}

/* ===== gzip ========================================================================= */

int cp_is_gzip(const uint8_t *buf, size_t len)
{
    return len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b;
}

int cp_gunzip(const uint8_t *src, size_t len, size_t max_out, cp_buf *out, cp_err *err)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return cp_err_set(err, CP_ENOMEM, "inflateInit failed");
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)len;
    size_t start = out->len;
    int rc;
    for (;;) {
        size_t want = len * 4 < 65536 ? 65536 : len * 4;
        if (cp_buf_reserve(out, want)) {
            inflateEnd(&z);
            return cp_err_set(err, CP_ENOMEM, "out of memory inflating %zu bytes", len);
        }
        z.next_out = out->data + out->len;
        z.avail_out = (uInt)(out->cap - out->len);
        rc = inflate(&z, Z_NO_FLUSH);
        out->len = out->cap - z.avail_out;
        if (out->len - start > max_out) {
            inflateEnd(&z);
            out->len = start;
            return cp_err_set(err, CP_ELIMIT, "gzip data inflates past the %zu-byte limit", max_out);
        }
        if (rc == Z_STREAM_END) break;
        if (rc == Z_BUF_ERROR && z.avail_in == 0) {
            inflateEnd(&z);
            out->len = start;
            return cp_err_set(err, CP_EGZIP, "gzip data truncated after %zu input bytes", len);
        }
        if (rc != Z_OK && rc != Z_BUF_ERROR) {
            const char *m = z.msg ? z.msg : "inflate failed";
            cp_err_set(err, CP_EGZIP, "bad gzip data at input byte %zu: %s", (size_t)z.total_in, m);
            inflateEnd(&z);
            out->len = start;
            return CP_EGZIP;
        }
    }
    inflateEnd(&z);
    return 0;
}

int cp_gzip(const uint8_t *src, size_t len, int level, cp_buf *out)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return CP_ENOMEM;
    size_t bound = deflateBound(&z, (uLong)len) + 32;
    if (cp_buf_reserve(out, bound)) {
        deflateEnd(&z);
        return CP_ENOMEM;
    }
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)len;
    z.next_out = out->data + out->len;
    z.avail_out = (uInt)(out->cap - out->len);
    int rc = deflate(&z, Z_FINISH);
    out->len = out->cap - z.avail_out;
    deflateEnd(&z);
    return rc == Z_STREAM_END ? 0 : CP_ENOMEM;
}

/* ===== decoding ===================================================================== */

void cp_pprof_limits_default(cp_pprof_limits *lim)
{
    lim->max_bytes = 64u << 20;
    lim->max_samples = 4u << 20;
    lim->max_locations = 4u << 20;
    lim->max_depth = 1024;
    lim->max_strings = 4u << 20;
    lim->max_string_bytes = 32u << 20;
}

/* Maps pprof's arbitrary nonzero uint64 ids to dense indices. Producers almost always
 * number 1..n in order; then the map is the identity and costs nothing. */
typedef struct idmap {
    int dense;       /* id == index + 1 for all */
    uint64_t *keys;  /* open addressing, 0 = empty */
    uint32_t *vals;
    uint32_t mask;
} idmap;

static void idmap_close(idmap *m)
{
    free(m->keys);
    free(m->vals);
}

/* Builds the map over ids[i] = get(i); fails naming the first zero or duplicate id. */
static int idmap_build(idmap *m, const char *what, size_t n, uint64_t (*get)(void *, size_t),
                       void *items, cp_err *err)
{
    memset(m, 0, sizeof *m);
    m->dense = 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t id = get(items, i);
        if (id == 0) return cp_err_set(err, CP_EPPROF, "%s[%zu]: id is 0 (ids must be nonzero)", what, i);
        if (id != i + 1) m->dense = 0;
    }
    if (m->dense) return 0;
    uint32_t cap = 16;
    while (cap < n * 2) cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = malloc(cap * sizeof *m->vals);
    if (!m->keys || !m->vals) return cp_err_set(err, CP_ENOMEM, "out of memory mapping %s ids", what);
    m->mask = cap - 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t id = get(items, i);
        uint32_t j = (uint32_t)cp_hash_u64(0, id) & m->mask;
        while (m->keys[j]) {
            if (m->keys[j] == id)
                return cp_err_set(err, CP_EPPROF, "%s[%zu]: duplicate id %llu", what, i,
                                  (unsigned long long)id);
            j = (j + 1) & m->mask;
        }
        m->keys[j] = id;
        m->vals[j] = (uint32_t)i;
    }
    return 0;
}

/* Dense index + 1 of id, or 0 if absent. */
static uint32_t idmap_get(const idmap *m, size_t n, uint64_t id)
{
    if (m->dense) return id >= 1 && id <= n ? (uint32_t)id : 0;
    if (!m->keys || id == 0) return 0;
    uint32_t j = (uint32_t)cp_hash_u64(0, id) & m->mask;
    while (m->keys[j]) {
        if (m->keys[j] == id) return m->vals[j] + 1;
        j = (j + 1) & m->mask;
    }
    return 0;
}

static uint64_t map_id(void *v, size_t i) { return ((Perftools__Profiles__Mapping **)v)[i]->id; }
static uint64_t loc_id(void *v, size_t i) { return ((Perftools__Profiles__Location **)v)[i]->id; }
static uint64_t fn_id(void *v, size_t i) { return ((Perftools__Profiles__Function **)v)[i]->id; }

/* Checks a string index field: in [0, nstr). */
#define CHECK_STR(val, ...)                                                            \
    do {                                                                               \
        if ((val) < 0 || (uint64_t)(val) >= nstr) {                                    \
            char where_[160];                                                          \
            snprintf(where_, sizeof where_, __VA_ARGS__);                              \
            rc = cp_err_set(err, CP_EPPROF,                                            \
                            "%s: string index %lld out of range (string_table has %zu)", \
                            where_, (long long)(val), nstr);                           \
            goto out;                                                                  \
        }                                                                              \
    } while (0)

#include <stdio.h>

static int convert(const PbProfile *pb, const cp_pprof_limits *lim, cp_profile *p, cp_err *err)
{
    int rc = 0;
    size_t nstr = pb->n_string_table;
    idmap mm = {0}, lm = {0}, fm = {0};

    /* --- sizes and the string table --- */
    if (nstr == 0 || pb->string_table[0][0] != 0) {
        rc = cp_err_set(err, CP_EPPROF, nstr == 0 ? "string_table is empty (string_table[0] must be \"\")"
                                                  : "string_table[0] is not the empty string");
        goto out;
    }
    if (nstr > lim->max_strings) {
        rc = cp_err_set(err, CP_ELIMIT, "string_table has %zu strings (limit %u)", nstr, lim->max_strings);
        goto out;
    }
    if (pb->n_sample > lim->max_samples) {
        rc = cp_err_set(err, CP_ELIMIT, "profile has %zu samples (limit %u)", pb->n_sample, lim->max_samples);
        goto out;
    }
    if (pb->n_location > lim->max_locations || pb->n_function > lim->max_locations ||
        pb->n_mapping > lim->max_locations) {
        rc = cp_err_set(err, CP_ELIMIT, "profile has %zu locations, %zu functions, %zu mappings (limit %u each)",
                        pb->n_location, pb->n_function, pb->n_mapping, lim->max_locations);
        goto out;
    }
    if (pb->n_sample_type > 64) {
        rc = cp_err_set(err, CP_ELIMIT, "profile has %zu sample types (limit 64)", pb->n_sample_type);
        goto out;
    }
    size_t sbytes = 0;
    for (size_t i = 0; i < nstr; i++) sbytes += strlen(pb->string_table[i]) + 1;
    if (sbytes > lim->max_string_bytes) {
        rc = cp_err_set(err, CP_ELIMIT, "strings take %zu bytes (limit %zu)", sbytes, lim->max_string_bytes);
        goto out;
    }
    p->strs.len = 0;
    p->strs.off.n = 0;
    if (cp_vec_reserve(&p->strs.off, nstr)) goto nomem;
    for (size_t i = 0; i < nstr; i++)
        if (cp_profile_append_str(p, pb->string_table[i], strlen(pb->string_table[i]))) goto nomem;

    /* --- header fields --- */
    for (size_t i = 0; i < pb->n_sample_type; i++) {
        const Perftools__Profiles__ValueType *vt = pb->sample_type[i];
        CHECK_STR(vt->type, "sample_type[%zu].type", i);
        CHECK_STR(vt->unit, "sample_type[%zu].unit", i);
        cp_value_type v = {(uint32_t)vt->type, (uint32_t)vt->unit};
        if (cp_vec_push(&p->sample_types, v)) goto nomem;
    }
    if (pb->period_type) {
        CHECK_STR(pb->period_type->type, "period_type.type");
        CHECK_STR(pb->period_type->unit, "period_type.unit");
        p->period_type.type = (uint32_t)pb->period_type->type;
        p->period_type.unit = (uint32_t)pb->period_type->unit;
    }
    CHECK_STR(pb->drop_frames, "drop_frames");
    CHECK_STR(pb->keep_frames, "keep_frames");
    CHECK_STR(pb->default_sample_type, "default_sample_type");
    p->drop_frames = (uint32_t)pb->drop_frames;
    p->keep_frames = (uint32_t)pb->keep_frames;
    p->default_sample_type = (uint32_t)pb->default_sample_type;
    p->time_nanos = pb->time_nanos;
    p->duration_nanos = pb->duration_nanos;
    p->period = pb->period;
    for (size_t i = 0; i < pb->n_comment; i++) {
        CHECK_STR(pb->comment[i], "comment[%zu]", i);
        if (cp_vec_push(&p->comments, (uint32_t)pb->comment[i])) goto nomem;
    }

    /* --- mappings, functions --- */
    if ((rc = idmap_build(&mm, "mapping", pb->n_mapping, map_id, pb->mapping, err))) goto out;
    if ((rc = idmap_build(&fm, "function", pb->n_function, fn_id, pb->function, err))) goto out;
    if ((rc = idmap_build(&lm, "location", pb->n_location, loc_id, pb->location, err))) goto out;
    if (cp_vec_reserve(&p->mappings, pb->n_mapping) || cp_vec_reserve(&p->functions, pb->n_function) ||
        cp_vec_reserve(&p->locations, pb->n_location))
        goto nomem;
    for (size_t i = 0; i < pb->n_mapping; i++) {
        const Perftools__Profiles__Mapping *m = pb->mapping[i];
        CHECK_STR(m->filename, "mapping[%zu] (id %llu).filename", i, (unsigned long long)m->id);
        CHECK_STR(m->build_id, "mapping[%zu] (id %llu).build_id", i, (unsigned long long)m->id);
        cp_mapping cm = {.start = m->memory_start, .limit = m->memory_limit, .offset = m->file_offset,
                         .filename = (uint32_t)m->filename, .build_id = (uint32_t)m->build_id,
                         .flags = (m->has_functions ? CP_MAP_HAS_FUNCTIONS : 0) |
                                  (m->has_filenames ? CP_MAP_HAS_FILENAMES : 0) |
                                  (m->has_line_numbers ? CP_MAP_HAS_LINE_NUMBERS : 0) |
                                  (m->has_inline_frames ? CP_MAP_HAS_INLINE_FRAMES : 0)};
        p->mappings.v[p->mappings.n++] = cm;
    }
    for (size_t i = 0; i < pb->n_function; i++) {
        const Perftools__Profiles__Function *f = pb->function[i];
        CHECK_STR(f->name, "function[%zu] (id %llu).name", i, (unsigned long long)f->id);
        CHECK_STR(f->system_name, "function[%zu] (id %llu).system_name", i, (unsigned long long)f->id);
        CHECK_STR(f->filename, "function[%zu] (id %llu).filename", i, (unsigned long long)f->id);
        cp_function cf = {(uint32_t)f->name, (uint32_t)f->system_name, (uint32_t)f->filename, f->start_line};
        p->functions.v[p->functions.n++] = cf;
    }

    /* --- locations --- */
    for (size_t i = 0; i < pb->n_location; i++) {
        const Perftools__Profiles__Location *l = pb->location[i];
        uint32_t mid = 0;
        if (l->mapping_id) {
            mid = idmap_get(&mm, pb->n_mapping, l->mapping_id);
            if (!mid) {
                rc = cp_err_set(err, CP_EPPROF, "location[%zu] (id %llu): mapping_id %llu not found (profile has %zu mappings)",
                                i, (unsigned long long)l->id, (unsigned long long)l->mapping_id, pb->n_mapping);
                goto out;
            }
        }
        if (cp_vec_reserve(&p->lines, (size_t)p->lines.n + l->n_line)) goto nomem;
        cp_location cl = {.address = l->address, .mapping_id = mid, .line_off = p->lines.n,
                          .nlines = (uint32_t)l->n_line, .is_folded = l->is_folded};
        for (size_t k = 0; k < l->n_line; k++) {
            uint32_t fid = idmap_get(&fm, pb->n_function, l->line[k]->function_id);
            if (!fid) {
                rc = cp_err_set(err, CP_EPPROF, "location[%zu] (id %llu).line[%zu]: function_id %llu not found (profile has %zu functions)",
                                i, (unsigned long long)l->id, k, (unsigned long long)l->line[k]->function_id, pb->n_function);
                goto out;
            }
            p->lines.v[p->lines.n++] = (cp_line){fid, l->line[k]->line};
        }
        p->locations.v[p->locations.n++] = cl;
    }

    /* --- samples --- */
    size_t nv = pb->n_sample_type;
    size_t nlocs = 0, nlabels = 0;
    for (size_t i = 0; i < pb->n_sample; i++) {
        const Perftools__Profiles__Sample *s = pb->sample[i];
        if (s->n_value != nv) {
            rc = cp_err_set(err, CP_EPPROF, "sample[%zu] has %zu values (profile has %zu sample types)", i, s->n_value, nv);
            goto out;
        }
        if (s->n_location_id > lim->max_depth) {
            rc = cp_err_set(err, CP_ELIMIT, "sample[%zu] has %zu locations (stack depth limit %u)", i, s->n_location_id, lim->max_depth);
            goto out;
        }
        nlocs += s->n_location_id;
        nlabels += s->n_label;
    }
    if (nlocs > UINT32_MAX / 2 || nlabels > UINT32_MAX / 2 || pb->n_sample * nv > UINT32_MAX / 2) {
        rc = cp_err_set(err, CP_ELIMIT, "profile too large (%zu stack entries, %zu labels)", nlocs, nlabels);
        goto out;
    }
    if (cp_vec_reserve(&p->samples, pb->n_sample) || cp_vec_reserve(&p->stack, nlocs) ||
        cp_vec_reserve(&p->values, pb->n_sample * nv) || cp_vec_reserve(&p->labels, nlabels))
        goto nomem;
    for (size_t i = 0; i < pb->n_sample; i++) {
        const Perftools__Profiles__Sample *s = pb->sample[i];
        cp_sample cs = {.loc_off = p->stack.n, .nlocs = (uint32_t)s->n_location_id,
                        .label_off = p->labels.n, .nlabels = (uint32_t)s->n_label};
        for (size_t k = 0; k < s->n_location_id; k++) {
            uint32_t lid = idmap_get(&lm, pb->n_location, s->location_id[k]);
            if (!lid) {
                rc = cp_err_set(err, CP_EPPROF, "sample[%zu].location_id[%zu]: location %llu not found (profile has %zu locations)",
                                i, k, (unsigned long long)s->location_id[k], pb->n_location);
                goto out;
            }
            p->stack.v[p->stack.n++] = lid;
        }
        for (size_t k = 0; k < s->n_label; k++) {
            const Perftools__Profiles__Label *l = s->label[k];
            CHECK_STR(l->key, "sample[%zu].label[%zu].key", i, k);
            CHECK_STR(l->str, "sample[%zu].label[%zu].str", i, k);
            CHECK_STR(l->num_unit, "sample[%zu].label[%zu].num_unit", i, k);
            if (l->key == 0) {
                rc = cp_err_set(err, CP_EPPROF, "sample[%zu].label[%zu]: key is the empty string", i, k);
                goto out;
            }
            p->labels.v[p->labels.n++] = (cp_label){(uint32_t)l->key, (uint32_t)l->str, (uint32_t)l->num_unit, l->num};
        }
        memcpy(p->values.v + p->values.n, s->value, nv * sizeof(int64_t));
        p->values.n += (uint32_t)nv;
        p->samples.v[p->samples.n++] = cs;
    }
    goto out;
nomem:
    rc = cp_err_set(err, CP_ENOMEM, "out of memory decoding profile");
out:
    idmap_close(&mm);
    idmap_close(&lm);
    idmap_close(&fm);
    return rc;
}

/* Walks the top-level fields of a protobuf message so that the two commonest kinds of
 * damage get their own message: input that ends inside a field (truncated) and a length
 * prefix larger than anything allowed. protobuf-c checks everything again while unpacking. */
static int wire_scan(const uint8_t *b, size_t len, size_t max_len, cp_err *err)
{
    size_t i = 0;
    while (i < len) {
        size_t start = i;
        uint64_t key = 0, v = 0;
        int shift = 0;
        do {
            if (i >= len || shift > 63)
                return cp_err_set(err, CP_EPPROF, "truncated: field key at byte %zu runs past the end (%zu bytes)", start, len);
            key |= (uint64_t)(b[i] & 0x7f) << shift;
            shift += 7;
        } while (b[i++] & 0x80);
        unsigned field = (unsigned)(key >> 3), wt = key & 7;
        size_t vstart = i;
        switch (wt) {
        case 0:
        case 2:
            v = 0;
            shift = 0;
            do {
                if (i >= len || shift > 63)
                    return cp_err_set(err, CP_EPPROF, "truncated: field %u at byte %zu: varint runs past the end (%zu bytes)",
                                      field, vstart, len);
                v |= (uint64_t)(b[i] & 0x7f) << shift;
                shift += 7;
            } while (b[i++] & 0x80);
            if (wt == 2) {
                if (v > max_len)
                    return cp_err_set(err, CP_EPPROF, "field %u at byte %zu declares length %llu, beyond the %zu-byte limit",
                                      field, start, (unsigned long long)v, max_len);
                if (v > len - i)
                    return cp_err_set(err, CP_EPPROF, "truncated: field %u at byte %zu needs %llu bytes, %zu remain",
                                      field, start, (unsigned long long)v, len - i);
                i += v;
            }
            break;
        case 1:
        case 5: {
            size_t w = wt == 1 ? 8 : 4;
            if (w > len - i)
                return cp_err_set(err, CP_EPPROF, "truncated: field %u at byte %zu needs %zu bytes, %zu remain", field, start, w, len - i);
            i += w;
            break;
        }
        default:
            return cp_err_set(err, CP_EPPROF, "field %u at byte %zu has invalid wire type %u", field, start, wt);
        }
        if (field == 0) return cp_err_set(err, CP_EPPROF, "field number 0 at byte %zu", start);
    }
    return 0;
}

int cp_pprof_decode(const uint8_t *buf, size_t len, const cp_pprof_limits *lim,
                    cp_profile **out, cp_err *err)
{
    cp_pprof_limits dl;
    cp_buf raw = {0};
    arena a = {NULL, 0};
    int rc;
    *out = NULL;
    if (!lim) {
        cp_pprof_limits_default(&dl);
        lim = &dl;
    }
    if (cp_is_gzip(buf, len)) {
        if ((rc = cp_gunzip(buf, len, lim->max_bytes, &raw, err))) goto done;
        buf = raw.data;
        len = raw.len;
    } else if (len > lim->max_bytes) {
        return cp_err_set(err, CP_ELIMIT, "profile is %zu bytes (limit %zu)", len, lim->max_bytes);
    }
    a.budget = len * 8 + (1u << 20);
    if ((rc = wire_scan(buf, len, lim->max_bytes, err))) goto done;
    /* The decoded form is a few times the wire size; the budget keeps hostile lengths
     * from turning into huge allocations. */
    ProtobufCAllocator alloc = {arena_alloc, arena_free_one, &a};
    PbProfile *pb = perftools__profiles__profile__unpack(&alloc, len, buf);
    if (!pb) {
        rc = cp_err_set(err, a.budget < 64 ? CP_ELIMIT : CP_EPPROF,
                        "not a valid pprof protobuf (%zu bytes): truncated, bad wire type, or length out of bounds", len);
        goto done;
    }
    cp_profile *p = cp_profile_create();
    if (!p) {
        rc = cp_err_set(err, CP_ENOMEM, "out of memory");
        goto done;
    }
    if ((rc = convert(pb, lim, p, err))) {
        cp_profile_destroy(p);
        goto done;
    }
    *out = p;
done:
    arena_release(&a);
    cp_buf_close(&raw);
    return rc;
}

/* ===== encoding ===================================================================== */

int cp_pprof_encode(const cp_profile *p, int gzip_level, cp_buf *out)
{
    arena a = {NULL, SIZE_MAX};
    int rc = CP_ENOMEM;
    PbProfile pb = PERFTOOLS__PROFILES__PROFILE__INIT;
    uint32_t nv = p->sample_types.n;
#define ALLOC(n, T) ((T *)arena_alloc(&a, (n) * sizeof(T) + 1))

    pb.n_string_table = p->strs.off.n;
    pb.string_table = ALLOC(pb.n_string_table, char *);
    if (!pb.string_table) goto done;
    for (uint32_t i = 0; i < p->strs.off.n; i++) pb.string_table[i] = p->strs.buf + p->strs.off.v[i];

    Perftools__Profiles__ValueType *vts = ALLOC(nv + 1, Perftools__Profiles__ValueType);
    pb.sample_type = ALLOC(nv, Perftools__Profiles__ValueType *);
    if (!vts || !pb.sample_type) goto done;
    pb.n_sample_type = nv;
    for (uint32_t i = 0; i < nv; i++) {
        perftools__profiles__value_type__init(&vts[i]);
        vts[i].type = p->sample_types.v[i].type;
        vts[i].unit = p->sample_types.v[i].unit;
        pb.sample_type[i] = &vts[i];
    }
    if (p->period_type.type || p->period_type.unit) {
        perftools__profiles__value_type__init(&vts[nv]);
        vts[nv].type = p->period_type.type;
        vts[nv].unit = p->period_type.unit;
        pb.period_type = &vts[nv];
    }
    pb.period = p->period;
    pb.time_nanos = p->time_nanos;
    pb.duration_nanos = p->duration_nanos;
    pb.drop_frames = p->drop_frames;
    pb.keep_frames = p->keep_frames;
    pb.default_sample_type = p->default_sample_type;
    pb.n_comment = p->comments.n;
    pb.comment = ALLOC(p->comments.n, int64_t);
    if (!pb.comment) goto done;
    for (uint32_t i = 0; i < p->comments.n; i++) pb.comment[i] = p->comments.v[i];

    Perftools__Profiles__Mapping *ms = ALLOC(p->mappings.n, Perftools__Profiles__Mapping);
    pb.mapping = ALLOC(p->mappings.n, Perftools__Profiles__Mapping *);
    if (!ms || !pb.mapping) goto done;
    pb.n_mapping = p->mappings.n;
    for (uint32_t i = 0; i < p->mappings.n; i++) {
        const cp_mapping *m = &p->mappings.v[i];
        perftools__profiles__mapping__init(&ms[i]);
        ms[i].id = i + 1;
        ms[i].memory_start = m->start;
        ms[i].memory_limit = m->limit;
        ms[i].file_offset = m->offset;
        ms[i].filename = m->filename;
        ms[i].build_id = m->build_id;
        ms[i].has_functions = !!(m->flags & CP_MAP_HAS_FUNCTIONS);
        ms[i].has_filenames = !!(m->flags & CP_MAP_HAS_FILENAMES);
        ms[i].has_line_numbers = !!(m->flags & CP_MAP_HAS_LINE_NUMBERS);
        ms[i].has_inline_frames = !!(m->flags & CP_MAP_HAS_INLINE_FRAMES);
        pb.mapping[i] = &ms[i];
    }

    Perftools__Profiles__Function *fs = ALLOC(p->functions.n, Perftools__Profiles__Function);
    pb.function = ALLOC(p->functions.n, Perftools__Profiles__Function *);
    if (!fs || !pb.function) goto done;
    pb.n_function = p->functions.n;
    for (uint32_t i = 0; i < p->functions.n; i++) {
        const cp_function *f = &p->functions.v[i];
        perftools__profiles__function__init(&fs[i]);
        fs[i].id = i + 1;
        fs[i].name = f->name;
        fs[i].system_name = f->system_name;
        fs[i].filename = f->filename;
        fs[i].start_line = f->start_line;
        pb.function[i] = &fs[i];
    }

    Perftools__Profiles__Line *ls = ALLOC(p->lines.n, Perftools__Profiles__Line);
    Perftools__Profiles__Line **lps = ALLOC(p->lines.n, Perftools__Profiles__Line *);
    Perftools__Profiles__Location *locs = ALLOC(p->locations.n, Perftools__Profiles__Location);
    pb.location = ALLOC(p->locations.n, Perftools__Profiles__Location *);
    if (!ls || !lps || !locs || !pb.location) goto done;
    for (uint32_t i = 0; i < p->lines.n; i++) {
        perftools__profiles__line__init(&ls[i]);
        ls[i].function_id = p->lines.v[i].function_id;
        ls[i].line = p->lines.v[i].line;
        lps[i] = &ls[i];
    }
    pb.n_location = p->locations.n;
    for (uint32_t i = 0; i < p->locations.n; i++) {
        const cp_location *l = &p->locations.v[i];
        perftools__profiles__location__init(&locs[i]);
        locs[i].id = i + 1;
        locs[i].mapping_id = l->mapping_id;
        locs[i].address = l->address;
        locs[i].is_folded = l->is_folded;
        locs[i].n_line = l->nlines;
        locs[i].line = lps + l->line_off;
        pb.location[i] = &locs[i];
    }

    Perftools__Profiles__Sample *ss = ALLOC(p->samples.n, Perftools__Profiles__Sample);
    pb.sample = ALLOC(p->samples.n, Perftools__Profiles__Sample *);
    uint64_t *stack = ALLOC(p->stack.n, uint64_t);
    Perftools__Profiles__Label *lbs = ALLOC(p->labels.n, Perftools__Profiles__Label);
    Perftools__Profiles__Label **lbps = ALLOC(p->labels.n, Perftools__Profiles__Label *);
    if (!ss || !pb.sample || !stack || !lbs || !lbps) goto done;
    for (uint32_t i = 0; i < p->stack.n; i++) stack[i] = p->stack.v[i];
    for (uint32_t i = 0; i < p->labels.n; i++) {
        perftools__profiles__label__init(&lbs[i]);
        lbs[i].key = p->labels.v[i].key;
        lbs[i].str = p->labels.v[i].str;
        lbs[i].num = p->labels.v[i].num;
        lbs[i].num_unit = p->labels.v[i].num_unit;
        lbps[i] = &lbs[i];
    }
    pb.n_sample = p->samples.n;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        perftools__profiles__sample__init(&ss[i]);
        ss[i].n_location_id = s->nlocs;
        ss[i].location_id = stack + s->loc_off;
        ss[i].n_value = nv;
        ss[i].value = p->values.v + (size_t)i * nv;
        ss[i].n_label = s->nlabels;
        ss[i].label = lbps + s->label_off;
        pb.sample[i] = &ss[i];
    }
#undef ALLOC

    size_t size = perftools__profiles__profile__get_packed_size(&pb);
    if (gzip_level > 0) {
        uint8_t *tmp = malloc(size ? size : 1);
        if (!tmp) goto done;
        perftools__profiles__profile__pack(&pb, tmp);
        rc = cp_gzip(tmp, size, gzip_level > 9 ? 9 : gzip_level, out);
        free(tmp);
    } else {
        if (cp_buf_reserve(out, size)) goto done;
        perftools__profiles__profile__pack(&pb, out->data + out->len);
        out->len += size;
        rc = 0;
    }
done:
    arena_release(&a);
    return rc;
}
