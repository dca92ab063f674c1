/* Server-side symbolization in process: the ELF reader and table against this very test
 * binary (functions, lines, inlined calls at addresses taken at run time), every kind of bad
 * file, and the upload endpoint over real HTTP with a real store: profiles stored before the
 * upload get named, per tenant only, in every format. */
#include <gelf.h>
#include <libelf.h>
#include <dlfcn.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <pthread.h>
#include <sys/stat.h>

#include "elfsym.h"
#include "fixture.h"
#include "pprof.h"
#include "symbols.h"
#include "symtab.h"

#define SEC 1000000000LL

static const char *bindir(void)
{
    const char *b = getenv("CP_BINARY_DIR");
    return b ? b : "build";
}

static cp_buf read_all(const char *path)
{
    cp_buf b = {0};
    if (cp_read_file(path, &b, NULL)) fprintf(stderr, "cannot read %s\n", path);
    CHECK(b.len > 0);
    return b;
}

/* The file offset of a code address of this process, as the agent computes it from
 * /proc/self/maps: address - mapping start + mapping offset. */
static uint64_t self_file_offset(uintptr_t addr)
{
    FILE *f = fopen("/proc/self/maps", "r");
    CHECK(f);
    char line[1024];
    uint64_t off = UINT64_MAX;
    while (fgets(line, sizeof line, f)) {
        unsigned long long lo, hi, o;
        if (sscanf(line, "%llx-%llx %*s %llx", &lo, &hi, &o) != 3) continue;
        if (addr >= lo && addr < hi) off = addr - lo + o;
    }
    fclose(f);
    CHECK(off != UINT64_MAX);
    return off;
}

/* ---- code whose addresses the tests take ----------------------------------------------- */

static uintptr_t g_ret;
static int g_inner_line, g_outer_line;

__attribute__((noinline)) static void capture(int line)
{
    g_ret = (uintptr_t)__builtin_return_address(0);
    g_inner_line = line;
    __asm__ volatile("" ::: "memory");
}

static inline __attribute__((always_inline)) void inlined_helper(int outer_line)
{
    g_outer_line = outer_line;
    capture(__LINE__);
}

__attribute__((noinline)) void symtab_test_outer(void)
{
    inlined_helper(__LINE__);
    __asm__ volatile("" ::: "memory");
}

static const char *base(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* ---- the table --------------------------------------------------------------------------- */

TEST(table_names_functions_lines_and_inlined_calls_of_this_binary)
{
    cp_buf exe = read_all("/proc/self/exe");
    cp_buf tab = {0};
    char id[CP_BUILD_ID_HEX_MAX + 1];
    cp_err err = {0};
    int rc = cp_symtab_build(exe.data, exe.len, 64u << 20, &tab, id, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    CHECK_EQ(rc, 0);
    CHECK(strlen(id) >= 16);
    cp_symtab t;
    CHECK_EQ(cp_symtab_open(&t, tab.data, tab.len, &err), 0);

    /* a function entry */
    cp_symframe fr[CP_SYMTAB_MAX_FRAMES];
    uint32_t n = cp_symtab_lookup(&t, self_file_offset((uintptr_t)&symtab_test_outer), fr,
                                  CP_SYMTAB_MAX_FRAMES);
    CHECK(n >= 1);
    CHECK_STREQ(fr[n - 1].name, "symtab_test_outer");
    CHECK_STREQ(base(fr[n - 1].file), "symtab_test.c");

    /* a call inside an inlined function: the inlined frame first, then its caller, each at
     * the line of its call */
    symtab_test_outer();
    n = cp_symtab_lookup(&t, self_file_offset(g_ret - 1), fr, CP_SYMTAB_MAX_FRAMES);
    for (uint32_t i = 0; i < n; i++)
        fprintf(stderr, "frame %u: %s %s:%lld\n", i, fr[i].name, fr[i].file, (long long)fr[i].line);
    CHECK_EQ(n, 2);
    CHECK_STREQ(fr[0].name, "inlined_helper");
    CHECK_EQ(fr[0].line, g_inner_line);
    CHECK_STREQ(base(fr[0].file), "symtab_test.c");
    CHECK_STREQ(fr[1].name, "symtab_test_outer");
    CHECK_EQ(fr[1].line, g_outer_line);

    /* outside every segment: nothing */
    CHECK_EQ(cp_symtab_lookup(&t, (uint64_t)exe.len * 16, fr, CP_SYMTAB_MAX_FRAMES), 0);

    /* a damaged table is refused, not read */
    tab.data[tab.len / 2] ^= 0xff; /* a value in the middle may be fine; the size is not */
    CHECK(cp_symtab_open(&t, tab.data, tab.len - 1, &err) == CP_ESTORE);
    cp_buf_close(&tab);
    cp_buf_close(&exe);
}

/* Sets the type of the build ID note of an ELF image to something else. */
static void drop_build_id(cp_buf *e)
{
    const uint8_t *p = e->data;
    Elf64_Ehdr eh;
    memcpy(&eh, p, sizeof eh);
    int done = 0;
    for (int i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh;
        memcpy(&sh, p + eh.e_shoff + (size_t)i * sizeof sh, sizeof sh);
        if (sh.sh_type != SHT_NOTE) continue;
        for (size_t o = sh.sh_offset; o + 12 <= sh.sh_offset + sh.sh_size;) {
            uint32_t nsz, dsz, ty;
            memcpy(&nsz, p + o, 4);
            memcpy(&dsz, p + o + 4, 4);
            memcpy(&ty, p + o + 8, 4);
            if (ty == NT_GNU_BUILD_ID) {
                uint32_t other = 0x99;
                memcpy(e->data + o + 8, &other, 4);
                done = 1;
            }
            o += 12 + ((nsz + 3) & ~3u) + ((dsz + 3) & ~3u);
        }
    }
    CHECK(done);
}

static void expect_bad(const uint8_t *d, size_t len, size_t max_table, int code, const char *needle)
{
    cp_buf tab = {0};
    char id[CP_BUILD_ID_HEX_MAX + 1];
    cp_err err = {0};
    int rc = cp_symtab_build(d, len, max_table, &tab, id, &err);
    fprintf(stderr, "%zu bytes -> %d: %s\n", len, rc, err.msg);
    CHECK_EQ(rc, code);
    CHECK_CONTAINS(err.msg, needle);
    CHECK_EQ(tab.len, 0);
    cp_buf_close(&tab);
}

TEST(bad_files_are_refused_naming_the_problem)
{
    char path[600];
    snprintf(path, sizeof path, "%s/tests/symbols/symprog", bindir());
    cp_buf e = read_all(path);
    static const char text[] = "#!/bin/sh\necho not an object\n";
    expect_bad((const uint8_t *)text, sizeof text - 1, 1 << 20, CP_EPARSE, "not an ELF file");
    expect_bad(e.data, 40, 1 << 20, CP_EPARSE, "truncated ELF");
    expect_bad(e.data, e.len / 2, 1 << 20, CP_EPARSE, "truncated ELF");
    expect_bad(e.data, 0, 1 << 20, CP_EPARSE, "not an ELF file");
    expect_bad(e.data, e.len, 200, CP_ELIMIT, "symbols.max_table_bytes");
    snprintf(path, sizeof path, "%s/tests/symbols/symprog-stripped", bindir());
    cp_buf s = read_all(path);
    expect_bad(s.data, s.len, 1 << 20, CP_EPARSE, "no function symbols");
    drop_build_id(&e);
    expect_bad(e.data, e.len, 1 << 20, CP_EPARSE, "no GNU build ID");
    cp_buf_close(&e);
    cp_buf_close(&s);
}

/* ---- upload and naming over HTTP --------------------------------------------------------- */

/* A CPU window with one two-frame stack in symprog, unsymbolized (as
 * CONTPROF_SYMBOLIZE=server sends it): mapped at start, the leaf 3 bytes into the function
 * at file offset leaf_off, its caller 1 byte into the one at caller_off. */
static cp_profile *server_window(const char *build_id, uint64_t start, uint64_t leaf_off,
                                 uint64_t caller_off)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK(cp_store_kind_types(CP_KIND_CPU, p) == 0);
    p->period = 10000000;
    cp_mapping m = {.start = start, .limit = start + 0x10000, .offset = 0};
    CHECK(cp_profile_intern_cstr(p, "/opt/app/symprog", &m.filename) == 0);
    CHECK(cp_profile_intern_cstr(p, build_id, &m.build_id) == 0);
    uint32_t mid, l1, l2;
    CHECK(cp_profile_add_mapping(p, &m, &mid) == 0);
    CHECK(cp_profile_add_location(p, start + leaf_off + 3, mid, NULL, 0, &l1) == 0);
    CHECK(cp_profile_add_location(p, start + caller_off + 1, mid, NULL, 0, &l2) == 0);
    uint32_t stack[2] = {l1, l2};
    int64_t v[2] = {7, 70000000};
    CHECK(cp_profile_add_sample(p, stack, 2, v, NULL, 0) == 0);
    return p;
}

static cp_http_result post(qfx *f, const char *pq, const char *token, const void *b, size_t n)
{
    cp_http_result r;
    cp_err err = {0};
    int rc = cp_http_post(f->url, pq, token, b, n, 60000, 0, &r, &err);
    if (rc) fprintf(stderr, "POST %s: %s\n", pq, err.msg);
    CHECK(rc == 0);
    cp_buf_append(&r.body, "", 1);
    r.body.len--;
    fprintf(stderr, "POST %s -> %d %s", pq, r.status, (char *)r.body.data);
    return r;
}

static void expect_post(qfx *f, const char *token, const void *b, size_t n, int status,
                        const char *needle)
{
    cp_http_result r = post(f, "/api/v1/symbols", token, b, n);
    CHECK_EQ(r.status, status);
    CHECK_CONTAINS((char *)r.body.data, needle);
    cp_buf_close(&r.body);
}

static char *get_text(qfx *f, const char *pq, const char *token)
{
    cp_http_result r = qfx_get(f, pq, token);
    if (r.status != 200) fprintf(stderr, "GET %s: %d %s\n", pq, r.status, (char *)r.body.data);
    CHECK_EQ(r.status, 200);
    return (char *)r.body.data;
}

/* Stores wa as tenant a's window and wb as b's (labels, start t0) and destroys both. */
static void store_for_a_and_b(qfx *f, const char *labels, int64_t t0, cp_profile *wa,
                              cp_profile *wb)
{
    qfx_add(f, "a", CP_KIND_CPU, labels, t0, wa);
    qfx_add(f, "b", CP_KIND_CPU, labels, t0, wb);
    qfx_commit(f);
    cp_profile_destroy(wa);
    cp_profile_destroy(wb);
}

/* Serves f's store with symbols sy for tenants a and b (tokens token-of-a, token-of-b);
 * reg: the registry /metrics prints (NULL: the fixture's own). */
static void serve_tenants_a_b(qfx *f, cp_symbols *sy, cp_metrics *reg)
{
    static const cp_api_token toks[2] = {{"token-of-a", "a"}, {"token-of-b", "b"}};
    cp_api_options ao;
    cp_api_options_default(&ao);
    ao.tokens = toks;
    ao.ntokens = 2;
    ao.symbols = sy;
    ao.metrics = reg;
    qfx_serve(f, &ao, 2);
}

/* Uploads the server refuses (4xx naming the problem, nothing stored): not an ELF file,
 * truncated, empty, stripped, without a build ID, without a token, for another tenant, over
 * the upload limit (from the headers), and a GET. */
static void expect_bad_uploads(qfx *fp, const cp_buf *elfp, const char *stripped)
{
    cp_err err = {0};
    static const char text[] = "hello, not an ELF";
    expect_post(fp, "token-of-a", text, sizeof text - 1, 400, "not an ELF file");
    expect_post(fp, "token-of-a", elfp->data, elfp->len / 3, 400, "truncated ELF");
    expect_post(fp, "token-of-a", "", 0, 400, "empty body");
    cp_buf s = read_all(stripped);
    expect_post(fp, "token-of-a", s.data, s.len, 400, "no function symbols");
    cp_buf_close(&s);
    cp_buf nobid = {0};
    CHECK(cp_buf_append(&nobid, elfp->data, elfp->len) == 0);
    drop_build_id(&nobid);
    expect_post(fp, "token-of-a", nobid.data, nobid.len, 400, "no GNU build ID");
    cp_buf_close(&nobid);
    expect_post(fp, NULL, elfp->data, elfp->len, 401, "Bearer");
    cp_http_result r = post(fp, "/api/v1/symbols?tenant=b", "token-of-a", elfp->data, elfp->len);
    CHECK_EQ(r.status, 403);
    cp_buf_close(&r.body);
    /* over the upload limit: refused from the headers, before the body is read */
    char raw[256];
    int rl = snprintf(raw, sizeof raw,
                      "POST /api/v1/symbols HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      "token-of-a\r\nContent-Length: %llu\r\n\r\n",
                      (unsigned long long)(65u << 20));
    CHECK(cp_http_raw("127.0.0.1", fp->port, raw, (size_t)rl, 30000, &r, &err) == 0);
    cp_buf_append(&r.body, "", 1);
    CHECK_EQ(r.status, 413);
    CHECK_CONTAINS((char *)r.body.data, "symbols.max_upload_bytes");
    cp_buf_close(&r.body);
    r = qfx_get(fp, "/api/v1/symbols", "token-of-a");
    CHECK_EQ(r.status, 405);
    cp_buf_close(&r.body);
}

/* A's window, stored before the upload (from t0 on), named in every format: top, folded,
 * the JSON tree and diff, pprof (the location carries the function and its line) and go
 * tool pprof reading that. */
static void expect_named_in_every_format(qfx *fp, int64_t t0)
{
    cp_err err = {0};
    cp_http_result r;
    char pq[256];
    snprintf(pq, sizeof pq, "/api/v1/profile?format=top&from=%lld&to=now",
             (long long)(t0 / SEC - 1));
    char *top = get_text(fp, pq, "token-of-a");
    CHECK_CONTAINS(top, "symprog_hash_spin");
    CHECK_CONTAINS(top, "main");
    free(top);
    snprintf(pq, sizeof pq, "/api/v1/profile?format=folded&from=%lld&to=now",
             (long long)(t0 / SEC - 1));
    char *folded = get_text(fp, pq, "token-of-a");
    CHECK_CONTAINS(folded, "main;symprog_hash_spin 70000000");
    free(folded);
    snprintf(pq, sizeof pq, "/api/v1/profile?format=json&from=%lld&to=now",
             (long long)(t0 / SEC - 1));
    char *json = get_text(fp, pq, "token-of-a");
    CHECK_CONTAINS(json, "\"name\":\"symprog_hash_spin\"");
    free(json);
    snprintf(pq, sizeof pq, "/api/v1/diff?format=json&from=%lld&to=now", (long long)(t0 / SEC - 1));
    json = get_text(fp, pq, "token-of-a");
    CHECK_CONTAINS(json, "\"name\":\"symprog_hash_spin\"");
    free(json);
    /* pprof: the location carries the function and its line */
    snprintf(pq, sizeof pq, "/api/v1/profile?format=pprof&from=%lld&to=now",
             (long long)(t0 / SEC - 1));
    r = qfx_get(fp, pq, "token-of-a");
    CHECK_EQ(r.status, 200);
    cp_profile *p = NULL;
    CHECK(cp_pprof_decode(r.body.data, r.body.len, NULL, &p, &err) == 0);
    int found = 0;
    for (uint32_t i = 0; i < p->locations.n; i++) {
        const cp_location *l = &p->locations.v[i];
        for (uint32_t k = 0; k < l->nlines; k++) {
            const cp_line *ln = &p->lines.v[l->line_off + k];
            const cp_function *fn = &p->functions.v[ln->function_id - 1];
            if (strcmp(cp_profile_str(p, fn->name), "symprog_hash_spin") == 0 && ln->line > 0 &&
                strstr(cp_profile_str(p, fn->filename), "symprog.c"))
                found = 1;
        }
    }
    CHECK(found);
    cp_profile_destroy(p);
    /* and go tool pprof reads it */
    char tmp[] = "/tmp/cpsym-XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0);
    CHECK(write(fd, r.body.data, r.body.len) == (ssize_t)r.body.len);
    close(fd);
    cp_buf_close(&r.body);
    char cmd[300], out[8192];
    snprintf(cmd, sizeof cmd, "go tool pprof -top %s 2>&1", tmp);
    FILE *pp = popen(cmd, "r");
    CHECK(pp);
    size_t n = fread(out, 1, sizeof out - 1, pp);
    out[n] = 0;
    int prc = pclose(pp);
    fprintf(stderr, "%s\n", out);
    CHECK_EQ(prc, 0);
    CHECK_CONTAINS(out, "symprog_hash_spin");
    unlink(tmp);
}

TEST(uploaded_symbols_name_stored_profiles_of_their_tenant_only)
{
    char prog[600], stripped[600];
    snprintf(prog, sizeof prog, "%s/tests/symbols/symprog", bindir());
    snprintf(stripped, sizeof stripped, "%s/tests/symbols/symprog-stripped", bindir());
    cp_buf elf = read_all(prog);
    cp_buf tab = {0};
    char id[CP_BUILD_ID_HEX_MAX + 1];
    cp_err err = {0};
    CHECK_EQ(cp_symtab_build(elf.data, elf.len, 1 << 20, &tab, id, &err), 0);
    cp_buf_close(&tab);
    uint64_t off = elf_symbol_offset(prog, "symprog_hash_spin");
    uint64_t moff = elf_symbol_offset(prog, "main");

    qfx f = {0};
    qfx_open_store(&f, NULL);
    /* windows of both tenants, stored before any upload, at two different load addresses */
    int64_t t0 = (time(NULL) - 600) * SEC;
    cp_profile *wa = server_window(id, 0x555500000000, off, moff);
    cp_profile *wb = server_window(id, 0x7f0000000000, off, moff);
    store_for_a_and_b(&f, "service=sp", t0, wa, wb);

    cp_symbols_options so;
    cp_symbols_options_default(&so);
    so.store = f.store;
    so.dirs = ""; /* only uploads here */
    cp_symbols *sy = cp_symbols_create(&so);
    CHECK(sy);
    cp_metrics *reg; /* as contprofd: the symbols' counters registered, /metrics prints them */
    CHECK_EQ(cp_metrics_create(&reg), 0);
    CHECK_EQ(cp_symbols_register_metrics(sy, reg), 0);
    serve_tenants_a_b(&f, sy, reg);

    char pq[256];
    snprintf(pq, sizeof pq, "/api/v1/profile?format=top&from=%lld&to=now",
             (long long)(t0 / SEC - 1));
    char *top = get_text(&f, pq, "token-of-a");
    CHECK(!strstr(top, "symprog_hash_spin"));
    free(top);

    expect_bad_uploads(&f, &elf, stripped);
    top = get_text(&f, pq, "token-of-a");
    CHECK(!strstr(top, "symprog_hash_spin"));
    free(top);

    /* the upload, as tenant a (the optional tenant check passes) */
    cp_http_result r = post(&f, "/api/v1/symbols?tenant=a", "token-of-a", elf.data, elf.len);
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS((char *)r.body.data, id);
    cp_buf_close(&r.body);

    expect_named_in_every_format(&f, t0);

    /* the counters */
    char *metrics = get_text(&f, "/metrics", "token-of-a");
    CHECK_CONTAINS(metrics, "contprof_symbols_uploads_total 1\n");
    CHECK_CONTAINS(metrics, "contprof_symbols_uploads_refused_total 4\n");
    CHECK(!strstr(metrics, "contprof_symbols_locations_named_total 0\n"));
    free(metrics);

    /* tenant b's identical window is not named by a's upload */
    snprintf(pq, sizeof pq, "/api/v1/profile?format=top&from=%lld&to=now",
             (long long)(t0 / SEC - 1));
    top = get_text(&f, pq, "token-of-b");
    CHECK(!strstr(top, "symprog_hash_spin"));
    free(top);
    /* until b uploads its own */
    r = post(&f, "/api/v1/symbols", "token-of-b", elf.data, elf.len);
    CHECK_EQ(r.status, 200);
    cp_buf_close(&r.body);
    top = get_text(&f, pq, "token-of-b");
    CHECK_CONTAINS(top, "symprog_hash_spin");
    free(top);

    qfx_close(&f, 0);
    cp_symbols_destroy(sy);
    cp_metrics_destroy(reg);
    /* the tables outlive the process: a reopened store names a's window again */
    qfx g = {0};
    qfx_open_store(&g, f.dir);
    so.store = g.store;
    sy = cp_symbols_create(&so);
    CHECK(sy);
    serve_tenants_a_b(&g, sy, NULL); /* reg is gone: the fixture's own registry */
    top = get_text(&g, pq, "token-of-a");
    CHECK_CONTAINS(top, "symprog_hash_spin");
    free(top);
    qfx_close(&g, 1);
    cp_symbols_destroy(sy);
    cp_buf_close(&elf);
}

/* ---- source maps ------------------------------------------------------------------------ */

/* A map of a one-line minified script: `function u(...` with u renamed from tsMain (the
 * segment at column 9 names it), the function at column 10 (V8's position) from line 15 of
 * src/worker.ts. */
static const char g_map[] = "{\"version\":3,\"sources\":[\"src/worker.ts\"],\"names\":[\"tsMain\"],"
                            "\"mappings\":\"AAAA,SAAAA,CAcA\"}";

/* A CPU window with one V8 frame as the V8 source stores it (collector/v8/v8conv.c):
 * function u of url at 1-based line 1, column 11, its system_name "u URL:1:11". */
static cp_profile *v8_window(const char *url)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK(cp_store_kind_types(CP_KIND_CPU, p) == 0);
    p->period = 10000000;
    char sys[256];
    snprintf(sys, sizeof sys, "u %s:1:11", url);
    cp_function fn = {.start_line = 1};
    uint32_t fid, lid;
    CHECK(cp_profile_intern_cstr(p, "u", &fn.name) == 0);
    CHECK(cp_profile_intern_cstr(p, sys, &fn.system_name) == 0);
    CHECK(cp_profile_intern_cstr(p, url, &fn.filename) == 0);
    CHECK(cp_profile_add_function(p, &fn, &fid) == 0);
    cp_line ln = {.function_id = fid, .line = 1};
    CHECK(cp_profile_add_location(p, 0, 0, &ln, 1, &lid) == 0);
    int64_t v[2] = {3, 30000000};
    CHECK(cp_profile_add_sample(p, &lid, 1, v, NULL, 0) == 0);
    return p;
}

TEST(source_maps_name_stored_v8_frames_of_their_tenant_only)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    int64_t t0 = (time(NULL) - 600) * SEC;
    cp_profile *wa = v8_window("file:///srv/app/worker.js?v=3");
    cp_profile *wb = v8_window("file:///srv/app/worker.js?v=3");
    store_for_a_and_b(&f, "service=js", t0, wa, wb);
    cp_symbols_options so;
    cp_symbols_options_default(&so);
    so.store = f.store;
    so.dirs = "";
    so.max_table_bytes = 1 << 20;
    cp_symbols *sy = cp_symbols_create(&so);
    CHECK(sy);
    serve_tenants_a_b(&f, sy, NULL);
    char pq[256];
    snprintf(pq, sizeof pq, "/api/v1/profile?format=folded&from=%lld&to=now",
             (long long)(t0 / SEC - 1));
    char *folded = get_text(&f, pq, "token-of-a");
    CHECK_CONTAINS(folded, "u 30000000");
    free(folded);

    /* bad maps: 400 (413 over a limit) with a JSON error naming the problem */
    static const struct {
        const char *pq, *body;
        int status;
        const char *needle;
    } bad[] = {
        {"/api/v1/symbols?name=w.js.map", "{\"version\":2,\"mappings\":\"\"}", 400,
         "version is not 3"},
        {"/api/v1/symbols?name=w.js.map",
         "{\"version\":3,\"sources\":[\"a\"],\"mappings\":\"AA!A\"}", 400,
         "mappings[2] '!' is not a base64 VLQ digit"},
        {"/api/v1/symbols?name=w.js.map", "{\"version\":3,\"sources\":[],\"mappings\":\"AAAA\"}",
         400, "source index 0 out of range"},
        {"/api/v1/symbols?name=w.js.map", "{\"version\":3,\"mappings\":\"\"", 400, "not JSON"},
        {"/api/v1/symbols", "{\"version\":3,\"sources\":[],\"mappings\":\"\"}", 400,
         "no \\\"file\\\" member and no name="},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cp_http_result r = post(&f, bad[i].pq, "token-of-a", bad[i].body, strlen(bad[i].body));
        CHECK_EQ(r.status, bad[i].status);
        CHECK_CONTAINS((char *)r.body.data, "{\"error\":\"");
        CHECK_CONTAINS((char *)r.body.data, bad[i].needle);
        cp_buf_close(&r.body);
    }
    cp_buf big = {0};
    CHECK(cp_buf_printf(&big, "{\"version\":3,\"mappings\":\"") == 0);
    while (big.len < (3u << 19))
        CHECK(cp_buf_append(&big, "AAAA,", 5) == 0);
    CHECK(cp_buf_append(&big, "\"}", 2) == 0);
    cp_http_result r = post(&f, "/api/v1/symbols?name=w.js.map", "token-of-a", big.data, big.len);
    CHECK_EQ(r.status, 413);
    CHECK_CONTAINS((char *)r.body.data, "symbols.max_table_bytes");
    cp_buf_close(&r.body);
    cp_buf_close(&big);
    folded = get_text(&f, pq, "token-of-a");
    CHECK(!strstr(folded, "tsMain"));
    free(folded);

    /* the map of worker.js (named by the upload), then a's stored window reads as the TS */
    r = post(&f, "/api/v1/symbols?name=worker.js.map", "token-of-a", g_map, strlen(g_map));
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS((char *)r.body.data, "\"script\":\"worker.js\",\"sources\":1,\"segments\":3");
    cp_buf_close(&r.body);
    folded = get_text(&f, pq, "token-of-a");
    CHECK_CONTAINS(folded, "tsMain 30000000");
    free(folded);
    snprintf(pq, sizeof pq, "/api/v1/profile?format=pprof&from=%lld&to=now",
             (long long)(t0 / SEC - 1));
    r = qfx_get(&f, pq, "token-of-a");
    CHECK_EQ(r.status, 200);
    cp_profile *p = NULL;
    cp_err err = {0};
    CHECK(cp_pprof_decode(r.body.data, r.body.len, NULL, &p, &err) == 0);
    cp_buf_close(&r.body);
    CHECK_EQ(p->locations.n, 1);
    const cp_line *ln = &p->lines.v[p->locations.v[0].line_off];
    const cp_function *fn = &p->functions.v[ln->function_id - 1];
    CHECK(!strcmp(cp_profile_str(p, fn->name), "tsMain"));
    CHECK(!strcmp(cp_profile_str(p, fn->filename), "src/worker.ts"));
    CHECK_EQ(ln->line, 15);
    CHECK_EQ(fn->start_line, 15);
    CHECK(!strcmp(cp_profile_str(p, fn->system_name), "u file:///srv/app/worker.js?v=3:1:11"));
    cp_profile_destroy(p);
    /* b's identical window is not: the map is a's */
    snprintf(pq, sizeof pq, "/api/v1/profile?format=folded&from=%lld&to=now",
             (long long)(t0 / SEC - 1));
    folded = get_text(&f, pq, "token-of-b");
    CHECK_CONTAINS(folded, "u 30000000");
    free(folded);
    /* b's map keyed by its "file" member (no name=): a replaced map, as ELF tables are */
    static const char filed[] =
        "{\"version\":3,\"file\":\"dist/worker.js\",\"sources\":"
        "[\"b.ts\"],\"names\":[\"bMain\"],\"mappings\":\"AAAA,SAAAA,CAEA\"}";
    r = post(&f, "/api/v1/symbols", "token-of-b", filed, strlen(filed));
    CHECK_EQ(r.status, 200);
    CHECK_CONTAINS((char *)r.body.data, "\"script\":\"worker.js\"");
    cp_buf_close(&r.body);
    folded = get_text(&f, pq, "token-of-b");
    CHECK_CONTAINS(folded, "bMain 30000000");
    free(folded);
    folded = get_text(&f, pq, "token-of-a");
    CHECK_CONTAINS(folded, "tsMain 30000000");
    free(folded);
    qfx_close(&f, 1);
    cp_symbols_destroy(sy);
}

/* The configured directories (.build-id/xx/yyyy.debug) name frames of every tenant. */
/* symprog (its path in prog, 600 bytes; its image in *elf; its build ID in id) in a new
 * debug directory (mkdtemp of dir) as ID[0:2]/ID[2:].debug. */
static void symprog_debug_dir(char *prog, cp_buf *elf, char *id, char *dir)
{
    snprintf(prog, 600, "%s/tests/symbols/symprog", bindir());
    *elf = read_all(prog);
    cp_buf tab = {0};
    cp_err err = {0};
    CHECK_EQ(cp_symtab_build(elf->data, elf->len, 1 << 20, &tab, id, &err), 0);
    cp_buf_close(&tab);
    CHECK(mkdtemp(dir));
    char sub[700], file[1000];
    snprintf(sub, sizeof sub, "%s/%.2s", dir, id);
    CHECK(mkdir(sub, 0755) == 0);
    snprintf(file, sizeof file, "%s/%s.debug", sub, id + 2);
    CHECK(cp_write_file(file, elf->data, elf->len, NULL) == 0);
}

/* A symbolizer reading the debug directories dirs (kept by the caller), no store. */
static cp_symbols *symbols_with_dirs(const char *dirs)
{
    cp_symbols_options so;
    cp_symbols_options_default(&so);
    so.dirs = dirs;
    cp_symbols *sy = cp_symbols_create(&so);
    CHECK(sy);
    return sy;
}

TEST(debug_directories_name_frames_without_an_upload)
{
    char prog[600], id[CP_BUILD_ID_HEX_MAX + 1], dir[] = "/tmp/cpsymdir-XXXXXX";
    cp_buf elf;
    symprog_debug_dir(prog, &elf, id, dir);

    char dirs[700];
    snprintf(dirs, sizeof dirs, "/nonexistent/dir:%s", dir);
    cp_symbols *sy = symbols_with_dirs(dirs);
    cp_profile *p = server_window(id, 0x400000, elf_symbol_offset(prog, "symprog_table_walk"),
                                  elf_symbol_offset(prog, "main"));
    uint32_t named = 0;
    CHECK_EQ(cp_symbols_name(sy, "anyone", p, &named), 0);
    CHECK_EQ(named, 2);
    const cp_location *l = &p->locations.v[0];
    CHECK(l->nlines >= 1);
    const cp_line *ln = &p->lines.v[l->line_off + l->nlines - 1];
    CHECK_STREQ(cp_profile_str(p, p->functions.v[ln->function_id - 1].name), "symprog_table_walk");
    CHECK(p->mappings.v[0].flags & CP_MAP_HAS_FUNCTIONS);
    cp_profile_destroy(p);
    cp_symbols_destroy(sy);
    cp_buf_close(&elf);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* The leaf function's name and system name of the first location of p. */
static void leaf_names(const cp_profile *p, uint32_t loc, const char **name, const char **sys)
{
    const cp_location *l = &p->locations.v[loc];
    CHECK(l->nlines >= 1);
    const cp_line *ln = &p->lines.v[l->line_off + l->nlines - 1];
    const cp_function *fn = &p->functions.v[ln->function_id - 1];
    *name = cp_profile_str(p, fn->name);
    *sys = cp_profile_str(p, fn->system_name);
}

/* C++ and Rust (v0, legacy) symbols of a table come out demangled, the symbol as the
 * function's system name (a directory's table here; an uploaded one takes the same path:
 * cp_symbols_name demangles whatever table named the frame). */
TEST(table_cxx_and_rust_names_demangled)
{
    char prog[600], id[CP_BUILD_ID_HEX_MAX + 1], dir[] = "/tmp/cpsymdm-XXXXXX";
    cp_buf elf;
    symprog_debug_dir(prog, &elf, id, dir);
    cp_symbols *sy = symbols_with_dirs(dir);
    cp_profile *a = server_window(id, 0x400000, elf_symbol_offset(prog, "_ZN3foo3barEv"),
                                  elf_symbol_offset(prog, "_RNvCs1234_7mycrate4main"));
    cp_profile *b = server_window(id, 0x400000,
                                  elf_symbol_offset(prog, "_ZN7mycrate6legacy17h0123456789abcdefE"),
                                  elf_symbol_offset(prog, "main"));
    uint32_t named = 0;
    CHECK_EQ(cp_symbols_name(sy, "anyone", a, &named), 0);
    CHECK_EQ(named, 2);
    CHECK_EQ(cp_symbols_name(sy, "anyone", b, &named), 0);
    CHECK_EQ(named, 2);
    const char *name, *sys;
    leaf_names(a, 0, &name, &sys);
    CHECK_STREQ(name, "foo::bar()");
    CHECK_STREQ(sys, "_ZN3foo3barEv");
    leaf_names(a, 1, &name, &sys);
    CHECK_STREQ(name, "mycrate::main");
    CHECK_STREQ(sys, "_RNvCs1234_7mycrate4main");
    leaf_names(b, 0, &name, &sys);
    CHECK_STREQ(name, "mycrate::legacy");
    leaf_names(b, 1, &name, &sys);
    CHECK_STREQ(name, "main");
    CHECK_STREQ(sys, "main");
    cp_profile_destroy(a);
    cp_profile_destroy(b);
    cp_symbols_destroy(sy);
    cp_buf_close(&elf);
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* The mapping of this process that holds addr: start, file offset and path. */
static void self_mapping(uintptr_t addr, uint64_t *start, uint64_t *limit, uint64_t *offset,
                         char *path, size_t cap)
{
    FILE *f = fopen("/proc/self/maps", "r");
    CHECK(f);
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long lo, hi, o;
        char p[600] = "";
        if (sscanf(line, "%llx-%llx %*s %llx %*s %*s %599s", &lo, &hi, &o, p) < 3) continue;
        if (addr >= lo && addr < hi) {
            *start = lo, *limit = hi, *offset = o;
            snprintf(path, cap, "%s", p);
            found = 1;
        }
    }
    fclose(f);
    CHECK(found);
}

/* libc's own frames, named from Debian's detached debug file (libc6-dbg, installed by
 * .ci/deps) in the default directory: the debug file's segment offsets are rebuilt, so an
 * address of this process must come back as a symbol that resolves to that address. */
TEST(libc_frames_named_from_its_debug_file)
{
    static const char *const fns[] = {"qsort", "getpid",         "strtol",
                                      "fopen", "pthread_create", "abort"};
    /* libc's own definitions (in the sanitizer build RTLD_DEFAULT finds ASan's interceptors) */
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    CHECK(libc);
    uintptr_t addr0 = (uintptr_t)dlsym(libc, "qsort");
    CHECK(addr0);
    uint64_t start = 0, limit = 0, offset = 0;
    char path[600];
    self_mapping(addr0, &start, &limit, &offset, path, sizeof path);
    cp_buf so = read_all(path);
    cp_buf tab = {0};
    char id[CP_BUILD_ID_HEX_MAX + 1];
    cp_err err = {0};
    CHECK_EQ(cp_symtab_build(so.data, so.len, 64u << 20, &tab, id, &err), 0);
    cp_buf_close(&tab);
    cp_buf_close(&so);
    char debug[300];
    snprintf(debug, sizeof debug, "/usr/lib/debug/.build-id/%.2s/%s.debug", id, id + 2);
    struct stat st;
    if (stat(debug, &st) != 0) fprintf(stderr, "%s missing: install libc6-dbg\n", debug);
    CHECK(stat(debug, &st) == 0);

    cp_symbols_options o;
    cp_symbols_options_default(&o); /* dirs: /usr/lib/debug/.build-id */
    cp_symbols *sy = cp_symbols_create(&o);
    CHECK(sy);
    cp_profile *p = cp_profile_create();
    CHECK(p);
    cp_mapping m = {.start = start, .limit = limit, .offset = offset};
    CHECK(cp_profile_intern_cstr(p, path, &m.filename) == 0);
    CHECK(cp_profile_intern_cstr(p, id, &m.build_id) == 0);
    uint32_t mid;
    CHECK(cp_profile_add_mapping(p, &m, &mid) == 0);
    uintptr_t addrs[sizeof fns / sizeof fns[0]];
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        addrs[i] = (uintptr_t)dlsym(libc, fns[i]);
        CHECK(addrs[i] >= start && addrs[i] < limit);
        uint32_t lid;
        CHECK(cp_profile_add_location(p, addrs[i] + 2, mid, NULL, 0, &lid) == 0);
    }
    uint32_t named = 0;
    CHECK_EQ(cp_symbols_name(sy, "default", p, &named), 0);
    CHECK_EQ(named, sizeof fns / sizeof fns[0]);
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        const cp_location *l = &p->locations.v[i];
        const cp_line *ln = &p->lines.v[l->line_off + l->nlines - 1];
        const char *name = cp_profile_str(p, p->functions.v[ln->function_id - 1].name);
        fprintf(stderr, "%s at %#lx: %s %s:%lld\n", fns[i], (unsigned long)addrs[i], name,
                cp_profile_str(p, p->functions.v[ln->function_id - 1].filename),
                (long long)ln->line);
        CHECK((uintptr_t)dlsym(libc, name) == addrs[i] || strstr(name, fns[i]));
        CHECK(ln->line > 0); /* the debug file's lines, not just the symbol */
    }
    cp_profile_destroy(p);
    cp_symbols_destroy(sy);
    dlclose(libc);
}

/* Opens a connection that starts an upload of 1 MB and sends only its first bytes. */
static int half_upload(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    static const char head[] = "POST /api/v1/symbols HTTP/1.1\r\nHost: x\r\n"
                               "Content-Length: 1000000\r\n\r\n\177ELF";
    CHECK(write(fd, head, sizeof head - 1) == (ssize_t)(sizeof head - 1));
    return fd;
}

/* Each upload may hold symbols.max_upload_bytes of memory: only max_uploads (2) at once,
 * the next gets 503 until one is done. */
TEST(concurrent_uploads_are_bounded)
{
    qfx f = {0};
    qfx_open_store(&f, NULL);
    cp_symbols_options so;
    cp_symbols_options_default(&so);
    so.store = f.store;
    so.dirs = "";
    cp_symbols *sy = cp_symbols_create(&so);
    CHECK(sy);
    cp_api_options ao;
    cp_api_options_default(&ao);
    ao.symbols = sy;
    qfx_serve(&f, &ao, 2);
    char prog[600];
    snprintf(prog, sizeof prog, "%s/tests/symbols/symprog", bindir());
    cp_buf elf = read_all(prog);
    int a = half_upload(f.port), b = half_upload(f.port);
    int status = 0;
    for (int i = 0; i < 200 && status != 503; i++) { /* both have reached the server */
        cp_http_result r = post(&f, "/api/v1/symbols", NULL, elf.data, elf.len);
        status = r.status;
        if (status == 503) CHECK_CONTAINS((char *)r.body.data, "uploads in progress");
        cp_buf_close(&r.body);
        if (status != 503) usleep(50000);
    }
    CHECK_EQ(status, 503);
    close(a);
    close(b);
    for (int i = 0; i < 200 && status != 200; i++) { /* the slots are given back */
        cp_http_result r = post(&f, "/api/v1/symbols", NULL, elf.data, elf.len);
        status = r.status;
        cp_buf_close(&r.body);
        if (status != 200) usleep(50000);
    }
    CHECK_EQ(status, 200);
    cp_buf_close(&elf);
    qfx_close(&f, 1);
    cp_symbols_destroy(sy);
}

/* A stub of path's PLT sections as objdump names them: its name and its file offset. */
typedef struct stub {
    uint64_t off;
    char name[128];
} stub;

static int objdump_stubs(const char *path, stub *out, int cap)
{
    char cmd[700], line[512];
    /* the sections' addresses and file offsets, to turn a stub's address into its offset */
    uint64_t vma[8], foff[8];
    char sname[8][64];
    int ns = 0;
    snprintf(cmd, sizeof cmd, "objdump -h %s", path);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    while (fgets(line, sizeof line, p)) {
        unsigned idx;
        char nm[64];
        unsigned long long size, v, l, o;
        if (sscanf(line, " %u %63s %llx %llx %llx %llx", &idx, nm, &size, &v, &l, &o) == 6 &&
            !strncmp(nm, ".plt", 4) && ns < 8) {
            vma[ns] = v;
            foff[ns] = o;
            snprintf(sname[ns++], 64, "%s", nm);
        }
    }
    pclose(p);
    snprintf(cmd, sizeof cmd, "objdump -d -j .plt -j .plt.sec -j .plt.got %s", path);
    p = popen(cmd, "r");
    CHECK(p);
    int n = 0, sec = -1;
    while (fgets(line, sizeof line, p)) {
        char nm[128];
        unsigned long long a;
        if (sscanf(line, "Disassembly of section %127[^:]:", nm) == 1) {
            sec = -1;
            for (int i = 0; i < ns; i++)
                if (!strcmp(sname[i], nm)) sec = i;
            continue;
        }
        if (sec < 0 || sscanf(line, "%llx <%127[^>]>:", &a, nm) != 2) continue;
        if (!strstr(nm, "@plt") || strchr(nm, '-') || strchr(nm, '+') || n >= cap) continue;
        out[n].off = foff[sec] + (a - vma[sec]);
        snprintf(out[n++].name, 128, "%s", nm);
    }
    pclose(p);
    return n;
}

/* A frame in a PLT stub is named `func@plt` as binutils names it, never `_init` (the sizeless
 * symbol before .plt reached over every stub): this test binary (.symtab with a local
 * _init) and Debian's python3.11 (stripped, .dynsym) when installed. */
TEST(plt_stubs_named_not_init)
{
    const char *paths[] = {"/proc/self/exe", "/usr/bin/python3.11"};
    static stub st[4096];
    for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++) {
        if (access(paths[k], R_OK) != 0) continue;
        char real[600];
        ssize_t rl = readlink(paths[k], real, sizeof real - 1);
        if (rl > 0)
            real[rl] = 0;
        else
            snprintf(real, sizeof real, "%s", paths[k]);
        int n = objdump_stubs(real, st, 4096);
        cp_buf elf = read_all(real);
        cp_buf tab = {0};
        char id[CP_BUILD_ID_HEX_MAX + 1];
        cp_err err = {0};
        CHECK_EQ(cp_symtab_build(elf.data, elf.len, 64u << 20, &tab, id, &err), 0);
        cp_symtab t;
        CHECK_EQ(cp_symtab_open(&t, tab.data, tab.len, &err), 0);
        int same = 0;
        for (int i = 0; i < n; i++) {
            cp_symframe fr[CP_SYMTAB_MAX_FRAMES];
            uint32_t nf = cp_symtab_lookup(&t, st[i].off + 3, fr, CP_SYMTAB_MAX_FRAMES);
            CHECK(nf >= 1);
            const char *got = fr[nf - 1].name;
            if (i < 2 || strcmp(got, st[i].name)) printf("  %s: %s\n", st[i].name, got);
            CHECK(strcmp(got, "_init") != 0);
            same += !strcmp(got, st[i].name);
        }
        printf("%s: %d of %d stubs as objdump names them\n", real, same, n);
        CHECK(n > 0);
        CHECK_EQ(same, n);
        cp_buf_close(&tab);
        cp_buf_close(&elf);
    }
}

TEST_MAIN(T(table_names_functions_lines_and_inlined_calls_of_this_binary),
          T(plt_stubs_named_not_init), T(table_cxx_and_rust_names_demangled),
          T(concurrent_uploads_are_bounded), T(libc_frames_named_from_its_debug_file),
          T(bad_files_are_refused_naming_the_problem),
          T(uploaded_symbols_name_stored_profiles_of_their_tenant_only),
          T(debug_directories_name_frames_without_an_upload),
          T(source_maps_name_stored_v8_frames_of_their_tenant_only))
