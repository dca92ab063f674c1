/* The tables of each stream (isolate, kind) kept from one window to the next: a window's
 * profile is the stream's epoch (mappings, locations, functions, their strings) with this
 * window's samples, so a stack already seen in the epoch costs no new table entry and no
 * symbolization, and ingest can skip what a window shares with the previous one. */
#include "guard.h"
#include "stream.h"

#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include "isolate.h"

struct cp_stream {
    cp_stream_key key;
    uint64_t used; /* the window it was last ended in (S.window), for eviction */
    cp_profile *p;
    uint32_t nstrings; /* strings of the epoch: [0, nstrings) */
    cp_symbolize_fn symbolize;
    void *sym_arg;
    /* the module snapshot map_id was built for, by its dl_iterate_phdr counters */
    const cp_modules *mods;
    uint64_t adds, subs;
    uint32_t *map_id; /* module index -> mapping id (0: none yet) */
    /* by mapping id - 1: the module's run-time start, and what to add to a run-time
     * address to get the canonical one (cp_mapping_canonicalize) */
    CP_VEC(uint64_t) map_lo;
    CP_VEC(uint64_t) map_delta;
    /* pc -> location id; (name, system name, file) string ids -> function id */
    uint64_t *loc_pc;
    uint32_t *loc_id;
    uint32_t loc_cap;
    uint64_t *fn_key;
    uint32_t *fn_id;
    uint32_t fn_cap, fn_n;
    int err;
};

static struct {
    cp_stream *slot[CP_STREAMS_MAX];
    uint64_t window; /* windows done (cp_streams_window_done) */
    uint32_t max_streams, max_locations;
    size_t max_bytes;
    int bounds_set;
} S;

static void bounds_default(void)
{
    if (S.bounds_set) return;
    S.bounds_set = 1;
    S.max_streams = CP_STREAMS_MAX;
    S.max_locations = CP_STREAM_MAX_LOCATIONS;
    S.max_bytes = CP_STREAM_MAX_BYTES;
}

/* ------------------------------------------------------------------------------------
 * One stream's tables */

static void stream_destroy(cp_stream *s)
{
    if (!s) return;
    cp_profile_destroy(s->p);
    free(s->map_id);
    free(s->map_lo.v);
    free(s->map_delta.v);
    free(s->loc_pc);
    free(s->loc_id);
    free(s->fn_key);
    free(s->fn_id);
    free(s);
}

static uint32_t str_id(cp_stream *s, const char *str)
{
    uint32_t id = 0;
    if (str && cp_profile_intern_cstr(s->p, str, &id) != 0) s->err = CP_ENOMEM;
    return id;
}

static int set_mods(cp_stream *s, const cp_modules *mods)
{
    free(s->map_id);
    s->map_id = NULL;
    s->mods = mods;
    s->adds = mods ? mods->adds : 0;
    s->subs = mods ? mods->subs : 0;
    if (!mods) return 0;
    s->map_id = calloc(mods->n + 1, sizeof(uint32_t));
    return s->map_id ? 0 : CP_ENOMEM;
}

static uint32_t mapping_for(cp_stream *s, uint64_t pc)
{
    const cp_module *m = s->mods ? cp_modules_find(s->mods, pc) : NULL;
    if (!m) return 0;
    uint32_t idx = (uint32_t)(m - s->mods->m);
    if (s->map_id[idx]) return s->map_id[idx];
    static const char digits[] = "0123456789abcdef";
    char hex[2 * CP_BUILD_ID_MAX + 1];
    for (uint32_t i = 0; i < m->build_id_len; i++) {
        hex[2 * i] = digits[m->build_id[i] >> 4];
        hex[2 * i + 1] = digits[m->build_id[i] & 15];
    }
    hex[2 * m->build_id_len] = 0;
    cp_mapping mp = {
        .start = m->lo,
        .limit = m->hi,
        .offset = m->file_offset,
        .filename = str_id(s, m->path),
        .build_id = str_id(s, hex),
        .flags = s->symbolize ? CP_MAP_HAS_FUNCTIONS | CP_MAP_HAS_FILENAMES |
                                    CP_MAP_HAS_LINE_NUMBERS | CP_MAP_HAS_INLINE_FRAMES
                              : 0,
    };
    /* Canonical once, when added (the kept mapping must not move again): the same values
     * cp_profile_canonicalize gives a whole profile. */
    uint64_t delta = 0;
    const char *file = cp_profile_str(s->p, mp.filename), *bid = cp_profile_str(s->p, mp.build_id);
    if (cp_mapping_names_object(file, strlen(file), strlen(bid)))
        delta = cp_mapping_canonicalize(&mp);
    uint32_t id = 0;
    if (cp_vec_reserve(&s->map_lo, (size_t)s->p->mappings.n + 1) ||
        cp_vec_reserve(&s->map_delta, (size_t)s->p->mappings.n + 1) ||
        cp_profile_add_mapping(s->p, &mp, &id) != 0) {
        s->err = CP_ENOMEM;
        return 0;
    }
    s->map_lo.v[s->map_lo.n++] = m->lo;
    s->map_delta.v[s->map_delta.n++] = delta;
    s->map_id[idx] = id;
    return id;
}

/* pprof takes the first mapping for the program ("File:" in go tool pprof): put the main
 * executable's (the one holding the entry point) first. */
static void main_mapping_first(cp_stream *s)
{
    unsigned long entry = getauxval(AT_ENTRY);
    if (s->mods && entry) (void)mapping_for(s, (uint64_t)entry);
}

static cp_stream *stream_create(const cp_stream_key *k, const cp_modules *mods,
                                cp_symbolize_fn symbolize, void *arg)
{
    cp_stream *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->key = *k;
    s->symbolize = symbolize;
    s->sym_arg = arg;
    s->p = cp_profile_create();
    /* small at first, doubled as locations come: a short process's window has a few dozen,
     * and each of its four streams (cpu, alloc, inuse, the agent's own) took three fresh
     * pages at 1,024 (~11 page faults a process, ~2.5 us each here) */
    s->loc_cap = 64;
    s->loc_pc = calloc(s->loc_cap, sizeof(uint64_t));
    s->loc_id = calloc(s->loc_cap, sizeof(uint32_t));
    if (!s->p || !s->loc_pc || !s->loc_id || set_mods(s, mods) != 0) goto fail;
    main_mapping_first(s);
    if (s->err) goto fail;
    return s;
fail:
    stream_destroy(s);
    return NULL;
}

/* Functions are deduplicated through the profile's own string ids (name, system name,
 * file) with a small linear-probing table. */
static uint32_t add_function(cp_stream *s, const char *name, const char *sys, const char *file)
{
    cp_function f = {.name = str_id(s, name), .system_name = 0, .filename = str_id(s, file)};
    f.system_name = sys ? str_id(s, sys) : f.name;
    uint64_t key = cp_hash_u64(cp_hash_u64(f.name, f.system_name), f.filename) | 1;
    if (s->fn_n * 2 >= s->fn_cap) { /* grow the index */
        uint32_t nc = s->fn_cap ? s->fn_cap * 2 : 32;
        uint64_t *nk = calloc(nc, sizeof(uint64_t));
        uint32_t *ni = calloc(nc, sizeof(uint32_t));
        if (!nk || !ni) {
            free(nk);
            free(ni);
            s->err = CP_ENOMEM;
            return 0;
        }
        for (uint32_t i = 0; i < s->fn_cap; i++) {
            if (!s->fn_id[i]) continue;
            uint32_t j = (uint32_t)s->fn_key[i] & (nc - 1);
            while (ni[j])
                j = (j + 1) & (nc - 1);
            nk[j] = s->fn_key[i];
            ni[j] = s->fn_id[i];
        }
        free(s->fn_key);
        free(s->fn_id);
        s->fn_key = nk;
        s->fn_id = ni;
        s->fn_cap = nc;
    }
    uint32_t mask = s->fn_cap - 1, i = (uint32_t)key & mask;
    for (; s->fn_id[i]; i = (i + 1) & mask) {
        const cp_function *g = &s->p->functions.v[s->fn_id[i] - 1];
        if (s->fn_key[i] == key && g->name == f.name && g->system_name == f.system_name &&
            g->filename == f.filename)
            return s->fn_id[i];
    }
    uint32_t id = 0;
    if (cp_profile_add_function(s->p, &f, &id) != 0) {
        s->err = CP_ENOMEM;
        return 0;
    }
    s->fn_key[i] = key;
    s->fn_id[i] = id;
    s->fn_n++;
    return id;
}

static int loc_grow(cp_stream *s)
{
    uint32_t ncap = s->loc_cap * 2;
    uint64_t *npc = calloc(ncap, sizeof(uint64_t));
    uint32_t *nid = calloc(ncap, sizeof(uint32_t));
    if (!npc || !nid) {
        free(npc);
        free(nid);
        return CP_ENOMEM;
    }
    for (uint32_t i = 0; i < s->loc_cap; i++) {
        if (!s->loc_id[i]) continue;
        uint32_t j = (uint32_t)cp_hash_u64(0, s->loc_pc[i]) & (ncap - 1);
        while (nid[j])
            j = (j + 1) & (ncap - 1);
        npc[j] = s->loc_pc[i];
        nid[j] = s->loc_id[i];
    }
    free(s->loc_pc);
    free(s->loc_id);
    s->loc_pc = npc;
    s->loc_id = nid;
    s->loc_cap = ncap;
    return 0;
}

/* A pc's location, added on its first use in the epoch: symbolized then (once per epoch),
 * its address canonical through its mapping. Language ids (CP_LANG_TAG) name the same frame
 * for the process's life (cp_lang_intern), so their locations are kept as well. */
static uint32_t location_for(cp_stream *s, uint64_t pc)
{
    if (s->p->locations.n * 2 >= s->loc_cap && loc_grow(s) != 0) {
        s->err = CP_ENOMEM;
        return 0;
    }
    uint32_t mask = s->loc_cap - 1;
    uint32_t i = (uint32_t)cp_hash_u64(0, pc) & mask;
    while (s->loc_id[i] && s->loc_pc[i] != pc)
        i = (i + 1) & mask;
    if (s->loc_id[i]) return s->loc_id[i];

    cp_line lines[CP_SYM_MAX_LINES];
    uint32_t nl = 0, mapping = 0;
    uint64_t addr = pc;
    if (pc & CP_LANG_TAG) {
        const char *fn = NULL, *file = NULL;
        int64_t ln = 0;
        if (cp_lang_get((uint32_t)(pc & 0xffffffffu), &fn, &file, &ln) == 0) {
            lines[0].function_id = add_function(s, fn, NULL, file);
            lines[0].line = ln;
            nl = 1;
        }
        addr = 0;
    } else {
        mapping = mapping_for(s, pc);
        if (mapping) addr += s->map_delta.v[mapping - 1];
        cp_sym_line sl[CP_SYM_MAX_LINES];
        uint32_t n = s->symbolize ? s->symbolize(pc, sl, s->sym_arg) : 0;
        for (uint32_t k = 0; k < n && k < CP_SYM_MAX_LINES; k++) {
            lines[nl].function_id = add_function(s, sl[k].name, sl[k].mangled, sl[k].file);
            lines[nl++].line = sl[k].line;
        }
    }
    if (s->err) return 0;
    uint32_t id = 0;
    if (cp_profile_add_location(s->p, addr, mapping, lines, nl, &id) != 0) {
        s->err = CP_ENOMEM;
        return 0;
    }
    s->loc_pc[i] = pc;
    s->loc_id[i] = id;
    return id;
}

/* Whether s's tables still hold for mods: nothing was unloaded since they were built (an
 * address then means what it meant) and each mapping's module is found again at the same
 * place; map_id is rebuilt for mods' numbering. Returns 0, or -1 for a new epoch. */
static int follow_mods(cp_stream *s, const cp_modules *mods)
{
    if (mods == s->mods && (!mods || (mods->adds == s->adds && mods->subs == s->subs))) return 0;
    if (s->p->mappings.n && (!mods || !s->mods || mods->subs != s->subs)) return -1;
    if (set_mods(s, mods) != 0) return -1;
    for (uint32_t j = 0; j < s->p->mappings.n; j++) {
        const cp_module *m = cp_modules_find(mods, (uintptr_t)s->map_lo.v[j]);
        if (!m || m->lo != s->map_lo.v[j] ||
            strcmp(m->path, cp_profile_str(s->p, s->p->mappings.v[j].filename)) != 0)
            return -1;
        s->map_id[m - mods->m] = j + 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------
 * The kept streams */

#define VEC_BYTES(vec) ((size_t)(vec).cap * sizeof(*(vec).v))

/* The memory s holds, by capacity (what it keeps allocated between windows), allocator
 * overhead aside. */
static size_t footprint(const cp_stream *s)
{
    const cp_profile *p = s->p;
    size_t n = sizeof(*s) + sizeof(*p) + p->strs.cap + VEC_BYTES(p->strs.off) +
               (size_t)p->strs.nslots * sizeof(uint64_t);
    n += VEC_BYTES(p->sample_types) + VEC_BYTES(p->comments) + VEC_BYTES(p->mappings) +
         VEC_BYTES(p->locations) + VEC_BYTES(p->lines) + VEC_BYTES(p->functions) +
         VEC_BYTES(p->samples) + VEC_BYTES(p->stack) + VEC_BYTES(p->values) + VEC_BYTES(p->labels);
    n += (s->mods ? (size_t)s->mods->n + 1 : 0) * sizeof(uint32_t) + VEC_BYTES(s->map_lo) +
         VEC_BYTES(s->map_delta);
    n += (size_t)s->loc_cap * (sizeof(uint64_t) + sizeof(uint32_t)) +
         (size_t)s->fn_cap * (sizeof(uint64_t) + sizeof(uint32_t));
    return n;
}

static int key_eq(const cp_stream_key *a, const cp_stream_key *b)
{
    return a->kind == b->kind && a->iso == b->iso &&
           (a->iso || strncmp(a->thread, b->thread, sizeof(a->thread)) == 0);
}

cp_stream *cp_streams_begin(const cp_stream_key *k, const cp_modules *mods,
                            cp_symbolize_fn symbolize, void *arg, int *fresh)
{
    bounds_default();
    cp_stream *s = NULL;
    for (uint32_t i = 0; i < CP_STREAMS_MAX; i++)
        if (S.slot[i] && key_eq(&S.slot[i]->key, k)) {
            s = S.slot[i];
            S.slot[i] = NULL; /* the caller's until cp_streams_end */
            break;
        }
    if (s && (s->symbolize != symbolize || follow_mods(s, mods) != 0)) {
        stream_destroy(s);
        s = NULL;
    }
    if (s) {
        cp_profile_next_window(s->p, s->nstrings);
        s->sym_arg = arg;
        *fresh = 0;
        return s;
    }
    *fresh = 1;
    return stream_create(k, mods, symbolize, arg);
}

cp_profile *cp_stream_profile(cp_stream *s)
{
    CP_ASSERT_AGENT_THREAD();
    return s->p;
}

void cp_stream_add_sample(cp_stream *s, const uint64_t *pcs, uint32_t n, const int64_t *vals)
{
    CP_ASSERT_AGENT_THREAD();
    uint32_t locs[CP_MAX_FRAMES];
    uint32_t k = 0;
    for (uint32_t i = 0; i < n && i < CP_MAX_FRAMES && !s->err; i++) {
        uint32_t id = location_for(s, pcs[i]);
        if (id) locs[k++] = id;
    }
    if (s->err) return;
    if (cp_profile_add_sample(s->p, locs, k, vals, NULL, 0) != 0) s->err = CP_ENOMEM;
}

int cp_stream_seal(cp_stream *s)
{
    CP_ASSERT_AGENT_THREAD();
    s->nstrings = s->p->strs.off.n;
    return s->err;
}

void cp_streams_end(cp_stream *s, int keep)
{
    bounds_default();
    if (!keep || s->err || S.max_streams == 0 || s->p->locations.n > S.max_locations ||
        footprint(s) > S.max_bytes) {
        stream_destroy(s);
        return;
    }
    s->used = S.window;
    uint32_t at = 0, live = 0;
    for (uint32_t i = 0; i < CP_STREAMS_MAX; i++) {
        if (!S.slot[i]) continue;
        live++;
        if (!S.slot[at] || S.slot[i]->used < S.slot[at]->used) at = i;
    }
    if (live < S.max_streams) { /* a free slot */
        for (at = 0; S.slot[at]; at++)
            ;
    } else if (S.slot[at]->used < S.window) { /* the least recently used goes */
        stream_destroy(S.slot[at]);
    } else {
        /* Every kept stream is in this window too: keep those. Evicting the oldest would,
         * with more streams than slots, evict each stream just before its next window (no
         * epoch would ever continue); this way the kept ones continue and the others are
         * built fresh each window. */
        stream_destroy(s);
        return;
    }
    S.slot[at] = s;
}

void cp_streams_window_done(void)
{
    S.window++;
    for (uint32_t i = 0; i < CP_STREAMS_MAX; i++) {
        cp_stream *s = S.slot[i];
        if (!s || !s->key.iso) continue;
        if (s->key.iso > CP_MAX_ISOLATES ||
            atomic_load(&cp_isolates[s->key.iso - 1].state) != CP_ISO_LIVE) {
            stream_destroy(s);
            S.slot[i] = NULL;
        }
    }
}

uint32_t cp_streams_kept(void)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < CP_STREAMS_MAX; i++)
        n += S.slot[i] != NULL;
    return n;
}

void cp_streams_reset(void)
{
    for (uint32_t i = 0; i < CP_STREAMS_MAX; i++) {
        stream_destroy(S.slot[i]);
        S.slot[i] = NULL;
    }
}

void cp_streams_set_bounds(uint32_t streams, uint32_t locations, size_t bytes)
{
    cp_streams_reset();
    S.bounds_set = 1;
    S.max_streams = streams < CP_STREAMS_MAX ? streams : CP_STREAMS_MAX;
    S.max_locations = locations;
    S.max_bytes = bytes;
}

void cp_streams_abandon(void)
{
    /* the parent's agent may have been changing them when it forked: forget them (their
     * memory is lost once per fork) */
    memset(S.slot, 0, sizeof(S.slot));
}
