/* Per-tenant dictionaries: strings, functions, mappings, locations and stacks interned once
 * per tenant, so a stored block holds only stack ids. New entries go into the writer's
 * current LevelDB batch, so they become durable together with the blocks that use them. */
#include "store_int.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------
 * Id hash
 * --------------------------------------------------------------------------------- */

static void idx_close(cp_idx *x)
{
    free(x->ids);
    free(x->hs);
    memset(x, 0, sizeof *x);
}

static int idx_insert(cp_idx *x, uint64_t h, uint32_t id);

static int idx_grow(cp_idx *x)
{
    uint32_t n = x->nslots ? x->nslots * 2 : 256;
    cp_idx nx = {calloc(n, sizeof(uint32_t)), malloc(n * sizeof(uint64_t)), n, 0};
    if (!nx.ids || !nx.hs) {
        idx_close(&nx);
        return CP_ENOMEM;
    }
    for (uint32_t i = 0; i < x->nslots; i++)
        if (x->ids[i]) idx_insert(&nx, x->hs[i], x->ids[i]);
    idx_close(x);
    *x = nx;
    return 0;
}

static int idx_insert(cp_idx *x, uint64_t h, uint32_t id)
{
    if ((x->n + 1) * 4 > x->nslots * 3 && idx_grow(x)) return CP_ENOMEM;
    uint32_t m = x->nslots - 1, i = (uint32_t)h & m;
    while (x->ids[i])
        i = (i + 1) & m;
    x->ids[i] = id;
    x->hs[i] = h;
    x->n++;
    return 0;
}

typedef int (*eq_fn)(const cp_dict *d, uint32_t id, const void *key);

static uint32_t idx_find(const cp_idx *x, uint64_t h, eq_fn eq, const cp_dict *d, const void *key)
{
    if (!x->nslots) return 0;
    uint32_t m = x->nslots - 1, i = (uint32_t)h & m;
    while (x->ids[i]) {
        if (x->hs[i] == h && eq(d, x->ids[i], key)) return x->ids[i];
        i = (i + 1) & m;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Lifecycle
 * --------------------------------------------------------------------------------- */

int cp_dict_init(cp_dict *d)
{
    memset(d, 0, sizeof *d);
    d->sbuf = malloc(64);
    if (!d->sbuf) return CP_ENOMEM;
    d->scap = 64;
    d->sbuf[0] = 0;
    d->slen = 1;
    if (cp_vec_push(&d->soff, 0) || cp_vec_push(&d->soff, 1)) return CP_ENOMEM;
    return 0;
}

void cp_dict_close(cp_dict *d)
{
    if (!d) return;
    free(d->sbuf);
    free(d->soff.v);
    free(d->fn.v);
    free(d->map.v);
    free(d->loc.v);
    free(d->lines.v);
    free(d->stk.v);
    free(d->stk_locs.v);
    free(d->stk_labels.v);
    idx_close(&d->si);
    idx_close(&d->fi);
    idx_close(&d->mi);
    idx_close(&d->li);
    idx_close(&d->ki);
    idx_close(&d->ai);
    free(d->stk_alias);
    memset(d, 0, sizeof *d);
}

/* Writes a new entry to the current batch (none while loading). */
static void put_entry(cp_dict *d, uint8_t kind, uint32_t id, const uint8_t *v, size_t len)
{
    if (!d->wb) return;
    uint8_t key[CP_TENANT_KEY_MAX + 8];
    memcpy(key, d->tenant, d->tenant_len);
    size_t k = d->tenant_len;
    key[k++] = 0;
    key[k++] = CP_K_DICT;
    key[k++] = kind;
    cp_put_be32(key + k, id);
    k += 4;
    leveldb_writebatch_put(d->wb, (const char *)key, k, (const char *)v, len);
}

/* ---------------------------------------------------------------------------------
 * Strings
 * --------------------------------------------------------------------------------- */

/* String hash: length plus up to 56 sampled bytes (the first 24, 8 from the middle, the
 * last 24). Long symbol names share prefixes and lengths rarely all at once; a full compare
 * on every hash hit keeps it exact. Much cheaper than hashing every byte of every name of
 * every window. */
static uint64_t str_hash(const char *s, size_t n)
{
    if (n <= 56) return cp_hash_bytes(s, n, 0x5157);
    uint64_t w[7];
    memcpy(w, s, 24);
    memcpy(w + 3, s + n / 2 - 4, 8);
    memcpy(w + 4, s + n - 24, 24);
    return cp_hash_bytes(w, sizeof w, 0x5157 ^ n);
}

typedef struct skey {
    const char *s;
    size_t len;
} skey;

static int str_eq(const cp_dict *d, uint32_t id, const void *key)
{
    const skey *k = key;
    size_t len;
    const char *s = cp_dict_str(d, id, &len);
    return len == k->len && memcmp(s, k->s, len) == 0;
}

static int str_append(cp_dict *d, const char *s, size_t len)
{
    if (d->slen + len + 1 > UINT32_MAX) return CP_ENOMEM;
    if (d->slen + len + 1 > d->scap) {
        size_t cap = d->scap * 2;
        while (cap < d->slen + len + 1)
            cap *= 2;
        char *nb = realloc(d->sbuf, cap);
        if (!nb) return CP_ENOMEM;
        d->sbuf = nb;
        d->scap = cap;
    }
    memcpy(d->sbuf + d->slen, s, len);
    d->sbuf[d->slen + len] = 0;
    d->slen += len + 1;
    return cp_vec_push(&d->soff, (uint32_t)d->slen);
}

int cp_dict_string(cp_dict *d, const char *s, size_t len, uint32_t *id)
{
    if (len == 0) {
        *id = 0;
        return 0;
    }
    uint64_t h = str_hash(s, len);
    skey k = {s, len};
    uint32_t got = idx_find(&d->si, h, str_eq, d, &k);
    if (got) {
        *id = got;
        return 0;
    }
    uint32_t nid = d->soff.n - 1;
    if (str_append(d, s, len)) return CP_ENOMEM;
    if (idx_insert(&d->si, h, nid)) {
        d->soff.n--;
        d->slen -= len + 1;
        return CP_ENOMEM;
    }
    put_entry(d, CP_D_STRING, nid, (const uint8_t *)s, len);
    *id = nid;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Functions and mappings
 * --------------------------------------------------------------------------------- */

static uint64_t fn_hash(const cp_function *f)
{
    uint64_t h = cp_hash_u64(0xf00d, f->name);
    h = cp_hash_u64(h, f->system_name);
    h = cp_hash_u64(h, f->filename);
    return cp_hash_u64(h, (uint64_t)f->start_line);
}

static int fn_eq(const cp_dict *d, uint32_t id, const void *key)
{
    const cp_function *a = &d->fn.v[id - 1], *b = key;
    return a->name == b->name && a->system_name == b->system_name && a->filename == b->filename &&
           a->start_line == b->start_line;
}

int cp_dict_function(cp_dict *d, const cp_function *f, uint32_t *id)
{
    uint64_t h = fn_hash(f);
    uint32_t got = idx_find(&d->fi, h, fn_eq, d, f);
    if (got) {
        *id = got;
        return 0;
    }
    if (cp_vec_push(&d->fn, *f)) return CP_ENOMEM;
    uint32_t nid = d->fn.n;
    if (idx_insert(&d->fi, h, nid)) {
        d->fn.n--;
        return CP_ENOMEM;
    }
    uint8_t v[64], *p = v;
    p = cp_put_uv(p, f->name);
    p = cp_put_uv(p, f->system_name);
    p = cp_put_uv(p, f->filename);
    p = cp_put_uv(p, cp_zz(f->start_line));
    put_entry(d, CP_D_FUNCTION, nid, v, (size_t)(p - v));
    *id = nid;
    return 0;
}

/* A mapping's identity: its range and offset (canonical for objects: the file offset and
 * size), and the object: its build ID, or its file name where it has none. The file name of
 * a mapping with a build ID (it may differ between hosts) and the flags are those of the
 * first entry interned. */
static uint64_t map_hash(const cp_mapping *m)
{
    uint64_t h = cp_hash_u64(0x3a9, m->start);
    h = cp_hash_u64(h, m->limit);
    h = cp_hash_u64(h, m->offset);
    return cp_hash_u64(h,
                       m->build_id ? (uint64_t)m->build_id << 1 : (uint64_t)m->filename << 1 | 1);
}

static int map_eq(const cp_dict *d, uint32_t id, const void *key)
{
    const cp_mapping *a = &d->map.v[id - 1], *b = key;
    return a->start == b->start && a->limit == b->limit && a->offset == b->offset &&
           a->build_id == b->build_id && (a->build_id || a->filename == b->filename);
}

int cp_dict_mapping(cp_dict *d, const cp_mapping *m, uint32_t *id)
{
    uint64_t h = map_hash(m);
    uint32_t got = idx_find(&d->mi, h, map_eq, d, m);
    if (got) {
        *id = got;
        return 0;
    }
    if (cp_vec_push(&d->map, *m)) return CP_ENOMEM;
    uint32_t nid = d->map.n;
    if (idx_insert(&d->mi, h, nid)) {
        d->map.n--;
        return CP_ENOMEM;
    }
    uint8_t v[64], *p = v;
    p = cp_put_uv(p, m->start);
    p = cp_put_uv(p, m->limit);
    p = cp_put_uv(p, m->offset);
    p = cp_put_uv(p, m->filename);
    p = cp_put_uv(p, m->build_id);
    p = cp_put_uv(p, m->flags);
    put_entry(d, CP_D_MAPPING, nid, v, (size_t)(p - v));
    *id = nid;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Locations and stacks
 * --------------------------------------------------------------------------------- */

typedef struct lkey {
    const cp_location *l;
    const cp_line *lines;
} lkey;

static uint64_t loc_hash(const cp_location *l, const cp_line *lines)
{
    uint64_t h = cp_hash_u64(0x10c, l->address);
    h = cp_hash_u64(h, l->mapping_id);
    h = cp_hash_u64(h, l->is_folded);
    for (uint32_t i = 0; i < l->nlines; i++) {
        h = cp_hash_u64(h, lines[i].function_id);
        h = cp_hash_u64(h, (uint64_t)lines[i].line);
    }
    return h;
}

static int loc_eq(const cp_dict *d, uint32_t id, const void *key)
{
    const lkey *k = key;
    const cp_location *a = &d->loc.v[id - 1];
    if (a->address != k->l->address || a->mapping_id != k->l->mapping_id ||
        a->is_folded != k->l->is_folded || a->nlines != k->l->nlines)
        return 0;
    const cp_line *al = a->nlines ? d->lines.v + a->line_off : NULL;
    for (uint32_t i = 0; i < a->nlines; i++)
        if (al[i].function_id != k->lines[i].function_id || al[i].line != k->lines[i].line)
            return 0;
    return 1;
}

static uint64_t addr_hash(uint32_t mid, uint64_t addr)
{
    return cp_hash_u64(cp_hash_u64(0xadd7, mid), addr);
}

static int loc_add(cp_dict *d, const cp_location *l, const cp_line *lines, uint64_t h, uint32_t *id)
{
    if (l->address && idx_insert(&d->ai, addr_hash(l->mapping_id, l->address), d->loc.n + 1))
        return CP_ENOMEM;
    if (cp_vec_reserve(&d->lines, (size_t)d->lines.n + l->nlines)) return CP_ENOMEM;
    cp_location nl = *l;
    nl.line_off = d->lines.n;
    if (cp_vec_push(&d->loc, nl)) return CP_ENOMEM;
    if (idx_insert(&d->li, h, d->loc.n)) {
        d->loc.n--;
        return CP_ENOMEM;
    }
    if (l->nlines) memcpy(d->lines.v + d->lines.n, lines, sizeof(cp_line) * l->nlines);
    d->lines.n += l->nlines;
    *id = d->loc.n;
    return 0;
}

int cp_dict_location(cp_dict *d, const cp_location *l, const cp_line *lines, uint32_t *id)
{
    uint64_t h = loc_hash(l, lines);
    lkey k = {l, lines};
    uint32_t got = idx_find(&d->li, h, loc_eq, d, &k);
    if (got) {
        *id = got;
        return 0;
    }
    if (loc_add(d, l, lines, h, id)) return CP_ENOMEM;
    size_t cap = 40 + (size_t)l->nlines * 20;
    uint8_t sv[512], *v = cap <= sizeof sv ? sv : malloc(cap), *p = v;
    if (!v) return CP_ENOMEM; /* the entry stays in memory; the batch will fail later */
    p = cp_put_uv(p, l->mapping_id);
    p = cp_put_uv(p, l->address);
    p = cp_put_uv(p, l->is_folded);
    p = cp_put_uv(p, l->nlines);
    for (uint32_t i = 0; i < l->nlines; i++) {
        p = cp_put_uv(p, lines[i].function_id);
        p = cp_put_uv(p, cp_zz(lines[i].line));
    }
    put_entry(d, CP_D_LOCATION, *id, v, (size_t)(p - v));
    if (v != sv) free(v);
    return 0;
}

/* String sid of p (its length from the table's offsets). */
static const char *pstr(const cp_profile *p, uint32_t sid, size_t *len)
{
    if (sid == 0 || sid >= p->strs.off.n) {
        *len = 0;
        return "";
    }
    const char *s = p->strs.buf + p->strs.off.v[sid];
    *len = sid + 1 < p->strs.off.n ? p->strs.off.v[sid + 1] - p->strs.off.v[sid] - 1 : strlen(s);
    return s;
}

/* Content equality of dict string did and profile string sid; smap (profile sid -> dict
 * id + 1) remembers what was found equal, so each profile string is compared once. */
static inline __attribute__((always_inline)) int
str_same(const cp_dict *d, uint32_t did, const cp_profile *p, uint32_t sid, uint32_t *smap)
{
    if (sid && sid < p->strs.off.n && smap[sid]) return smap[sid] - 1 == did;
    size_t a, b;
    const char *x = cp_dict_str(d, did, &a), *y = pstr(p, sid, &b);
    if (a != b || memcmp(x, y, a)) return 0;
    if (sid && sid < p->strs.off.n) smap[sid] = did + 1;
    return 1;
}

static int fn_same(const cp_dict *d, uint32_t dfid, const cp_profile *p, uint32_t pfid,
                   uint32_t *smap, uint32_t *fmap)
{
    if (!pfid || pfid > p->functions.n) return dfid == 0;
    if (fmap[pfid]) return fmap[pfid] == dfid;
    if (!dfid || dfid > d->fn.n) return 0;
    const cp_function *df = &d->fn.v[dfid - 1], *pf = &p->functions.v[pfid - 1];
    /* a system name that is the name itself (the usual case) needs no second compare */
    if (df->start_line == pf->start_line && str_same(d, df->name, p, pf->name, smap) &&
        (df->system_name == df->name ? pf->system_name == pf->name
                                     : str_same(d, df->system_name, p, pf->system_name, smap)) &&
        str_same(d, df->filename, p, pf->filename, smap)) {
        fmap[pfid] = dfid;
        return 1;
    }
    return 0;
}

int cp_dict_location_known(const cp_dict *d, const cp_profile *p, const cp_location *l,
                           uint32_t mid, uint64_t address, uint32_t *smap, uint32_t *fmap,
                           uint32_t *id)
{
    const cp_idx *x = &d->ai;
    if (!x->nslots || !address || (size_t)l->line_off + l->nlines > p->lines.n) return 0;
    uint64_t h = addr_hash(mid, address);
    uint32_t m = x->nslots - 1, i = (uint32_t)h & m;
    for (; x->ids[i]; i = (i + 1) & m) {
        if (x->hs[i] != h) continue;
        const cp_location *dl = &d->loc.v[x->ids[i] - 1];
        if (dl->address != address || dl->mapping_id != mid || dl->is_folded != l->is_folded ||
            dl->nlines != l->nlines)
            continue;
        uint32_t j = 0;
        for (; j < l->nlines; j++) {
            const cp_line *a = &d->lines.v[dl->line_off + j], *b = &p->lines.v[l->line_off + j];
            if (a->line != b->line || !fn_same(d, a->function_id, p, b->function_id, smap, fmap))
                break;
        }
        if (j == l->nlines) {
            *id = x->ids[i];
            return 1;
        }
    }
    return 0;
}

typedef struct kkey {
    const uint32_t *locs;
    uint32_t nlocs;
    const cp_label *labels;
    uint32_t nlabels;
} kkey;

static uint64_t stk_hash(const kkey *k)
{
    uint64_t h = cp_hash_bytes(k->locs, sizeof(uint32_t) * k->nlocs, 0x57ac);
    for (uint32_t i = 0; i < k->nlabels; i++) {
        h = cp_hash_u64(h, k->labels[i].key);
        h = cp_hash_u64(h, k->labels[i].str);
        h = cp_hash_u64(h, (uint64_t)k->labels[i].num);
        h = cp_hash_u64(h, k->labels[i].num_unit);
    }
    return h;
}

static int stk_eq(const cp_dict *d, uint32_t id, const void *key)
{
    const kkey *k = key;
    const cp_sample *s = &d->stk.v[id - 1];
    if (s->nlocs != k->nlocs || s->nlabels != k->nlabels) return 0;
    if (k->nlocs && memcmp(d->stk_locs.v + s->loc_off, k->locs, sizeof(uint32_t) * k->nlocs))
        return 0;
    const cp_label *a = k->nlabels ? d->stk_labels.v + s->label_off : NULL;
    for (uint32_t i = 0; i < k->nlabels; i++)
        if (a[i].key != k->labels[i].key || a[i].str != k->labels[i].str ||
            a[i].num != k->labels[i].num || a[i].num_unit != k->labels[i].num_unit)
            return 0;
    return 1;
}

static int stk_add(cp_dict *d, const kkey *k, uint64_t h, uint32_t *id)
{
    if (cp_vec_reserve(&d->stk_locs, (size_t)d->stk_locs.n + k->nlocs) ||
        cp_vec_reserve(&d->stk_labels, (size_t)d->stk_labels.n + k->nlabels))
        return CP_ENOMEM;
    cp_sample s = {d->stk_locs.n, k->nlocs, d->stk_labels.n, k->nlabels};
    if (cp_vec_push(&d->stk, s)) return CP_ENOMEM;
    if (idx_insert(&d->ki, h, d->stk.n)) {
        d->stk.n--;
        return CP_ENOMEM;
    }
    if (k->nlocs) memcpy(d->stk_locs.v + d->stk_locs.n, k->locs, sizeof(uint32_t) * k->nlocs);
    d->stk_locs.n += k->nlocs;
    if (k->nlabels)
        memcpy(d->stk_labels.v + d->stk_labels.n, k->labels, sizeof(cp_label) * k->nlabels);
    d->stk_labels.n += k->nlabels;
    *id = d->stk.n;
    return 0;
}

int cp_dict_stack(cp_dict *d, const uint32_t *locs, uint32_t nlocs, const cp_label *labels,
                  uint32_t nlabels, uint32_t *id)
{
    kkey k = {locs, nlocs, labels, nlabels};
    uint64_t h = stk_hash(&k);
    uint32_t got = idx_find(&d->ki, h, stk_eq, d, &k);
    if (got) {
        *id = got;
        return 0;
    }
    if (stk_add(d, &k, h, id)) return CP_ENOMEM;
    size_t cap = 20 + (size_t)nlocs * 5 + (size_t)nlabels * 40;
    uint8_t sv[1024], *v = cap <= sizeof sv ? sv : malloc(cap), *p = v;
    if (!v) return CP_ENOMEM;
    p = cp_put_uv(p, nlocs);
    for (uint32_t i = 0; i < nlocs; i++)
        p = cp_put_uv(p, locs[i]);
    p = cp_put_uv(p, nlabels);
    for (uint32_t i = 0; i < nlabels; i++) {
        p = cp_put_uv(p, labels[i].key);
        p = cp_put_uv(p, labels[i].str);
        p = cp_put_uv(p, cp_zz(labels[i].num));
        p = cp_put_uv(p, labels[i].num_unit);
    }
    put_entry(d, CP_D_STACK, *id, v, (size_t)(p - v));
    if (v != sv) free(v);
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Loading at open
 * --------------------------------------------------------------------------------- */

int cp_dict_load(cp_dict *d, uint8_t kind, uint32_t id, const uint8_t *v, size_t len, cp_err *err)
{
    cp_rd r = {v, v + len, 0};
    uint32_t expect;
    switch (kind) {
    case CP_D_STRING:
        expect = d->soff.n - 1;
        break;
    case CP_D_FUNCTION:
        expect = d->fn.n + 1;
        break;
    case CP_D_MAPPING:
        expect = d->map.n + 1;
        break;
    case CP_D_LOCATION:
        expect = d->loc.n + 1;
        break;
    case CP_D_STACK:
        expect = d->stk.n + 1;
        break;
    default:
        return cp_err_set(err, CP_ESTORE, "dictionary entry of unknown kind 0x%02x", kind);
    }
    if (id != expect)
        return cp_err_set(err, CP_ESTORE, "dictionary '%c' of tenant %s: id %u where %u expected",
                          kind, d->tenant, id, expect);
    uint32_t got = 0;
    int rc = 0;
    switch (kind) {
    case CP_D_STRING: {
        uint64_t h = str_hash((const char *)v, len);
        if ((rc = str_append(d, (const char *)v, len))) break;
        rc = idx_insert(&d->si, h, id);
        got = id;
        break;
    }
    case CP_D_FUNCTION: {
        cp_function f;
        f.name = (uint32_t)cp_get_uv(&r);
        f.system_name = (uint32_t)cp_get_uv(&r);
        f.filename = (uint32_t)cp_get_uv(&r);
        f.start_line = cp_get_sv(&r);
        if (r.bad) break;
        uint64_t h = fn_hash(&f);
        if ((rc = cp_vec_push(&d->fn, f))) break;
        rc = idx_insert(&d->fi, h, id);
        got = id;
        break;
    }
    case CP_D_MAPPING: {
        cp_mapping m;
        m.start = cp_get_uv(&r);
        m.limit = cp_get_uv(&r);
        m.offset = cp_get_uv(&r);
        m.filename = (uint32_t)cp_get_uv(&r);
        m.build_id = (uint32_t)cp_get_uv(&r);
        m.flags = (uint32_t)cp_get_uv(&r);
        if (r.bad) break;
        uint64_t h = map_hash(&m);
        if ((rc = cp_vec_push(&d->map, m))) break;
        rc = idx_insert(&d->mi, h, id);
        got = id;
        break;
    }
    case CP_D_LOCATION: {
        cp_location l = {0};
        l.mapping_id = (uint32_t)cp_get_uv(&r);
        l.address = cp_get_uv(&r);
        l.is_folded = (uint32_t)cp_get_uv(&r);
        uint64_t n = cp_get_uv(&r);
        if (r.bad || n > len) {
            r.bad = 1;
            break;
        }
        l.nlines = (uint32_t)n;
        cp_line *lines = malloc(sizeof(cp_line) * (n ? n : 1));
        if (!lines) return cp_err_set(err, CP_ENOMEM, "dictionary");
        for (uint32_t i = 0; i < n; i++) {
            lines[i].function_id = (uint32_t)cp_get_uv(&r);
            lines[i].line = cp_get_sv(&r);
        }
        if (!r.bad) rc = loc_add(d, &l, lines, loc_hash(&l, lines), &got);
        free(lines);
        break;
    }
    case CP_D_STACK: {
        uint64_t n = cp_get_uv(&r);
        if (r.bad || n > len) {
            r.bad = 1;
            break;
        }
        uint32_t *locs = malloc(sizeof(uint32_t) * (n ? n : 1));
        if (!locs) return cp_err_set(err, CP_ENOMEM, "dictionary");
        for (uint32_t i = 0; i < n; i++)
            locs[i] = (uint32_t)cp_get_uv(&r);
        uint64_t nl = cp_get_uv(&r);
        cp_label *labels = NULL;
        if (r.bad || nl > len) {
            r.bad = 1;
        } else {
            labels = malloc(sizeof(cp_label) * (nl ? nl : 1));
            if (!labels) {
                free(locs);
                return cp_err_set(err, CP_ENOMEM, "dictionary");
            }
            for (uint32_t i = 0; i < nl; i++) {
                labels[i].key = (uint32_t)cp_get_uv(&r);
                labels[i].str = (uint32_t)cp_get_uv(&r);
                labels[i].num = cp_get_sv(&r);
                labels[i].num_unit = (uint32_t)cp_get_uv(&r);
            }
        }
        if (!r.bad) {
            kkey k = {locs, (uint32_t)n, labels, (uint32_t)nl};
            rc = stk_add(d, &k, stk_hash(&k), &got);
        }
        free(locs);
        free(labels);
        break;
    }
    }
    if (rc) return cp_err_set(err, rc, "dictionary of tenant %s: out of memory", d->tenant);
    if (r.bad || got != id)
        return cp_err_set(err, CP_ESTORE, "dictionary '%c' entry %u of tenant %s is corrupt", kind,
                          id, d->tenant);
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Canonical identity of a format-1 store's entries
 * --------------------------------------------------------------------------------- */

int cp_dict_canonicalize(cp_dict *d)
{
    uint32_t *malias = malloc(sizeof(uint32_t) * ((size_t)d->map.n + 1));
    uint64_t *delta = malloc(sizeof(uint64_t) * ((size_t)d->map.n + 1));
    uint32_t *lalias = malloc(sizeof(uint32_t) * ((size_t)d->loc.n + 1));
    int rc = CP_ENOMEM;
    if (!malias || !delta || !lalias) goto done;

    /* mappings: canonical form, the first of equal ones is the one kept in the index */
    idx_close(&d->mi);
    malias[0] = 0;
    delta[0] = 0;
    for (uint32_t i = 1; i <= d->map.n; i++) {
        cp_mapping *m = &d->map.v[i - 1];
        size_t fl, bl;
        const char *f = cp_dict_str(d, m->filename, &fl);
        (void)cp_dict_str(d, m->build_id, &bl);
        delta[i] = cp_mapping_names_object(f, fl, bl) ? cp_mapping_canonicalize(m) : 0;
        uint64_t h = map_hash(m);
        uint32_t got = idx_find(&d->mi, h, map_eq, d, m);
        if (got) {
            malias[i] = got;
        } else {
            if (idx_insert(&d->mi, h, i)) goto done;
            malias[i] = i;
        }
    }

    /* locations: canonical address in the kept mapping; equal ones collapse likewise */
    idx_close(&d->li);
    idx_close(&d->ai);
    lalias[0] = 0;
    for (uint32_t i = 1; i <= d->loc.n; i++) {
        cp_location *l = &d->loc.v[i - 1];
        if (l->mapping_id && l->mapping_id <= d->map.n) {
            if (l->address) l->address += delta[l->mapping_id]; /* 0: none given */
            l->mapping_id = malias[l->mapping_id];
        }
        const cp_line *lines = l->nlines ? d->lines.v + l->line_off : NULL;
        uint64_t h = loc_hash(l, lines);
        lkey k = {l, lines};
        uint32_t got = idx_find(&d->li, h, loc_eq, d, &k);
        if (got) {
            lalias[i] = got;
            continue;
        }
        if (idx_insert(&d->li, h, i) ||
            (l->address && idx_insert(&d->ai, addr_hash(l->mapping_id, l->address), i)))
            goto done;
        lalias[i] = i;
    }

    /* stacks: through the kept locations. Two stacks that become equal both stay (blocks
     * refer to both ids); queries read the later one as the first (stk_alias). */
    idx_close(&d->ki);
    free(d->stk_alias);
    d->nstk_alias = 0;
    if (!(d->stk_alias = malloc(sizeof(uint32_t) * ((size_t)d->stk.n + 1)))) goto done;
    d->nstk_alias = d->stk.n + 1;
    d->stk_alias[0] = 0;
    for (uint32_t i = 1; i <= d->stk.n; i++) {
        const cp_sample *st = &d->stk.v[i - 1];
        /* (an empty stack of an empty vector has no pointer to offset) */
        uint32_t *locs = st->nlocs ? d->stk_locs.v + st->loc_off : NULL;
        for (uint32_t j = 0; j < st->nlocs; j++)
            if (locs[j] <= d->loc.n) locs[j] = lalias[locs[j]];
        kkey k = {locs, st->nlocs, st->nlabels ? d->stk_labels.v + st->label_off : NULL,
                  st->nlabels};
        uint64_t h = stk_hash(&k);
        uint32_t got = idx_find(&d->ki, h, stk_eq, d, &k);
        d->stk_alias[i] = got ? got : i;
        if (!got && idx_insert(&d->ki, h, i)) goto done;
    }
    rc = 0;
done:
    free(malias);
    free(delta);
    free(lalias);
    return rc;
}
