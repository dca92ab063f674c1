/* Server-side symbolization: the upload of an ELF file (its table goes to the store under
 * the tenant and build ID) or of a JavaScript source map (under "js:" and its script), a
 * bounded in-memory cache of both shared by the query threads, the configured .build-id
 * directories, and the naming passes that add functions and lines to a merged profile's
 * unsymbolized locations, and rewrite its V8 frames, just before it is rendered. */
#include "symbols.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "demangle.h"
#include "log.h"
#include "sourcemap.h"
#include "times.h"

#define NEGATIVE_TTL_NS (30LL * 1000000000LL) /* how long "no table" is believed */

/* One cached answer for (tenant, build ID); tenant "" = the directories. */
typedef struct entry {
    struct entry *next;
    char tenant[CP_TENANT_MAX + 1];
    char id[CP_BUILD_ID_HEX_MAX + 1];
    int present;      /* 0: known to be absent (until expires_ns) */
    uint8_t *blob;    /* an ELF table's bytes (cp_symtab reads them in place) */
    size_t len;       /* the bytes held: the table's, or the decoded map's (cp_v8_smap_bytes) */
    cp_symtab t;      /* an ELF table's (id a build ID) */
    cp_v8_smap *smap; /* a source map's (id "js:" SCRIPT); its JSON is not kept */
    int64_t expires_ns;
    uint64_t used; /* LRU tick */
    uint32_t refs;
    int stale; /* replaced by an upload: freed at its last release */
} entry;

struct cp_symbols {
    cp_symbols_options o;
    char *dirs;
    pthread_mutex_t mu;
    entry *head;
    size_t bytes;
    uint64_t tick;
    cp_counter uploads, refused, named; /* registered by cp_symbols_register_metrics */
    cp_metrics *metrics;                /* where; NULL = nowhere */
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void cp_symbols_options_default(cp_symbols_options *o)
{
    memset(o, 0, sizeof *o);
    o->dirs = "/usr/lib/debug/.build-id";
    o->max_upload_bytes = (size_t)512 << 20;
    o->max_table_bytes = (size_t)64 << 20;
    o->cache_bytes = (size_t)256 << 20;
}

cp_symbols *cp_symbols_create(const cp_symbols_options *o)
{
    cp_symbols *sy = calloc(1, sizeof *sy);
    if (!sy) return NULL;
    sy->o = *o;
    sy->dirs = strdup(o->dirs ? o->dirs : "");
    if (!sy->dirs || pthread_mutex_init(&sy->mu, NULL)) {
        free(sy->dirs);
        free(sy);
        return NULL;
    }
    sy->o.dirs = NULL;
    return sy;
}

/* Gives freed memory back to the system: a map's strings and tables are many mid-sized
 * blocks that glibc keeps in its arenas otherwise (a 28 MB map's transient copies once
 * stayed resident for good). */
static void trim(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

static void entry_free(entry *e)
{
    if (!e) return;
    int big = e->smap && e->len >= ((size_t)1 << 20);
    cp_v8_smap_destroy(e->smap);
    free(e->blob);
    free(e);
    if (big) trim();
}

void cp_symbols_destroy(cp_symbols *sy)
{
    if (!sy) return;
    cp_metrics_remove(sy->metrics, sy);
    for (entry *e = sy->head, *n; e; e = n) {
        n = e->next;
        entry_free(e);
    }
    pthread_mutex_destroy(&sy->mu);
    free(sy->dirs);
    free(sy);
}

/* ---- the cache ------------------------------------------------------------------------ */

/* Unlinks e (lock held). */
static void unlink_entry(cp_symbols *sy, entry *e)
{
    for (entry **pp = &sy->head; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            sy->bytes -= e->len;
            return;
        }
}

/* Drops expired "absent" answers, then unreferenced least recently used tables until the
 * cache fits (lock held). */
static void evict(cp_symbols *sy, int64_t now)
{
    for (entry **pp = &sy->head; *pp;) {
        entry *e = *pp;
        if (!e->present && !e->refs && now >= e->expires_ns) {
            *pp = e->next;
            entry_free(e);
        } else {
            pp = &e->next;
        }
    }
    while (sy->bytes > sy->o.cache_bytes) {
        entry *victim = NULL;
        for (entry *e = sy->head; e; e = e->next)
            if (!e->refs && e->present && (!victim || e->used < victim->used)) victim = e;
        if (!victim) return;
        unlink_entry(sy, victim);
        entry_free(victim);
    }
}

static entry *find_locked(cp_symbols *sy, const char *tenant, const char *id, int64_t now)
{
    for (entry *e = sy->head; e; e = e->next) {
        if (e->stale || strcmp(e->id, id) != 0 || strcmp(e->tenant, tenant) != 0) continue;
        if (!e->present && now >= e->expires_ns) continue; /* an expired "absent" */
        return e;
    }
    return NULL;
}

static void release(cp_symbols *sy, entry *e)
{
    if (!e) return;
    pthread_mutex_lock(&sy->mu);
    if (--e->refs == 0 && e->stale) entry_free(e);
    pthread_mutex_unlock(&sy->mu);
}

/* Loads the table of id from the directories into *blob (NULL if none). */
static void load_from_dirs(cp_symbols *sy, const char *id, uint8_t **blob, size_t *len)
{
    *blob = NULL;
    *len = 0;
    /* the ID becomes part of a path: hex digits only, checked here where it is formed */
    if (strlen(id) < 3 || !cp_symtab_build_id_valid(id)) return;
    for (const char *d = sy->dirs; *d;) {
        const char *end = strchr(d, ':');
        size_t dl = end ? (size_t)(end - d) : strlen(d);
        char path[4096];
        if (dl && dl < 3000) {
            snprintf(path, sizeof path, "%.*s/%.2s/%s.debug", (int)dl, d, id, id + 2);
            struct stat st;
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                cp_buf file = {0}, tab = {0};
                cp_err err = {0};
                char got[CP_BUILD_ID_HEX_MAX + 1];
                if ((size_t)st.st_size > sy->o.max_upload_bytes) {
                    cp_log_warn("symbols: %s: %lld bytes exceeds symbols.max_upload_bytes", path,
                                (long long)st.st_size);
                } else if (cp_read_file(path, &file, &err)) {
                    cp_log_warn("symbols: %s", err.msg);
                } else if (cp_symtab_build(file.data, file.len, sy->o.max_table_bytes, &tab, got,
                                           &err)) {
                    cp_log_warn("symbols: %s: %s", path, err.msg);
                } else if (strcmp(got, id) != 0) {
                    cp_log_warn("symbols: %s has build ID %s", path, got);
                } else {
                    cp_buf_close(&file);
                    *blob = cp_buf_steal(&tab, len);
                    return;
                }
                cp_buf_close(&file);
                cp_buf_close(&tab);
            }
        }
        if (!end) break;
        d = end + 1;
    }
}

/* The table of (tenant, id), acquired (release it), or NULL. tenant "" = directories. A
 * source map is decoded within symbols.max_table_bytes and until deadline_ns (0 = none);
 * *late (may be NULL) is set when the deadline stopped it (nothing is remembered then). */
static entry *acquire(cp_symbols *sy, const char *tenant, const char *id, int64_t deadline_ns,
                      int *late)
{
    if (strlen(tenant) > CP_TENANT_MAX || strlen(id) > CP_BUILD_ID_HEX_MAX) return NULL;
    int64_t now = mono_ns();
    pthread_mutex_lock(&sy->mu);
    entry *e = find_locked(sy, tenant, id, now);
    if (e) {
        e->used = ++sy->tick;
        if (e->present) e->refs++;
        pthread_mutex_unlock(&sy->mu);
        return e->present ? e : NULL;
    }
    pthread_mutex_unlock(&sy->mu);

    /* Load outside the lock (a LevelDB read or a file parse); a racing load of the same
     * table is harmless: the first one inserted is used. */
    uint8_t *blob = NULL;
    size_t len = 0;
    cp_err err = {0};
    if (*tenant) {
        int rc = sy->o.store ? cp_store_get_symbols(sy->o.store, tenant, id, &blob, &len, &err)
                             : CP_ENOTFOUND;
        if (rc && rc != CP_ENOTFOUND) cp_log_warn("symbols of %s: %s", id, err.msg);
    } else {
        load_from_dirs(sy, id, &blob, &len);
    }
    entry *ne = calloc(1, sizeof *ne);
    if (!ne) {
        free(blob);
        return NULL;
    }
    snprintf(ne->tenant, sizeof ne->tenant, "%s", tenant);
    snprintf(ne->id, sizeof ne->id, "%s", id);
    int bad = 0;
    if (blob && !strncmp(id, "js:", 3)) {
        /* the map is held decoded, counted as it is held; its JSON goes */
        cp_v8_smap_limits lim = {.max_bytes = sy->o.max_table_bytes,
                                 .max_bytes_name = "symbols.max_table_bytes",
                                 .deadline_ns = deadline_ns};
        bad = cp_v8_smap_create_within((const char *)blob, len, &lim, &ne->smap, &err);
        free(blob);
        blob = NULL;
        if (bad == CP_ELIMIT && deadline_ns && cp_mono_ns() >= deadline_ns) {
            cp_log_warn("symbols of %s (tenant %s): the query's deadline passed while its map "
                        "was read (%s)",
                        id, tenant, err.msg);
            if (late) *late = 1;
            entry_free(ne);
            trim();
            return NULL;
        }
        len = cp_v8_smap_bytes(ne->smap);
        if (bad) trim();
    } else if (blob) {
        bad = cp_symtab_open(&ne->t, blob, len, &err) != 0;
    }
    if (bad) {
        cp_log_warn("symbols of %s (tenant %s): %s", id, *tenant ? tenant : "(dirs)", err.msg);
        free(blob);
        blob = NULL;
        cp_v8_smap_destroy(ne->smap);
        ne->smap = NULL;
    }
    ne->present = blob || ne->smap;
    ne->blob = blob;
    ne->len = ne->present ? len : 0;
    ne->expires_ns = now + NEGATIVE_TTL_NS;

    pthread_mutex_lock(&sy->mu);
    e = find_locked(sy, tenant, id, now);
    if (e) {
        entry_free(ne);
    } else {
        e = ne;
        e->next = sy->head;
        sy->head = e;
        sy->bytes += e->len;
    }
    e->used = ++sy->tick;
    if (e->present) e->refs++;
    evict(sy, now);
    pthread_mutex_unlock(&sy->mu);
    return e->present ? e : NULL;
}

/* ---- upload --------------------------------------------------------------------------- */

/* Whatever the cache held for (tenant, id) (a table, a map or "absent") is now stale. */
static void forget(cp_symbols *sy, const char *tenant, const char *id)
{
    pthread_mutex_lock(&sy->mu);
    for (entry **pp = &sy->head; *pp;) {
        entry *e = *pp;
        if (strcmp(e->id, id) == 0 && strcmp(e->tenant, tenant) == 0) {
            *pp = e->next;
            sy->bytes -= e->len;
            if (e->refs)
                e->stale = 1;
            else
                entry_free(e);
        } else {
            pp = &e->next;
        }
    }
    pthread_mutex_unlock(&sy->mu);
}

int cp_symbols_upload(cp_symbols *sy, const char *tenant, const uint8_t *elf, size_t len,
                      cp_symbols_result *out, cp_err *err)
{
    memset(out, 0, sizeof *out);
    if (len > sy->o.max_upload_bytes) {
        cp_counter_add(&sy->refused, 1);
        return cp_err_set(err, CP_ELIMIT,
                          "file of %zu bytes exceeds the upload limit of %zu bytes "
                          "(symbols.max_upload_bytes)",
                          len, sy->o.max_upload_bytes);
    }
    if (!sy->o.store) return cp_err_set(err, CP_EINVAL, "this server keeps no uploads");
    cp_buf tab = {0};
    int rc = cp_symtab_build(elf, len, sy->o.max_table_bytes, &tab, out->build_id, err);
    cp_symtab t;
    if (!rc) rc = cp_symtab_open(&t, tab.data, tab.len, err);
    if (!rc) rc = cp_store_put_symbols(sy->o.store, tenant, out->build_id, tab.data, tab.len, err);
    cp_counter_add(&sy->uploads, rc == 0);
    cp_counter_add(&sy->refused, rc == CP_EPARSE || rc == CP_ELIMIT);
    if (!rc) {
        cp_symtab_info_get(&t, &out->info);
        out->table_bytes = tab.len;
        forget(sy, tenant, out->build_id);
    }
    cp_buf_close(&tab);
    return rc;
}

int cp_symbols_is_map(const uint8_t *body, size_t len)
{
    size_t i = 0;
    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r'))
        i++;
    return i < len && body[i] == '{';
}

/* The basename of a script's URL or path: after the last '/', before any '?' or '#'. */
static const char *script_base(const char *url, size_t *n)
{
    size_t end = strcspn(url, "?#");
    const char *b = url;
    for (size_t i = 0; i < end; i++)
        if (url[i] == '/') b = url + i + 1;
    *n = (size_t)(url + end - b);
    return b;
}

int cp_symbols_upload_map(cp_symbols *sy, const cp_symbols_map_upload *up,
                          cp_symbols_map_result *out, cp_err *err)
{
    const char *tenant = up->tenant, *text = up->text, *name = up->name;
    size_t len = up->len;
    memset(out, 0, sizeof *out);
    int rc = 0;
    if (len > sy->o.max_upload_bytes)
        rc = cp_err_set(err, CP_ELIMIT,
                        "source map of %zu bytes exceeds the upload limit of %zu bytes "
                        "(symbols.max_upload_bytes)",
                        len, sy->o.max_upload_bytes);
    else if (len > sy->o.max_table_bytes)
        rc = cp_err_set(err, CP_ELIMIT,
                        "source map of %zu bytes exceeds the table limit of %zu bytes "
                        "(symbols.max_table_bytes)",
                        len, sy->o.max_table_bytes);
    if (rc) {
        cp_counter_add(&sy->refused, 1);
        return rc;
    }
    if (!sy->o.store) return cp_err_set(err, CP_EINVAL, "this server keeps no uploads");
    cp_v8_smap *m = NULL;
    cp_v8_smap_limits lim = {.max_bytes = sy->o.max_table_bytes,
                             .max_bytes_name = "symbols.max_table_bytes"};
    rc = cp_v8_smap_create_within(text, len, &lim, &m, err);
    if (!rc) {
        /* the script it maps: its "file", else the uploaded file's name less ".map" */
        size_t n = 0;
        const char *b = script_base(cp_v8_smap_file(m), &n);
        if (!n && name) {
            b = script_base(name, &n);
            if (n > 4 && !memcmp(b + n - 4, ".map", 4)) n -= 4;
        }
        int ok = n > 0 && n <= CP_SYMBOLS_SCRIPT_MAX;
        for (size_t i = 0; i < n && ok; i++)
            ok = (unsigned char)b[i] >= 0x20 && b[i] != 0x7f;
        if (!n)
            rc = cp_err_set(err, CP_EPARSE,
                            "source map: no \"file\" member and no name= to tell the script it "
                            "maps (contprof symbols upload sends the file's name: SCRIPT.js.map)");
        else if (!ok)
            rc = cp_err_set(err, CP_EPARSE,
                            "source map: script name '%.*s' is not 1-%d printable bytes",
                            (int)(n > 200 ? 200 : n), b, CP_SYMBOLS_SCRIPT_MAX);
        else
            snprintf(out->script, sizeof out->script, "%.*s", (int)n, b);
    }
    char id[CP_SYMBOLS_SCRIPT_MAX + 4];
    snprintf(id, sizeof id, "js:%s", out->script);
    if (!rc) {
        cp_v8_smap_counts(m, &out->sources, &out->segments);
        out->map_bytes = len;
        out->held_bytes = cp_v8_smap_bytes(m);
    }
    /* the decoded map goes before the store copies the text: never both at once */
    cp_v8_smap_destroy(m);
    trim();
    if (!rc) rc = cp_store_put_symbols(sy->o.store, tenant, id, text, len, err);
    cp_counter_add(&sy->uploads, rc == 0);
    cp_counter_add(&sy->refused, rc == CP_EPARSE || rc == CP_ELIMIT);
    if (!rc) forget(sy, tenant, id);
    return rc;
}

/* ---- the naming pass ------------------------------------------------------------------ */

typedef struct fn_index {
    uint64_t *keys; /* name << 32 | file, plus one so that 0 means empty */
    uint32_t *ids;
    uint32_t cap, n;
} fn_index;

/* The function (name, file) of p, added when missing; 0 on out of memory. */
static uint32_t fn_get(fn_index *x, cp_profile *p, uint32_t name, uint32_t file)
{
    if (x->n * 2 >= x->cap) {
        uint32_t nc = x->cap ? x->cap * 2 : 1024;
        uint64_t *nk = calloc(nc, sizeof *nk);
        uint32_t *ni = calloc(nc, sizeof *ni);
        if (!nk || !ni) {
            free(nk);
            free(ni);
            return 0;
        }
        for (uint32_t i = 0; i < x->cap; i++) {
            if (!x->keys[i]) continue;
            uint32_t j = (uint32_t)cp_hash_u64(0, x->keys[i]) & (nc - 1);
            while (nk[j])
                j = (j + 1) & (nc - 1);
            nk[j] = x->keys[i];
            ni[j] = x->ids[i];
        }
        free(x->keys);
        free(x->ids);
        x->keys = nk;
        x->ids = ni;
        x->cap = nc;
    }
    uint64_t key = ((uint64_t)name << 32 | file) + 1;
    uint32_t mask = x->cap - 1, i = (uint32_t)cp_hash_u64(0, key) & mask;
    for (; x->keys[i]; i = (i + 1) & mask)
        if (x->keys[i] == key) return x->ids[i];
    /* C++ and Rust names demangled (model/demangle.h), the symbol kept as system_name: once
     * per function of the profile, whatever table (uploaded or a directory's) named it */
    cp_function f = {.name = name, .system_name = name, .filename = file};
    if (cp_demangle_maybe(cp_profile_str(p, name))) {
        char *d = cp_demangle(cp_profile_str(p, name));
        int bad = d && cp_profile_intern_cstr(p, d, &f.name);
        free(d);
        if (bad) return 0;
    }
    uint32_t id = 0;
    if (cp_profile_add_function(p, &f, &id)) return 0;
    x->keys[i] = key;
    x->ids[i] = id;
    x->n++;
    return id;
}

/* Names the native locations (build-ID mappings) of p; *named gets their count. */
static int name_native(cp_symbols *sy, const char *tenant, cp_profile *p, uint32_t *named)
{
    if (named) *named = 0;
    uint32_t nm = p->mappings.n;
    if (!nm) return 0;
    /* per mapping: 0 unresolved, 1 resolved; the tenant's table and the directories' */
    uint8_t *state = calloc(nm, 1);
    entry **tabs = calloc((size_t)nm * 2, sizeof *tabs);
    fn_index fx = {0};
    int rc = 0;
    uint32_t count = 0;
    if (!state || !tabs) {
        rc = CP_ENOMEM;
        goto out;
    }
    for (uint32_t li = 0; li < p->locations.n && !rc; li++) {
        cp_location *l = &p->locations.v[li];
        if (l->nlines || !l->mapping_id || l->mapping_id > nm) continue;
        uint32_t mi = l->mapping_id - 1;
        const cp_mapping *m = &p->mappings.v[mi];
        if (!m->build_id) continue;
        if (!state[mi]) {
            state[mi] = 1;
            const char *id = cp_profile_str(p, m->build_id);
            if (cp_symtab_build_id_valid(id)) {
                tabs[2 * mi] = acquire(sy, tenant, id, 0, NULL);
                if (*sy->dirs) tabs[2 * mi + 1] = acquire(sy, "", id, 0, NULL);
            }
        }
        if (!tabs[2 * mi] && !tabs[2 * mi + 1]) continue;
        uint64_t off = l->address - m->start + m->offset;
        cp_symframe fr[CP_SYMTAB_MAX_FRAMES];
        uint32_t n = 0;
        for (int k = 0; k < 2 && !n; k++)
            if (tabs[2 * mi + k])
                n = cp_symtab_lookup(&tabs[2 * mi + k]->t, off, fr, CP_SYMTAB_MAX_FRAMES);
        if (!n) continue;
        uint32_t line_off = p->lines.n;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t name, file, fid;
            if (cp_profile_intern_cstr(p, fr[k].name, &name) ||
                cp_profile_intern_cstr(p, fr[k].file, &file) ||
                !(fid = fn_get(&fx, p, name, file))) {
                rc = CP_ENOMEM;
                break;
            }
            cp_line ln = {.function_id = fid, .line = fr[k].line};
            if (cp_vec_push(&p->lines, ln)) {
                rc = CP_ENOMEM;
                break;
            }
        }
        if (rc) break;
        l = &p->locations.v[li];
        l->line_off = line_off;
        l->nlines = n;
        p->mappings.v[mi].flags |= CP_MAP_HAS_FUNCTIONS | CP_MAP_HAS_FILENAMES |
                                   CP_MAP_HAS_LINE_NUMBERS | CP_MAP_HAS_INLINE_FRAMES;
        count++;
    }
out:
    if (tabs)
        for (uint32_t i = 0; i < 2 * nm; i++)
            release(sy, tabs[i]);
    free(tabs);
    free(state);
    free(fx.keys);
    free(fx.ids);
    if (named) *named = count;
    return rc;
}

/* V8's position of function f, from its system_name "NAME URL:LINE:COLUMN" (the V8
 * source's, collector/v8/v8conv.c; 1-based) with URL its filename: 1 with the 0-based line
 * and column, else 0. */
static int v8_position(const cp_profile *p, const cp_function *f, uint32_t *line, uint32_t *col)
{
    const char *url = cp_profile_str(p, f->filename), *s = cp_profile_str(p, f->system_name);
    size_t ul = strlen(url), sl = strlen(s);
    if (!ul) return 0;
    uint64_t v[2] = {0, 0};
    size_t at = sl;
    for (int k = 1; k >= 0; k--) {
        size_t digits = 0;
        uint64_t mult = 1;
        while (at > 0 && s[at - 1] >= '0' && s[at - 1] <= '9' && digits < 10) {
            v[k] += (uint64_t)(s[at - 1] - '0') * mult;
            mult *= 10;
            digits++;
            at--;
        }
        if (!digits || at == 0 || s[at - 1] != ':') return 0;
        at--;
    }
    if (at < ul + 1 || memcmp(s + at - ul, url, ul) != 0 || s[at - ul - 1] != ' ') return 0;
    if (v[0] < 1 || v[1] < 1 || v[0] > UINT32_MAX || v[1] > UINT32_MAX) return 0;
    *line = (uint32_t)(v[0] - 1);
    *col = (uint32_t)(v[1] - 1);
    return 1;
}

/* One script's map, acquired for one naming pass. */
typedef struct script_map {
    uint32_t file; /* the URL's string id */
    entry *e;      /* NULL: no map */
} script_map;

/* Rewrites the V8 frames of p through the tenant's source maps (cp_symbols_name); *named
 * gets the number of locations rewritten. */
static int name_js(cp_symbols *sy, const char *tenant, cp_profile *p, int64_t deadline_ns,
                   uint32_t *named)
{
    *named = 0;
    uint32_t nf = p->functions.n;
    if (!nf || !sy->o.store) return 0;
    /* per function of p as it came: 0 not seen, 1 not mapped, 2 mapped to newfn/newline */
    uint8_t *state = calloc(nf, 1);
    uint32_t *newfn = calloc(nf, sizeof *newfn);
    int64_t *newline = calloc(nf, sizeof *newline);
    script_map *sm = NULL;
    uint32_t nsm = 0, capsm = 0, count = 0;
    int rc = 0;
    if (!state || !newfn || !newline) {
        rc = CP_ENOMEM;
        goto out;
    }
    for (uint32_t li = 0; li < p->locations.n && !rc; li++) {
        cp_location *l = &p->locations.v[li];
        if (l->mapping_id || !l->nlines) continue;
        int rewritten = 0;
        for (uint32_t k = 0; k < l->nlines && !rc; k++) {
            cp_line *ln = &p->lines.v[l->line_off + k];
            uint32_t fi = ln->function_id - 1;
            if (!ln->function_id || fi >= nf) continue;
            if (!state[fi]) {
                state[fi] = 1;
                cp_function f = p->functions.v[fi];
                uint32_t gl, gc;
                if (!v8_position(p, &f, &gl, &gc)) continue;
                uint32_t j = 0;
                while (j < nsm && sm[j].file != f.filename)
                    j++;
                if (j == nsm) {
                    if (nsm == capsm) {
                        uint32_t nc = capsm ? capsm * 2 : 8;
                        script_map *ns = realloc(sm, nc * sizeof *ns);
                        if (!ns) {
                            rc = CP_ENOMEM;
                            break;
                        }
                        sm = ns;
                        capsm = nc;
                    }
                    size_t bl;
                    const char *b = script_base(cp_profile_str(p, f.filename), &bl);
                    char id[CP_SYMBOLS_SCRIPT_MAX + 4];
                    sm[nsm].file = f.filename;
                    sm[nsm].e = NULL;
                    if (bl && bl <= CP_SYMBOLS_SCRIPT_MAX) {
                        snprintf(id, sizeof id, "js:%.*s", (int)bl, b);
                        int late = 0;
                        sm[nsm].e = acquire(sy, tenant, id, deadline_ns, &late);
                        if (late) rc = CP_ELIMIT;
                    }
                    nsm++;
                }
                if (!sm[j].e || !sm[j].e->smap) continue;
                const char *fn = cp_profile_str(p, f.name);
                if (!strcmp(fn, "(anonymous)")) fn = "";
                cp_v8_smap_frame o;
                if (!cp_v8_smap_resolve(sm[j].e->smap, fn, gl, gc, &o)) continue;
                cp_function nfn = {.system_name = f.system_name, .start_line = (int64_t)o.line + 1};
                if (o.name[0] ? cp_profile_intern_cstr(p, o.name, &nfn.name)
                              : (nfn.name = f.name, 0)) {
                    rc = CP_ENOMEM;
                    break;
                }
                if (cp_profile_intern_cstr(p, o.source, &nfn.filename) ||
                    cp_profile_add_function(p, &nfn, &newfn[fi])) {
                    rc = CP_ENOMEM;
                    break;
                }
                newline[fi] = (int64_t)o.line + 1;
                state[fi] = 2;
            }
            if (state[fi] != 2) continue;
            ln = &p->lines.v[l->line_off + k];
            ln->function_id = newfn[fi];
            ln->line = newline[fi];
            rewritten = 1;
        }
        count += rewritten;
    }
out:
    for (uint32_t j = 0; j < nsm; j++)
        release(sy, sm[j].e);
    free(sm);
    free(state);
    free(newfn);
    free(newline);
    *named = count;
    return rc;
}

int cp_symbols_name(cp_symbols *sy, const char *tenant, cp_profile *p, uint32_t *named)
{
    return cp_symbols_name_until(sy, tenant, p, 0, named);
}

int cp_symbols_name_until(cp_symbols *sy, const char *tenant, cp_profile *p, int64_t deadline_ns,
                          uint32_t *named)
{
    uint32_t a = 0, b = 0;
    int rc = name_native(sy, tenant, p, &a);
    if (!rc && deadline_ns && cp_mono_ns() >= deadline_ns) rc = CP_ELIMIT;
    if (!rc) rc = name_js(sy, tenant, p, deadline_ns, &b);
    if (named) *named = a + b;
    if (a + b) cp_counter_add(&sy->named, a + b);
    return rc;
}

void cp_symbols_get_stats(cp_symbols *sy, cp_symbols_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&sy->mu);
    out->uploads = cp_counter_get(&sy->uploads);
    out->uploads_refused = cp_counter_get(&sy->refused);
    out->locations_named = cp_counter_get(&sy->named);
    for (entry *e = sy->head; e; e = e->next)
        if (e->present) out->tables_cached++;
    out->cache_bytes = sy->bytes;
    pthread_mutex_unlock(&sy->mu);
}

/* ---- statistics ---------------------------------------------------------------------- */

static int symbols_collect(void *arg, cp_metrics_out *o)
{
    cp_symbols_stats st;
    cp_symbols_get_stats(arg, &st);
    int rc =
        cp_metrics_out_scalar(o, "contprof_symbols_cached_tables", "Symbol tables held in memory.",
                              CP_METRIC_GAUGE, st.tables_cached);
    if (!rc)
        rc = cp_metrics_out_scalar(o, "contprof_symbols_cached_bytes", "Bytes of those tables.",
                                   CP_METRIC_GAUGE, st.cache_bytes);
    /* names libiberty read only without a C++20 requires-clause, or not at all
     * (model/demangle.h): process-wide */
    uint64_t cut, failed;
    cp_demangle_counts(&cut, &failed);
    if (!rc)
        rc = cp_metrics_out_scalar(o, "contprof_symbols_demangled_without_requires_total",
                                   "C++ names demangled without their C++20 requires-clause.",
                                   CP_METRIC_COUNTER, cut);
    if (!rc)
        rc = cp_metrics_out_scalar(o, "contprof_symbols_mangled_left_total",
                                   "C++ and Rust names the demangler refused, left mangled.",
                                   CP_METRIC_COUNTER, failed);
    return rc;
}

int cp_symbols_register_metrics(cp_symbols *sy, cp_metrics *r)
{
    if (sy->metrics) return CP_EINVAL;
    int rc =
        cp_metrics_counter(r, sy, "contprof_symbols_uploads_total",
                           "Symbol uploads kept (POST /api/v1/symbols).", NULL, 0, &sy->uploads);
    if (!rc)
        rc = cp_metrics_counter(r, sy, "contprof_symbols_uploads_refused_total",
                                "Symbol uploads refused (bad file, limit).", NULL, 0, &sy->refused);
    if (!rc)
        rc = cp_metrics_counter(r, sy, "contprof_symbols_locations_named_total",
                                "Locations named at query time.", NULL, 0, &sy->named);
    if (!rc) rc = cp_metrics_collector(r, sy, symbols_collect, sy);
    if (!rc)
        sy->metrics = r;
    else
        cp_metrics_remove(r, sy);
    return rc;
}
