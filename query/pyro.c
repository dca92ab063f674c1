/* Pyroscope's ingest formats read into profiles by kind (pyro.h): the name grammar, times,
 * multipart, folded text, pprof splitting and Push requests. */
#include "pyro.h"
#include "hmac.h"
#include "json.h"
#include "log.h"
#include "params.h"
#include "pprof.h"
#include "times.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void cp_pyro_batch_close(cp_pyro_batch *b)
{
    cp_labels_close(&b->labels);
    for (uint32_t i = 0; i < b->items.n; i++)
        cp_profile_destroy(b->items.v[i].p);
    free(b->items.v);
    for (uint32_t i = 0; i < b->dropped.n; i++)
        free(b->dropped.v[i]);
    free(b->dropped.v);
    memset(b, 0, sizeof *b);
}

/* ---- labels ------------------------------------------------------------------------- */

/* Sets one label of a sent set into b: service_name is service, __name__ the kind hint,
 * __delta__ the cumulative flag, other "__" names are Pyroscope's own and not kept. */
static int put_label(cp_pyro_batch *b, const char *name, const char *v, const char *where,
                     cp_err *err)
{
    /* OpenTelemetry's dotted names (the Node SDK sends otel.scope.name) as Prometheus maps
     * them: '.' becomes '_' (contprof's names are [A-Za-z_][A-Za-z0-9_]*) */
    char k[CP_LABEL_NAME_MAX + 2];
    snprintf(k, sizeof k, "%s", name);
    for (char *d = k; *d; d++)
        if (*d == '.') *d = '_';
    if (strlen(name) > CP_LABEL_NAME_MAX || !cp_label_name_valid(k))
        return cp_err_set(err, CP_EINVAL,
                          "%s: label name '%.64s' is not [A-Za-z_][A-Za-z0-9_.]* of at most %d "
                          "bytes",
                          where, name, CP_LABEL_NAME_MAX);
    int bad = cp_label_value_check(v);
    if (bad < 0)
        return cp_err_set(err, CP_EINVAL, "%s: label %s: the value is over %d bytes", where, k,
                          CP_LABEL_VALUE_MAX);
    if (bad)
        return cp_err_set(err, CP_EINVAL, "%s: label %s: control character 0x%02x at byte %d",
                          where, k, (unsigned char)v[bad - 1], bad - 1);
    if (!strcmp(k, "__name__")) {
        snprintf(b->kind_hint, sizeof b->kind_hint, "%s", v);
        return 0;
    }
    if (!strcmp(k, "__delta__")) {
        b->cumulative = !strcmp(v, "false");
        return 0;
    }
    if (k[0] == '_' && k[1] == '_') return 0;
    if (!strcmp(k, "service_name") || !strcmp(k, CP_LABEL_SERVICE)) {
        if (cp_labels_get(&b->labels, CP_LABEL_SERVICE))
            return cp_err_set(err, CP_EINVAL,
                              "%s: the service is given twice (the application name and "
                              "label %s)",
                              where, k);
        snprintf(k, sizeof k, "%s", CP_LABEL_SERVICE);
        if (!*v) return cp_err_set(err, CP_EINVAL, "%s: label %s is empty", where, k);
    }
    if (cp_labels_set(&b->labels, k, v)) return cp_err_set(err, CP_ENOMEM, "labels");
    if (b->labels.p.n > CP_LABELS_MAX)
        return cp_err_set(err, CP_EINVAL, "%s: more than %d labels", where, CP_LABELS_MAX);
    return 0;
}

int cp_pyro_parse_name(const char *name, cp_pyro_batch *b, cp_err *err)
{
    if (!name || !*name) return cp_err_set(err, CP_EINVAL, "name: missing (expected app{k=v,...})");
    size_t n = strlen(name), app = strcspn(name, "{");
    if (app == 0) return cp_err_set(err, CP_EINVAL, "name: the application name is empty");
    char *a = strndup(name, app);
    if (!a) return cp_err_set(err, CP_ENOMEM, "name");
    for (size_t i = 0; i < app; i++)
        if ((unsigned char)a[i] < 0x20 || a[i] == 0x7f || a[i] == '}' || a[i] == ',' ||
            a[i] == '=') {
            free(a);
            return cp_err_set(err, CP_EINVAL,
                              "name: byte %zu of the application name: 0x%02x is not allowed", i,
                              (unsigned char)name[i]);
        }
    /* the last dot-part names Go's mutex and block profiles (app.mutex, app.block) */
    const char *dot = strrchr(a, '.');
    if (dot && (!strcmp(dot + 1, "mutex") || !strcmp(dot + 1, "block")))
        snprintf(b->kind_hint, sizeof b->kind_hint, "%s", dot + 1);
    int rc = put_label(b, CP_LABEL_SERVICE, a, "name", err);
    free(a);
    if (rc || app == n) return rc;
    size_t i = app + 1;
    if (name[n - 1] != '}')
        return cp_err_set(err, CP_EINVAL, "name: byte %zu: expected '}' at the end", n - 1);
    while (i < n - 1) {
        size_t kl = strcspn(name + i, "=,}");
        if (name[i + kl] != '=')
            return cp_err_set(err, CP_EINVAL, "name: byte %zu: expected '=' after a label name",
                              i + kl);
        size_t vs = i + kl + 1, vl = strcspn(name + vs, ",}");
        if (vs + vl > n - 1)
            return cp_err_set(err, CP_EINVAL, "name: byte %zu: '}' inside the labels", vs + vl);
        char *k = strndup(name + i, kl), *v = strndup(name + vs, vl);
        char where[48];
        snprintf(where, sizeof where, "name: byte %zu", i);
        rc = !k || !v ? cp_err_set(err, CP_ENOMEM, "name") : put_label(b, k, v, where, err);
        free(k);
        free(v);
        if (rc) return rc;
        i = vs + vl + 1;
        if (name[vs + vl] == '}' && vs + vl != n - 1)
            return cp_err_set(err, CP_EINVAL, "name: byte %zu: text after '}'", vs + vl + 1);
    }
    return 0;
}

int cp_pyro_parse_time(const char *s, int64_t now_ns, int64_t *out, cp_err *err)
{
    if (!s || !*s) {
        *out = now_ns;
        return 0;
    }
    size_t n = strlen(s);
    if (n > 19 || strspn(s, "0123456789") != n)
        return cp_err_set(err, CP_EINVAL,
                          "'%.40s' is not a time: expected unix seconds, or 13 digits of ms, 16 "
                          "of us, 19 of ns",
                          s);
    uint64_t v = strtoull(s, NULL, 10);
    int64_t mul = n == 13 ? 1000000 : n == 16 ? 1000 : n == 19 ? 1 : 1000000000;
    if (v > (uint64_t)INT64_MAX / (uint64_t)mul)
        return cp_err_set(err, CP_EINVAL, "'%.40s': out of range as %s", s,
                          mul == 1000000000 ? "seconds" : "a time");
    *out = (int64_t)v * mul;
    return 0;
}

/* ---- multipart ---------------------------------------------------------------------- */

static const uint8_t *find(const uint8_t *h, size_t hl, const void *n, size_t nl)
{
    if (nl == 0 || hl < nl) return NULL;
    const uint8_t *end = h + hl - nl + 1;
    for (const uint8_t *p = h; p < end; p++) {
        p = memchr(p, *(const uint8_t *)n, (size_t)(end - p));
        if (!p) return NULL;
        if (!memcmp(p, n, nl)) return p;
    }
    return NULL;
}

int cp_pyro_multipart(const char *ct, const uint8_t *body, size_t len, cp_pyro_part *parts, int *n,
                      cp_err *err)
{
    *n = 0;
    const char *bp = ct ? strstr(ct, "boundary=") : NULL;
    if (!bp) return cp_err_set(err, CP_EPARSE, "multipart: Content-Type has no boundary");
    bp += 9;
    char delim[80] = "\r\n--";
    size_t bl = *bp == '"' ? strcspn(bp + 1, "\"") : strcspn(bp, "; \t");
    if (*bp == '"') bp++;
    if (bl == 0 || bl > 70)
        return cp_err_set(err, CP_EPARSE, "multipart: bad boundary length %zu", bl);
    memcpy(delim + 4, bp, bl);
    size_t dl = bl + 4;
    /* the first delimiter may open the body (no CRLF before it) */
    const uint8_t *p;
    if (len >= dl - 2 && !memcmp(body, delim + 2, dl - 2))
        p = body + dl - 2;
    else if ((p = find(body, len, delim, dl)))
        p += dl;
    else
        return cp_err_set(err, CP_EPARSE, "multipart: no boundary in the body");
    const uint8_t *end = body + len;
    for (;;) {
        if (end - p >= 2 && p[0] == '-' && p[1] == '-') return 0; /* the closing delimiter */
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
            return cp_err_set(err, CP_EPARSE, "multipart: byte %zu: expected CRLF after a boundary",
                              (size_t)(p - body));
        p += 2;
        const uint8_t *he = find(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (!he)
            return cp_err_set(err, CP_EPARSE, "multipart: byte %zu: a part's headers never end",
                              (size_t)(p - body));
        if (*n >= CP_PYRO_MAX_PARTS)
            return cp_err_set(err, CP_EPARSE, "multipart: more than %d parts", CP_PYRO_MAX_PARTS);
        cp_pyro_part *pt = &parts[*n];
        memset(pt, 0, sizeof *pt);
        /* name="..." of Content-Disposition (headers are short: scanned as text) */
        for (const uint8_t *q = p; q + 6 <= he; q++)
            if (!memcmp(q, "name=\"", 6) && (q == p || q[-1] == ' ' || q[-1] == ';')) {
                const uint8_t *v = q + 6, *ve = memchr(v, '"', (size_t)(he - v));
                if (!ve || (size_t)(ve - v) >= sizeof pt->name) break;
                memcpy(pt->name, v, (size_t)(ve - v));
                break;
            }
        if (!pt->name[0])
            return cp_err_set(err, CP_EPARSE, "multipart: byte %zu: a part without a name",
                              (size_t)(p - body));
        const uint8_t *data = he + 4, *de = find(data, (size_t)(end - data), delim, dl);
        if (!de)
            return cp_err_set(err, CP_EPARSE,
                              "multipart: part '%s' has no closing boundary (truncated body?)",
                              pt->name);
        pt->data = data;
        pt->len = (size_t)(de - data);
        (*n)++;
        p = de + dl;
    }
}

/* ---- folded text -------------------------------------------------------------------- */

typedef CP_VEC(uint32_t) u32vec;

/* The location of frame s (len bytes) in p, made once per name: map[string id] = location. */
static int frame_loc(cp_profile *p, const char *s, size_t len, u32vec *map, uint32_t *out)
{
    uint32_t sid;
    if (cp_profile_intern(p, s, len, &sid)) return CP_ENOMEM;
    while (map->n <= sid)
        if (cp_vec_push(map, 0)) return CP_ENOMEM;
    if (!map->v[sid]) {
        cp_function f = {.name = sid, .system_name = sid};
        uint32_t fid, lid;
        if (cp_profile_add_function(p, &f, &fid)) return CP_ENOMEM;
        cp_line ln = {fid, 0};
        if (cp_profile_add_location(p, 0, 0, &ln, 1, &lid)) return CP_ENOMEM;
        map->v[sid] = lid;
    }
    *out = map->v[sid];
    return 0;
}

int cp_pyro_folded(const uint8_t *text, size_t len, const cp_pyro_folded_opts *o, cp_pyro_batch *b,
                   cp_err *err)
{
    const char *units = o->units && *o->units ? o->units : "samples";
    const char *agg = o->aggregation && *o->aggregation ? o->aggregation : "sum";
    int64_t hz = o->sample_rate > 0 ? o->sample_rate : 100;
    int avg = !strcmp(agg, "average");
    if (!avg && strcmp(agg, "sum"))
        return cp_err_set(err, CP_EINVAL, "aggregationType '%.32s': expected sum or average", agg);
    cp_kind kind;
    int col = 0; /* the column the count goes to; cpu's second gets count * period */
    const char *t0, *u0, *t1 = NULL, *u1 = NULL, *pt;
    if (!strcmp(units, "samples")) {
        kind = CP_KIND_CPU, t0 = "samples", u0 = "count", t1 = "cpu", u1 = "nanoseconds",
        pt = "cpu";
    } else if (!strcmp(units, "objects") || !strcmp(units, "bytes")) {
        kind = avg ? CP_KIND_INUSE : CP_KIND_ALLOC;
        t0 = avg ? "inuse_objects" : "alloc_objects", u0 = "count";
        t1 = avg ? "inuse_space" : "alloc_space", u1 = "bytes", pt = "space";
        col = units[0] == 'b';
    } else if (!strcmp(units, "goroutines")) {
        kind = CP_KIND_GOROUTINES, t0 = "goroutine", u0 = "count", pt = "goroutine";
    } else if (!strcmp(units, "lock_samples") || !strcmp(units, "lock_nanoseconds")) {
        kind = CP_KIND_MUTEX, t0 = "contentions", u0 = "count", t1 = "delay", u1 = "nanoseconds";
        pt = "contentions";
        col = units[5] == 'n';
    } else {
        return cp_err_set(err, CP_EINVAL,
                          "units '%.32s': expected samples, objects, bytes, goroutines, "
                          "lock_samples or lock_nanoseconds",
                          units);
    }
    cp_profile *p = cp_profile_create();
    u32vec map = {0};
    uint32_t *stack = malloc(CP_PYRO_MAX_DEPTH * sizeof *stack);
    int rc =
        !p || !stack || cp_profile_add_sample_type(p, t0, u0) ||
        (t1 && cp_profile_add_sample_type(p, t1, u1)) ||
        cp_profile_intern_cstr(p, pt, &p->period_type.type) ||
        cp_profile_intern_cstr(p, kind == CP_KIND_CPU ? "nanoseconds" : u0, &p->period_type.unit);
    if (rc) rc = cp_err_set(err, CP_ENOMEM, "folded profile");
    if (!rc && kind == CP_KIND_CPU) p->period = 1000000000 / hz;
    size_t lineno = 0;
    for (size_t i = 0; i < len && !rc;) {
        const uint8_t *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len, ll = e - i;
        const char *line = (const char *)text + i;
        lineno++;
        i = e + 1;
        while (ll && (line[ll - 1] == '\r' || line[ll - 1] == ' '))
            ll--;
        if (!ll) continue;
        size_t sp = ll;
        while (sp && line[sp - 1] != ' ')
            sp--;
        if (!sp || sp == ll) {
            rc = cp_err_set(err, CP_EPARSE, "folded line %zu: expected 'frame;frame;... count'",
                            lineno);
            break;
        }
        uint64_t v = 0;
        for (size_t k = sp; k < ll && !rc; k++) {
            if (line[k] < '0' || line[k] > '9' || v > (uint64_t)INT64_MAX / 10)
                rc = cp_err_set(err, CP_EPARSE, "folded line %zu: bad count '%.*s'", lineno,
                                (int)(ll - sp > 32 ? 32 : ll - sp), line + sp);
            else
                v = v * 10 + (uint64_t)(line[k] - '0');
        }
        if (rc) break;
        size_t sl = sp - 1; /* the stack, root first */
        while (sl && line[sl - 1] == ' ')
            sl--;
        uint32_t depth = 0;
        for (size_t a = 0; a <= sl && !rc;) {
            size_t fl = 0;
            while (a + fl < sl && line[a + fl] != ';')
                fl++;
            if (fl == 0) {
                rc = cp_err_set(err, CP_EPARSE, "folded line %zu: empty frame at byte %zu", lineno,
                                a);
                break;
            }
            if (depth == CP_PYRO_MAX_DEPTH) {
                rc = cp_err_set(err, CP_EPARSE, "folded line %zu: deeper than %d frames", lineno,
                                CP_PYRO_MAX_DEPTH);
                break;
            }
            if (frame_loc(p, line + a, fl, &map, &stack[depth]))
                rc = cp_err_set(err, CP_ENOMEM, "folded profile");
            depth++;
            a += fl + 1;
        }
        if (rc) break;
        /* pprof: leaf first */
        for (uint32_t a = 0, z = depth - 1; a < z; a++, z--) {
            uint32_t t = stack[a];
            stack[a] = stack[z];
            stack[z] = t;
        }
        int64_t vals[2] = {0, 0};
        vals[col] = (int64_t)v;
        if (kind == CP_KIND_CPU && v > (uint64_t)(INT64_MAX / p->period)) {
            rc = cp_err_set(err, CP_EPARSE,
                            "folded line %zu: count %llu at %lld Hz overflows the "
                            "cpu nanoseconds",
                            lineno, (unsigned long long)v, (long long)hz);
            break;
        }
        if (kind == CP_KIND_CPU) vals[1] = (int64_t)v * p->period;
        if (cp_profile_add_sample(p, stack, depth, vals, NULL, 0))
            rc = cp_err_set(err, CP_ENOMEM, "folded profile");
    }
    free(map.v);
    free(stack);
    if (!rc && !p->samples.n) rc = cp_err_set(err, CP_EPARSE, "folded: no samples in the body");
    cp_pyro_item it = {kind, 0, p, {0}};
    cp_sha256(text, len, it.src);
    if (!rc && cp_vec_push(&b->items, it)) rc = cp_err_set(err, CP_ENOMEM, "folded profile");
    if (rc) cp_profile_destroy(p);
    return rc;
}

/* ---- pprof -------------------------------------------------------------------------- */

/* One kind's sample types as found in a profile (column indexes, -1 absent). */
typedef struct group {
    cp_kind kind;
    const char *names[2]; /* the stored names of the kind's two types */
    int col[2];
    int cumulative;
} group;

static int type_is(const char *const *names, uint32_t n, const char *t)
{
    for (uint32_t i = 0; i < n; i++)
        if (names[i] && !strcmp(names[i], t)) return (int)i;
    return -1;
}

int cp_pyro_pprof(const uint8_t *buf, size_t len, const char *stc, size_t stc_len, cp_pyro_batch *b,
                  cp_err *err)
{
    cp_pprof_limits lim;
    cp_pprof_limits_default(&lim);
    cp_profile *p = NULL;
    int rc = cp_pprof_decode(buf, len, &lim, &p, err);
    if (rc) return rc;
    cp_json *cfg = NULL;
    cp_err je = {0};
    if (stc && stc_len && cp_json_parse(stc, stc_len, &cfg, &je)) {
        cp_profile_destroy(p);
        return cp_err_set(err, CP_EPARSE, "sample_type_config: %s", je.msg);
    }
    if (cfg && cfg->type != CP_JSON_OBJECT) {
        cp_json_free(cfg);
        cp_profile_destroy(p);
        return cp_err_set(err, CP_EPARSE, "sample_type_config: expected an object");
    }
    uint8_t src[CP_SHA256_LEN];
    cp_sha256(buf, len, src); /* as sent: hashing it costs a fifth of hashing it decoded */
    uint32_t nt = p->sample_types.n;
    const char *names[64] = {0};
    int cum[64] = {0};
    if (nt > 64) nt = 64;
    for (uint32_t i = 0; i < nt; i++) {
        names[i] = cp_profile_str(p, p->sample_types.v[i].type);
        const cp_json *c = cfg ? cp_json_get(cfg, names[i]) : NULL;
        if (c && c->type == CP_JSON_OBJECT) {
            const char *dn = cp_json_str(cp_json_get(c, "display-name"), NULL);
            if (dn && *dn) names[i] = dn;
            /* pyroscope-go names Go's mutex and block profiles' types so */
            static const char *const go[4][3] = {{"mutex_count", "contentions", "mutex"},
                                                 {"mutex_duration", "delay", "mutex"},
                                                 {"block_count", "contentions", "block"},
                                                 {"block_duration", "delay", "block"}};
            for (int k = 0; k < 4; k++)
                if (!strcmp(names[i], go[k][0])) {
                    names[i] = go[k][1];
                    snprintf(b->kind_hint, sizeof b->kind_hint, "%s", go[k][2]);
                }
            const cp_json *cu = cp_json_get(c, "cumulative");
            cum[i] = cu && cu->type == CP_JSON_BOOL && cu->num != 0;
        }
    }
    int used[64] = {0};
    const char *pt = cp_profile_str(p, p->period_type.type);
    int hint_block = !strcmp(b->kind_hint, "block");
    int inuse_present =
        type_is(names, nt, "inuse_objects") >= 0 || type_is(names, nt, "inuse_space") >= 0;
    int samples = type_is(names, nt, "samples");
    group g[8];
    int ng = 0;
#define GROUP(K, A, B, CA, CB)                                                                     \
    do {                                                                                           \
        int ca = (CA), cb = (CB);                                                                  \
        if (ca >= 0 || cb >= 0) g[ng++] = (group){K, {A, B}, {ca, cb}, 0};                         \
    } while (0)
    int cpu = type_is(names, nt, "cpu"), wall = type_is(names, nt, "wall");
    if (cpu >= 0 || (samples >= 0 && wall < 0 && !strcmp(pt, "cpu")))
        GROUP(CP_KIND_CPU, "samples", "cpu", samples, cpu);
    if (wall >= 0 || (samples >= 0 && cpu < 0 && !strcmp(pt, "wall")))
        GROUP(CP_KIND_WALL, "samples", "wall", samples, wall);
    GROUP(CP_KIND_ALLOC, "alloc_objects", "alloc_space", type_is(names, nt, "alloc_objects"),
          type_is(names, nt, "alloc_space"));
    GROUP(CP_KIND_INUSE, "inuse_objects", "inuse_space", type_is(names, nt, "inuse_objects"),
          type_is(names, nt, "inuse_space"));
    if (!inuse_present) /* node's heap: objects/space in use */
        GROUP(CP_KIND_INUSE, "inuse_objects", "inuse_space", type_is(names, nt, "objects"),
              type_is(names, nt, "space"));
    GROUP(hint_block ? CP_KIND_BLOCK : CP_KIND_MUTEX, "contentions", "delay",
          type_is(names, nt, "contentions"), type_is(names, nt, "delay"));
    int gor = type_is(names, nt, "goroutine");
    if (gor < 0) gor = type_is(names, nt, "goroutines");
    GROUP(CP_KIND_GOROUTINES, "goroutine", NULL, gor, -1);
#undef GROUP
    for (int k = 0; k < ng && !rc; k++) {
        group *x = &g[k];
        cp_profile *q = cp_profile_clone(p);
        const char *sel[2];
        size_t ns = 0;
        int c = 0;
        for (int j = 0; j < 2 && q && !rc; j++) {
            if (x->col[j] < 0) continue;
            used[x->col[j]] = 1;
            c |= cum[x->col[j]];
            /* the stored name (renamed where Pyroscope's differs) */
            if (cp_profile_intern_cstr(q, x->names[j], &q->sample_types.v[x->col[j]].type))
                rc = cp_err_set(err, CP_ENOMEM, "profile");
            sel[ns++] = x->names[j];
        }
        if (!q) rc = cp_err_set(err, CP_ENOMEM, "profile");
        if (!rc) rc = cp_profile_select_types(q, sel, ns, err);
        /* a Go heap profile (alloc beside inuse) counts since the process started, as
         * `contprof import` takes it; a gauge never is */
        if (x->kind == CP_KIND_ALLOC && inuse_present) c = 1;
        if (b->cumulative) c = 1;
        if (cp_kind_is_gauge(x->kind)) c = 0;
        cp_pyro_item it = {x->kind, c, q, {0}};
        memcpy(it.src, src, sizeof it.src);
        if (!rc && cp_vec_push(&b->items, it)) rc = cp_err_set(err, CP_ENOMEM, "profile");
        if (rc) cp_profile_destroy(q);
    }
    for (uint32_t i = 0; i < nt && !rc; i++) {
        if (used[i]) continue;
        char d[160];
        snprintf(d, sizeof d, "%s/%s", names[i], cp_profile_str(p, p->sample_types.v[i].unit));
        char *s = strdup(d);
        if (!s || cp_vec_push(&b->dropped, s)) {
            free(s);
            rc = cp_err_set(err, CP_ENOMEM, "profile");
        }
    }
    if (!rc && !ng) {
        char list[200] = "";
        for (uint32_t i = 0; i < b->dropped.n; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     b->dropped.v[i]);
        rc = cp_err_set(err, CP_EINVAL,
                        "no sample type makes a profile type contprof keeps (%s; expected cpu, "
                        "wall, alloc_*, inuse_*, objects/space, contentions/delay, goroutine)",
                        list[0] ? list : "none");
    }
    cp_json_free(cfg);
    cp_profile_destroy(p);
    return rc;
}

/* ---- base64 and Push ---------------------------------------------------------------- */

int cp_pyro_base64(const char *s, size_t n, cp_buf *out)
{
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i], v;
        if (c >= 'A' && c <= 'Z')
            v = c - 'A';
        else if (c >= 'a' && c <= 'z')
            v = c - 'a' + 26;
        else if (c >= '0' && c <= '9')
            v = c - '0' + 52;
        else if (c == '+' || c == '-')
            v = 62;
        else if (c == '/' || c == '_')
            v = 63;
        else if (c == '=')
            break;
        else
            return CP_EPARSE;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            uint8_t byte = (uint8_t)(acc >> bits);
            if (cp_buf_append(out, &byte, 1)) return CP_ENOMEM;
        }
    }
    return 0;
}

static void series_close(cp_pyro_push_series *s)
{
    cp_labels_close(&s->labels);
    for (uint32_t j = 0; j < s->profiles.n; j++)
        cp_buf_close(&s->profiles.v[j]);
    free(s->profiles.v);
    memset(s, 0, sizeof *s);
}

void cp_pyro_push_close(cp_pyro_pushreq *p)
{
    for (uint32_t i = 0; i < p->series.n; i++)
        series_close(&p->series.v[i]);
    free(p->series.v);
    memset(p, 0, sizeof *p);
}

/* A protobuf reader over [p, end): varints and length-delimited fields. */
typedef struct pb {
    const uint8_t *p, *end, *base;
} pb;

static int pb_varint(pb *r, uint64_t *v)
{
    *v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (r->p >= r->end) return -1;
        uint8_t c = *r->p++;
        *v |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) return 0;
    }
    return -1;
}

/* The next field: its number, and for wire type 2 its bytes; other wire types skipped
 * (*len = SIZE_MAX). -1 when malformed, 1 at the end. */
static int pb_next(pb *r, uint32_t *field, const uint8_t **data, size_t *len)
{
    if (r->p >= r->end) return 1;
    uint64_t key, v;
    if (pb_varint(r, &key) || (key >> 3) == 0 || (key >> 3) > UINT32_MAX) return -1;
    *field = (uint32_t)(key >> 3);
    *len = SIZE_MAX;
    switch (key & 7) {
    case 0:
        return pb_varint(r, &v);
    case 1:
        if (r->end - r->p < 8) return -1;
        r->p += 8;
        return 0;
    case 5:
        if (r->end - r->p < 4) return -1;
        r->p += 4;
        return 0;
    case 2:
        if (pb_varint(r, &v) || v > (uint64_t)(r->end - r->p)) return -1;
        *data = r->p;
        *len = (size_t)v;
        r->p += v;
        return 0;
    }
    return -1;
}

#define PB_BAD(r, what)                                                                            \
    cp_err_set(err, CP_EPARSE, "PushRequest: %s malformed at byte %zu", what,                      \
               (size_t)((r)->p - (r)->base))

static int push_series_pb(const uint8_t *d, size_t n, const uint8_t *base, size_t *total,
                          size_t max, cp_pyro_push_series *s, cp_err *err)
{
    pb r = {d, d + n, base};
    uint32_t f;
    const uint8_t *x;
    size_t xl;
    int st;
    while (!(st = pb_next(&r, &f, &x, &xl))) {
        if (xl == SIZE_MAX) continue;
        pb m = {x, x + xl, base};
        uint32_t g;
        const uint8_t *y;
        size_t yl;
        int mt;
        if (f == 1) { /* LabelPair{1 name, 2 value} */
            char *name = NULL, *value = NULL;
            while (!(mt = pb_next(&m, &g, &y, &yl)))
                if (yl != SIZE_MAX && (g == 1 || g == 2)) {
                    char **dst = g == 1 ? &name : &value;
                    free(*dst);
                    *dst = memchr(y, 0, yl) ? NULL : strndup((const char *)y, yl);
                    if (!*dst) mt = -1;
                    if (mt) break;
                }
            int rc = 0;
            if (mt < 0)
                rc = PB_BAD(&m, "a label");
            else if (!name)
                rc = cp_err_set(err, CP_EPARSE, "PushRequest: a label without a name");
            else if (cp_labels_set(&s->labels, name, value ? value : ""))
                rc = cp_err_set(err, CP_ENOMEM, "PushRequest");
            free(name);
            free(value);
            if (rc) return rc;
        } else if (f == 2) { /* RawSample{1 raw_profile, 2 ID} */
            cp_buf prof = {0};
            int rc = 0;
            while (!(mt = pb_next(&m, &g, &y, &yl)))
                if (g == 1 && yl != SIZE_MAX) {
                    *total += yl;
                    if (*total > max) {
                        rc =
                            cp_err_set(err, CP_ELIMIT, "PushRequest: profiles over %zu bytes", max);
                        break;
                    }
                    prof.len = 0;
                    if (cp_buf_append(&prof, y, yl)) rc = cp_err_set(err, CP_ENOMEM, "PushRequest");
                }
            if (!rc && mt < 0) rc = PB_BAD(&m, "a sample");
            if (!rc && !prof.len)
                rc = cp_err_set(err, CP_EPARSE, "PushRequest: a sample without raw_profile");
            if (!rc && cp_vec_push(&s->profiles, prof))
                rc = cp_err_set(err, CP_ENOMEM, "PushRequest");
            if (rc) {
                cp_buf_close(&prof);
                return rc;
            }
        }
    }
    return st < 0 ? PB_BAD(&r, "a series") : 0;
}

static int push_json(const uint8_t *buf, size_t len, size_t max, cp_pyro_pushreq *out, cp_err *err)
{
    cp_json *j = NULL;
    cp_err je = {0};
    if (cp_json_parse((const char *)buf, len, &j, &je))
        return cp_err_set(err, CP_EPARSE, "PushRequest JSON: %s", je.msg);
    int rc = 0;
    size_t total = 0;
    const cp_json *ser = cp_json_get(j, "series");
    if (j->type != CP_JSON_OBJECT || (ser && ser->type != CP_JSON_ARRAY))
        rc = cp_err_set(err, CP_EPARSE, "PushRequest JSON: expected {\"series\":[...]}");
    for (uint32_t i = 0; !rc && ser && i < ser->n; i++) {
        const cp_json *s = ser->items[i];
        cp_pyro_push_series ps = {0};
        const cp_json *ls = cp_json_get(s, "labels"), *ss = cp_json_get(s, "samples");
        for (uint32_t k = 0; !rc && ls && ls->type == CP_JSON_ARRAY && k < ls->n; k++) {
            const char *nm = cp_json_str(cp_json_get(ls->items[k], "name"), NULL);
            const char *vl = cp_json_str(cp_json_get(ls->items[k], "value"), "");
            if (!nm)
                rc = cp_err_set(err, CP_EPARSE, "PushRequest JSON: series %u label %u has no name",
                                i, k);
            else if (cp_labels_set(&ps.labels, nm, vl))
                rc = cp_err_set(err, CP_ENOMEM, "PushRequest");
        }
        for (uint32_t k = 0; !rc && ss && ss->type == CP_JSON_ARRAY && k < ss->n; k++) {
            const cp_json *rp = cp_json_get(ss->items[k], "rawProfile");
            if (!rp) rp = cp_json_get(ss->items[k], "raw_profile");
            const char *b64 = cp_json_str(rp, NULL);
            cp_buf prof = {0};
            if (!b64)
                rc = cp_err_set(err, CP_EPARSE,
                                "PushRequest JSON: series %u sample %u has no rawProfile", i, k);
            else if ((total += strlen(b64) / 4 * 3) > max)
                rc = cp_err_set(err, CP_ELIMIT, "PushRequest: profiles over %zu bytes", max);
            else if (cp_pyro_base64(b64, strlen(b64), &prof) || !prof.len)
                rc = cp_err_set(err, CP_EPARSE,
                                "PushRequest JSON: series %u sample %u: rawProfile is not base64",
                                i, k);
            else if (cp_vec_push(&ps.profiles, prof))
                rc = cp_err_set(err, CP_ENOMEM, "PushRequest");
            if (rc) cp_buf_close(&prof);
        }
        if (!rc && cp_vec_push(&out->series, ps)) rc = cp_err_set(err, CP_ENOMEM, "PushRequest");
        if (rc) series_close(&ps);
    }
    cp_json_free(j);
    return rc;
}

int cp_pyro_push_decode(const uint8_t *buf, size_t len, int json, size_t max, cp_pyro_pushreq *out,
                        cp_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = 0;
    if (json) {
        rc = push_json(buf, len, max, out, err);
    } else {
        pb r = {buf, buf + len, buf};
        uint32_t f;
        const uint8_t *x;
        size_t xl, total = 0;
        int st;
        while (!rc && !(st = pb_next(&r, &f, &x, &xl))) {
            if (f != 1 || xl == SIZE_MAX) continue;
            cp_pyro_push_series s = {0};
            rc = push_series_pb(x, xl, buf, &total, max, &s, err);
            if (!rc && cp_vec_push(&out->series, s)) rc = cp_err_set(err, CP_ENOMEM, "PushRequest");
            if (rc) series_close(&s);
        }
        if (!rc && st < 0) rc = PB_BAD(&r, "the request");
    }
    if (rc) cp_pyro_push_close(out);
    return rc;
}

int cp_pyro_push_labels(const cp_labels *sent, cp_pyro_batch *b, cp_err *err)
{
    for (uint32_t i = 0; i < sent->p.n; i++) {
        int rc = put_label(b, sent->p.v[i].name, sent->p.v[i].value, "labels", err);
        if (rc) return rc;
    }
    if (!cp_labels_get(&b->labels, CP_LABEL_SERVICE))
        return cp_err_set(err, CP_EINVAL, "labels: service_name is missing");
    return 0;
}

/* ---- the endpoints ------------------------------------------------------------------ */

static const char *const g_refusals[5] = {"bad_metadata", "too_large", "over_limit",
                                          "unprocessable", "unavailable"};

int cp_pyro_register_metrics(cp_pyro_stats *s, cp_metrics *m, const void *owner)
{
    int rc = cp_metrics_counter(m, owner, "contprof_pyroscope_requests_total",
                                "Pyroscope ingest and Push requests answered 200.", NULL, 0,
                                &s->requests);
    if (!rc)
        rc = cp_metrics_counter(m, owner, "contprof_pyroscope_profiles_total",
                                "Profiles from Pyroscope clients acknowledged by Kafka.", NULL, 0,
                                &s->profiles);
    for (int i = 0; i < 5 && !rc; i++)
        rc = cp_metrics_counter(m, owner, "contprof_pyroscope_refused_total",
                                "Pyroscope requests refused, by reason (nothing of them "
                                "stored).",
                                (cp_metric_label[]){{"reason", g_refusals[i]}}, 1, &s->refused[i]);
    if (!rc)
        rc = cp_metrics_counter(m, owner, "contprof_pyroscope_dropped_sample_types_total",
                                "Sample types of stored Pyroscope profiles that no contprof "
                                "profile type takes (logged with tenant and service).",
                                NULL, 0, &s->dropped_types);
    return rc;
}

void cp_pyro_count(cp_pyro_stats *s, int status)
{
    if (!s) return;
    if (status == 200)
        cp_counter_add(&s->requests, 1);
    else if (status == 413)
        cp_counter_add(&s->refused[1], 1);
    else if (status == 429)
        cp_counter_add(&s->refused[2], 1);
    else if (status == 422)
        cp_counter_add(&s->refused[3], 1);
    else if (status >= 500)
        cp_counter_add(&s->refused[4], 1);
    else if (status >= 400)
        cp_counter_add(&s->refused[0], 1);
}

/* The status of a body's refusal: 413 past a limit, 503 out of memory, else 422. */
static int body_status(int rc)
{
    return rc == CP_ELIMIT ? 413 : rc == CP_ENOMEM ? 503 : 422;
}

/* Names the window e (its series key in key) by what it is, so that a client's retry of the
 * same profile is a duplicate the store drops (`contprof import`'s scheme, ingest/README.md):
 * "pyroscope:S#W", S over the series key (its cumulative stream: a process's successive
 * cumulative profiles subtract), W over the series key, window, flag and the profile as
 * sent (src: SHA-256 of the request's bytes, not of the pprof made of them, which is 5
 * times larger and took 29% of contprofd's CPU per request). */
static int window_producer(const cp_envelope *e, const cp_buf *key, const uint8_t *src, char *out,
                           size_t cap)
{
    uint8_t hs[CP_SHA256_LEN], hw[CP_SHA256_LEN];
    cp_sha256(key->data, key->len, hs);
    cp_buf b = {0};
    if (cp_buf_printf(&b, "%.*s\n%lld %lld %d\n", (int)key->len, (const char *)key->data,
                      (long long)e->window_start_ns, (long long)e->window_duration_ns,
                      e->cumulative) ||
        cp_buf_append(&b, src, CP_SHA256_LEN)) {
        cp_buf_close(&b);
        return CP_ENOMEM;
    }
    cp_sha256(b.data, b.len, hw);
    cp_buf_close(&b);
    int n = snprintf(out, cap, "pyroscope:");
    for (int i = 0; i < 8; i++)
        n += snprintf(out + n, cap - (size_t)n, "%02x", hs[i]);
    n += snprintf(out + n, cap - (size_t)n, "#");
    for (int i = 0; i < 16; i++)
        n += snprintf(out + n, cap - (size_t)n, "%02x", hw[i]);
    return 0;
}

/* Encoded messages of a request, produced together. */
typedef struct outbox {
    CP_VEC(cp_buf) keys;
    CP_VEC(cp_buf) values;
} outbox;

static void outbox_close(outbox *o)
{
    for (uint32_t i = 0; i < o->keys.n; i++)
        cp_buf_close(&o->keys.v[i]);
    for (uint32_t i = 0; i < o->values.n; i++)
        cp_buf_close(&o->values.v[i]);
    free(o->keys.v);
    free(o->values.v);
}

/* Each item of b as an envelope of c's tenant in o. The window [start, start + dur); 0
 * start or dur: the profile's own time and duration, else now and 10 s. Returns 0, or the
 * HTTP status with err set. */
static int build(const cp_pyro_call *c, cp_pyro_batch *b, int64_t start, int64_t dur, outbox *o,
                 cp_err *err)
{
    for (uint32_t i = 0; i < b->items.n; i++) {
        cp_pyro_item *it = &b->items.v[i];
        cp_envelope e = {0};
        cp_buf pp = {0}, enc = {0}, key = {0};
        char producer[128];
        int rc = 0, st = 0;
        e.tenant = (char *)c->tenant;
        e.labels = b->labels; /* borrowed */
        e.kind = it->kind;
        e.window_start_ns = start ? start : it->p->time_nanos ? it->p->time_nanos : cp_now_ns();
        e.window_duration_ns = dur > 0                     ? dur
                               : it->p->duration_nanos > 0 ? it->p->duration_nanos
                                                           : 10000000000LL;
        e.cumulative = it->cumulative;
        it->p->time_nanos = e.window_start_ns;
        it->p->duration_nanos = e.window_duration_ns;
        rc = cp_pprof_encode(it->p, 0, &pp);
        if (!rc && pp.len > CP_RAW_PPROF_MAX) {
            pp.len = 0;
            rc = cp_pprof_encode(it->p, 1, &pp);
        }
        e.pprof = pp.data;
        e.pprof_len = pp.len;
        if (!rc) rc = cp_envelope_series_key(&e, &key);
        if (!rc) rc = window_producer(&e, &key, it->src, producer, sizeof producer);
        e.producer_id = producer;
        e.sequence = 1;
        if (!rc) rc = cp_envelope_encode(&e, &enc);
        if (rc) {
            st = rc == CP_EINVAL ? 400 : 503;
            cp_err_set(err, rc, "%s profile: %s", cp_kind_name(it->kind),
                       rc == CP_EINVAL ? "too many labels" : "out of memory");
        } else {
            /* ingest's own checks, so that nothing it would refuse is acknowledged */
            cp_envelope v = e, back = {0};
            v.format_major = CP_ENVELOPE_MAJOR;
            v.format_minor = CP_ENVELOPE_MINOR;
            if ((rc = cp_envelope_validate(&v, CP_INGEST_MAX_PPROF, err)) ||
                (rc = cp_envelope_decode_view(enc.data, enc.len, CP_INGEST_MAX_PPROF, &back, err)))
                st = rc == CP_ELIMIT ? 413 : 400;
            cp_envelope_close(&back);
        }
        if (!st && c->token && *c->token && cp_envelope_sign(&enc, c->token)) {
            st = 503;
            cp_err_set(err, CP_ENOMEM, "out of memory");
        }
        if (!st && (cp_vec_push(&o->keys, key) || (key = (cp_buf){0}, 0) ||
                    cp_vec_push(&o->values, enc) || (enc = (cp_buf){0}, 0))) {
            st = 503;
            cp_err_set(err, CP_ENOMEM, "out of memory");
        }
        cp_buf_close(&pp);
        cp_buf_close(&enc);
        cp_buf_close(&key);
        if (st) return st;
    }
    return 0;
}

/* Builds and produces b's items; logs and counts dropped sample types. 0 with *n the
 * envelopes acknowledged, or the HTTP status with err set. */
static int send_batch(const cp_pyro_call *c, cp_pyro_batch *b, int64_t start, int64_t dur,
                      uint32_t *n, cp_err *err)
{
    outbox o = {0};
    int st = build(c, b, start, dur, &o, err);
    cp_pyro_message *m = st ? NULL : calloc(o.keys.n ? o.keys.n : 1, sizeof *m);
    if (!st && !m) {
        st = 503;
        cp_err_set(err, CP_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; !st && i < o.keys.n; i++)
        m[i] = (cp_pyro_message){o.keys.v[i].data, o.values.v[i].data, o.keys.v[i].len,
                                 o.values.v[i].len};
    if (!st && o.keys.n) {
        int rc = c->produce ? c->produce(c->produce_arg, m, o.keys.n, err)
                            : cp_err_set(err, CP_EKAFKA, "this server has no Kafka producer");
        if (rc) st = rc == CP_ELIMIT ? 413 : 503;
    }
    if (!st) {
        *n = o.keys.n;
        if (c->stats) cp_counter_add(&c->stats->profiles, o.keys.n);
        if (b->dropped.n) {
            if (c->stats) cp_counter_add(&c->stats->dropped_types, b->dropped.n);
            for (uint32_t i = 0; i < b->dropped.n; i++)
                cp_log_warn("pyroscope: tenant %s service %s: sample type %s dropped (no contprof "
                            "profile type takes it)",
                            c->tenant, cp_labels_get(&b->labels, CP_LABEL_SERVICE),
                            b->dropped.v[i]);
        }
    }
    free(m);
    outbox_close(&o);
    return st;
}

static const char *const g_ingest_params[] = {
    "name", "from", "until", "format", "sampleRate", "spyName", "units", "aggregationType", NULL};

void cp_pyro_ingest(const cp_pyro_call *c, const cp_http_request *req, cp_http_response *r)
{
    cp_params pa = {0};
    cp_pyro_batch b = {0};
    cp_err err = {0};
    int st = 0;
    int64_t from = 0, until = 0, now = cp_now_ns();
    if (cp_params_parse(req->query, &pa, &err) || cp_params_check(&pa, g_ingest_params, &err) ||
        cp_pyro_parse_name(cp_params_get(&pa, "name"), &b, &err))
        st = err.code == CP_ENOMEM ? 503 : 400;
    const char *spy = cp_params_get(&pa, "spyName");
    if (!st && spy && *spy && put_label(&b, "pyroscope_spy", spy, "spyName", &err)) st = 400;
    cp_err te = {0};
    if (!st && (cp_pyro_parse_time(cp_params_get(&pa, "from"), now, &from, &te) ||
                cp_pyro_parse_time(cp_params_get(&pa, "until"), now, &until, &te))) {
        st = 400;
        cp_err_set(&err, CP_EINVAL, "from/until: %s", te.msg);
    }
    if (!st && until < from) {
        st = 400;
        cp_err_set(&err, CP_EINVAL, "until (%lld ns) is before from (%lld ns)", (long long)until,
                   (long long)from);
    }
    const char *fmt = cp_params_get(&pa, "format");
    const char *sr = cp_params_get(&pa, "sampleRate");
    int64_t rate = 0;
    if (!st && sr && *sr) {
        char *end;
        long long v = strtoll(sr, &end, 10);
        if (*end || v <= 0 || v > 1000000) {
            st = 400;
            cp_err_set(&err, CP_EINVAL, "sampleRate '%.32s': expected 1..1000000 (Hz)", sr);
        }
        rate = v;
    }
    if (!st && (!req->body_len)) {
        st = 422;
        cp_err_set(&err, CP_EPARSE, "empty body: send the profile as the request body");
    }
    if (!st && (!fmt || !*fmt || !strcmp(fmt, "lines") || !strcmp(fmt, "folded"))) {
        cp_pyro_folded_opts fo = {cp_params_get(&pa, "units"),
                                  cp_params_get(&pa, "aggregationType"), rate};
        int rc = cp_pyro_folded(req->body, req->body_len, &fo, &b, &err);
        if (rc) st = rc == CP_EINVAL ? 400 : body_status(rc);
    } else if (!st && !strcmp(fmt, "pprof")) {
        const uint8_t *prof = req->body, *stc = NULL;
        size_t plen = req->body_len, slen = 0;
        if (!strncasecmp(req->content_type, "multipart/form-data", 19)) {
            cp_pyro_part parts[CP_PYRO_MAX_PARTS];
            int np = 0, rc = cp_pyro_multipart(req->content_type, req->body, req->body_len, parts,
                                               &np, &err);
            prof = NULL;
            for (int i = 0; !rc && i < np; i++) {
                if (!strcmp(parts[i].name, "profile")) prof = parts[i].data, plen = parts[i].len;
                if (!strcmp(parts[i].name, "sample_type_config"))
                    stc = parts[i].data, slen = parts[i].len;
                if (!strcmp(parts[i].name, "prev_profile"))
                    rc = cp_err_set(&err, CP_EPARSE,
                                    "multipart: prev_profile is not taken (send delta profiles)");
            }
            if (!rc && !prof) rc = cp_err_set(&err, CP_EPARSE, "multipart: no part named profile");
            if (rc) st = body_status(rc);
        }
        if (!st) {
            int rc = cp_pyro_pprof(prof, plen, (const char *)stc, slen, &b, &err);
            if (rc) st = body_status(rc);
        }
    } else if (!st) {
        st = 422;
        cp_err_set(&err, CP_EINVAL, "format '%.32s' is not taken (expected pprof, lines or folded)",
                   fmt);
    }
    uint32_t n = 0;
    if (!st) st = send_batch(c, &b, from, until - from, &n, &err);
    if (st) {
        cp_http_error(r, st, "%s", err.msg);
    } else if (cp_buf_printf(&r->body, "{\"profiles\":%u}\n", n)) {
        cp_buf_close(&r->body);
        st = 503;
        cp_http_error(r, st, "out of memory");
    }
    cp_pyro_count(c->stats, st ? st : 200);
    cp_pyro_batch_close(&b);
    cp_params_close(&pa);
}

/* A Connect error: the HTTP status Connect maps its code to, {"code","message"}. */
static void connect_error(cp_http_response *r, int st, const char *msg)
{
    const char *code = st == 400                ? "invalid_argument"
                       : st == 401              ? "unauthenticated"
                       : st == 403              ? "permission_denied"
                       : st == 413 || st == 429 ? "resource_exhausted"
                       : st == 422              ? "invalid_argument"
                                                : "unavailable";
    int hs = st == 413 || st == 429 ? 429 : st == 422 ? 400 : st;
    cp_pyro_connect_error(r, hs, code, msg);
}

void cp_pyro_connect_error(cp_http_response *r, int status, const char *code, const char *msg)
{
    cp_buf_close(&r->body);
    r->status = status;
    snprintf(r->content_type, sizeof r->content_type, "application/json");
    size_t n = strlen(msg);
    if (cp_buf_printf(&r->body, "{\"error\":\"") || cp_json_escape(&r->body, msg, n) ||
        cp_buf_printf(&r->body, "\",\"code\":\"%s\",\"message\":\"", code) ||
        cp_json_escape(&r->body, msg, n) || cp_buf_printf(&r->body, "\"}\n"))
        cp_buf_close(&r->body);
}

void cp_pyro_push(const cp_pyro_call *c, const cp_http_request *req, cp_http_response *r)
{
    cp_err err = {0};
    int st = 0;
    const char *ct = req->content_type;
    int json = !strncasecmp(ct, "application/json", 16);
    if (!json && strncasecmp(ct, "application/proto", 17)) {
        cp_err_set(&err, CP_EINVAL,
                   "Content-Type '%.64s': expected application/proto or application/json", ct);
        connect_error(r, 415, err.msg);
        r->status = 415;
        cp_pyro_count(c->stats, 400);
        return;
    }
    const uint8_t *body = req->body;
    size_t len = req->body_len;
    cp_buf gz = {0};
    if (!strcasecmp(req->content_encoding, "gzip") || cp_is_gzip(body, len)) {
        int rc = cp_gunzip(body, len, CP_PYRO_MAX_PPROF, &gz, &err);
        if (rc) st = body_status(rc == CP_EGZIP ? CP_EPARSE : rc);
        body = gz.data;
        len = gz.len;
    } else if (req->content_encoding[0] && strcasecmp(req->content_encoding, "identity")) {
        st = 400;
        cp_err_set(&err, CP_EINVAL, "Content-Encoding '%.32s': expected gzip or identity",
                   req->content_encoding);
    }
    cp_pyro_pushreq pr = {0};
    if (!st) {
        int rc = cp_pyro_push_decode(body, len, json, CP_PYRO_MAX_PPROF, &pr, &err);
        if (rc) st = body_status(rc);
    }
    /* every series is read and built before anything is produced: a bad one refuses all */
    cp_pyro_batch *bs = st ? NULL : calloc(pr.series.n ? pr.series.n : 1, sizeof *bs);
    if (!st && !bs) {
        st = 503;
        cp_err_set(&err, CP_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; !st && i < pr.series.n; i++) {
        int rc = cp_pyro_push_labels(&pr.series.v[i].labels, &bs[i], &err);
        if (rc) st = rc == CP_ENOMEM ? 503 : 400;
        for (uint32_t j = 0; !st && j < pr.series.v[i].profiles.n; j++) {
            cp_buf *pb = &pr.series.v[i].profiles.v[j];
            rc = cp_pyro_pprof(pb->data, pb->len, NULL, 0, &bs[i], &err);
            if (rc) st = body_status(rc);
        }
    }
    for (uint32_t i = 0; !st && i < pr.series.n; i++) {
        uint32_t n = 0;
        st = send_batch(c, &bs[i], 0, 0, &n, &err);
    }
    if (st) {
        connect_error(r, st, err.msg);
    } else if (json) {
        if (cp_buf_printf(&r->body, "{}")) st = 503;
    } else {
        snprintf(r->content_type, sizeof r->content_type, "application/proto");
    }
    cp_pyro_count(c->stats, st ? st : 200);
    for (uint32_t i = 0; bs && i < pr.series.n; i++)
        cp_pyro_batch_close(&bs[i]);
    free(bs);
    cp_pyro_push_close(&pr);
    cp_buf_close(&gz);
}
