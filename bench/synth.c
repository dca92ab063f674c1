/* Synthetic service profiles (see synth.h). */
#include "synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NFUNCS 1200

struct cp_synth {
    uint64_t rng;
    uint32_t nstacks;
    uint32_t *stack_off, *stack_len; /* into frames */
    uint32_t *frames;                /* function indices, leaf first */
    char **names;
    char **files;
    double *cdf; /* cumulative popularity of stacks */
};

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static const char *const ns1[] = {"app", "storage", "net", "rpc", "json", "cache", "sched", "util"};
static const char *const ns2[] = {"detail", "internal", "v2", "impl", "core", "io"};
static const char *const cls[] = {"BTreeIndex",      "RequestHandler", "Serializer",
                                  "ConnectionPool",  "LruCache",       "ThreadPool",
                                  "MetricsRegistry", "Tokenizer",      "HashTable",
                                  "BufferChain",     "Scheduler",      "QueryPlanner"};
static const char *const tmpl[] = {
    "std::basic_string<char, std::char_traits<char>, std::allocator<char> >", "unsigned long",
    "std::vector<int, std::allocator<int> >", "std::shared_ptr<Request>",
    "std::unique_ptr<Node, NodeDeleter>"};
static const char *const meth[] = {"lookup", "insert", "serialize", "dispatch",
                                   "flush",  "parse",  "evict",     "run",
                                   "encode", "visit",  "rebalance", "poll"};

cp_synth *cp_synth_create(uint64_t seed, uint32_t nstacks)
{
    cp_synth *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->rng = seed * 2654435761u + 88172645463325252ull;
    s->nstacks = nstacks;
    s->names = calloc(NFUNCS, sizeof *s->names);
    s->files = calloc(NFUNCS, sizeof *s->files);
    s->stack_off = calloc(nstacks, sizeof *s->stack_off);
    s->stack_len = calloc(nstacks, sizeof *s->stack_len);
    s->frames = calloc((size_t)nstacks * 60, sizeof *s->frames);
    s->cdf = calloc(nstacks, sizeof *s->cdf);
    if (!s->names || !s->files || !s->stack_off || !s->stack_len || !s->frames || !s->cdf)
        goto fail;
    for (int i = 0; i < NFUNCS; i++) {
        char buf[512];
        uint64_t r = rnd(&s->rng);
        snprintf(buf, sizeof buf, "%s::%s::%s<%s>::%s_%d(%s const&, unsigned long) const",
                 ns1[r % 8], ns2[(r >> 8) % 6], cls[(r >> 16) % 12], tmpl[(r >> 24) % 5],
                 meth[(r >> 32) % 12], i, tmpl[(r >> 40) % 5]);
        s->names[i] = strdup(buf);
        snprintf(buf, sizeof buf, "src/%s/%s/%s.cc", ns1[r % 8], ns2[(r >> 8) % 6],
                 cls[(r >> 16) % 12]);
        s->files[i] = strdup(buf);
        if (!s->names[i] || !s->files[i]) goto fail;
    }
    /* Stacks share prefixes (callers) like a real call tree: each new stack extends a
     * prefix of an earlier one. Stored root-first while building, reversed at the end. */
    uint32_t used = 0;
    for (uint32_t i = 0; i < nstacks; i++) {
        uint32_t depth = 10 + (uint32_t)(rnd(&s->rng) % 51);
        uint32_t *f = s->frames + used;
        uint32_t keep = 0;
        if (i > 0) {
            uint32_t j = (uint32_t)(rnd(&s->rng) % i);
            keep = (uint32_t)(rnd(&s->rng) % (s->stack_len[j] < depth ? s->stack_len[j] : depth));
            /* stack j is stored leaf first: its root is its last frame */
            for (uint32_t k = 0; k < keep; k++)
                f[k] = s->frames[s->stack_off[j] + s->stack_len[j] - 1 - k];
        }
        for (uint32_t k = keep; k < depth; k++)
            f[k] = (uint32_t)(rnd(&s->rng) % NFUNCS);
        for (uint32_t a = 0, b = depth - 1; a < b; a++, b--) {
            uint32_t t = f[a];
            f[a] = f[b];
            f[b] = t;
        }
        s->stack_off[i] = used;
        s->stack_len[i] = depth;
        used += depth;
    }
    double sum = 0;
    for (uint32_t i = 0; i < nstacks; i++) {
        sum += 1.0 / (1.0 + i * 0.05); /* a few hot stacks, a long tail */
        s->cdf[i] = sum;
    }
    for (uint32_t i = 0; i < nstacks; i++)
        s->cdf[i] /= sum;
    return s;
fail:
    cp_synth_destroy(s);
    return NULL;
}

void cp_synth_destroy(cp_synth *s)
{
    if (!s) return;
    for (int i = 0; i < NFUNCS && s->names; i++)
        free(s->names[i]);
    for (int i = 0; i < NFUNCS && s->files; i++)
        free(s->files[i]);
    free(s->names);
    free(s->files);
    free(s->stack_off);
    free(s->stack_len);
    free(s->frames);
    free(s->cdf);
    free(s);
}

cp_profile *cp_synth_cpu_window(cp_synth *s, uint32_t nsamples, int64_t start_ns, int64_t dur_ns)
{
    cp_profile *p = cp_profile_create();
    uint32_t *counts = calloc(s->nstacks, sizeof *counts);
    uint32_t *fn_id = calloc(NFUNCS, sizeof *fn_id);
    uint32_t *loc_id = calloc(NFUNCS, sizeof *loc_id);
    if (!p || !counts || !fn_id || !loc_id) goto fail;
    if (cp_profile_add_sample_type(p, "samples", "count") ||
        cp_profile_add_sample_type(p, "cpu", "nanoseconds"))
        goto fail;
    if (cp_profile_intern_cstr(p, "cpu", &p->period_type.type) ||
        cp_profile_intern_cstr(p, "nanoseconds", &p->period_type.unit))
        goto fail;
    p->period = 10000000;
    p->time_nanos = start_ns;
    p->duration_nanos = dur_ns;
    cp_mapping m = {.start = 0x400000,
                    .limit = 0x2400000,
                    .offset = 0,
                    .flags = CP_MAP_HAS_FUNCTIONS | CP_MAP_HAS_FILENAMES | CP_MAP_HAS_LINE_NUMBERS};
    uint32_t mid;
    if (cp_profile_intern_cstr(p, "/usr/bin/service", &m.filename) ||
        cp_profile_intern_cstr(p, "4f1c2a9e0b7d3c5a8e6f1029384756abcdef0123", &m.build_id) ||
        cp_profile_add_mapping(p, &m, &mid))
        goto fail;
    for (uint32_t i = 0; i < nsamples; i++) {
        double u = (double)(rnd(&s->rng) >> 11) / 9007199254740992.0;
        uint32_t lo = 0, hi = s->nstacks - 1;
        while (lo < hi) {
            uint32_t mi = (lo + hi) / 2;
            if (s->cdf[mi] < u)
                lo = mi + 1;
            else
                hi = mi;
        }
        counts[lo]++;
    }
    uint32_t locs[64];
    for (uint32_t i = 0; i < s->nstacks; i++) {
        if (!counts[i]) continue;
        for (uint32_t k = 0; k < s->stack_len[i]; k++) {
            uint32_t f = s->frames[s->stack_off[i] + k];
            if (!loc_id[f]) {
                cp_function fn = {0};
                if (cp_profile_intern_cstr(p, s->names[f], &fn.name) ||
                    cp_profile_intern_cstr(p, s->files[f], &fn.filename))
                    goto fail;
                fn.system_name = fn.name;
                fn.start_line = 10 + f;
                cp_line ln;
                if (cp_profile_add_function(p, &fn, &fn_id[f])) goto fail;
                ln.function_id = fn_id[f];
                ln.line = 12 + f;
                if (cp_profile_add_location(p, 0x400000 + (uint64_t)f * 0x1000 + 0x24, mid, &ln, 1,
                                            &loc_id[f]))
                    goto fail;
            }
            locs[k] = loc_id[f];
        }
        int64_t v[2] = {counts[i], (int64_t)counts[i] * 10000000};
        if (cp_profile_add_sample(p, locs, s->stack_len[i], v, NULL, 0)) goto fail;
    }
    free(counts);
    free(fn_id);
    free(loc_id);
    return p;
fail:
    free(counts);
    free(fn_id);
    free(loc_id);
    cp_profile_destroy(p);
    return NULL;
}

/* ===== a stream that keeps its tables ============================================== */

static uint32_t epoch_str(cp_profile *e, const cp_profile *w, uint32_t id)
{
    uint32_t out = 0;
    if (id && cp_profile_intern_cstr(e, cp_profile_str(w, id), &out)) return UINT32_MAX;
    return out;
}

int cp_synth_stream_add(cp_profile *e, const cp_profile *w)
{
    uint32_t *lmap = calloc(w->locations.n + 1, sizeof *lmap), locs[256];
    /* e's locations by address (open addressing, rebuilt per call: this is set-up code) */
    uint32_t cap = 64;
    while (cap < 2 * (e->locations.n + w->locations.n))
        cap *= 2;
    uint32_t *byaddr = calloc(cap, sizeof *byaddr);
    if (!lmap || !byaddr) goto fail;
    for (uint32_t j = 0; j < e->locations.n; j++) {
        uint32_t h = (uint32_t)cp_hash_u64(0, e->locations.v[j].address) & (cap - 1);
        while (byaddr[h])
            h = (h + 1) & (cap - 1);
        byaddr[h] = j + 1;
    }
    for (uint32_t i = 0; i < w->locations.n; i++) {
        const cp_location *l = &w->locations.v[i];
        uint32_t h = (uint32_t)cp_hash_u64(0, l->address) & (cap - 1);
        while (byaddr[h] && e->locations.v[byaddr[h] - 1].address != l->address)
            h = (h + 1) & (cap - 1);
        if ((lmap[i + 1] = byaddr[h])) continue;
        uint32_t mid = 0;
        if (l->mapping_id) {
            cp_mapping m = w->mappings.v[l->mapping_id - 1];
            m.filename = epoch_str(e, w, m.filename);
            m.build_id = epoch_str(e, w, m.build_id);
            for (uint32_t j = 0; j < e->mappings.n && !mid; j++)
                if (e->mappings.v[j].filename == m.filename &&
                    e->mappings.v[j].build_id == m.build_id)
                    mid = j + 1;
            if (!mid && cp_profile_add_mapping(e, &m, &mid)) goto fail;
        }
        cp_line lines[8];
        uint32_t nl = l->nlines < 8 ? l->nlines : 8;
        for (uint32_t k = 0; k < nl; k++) {
            lines[k] = w->lines.v[l->line_off + k];
            cp_function f = w->functions.v[lines[k].function_id - 1];
            f.name = epoch_str(e, w, f.name);
            f.system_name = epoch_str(e, w, f.system_name);
            f.filename = epoch_str(e, w, f.filename);
            uint32_t fid = 0;
            for (uint32_t j = 0; j < e->functions.n && !fid; j++) {
                const cp_function *g = &e->functions.v[j];
                if (g->name == f.name && g->system_name == f.system_name &&
                    g->filename == f.filename && g->start_line == f.start_line)
                    fid = j + 1;
            }
            if (!fid && cp_profile_add_function(e, &f, &fid)) goto fail;
            lines[k].function_id = fid;
        }
        if (cp_profile_add_location(e, l->address, mid, lines, nl, &lmap[i + 1])) goto fail;
        byaddr[h] = lmap[i + 1];
    }
    for (uint32_t i = 0; i < w->samples.n; i++) {
        const cp_sample *s = &w->samples.v[i];
        uint32_t n = s->nlocs < 256 ? s->nlocs : 256;
        for (uint32_t k = 0; k < n; k++)
            locs[k] = lmap[w->stack.v[s->loc_off + k]];
        if (cp_profile_add_sample(e, locs, n, cp_profile_sample_values(w, i), NULL, 0)) goto fail;
    }
    free(lmap);
    free(byaddr);
    return 0;
fail:
    free(lmap);
    free(byaddr);
    return -1;
}

cp_profile *cp_synth_one_stack(cp_kind kind, int64_t start_ns, int64_t v)
{
    cp_profile *p = cp_profile_create();
    if (!p) return NULL;
    int inuse = kind == CP_KIND_INUSE;
    if (cp_profile_add_sample_type(p, inuse ? "inuse_objects" : "samples", "count") ||
        cp_profile_add_sample_type(p, inuse ? "inuse_space" : "cpu",
                                   inuse ? "bytes" : "nanoseconds"))
        goto fail;
    p->time_nanos = start_ns;
    p->duration_nanos = 10 * 1000000000LL;
    uint32_t locs[10];
    for (int i = 0; i < 10; i++) {
        char name[32];
        snprintf(name, sizeof name, "holder_%d", i);
        cp_function f = {0};
        uint32_t fid;
        if (cp_profile_intern_cstr(p, name, &f.name) || cp_profile_add_function(p, &f, &fid))
            goto fail;
        cp_line ln = {fid, 10 + i};
        if (cp_profile_add_location(p, 0x4000 + (uint64_t)i * 32, 0, &ln, 1, &locs[i])) goto fail;
    }
    int64_t vals[2] = {v, v * 4096};
    if (cp_profile_add_sample(p, locs, 10, vals, NULL, 0) == 0) return p;
fail:
    cp_profile_destroy(p);
    return NULL;
}
