/* The profile store's tables and lifecycle: series and tenants in memory, opening (the
 * log check, the format record, loading every table), closing and reopening, and the
 * symbol tables' side keys (layout of everything in format.h). The writer is write.c, the
 * readers read.c, retention retention.c.
 *
 * Locking: open and close run alone. cp_store_reopen takes s->dblock for writing (it waits
 * for running queries, and queries wait for it), then s->lock for writing, and rebuilds
 * every table under both. The symbol keys are single LevelDB reads and writes of their
 * own from query threads, outside the writer's batches and the tables' lock, under
 * s->dblock for reading like a query (LevelDB is thread-safe; a reopen is not). */
#include "store.h"
#include "store_int.h"
#include "check.h"
#include "log.h"
#include "metrics.h"

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t sm_hash(const char *k, size_t len)
{
    return cp_hash_bytes(k, len, 0x5e5);
}

void *cp_strmap_get(const strmap *m, const char *k, size_t len)
{
    if (!m->cap) return NULL;
    uint32_t i = (uint32_t)sm_hash(k, len) & (m->cap - 1);
    while (m->s[i].k) {
        if (m->s[i].len == len && !memcmp(m->s[i].k, k, len)) return m->s[i].v;
        i = (i + 1) & (m->cap - 1);
    }
    return NULL;
}

/* Rehashes m into nc slots (a power of two, > 2 n); CP_ENOMEM leaves m as it was. */
static int sm_resize(strmap *m, uint32_t nc)
{
    struct sm_slot *ns = calloc(nc, sizeof *ns);
    if (!ns) return CP_ENOMEM;
    for (uint32_t i = 0; i < m->cap; i++) {
        if (!m->s[i].k) continue;
        uint32_t j = (uint32_t)sm_hash(m->s[i].k, m->s[i].len) & (nc - 1);
        while (ns[j].k)
            j = (j + 1) & (nc - 1);
        ns[j] = m->s[i];
    }
    free(m->s);
    m->s = ns;
    m->cap = nc;
    return 0;
}

/* k must stay valid as long as the entry (it is owned by the value). */
int cp_strmap_put(strmap *m, const char *k, size_t len, void *v)
{
    if ((m->n + 1) * 2 > m->cap && sm_resize(m, m->cap ? m->cap * 2 : 64)) return CP_ENOMEM;
    uint32_t i = (uint32_t)sm_hash(k, len) & (m->cap - 1);
    while (m->s[i].k)
        i = (i + 1) & (m->cap - 1);
    m->s[i] = (struct sm_slot){k, len, v};
    m->n++;
    return 0;
}

/* Empties slot i and closes the hole: a later key of the run moves into it unless its home
 * lies cyclically in (hole, j], where a probe from home never passes the hole. */
static void sm_erase(strmap *m, uint32_t i)
{
    uint32_t mask = m->cap - 1;
    for (uint32_t j = i;;) {
        m->s[i] = (struct sm_slot){0}; /* an empty slot holds no value either */
        for (;;) {
            j = (j + 1) & mask;
            if (!m->s[j].k) return;
            uint32_t home = (uint32_t)sm_hash(m->s[j].k, m->s[j].len) & mask;
            if (i <= j ? home <= i || home > j : home <= i && home > j) break;
        }
        m->s[i] = m->s[j];
        i = j;
    }
}

void cp_strmap_del(strmap *m, const char *k, size_t len)
{
    if (!m->cap) return;
    uint32_t mask = m->cap - 1, i = (uint32_t)sm_hash(k, len) & mask;
    while (m->s[i].k && !(m->s[i].len == len && !memcmp(m->s[i].k, k, len)))
        i = (i + 1) & mask;
    if (!m->s[i].k) return;
    sm_erase(m, i);
    m->n--;
    /* an eighth full: half the slots, so the table follows what it holds, not its peak
     * (out of memory it stays as it is) */
    if (m->cap > 64 && m->n * 8 < m->cap) (void)sm_resize(m, m->cap / 2);
}

/* ---------------------------------------------------------------------------------
 * Series and tenants
 * --------------------------------------------------------------------------------- */

const char *cp_tenant_word(tenant *t, const char *s, size_t n)
{
    char *w = cp_strmap_get(&t->words, s, n);
    if (w) return w;
    if (!(w = xstrndup(s, n))) return NULL;
    if (cp_strmap_put(&t->words, w, n, w)) {
        free(w);
        return NULL;
    }
    return w;
}

/* Room for ser's ntypes names (ser->type, ser->unit); CP_ENOMEM. */
int cp_ser_types_alloc(cp_ser *ser, uint32_t ntypes)
{
    ser->ntypes = ntypes;
    ser->type = calloc(2 * (size_t)ntypes + 1, sizeof *ser->type);
    if (!ser->type) return CP_ENOMEM;
    ser->unit = ser->type + ntypes;
    return 0;
}

int cp_ser_add(tenant *t, cp_ser *ser)
{
    cp_put_be32(ser->idkey, ser->id);
    if (cp_vec_reserve(&t->series, (size_t)t->series.n + 1) ||
        cp_strmap_put(&t->by_key, ser->key, ser->keylen, ser))
        return CP_ENOMEM;
    if (cp_strmap_put(&t->by_id, (const char *)ser->idkey, 4, ser)) {
        cp_strmap_del(&t->by_key, ser->key, ser->keylen);
        return CP_ENOMEM;
    }
    ser->pos = t->series.n;
    t->series.v[t->series.n++] = ser;
    if (ser->id >= t->next_id) t->next_id = ser->id + 1;
    return 0;
}

void cp_ser_free(cp_ser *s)
{
    if (!s) return;
    cp_labels_close(&s->labels);
    free(s->key);
    free(s->type);
    free(s->cum_producer);
    cp_acc_close(&s->cum);
    cp_acc_close(&s->stage);
    cp_acc_close(&s->stage10);
    cp_wcache_free(s->wc);
    free(s);
}

void cp_forgotten_free(cp_store *s)
{
    for (uint32_t i = 0; i < s->forgotten.n; i++)
        cp_ser_free(s->forgotten.v[i]);
    s->forgotten.n = 0;
}

static void tenant_free(tenant *t)
{
    if (!t) return;
    for (uint32_t i = 0; i < t->series.n; i++)
        cp_ser_free(t->series.v[i]);
    free(t->series.v);
    free(t->by_key.s);
    free(t->by_id.s);
    for (uint32_t i = 0; i < t->words.cap; i++)
        free(t->words.s[i].v);
    free(t->words.s);
    for (uint32_t i = 0; i < t->prods.cap; i++) {
        prod *p = t->prods.s[i].v;
        if (p) {
            free(p->key);
            free(p);
        }
    }
    free(t->prods.s);
    cp_dict_close(&t->dict);
    free(t->name);
    free(t);
}

tenant *cp_tenant_find(cp_store *s, const char *name, size_t len)
{
    for (uint32_t i = 0; i < s->tenants.n; i++)
        if (s->tenants.v[i]->len == len && !memcmp(s->tenants.v[i]->name, name, len))
            return s->tenants.v[i];
    return NULL;
}

/* Creates tenant name (caller holds the write lock or is opening). */
tenant *cp_tenant_add(cp_store *s, const char *name, size_t len)
{
    tenant *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    if (cp_dict_init(&t->dict) || !(t->name = xstrndup(name, len)) || cp_vec_push(&s->tenants, t)) {
        tenant_free(t);
        return NULL;
    }
    t->next_id = 1;
    t->len = len;
    t->dict.tenant = t->name;
    t->dict.tenant_len = len;
    return t;
}

/* The identity key of (kind, labels). */
int cp_ser_identity(cp_kind kind, const cp_labels *l, cp_buf *out)
{
    out->len = 0;
    uint8_t k = (uint8_t)kind;
    if (cp_buf_append(out, &k, 1)) return CP_ENOMEM;
    for (uint32_t i = 0; i < l->p.n; i++)
        if (cp_buf_append(out, l->p.v[i].name, strlen(l->p.v[i].name) + 1) ||
            cp_buf_append(out, l->p.v[i].value, strlen(l->p.v[i].value) + 1))
            return CP_ENOMEM;
    return 0;
}

static char *rd_strdup(cp_rd *r)
{
    size_t n;
    const uint8_t *p = cp_get_str(r, &n);
    if (!p) return NULL;
    return xstrndup((const char *)p, n);
}

/* The next string of r as t's word (NULL: bad or out of memory). */
static const char *rd_word(tenant *t, cp_rd *r)
{
    size_t n;
    const uint8_t *p = cp_get_str(r, &n);
    return p ? cp_tenant_word(t, (const char *)p, n) : NULL;
}

static int ser_decode(tenant *t, uint32_t id, const uint8_t *v, size_t len, cp_ser **out,
                      cp_err *err)
{
    cp_rd r = {v, v + len, 0};
    cp_ser *s = calloc(1, sizeof *s);
    cp_buf key = {0};
    if (!s) return cp_err_set(err, CP_ENOMEM, "series");
    s->id = id;
    s->t = t;
    s->kind = (cp_kind)cp_get_uv(&r);
    uint64_t nl = cp_get_uv(&r);
    for (uint64_t i = 0; i < nl && !r.bad; i++) {
        char *n = rd_strdup(&r), *val = rd_strdup(&r);
        if (n && val && cp_labels_set(&s->labels, n, val)) r.bad = 1;
        if (!n || !val) r.bad = 1;
        free(n);
        free(val);
    }
    uint64_t nt = cp_get_uv(&r);
    if (nt > CP_MAX_TYPES || (!r.bad && cp_ser_types_alloc(s, (uint32_t)nt))) r.bad = 1;
    for (uint64_t i = 0; i < nt && !r.bad; i++) {
        s->type[i] = rd_word(t, &r);
        s->unit[i] = rd_word(t, &r);
        if (!s->type[i] || !s->unit[i]) r.bad = 1;
    }
    if (!r.bad) {
        s->period_type = rd_word(t, &r);
        s->period_unit = rd_word(t, &r);
    }
    s->period = cp_get_sv(&r);
    s->first_ns = cp_get_sv(&r);
    s->last_ns = cp_get_sv(&r);
    s->windows = cp_get_uv(&r);
    for (int l = 0; l < CP_NLEVELS; l++)
        s->mt_floor[l] = INT64_MIN; /* retention looks once */
    if (r.bad || !s->period_type || !s->period_unit || !cp_kind_name((int)s->kind)) {
        cp_ser_free(s);
        return cp_err_set(err, CP_ESTORE, "series %u of tenant %s: corrupt record", id, t->name);
    }
    if (cp_ser_identity(s->kind, &s->labels, &key)) {
        cp_ser_free(s);
        cp_buf_close(&key);
        return cp_err_set(err, CP_ENOMEM, "series");
    }
    s->keylen = key.len;
    s->key = (char *)cp_buf_steal(&key, &s->keylen);
    *out = s;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Open and close
 * --------------------------------------------------------------------------------- */

static int mkdirs(const char *path)
{
    char tmp[4096];
    size_t n = strlen(path);
    if (n >= sizeof tmp) return -1;
    memcpy(tmp, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] == '/' || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            tmp[i] = c;
        }
    }
    return 0;
}

/* A LevelDB error as CP_ESTORE naming the store and what was being done; damage found by
 * LevelDB (a "Corruption" status) also names the table when there is only one, and the
 * way out. */
int cp_ldb_fail(const cp_store *s, cp_err *err, const char *e, const char *what)
{
    if (!strstr(e, "orruption"))
        return cp_err_set(err, CP_ESTORE, "store %s: %s: %s", s->path, what, e);
    char table[64] = "";
    uint32_t n = 0;
    DIR *d = opendir(s->path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 4 && l < 40 && !strcmp(de->d_name + l - 4, ".ldb") && n++ == 0)
            snprintf(table, sizeof table, " (table %.40s)", de->d_name);
    }
    if (d) closedir(d);
    if (n != 1) snprintf(table, sizeof table, " (one of %u tables)", n);
    /* LevelDB's text goes short first: the command at the end must fit in the message */
    int room = (int)sizeof err->msg - 100 - 2 * (int)strlen(s->path) - (int)strlen(what) -
               (int)strlen(table);
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg,
             "store %s: %s: %.*s%s; the store is damaged: stop contprofd and run "
             "`contprofd --repair --data %s`",
             s->path, what, room > 24 ? room : 24, e, table, s->path);
    /* the one field a reader writes (cp_store_damage): under its own mutex */
    cp_store *w = (cp_store *)(uintptr_t)s;
    pthread_mutex_lock(&w->damage_mu);
    if (!w->damage[0]) snprintf(w->damage, sizeof w->damage, "%s", msg);
    pthread_mutex_unlock(&w->damage_mu);
    return cp_err_set(err, CP_ESTORE, "%s", msg);
}

void cp_store_get_retention(const cp_store *s, int64_t *raw_ns, int64_t *rollup_ns)
{
    *raw_ns = s->retention[0];
    *rollup_ns = s->retention[1];
}

int cp_store_damage(cp_store *s, char *out, size_t len)
{
    pthread_mutex_lock(&s->damage_mu);
    int seen = s->damage[0] != 0;
    if (len) snprintf(out, len, "%s", s->damage);
    pthread_mutex_unlock(&s->damage_mu);
    return seen;
}

static int check_version(cp_store *s, cp_err *err)
{
    static const char vkey[2] = {0, CP_K_VERSION};
    char *e = NULL;
    size_t vlen = 0;
    char *v = leveldb_get(s->db, s->ropts, vkey, 2, &vlen, &e);
    if (e) {
        int rc = cp_ldb_fail(s, err, e, "reading the format record");
        leveldb_free(e);
        return rc;
    }
    size_t ml = strlen(CP_STORE_FORMAT_MAGIC);
    if (v) {
        int rc = 0;
        if (vlen != ml + 4 || memcmp(v, CP_STORE_FORMAT_MAGIC, ml))
            rc = cp_err_set(err, CP_EVERSION, "store %s: not a contprof store (bad format record)",
                            s->path);
        else if ((s->format = cp_get_be32((const uint8_t *)v + ml)) < CP_STORE_FORMAT_OLDEST ||
                 s->format > CP_STORE_FORMAT_VERSION)
            rc = cp_err_set(err, CP_EVERSION,
                            "store %s has format version %u; this contprofd reads versions %u to "
                            "%u only",
                            s->path, s->format, CP_STORE_FORMAT_OLDEST, CP_STORE_FORMAT_VERSION);
        leveldb_free(v);
        return rc;
    }
    /* no record: only an empty database may become a store */
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    leveldb_iter_seek_to_first(it);
    int empty = !leveldb_iter_valid(it);
    leveldb_iter_destroy(it);
    if (!empty)
        return cp_err_set(err, CP_EVERSION,
                          "store %s: LevelDB database without a contprof format record", s->path);
    uint8_t rec[32];
    memcpy(rec, CP_STORE_FORMAT_MAGIC, ml);
    cp_put_be32(rec + ml, CP_STORE_FORMAT_VERSION);
    s->format = CP_STORE_FORMAT_VERSION;
    leveldb_put(s->db, s->wsync, vkey, 2, (const char *)rec, ml + 4, &e);
    if (e) {
        int rc = cp_ldb_fail(s, err, e, "writing the format record");
        leveldb_free(e);
        return rc;
    }
    return 0;
}

/* Loads every tenant's dictionaries and series; skips over the (many) blocks. */
static int load_tenants(cp_store *s, cp_err *err)
{
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    int rc = 0;
    leveldb_iter_seek(it, "\x01", 1);
    while (rc == 0 && leveldb_iter_valid(it)) {
        size_t kl;
        const char *key = leveldb_iter_key(it, &kl);
        const char *nul = memchr(key, 0, kl);
        if (!nul || nul == key || (size_t)(nul - key) > CP_TENANT_KEY_MAX) {
            rc = cp_err_set(err, CP_ESTORE, "store %s: key without a tenant prefix", s->path);
            break;
        }
        size_t tl = (size_t)(nul - key);
        tenant *t = cp_tenant_add(s, key, tl);
        if (!t) {
            rc = cp_err_set(err, CP_ENOMEM, "store: loading tenants");
            break;
        }
        /* dictionaries */
        size_t n = key_tenant(k, t, CP_K_DICT);
        for (leveldb_iter_seek(it, (const char *)k, n); leveldb_iter_valid(it);
             leveldb_iter_next(it)) {
            key = leveldb_iter_key(it, &kl);
            if (kl != n + 5 || memcmp(key, k, n)) break;
            size_t vl;
            const char *v = leveldb_iter_value(it, &vl);
            if ((rc = cp_dict_load(&t->dict, (uint8_t)key[n],
                                   cp_get_be32((const uint8_t *)key + n + 1), (const uint8_t *)v,
                                   vl, err)))
                break;
        }
        /* format 1 stored run-time addresses: canonical identity is made at every open */
        if (rc == 0 && s->format < 2 && cp_dict_canonicalize(&t->dict))
            rc = cp_err_set(err, CP_ENOMEM, "store: canonicalizing tenant %s's frames", t->name);
        /* series */
        n = key_tenant(k, t, CP_K_SERIES);
        for (leveldb_iter_seek(it, (const char *)k, n); rc == 0 && leveldb_iter_valid(it);
             leveldb_iter_next(it)) {
            key = leveldb_iter_key(it, &kl);
            if (kl != n + 4 || memcmp(key, k, n)) break;
            uint32_t id = cp_get_be32((const uint8_t *)key + n);
            if (id == 0) { /* ids start at 1, in key order; forgotten ones leave gaps */
                rc = cp_err_set(err, CP_ESTORE, "tenant %s: a series record with id 0", t->name);
                break;
            }
            size_t vl;
            const char *v = leveldb_iter_value(it, &vl);
            cp_ser *ser = NULL;
            if ((rc = ser_decode(t, id, (const uint8_t *)v, vl, &ser, err))) break;
            if (cp_ser_add(t, ser)) {
                cp_ser_free(ser);
                rc = cp_err_set(err, CP_ENOMEM, "store: loading series");
            }
        }
        /* next tenant: every key of this one sorts below name \x01 */
        memcpy(k, t->name, tl);
        k[tl] = 1;
        leveldb_iter_seek(it, (const char *)k, tl + 1);
    }
    if (rc == 0) {
        char *e = NULL;
        leveldb_iter_get_error(it, &e);
        if (e) {
            rc = cp_ldb_fail(s, err, e, "loading the tables");
            leveldb_free(e);
        }
    }
    leveldb_iter_destroy(it);
    return rc;
}

/* Appends the way out to a message about a damaged store. */
static int corrupt_fix(cp_store *s, cp_err *err)
{
    if (err && !strstr(err->msg, "--repair")) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        int named = !strncmp(m, "store ", 6);
        cp_err_set(err, CP_ESTORE, "%s%s%s%s; run `contprofd --repair --data %s`",
                   named ? "" : "store ", named ? "" : s->path, named ? "" : ": ", m, s->path);
    }
    return CP_ESTORE;
}

/* LevelDB's create_if_missing makes a new, empty store wherever CURRENT is absent, and
 * deletes the tables and logs it then finds as garbage: a lost CURRENT would wipe every
 * window without a word. So a directory that holds LevelDB's files (tables, logs, a
 * MANIFEST) but no CURRENT is refused; only an empty or absent one becomes a new store. */
static int refuse_orphaned_files(cp_store *s, cp_err *err)
{
    DIR *d = opendir(s->path);
    if (!d) return 0; /* LevelDB's own open says why */
    char first[256] = "", other[256] = "";
    int current = 0, files = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        size_t l = strlen(n);
        if (!strcmp(n, "CURRENT")) current = 1;
        int data = !strncmp(n, "MANIFEST-", 9) ||
                   (l > 4 && (!strcmp(n + l - 4, ".ldb") || !strcmp(n + l - 4, ".sst") ||
                              (!strcmp(n + l - 4, ".log") && strcmp(n, "LOG"))));
        /* what a store's directory holds besides its tables: LevelDB's lock and info log,
         * the repair's lost/, contprofd's relay/ (cmd/README.md) */
        int own = !strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "CURRENT") ||
                  !strcmp(n, "LOCK") || !strcmp(n, "LOG") || !strcmp(n, "LOG.old") ||
                  !strcmp(n, "lost") || !strcmp(n, "relay");
        if (data && !files++) snprintf(first, sizeof first, "%s", n);
        if (!data && !own && !other[0]) snprintf(other, sizeof other, "%s", n);
    }
    closedir(d);
    if (current) return 0;
    /* a directory of other things would silently become a store and share their fate
     * (issue 36): only an empty or absent one does */
    if (!files && other[0])
        return cp_err_set(err, CP_ESTORE,
                          "store %s: the directory is not empty and holds no store ('%s' is "
                          "not part of one): only an empty or absent directory becomes a new "
                          "store; give --data a directory of its own",
                          s->path, other);
    if (!files) return 0;
    return cp_err_set(err, CP_ESTORE,
                      "store %s: CURRENT is missing but the directory holds %d LevelDB files "
                      "(%s among them): refusing to create a new store over them; run "
                      "`contprofd --repair --data %s`",
                      s->path, files, first, s->path);
}

/* Opens LevelDB and loads the in-memory tables (s->tenants empty, s->db NULL). On failure
 * s->db may be left open or NULL; err says what is wrong and, for damage, the fix. */
static int db_open(cp_store *s, cp_err *err)
{
    int rc = refuse_orphaned_files(s, err);
    if (rc) return rc;
    if ((rc = cp_wal_check(s->path, err))) return rc;
    char *e = NULL;
    s->db = leveldb_open(s->opts, s->path, &e);
    if (e) {
        s->db = NULL;
        rc = cp_ldb_fail(s, err, e, "cannot open LevelDB");
        leveldb_free(e);
        return rc;
    }
    if ((rc = check_version(s, err))) return rc;
    if ((rc = load_tenants(s, err)) == CP_ESTORE) {
        if (!strstr(err ? err->msg : "", "No space") && !strstr(err ? err->msg : "", "IO error"))
            rc = corrupt_fix(s, err);
    }
    return rc;
}

int cp_store_open(const cp_store_options *opt, cp_store **out, cp_err *err)
{
    *out = NULL;
    if (!opt || !opt->path || !*opt->path)
        return cp_err_set(err, CP_EINVAL, "store: no path given");
    cp_store *s = calloc(1, sizeof *s);
    if (!s) return cp_err_set(err, CP_ENOMEM, "store");
    s->reader = cp_store_reader_fns;
    /* each open its own range of capture generations: a copy of another store's records
     * (one opened before at the same address) never matches */
    static atomic_uint_fast64_t opens;
    atomic_store(&s->capture_gen, (atomic_fetch_add(&opens, 1) + 1) << 40);
    int rc;
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->lock, &ra);
    pthread_rwlock_init(&s->dblock, &ra); /* a reopen must not starve behind queries */
    pthread_mutex_init(&s->damage_mu, NULL);
    pthread_rwlockattr_destroy(&ra);
    s->path = xstrndup(opt->path, strlen(opt->path));
    if (!s->path) {
        rc = cp_err_set(err, CP_ENOMEM, "store");
        goto fail;
    }
    /* mkdir takes a dangling symlink for a directory that exists, and LevelDB then says
     * only "NotFound: .../LOCK" */
    struct stat lst, st;
    if (lstat(opt->path, &lst) == 0 && S_ISLNK(lst.st_mode) && stat(opt->path, &st) != 0) {
        int why = errno;
        char to[1024] = "";
        ssize_t tl = readlink(opt->path, to, sizeof to - 1);
        if (tl > 0) to[tl] = 0;
        rc = cp_err_set(err, CP_EIO,
                        "store: %s is a symbolic link to '%s', which %s: create the target "
                        "directory or point --data elsewhere",
                        opt->path, to, why == ENOENT ? "does not exist" : strerror(why));
        goto fail;
    }
    if (mkdirs(opt->path)) {
        rc = cp_err_set(err, CP_EIO, "store: cannot create directory %s: %s", opt->path,
                        strerror(errno));
        goto fail;
    }
    s->retention[0] = opt->retention_raw_ns;
    for (int l = 1; l < CP_NLEVELS; l++)
        s->retention[l] = opt->retention_rollup_ns;
    s->bucket_rows_max = opt->bucket_cache_entries ? opt->bucket_cache_entries : (2u << 20);
    s->bucket_bytes_max = opt->memory_budget ? opt->memory_budget : ((size_t)256 << 20);
    s->wcache_budget = opt->stack_cache_bytes ? opt->stack_cache_bytes : (64u << 20);
    s->forgotten_wait = 1024; /* ~0.9 MB of series (store/README.md, Retention) */
    s->prod_scan = 4096;
    s->opts = leveldb_options_create();
    s->cache = leveldb_cache_create_lru(opt->cache_bytes ? opt->cache_bytes : (64u << 20));
    s->filter = leveldb_filterpolicy_create_bloom(10);
    leveldb_options_set_create_if_missing(s->opts, 1);
    /* a damaged log record or table is refused, not skipped (see cp_wal_check) */
    leveldb_options_set_paranoid_checks(s->opts, 1);
    leveldb_options_set_cache(s->opts, s->cache);
    leveldb_options_set_filter_policy(s->opts, s->filter);
    leveldb_options_set_write_buffer_size(s->opts, 16u << 20);
    leveldb_options_set_max_file_size(s->opts, 8u << 20);
    s->ropts = leveldb_readoptions_create();
    /* a damaged table block is an error, not data (LevelDB does not check by default) */
    leveldb_readoptions_set_verify_checksums(s->ropts, 1);
    s->wsync = leveldb_writeoptions_create();
    leveldb_writeoptions_set_sync(s->wsync, 1);
    s->wnosync = leveldb_writeoptions_create();
    if ((rc = db_open(s, err))) goto fail;
    *out = s;
    return 0;
fail:
    cp_store_close(s);
    return rc;
}

void cp_store_close(cp_store *s)
{
    if (!s) return;
    cp_metrics_remove(s->metrics, s);
    cp_buckets_drop(s, 0);
    free(s->buckets.v);
    free(s->dirty.v);
    free(s->bslots);
    cp_forgotten_free(s);
    free(s->forgotten.v);
    cp_buf_close(&s->mt_prod);
    for (uint32_t i = 0; i < s->tenants.n; i++)
        tenant_free(s->tenants.v[i]);
    free(s->tenants.v);
    if (s->db) leveldb_close(s->db);
    if (s->opts) leveldb_options_destroy(s->opts);
    if (s->cache) leveldb_cache_destroy(s->cache);
    if (s->filter) leveldb_filterpolicy_destroy(s->filter);
    if (s->ropts) leveldb_readoptions_destroy(s->ropts);
    if (s->wsync) leveldb_writeoptions_destroy(s->wsync);
    if (s->wnosync) leveldb_writeoptions_destroy(s->wnosync);
    pthread_rwlock_destroy(&s->lock);
    pthread_rwlock_destroy(&s->dblock);
    pthread_mutex_destroy(&s->damage_mu);
    free(s->path);
    free(s);
}

int cp_store_reopen(cp_store *s, cp_err *err)
{
    CP_ASSERT_THREAD(&s->writer, "writer thread only");
    pthread_rwlock_wrlock(&s->dblock);
    cp_buckets_drop(s, 0);
    if (s->db) leveldb_close(s->db);
    s->db = NULL;
    /* readers never hold table pointers without dblock; cp_store_get_stats reads the
     * tenant list under lock only */
    pthread_rwlock_wrlock(&s->lock);
    cp_forgotten_free(s);
    for (uint32_t i = 0; i < s->tenants.n; i++)
        tenant_free(s->tenants.v[i]);
    s->tenants.n = 0;
    s->wcache_bytes = 0; /* the series and their stack caches are gone */
    s->mt_tenant = s->mt_series = s->mt_level = 0;
    s->mt_prod_tenant = 0;
    s->mt_prod.len = 0;
    s->broken = 1;
    int rc = db_open(s, err);
    if (rc) {
        for (uint32_t i = 0; i < s->tenants.n; i++)
            tenant_free(s->tenants.v[i]);
        s->tenants.n = 0;
        if (s->db) leveldb_close(s->db);
        s->db = NULL;
    } else {
        s->broken = 0;
    }
    pthread_rwlock_unlock(&s->lock);
    pthread_rwlock_unlock(&s->dblock);
    return rc;
}

/* ---- symbol tables (a side input of query/, see format.h 'Y') ------------------------ */

/* Builds T \0 'Y' build_id; returns the length or 0 when the names do not fit. */
static size_t key_symbols(uint8_t *k, size_t cap, const char *tenant, const char *build_id)
{
    size_t tl = strlen(tenant), bl = strlen(build_id);
    if (!tl || tl > CP_TENANT_KEY_MAX || !bl || bl > CP_SYMBOLS_ID_MAX || tl + 2 + bl > cap)
        return 0;
    memcpy(k, tenant, tl);
    k[tl] = 0;
    k[tl + 1] = CP_K_SYMBOLS;
    memcpy(k + tl + 2, build_id, bl);
    return tl + 2 + bl;
}

/* The answer to a symbols call while the store is closed (between a failed write and a
 * successful cp_store_reopen). */
static int not_open(const cp_store *s, cp_err *err)
{
    return cp_err_set(err, CP_ESTORE,
                      "store %s is not open: an earlier write failed and reopening it has not "
                      "succeeded yet",
                      s->path);
}

int cp_store_put_symbols(cp_store *s, const char *tenant, const char *build_id, const void *table,
                         size_t len, cp_err *err)
{
    uint8_t k[CP_TENANT_KEY_MAX + CP_SYMBOLS_ID_MAX + 2];
    size_t kl = key_symbols(k, sizeof k, tenant, build_id);
    if (!kl) return cp_err_set(err, CP_EINVAL, "symbols: bad tenant or build id");
    char *lerr = NULL;
    /* from a query thread: dblock keeps a concurrent cp_store_reopen from closing db */
    pthread_rwlock_rdlock(&s->dblock);
    if (s->db) leveldb_put(s->db, s->wsync, (const char *)k, kl, table, len, &lerr);
    int open = s->db != NULL;
    pthread_rwlock_unlock(&s->dblock);
    if (!open) return not_open(s, err);
    if (lerr) {
        cp_err_set(err, CP_ESTORE, "store %s: writing the symbols of %s: %s", s->path, build_id,
                   lerr);
        leveldb_free(lerr);
        return CP_ESTORE;
    }
    return 0;
}

int cp_store_get_symbols(cp_store *s, const char *tenant, const char *build_id, uint8_t **out,
                         size_t *len, cp_err *err)
{
    *out = NULL;
    *len = 0;
    uint8_t k[CP_TENANT_KEY_MAX + CP_SYMBOLS_ID_MAX + 2];
    size_t kl = key_symbols(k, sizeof k, tenant, build_id);
    if (!kl) return CP_ENOTFOUND;
    char *lerr = NULL;
    size_t vl = 0;
    pthread_rwlock_rdlock(&s->dblock);
    char *v = s->db ? leveldb_get(s->db, s->ropts, (const char *)k, kl, &vl, &lerr) : NULL;
    int open = s->db != NULL;
    pthread_rwlock_unlock(&s->dblock);
    if (!open) return not_open(s, err);
    if (lerr) {
        cp_err_set(err, CP_ESTORE, "store %s: reading the symbols of %s: %s", s->path, build_id,
                   lerr);
        leveldb_free(lerr);
        return CP_ESTORE;
    }
    if (!v) return CP_ENOTFOUND;
    /* leveldb_get's buffer is malloc'ed; copy so that the caller may free() it */
    uint8_t *c = malloc(vl ? vl : 1);
    if (!c) {
        leveldb_free(v);
        return cp_err_set(err, CP_ENOMEM, "out of memory");
    }
    memcpy(c, v, vl);
    leveldb_free(v);
    *out = c;
    *len = vl;
    return 0;
}

/* ---- statistics ---------------------------------------------------------------------- */

static int store_collect(void *arg, cp_metrics_out *o)
{
    cp_store_stats st = {0};
    cp_store_get_stats(arg, &st);
    static const struct {
        const char *name, *help;
        cp_metric_type type;
        size_t off;
    } fams[] = {
        {"contprof_store_disk_bytes", "Approximate size of the store on disk.", CP_METRIC_GAUGE,
         offsetof(cp_store_stats, disk_bytes)},
        {"contprof_store_series", "Distinct series in the store.", CP_METRIC_GAUGE,
         offsetof(cp_store_stats, series)},
        {"contprof_store_series_forgotten_total",
         "Series forgotten by retention: every window of theirs was past every level's "
         "retention (a later window of the same labels makes a new series).",
         CP_METRIC_COUNTER, offsetof(cp_store_stats, series_forgotten)},
        {"contprof_store_windows_written_total", "Windows stored by this process.",
         CP_METRIC_COUNTER, offsetof(cp_store_stats, windows)},
        {"contprof_store_stack_cache_hits_total",
         "Samples whose stack the writer's per-series cache knew (store/README.md).",
         CP_METRIC_COUNTER, offsetof(cp_store_stats, stack_cache_hits)},
        {"contprof_store_stack_cache_misses_total", "Samples decoded and interned in full.",
         CP_METRIC_COUNTER, offsetof(cp_store_stats, stack_cache_misses)},
        {"contprof_store_stack_cache_flushes_total",
         "Times every series' stack cache was dropped to stay in its budget.", CP_METRIC_COUNTER,
         offsetof(cp_store_stats, stack_cache_flushes)},
        {"contprof_store_stack_cache_bytes", "Memory held by the stack caches.", CP_METRIC_GAUGE,
         offsetof(cp_store_stats, stack_cache_bytes)},
        {"contprof_store_open_bucket_bytes",
         "Memory held by the writer's open rollup buckets (bounded by store.memory_budget).",
         CP_METRIC_GAUGE, offsetof(cp_store_stats, bucket_bytes)},
        {"contprof_store_open_bucket_drops_total",
         "Times every open bucket was dropped after a commit, past store.memory_budget or the "
         "row cap (each is read back from LevelDB when next written).",
         CP_METRIC_COUNTER, offsetof(cp_store_stats, bucket_drops)},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof fams / sizeof fams[0] && !rc; i++) {
        uint64_t v;
        memcpy(&v, (const char *)&st + fams[i].off, sizeof v);
        rc = cp_metrics_out_scalar(o, fams[i].name, fams[i].help, fams[i].type, v);
    }
    return rc;
}

int cp_store_register_metrics(cp_store *s, cp_metrics *r)
{
    if (s->metrics) return CP_EINVAL;
    int rc = cp_metrics_collector(r, s, store_collect, s);
    if (!rc) s->metrics = r;
    return rc;
}

void cp_store_writer_release(cp_store *s)
{
    CP_THREAD_RELEASE(&s->writer);
}
