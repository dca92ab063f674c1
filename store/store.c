/* The profile store: series, time buckets at five levels, dictionaries and ingest offsets
 * in one LevelDB database (layout in format.h). One writer (ingest) and many readers
 * (query) run concurrently: LevelDB gives readers consistent snapshots, and one
 * writer-preferring rwlock guards the in-memory tables (tenants, series, dictionaries). */
#include "store.h"
#include "store_int.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

_Static_assert(CP_TENANT_KEY_MAX == CP_TENANT_MAX, "tenant key size");

#define TIME_LIMIT (1LL << 62) /* times beyond +-2^62 ns (year 2116) are refused */

/* ---------------------------------------------------------------------------------
 * In-memory tables
 * --------------------------------------------------------------------------------- */

typedef struct cp_ser cp_ser;
typedef struct tenant tenant;

/* A bucket the writer has open: loaded or new, dirty until committed. */
typedef struct bucket {
    cp_ser *ser;
    int level;
    int64_t start;
    int dirty;
    cp_acc acc;
} bucket;

struct cp_ser {
    uint32_t id;
    cp_kind kind;
    tenant *t;
    cp_labels labels;
    char *key; /* identity: kind, then name \0 value \0 ... */
    size_t keylen;
    uint32_t ntypes;
    char *type[CP_MAX_TYPES], *unit[CP_MAX_TYPES];
    char *period_type, *period_unit;
    int64_t period;
    int64_t first_ns, last_ns; /* window starts; first > last while empty */
    uint64_t windows;
    int meta_dirty;
    /* writer: the last cumulative input (alloc, cumulative=true) of one producer */
    char *cum_producer;
    cp_acc cum;
    int cum_valid, cum_dirty;
};

typedef struct prod {
    char *key; /* producer \0 be32 scope */
    size_t keylen;
    int exists, dirty;
    uint64_t hwm, bits[4];
    int64_t last_seen;
} prod;

/* string -> pointer hash */
typedef struct strmap {
    struct sm_slot {
        const char *k;
        size_t len;
        void *v;
    } * s;
    uint32_t n, cap;
} strmap;

struct tenant {
    char *name;
    size_t len;
    cp_dict dict;
    CP_VEC(cp_ser *) series; /* by id - 1 */
    strmap by_key;           /* series key -> cp_ser */
    strmap prods;            /* writer: producer records */
};

struct cp_store {
    leveldb_t *db;
    leveldb_options_t *opts;
    leveldb_cache_t *cache;
    leveldb_filterpolicy_t *filter;
    leveldb_readoptions_t *ropts;
    leveldb_writeoptions_t *wsync, *wnosync;
    char *path;
    pthread_rwlock_t lock;
    /* Guards db itself: readers hold it for reading for as long as they use db (snapshot,
     * iterators), cp_store_reopen holds it for writing while it closes and reopens db. */
    pthread_rwlock_t dblock;
    CP_VEC(tenant *) tenants;
    int64_t retention[CP_NLEVELS];
    atomic_uint_fast64_t windows;
    int broken;
    uint32_t format; /* the store's format version (CP_STORE_FORMAT_OLDEST..VERSION) */
    /* writer state */
    CP_VEC(bucket *) buckets; /* open buckets (hash below) */
    uint32_t *bslots, nbslots;
    size_t bucket_rows, bucket_rows_max;
    uint32_t mt_tenant, mt_series, mt_level; /* maintenance cursor */
};

struct cp_store_batch {
    cp_store *s;
    leveldb_writebatch_t *wb;
    uint32_t windows;
    CP_VEC(cp_ser *) dirty_series;
    CP_VEC(prod *) dirty_prods;
    cp_acc win, prev;
    cp_buf scratch, vbuf, kbuf;
    CP_VEC(uint32_t) locmap; /* profile location id -> dict location id */
    CP_VEC(uint32_t) stack;  /* one sample's dict locations */
    CP_VEC(cp_label) labels; /* one sample's labels, dict string ids */
    CP_VEC(uint32_t) strmap; /* profile string id -> dict string id (0 = not yet) */
    CP_VEC(uint32_t) fnmap, mapmap;
    CP_VEC(uint64_t) mapdelta; /* profile mapping id -> add to an address: canonical form */
};

/* ---------------------------------------------------------------------------------
 * Small helpers
 * --------------------------------------------------------------------------------- */

static char *xstrndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static uint64_t sm_hash(const char *k, size_t len)
{
    return cp_hash_bytes(k, len, 0x5e5);
}

static void *sm_get(const strmap *m, const char *k, size_t len)
{
    if (!m->cap) return NULL;
    uint32_t i = (uint32_t)sm_hash(k, len) & (m->cap - 1);
    while (m->s[i].k) {
        if (m->s[i].len == len && !memcmp(m->s[i].k, k, len)) return m->s[i].v;
        i = (i + 1) & (m->cap - 1);
    }
    return NULL;
}

/* k must stay valid as long as the entry (it is owned by the value). */
static int sm_put(strmap *m, const char *k, size_t len, void *v)
{
    if ((m->n + 1) * 2 > m->cap) {
        uint32_t nc = m->cap ? m->cap * 2 : 64;
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
    }
    uint32_t i = (uint32_t)sm_hash(k, len) & (m->cap - 1);
    while (m->s[i].k)
        i = (i + 1) & (m->cap - 1);
    m->s[i] = (struct sm_slot){k, len, v};
    m->n++;
    return 0;
}

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static int64_t now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Key builders (format.h). All return the length written into k (>= 96 + tenant bytes). */
static size_t key_tenant(uint8_t *k, const tenant *t, uint8_t type)
{
    memcpy(k, t->name, t->len);
    k[t->len] = 0;
    k[t->len + 1] = type;
    return t->len + 2;
}

static size_t key_block(uint8_t *k, const cp_ser *s, int level, int64_t start)
{
    size_t n = key_tenant(k, s->t, CP_K_BLOCK);
    cp_put_be32(k + n, s->id);
    k[n + 4] = (uint8_t)level;
    cp_put_be64(k + n + 5, cp_time_key(start));
    return n + 13;
}

static size_t key_series(uint8_t *k, const cp_ser *s)
{
    size_t n = key_tenant(k, s->t, CP_K_SERIES);
    cp_put_be32(k + n, s->id);
    return n + 4;
}

static size_t key_offset(uint8_t *k, size_t cap, const char *topic, int32_t partition)
{
    size_t tl = strlen(topic);
    if (tl + 8 > cap) tl = cap - 8;
    k[0] = 0;
    k[1] = CP_K_OFFSET;
    memcpy(k + 2, topic, tl);
    k[2 + tl] = 0;
    cp_put_be32(k + 3 + tl, (uint32_t)partition);
    return tl + 7;
}

/* Bucket start of time t at level (level 0: t itself). */
static int64_t bucket_of(int level, int64_t t)
{
    return level ? floor_div(t, cp_level_ns[level]) * cp_level_ns[level] : t;
}

/* ---------------------------------------------------------------------------------
 * Series and tenants
 * --------------------------------------------------------------------------------- */

static void ser_free(cp_ser *s)
{
    if (!s) return;
    cp_labels_close(&s->labels);
    free(s->key);
    for (uint32_t i = 0; i < CP_MAX_TYPES; i++) {
        free(s->type[i]);
        free(s->unit[i]);
    }
    free(s->period_type);
    free(s->period_unit);
    free(s->cum_producer);
    cp_acc_close(&s->cum);
    free(s);
}

static void tenant_free(tenant *t)
{
    if (!t) return;
    for (uint32_t i = 0; i < t->series.n; i++)
        ser_free(t->series.v[i]);
    free(t->series.v);
    free(t->by_key.s);
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

static tenant *tenant_find(cp_store *s, const char *name, size_t len)
{
    for (uint32_t i = 0; i < s->tenants.n; i++)
        if (s->tenants.v[i]->len == len && !memcmp(s->tenants.v[i]->name, name, len))
            return s->tenants.v[i];
    return NULL;
}

/* Creates tenant name (caller holds the write lock or is opening). */
static tenant *tenant_add(cp_store *s, const char *name, size_t len)
{
    tenant *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    if (cp_dict_init(&t->dict) || !(t->name = xstrndup(name, len)) || cp_vec_push(&s->tenants, t)) {
        tenant_free(t);
        return NULL;
    }
    t->len = len;
    t->dict.tenant = t->name;
    t->dict.tenant_len = len;
    return t;
}

/* The identity key of (kind, labels). */
static int ser_identity(cp_kind kind, const cp_labels *l, cp_buf *out)
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

static void put_str(cp_buf *b, const char *s)
{
    size_t n = strlen(s);
    uint8_t tmp[10];
    uint8_t *e = cp_put_uv(tmp, n);
    cp_buf_append(b, tmp, (size_t)(e - tmp));
    cp_buf_append(b, s, n);
}

static void put_uv(cp_buf *b, uint64_t v)
{
    uint8_t tmp[10];
    uint8_t *e = cp_put_uv(tmp, v);
    cp_buf_append(b, tmp, (size_t)(e - tmp));
}

static int ser_encode(const cp_ser *s, cp_buf *b)
{
    b->len = 0;
    if (cp_buf_reserve(b, 256)) return CP_ENOMEM;
    put_uv(b, (uint64_t)s->kind);
    put_uv(b, s->labels.p.n);
    for (uint32_t i = 0; i < s->labels.p.n; i++) {
        put_str(b, s->labels.p.v[i].name);
        put_str(b, s->labels.p.v[i].value);
    }
    put_uv(b, s->ntypes);
    for (uint32_t i = 0; i < s->ntypes; i++) {
        put_str(b, s->type[i]);
        put_str(b, s->unit[i]);
    }
    put_str(b, s->period_type);
    put_str(b, s->period_unit);
    put_uv(b, cp_zz(s->period));
    put_uv(b, cp_zz(s->first_ns));
    put_uv(b, cp_zz(s->last_ns));
    put_uv(b, s->windows);
    return 0;
}

static char *rd_strdup(cp_rd *r)
{
    size_t n;
    const uint8_t *p = cp_get_str(r, &n);
    if (!p) return NULL;
    return xstrndup((const char *)p, n);
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
    if (nt > CP_MAX_TYPES) r.bad = 1;
    for (uint64_t i = 0; i < nt && !r.bad; i++) {
        s->type[i] = rd_strdup(&r);
        s->unit[i] = rd_strdup(&r);
        if (!s->type[i] || !s->unit[i]) r.bad = 1;
    }
    s->ntypes = (uint32_t)nt;
    if (!r.bad) {
        s->period_type = rd_strdup(&r);
        s->period_unit = rd_strdup(&r);
    }
    s->period = cp_get_sv(&r);
    s->first_ns = cp_get_sv(&r);
    s->last_ns = cp_get_sv(&r);
    s->windows = cp_get_uv(&r);
    if (r.bad || !s->period_type || !s->period_unit || !cp_kind_name((int)s->kind)) {
        ser_free(s);
        return cp_err_set(err, CP_ESTORE, "series %u of tenant %s: corrupt record", id, t->name);
    }
    if (ser_identity(s->kind, &s->labels, &key)) {
        ser_free(s);
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
static int ldb_fail(const cp_store *s, cp_err *err, const char *e, const char *what)
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
    return cp_err_set(err, CP_ESTORE,
                      "store %s: %s: %s%s; the store is damaged: stop contprofd and run "
                      "`contprofd --repair --data %s`",
                      s->path, what, e, table, s->path);
}

static int check_version(cp_store *s, cp_err *err)
{
    static const char vkey[2] = {0, CP_K_VERSION};
    char *e = NULL;
    size_t vlen = 0;
    char *v = leveldb_get(s->db, s->ropts, vkey, 2, &vlen, &e);
    if (e) {
        int rc = ldb_fail(s, err, e, "reading the format record");
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
        int rc = ldb_fail(s, err, e, "writing the format record");
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
        tenant *t = tenant_add(s, key, tl);
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
            if (id != t->series.n + 1) {
                rc = cp_err_set(err, CP_ESTORE, "tenant %s: series %u where %u expected", t->name,
                                id, t->series.n + 1);
                break;
            }
            size_t vl;
            const char *v = leveldb_iter_value(it, &vl);
            cp_ser *ser = NULL;
            if ((rc = ser_decode(t, id, (const uint8_t *)v, vl, &ser, err))) break;
            if (sm_put(&t->by_key, ser->key, ser->keylen, ser)) {
                ser_free(ser);
                rc = cp_err_set(err, CP_ENOMEM, "store: loading series");
            } else if (cp_vec_push(&t->series, ser)) {
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
            rc = ldb_fail(s, err, e, "loading the tables");
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

/* Opens LevelDB and loads the in-memory tables (s->tenants empty, s->db NULL). On failure
 * s->db may be left open or NULL; err says what is wrong and, for damage, the fix. */
static int db_open(cp_store *s, cp_err *err)
{
    int rc = cp_wal_check(s->path, err);
    if (rc) return rc;
    char *e = NULL;
    s->db = leveldb_open(s->opts, s->path, &e);
    if (e) {
        s->db = NULL;
        rc = ldb_fail(s, err, e, "cannot open LevelDB");
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
    int rc;
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->lock, &ra);
    pthread_rwlock_init(&s->dblock, &ra); /* a reopen must not starve behind queries */
    pthread_rwlockattr_destroy(&ra);
    s->path = xstrndup(opt->path, strlen(opt->path));
    if (!s->path) {
        rc = cp_err_set(err, CP_ENOMEM, "store");
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

static void buckets_drop(cp_store *s, int keep_dirty);

void cp_store_close(cp_store *s)
{
    if (!s) return;
    buckets_drop(s, 0);
    free(s->buckets.v);
    free(s->bslots);
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
    free(s->path);
    free(s);
}

int cp_store_reopen(cp_store *s, cp_err *err)
{
    pthread_rwlock_wrlock(&s->dblock);
    buckets_drop(s, 0);
    if (s->db) leveldb_close(s->db);
    s->db = NULL;
    /* readers never hold table pointers without dblock; cp_store_get_stats reads the
     * tenant list under lock only */
    pthread_rwlock_wrlock(&s->lock);
    for (uint32_t i = 0; i < s->tenants.n; i++)
        tenant_free(s->tenants.v[i]);
    s->tenants.n = 0;
    s->mt_tenant = s->mt_series = s->mt_level = 0;
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

/* ---------------------------------------------------------------------------------
 * Writer: open buckets
 * --------------------------------------------------------------------------------- */

static uint64_t bkt_hash(const cp_ser *ser, int level, int64_t start)
{
    return cp_hash_u64(cp_hash_u64((uint64_t)(uintptr_t)ser, (uint64_t)level), (uint64_t)start);
}

static void bslots_rebuild(cp_store *s)
{
    memset(s->bslots, 0, sizeof(uint32_t) * s->nbslots);
    for (uint32_t i = 0; i < s->buckets.n; i++) {
        bucket *b = s->buckets.v[i];
        uint32_t h = (uint32_t)bkt_hash(b->ser, b->level, b->start) & (s->nbslots - 1);
        while (s->bslots[h])
            h = (h + 1) & (s->nbslots - 1);
        s->bslots[h] = i + 1;
    }
}

/* Drops open buckets (all, or only the clean ones). */
static void buckets_drop(cp_store *s, int keep_dirty)
{
    uint32_t w = 0;
    for (uint32_t i = 0; i < s->buckets.n; i++) {
        bucket *b = s->buckets.v[i];
        if (keep_dirty && b->dirty) {
            s->buckets.v[w++] = b;
            continue;
        }
        s->bucket_rows -= b->acc.ids.n;
        cp_acc_close(&b->acc);
        free(b);
    }
    s->buckets.n = w;
    if (s->nbslots) bslots_rebuild(s);
}

static bucket *bucket_find(cp_store *s, const cp_ser *ser, int level, int64_t start)
{
    if (!s->nbslots) return NULL;
    uint32_t h = (uint32_t)bkt_hash(ser, level, start) & (s->nbslots - 1);
    while (s->bslots[h]) {
        bucket *b = s->buckets.v[s->bslots[h] - 1];
        if (b->ser == ser && b->level == level && b->start == start) return b;
        h = (h + 1) & (s->nbslots - 1);
    }
    return NULL;
}

/* The open bucket (ser, level, start): cached, else read from disk when it may exist,
 * else new and empty. */
static int bucket_get(cp_store_batch *B, cp_ser *ser, int level, int64_t start, bucket **out,
                      cp_err *err)
{
    cp_store *s = B->s;
    bucket *b = bucket_find(s, ser, level, start);
    if (b) {
        *out = b;
        return 0;
    }
    if ((s->buckets.n + 1) * 2 > s->nbslots) {
        uint32_t n = s->nbslots ? s->nbslots * 2 : 1024;
        uint32_t *ns = calloc(n, sizeof *ns);
        if (!ns) return cp_err_set(err, CP_ENOMEM, "store: bucket cache");
        free(s->bslots);
        s->bslots = ns;
        s->nbslots = n;
        bslots_rebuild(s);
    }
    b = calloc(1, sizeof *b);
    if (!b || cp_vec_push(&s->buckets, b)) {
        free(b);
        return cp_err_set(err, CP_ENOMEM, "store: bucket cache");
    }
    b->ser = ser;
    b->level = level;
    b->start = start;
    cp_acc_init(&b->acc, ser->ntypes);
    uint32_t h = (uint32_t)bkt_hash(ser, level, start) & (s->nbslots - 1);
    while (s->bslots[h])
        h = (h + 1) & (s->nbslots - 1);
    s->bslots[h] = s->buckets.n;
    *out = b;
    /* may it exist on disk? only if a committed window started inside it */
    int64_t end = level ? start + cp_level_ns[level] : start + 1;
    if (ser->first_ns > ser->last_ns || end <= ser->first_ns || start > ser->last_ns) return 0;
    uint8_t k[CP_TENANT_KEY_MAX + 16];
    size_t kl = key_block(k, ser, level, start);
    char *e = NULL;
    size_t vl;
    char *v = leveldb_get(s->db, s->ropts, (const char *)k, kl, &vl, &e);
    if (e) {
        int rc = ldb_fail(s, err, e, "reading a block");
        leveldb_free(e);
        return rc;
    }
    if (!v) return 0;
    int rc = cp_block_load(&b->acc, (const uint8_t *)v, vl, &B->scratch, err);
    leveldb_free(v);
    if (rc == 0 && b->acc.ntypes != ser->ntypes)
        rc =
            cp_err_set(err, CP_ESTORE, "series %u of tenant %s: block with %u types, series has %u",
                       ser->id, ser->t->name, b->acc.ntypes, ser->ntypes);
    if (rc) cp_acc_reset(&b->acc, ser->ntypes); /* a damaged block is replaced */
    s->bucket_rows += b->acc.ids.n;
    return rc == CP_ENOMEM ? rc : 0;
}

/* ---------------------------------------------------------------------------------
 * Writer: batches
 * --------------------------------------------------------------------------------- */

cp_store_batch *cp_store_batch_create(cp_store *s)
{
    cp_store_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->s = s;
    b->wb = leveldb_writebatch_create();
    cp_acc_init(&b->win, 0);
    cp_acc_init(&b->prev, 0);
    return b;
}

void cp_store_batch_destroy(cp_store_batch *b)
{
    if (!b) return;
    if (b->windows) {
        /* uncommitted changes live in the writer's caches: refuse further writes */
        b->s->broken = 1;
        buckets_drop(b->s, 0);
    }
    leveldb_writebatch_destroy(b->wb);
    free(b->dirty_series.v);
    free(b->dirty_prods.v);
    cp_acc_close(&b->win);
    cp_acc_close(&b->prev);
    cp_buf_close(&b->scratch);
    cp_buf_close(&b->vbuf);
    cp_buf_close(&b->kbuf);
    free(b->locmap.v);
    free(b->stack.v);
    free(b->labels.v);
    free(b->strmap.v);
    free(b->fnmap.v);
    free(b->mapmap.v);
    free(b->mapdelta.v);
    free(b);
}

void cp_store_batch_reset(cp_store_batch *b)
{
    if (b->windows) {
        b->s->broken = 1;
        buckets_drop(b->s, 0);
    }
    leveldb_writebatch_clear(b->wb);
    b->windows = 0;
    b->dirty_series.n = 0;
    b->dirty_prods.n = 0;
}

uint32_t cp_store_batch_windows(const cp_store_batch *b)
{
    return b->windows;
}

int cp_store_batch_set_offset(cp_store_batch *b, const char *topic, int32_t partition,
                              int64_t next_offset)
{
    uint8_t k[300], v[8];
    size_t kl = key_offset(k, sizeof k, topic, partition);
    cp_put_be64(v, (uint64_t)next_offset);
    leveldb_writebatch_put(b->wb, (const char *)k, kl, (const char *)v, 8);
    return 0;
}

int cp_store_get_offset(cp_store *s, const char *topic, int32_t partition, int64_t *next_offset,
                        cp_err *err)
{
    uint8_t k[300];
    size_t kl = key_offset(k, sizeof k, topic, partition);
    char *e = NULL;
    size_t vl;
    if (!s->db) return cp_err_set(err, CP_ESTORE, "store %s is not open (reopen failed)", s->path);
    char *v = leveldb_get(s->db, s->ropts, (const char *)k, kl, &vl, &e);
    if (e) {
        char what[300];
        snprintf(what, sizeof what, "reading the offset of %.200s/%d", topic, partition);
        int rc = ldb_fail(s, err, e, what);
        leveldb_free(e);
        return rc;
    }
    if (!v) return CP_ENOTFOUND;
    int rc = 0;
    if (vl != 8)
        rc = cp_err_set(err, CP_ESTORE, "store: offset record of %s/%d is corrupt", topic,
                        partition);
    else
        *next_offset = (int64_t)cp_get_be64((const uint8_t *)v);
    leveldb_free(v);
    return rc;
}

/* --- producers (duplicate detection) ----------------------------------------------- */

static int prod_get(cp_store_batch *B, tenant *t, const char *producer, int32_t scope, prod **out,
                    cp_err *err)
{
    size_t pl = strlen(producer);
    char kbuf[600];
    if (pl > 512) pl = 512;
    memcpy(kbuf, producer, pl);
    kbuf[pl] = 0;
    cp_put_be32((uint8_t *)kbuf + pl + 1, (uint32_t)scope);
    size_t kl = pl + 5;
    prod *p = sm_get(&t->prods, kbuf, kl);
    if (p) {
        *out = p;
        return 0;
    }
    p = calloc(1, sizeof *p);
    if (!p || !(p->key = xstrndup(kbuf, kl)) || sm_put(&t->prods, p->key, kl, p)) {
        if (p) free(p->key);
        free(p);
        return cp_err_set(err, CP_ENOMEM, "store: producers");
    }
    p->keylen = kl;
    /* load the stored record */
    uint8_t k[CP_TENANT_KEY_MAX + 620];
    size_t n = key_tenant(k, t, CP_K_PRODUCER);
    memcpy(k + n, kbuf, kl);
    char *e = NULL;
    size_t vl;
    char *v = leveldb_get(B->s->db, B->s->ropts, (const char *)k, n + kl, &vl, &e);
    if (e) {
        int rc = ldb_fail(B->s, err, e, "reading a producer record");
        leveldb_free(e);
        return rc;
    }
    if (v) {
        cp_rd r = {(const uint8_t *)v, (const uint8_t *)v + vl, 0};
        p->hwm = cp_get_uv(&r);
        for (int i = 0; i < 4; i++) {
            uint64_t w = 0;
            for (int j = 0; j < 8; j++) {
                if (r.p >= r.end)
                    r.bad = 1;
                else
                    w |= (uint64_t)*r.p++ << (8 * j);
            }
            p->bits[i] = w;
        }
        p->last_seen = cp_get_sv(&r);
        p->exists = !r.bad; /* a damaged record counts as none */
        leveldb_free(v);
    }
    *out = p;
    return 0;
}

static int prod_seen(const prod *p, uint64_t seq)
{
    if (!p->exists || seq > p->hwm) return 0;
    if (seq == p->hwm) return 1;
    uint64_t d = p->hwm - seq;
    if (d > 256) return 1; /* too far behind to tell: treated as already seen */
    return (int)((p->bits[(d - 1) / 64] >> ((d - 1) % 64)) & 1);
}

static void bits_shift(uint64_t *b, uint64_t n)
{
    if (n >= 256) {
        b[0] = b[1] = b[2] = b[3] = 0;
        return;
    }
    uint32_t w = (uint32_t)(n / 64), s = (uint32_t)(n % 64);
    for (int i = 3; i >= 0; i--) {
        uint64_t v = i - (int)w >= 0 ? b[i - w] << s : 0;
        if (s && i - (int)w - 1 >= 0) v |= b[i - w - 1] >> (64 - s);
        b[i] = v;
    }
}

static void prod_mark(prod *p, uint64_t seq, int64_t now)
{
    if (!p->exists) {
        p->exists = 1;
        p->hwm = seq;
        memset(p->bits, 0, sizeof p->bits);
    } else if (seq > p->hwm) {
        uint64_t n = seq - p->hwm;
        bits_shift(p->bits, n);
        if (n <= 256) p->bits[(n - 1) / 64] |= 1ULL << ((n - 1) % 64);
        p->hwm = seq;
    } else {
        uint64_t d = p->hwm - seq;
        if (d >= 1 && d <= 256) p->bits[(d - 1) / 64] |= 1ULL << ((d - 1) % 64);
    }
    if (now > p->last_seen) p->last_seen = now;
}

/* --- converting a profile to (stack id, values) ------------------------------------ */

static int map_str(cp_store_batch *B, cp_dict *d, const cp_profile *p, uint32_t sid, uint32_t *out)
{
    if (sid == 0 || sid >= B->strmap.n) {
        *out = 0;
        return 0;
    }
    if (!B->strmap.v[sid]) {
        const char *str = cp_profile_str(p, sid);
        uint32_t len = p->strs.off.n > sid + 1 ? p->strs.off.v[sid + 1] - p->strs.off.v[sid] - 1
                                               : (uint32_t)strlen(str);
        uint32_t id;
        if (cp_dict_string(d, str, len, &id)) return CP_ENOMEM;
        B->strmap.v[sid] = id + 1;
    }
    *out = B->strmap.v[sid] - 1;
    return 0;
}

static int vec_zero(void *vecp, size_t n)
{
    CP_VEC(uint32_t) *v = vecp;
    if (cp_vec_reserve(v, n)) return CP_ENOMEM;
    memset(v->v, 0, n * sizeof(uint32_t));
    v->n = (uint32_t)n;
    return 0;
}

/* Interns p's stacks into t's dictionaries and sums its samples into B->win (width =
 * the series' types, mapped by colmap). Caller holds the write lock. */
static int profile_to_acc(cp_store_batch *B, tenant *t, const cp_profile *p, const int *colmap,
                          uint32_t ntypes, cp_err *err)
{
    cp_dict *d = &t->dict;
    if (vec_zero(&B->strmap, p->strs.off.n) || vec_zero(&B->fnmap, p->functions.n + 1) ||
        vec_zero(&B->mapmap, p->mappings.n + 1) || vec_zero(&B->locmap, p->locations.n + 1) ||
        cp_vec_reserve(&B->mapdelta, (size_t)p->mappings.n + 1))
        return cp_err_set(err, CP_ENOMEM, "store");
    cp_acc_reset(&B->win, ntypes);
    if (cp_acc_reserve(&B->win, p->samples.n)) return cp_err_set(err, CP_ENOMEM, "store");
    CP_VEC(cp_line) lines = {0};
    int rc = 0;
    for (uint32_t i = 0; i < p->locations.n && !rc; i++) {
        const cp_location *l = &p->locations.v[i];
        cp_location nl = *l;
        nl.mapping_id = 0;
        if (l->mapping_id && l->mapping_id <= p->mappings.n) {
            /* frames are stored by object and file offset: an object's mapping in its
             * canonical form (profile.h), so every process of a binary shares its entries */
            uint32_t *mm = &B->mapmap.v[l->mapping_id];
            if (!*mm) {
                cp_mapping m = p->mappings.v[l->mapping_id - 1];
                const char *file = cp_profile_str(p, m.filename);
                const char *bid = cp_profile_str(p, m.build_id);
                B->mapdelta.v[l->mapping_id] =
                    cp_mapping_names_object(file, strlen(file), strlen(bid))
                        ? cp_mapping_canonicalize(&m)
                        : 0;
                if ((rc = map_str(B, d, p, m.filename, &m.filename)) ||
                    (rc = map_str(B, d, p, m.build_id, &m.build_id)) ||
                    (rc = cp_dict_mapping(d, &m, mm)))
                    break;
            }
            nl.mapping_id = *mm;
            if (nl.address) nl.address += B->mapdelta.v[l->mapping_id]; /* 0: none given */
        }
        if (cp_dict_location_known(d, p, l, nl.mapping_id, nl.address, B->strmap.v, B->fnmap.v,
                                   &B->locmap.v[i + 1]))
            continue;
        lines.n = 0;
        if (cp_vec_reserve(&lines, l->nlines ? l->nlines : 1)) {
            rc = CP_ENOMEM;
            break;
        }
        for (uint32_t j = 0; j < l->nlines && l->line_off + j < p->lines.n; j++) {
            cp_line ln = p->lines.v[l->line_off + j];
            uint32_t fid = ln.function_id;
            if (fid && fid <= p->functions.n) {
                if (!B->fnmap.v[fid]) {
                    cp_function f = p->functions.v[fid - 1];
                    if ((rc = map_str(B, d, p, f.name, &f.name)) ||
                        (rc = map_str(B, d, p, f.system_name, &f.system_name)) ||
                        (rc = map_str(B, d, p, f.filename, &f.filename)) ||
                        (rc = cp_dict_function(d, &f, &B->fnmap.v[fid])))
                        break;
                }
                ln.function_id = B->fnmap.v[fid];
            } else {
                ln.function_id = 0;
            }
            lines.v[lines.n++] = ln;
        }
        if (rc) break;
        nl.nlines = lines.n;
        rc = cp_dict_location(d, &nl, lines.v, &B->locmap.v[i + 1]);
    }
    free(lines.v);
    if (rc) return cp_err_set(err, rc, "store: interning locations");
    uint32_t nin = p->sample_types.n;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *sm = &p->samples.v[i];
        B->stack.n = 0;
        B->labels.n = 0;
        if (cp_vec_reserve(&B->stack, sm->nlocs + 1) || cp_vec_reserve(&B->labels, sm->nlabels + 1))
            return cp_err_set(err, CP_ENOMEM, "store");
        /* the hot loop (tens of thousands of ids per window): locals only, so nothing
         * is reloaded through the batch's pointers; an id out of range maps to 0 */
        uint32_t have = sm->loc_off >= p->stack.n              ? 0
                        : p->stack.n - sm->loc_off < sm->nlocs ? p->stack.n - sm->loc_off
                                                               : sm->nlocs;
        const uint32_t *src = p->stack.v + sm->loc_off, *lm = B->locmap.v;
        uint32_t *dst = B->stack.v, nloc = p->locations.n;
        for (uint32_t j = 0; j < have; j++) /* lm[0] is 0: ids out of range read it */
            dst[j] = lm[src[j] <= nloc ? src[j] : 0];
        for (uint32_t j = have; j < sm->nlocs; j++)
            dst[j] = 0;
        B->stack.n = sm->nlocs;
        for (uint32_t j = 0; j < sm->nlabels && sm->label_off + j < p->labels.n; j++) {
            cp_label lb = p->labels.v[sm->label_off + j];
            if (map_str(B, d, p, lb.key, &lb.key) || map_str(B, d, p, lb.str, &lb.str) ||
                map_str(B, d, p, lb.num_unit, &lb.num_unit))
                return cp_err_set(err, CP_ENOMEM, "store");
            B->labels.v[B->labels.n++] = lb;
        }
        uint32_t sid;
        if (cp_dict_stack(d, B->stack.v, B->stack.n, B->labels.v, B->labels.n, &sid))
            return cp_err_set(err, CP_ENOMEM, "store: interning stacks");
        int64_t *row = cp_acc_row(&B->win, sid);
        if (!row) return cp_err_set(err, CP_ENOMEM, "store");
        const int64_t *v = p->values.v + (size_t)i * nin;
        for (uint32_t c = 0; c < nin; c++)
            if (colmap[c] >= 0) row[colmap[c]] = cp_add_wrap(row[colmap[c]], v[c]);
    }
    return 0;
}

/* --- series lookup/creation -------------------------------------------------------- */

static int ser_create(cp_store_batch *B, tenant *t, const cp_envelope *e, const cp_profile *p,
                      const cp_buf *ident, cp_ser **out, cp_err *err)
{
    cp_ser *s = calloc(1, sizeof *s);
    if (!s) return cp_err_set(err, CP_ENOMEM, "store: series");
    s->t = t;
    s->kind = e->kind;
    s->id = t->series.n + 1;
    s->first_ns = INT64_MAX;
    s->last_ns = INT64_MIN;
    s->ntypes = p->sample_types.n;
    int bad = cp_labels_copy(&s->labels, &e->labels) != 0;
    for (uint32_t i = 0; i < s->ntypes && !bad; i++) {
        const char *ty = cp_profile_str(p, p->sample_types.v[i].type);
        const char *un = cp_profile_str(p, p->sample_types.v[i].unit);
        s->type[i] = xstrndup(ty, strlen(ty));
        s->unit[i] = xstrndup(un, strlen(un));
        bad |= !s->type[i] || !s->unit[i];
    }
    const char *pt = cp_profile_str(p, p->period_type.type);
    const char *pu = cp_profile_str(p, p->period_type.unit);
    s->period_type = xstrndup(pt, strlen(pt));
    s->period_unit = xstrndup(pu, strlen(pu));
    s->period = p->period;
    s->keylen = ident->len;
    s->key = xstrndup((const char *)ident->data, ident->len);
    if (bad || !s->period_type || !s->period_unit || !s->key ||
        cp_vec_reserve(&t->series, (size_t)t->series.n + 1) ||
        sm_put(&t->by_key, s->key, s->keylen, s)) {
        ser_free(s);
        return cp_err_set(err, CP_ENOMEM, "store: series");
    }
    t->series.v[t->series.n++] = s;
    /* label index */
    cp_buf *k = &B->kbuf;
    for (uint32_t i = 0; i < s->labels.p.n; i++) {
        k->len = 0;
        uint8_t pre[CP_TENANT_KEY_MAX + 2], id[4];
        size_t n = key_tenant(pre, t, CP_K_LABEL);
        cp_put_be32(id, s->id);
        if (cp_buf_append(k, pre, n) ||
            cp_buf_append(k, s->labels.p.v[i].name, strlen(s->labels.p.v[i].name) + 1) ||
            cp_buf_append(k, s->labels.p.v[i].value, strlen(s->labels.p.v[i].value) + 1) ||
            cp_buf_append(k, id, 4))
            return cp_err_set(err, CP_ENOMEM, "store: series");
        leveldb_writebatch_put(B->wb, (const char *)k->data, k->len, "", 0);
    }
    s->meta_dirty = 1;
    if (cp_vec_push(&B->dirty_series, s)) return cp_err_set(err, CP_ENOMEM, "store");
    *out = s;
    return 0;
}

static int valid_name(const char *s, size_t max)
{
    size_t n = 0;
    for (; s[n]; n++)
        if ((unsigned char)s[n] < 0x20 || s[n] == 0x7f) return 0;
    return n > 0 && n <= max;
}

/* --- applying a window to its buckets ---------------------------------------------- */

static int apply_window(cp_store_batch *B, cp_ser *ser, int64_t start, cp_err *err)
{
    cp_acc *w = &B->win;
    w->time_ns = start;
    w->windows = 1;
    /* coarsest first: level 0, the window's own bucket, is usually new and then simply
     * takes B->win's rows (no copy, B->win keeps its slot table); B->win is refilled next */
    for (int l = CP_NLEVELS - 1; l >= 0; l--) {
        bucket *b = NULL;
        int rc = bucket_get(B, ser, l, bucket_of(l, start), &b, err);
        if (rc) return rc;
        size_t before = b->acc.ids.n;
        if (l == 0 && b->acc.windows == 0 && b->acc.ids.n == 0) {
            cp_acc_take(&b->acc, w);
        } else if (ser->kind == CP_KIND_INUSE) {
            if (b->acc.windows == 0 || start >= b->acc.time_ns) {
                uint64_t nw = b->acc.windows + 1;
                if (cp_acc_copy(&b->acc, w)) return cp_err_set(err, CP_ENOMEM, "store");
                b->acc.windows = nw;
            } else {
                b->acc.windows++;
            }
        } else {
            if (b->acc.windows == 0 || start < b->acc.time_ns) b->acc.time_ns = start;
            b->acc.windows++;
            if (cp_acc_add(&b->acc, w, 1)) return cp_err_set(err, CP_ENOMEM, "store");
        }
        B->s->bucket_rows += b->acc.ids.n - before;
        b->dirty = 1;
    }
    return 0;
}

/* Turns B->win (a cumulative input of ser from producer) into the delta from the previous
 * cumulative input of the same series and producer, and remembers it. */
static int cumulative_delta(cp_store_batch *B, cp_ser *ser, const char *producer, cp_err *err)
{
    cp_store *s = B->s;
    if (!ser->cum_valid || strcmp(ser->cum_producer, producer)) {
        free(ser->cum_producer);
        ser->cum_producer = xstrndup(producer, strlen(producer));
        if (!ser->cum_producer) return cp_err_set(err, CP_ENOMEM, "store");
        cp_acc_reset(&ser->cum, ser->ntypes);
        ser->cum_valid = 1;
        ser->cum_dirty = 0;
        cp_buf *k = &B->kbuf;
        k->len = 0;
        uint8_t pre[CP_TENANT_KEY_MAX + 8];
        size_t n = key_tenant(pre, ser->t, CP_K_CUMUL);
        cp_put_be32(pre + n, ser->id);
        if (cp_buf_append(k, pre, n + 4) || cp_buf_append(k, producer, strlen(producer)))
            return cp_err_set(err, CP_ENOMEM, "store");
        char *e = NULL;
        size_t vl;
        char *v = leveldb_get(s->db, s->ropts, (const char *)k->data, k->len, &vl, &e);
        if (e) {
            int rc = ldb_fail(s, err, e, "reading a cumulative input");
            leveldb_free(e);
            ser->cum_valid = 0;
            return rc;
        }
        if (v) {
            int rc = cp_block_load(&ser->cum, (const uint8_t *)v, vl, &B->scratch, err);
            leveldb_free(v);
            if (rc || ser->cum.ntypes != ser->ntypes) cp_acc_reset(&ser->cum, ser->ntypes);
        }
    }
    /* prev = cum; cum = win; win = win - prev */
    if (cp_acc_copy(&B->prev, &ser->cum) || cp_acc_copy(&ser->cum, &B->win) ||
        cp_acc_add(&B->win, &B->prev, -1))
        return cp_err_set(err, CP_ENOMEM, "store");
    if (!ser->cum_dirty) {
        ser->cum_dirty = 1;
        int dup = 0;
        for (uint32_t i = 0; i < B->dirty_series.n; i++)
            dup |= B->dirty_series.v[i] == ser;
        if (!dup && cp_vec_push(&B->dirty_series, ser)) return cp_err_set(err, CP_ENOMEM, "store");
    }
    return 0;
}

int cp_store_batch_add(cp_store_batch *B, const cp_envelope *e, const cp_profile *p,
                       int32_t dedup_scope, cp_err *err)
{
    cp_store *s = B->s;
    if (s->broken)
        return cp_err_set(err, CP_ESTORE, "store %s: an earlier write failed; reopen the store",
                          s->path);
    /* --- checks that leave everything unchanged --- */
    if (!e->tenant || !valid_name(e->tenant, CP_TENANT_KEY_MAX))
        return cp_err_set(err, CP_EINVAL, "envelope: tenant must be 1..%d printable bytes",
                          CP_TENANT_KEY_MAX);
    if (!cp_kind_name((int)e->kind))
        return cp_err_set(err, CP_EINVAL, "envelope: unknown kind %d", (int)e->kind);
    if (e->window_start_ns <= -TIME_LIMIT || e->window_start_ns >= TIME_LIMIT)
        return cp_err_set(err, CP_EINVAL, "envelope: window_start_ns %lld out of range",
                          (long long)e->window_start_ns);
    if (!e->producer_id || strlen(e->producer_id) > 512)
        return cp_err_set(err, CP_EINVAL, "envelope: producer_id missing or over 512 bytes");
    if (p->sample_types.n == 0 || p->sample_types.n > CP_MAX_TYPES)
        return cp_err_set(err, CP_ELIMIT, "profile: %u sample types (1..%d allowed)",
                          p->sample_types.n, CP_MAX_TYPES);
    for (uint32_t i = 0; i < e->labels.p.n; i++)
        if (!valid_name(e->labels.p.v[i].name, CP_LABEL_NAME_MAX) ||
            strlen(e->labels.p.v[i].value) > CP_LABEL_VALUE_MAX)
            return cp_err_set(err, CP_EINVAL, "envelope: label %u has a bad name or value", i);
    if (e->cumulative && e->kind != CP_KIND_ALLOC)
        return cp_err_set(err, CP_EINVAL, "envelope: cumulative is only meaningful for alloc");

    size_t tl = strlen(e->tenant);
    tenant *t = tenant_find(s, e->tenant, tl);
    if (!t) {
        pthread_rwlock_wrlock(&s->lock);
        t = tenant_add(s, e->tenant, tl);
        pthread_rwlock_unlock(&s->lock);
        if (!t) return cp_err_set(err, CP_ENOMEM, "store: tenant");
    }
    prod *pr;
    int rc = prod_get(B, t, e->producer_id, dedup_scope, &pr, err);
    if (rc) return rc;
    if (prod_seen(pr, e->sequence)) return CP_STORE_DUPLICATE;

    if ((rc = ser_identity(e->kind, &e->labels, &B->kbuf))) return cp_err_set(err, rc, "store");
    cp_ser *ser = sm_get(&t->by_key, (const char *)B->kbuf.data, B->kbuf.len);
    int colmap[CP_MAX_TYPES];
    if (ser) {
        /* map the input's types onto the series' types by name */
        for (uint32_t c = 0; c < p->sample_types.n; c++) {
            const char *ty = cp_profile_str(p, p->sample_types.v[c].type);
            const char *un = cp_profile_str(p, p->sample_types.v[c].unit);
            colmap[c] = -1;
            for (uint32_t j = 0; j < ser->ntypes; j++)
                if (!strcmp(ser->type[j], ty) && !strcmp(ser->unit[j], un)) colmap[c] = (int)j;
            if (colmap[c] < 0)
                return cp_err_set(
                    err, CP_EINCOMPAT,
                    "profile: sample type %s/%s is not one of series %u's types (first is %s/%s)",
                    ty, un, ser->id, ser->type[0], ser->unit[0]);
        }
    } else {
        for (uint32_t c = 0; c < p->sample_types.n; c++)
            colmap[c] = (int)c;
    }

    /* --- from here on the batch changes --- */
    pthread_rwlock_wrlock(&s->lock);
    t->dict.wb = B->wb;
    if (!ser) {
        cp_buf ident = {0};
        rc = cp_buf_append(&ident, B->kbuf.data, B->kbuf.len);
        if (!rc)
            rc = ser_create(B, t, e, p, &ident, &ser, err);
        else
            cp_err_set(err, rc, "store");
        cp_buf_close(&ident);
    }
    if (!rc) rc = profile_to_acc(B, t, p, colmap, ser->ntypes, err);
    t->dict.wb = NULL;
    pthread_rwlock_unlock(&s->lock);
    if (rc) goto broken;

    if (e->cumulative && (rc = cumulative_delta(B, ser, e->producer_id, err))) goto broken;
    if ((rc = apply_window(B, ser, e->window_start_ns, err))) goto broken;

    pthread_rwlock_wrlock(&s->lock);
    if (e->window_start_ns < ser->first_ns) ser->first_ns = e->window_start_ns;
    if (e->window_start_ns > ser->last_ns) ser->last_ns = e->window_start_ns;
    if (p->period > ser->period) ser->period = p->period;
    ser->windows++;
    pthread_rwlock_unlock(&s->lock);
    if (!ser->meta_dirty) {
        ser->meta_dirty = 1;
        int dup = 0;
        for (uint32_t i = 0; i < B->dirty_series.n; i++)
            dup |= B->dirty_series.v[i] == ser;
        if (!dup && cp_vec_push(&B->dirty_series, ser)) {
            rc = cp_err_set(err, CP_ENOMEM, "store");
            goto broken;
        }
    }
    prod_mark(pr, e->sequence, e->window_start_ns);
    if (!pr->dirty) {
        pr->dirty = 1;
        if (cp_vec_push(&B->dirty_prods, pr)) {
            rc = cp_err_set(err, CP_ENOMEM, "store");
            goto broken;
        }
    }
    B->windows++;
    return 0;
broken:
    /* a failure half-way through leaves caches ahead of the batch: no more writes */
    s->broken = 1;
    return rc;
}

int cp_store_batch_commit(cp_store_batch *B, cp_err *err)
{
    cp_store *s = B->s;
    int rc = 0;
    if (s->broken) {
        rc = cp_err_set(err, CP_ESTORE, "store %s: an earlier write failed; reopen the store",
                        s->path);
        goto out;
    }
    uint8_t k[CP_TENANT_KEY_MAX + 640];
    /* buckets */
    for (uint32_t i = 0; i < s->buckets.n; i++) {
        bucket *b = s->buckets.v[i];
        if (!b->dirty) continue;
        B->vbuf.len = 0;
        if ((rc = cp_block_encode(&b->acc, &B->vbuf))) goto fail;
        size_t kl = key_block(k, b->ser, b->level, b->start);
        leveldb_writebatch_put(B->wb, (const char *)k, kl, (const char *)B->vbuf.data, B->vbuf.len);
    }
    /* series records and cumulative inputs */
    for (uint32_t i = 0; i < B->dirty_series.n; i++) {
        cp_ser *ser = B->dirty_series.v[i];
        if (ser->meta_dirty) {
            pthread_rwlock_rdlock(&s->lock);
            rc = ser_encode(ser, &B->vbuf);
            pthread_rwlock_unlock(&s->lock);
            if (rc) goto fail;
            size_t kl = key_series(k, ser);
            leveldb_writebatch_put(B->wb, (const char *)k, kl, (const char *)B->vbuf.data,
                                   B->vbuf.len);
        }
        if (ser->cum_dirty) {
            B->vbuf.len = 0;
            if ((rc = cp_block_encode(&ser->cum, &B->vbuf))) goto fail;
            size_t n = key_tenant(k, ser->t, CP_K_CUMUL);
            cp_put_be32(k + n, ser->id);
            size_t pl = strlen(ser->cum_producer);
            if (pl > 512) pl = 512;
            memcpy(k + n + 4, ser->cum_producer, pl);
            leveldb_writebatch_put(B->wb, (const char *)k, n + 4 + pl, (const char *)B->vbuf.data,
                                   B->vbuf.len);
        }
    }
    /* producers */
    for (uint32_t i = 0; i < B->dirty_prods.n; i++) {
        prod *p = B->dirty_prods.v[i];
        tenant *t = NULL;
        for (uint32_t j = 0; j < s->tenants.n && !t; j++)
            if (sm_get(&s->tenants.v[j]->prods, p->key, p->keylen) == p) t = s->tenants.v[j];
        if (!t) continue;
        size_t n = key_tenant(k, t, CP_K_PRODUCER);
        memcpy(k + n, p->key, p->keylen);
        uint8_t v[64], *q = v;
        q = cp_put_uv(q, p->hwm);
        for (int w = 0; w < 4; w++)
            for (int j = 0; j < 8; j++)
                *q++ = (uint8_t)(p->bits[w] >> (8 * j));
        q = cp_put_uv(q, cp_zz(p->last_seen));
        leveldb_writebatch_put(B->wb, (const char *)k, n + p->keylen, (const char *)v,
                               (size_t)(q - v));
    }
    char *e = NULL;
    leveldb_write(s->db, s->wsync, B->wb, &e);
    if (e) {
        rc = cp_err_set(err, CP_ESTORE, "store %s: synced write of %u windows failed: %s", s->path,
                        B->windows, e);
        leveldb_free(e);
        goto fail;
    }
    atomic_fetch_add(&s->windows, B->windows);
    for (uint32_t i = 0; i < s->buckets.n; i++)
        s->buckets.v[i]->dirty = 0;
    for (uint32_t i = 0; i < B->dirty_series.n; i++)
        B->dirty_series.v[i]->meta_dirty = B->dirty_series.v[i]->cum_dirty = 0;
    for (uint32_t i = 0; i < B->dirty_prods.n; i++)
        B->dirty_prods.v[i]->dirty = 0;
    /* keep the cache bounded: raw windows rarely come back; rollups do */
    if (s->bucket_rows > s->bucket_rows_max) {
        buckets_drop(s, 0);
    } else {
        uint32_t w = 0;
        for (uint32_t i = 0; i < s->buckets.n; i++) {
            bucket *b = s->buckets.v[i];
            if (b->level == 0) {
                s->bucket_rows -= b->acc.ids.n;
                cp_acc_close(&b->acc);
                free(b);
            } else {
                s->buckets.v[w++] = b;
            }
        }
        s->buckets.n = w;
        if (s->nbslots) bslots_rebuild(s);
    }
    goto out;
fail:
    s->broken = 1;
    buckets_drop(s, 0);
out:
    leveldb_writebatch_clear(B->wb);
    B->windows = 0;
    B->dirty_series.n = 0;
    B->dirty_prods.n = 0;
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Retention
 * --------------------------------------------------------------------------------- */

int cp_store_maintain(cp_store *s, int64_t now_ns, uint32_t max_keys, uint32_t *deleted,
                      cp_err *err)
{
    uint32_t done = 0, visits = 0, total = 0;
    if (deleted) *deleted = 0;
    if (s->broken || !s->db)
        return cp_err_set(err, CP_ESTORE, "store %s: an earlier write failed; reopen the store",
                          s->path);
    for (uint32_t i = 0; i < s->tenants.n; i++)
        total += s->tenants.v[i]->series.n;
    int rc = 0;
    leveldb_writebatch_t *wb = leveldb_writebatch_create();
    uint8_t k0[CP_TENANT_KEY_MAX + 16], k1[CP_TENANT_KEY_MAX + 16];
    while (done < max_keys && visits < total * CP_NLEVELS && rc == 0) {
        if (s->mt_tenant >= s->tenants.n) {
            s->mt_tenant = s->mt_series = s->mt_level = 0;
            if (!s->tenants.n) break;
        }
        tenant *t = s->tenants.v[s->mt_tenant];
        if (s->mt_series >= t->series.n) {
            s->mt_tenant++;
            s->mt_series = s->mt_level = 0;
            continue;
        }
        cp_ser *ser = t->series.v[s->mt_series];
        int l = (int)s->mt_level;
        if (++s->mt_level >= CP_NLEVELS) {
            s->mt_level = 0;
            s->mt_series++;
        }
        visits++;
        if (s->retention[l] <= 0) continue;
        /* a bucket goes once all of it is older than the cut */
        int64_t cut = now_ns - s->retention[l] - cp_level_ns[l];
        size_t n0 = key_block(k0, ser, l, INT64_MIN);
        key_block(k1, ser, l, cut + (l ? 0 : 1));
        leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
        uint32_t here = 0;
        size_t lastlen = 0;
        uint8_t last[CP_TENANT_KEY_MAX + 16];
        for (leveldb_iter_seek(it, (const char *)k0, n0); leveldb_iter_valid(it) && done < max_keys;
             leveldb_iter_next(it)) {
            size_t kl;
            const char *key = leveldb_iter_key(it, &kl);
            if (kl != n0 || memcmp(key, k1, n0) >= 0) break;
            leveldb_writebatch_delete(wb, key, kl);
            memcpy(last, key, kl);
            lastlen = kl;
            here++;
            done++;
        }
        leveldb_iter_destroy(it);
        if (!here) continue;
        char *e = NULL;
        leveldb_write(s->db, s->wnosync, wb, &e);
        leveldb_writebatch_clear(wb);
        if (e) {
            rc = cp_err_set(err, CP_ESTORE, "store: retention delete failed: %s", e);
            leveldb_free(e);
            break;
        }
        /* give the space back: rewrite the files holding the deleted range */
        leveldb_compact_range(s->db, (const char *)k0, n0, (const char *)last, lastlen);
        if (l == 0) {
            pthread_rwlock_wrlock(&s->lock);
            if (ser->first_ns < cut + 1) ser->first_ns = cut + 1;
            if (ser->first_ns > ser->last_ns) ser->first_ns = INT64_MAX, ser->last_ns = INT64_MIN;
            pthread_rwlock_unlock(&s->lock);
        }
        buckets_drop(s, 1);
    }
    leveldb_writebatch_destroy(wb);
    if (deleted) *deleted = done;
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Reading
 * --------------------------------------------------------------------------------- */

int cp_store_kind_types(cp_kind kind, cp_profile *p)
{
    int rc;
    uint32_t a, b;
    switch (kind) {
    case CP_KIND_CPU:
        if ((rc = cp_profile_add_sample_type(p, "samples", "count")) ||
            (rc = cp_profile_add_sample_type(p, "cpu", "nanoseconds")) ||
            (rc = cp_profile_intern_cstr(p, "cpu", &a)) ||
            (rc = cp_profile_intern_cstr(p, "nanoseconds", &b)))
            return rc;
        break;
    case CP_KIND_ALLOC:
    case CP_KIND_INUSE: {
        int al = kind == CP_KIND_ALLOC;
        if ((rc = cp_profile_add_sample_type(p, al ? "alloc_objects" : "inuse_objects", "count")) ||
            (rc = cp_profile_add_sample_type(p, al ? "alloc_space" : "inuse_space", "bytes")) ||
            (rc = cp_profile_intern_cstr(p, "space", &a)) ||
            (rc = cp_profile_intern_cstr(p, "bytes", &b)))
            return rc;
        break;
    }
    default:
        return CP_EINVAL;
    }
    p->period_type.type = a;
    p->period_type.unit = b;
    return 0;
}

typedef struct range {
    int level;
    int64_t a, b;
} range;

/* Splits [a, b) into the fewest aligned buckets, coarsest level first, in time order. */
static void decompose(int level, int64_t a, int64_t b, range *out, int *n)
{
    if (a >= b) return;
    if (level == 0) {
        out[(*n)++] = (range){0, a, b};
        return;
    }
    int64_t sz = cp_level_ns[level];
    int64_t first = -floor_div(-a, sz) * sz, last = floor_div(b, sz) * sz;
    if (first >= last) {
        decompose(level - 1, a, b, out, n);
        return;
    }
    decompose(level - 1, a, first, out, n);
    out[(*n)++] = (range){level, first, last};
    decompose(level - 1, last, b, out, n);
}

typedef struct qctx {
    cp_store *s;
    const leveldb_snapshot_t *snap;
    leveldb_readoptions_t *ro;
    leveldb_iterator_t *it;
    const cp_query_limits *lim;
    uint64_t blocks;
    cp_buf scratch;
    cp_err *err;
    int locked; /* holds s->dblock for reading */
} qctx;

static int qctx_init(qctx *q, cp_store *s, const cp_query_limits *lim, cp_err *err)
{
    memset(q, 0, sizeof *q);
    q->s = s;
    q->lim = lim;
    q->err = err;
    pthread_rwlock_rdlock(&s->dblock);
    q->locked = 1;
    if (!s->db)
        return cp_err_set(err, CP_ESTORE,
                          "store %s is not open: an earlier write failed and "
                          "reopening it has not succeeded yet",
                          s->path);
    q->snap = leveldb_create_snapshot(s->db);
    q->ro = leveldb_readoptions_create();
    leveldb_readoptions_set_verify_checksums(q->ro, 1);
    leveldb_readoptions_set_snapshot(q->ro, q->snap);
    q->it = leveldb_create_iterator(s->db, q->ro);
    return 0;
}

static void qctx_close(qctx *q)
{
    if (q->it) leveldb_iter_destroy(q->it);
    if (q->ro) leveldb_readoptions_destroy(q->ro);
    if (q->snap) leveldb_release_snapshot(q->s->db, q->snap);
    cp_buf_close(&q->scratch);
    if (q->locked) pthread_rwlock_unlock(&q->s->dblock);
    q->locked = 0;
}

static int q_check(qctx *q)
{
    q->blocks++;
    if (q->lim && q->lim->max_blocks && q->blocks > q->lim->max_blocks)
        return cp_err_set(q->err, CP_ELIMIT, "query reads more than %llu blocks",
                          (unsigned long long)q->lim->max_blocks);
    if (q->lim && q->lim->deadline_ns && (q->blocks & 7) == 0 && now_mono() > q->lim->deadline_ns)
        return cp_err_set(q->err, CP_ELIMIT, "query ran past its time limit");
    return 0;
}

/* Calls fn for every block of ser in r (time order). fn returns 0 to go on, 1 to stop. */
typedef int (*block_fn)(qctx *q, void *arg, const uint8_t *v, size_t len);

static int scan_range(qctx *q, const cp_ser *ser, const range *r, block_fn fn, void *arg)
{
    uint8_t k0[CP_TENANT_KEY_MAX + 16], k1[CP_TENANT_KEY_MAX + 16];
    size_t n = key_block(k0, ser, r->level, r->a);
    key_block(k1, ser, r->level, r->b);
    for (leveldb_iter_seek(q->it, (const char *)k0, n); leveldb_iter_valid(q->it);
         leveldb_iter_next(q->it)) {
        size_t kl, vl;
        const char *key = leveldb_iter_key(q->it, &kl);
        if (kl != n || memcmp(key, k1, n) >= 0) break;
        int rc = q_check(q);
        if (rc) return rc;
        const char *v = leveldb_iter_value(q->it, &vl);
        if ((rc = fn(q, arg, (const uint8_t *)v, vl))) return rc;
    }
    char *e = NULL;
    leveldb_iter_get_error(q->it, &e);
    if (e) {
        int rc = ldb_fail(q->s, q->err, e, "reading blocks");
        leveldb_free(e);
        return rc;
    }
    return 0;
}

static int keep_last(qctx *q, void *arg, const uint8_t *v, size_t len)
{
    cp_buf *b = arg;
    b->len = 0;
    if (cp_buf_append(b, v, len)) return cp_err_set(q->err, CP_ENOMEM, "query");
    return 0;
}

/* Visits the blocks of ser that make up [from, to): every one (sum kinds), or only the
 * last existing one (inuse: the latest snapshot). */
static int visit(qctx *q, const cp_ser *ser, int64_t from, int64_t to, block_fn fn, void *arg)
{
    range rs[4 * CP_NLEVELS];
    int n = 0;
    decompose(CP_NLEVELS - 1, from, to, rs, &n);
    if (ser->kind != CP_KIND_INUSE) {
        for (int i = 0; i < n; i++) {
            int rc = scan_range(q, ser, &rs[i], fn, arg);
            if (rc) return rc < 0 ? rc : 0;
        }
        return 0;
    }
    /* inuse: the last block of the last range that has one */
    cp_buf last = {0};
    int rc = 0;
    for (int i = n - 1; i >= 0 && rc == 0; i--) {
        last.len = 0;
        rc = scan_range(q, ser, &rs[i], keep_last, &last);
        if (rc == 0 && last.len) {
            rc = fn(q, arg, last.data, last.len);
            break;
        }
    }
    cp_buf_close(&last);
    return rc < 0 ? rc : 0;
}

typedef CP_VEC(cp_ser *) servec;

/* Selector semantics of model/selector.h (an absent label matches as ""), evaluated here
 * on the parsed matchers so the store does not depend on the parser's module. */
static int sel_match(const cp_selector *sel, const cp_labels *l)
{
    for (uint32_t i = 0; sel && i < sel->n; i++) {
        const cp_matcher *m = &sel->m[i];
        const char *v = cp_labels_get(l, m->name);
        if (!v) v = "";
        int hit;
        switch (m->op) {
        case CP_MATCH_EQ:
            hit = strcmp(v, m->value) == 0;
            break;
        case CP_MATCH_NE:
            hit = strcmp(v, m->value) != 0;
            break;
        case CP_MATCH_RE:
        case CP_MATCH_NRE:
            hit = m->has_re ? regexec(&m->re, v, 0, NULL, 0) == 0 : strcmp(v, m->value) == 0;
            if (m->op == CP_MATCH_NRE) hit = !hit;
            break;
        default:
            hit = 0;
        }
        if (!hit) return 0;
    }
    return 1;
}

/* Series of t of kind (0 = any) matched by sel. Uses the label index for the first
 * non-empty equality matcher, then checks every matcher. Caller holds the read lock. */
static int match_series(qctx *q, tenant *t, int kind, const cp_selector *sel, servec *out)
{
    out->n = 0;
    const cp_matcher *eq = NULL;
    for (uint32_t i = 0; sel && i < sel->n && !eq; i++)
        if (sel->m[i].op == CP_MATCH_EQ && sel->m[i].value[0]) eq = &sel->m[i];
    if (!eq) {
        for (uint32_t i = 0; i < t->series.n; i++) {
            cp_ser *s = t->series.v[i];
            if ((kind && (int)s->kind != kind) || !sel_match(sel, &s->labels)) continue;
            if (cp_vec_push(out, s)) return cp_err_set(q->err, CP_ENOMEM, "query");
        }
        return 0;
    }
    cp_buf k = {0};
    uint8_t pre[CP_TENANT_KEY_MAX + 2];
    size_t n = key_tenant(pre, t, CP_K_LABEL);
    if (cp_buf_append(&k, pre, n) || cp_buf_append(&k, eq->name, strlen(eq->name) + 1) ||
        cp_buf_append(&k, eq->value, strlen(eq->value) + 1)) {
        cp_buf_close(&k);
        return cp_err_set(q->err, CP_ENOMEM, "query");
    }
    int rc = 0;
    for (leveldb_iter_seek(q->it, (const char *)k.data, k.len); leveldb_iter_valid(q->it);
         leveldb_iter_next(q->it)) {
        size_t kl;
        const char *key = leveldb_iter_key(q->it, &kl);
        if (kl != k.len + 4 || memcmp(key, k.data, k.len)) break;
        uint32_t id = cp_get_be32((const uint8_t *)key + k.len);
        if (id == 0 || id > t->series.n) continue; /* created after this query's snapshot */
        cp_ser *s = t->series.v[id - 1];
        if ((kind && (int)s->kind != kind) || !sel_match(sel, &s->labels)) continue;
        if (cp_vec_push(out, s)) {
            rc = cp_err_set(q->err, CP_ENOMEM, "query");
            break;
        }
    }
    cp_buf_close(&k);
    return rc;
}

static int check_range(int64_t from, int64_t to, const cp_query_limits *lim, cp_err *err)
{
    if (from <= -TIME_LIMIT || from >= TIME_LIMIT || to <= -TIME_LIMIT || to >= TIME_LIMIT)
        return cp_err_set(err, CP_EINVAL, "time range [%lld, %lld) out of bounds", (long long)from,
                          (long long)to);
    if (from > to)
        return cp_err_set(err, CP_EINVAL, "from (%lld) is after to (%lld)", (long long)from,
                          (long long)to);
    if (lim && lim->max_range_ns && to - from > lim->max_range_ns)
        return cp_err_set(err, CP_ELIMIT, "time range of %llds exceeds the limit of %llds",
                          (long long)((to - from) / 1000000000),
                          (long long)(lim->max_range_ns / 1000000000));
    return 0;
}

/* Output columns: the first series' types; other series map theirs by name. */
typedef struct qtypes {
    uint32_t n;
    const char *type[CP_MAX_TYPES], *unit[CP_MAX_TYPES];
} qtypes;

static void ser_colmap(const qtypes *qt, const cp_ser *s, int *colmap)
{
    for (uint32_t c = 0; c < s->ntypes; c++) {
        colmap[c] = -1;
        for (uint32_t j = 0; j < qt->n; j++)
            if (!strcmp(qt->type[j], s->type[c]) && !strcmp(qt->unit[j], s->unit[c]))
                colmap[c] = (int)j;
    }
}

typedef struct addctx {
    cp_acc *acc;
    const int *colmap;
    int64_t *totals; /* timeline: per output column */
    /* format-1 stores: stack id -> the first equal stack (cp_dict.stk_alias; fixed at open) */
    const uint32_t *stk_alias;
    uint32_t nstk_alias;
} addctx;

static int add_block(qctx *q, void *arg, const uint8_t *v, size_t len)
{
    addctx *a = arg;
    cp_block_it it;
    int rc = cp_block_it_init(&it, v, len, &q->scratch, q->err);
    if (rc) return rc;
    if (a->totals) {
        for (uint32_t t = 0; t < it.ntypes; t++)
            if (a->colmap[t] >= 0)
                a->totals[a->colmap[t]] = cp_add_wrap(a->totals[a->colmap[t]], it.total[t]);
        return 0;
    }
    int64_t vals[CP_MAX_TYPES];
    uint32_t id;
    while ((rc = cp_block_it_next(&it, &id, vals)) == 1) {
        if (id < a->nstk_alias) id = a->stk_alias[id];
        int64_t *row = cp_acc_row(a->acc, id);
        if (!row) return cp_err_set(q->err, CP_ENOMEM, "query");
        for (uint32_t t = 0; t < it.ntypes; t++)
            if (a->colmap[t] >= 0) row[a->colmap[t]] = cp_add_wrap(row[a->colmap[t]], vals[t]);
    }
    if (rc < 0) return cp_err_set(q->err, CP_ESTORE, "store: corrupt block entry");
    return 0;
}

/* --- building the output profile from dictionary ids (read lock held) --------------- */

typedef struct outmap {
    const cp_dict *d;
    cp_profile *p;
    uint32_t *s, *f, *m, *l; /* dict id -> output id + 1 (strings) or output id */
} outmap;

static int out_str(outmap *o, uint32_t id, uint32_t *out)
{
    if (id == 0 || id + 1 >= o->d->soff.n) {
        *out = 0;
        return 0;
    }
    if (!o->s[id]) {
        size_t len;
        const char *str = cp_dict_str(o->d, id, &len);
        uint32_t oid;
        if (cp_profile_intern(o->p, str, len, &oid)) return CP_ENOMEM;
        o->s[id] = oid + 1;
    }
    *out = o->s[id] - 1;
    return 0;
}

static int out_loc(outmap *o, uint32_t lid, uint32_t *out)
{
    const cp_dict *d = o->d;
    if (lid == 0 || lid > d->loc.n) return CP_ESTORE;
    if (o->l[lid]) {
        *out = o->l[lid];
        return 0;
    }
    const cp_location *l = &d->loc.v[lid - 1];
    uint32_t mid = 0;
    if (l->mapping_id && l->mapping_id <= d->map.n) {
        if (!o->m[l->mapping_id]) {
            cp_mapping m = d->map.v[l->mapping_id - 1];
            if (out_str(o, m.filename, &m.filename) || out_str(o, m.build_id, &m.build_id) ||
                cp_profile_add_mapping(o->p, &m, &o->m[l->mapping_id]))
                return CP_ENOMEM;
        }
        mid = o->m[l->mapping_id];
    }
    cp_line lines[64], *lp = l->nlines <= 64 ? lines : malloc(sizeof(cp_line) * l->nlines);
    if (!lp) return CP_ENOMEM;
    int rc = 0;
    for (uint32_t i = 0; i < l->nlines && !rc; i++) {
        cp_line ln = l->line_off + i < d->lines.n ? d->lines.v[l->line_off + i] : (cp_line){0, 0};
        uint32_t fid = ln.function_id;
        ln.function_id = 0;
        if (fid && fid <= d->fn.n) {
            if (!o->f[fid]) {
                cp_function f = d->fn.v[fid - 1];
                if (out_str(o, f.name, &f.name) || out_str(o, f.system_name, &f.system_name) ||
                    out_str(o, f.filename, &f.filename) ||
                    cp_profile_add_function(o->p, &f, &o->f[fid])) {
                    rc = CP_ENOMEM;
                    break;
                }
            }
            ln.function_id = o->f[fid];
        }
        lp[i] = ln;
    }
    if (!rc) rc = cp_profile_add_location(o->p, l->address, mid, lp, l->nlines, &o->l[lid]);
    if (lp != lines) free(lp);
    if (!rc) *out = o->l[lid];
    return rc;
}

static int build_profile(const tenant *t, const cp_acc *acc, cp_profile *p, cp_err *err)
{
    const cp_dict *d = &t->dict;
    outmap o = {d,
                p,
                calloc(d->soff.n + 1, 4),
                calloc(d->fn.n + 1, 4),
                calloc(d->map.n + 1, 4),
                calloc(d->loc.n + 1, 4)};
    CP_VEC(uint32_t) locs = {0};
    CP_VEC(cp_label) labels = {0};
    int rc = 0;
    if (!o.s || !o.f || !o.m || !o.l) rc = CP_ENOMEM;
    for (uint32_t i = 0; i < acc->ids.n && !rc; i++) {
        const int64_t *row = acc->vals.v + (size_t)i * acc->ntypes;
        int nz = 0;
        for (uint32_t c = 0; c < acc->ntypes; c++)
            nz |= row[c] != 0;
        if (!nz) continue;
        uint32_t sid = acc->ids.v[i];
        if (sid == 0 || sid > d->stk.n) {
            rc = CP_ESTORE;
            break;
        }
        const cp_sample *st = &d->stk.v[sid - 1];
        locs.n = labels.n = 0;
        if (cp_vec_reserve(&locs, st->nlocs + 1) || cp_vec_reserve(&labels, st->nlabels + 1)) {
            rc = CP_ENOMEM;
            break;
        }
        for (uint32_t j = 0; j < st->nlocs && !rc; j++) {
            uint32_t lid = st->loc_off + j < d->stk_locs.n ? d->stk_locs.v[st->loc_off + j] : 0;
            rc = out_loc(&o, lid, &locs.v[locs.n++]);
        }
        for (uint32_t j = 0; j < st->nlabels && !rc && st->label_off + j < d->stk_labels.n; j++) {
            cp_label lb = d->stk_labels.v[st->label_off + j];
            if (out_str(&o, lb.key, &lb.key) || out_str(&o, lb.str, &lb.str) ||
                out_str(&o, lb.num_unit, &lb.num_unit))
                rc = CP_ENOMEM;
            labels.v[labels.n++] = lb;
        }
        if (!rc) rc = cp_profile_add_sample(p, locs.v, locs.n, row, labels.v, labels.n);
    }
    free(o.s);
    free(o.f);
    free(o.m);
    free(o.l);
    free(locs.v);
    free(labels.v);
    if (rc == CP_ESTORE)
        return cp_err_set(err, rc,
                          "tenant %s: a block refers to a stack or location missing "
                          "from the dictionary",
                          t->name);
    if (rc) return cp_err_set(err, rc, "query: building the profile");
    return 0;
}

/* Output sample types and period from the matched series (read lock held). */
static int set_types(cp_profile *p, cp_kind kind, const servec *ss, qtypes *qt)
{
    memset(qt, 0, sizeof *qt);
    if (!ss->n) {
        int rc = cp_store_kind_types(kind, p);
        if (rc) return rc;
        qt->n = p->sample_types.n;
        for (uint32_t i = 0; i < qt->n; i++) {
            qt->type[i] = cp_profile_str(p, p->sample_types.v[i].type);
            qt->unit[i] = cp_profile_str(p, p->sample_types.v[i].unit);
        }
        return 0;
    }
    const cp_ser *f = ss->v[0];
    qt->n = f->ntypes;
    for (uint32_t i = 0; i < f->ntypes; i++) {
        qt->type[i] = f->type[i];
        qt->unit[i] = f->unit[i];
        int rc = cp_profile_add_sample_type(p, f->type[i], f->unit[i]);
        if (rc) return rc;
    }
    int64_t period = 0;
    for (uint32_t i = 0; i < ss->n; i++)
        if (ss->v[i]->period > period) period = ss->v[i]->period;
    p->period = period;
    int rc = cp_profile_intern_cstr(p, f->period_type, &p->period_type.type);
    if (!rc) rc = cp_profile_intern_cstr(p, f->period_unit, &p->period_type.unit);
    return rc;
}

int cp_store_query(cp_store *s, const char *tenant_name, cp_kind kind, const cp_selector *sel,
                   int64_t from_ns, int64_t to_ns, const cp_query_limits *lim, cp_profile **out,
                   cp_err *err)
{
    *out = NULL;
    if (!cp_kind_name((int)kind)) return cp_err_set(err, CP_EINVAL, "unknown kind %d", (int)kind);
    int rc = check_range(from_ns, to_ns, lim, err);
    if (rc) return rc;
    cp_profile *p = cp_profile_create();
    if (!p) return cp_err_set(err, CP_ENOMEM, "query");
    qctx q;
    rc = qctx_init(&q, s, lim, err);
    servec ss = {0};
    cp_acc acc;
    cp_acc_init(&acc, 0);
    qtypes qt;
    pthread_rwlock_rdlock(&s->lock);
    tenant *t = tenant_name && !rc ? tenant_find(s, tenant_name, strlen(tenant_name)) : NULL;
    if (t) rc = match_series(&q, t, (int)kind, sel, &ss);
    if (!rc) rc = set_types(p, kind, &ss, &qt);
    pthread_rwlock_unlock(&s->lock);
    if (rc) {
        if (rc != CP_ENOMEM && err && err->code == rc) goto done;
        cp_err_set(err, rc, "query: %s", cp_strerror(rc));
        goto done;
    }
    cp_acc_reset(&acc, qt.n);
    for (uint32_t i = 0; i < ss.n && !rc && from_ns < to_ns; i++) {
        int colmap[CP_MAX_TYPES];
        ser_colmap(&qt, ss.v[i], colmap);
        addctx a = {&acc, colmap, NULL, t->dict.stk_alias, t->dict.nstk_alias};
        rc = visit(&q, ss.v[i], from_ns, to_ns, add_block, &a);
    }
    if (!rc && acc.ids.n) {
        pthread_rwlock_rdlock(&s->lock);
        rc = build_profile(t, &acc, p, err);
        pthread_rwlock_unlock(&s->lock);
    }
    p->time_nanos = from_ns;
    p->duration_nanos = to_ns - from_ns;
done:
    qctx_close(&q);
    free(ss.v);
    cp_acc_close(&acc);
    if (rc) {
        cp_profile_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

int cp_store_timeline(cp_store *s, const char *tenant_name, cp_kind kind, const cp_selector *sel,
                      int64_t from_ns, int64_t to_ns, int64_t step_ns, const cp_query_limits *lim,
                      int64_t **out, uint32_t *nsteps, uint32_t *ntypes, cp_err *err)
{
    *out = NULL;
    *nsteps = *ntypes = 0;
    if (!cp_kind_name((int)kind)) return cp_err_set(err, CP_EINVAL, "unknown kind %d", (int)kind);
    int rc = check_range(from_ns, to_ns, lim, err);
    if (rc) return rc;
    if (step_ns <= 0) return cp_err_set(err, CP_EINVAL, "step must be positive");
    uint64_t n = (uint64_t)((to_ns - from_ns) / step_ns) + ((to_ns - from_ns) % step_ns != 0);
    if (n > 1000000)
        return cp_err_set(err, CP_ELIMIT, "timeline of %llu steps (at most 1000000)",
                          (unsigned long long)n);
    cp_profile *p = cp_profile_create();
    if (!p) return cp_err_set(err, CP_ENOMEM, "timeline");
    qctx q;
    rc = qctx_init(&q, s, lim, err);
    servec ss = {0};
    qtypes qt;
    pthread_rwlock_rdlock(&s->lock);
    tenant *t = tenant_name && !rc ? tenant_find(s, tenant_name, strlen(tenant_name)) : NULL;
    if (t) rc = match_series(&q, t, (int)kind, sel, &ss);
    if (!rc) rc = set_types(p, kind, &ss, &qt);
    int64_t *span = rc ? NULL : malloc(sizeof(int64_t) * 2 * (ss.n + 1));
    if (!rc && !span) rc = CP_ENOMEM;
    for (uint32_t i = 0; !rc && i < ss.n; i++) {
        span[2 * i] = ss.v[i]->first_ns;
        span[2 * i + 1] = ss.v[i]->last_ns;
    }
    pthread_rwlock_unlock(&s->lock);
    int64_t *res = NULL;
    if (rc) {
        if (!err || err->code != rc) cp_err_set(err, rc, "timeline: %s", cp_strerror(rc));
        goto done;
    }
    res = calloc(n * qt.n + 1, sizeof(int64_t));
    if (!res) {
        rc = cp_err_set(err, CP_ENOMEM, "timeline");
        goto done;
    }
    for (uint32_t i = 0; i < ss.n && !rc; i++) {
        int colmap[CP_MAX_TYPES];
        ser_colmap(&qt, ss.v[i], colmap);
        for (uint64_t k = 0; k < n && !rc; k++) {
            int64_t a = from_ns + (int64_t)k * step_ns;
            int64_t b = a + step_ns < to_ns ? a + step_ns : to_ns;
            if (b <= span[2 * i] || a > span[2 * i + 1]) continue;
            addctx ac = {NULL, colmap, res + k * qt.n, NULL, 0};
            rc = visit(&q, ss.v[i], a, b, add_block, &ac);
        }
    }
done:
    qctx_close(&q);
    free(ss.v);
    free(span);
    cp_profile_destroy(p);
    if (rc) {
        free(res);
        return rc;
    }
    *out = res;
    *nsteps = (uint32_t)n;
    *ntypes = qt.n;
    return 0;
}

static int exists_block(qctx *q, void *arg, const uint8_t *v, size_t len)
{
    (void)q, (void)v, (void)len;
    *(int *)arg = 1;
    return 1;
}

void cp_series_list_close(cp_series_list *l)
{
    if (!l) return;
    for (uint32_t i = 0; i < l->n; i++)
        cp_labels_close(&l->v[i].labels);
    free(l->v);
    memset(l, 0, sizeof *l);
}

void cp_string_list_close(cp_string_list *l)
{
    if (!l) return;
    for (uint32_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

int cp_store_series(cp_store *s, const char *tenant_name, const cp_selector *sel, int64_t from_ns,
                    int64_t to_ns, cp_series_list *out, cp_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = check_range(from_ns, to_ns, NULL, err);
    if (rc) return rc;
    qctx q;
    rc = qctx_init(&q, s, NULL, err);
    servec ss = {0};
    pthread_rwlock_rdlock(&s->lock);
    tenant *t = tenant_name && !rc ? tenant_find(s, tenant_name, strlen(tenant_name)) : NULL;
    if (t) rc = match_series(&q, t, 0, sel, &ss);
    for (uint32_t i = 0; i < ss.n && !rc; i++) {
        cp_ser *x = ss.v[i];
        if (x->first_ns > x->last_ns || to_ns <= x->first_ns || from_ns > x->last_ns) continue;
        int found = from_ns <= x->first_ns && x->last_ns < to_ns;
        if (!found) rc = visit(&q, x, from_ns, to_ns, exists_block, &found);
        if (rc || !found) continue;
        cp_series_info si = {{{0}}, x->kind, x->first_ns, x->last_ns};
        if (cp_labels_copy(&si.labels, &x->labels) || cp_vec_push(out, si)) {
            cp_labels_close(&si.labels);
            rc = cp_err_set(err, CP_ENOMEM, "series");
        }
    }
    pthread_rwlock_unlock(&s->lock);
    qctx_close(&q);
    free(ss.v);
    if (rc) cp_series_list_close(out);
    return rc;
}

/* Walks the label index of a tenant: distinct names (name == NULL) or the distinct values
 * of one name, in byte order. */
static int label_walk(cp_store *s, const char *tenant_name, const char *name, cp_string_list *out,
                      cp_err *err)
{
    memset(out, 0, sizeof *out);
    if (!tenant_name || !valid_name(tenant_name, CP_TENANT_KEY_MAX)) return 0;
    size_t tl = strlen(tenant_name);
    cp_buf pre = {0}, k = {0};
    uint8_t z = 0, type = CP_K_LABEL;
    int rc = 0;
    if (cp_buf_append(&pre, tenant_name, tl) || cp_buf_append(&pre, &z, 1) ||
        cp_buf_append(&pre, &type, 1) || (name && cp_buf_append(&pre, name, strlen(name) + 1))) {
        rc = cp_err_set(err, CP_ENOMEM, "labels");
        goto done;
    }
    pthread_rwlock_rdlock(&s->dblock);
    if (!s->db) {
        pthread_rwlock_unlock(&s->dblock);
        rc = cp_err_set(err, CP_ESTORE,
                        "store %s is not open: an earlier write failed and "
                        "reopening it has not succeeded yet",
                        s->path);
        goto done;
    }
    leveldb_iterator_t *it = leveldb_create_iterator(s->db, s->ropts);
    leveldb_iter_seek(it, (const char *)pre.data, pre.len);
    while (leveldb_iter_valid(it)) {
        size_t kl;
        const char *key = leveldb_iter_key(it, &kl);
        if (kl < pre.len || memcmp(key, pre.data, pre.len)) break;
        const char *part = key + pre.len;
        const char *nul = memchr(part, 0, kl - pre.len);
        if (!nul) break;
        size_t pl = (size_t)(nul - part);
        char *str = xstrndup(part, pl);
        if (!str || cp_vec_push(out, str)) {
            free(str);
            rc = cp_err_set(err, CP_ENOMEM, "labels");
            break;
        }
        /* skip every key sharing this part */
        k.len = 0;
        uint8_t one = 1;
        if (cp_buf_append(&k, pre.data, pre.len) || cp_buf_append(&k, part, pl) ||
            cp_buf_append(&k, &one, 1)) {
            rc = cp_err_set(err, CP_ENOMEM, "labels");
            break;
        }
        leveldb_iter_seek(it, (const char *)k.data, k.len);
    }
    leveldb_iter_destroy(it);
    pthread_rwlock_unlock(&s->dblock);
done:
    cp_buf_close(&pre);
    cp_buf_close(&k);
    if (rc) cp_string_list_close(out);
    return rc;
}

int cp_store_label_names(cp_store *s, const char *tenant, cp_string_list *out, cp_err *err)
{
    return label_walk(s, tenant, NULL, out, err);
}

int cp_store_label_values(cp_store *s, const char *tenant, const char *name, cp_string_list *out,
                          cp_err *err)
{
    if (!name) return cp_err_set(err, CP_EINVAL, "label name missing");
    return label_walk(s, tenant, name, out, err);
}

void cp_store_get_stats(cp_store *s, cp_store_stats *out)
{
    memset(out, 0, sizeof *out);
    out->windows = atomic_load(&s->windows);
    pthread_rwlock_rdlock(&s->lock);
    for (uint32_t i = 0; i < s->tenants.n; i++)
        out->series += s->tenants.v[i]->series.n;
    pthread_rwlock_unlock(&s->lock);
    DIR *d = opendir(s->path);
    if (!d) return;
    struct dirent *de;
    char p[4352];
    while ((de = readdir(d))) {
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", s->path, de->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) out->disk_bytes += (uint64_t)st.st_size;
    }
    closedir(d);
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

int cp_store_put_symbols(cp_store *s, const char *tenant, const char *build_id, const void *table,
                         size_t len, cp_err *err)
{
    uint8_t k[CP_TENANT_KEY_MAX + CP_SYMBOLS_ID_MAX + 2];
    size_t kl = key_symbols(k, sizeof k, tenant, build_id);
    if (!kl) return cp_err_set(err, CP_EINVAL, "symbols: bad tenant or build id");
    char *lerr = NULL;
    leveldb_put(s->db, s->wsync, (const char *)k, kl, table, len, &lerr);
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
    char *v = leveldb_get(s->db, s->ropts, (const char *)k, kl, &vl, &lerr);
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
