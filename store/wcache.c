/* The writer's per-series cache of what a series' windows share (store/README.md, "The
 * stack cache"). An agent numbers a stream's tables stably (collector/README.md): window
 * N+1 lists window N's mappings, locations and functions with the same ids and contents, and
 * a stack it sent before as the same bytes of location ids. The cache keeps the tables of
 * the last window it followed, what their locations are in the dictionary, and for each
 * sample's packed location ids (bytes, as the decoder left them lazy) the dictionary stack
 * they made. A window whose tables start with the cached ones (compared entry by entry, not
 * trusted) reuses both; anything else takes the full path and the cache follows it. */
#include "store_int.h"

/* Bounds of one series' stacks (past them new stacks are not remembered; the cache still
 * serves the ones it has). The store-wide budget is s->wcache_budget. */
#define WC_MAX_STACKS 65536
#define WC_MAX_STACK_BYTES (4u << 20)
/* A window with more table bytes than this (location messages, or the strings its
 * mappings and functions name) is not followed: its series has no cache. */
#define WC_MAX_TABLE_BYTES (4u << 20)

/* A stack is one record in c->bytes, 4-byte aligned: its ids' length, its dictionary
 * stack id, then the ids' bytes; a slot points at it. A lookup touches the slot and the
 * record's one or two cache lines, nothing else. */
typedef struct wc_rec {
    uint32_t len, sid;
} wc_rec;

struct cp_wcache {
    /* the followed window's tables: its nloc location messages (their bytes, as sent),
     * nmap mappings, nfn functions, and strings [0, nstr) (every string they name) */
    uint32_t nloc, nmap, nfn, nstr;
    cp_buf locbytes;
    CP_VEC(cp_mapping) map;
    CP_VEC(cp_function) fn;
    CP_VEC(uint32_t) soff;
    cp_buf sbytes;
    CP_VEC(uint32_t) locmap; /* location index -> dictionary location id */
    /* stacks: slots hold (hash >> 32) << 32 | (record offset + 1), 0 = empty */
    uint64_t *slots;
    uint32_t nslots, n;
    cp_buf bytes;
};

size_t cp_wcache_bytes(const cp_wcache *c)
{
    if (!c) return 0;
    return sizeof *c + c->locbytes.cap + (size_t)c->map.cap * sizeof(cp_mapping) +
           (size_t)c->fn.cap * sizeof(cp_function) + (size_t)c->soff.cap * 4 + c->sbytes.cap +
           (size_t)c->locmap.cap * 4 + (size_t)c->nslots * 8 + c->bytes.cap;
}

void cp_wcache_free(cp_wcache *c)
{
    if (!c) return;
    cp_buf_close(&c->locbytes);
    free(c->map.v);
    free(c->fn.v);
    free(c->soff.v);
    cp_buf_close(&c->sbytes);
    free(c->locmap.v);
    free(c->slots);
    cp_buf_close(&c->bytes);
    free(c);
}

/* Byte length of strings [0, n) of p. */
static size_t str_bytes(const cp_profile *p, uint32_t n)
{
    return n < p->strs.off.n ? p->strs.off.v[n] : p->strs.len;
}

static int mapping_eq(const cp_mapping *a, const cp_mapping *b)
{
    return a->start == b->start && a->limit == b->limit && a->offset == b->offset &&
           a->filename == b->filename && a->build_id == b->build_id && a->flags == b->flags;
}

static int function_eq(const cp_function *a, const cp_function *b)
{
    return a->name == b->name && a->system_name == b->system_name && a->filename == b->filename &&
           a->start_line == b->start_line;
}

uint32_t cp_wcache_match(const cp_wcache *c, const cp_profile *p, const cp_pprof_lazy *lz)
{
    if (!c || !c->nloc || !lz->nloc) return 0;
    if (lz->nloc < c->nloc || lz->locs_len < c->locbytes.len || p->mappings.n < c->nmap ||
        p->functions.n < c->nfn || p->strs.off.n < c->nstr)
        return 0;
    /* strings first (few for an unsymbolized window), then what refers to them */
    if (str_bytes(p, c->nstr) != c->sbytes.len ||
        memcmp(p->strs.off.v, c->soff.v, (size_t)c->nstr * 4) ||
        memcmp(p->strs.buf, c->sbytes.data, c->sbytes.len))
        return 0;
    for (uint32_t i = 0; i < c->nmap; i++)
        if (!mapping_eq(&p->mappings.v[i], &c->map.v[i])) return 0;
    for (uint32_t i = 0; i < c->nfn; i++)
        if (!function_eq(&p->functions.v[i], &c->fn.v[i])) return 0;
    /* the cached messages, whole: the window's first nloc messages are the same ones */
    if (memcmp(lz->locs, c->locbytes.data, c->locbytes.len)) return 0;
    return c->nloc;
}

size_t cp_wcache_locbytes(const cp_wcache *c)
{
    return c->locbytes.len;
}

const uint32_t *cp_wcache_locmap(const cp_wcache *c)
{
    return c->locmap.v;
}

static const wc_rec *rec_at(const cp_wcache *c, uint64_t slot)
{
    return (const wc_rec *)(const void *)(c->bytes.data + (uint32_t)slot - 1);
}

void cp_wcache_find_all(const cp_wcache *c, uint32_t n, const cp_pprof_ids *ids, const uint64_t *h,
                        uint32_t *sid)
{
    memset(sid, 0, (size_t)n * sizeof *sid);
    if (!c || !c->nslots) return;
    uint32_t mask = c->nslots - 1;
    /* the slots of the next samples and the records of the nearer ones are fetched while
     * this one is compared: the tables of many series do not stay in the cache */
    enum { AHEAD = 8 };
    for (uint32_t i = 0; i < n && i < AHEAD; i++)
        if (h[i]) __builtin_prefetch(&c->slots[(uint32_t)h[i] & mask]);
    for (uint32_t i = 0; i < n; i++) {
        if (i + AHEAD < n && h[i + AHEAD])
            __builtin_prefetch(&c->slots[(uint32_t)h[i + AHEAD] & mask]);
        if (i + AHEAD / 2 < n && h[i + AHEAD / 2]) {
            uint64_t s = c->slots[(uint32_t)h[i + AHEAD / 2] & mask];
            if (s) __builtin_prefetch(rec_at(c, s));
        }
        if (!h[i]) continue;
        uint32_t tag = (uint32_t)(h[i] >> 32);
        for (uint32_t j = (uint32_t)h[i] & mask;; j = (j + 1) & mask) {
            uint64_t s = c->slots[j];
            if (!s) break;
            if ((uint32_t)(s >> 32) != tag) continue;
            const wc_rec *r = rec_at(c, s);
            if (r->len == ids[i].len && !memcmp(r + 1, ids[i].p, r->len)) {
                sid[i] = r->sid;
                break;
            }
        }
    }
}

static int slots_grow(cp_wcache *c)
{
    uint32_t n = c->nslots ? c->nslots * 2 : 1024;
    uint64_t *s = calloc(n, sizeof *s);
    if (!s) return CP_ENOMEM;
    for (uint32_t i = 0; i < c->nslots; i++) {
        if (!c->slots[i]) continue;
        const wc_rec *r = rec_at(c, c->slots[i]);
        uint64_t h = cp_wcache_hash((const uint8_t *)(r + 1), r->len);
        uint32_t j = (uint32_t)h & (n - 1);
        while (s[j])
            j = (j + 1) & (n - 1);
        s[j] = c->slots[i];
    }
    free(c->slots);
    c->slots = s;
    c->nslots = n;
    return 0;
}

int cp_wcache_put(cp_wcache *c, const uint8_t *b, uint32_t len, uint64_t h, uint32_t sid)
{
    size_t need = sizeof(wc_rec) + ((len + 3u) & ~3u);
    if (c->n >= WC_MAX_STACKS || c->bytes.len + need > WC_MAX_STACK_BYTES) return 0;
    if ((size_t)(c->n + 1) * 2 > c->nslots && slots_grow(c)) return CP_ENOMEM;
    uint32_t off = (uint32_t)c->bytes.len;
    wc_rec r = {len, sid};
    if (cp_buf_reserve(&c->bytes, need)) return CP_ENOMEM;
    uint8_t *d = c->bytes.data + off;
    memcpy(d, &r, sizeof r);
    memcpy(d + sizeof r, b, len);
    memset(d + sizeof r + len, 0, need - sizeof r - len); /* the padding */
    c->bytes.len += need;
    uint32_t mask = c->nslots - 1, j = (uint32_t)h & mask;
    while (c->slots[j])
        j = (j + 1) & mask;
    c->slots[j] = (h >> 32) << 32 | (off + 1);
    c->n++;
    return 0;
}

/* The string ids that p's tables name: one past the largest. */
static uint32_t strings_named(const cp_profile *p)
{
    uint32_t n = 1;
#define SEEN(x)                                                                                    \
    do {                                                                                           \
        if ((x) + 1 > n) n = (x) + 1;                                                              \
    } while (0)
    for (uint32_t i = 0; i < p->mappings.n; i++) {
        SEEN(p->mappings.v[i].filename);
        SEEN(p->mappings.v[i].build_id);
    }
    for (uint32_t i = 0; i < p->functions.n; i++) {
        SEEN(p->functions.v[i].name);
        SEEN(p->functions.v[i].system_name);
        SEEN(p->functions.v[i].filename);
    }
#undef SEEN
    return n < p->strs.off.n ? n : p->strs.off.n;
}

int cp_wcache_follow(cp_wcache **cp, const cp_profile *p, const cp_pprof_lazy *lz,
                     const uint32_t *locmap, int keep)
{
    cp_wcache *c = *cp;
    uint32_t named = strings_named(p);
    if (lz->locs_len > WC_MAX_TABLE_BYTES || str_bytes(p, named) > WC_MAX_TABLE_BYTES) {
        cp_wcache_free(c);
        *cp = NULL;
        return CP_ELIMIT;
    }
    if (!c && !(c = *cp = calloc(1, sizeof *c))) return CP_ENOMEM;
    if (!keep) { /* a new table: the stacks it made no longer mean anything */
        c->nloc = c->nmap = c->nfn = c->nstr = 0;
        c->map.n = c->fn.n = c->soff.n = c->locmap.n = 0;
        c->sbytes.len = c->bytes.len = c->locbytes.len = 0;
        c->n = 0;
        if (c->slots) memset(c->slots, 0, (size_t)c->nslots * sizeof *c->slots);
    }
    /* append what p has past the cached tables (all of it after a reset) */
    uint32_t nstr = named < c->nstr ? c->nstr : named;
    size_t sb = str_bytes(p, nstr);
    if (cp_vec_reserve(&c->locmap, lz->nloc) || cp_vec_reserve(&c->map, p->mappings.n) ||
        cp_vec_reserve(&c->fn, p->functions.n) || cp_vec_reserve(&c->soff, nstr))
        goto nomem;
    if (nstr != c->soff.n || sb != c->sbytes.len) { /* matched: only ever longer */
        c->sbytes.len = 0;
        if (cp_buf_append(&c->sbytes, p->strs.buf, sb)) goto nomem;
        memcpy(c->soff.v, p->strs.off.v, (size_t)nstr * 4);
        c->soff.n = nstr;
    }
    for (uint32_t i = c->map.n; i < p->mappings.n; i++)
        c->map.v[c->map.n++] = p->mappings.v[i];
    for (uint32_t i = c->fn.n; i < p->functions.n; i++)
        c->fn.v[c->fn.n++] = p->functions.v[i];
    /* the window's location messages begin with the cached ones (matched, or none after a
     * reset): add the rest */
    if (cp_buf_append(&c->locbytes, lz->locs + c->locbytes.len, lz->locs_len - c->locbytes.len))
        goto nomem;
    for (uint32_t i = c->locmap.n; i < lz->nloc; i++)
        c->locmap.v[c->locmap.n++] = locmap[i + 1];
    c->nloc = lz->nloc;
    c->nmap = c->map.n;
    c->nfn = c->fn.n;
    c->nstr = nstr;
    return 0;
nomem:
    cp_wcache_free(c);
    *cp = NULL;
    return CP_ENOMEM;
}
