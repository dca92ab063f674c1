/* The flat profile model: string interning, builders, scaling, type selection, cloning. */
#include "profile.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmath.h"

/* ===== string table ================================================================= */

static uint64_t str_hash(const char *s, size_t len)
{
    return cp_hash_bytes(s, len, 0x5bd1e995);
}

/* Slots hold (hash << 32 | id + 1): a probe compares hashes before touching strings. */
static int strtab_rehash(cp_strtab *t, uint32_t nslots)
{
    uint64_t *slots = calloc(nslots, sizeof *slots);
    if (!slots) return CP_ENOMEM;
    for (uint32_t i = 0; i < t->off.n; i++) {
        size_t end = i + 1 < t->off.n ? t->off.v[i + 1] : t->len;
        uint32_t h = (uint32_t)str_hash(t->buf + t->off.v[i], end - t->off.v[i] - 1);
        uint32_t j = h & (nslots - 1);
        while (slots[j])
            j = (j + 1) & (nslots - 1);
        slots[j] = (uint64_t)h << 32 | (i + 1);
    }
    free(t->slots);
    t->slots = slots;
    t->nslots = nslots;
    return 0;
}

int cp_profile_append_str(cp_profile *p, const char *s, size_t len)
{
    cp_strtab *t = &p->strs;
    if (t->len + len + 1 > t->cap) {
        size_t ncap = t->cap ? t->cap : 1024;
        while (ncap < t->len + len + 1)
            ncap *= 2;
        char *nb = realloc(t->buf, ncap);
        if (!nb) return CP_ENOMEM;
        t->buf = nb;
        t->cap = ncap;
    }
    if (len >= UINT32_MAX || t->len > UINT32_MAX - len - 1) return CP_ENOMEM; /* 32-bit offsets */
    if (cp_vec_push(&t->off, (uint32_t)t->len)) return CP_ENOMEM;
    memcpy(t->buf + t->len, s, len);
    t->buf[t->len + len] = 0;
    t->len += len + 1;
    /* The intern index, if built, no longer covers every string: drop it; the next
     * intern rebuilds it. Decoding appends only, interning afterwards is rarer. */
    if (t->slots) {
        free(t->slots);
        t->slots = NULL;
        t->nslots = 0;
    }
    return 0;
}

int cp_profile_intern(cp_profile *p, const char *s, size_t len, uint32_t *id)
{
    cp_strtab *t = &p->strs;
    if ((size_t)(t->off.n + 1) * 2 > t->nslots) {
        uint32_t n = t->nslots ? t->nslots : 64;
        while ((size_t)(t->off.n + 1) * 2 > n)
            n *= 2;
        if (strtab_rehash(t, n)) return CP_ENOMEM;
    }
    uint32_t h = (uint32_t)str_hash(s, len);
    uint32_t j = h & (t->nslots - 1);
    while (t->slots[j]) {
        if ((uint32_t)(t->slots[j] >> 32) == h) {
            uint32_t i = (uint32_t)t->slots[j] - 1;
            size_t end = i + 1 < t->off.n ? t->off.v[i + 1] : t->len; /* strings are back to back */
            if (end - t->off.v[i] == len + 1 && memcmp(t->buf + t->off.v[i], s, len) == 0) {
                *id = i;
                return 0;
            }
        }
        j = (j + 1) & (t->nslots - 1);
    }
    uint64_t *slots = t->slots;
    uint32_t nslots = t->nslots;
    t->slots = NULL; /* keep append_str from dropping the index we are about to extend */
    int rc = cp_profile_append_str(p, s, len);
    t->slots = slots;
    t->nslots = nslots;
    if (rc) return rc;
    *id = t->off.n - 1;
    t->slots[j] = (uint64_t)h << 32 | t->off.n;
    return 0;
}

const char *cp_profile_str(const cp_profile *p, uint32_t id)
{
    if (id >= p->strs.off.n) return "";
    return p->strs.buf + p->strs.off.v[id];
}

/* ===== lifecycle ==================================================================== */

cp_profile *cp_profile_create(void)
{
    cp_profile *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    if (cp_profile_append_str(p, "", 0)) {
        cp_profile_destroy(p);
        return NULL;
    }
    return p;
}

void cp_profile_destroy(cp_profile *p)
{
    if (!p) return;
    free(p->strs.buf);
    free(p->strs.off.v);
    free(p->strs.slots);
    free(p->sample_types.v);
    free(p->comments.v);
    free(p->mappings.v);
    free(p->locations.v);
    free(p->lines.v);
    free(p->functions.v);
    free(p->samples.v);
    free(p->stack.v);
    free(p->values.v);
    free(p->labels.v);
    free(p);
}

void cp_profile_reset(cp_profile *p)
{
    p->strs.len = 1; /* keep "" */
    p->strs.off.n = 1;
    if (p->strs.slots) memset(p->strs.slots, 0, p->strs.nslots * sizeof *p->strs.slots);
    if (p->strs.slots) {
        uint32_t h = (uint32_t)str_hash("", 0);
        p->strs.slots[h & (p->strs.nslots - 1)] = (uint64_t)h << 32 | 1;
    }
    p->sample_types.n = 0;
    memset(&p->period_type, 0, sizeof p->period_type);
    p->period = p->time_nanos = p->duration_nanos = 0;
    p->drop_frames = p->keep_frames = p->default_sample_type = 0;
    p->comments.n = p->mappings.n = p->locations.n = p->lines.n = 0;
    p->functions.n = p->samples.n = p->stack.n = p->values.n = p->labels.n = 0;
}

void cp_profile_next_window(cp_profile *p, uint32_t nstrings)
{
    cp_strtab *t = &p->strs;
    if (nstrings < 1) nstrings = 1; /* "" stays */
    if (nstrings < t->off.n) {
        t->len = t->off.v[nstrings];
        t->off.n = nstrings;
        /* the index loses the dropped strings: rebuilt at its size (a window's few
         * strings, once per window; failing leaves no index, which the next intern makes) */
        if (t->slots && strtab_rehash(t, t->nslots) != 0) {
            free(t->slots);
            t->slots = NULL;
            t->nslots = 0;
        }
    }
    p->comments.n = 0;
    p->samples.n = p->stack.n = p->values.n = p->labels.n = 0;
    p->time_nanos = p->duration_nanos = 0;
}

/* ===== builders ===================================================================== */

int cp_profile_add_sample_type(cp_profile *p, const char *type, const char *unit)
{
    cp_value_type vt;
    if (p->samples.n) return CP_EINVAL; /* values are row-major: types come first */
    if (cp_profile_intern_cstr(p, type, &vt.type) || cp_profile_intern_cstr(p, unit, &vt.unit))
        return CP_ENOMEM;
    return cp_vec_push(&p->sample_types, vt);
}

int cp_profile_add_function(cp_profile *p, const cp_function *f, uint32_t *id)
{
    if (cp_vec_push(&p->functions, *f)) return CP_ENOMEM;
    *id = p->functions.n;
    return 0;
}

int cp_profile_add_mapping(cp_profile *p, const cp_mapping *m, uint32_t *id)
{
    if (cp_vec_push(&p->mappings, *m)) return CP_ENOMEM;
    *id = p->mappings.n;
    return 0;
}

int cp_profile_add_location(cp_profile *p, uint64_t address, uint32_t mapping_id,
                            const cp_line *lines, uint32_t nlines, uint32_t *id)
{
    cp_location l = {
        .address = address, .mapping_id = mapping_id, .line_off = p->lines.n, .nlines = nlines};
    if (cp_vec_reserve(&p->lines, (size_t)p->lines.n + nlines)) return CP_ENOMEM;
    if (cp_vec_push(&p->locations, l)) return CP_ENOMEM;
    if (nlines) memcpy(p->lines.v + p->lines.n, lines, nlines * sizeof *lines);
    p->lines.n += nlines;
    *id = p->locations.n;
    return 0;
}

int cp_profile_add_sample(cp_profile *p, const uint32_t *locs, uint32_t nlocs,
                          const int64_t *values, const cp_label *labels, uint32_t nlabels)
{
    uint32_t nv = p->sample_types.n;
    cp_sample s = {
        .loc_off = p->stack.n, .nlocs = nlocs, .label_off = p->labels.n, .nlabels = nlabels};
    if (cp_vec_reserve(&p->stack, (size_t)p->stack.n + nlocs) ||
        cp_vec_reserve(&p->values, (size_t)p->values.n + nv) ||
        cp_vec_reserve(&p->labels, (size_t)p->labels.n + nlabels) || cp_vec_push(&p->samples, s))
        return CP_ENOMEM;
    if (nlocs) memcpy(p->stack.v + p->stack.n, locs, nlocs * sizeof *locs);
    if (nv) memcpy(p->values.v + p->values.n, values, nv * sizeof *values);
    if (nlabels) memcpy(p->labels.v + p->labels.n, labels, nlabels * sizeof *labels);
    p->stack.n += nlocs;
    p->values.n += nv;
    p->labels.n += nlabels;
    return 0;
}

/* ===== operations =================================================================== */

int cp_profile_find_type(const cp_profile *p, const char *type)
{
    for (uint32_t i = 0; i < p->sample_types.n; i++)
        if (strcmp(cp_profile_str(p, p->sample_types.v[i].type), type) == 0) return (int)i;
    return -1;
}

void cp_profile_scale(cp_profile *p, double factor)
{
    if (factor == 1.0) return;
    for (uint32_t i = 0; i < p->values.n; i++)
        p->values.v[i] = cp_math_llround((double)p->values.v[i] * factor);
}

int64_t cp_profile_total(const cp_profile *p, uint32_t t)
{
    int64_t sum = 0;
    uint32_t nv = p->sample_types.n;
    if (t >= nv) return 0;
    for (uint32_t i = 0; i < p->samples.n; i++)
        sum += p->values.v[(size_t)i * nv + t];
    return sum;
}

int cp_profile_select_types(cp_profile *p, const char *const *types, size_t n, cp_err *err)
{
    uint32_t nv = p->sample_types.n;
    int idx[64];
    if (n == 0 || n > 64)
        return cp_err_set(err, CP_EINVAL, "select %zu sample types: 1 to 64 allowed", n);
    for (size_t k = 0; k < n; k++) {
        idx[k] = cp_profile_find_type(p, types[k]);
        if (idx[k] < 0)
            return cp_err_set(err, CP_EINVAL, "sample type \"%s\" is not in the profile", types[k]);
    }
    cp_value_type vt[64];
    for (size_t k = 0; k < n; k++)
        vt[k] = p->sample_types.v[idx[k]];
    /* Compact samples in place: the new row (n values) is never longer than the old one. */
    uint32_t out = 0;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        int64_t row[64];
        int nonzero = 0;
        for (size_t k = 0; k < n; k++) {
            row[k] = p->values.v[(size_t)i * nv + (uint32_t)idx[k]];
            nonzero |= row[k] != 0;
        }
        if (!nonzero) continue;
        memcpy(p->values.v + (size_t)out * n, row, n * sizeof *row);
        p->samples.v[out++] = p->samples.v[i];
    }
    p->samples.n = out;
    p->values.n = (uint32_t)(out * n);
    p->sample_types.n = 0;
    for (size_t k = 0; k < n; k++)
        p->sample_types.v[p->sample_types.n++] = vt[k];
    if (p->default_sample_type) {
        int keep = 0;
        for (size_t k = 0; k < n; k++)
            keep |= vt[k].type == p->default_sample_type;
        if (!keep) p->default_sample_type = 0;
    }
    return 0;
}

#define CLONE_VEC(dst, src)                                                                        \
    do {                                                                                           \
        if ((src).n) {                                                                             \
            if (cp_vec_reserve(&(dst), (src).n)) goto fail;                                        \
            memcpy((dst).v, (src).v, (size_t)(src).n * sizeof *(src).v);                           \
        }                                                                                          \
        (dst).n = (src).n;                                                                         \
    } while (0)

cp_profile *cp_profile_clone(const cp_profile *p)
{
    cp_profile *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->strs.buf = malloc(p->strs.cap ? p->strs.cap : 1);
    if (!c->strs.buf) goto fail;
    memcpy(c->strs.buf, p->strs.buf, p->strs.len);
    c->strs.len = p->strs.len;
    c->strs.cap = p->strs.cap ? p->strs.cap : 1;
    CLONE_VEC(c->strs.off, p->strs.off);
    CLONE_VEC(c->sample_types, p->sample_types);
    CLONE_VEC(c->comments, p->comments);
    CLONE_VEC(c->mappings, p->mappings);
    CLONE_VEC(c->locations, p->locations);
    CLONE_VEC(c->lines, p->lines);
    CLONE_VEC(c->functions, p->functions);
    CLONE_VEC(c->samples, p->samples);
    CLONE_VEC(c->stack, p->stack);
    CLONE_VEC(c->values, p->values);
    CLONE_VEC(c->labels, p->labels);
    c->period_type = p->period_type;
    c->period = p->period;
    c->time_nanos = p->time_nanos;
    c->duration_nanos = p->duration_nanos;
    c->drop_frames = p->drop_frames;
    c->keep_frames = p->keep_frames;
    c->default_sample_type = p->default_sample_type;
    return c;
fail:
    cp_profile_destroy(c);
    return NULL;
}

/* ---------------------------------------------------------------------------------
 * Position-independent frame identity
 * --------------------------------------------------------------------------------- */

static int has_prefix(const char *s, size_t n, const char *pre)
{
    size_t k = strlen(pre);
    return n >= k && memcmp(s, pre, k) == 0;
}

int cp_mapping_names_object(const char *filename, size_t filename_len, size_t build_id_len)
{
    if (build_id_len) return 1;
    if (!filename_len) return 0;
    /* the kernel's and perf's names for memory that is no file's */
    if (filename[0] == '[')
        return has_prefix(filename, filename_len, "[vdso]") ||
               has_prefix(filename, filename_len, "[vsyscall]");
    static const char *const anon[] = {"//anon",    "/memfd:", "/anon_hugepage",
                                       "/dev/zero", "/SYSV",   "/dev/shm/"};
    for (size_t i = 0; i < sizeof anon / sizeof anon[0]; i++)
        if (has_prefix(filename, filename_len, anon[i])) return 0;
    return 1;
}

uint64_t cp_mapping_canonicalize(cp_mapping *m)
{
    if (m->limit < m->start) return 0;
    uint64_t delta = m->offset - m->start;
    m->limit = m->offset + (m->limit - m->start);
    m->start = m->offset;
    return delta;
}

static int profile_mapping_is_object(const cp_profile *p, const cp_mapping *m)
{
    const char *f = cp_profile_str(p, m->filename), *b = cp_profile_str(p, m->build_id);
    return cp_mapping_names_object(f, strlen(f), strlen(b));
}

void cp_profile_canonicalize(cp_profile *p)
{
    for (uint32_t i = 0; i < p->locations.n; i++) {
        cp_location *l = &p->locations.v[i];
        if (!l->mapping_id || l->mapping_id > p->mappings.n) continue;
        const cp_mapping *m = &p->mappings.v[l->mapping_id - 1];
        /* address 0: none given (a symbolized frame of some producers); it stays 0 */
        if (l->address && m->start != m->offset && m->limit >= m->start &&
            profile_mapping_is_object(p, m))
            l->address += m->offset - m->start;
    }
    for (uint32_t i = 0; i < p->mappings.n; i++)
        if (profile_mapping_is_object(p, &p->mappings.v[i]))
            (void)cp_mapping_canonicalize(&p->mappings.v[i]);
}

size_t cp_location_label(const cp_profile *p, const cp_location *l, char *out, size_t len)
{
    const cp_mapping *m =
        l->mapping_id && l->mapping_id <= p->mappings.n ? &p->mappings.v[l->mapping_id - 1] : NULL;
    const char *file = m ? cp_profile_str(p, m->filename) : "";
    const char *bid = m ? cp_profile_str(p, m->build_id) : "";
    int n;
    if (m && cp_mapping_names_object(file, strlen(file), strlen(bid))) {
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        if (!*base) base = *bid ? bid : "?";
        if (l->address)
            n = snprintf(out, len, "%s+0x%" PRIx64, base, l->address - m->start + m->offset);
        else /* no address given: the object alone, as pprof shows it */
            n = snprintf(out, len, "[%s]", base);
    } else {
        n = snprintf(out, len, "0x%" PRIx64, l->address);
    }
    if (n < 0) n = 0;
    return len && (size_t)n >= len ? len - 1 : (size_t)n;
}
