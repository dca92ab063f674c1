/* The streaming merger. Each input is remapped onto the output once: strings, mappings,
 * functions and locations through content-keyed hash tables, then samples keyed by their
 * remapped stack and labels. Cost is linear in the input; nothing is ever re-merged. */
#include "merge.h"

#include <stdlib.h>
#include <string.h>

#include "fmath.h"

/* A hash set of output entries (index + 1) with their hashes, side by side so that a
 * probe touches one cache line. */
typedef struct tslot {
    uint32_t id, hash; /* id 0: empty */
} tslot;

typedef struct tbl {
    tslot *s;
    uint32_t mask, n;
} tbl;

struct cp_merger {
    cp_profile *out;
    uint32_t count;
    tbl fns, maps, locs, smps;
    CP_VEC(uint32_t) str_map, fn_map, map_map, loc_map, key_locs;
    CP_VEC(cp_label) key_labels;
};

static void tbl_close(tbl *t)
{
    free(t->s);
    memset(t, 0, sizeof *t);
}

static int tbl_grow_slow(tbl *t);

/* Makes room for one more entry (load factor at most 3/4). */
static inline int tbl_grow(tbl *t)
{
    if ((size_t)(t->n + 1) * 4 <= (size_t)(t->mask + 1) * 3 && t->s) return 0;
    return tbl_grow_slow(t);
}

static int tbl_grow_slow(tbl *t)
{
    uint32_t cap = t->s ? (t->mask + 1) * 2 : 1024;
    tslot *ns = calloc(cap, sizeof *ns);
    if (!ns) return CP_ENOMEM;
    for (uint32_t i = 0; t->s && i <= t->mask; i++) {
        if (!t->s[i].id) continue;
        uint32_t j = t->s[i].hash & (cap - 1);
        while (ns[j].id)
            j = (j + 1) & (cap - 1);
        ns[j] = t->s[i];
    }
    free(t->s);
    t->s = ns;
    t->mask = cap - 1;
    return 0;
}

/* The slot where an entry equal to the key lives, or the empty slot where it would go. */
#define TBL_FIND(t, h, eq_expr, slot_out)                                                          \
    do {                                                                                           \
        uint32_t j_ = (h) & (t)->mask;                                                             \
        while ((t)->s[j_].id) {                                                                    \
            if ((t)->s[j_].hash == (h)) {                                                          \
                uint32_t cand = (t)->s[j_].id - 1;                                                 \
                (void)cand;                                                                        \
                if (eq_expr) break;                                                                \
            }                                                                                      \
            j_ = (j_ + 1) & (t)->mask;                                                             \
        }                                                                                          \
        (slot_out) = j_;                                                                           \
    } while (0)

/* Fills an empty slot found by TBL_FIND. */
static inline void tbl_set(tbl *t, uint32_t slot, uint32_t id, uint32_t h)
{
    t->s[slot] = (tslot){id, h};
    t->n++;
}

cp_merger *cp_merger_create(void)
{
    cp_merger *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    if (!(m->out = cp_profile_create())) {
        free(m);
        return NULL;
    }
    return m;
}

void cp_merger_destroy(cp_merger *m)
{
    if (!m) return;
    cp_profile_destroy(m->out);
    tbl_close(&m->fns);
    tbl_close(&m->maps);
    tbl_close(&m->locs);
    tbl_close(&m->smps);
    free(m->str_map.v);
    free(m->fn_map.v);
    free(m->map_map.v);
    free(m->loc_map.v);
    free(m->key_locs.v);
    free(m->key_labels.v);
    free(m);
}

uint32_t cp_merger_count(const cp_merger *m)
{
    return m->count;
}

static int same_vt(const cp_profile *a, cp_value_type x, const cp_profile *b, cp_value_type y)
{
    return strcmp(cp_profile_str(a, x.type), cp_profile_str(b, y.type)) == 0 &&
           strcmp(cp_profile_str(a, x.unit), cp_profile_str(b, y.unit)) == 0;
}

/* Checks p against the output's sample and period types without changing anything. */
static int check_compat(const cp_merger *m, const cp_profile *p, cp_err *err)
{
    const cp_profile *o = m->out;
    if (o->sample_types.n == 0) return 0;
    if (o->sample_types.n != p->sample_types.n)
        return cp_err_set(err, CP_EINCOMPAT, "profile has %u sample types, expected %u",
                          p->sample_types.n, o->sample_types.n);
    for (uint32_t i = 0; i < o->sample_types.n; i++) {
        if (!same_vt(o, o->sample_types.v[i], p, p->sample_types.v[i]))
            return cp_err_set(err, CP_EINCOMPAT, "sample type %u is %s/%s, expected %s/%s", i,
                              cp_profile_str(p, p->sample_types.v[i].type),
                              cp_profile_str(p, p->sample_types.v[i].unit),
                              cp_profile_str(o, o->sample_types.v[i].type),
                              cp_profile_str(o, o->sample_types.v[i].unit));
    }
    int oset = o->period_type.type || o->period_type.unit;
    int pset = p->period_type.type || p->period_type.unit;
    if (oset && pset && !same_vt(o, o->period_type, p, p->period_type))
        return cp_err_set(
            err, CP_EINCOMPAT, "period type is %s/%s, expected %s/%s",
            cp_profile_str(p, p->period_type.type), cp_profile_str(p, p->period_type.unit),
            cp_profile_str(o, o->period_type.type), cp_profile_str(o, o->period_type.unit));
    return 0;
}

static int label_cmp(const void *a, const void *b)
{
    const cp_label *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    if (x->str != y->str) return x->str < y->str ? -1 : 1;
    if (x->num != y->num) return x->num < y->num ? -1 : 1;
    if (x->num_unit != y->num_unit) return x->num_unit < y->num_unit ? -1 : 1;
    return 0;
}

static int map_strings(cp_merger *m, const cp_profile *p)
{
    m->str_map.n = 0;
    if (cp_vec_reserve(&m->str_map, p->strs.off.n)) return CP_ENOMEM;
    for (uint32_t i = 0; i < p->strs.off.n; i++) {
        size_t end = i + 1 < p->strs.off.n ? p->strs.off.v[i + 1] : p->strs.len;
        const char *s = p->strs.buf + p->strs.off.v[i];
        if (cp_profile_intern(m->out, s, end - p->strs.off.v[i] - 1, &m->str_map.v[i]))
            return CP_ENOMEM;
    }
    m->str_map.n = p->strs.off.n;
    return 0;
}

/* Field by field: the structs have padding, which memcmp would compare. */
static int fn_eq(const cp_function *a, const cp_function *b)
{
    return a->name == b->name && a->system_name == b->system_name && a->filename == b->filename &&
           a->start_line == b->start_line;
}

static int lines_eq(const cp_line *a, const cp_line *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (a[i].function_id != b[i].function_id || a[i].line != b[i].line) return 0;
    return 1;
}

static int labels_eq(const cp_label *a, const cp_label *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (label_cmp(&a[i], &b[i]) != 0) return 0;
    return 1;
}

static int map_functions(cp_merger *m, const cp_profile *p)
{
    cp_profile *o = m->out;
    const uint32_t *sm = m->str_map.v;
    if (cp_vec_reserve(&m->fn_map, (size_t)p->functions.n + 1)) return CP_ENOMEM;
    for (uint32_t i = 0; i < p->functions.n; i++) {
        const cp_function *f = &p->functions.v[i];
        cp_function k = {sm[f->name], sm[f->system_name], sm[f->filename], f->start_line};
        uint64_t h64 = cp_hash_mix((uint64_t)k.name << 32 | k.system_name,
                                   ((uint64_t)k.filename << 32) ^ (uint64_t)k.start_line);
        uint32_t h = (uint32_t)h64, slot;
        if (tbl_grow(&m->fns)) return CP_ENOMEM;
        TBL_FIND(&m->fns, h, fn_eq(&o->functions.v[cand], &k), slot);
        if (!m->fns.s[slot].id) {
            uint32_t id;
            if (cp_profile_add_function(o, &k, &id)) return CP_ENOMEM;
            tbl_set(&m->fns, slot, id, h);
        }
        m->fn_map.v[i + 1] = m->fns.s[slot].id;
    }
    return 0;
}

/* pprof's mapping key: size rounded up to 4 KiB, file offset, and build id (or file name
 * when there is no build id). */
static void mapping_key(const cp_mapping *mp, uint32_t build_id, uint32_t filename, uint64_t k[3])
{
    uint64_t size = mp->limit - mp->start;
    size = (size + 0xfff) & ~(uint64_t)0xfff;
    k[0] = size;
    k[1] = mp->offset;
    k[2] = build_id ? ((uint64_t)build_id << 1) : ((uint64_t)filename << 1 | 1);
}

static int map_mappings(cp_merger *m, const cp_profile *p)
{
    cp_profile *o = m->out;
    const uint32_t *sm = m->str_map.v;
    if (cp_vec_reserve(&m->map_map, (size_t)p->mappings.n + 1)) return CP_ENOMEM;
    for (uint32_t i = 0; i < p->mappings.n; i++) {
        cp_mapping mp = p->mappings.v[i];
        mp.filename = sm[mp.filename];
        mp.build_id = sm[mp.build_id];
        uint64_t k[3];
        mapping_key(&mp, mp.build_id, mp.filename, k);
        uint32_t h = (uint32_t)cp_hash_u64(cp_hash_u64(cp_hash_u64(2, k[0]), k[1]), k[2]), slot;
        if (tbl_grow(&m->maps)) return CP_ENOMEM;
        uint64_t c[3];
        TBL_FIND(&m->maps, h,
                 (mapping_key(&o->mappings.v[cand], o->mappings.v[cand].build_id,
                              o->mappings.v[cand].filename, c),
                  memcmp(c, k, sizeof k) == 0),
                 slot);
        if (!m->maps.s[slot].id) {
            /* an object's mapping in canonical form (start = file offset): the merged
             * addresses are then file offsets, whichever input came first */
            const char *file = cp_profile_str(o, mp.filename),
                       *bid = cp_profile_str(o, mp.build_id);
            if (cp_mapping_names_object(file, strlen(file), strlen(bid)))
                (void)cp_mapping_canonicalize(&mp);
            uint32_t id;
            if (cp_profile_add_mapping(o, &mp, &id)) return CP_ENOMEM;
            tbl_set(&m->maps, slot, id, h);
        } else {
            o->mappings.v[m->maps.s[slot].id - 1].flags |= mp.flags;
        }
        m->map_map.v[i + 1] = m->maps.s[slot].id;
    }
    return 0;
}

/* A location's address relative to its mapping's start; address 0 (none given, as some
 * producers write for symbolized frames) stays apart from every real address. */
static inline uint64_t loc_rel(uint64_t address, uint64_t start)
{
    return address ? address - start : UINT64_MAX;
}

static int loc_eq(const cp_profile *o, uint32_t cand, uint32_t mapping_id, uint64_t rel,
                  uint32_t is_folded, const cp_line *lines, uint32_t nlines)
{
    const cp_location *l = &o->locations.v[cand];
    if (l->mapping_id != mapping_id || l->nlines != nlines || l->is_folded != is_folded) return 0;
    uint64_t r = loc_rel(l->address, mapping_id ? o->mappings.v[mapping_id - 1].start : 0);
    if (r != rel) return 0;
    return nlines == 0 || lines_eq(o->lines.v + l->line_off, lines, nlines);
}

static int map_locations(cp_merger *m, const cp_profile *p)
{
    cp_profile *o = m->out;
    cp_line lines[64];
    if (cp_vec_reserve(&m->loc_map, (size_t)p->locations.n + 1)) return CP_ENOMEM;
    for (uint32_t i = 0; i < p->locations.n; i++) {
        const cp_location *l = &p->locations.v[i];
        uint32_t mid = l->mapping_id ? m->map_map.v[l->mapping_id] : 0;
        uint64_t rel =
            loc_rel(l->address, l->mapping_id ? p->mappings.v[l->mapping_id - 1].start : 0);
        uint32_t nl = l->nlines;
        cp_line *lp = lines;
        if (nl > 64 && !(lp = malloc(nl * sizeof *lp))) return CP_ENOMEM;
        uint64_t h64 = cp_hash_mix((uint64_t)mid << 1 | (l->is_folded != 0), rel);
        for (uint32_t k = 0; k < nl; k++) {
            const cp_line *src = &p->lines.v[l->line_off + k];
            lp[k].function_id = m->fn_map.v[src->function_id];
            lp[k].line = src->line;
            h64 = cp_hash_mix(h64 ^ lp[k].function_id, (uint64_t)lp[k].line);
        }
        uint32_t h = (uint32_t)h64, slot;
        int rc = 0;
        if (tbl_grow(&m->locs)) {
            rc = CP_ENOMEM;
            goto next;
        }
        TBL_FIND(&m->locs, h, loc_eq(o, cand, mid, rel, l->is_folded, lp, nl), slot);
        if (!m->locs.s[slot].id) {
            uint32_t id;
            uint64_t addr = rel == UINT64_MAX ? 0 : rel + (mid ? o->mappings.v[mid - 1].start : 0);
            if (cp_profile_add_location(o, addr, mid, lp, nl, &id)) {
                rc = CP_ENOMEM;
                goto next;
            }
            o->locations.v[id - 1].is_folded = l->is_folded;
            tbl_set(&m->locs, slot, id, h);
        }
        m->loc_map.v[i + 1] = m->locs.s[slot].id;
    next:
        if (lp != lines) free(lp);
        if (rc) return rc;
    }
    return 0;
}

static int sample_eq(const cp_profile *o, uint32_t cand, const uint32_t *locs, uint32_t nlocs,
                     const cp_label *labels, uint32_t nlabels)
{
    const cp_sample *s = &o->samples.v[cand];
    /* (n == 0 ||: no pointer arithmetic on the NULL of an empty array) */
    return s->nlocs == nlocs && s->nlabels == nlabels &&
           (nlocs == 0 || memcmp(o->stack.v + s->loc_off, locs, nlocs * sizeof *locs) == 0) &&
           (nlabels == 0 || labels_eq(o->labels.v + s->label_off, labels, nlabels));
}

static int map_samples(cp_merger *m, const cp_profile *p, double factor)
{
    cp_profile *o = m->out;
    uint32_t nv = o->sample_types.n;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        m->key_locs.n = m->key_labels.n = 0;
        if (cp_vec_reserve(&m->key_locs, s->nlocs) || cp_vec_reserve(&m->key_labels, s->nlabels))
            return CP_ENOMEM;
        const uint32_t *lm = m->loc_map.v, *in = p->stack.v + s->loc_off;
        uint32_t *key = m->key_locs.v;
        for (uint32_t k = 0; k < s->nlocs; k++)
            key[k] = lm[in[k]];
        uint64_t h64 = cp_hash_bytes(key, (size_t)s->nlocs * sizeof *key, 4);
        for (uint32_t k = 0; k < s->nlabels; k++) {
            cp_label l = p->labels.v[s->label_off + k];
            l.key = m->str_map.v[l.key];
            l.str = m->str_map.v[l.str];
            l.num_unit = m->str_map.v[l.num_unit];
            m->key_labels.v[k] = l;
        }
        if (s->nlabels > 1) qsort(m->key_labels.v, s->nlabels, sizeof(cp_label), label_cmp);
        for (uint32_t k = 0; k < s->nlabels; k++) {
            const cp_label *l = &m->key_labels.v[k];
            h64 = cp_hash_u64(
                cp_hash_u64(cp_hash_u64(cp_hash_u64(h64, l->key), l->str), (uint64_t)l->num),
                l->num_unit);
        }
        uint32_t h = (uint32_t)h64, slot;
        if (tbl_grow(&m->smps)) return CP_ENOMEM;
        TBL_FIND(&m->smps, h,
                 sample_eq(o, cand, m->key_locs.v, s->nlocs, m->key_labels.v, s->nlabels), slot);
        const int64_t *src = cp_profile_sample_values(p, i);
        if (!m->smps.s[slot].id) {
            int64_t zero[64] = {0};
            if (cp_profile_add_sample(o, m->key_locs.v, s->nlocs, zero, m->key_labels.v,
                                      s->nlabels))
                return CP_ENOMEM;
            tbl_set(&m->smps, slot, o->samples.n, h);
        }
        int64_t *dst = o->values.v + (size_t)(m->smps.s[slot].id - 1) * nv;
        if (factor == 1.0)
            for (uint32_t k = 0; k < nv; k++)
                dst[k] += src[k];
        else
            for (uint32_t k = 0; k < nv; k++)
                dst[k] += cp_math_llround((double)src[k] * factor);
    }
    return 0;
}

/* Sets the output's header from the first real input. */
static int adopt_header(cp_merger *m, const cp_profile *p)
{
    cp_profile *o = m->out;
    const uint32_t *sm = m->str_map.v;
    for (uint32_t i = 0; i < p->sample_types.n; i++) {
        cp_value_type vt = {sm[p->sample_types.v[i].type], sm[p->sample_types.v[i].unit]};
        if (cp_vec_push(&o->sample_types, vt)) return CP_ENOMEM;
    }
    o->period_type.type = sm[p->period_type.type];
    o->period_type.unit = sm[p->period_type.unit];
    o->drop_frames = sm[p->drop_frames];
    o->keep_frames = sm[p->keep_frames];
    o->default_sample_type = sm[p->default_sample_type];
    return 0;
}

int cp_merger_add_scaled(cp_merger *m, const cp_profile *p, double factor, cp_err *err)
{
    int rc;
    cp_profile *o = m->out;
    if (p->sample_types.n == 0) {
        m->count++;
        return 0;
    }
    if (p->sample_types.n > 64)
        return cp_err_set(err, CP_EINCOMPAT, "profile has %u sample types (at most 64 merge)",
                          p->sample_types.n);
    if ((rc = check_compat(m, p, err))) return rc;
    if ((rc = map_strings(m, p))) goto nomem;
    if (o->sample_types.n == 0 && (rc = adopt_header(m, p))) goto nomem;
    if (!o->period_type.type && !o->period_type.unit) {
        o->period_type.type = m->str_map.v[p->period_type.type];
        o->period_type.unit = m->str_map.v[p->period_type.unit];
    }
    if ((rc = map_mappings(m, p)) || (rc = map_functions(m, p)) || (rc = map_locations(m, p)) ||
        (rc = map_samples(m, p, factor)))
        goto nomem;
    for (uint32_t i = 0; i < p->comments.n; i++) {
        uint32_t c = m->str_map.v[p->comments.v[i]], seen = 0;
        for (uint32_t k = 0; k < o->comments.n && !seen; k++)
            seen = o->comments.v[k] == c;
        if (!seen && cp_vec_push(&o->comments, c)) goto nomem;
    }
    if (p->time_nanos && (!o->time_nanos || p->time_nanos < o->time_nanos))
        o->time_nanos = p->time_nanos;
    o->duration_nanos += p->duration_nanos;
    if (p->period > o->period) o->period = p->period;
    m->count++;
    return 0;
nomem:
    return cp_err_set(err, CP_ENOMEM, "out of memory merging profile %u", m->count);
}

int cp_merger_add(cp_merger *m, const cp_profile *p, cp_err *err)
{
    return cp_merger_add_scaled(m, p, 1.0, err);
}

cp_profile *cp_merger_finish(cp_merger *m)
{
    cp_profile *o = m->out, *fresh = cp_profile_create();
    if (!fresh) return NULL;
    /* Drop samples whose values all became zero (pprof does the same). */
    uint32_t nv = o->sample_types.n, out = 0;
    for (uint32_t i = 0; i < o->samples.n; i++) {
        const int64_t *v = o->values.v + (size_t)i * nv;
        int nz = 0;
        for (uint32_t k = 0; k < nv; k++)
            nz |= v[k] != 0;
        if (!nz) continue;
        if (out != i) {
            memmove(o->values.v + (size_t)out * nv, v, nv * sizeof *v);
            o->samples.v[out] = o->samples.v[i];
        }
        out++;
    }
    o->samples.n = out;
    o->values.n = out * nv;
    m->out = fresh;
    tbl_close(&m->fns);
    tbl_close(&m->maps);
    tbl_close(&m->locs);
    tbl_close(&m->smps);
    m->count = 0;
    return o;
}
