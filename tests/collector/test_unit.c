/* Unit tests of collector modules called directly (no interposition, so they also run in
 * the ASan+UBSan build): the CFI unwinder through libc code without frame pointers, the
 * configuration parser, the Kafka backlog with no reachable broker, the brokers lookup
 * over HTTP, and reading Node's Worker objects. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <search.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "capture.h"
#include "fake_contprofd.h"
#include "isolate.h"
#include "kafka.h"
#include "nodeworker.h"
#include "pprof.h"
#include "stream.h"
#include "test.h"
#include "unwind.h"
#include "watch.h"

/* ------------------------------------------------------------------------------------
 * Unwinding */

static uint64_t g_pcs[CP_MAX_FRAMES];
static cp_ucache *g_cache;
static int g_n;

static void stack_bounds(uintptr_t *lo, uintptr_t *hi)
{
    pthread_attr_t a;
    void *addr;
    size_t size;
    CHECK(pthread_getattr_np(pthread_self(), &a) == 0);
    CHECK(pthread_attr_getstack(&a, &addr, &size) == 0);
    pthread_attr_destroy(&a);
    *lo = (uintptr_t)addr;
    *hi = (uintptr_t)addr + size;
}

static int cmp_capture(const void *a, const void *b)
{
    if (g_n == 0) {
        uintptr_t lo, hi;
        stack_bounds(&lo, &hi);
        g_n = cp_unwind_here(lo, hi, g_pcs, CP_MAX_FRAMES, 0, g_cache);
    }
    return *(const int *)a - *(const int *)b;
}

/* lfind: a libc function that calls back and that ASan does not intercept */
__attribute__((noinline)) void unit_caller_of_qsort(void)
{
    int v[64];
    for (int i = 0; i < 64; i++)
        v[i] = 64 - i;
    int key = 1;
    size_t n = 64;
    if (!lfind(&key, v, &n, sizeof(int), cmp_capture)) abort();
    __asm__ volatile("" ::: "memory");
}

static const char *sym_of(uint64_t pc)
{
    Dl_info info;
    if (dladdr((void *)(uintptr_t)pc, &info) && info.dli_sname) return info.dli_sname;
    return "?";
}

static const char *obj_of(uint64_t pc)
{
    Dl_info info;
    if (dladdr((void *)(uintptr_t)pc, &info) && info.dli_fname) return info.dli_fname;
    return "?";
}

static void unwind_through_libc_with(cp_ucache *cache);

TEST(unwind_through_libc)
{
    /* without a cache, then with one twice (filling it, then reading from it) */
    static cp_ucache cache;
    unwind_through_libc_with(NULL);
    unwind_through_libc_with(&cache);
    uint64_t first[CP_MAX_FRAMES];
    int n1 = g_n;
    memcpy(first, g_pcs, sizeof(first));
    unwind_through_libc_with(&cache);
    CHECK_EQ(g_n, n1);
    /* the same frames through libc and back into unit_caller_of_qsort (the call sites of
     * its callers differ between the calls) */
    int k = 0;
    while (k < n1 && !strstr(obj_of(g_pcs[k]), "libc.so"))
        k++;
    CHECK(k + 1 < n1);
    CHECK(memcmp(first, g_pcs, (size_t)(k + 2) * sizeof(uint64_t)) == 0);
}

static void unwind_through_libc_with(cp_ucache *cache)
{
    g_cache = cache;
    CHECK(cp_modules_refresh(1) == 0);
    g_n = 0;
    unit_caller_of_qsort();
    CHECK(g_n > 3);
    int saw_libc = 0, saw_caller = 0, saw_start = 0;
    uintptr_t caller = (uintptr_t)unit_caller_of_qsort;
    for (int i = 0; i < g_n; i++) {
        const char *s = sym_of(g_pcs[i]);
        printf("  #%d %s (%s)\n", i, s, obj_of(g_pcs[i]));
        if (strstr(obj_of(g_pcs[i]), "libc.so")) saw_libc = 1;
        /* the caller is only reached by unwinding through qsort's frames (no frame
         * pointers in Debian's libc) */
        if (g_pcs[i] > caller && g_pcs[i] < caller + 4096 && saw_libc) saw_caller = 1;
        if (!strcmp(s, "_start") && saw_caller) saw_start = 1;
    }
    CHECK(saw_libc);
    CHECK(saw_caller);
    CHECK(saw_start); /* and all the way to the bottom of the stack */
}

TEST(unwind_stays_in_bounds)
{
    /* a stack window of nothing: only the leaf is reported */
    cp_uregs r = {.pc = (uintptr_t)unit_caller_of_qsort, .sp = 0, .fp = 0};
    uint64_t pcs[4];
    CHECK_EQ(cp_unwind(&r, 0, 0, pcs, 4, NULL), 1);
    /* garbage registers inside a real stack range stop cleanly */
    uintptr_t lo, hi;
    stack_bounds(&lo, &hi);
    cp_uregs g = {.pc = 0x1234, .sp = hi - 64, .fp = 0xdeadbeef};
    CHECK(cp_unwind(&g, lo, hi, pcs, 4, NULL) >= 1);
}

/* The engine that needs no signal unwinds a copy of the top of a stack (perf's
 * PERF_SAMPLE_STACK_USER): from the same registers, the copy gives the live stack's frames
 * (those its bytes cover), and it is the copy that is read: zeroed, the walk stops. */
static uint8_t g_copy[16384];
static uint64_t g_live[CP_MAX_FRAMES], g_from_copy[CP_MAX_FRAMES], g_from_zeros[CP_MAX_FRAMES];
static int g_nlive, g_ncopy, g_nzeros;

/* as the kernel copies it: other frames' bytes, ASan's redzones among them */
__attribute__((no_sanitize_address, noinline)) static void copy_stack(uint8_t *dst, uintptr_t from,
                                                                      size_t len)
{
    const volatile uint8_t *src = (const volatile uint8_t *)from;
    for (size_t i = 0; i < len; i++)
        dst[i] = src[i];
}

__attribute__((noinline)) static void unwind_copy_here(void)
{
    uintptr_t lo, hi;
    stack_bounds(&lo, &hi);
    cp_uregs r;
    __asm__ volatile("leaq 0(%%rip), %0\n\t"
                     "movq %%rsp, %1\n\t"
                     "movq %%rbp, %2"
                     : "=r"(r.pc), "=r"(r.sp), "=r"(r.fp));
    size_t len = hi - r.sp < sizeof(g_copy) ? hi - r.sp : sizeof(g_copy);
    copy_stack(g_copy, r.sp, len);
    g_nlive = cp_unwind(&r, lo, hi, g_live, CP_MAX_FRAMES, NULL);
    g_ncopy = cp_unwind_copy(&r, g_copy, len, g_from_copy, CP_MAX_FRAMES, NULL);
    memset(g_copy, 0, sizeof(g_copy));
    g_nzeros = cp_unwind_copy(&r, g_copy, len, g_from_zeros, CP_MAX_FRAMES, NULL);
}

static int cmp_copy(const void *a, const void *b)
{
    if (!g_nlive) unwind_copy_here();
    return *(const int *)a - *(const int *)b;
}

TEST(unwind_copy_of_stack)
{
    CHECK(cp_modules_refresh(1) == 0);
    int v[8] = {8, 7, 6, 5, 4, 3, 2, 1}, key = 1;
    size_t n = 8;
    g_nlive = 0;
    CHECK(lfind(&key, v, &n, sizeof(int), cmp_copy) != NULL);
    printf("live %d frames, from the copy %d, from zeros %d\n", g_nlive, g_ncopy, g_nzeros);
    CHECK(g_nlive > 4); /* through libc's lfind */
    CHECK(g_ncopy > 4);
    int k = g_ncopy < g_nlive ? g_ncopy : g_nlive;
    CHECK(memcmp(g_live, g_from_copy, (size_t)k * sizeof(uint64_t)) == 0);
    CHECK(g_nzeros <= 2);
}

TEST(modules_have_build_ids)
{
    CHECK(cp_modules_refresh(1) == 0);
    const cp_modules *m = cp_modules_current();
    CHECK(m && m->n >= 2);
    const cp_module *libc = cp_modules_find(m, (uintptr_t)&lfind);
    CHECK(libc != NULL);
    CHECK(strstr(libc->path, "libc.so") != NULL);
    CHECK(libc->build_id_len == 20);
    CHECK(libc->eh_hdr != NULL && libc->count > 100);
}

/* ------------------------------------------------------------------------------------
 * Configuration */

TEST(config_from_env)
{
    setenv("CONTPROF_SERVICE", "checkout", 1);
    setenv("CONTPROF_CPU_HZ", "5000", 1);
    setenv("CONTPROF_WINDOW", "3s", 1);
    setenv("CONTPROF_ALLOC_RATE", "-1", 1);
    cp_config c;
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_STREQ(c.service, "checkout");
    CHECK_STREQ(c.tenant, "default");
    CHECK_STREQ(c.topic, "contprof.profiles");
    CHECK_EQ(c.cpu_hz, 1000); /* clamped */
    CHECK_EQ(c.window_ns, 3000000000LL);
    CHECK_EQ(c.alloc_rate, 0);
    CHECK_EQ(c.children, 1);
    CHECK_STREQ(c.kafka_props, "");
    CHECK_EQ(c.cpu_engine, CP_ENGINE_AUTO);
    setenv("CONTPROF_CPU_ENGINE", "perf", 1);
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.cpu_engine, CP_ENGINE_PERF);
    setenv("CONTPROF_CPU_ENGINE", "timer", 1);
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.cpu_engine, CP_ENGINE_TIMER);
    setenv("CONTPROF_CPU_ENGINE", "auto", 1);
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.cpu_engine, CP_ENGINE_AUTO);
    unsetenv("CONTPROF_CPU_ENGINE");
    setenv("CONTPROF_KAFKA_SECURITY_PROTOCOL", "SASL_SSL", 1);
    setenv("CONTPROF_KAFKA_QUEUE", "64", 1); /* the agent's own, not a Kafka property */
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_STREQ(c.kafka_props, "security.protocol=SASL_SSL\n");
    CHECK_EQ(c.kafka_queue, 64);
    unsetenv("CONTPROF_KAFKA_SECURITY_PROTOCOL");
    unsetenv("CONTPROF_KAFKA_QUEUE");
    contprof_options o = {.service = "api", .cpu_hz = 99, .window_ms = 500};
    CHECK_EQ(cp_config_load(&c, &o, NULL), 0);
    CHECK_STREQ(c.service, "api"); /* options win over the environment */
    CHECK_EQ(c.cpu_hz, 99);
    CHECK_EQ(c.window_ns, 500000000LL);
    unsetenv("CONTPROF_SERVICE");
    unsetenv("CONTPROF_CPU_HZ");
    unsetenv("CONTPROF_WINDOW");
    unsetenv("CONTPROF_ALLOC_RATE");
}

/* The agent's durations read model/times.h's grammar (a bare number is seconds); a bare
 * CONTPROF_WINDOW that was milliseconds before, and CONTPROF_FLUSH_MS, are refused with a
 * message naming the variable, never silently read another way. */
TEST(config_durations)
{
    int64_t ns = 0;
    CHECK_EQ(cp_config_duration("X", "10s", 0, &ns, NULL), 0);
    CHECK_EQ(ns, 10000000000LL);
    CHECK_EQ(cp_config_duration("X", "250ms", 0, &ns, NULL), 0);
    CHECK_EQ(ns, 250000000LL);
    CHECK_EQ(cp_config_duration("X", "1m30s", 0, &ns, NULL), 0);
    CHECK_EQ(ns, 90000000000LL);
    CHECK_EQ(cp_config_duration("X", "1500", 0, &ns, NULL), 0); /* seconds */
    CHECK_EQ(ns, 1500000000000LL);
    cp_err err = {0};
    CHECK_EQ(cp_config_duration("CONTPROF_FLUSH", "5 s", 0, &ns, &err), CP_EPARSE);
    CHECK(strstr(err.msg, "CONTPROF_FLUSH='5 s'") != NULL);

    cp_config c;
    setenv("CONTPROF_WINDOW", "5", 1);
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.window_ns, 5000000000LL);
    setenv("CONTPROF_WINDOW", "99.5", 1);
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.window_ns, 99500000000LL);
    setenv("CONTPROF_WINDOW", "20ms", 1); /* below the shortest window */
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.window_ns, CP_WINDOW_MIN_NS);
    setenv("CONTPROF_WINDOW", "100s", 1); /* with the unit: as long as asked */
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.window_ns, 100000000000LL);
    memset(&err, 0, sizeof(err));
    setenv("CONTPROF_WINDOW", "1000", 1); /* 1 s in earlier versions */
    CHECK_EQ(cp_config_load(&c, NULL, &err), CP_EPARSE);
    CHECK(strstr(err.msg, "CONTPROF_WINDOW='1000'") != NULL);
    CHECK(strstr(err.msg, "1000ms") != NULL);
    memset(&err, 0, sizeof(err));
    setenv("CONTPROF_WINDOW", "ten", 1);
    CHECK_EQ(cp_config_load(&c, NULL, &err), CP_EPARSE);
    CHECK(strstr(err.msg, "CONTPROF_WINDOW='ten'") != NULL);
    /* options win: the variable is not read */
    contprof_options o = {.window_ms = 2000};
    CHECK_EQ(cp_config_load(&c, &o, NULL), 0);
    CHECK_EQ(c.window_ns, 2000000000LL);
    unsetenv("CONTPROF_WINDOW");

    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.window_ns, 10000000000LL);
    CHECK_EQ(c.flush_ns, 1000000000LL);
    setenv("CONTPROF_FLUSH", "250ms", 1);
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.flush_ns, 250000000LL);
    setenv("CONTPROF_FLUSH", "2", 1);
    CHECK_EQ(cp_config_load(&c, NULL, NULL), 0);
    CHECK_EQ(c.flush_ns, 2000000000LL);
    memset(&err, 0, sizeof(err));
    setenv("CONTPROF_FLUSH", "2h", 1);
    CHECK_EQ(cp_config_load(&c, NULL, &err), CP_EPARSE);
    CHECK(strstr(err.msg, "CONTPROF_FLUSH='2h': at most 1h") != NULL);
    unsetenv("CONTPROF_FLUSH");
    memset(&err, 0, sizeof(err));
    setenv("CONTPROF_FLUSH_MS", "500", 1);
    CHECK_EQ(cp_config_load(&c, NULL, &err), CP_EPARSE);
    CHECK(strstr(err.msg, "CONTPROF_FLUSH_MS='500'") != NULL);
    CHECK(strstr(err.msg, "CONTPROF_FLUSH=500ms") != NULL);
    unsetenv("CONTPROF_FLUSH_MS");
}

/* ------------------------------------------------------------------------------------
 * Isolates and language frames (isolate.c, a leaf: no thread, no hook) */

TEST(isolate_lang_frames)
{
    contprof_frame fr[3] = {{"f", "a.lua", 3}, {"g", NULL, 0}, {NULL, NULL, 0}};
    uint64_t ids[3];
    CHECK_EQ(cp_lang_ids(fr, 3, ids), 2); /* a frame without a function is left out */
    CHECK(ids[0] & CP_LANG_TAG);
    uint64_t again[2];
    CHECK_EQ(cp_lang_ids(fr, 2, again), 2);
    CHECK_EQ(again[0], ids[0]); /* interned once */
    CHECK_EQ(again[1], ids[1]);
    CHECK(ids[0] != ids[1]);
    const char *fn, *file;
    int64_t line;
    CHECK_EQ(cp_lang_get((uint32_t)(ids[0] & ~CP_LANG_TAG), &fn, &file, &line), 0);
    CHECK_STREQ(fn, "f");
    CHECK_STREQ(file, "a.lua");
    CHECK_EQ(line, 3);
    CHECK_EQ(cp_lang_get((uint32_t)(ids[1] & ~CP_LANG_TAG), &fn, &file, &line), 0);
    CHECK(file == NULL);
    CHECK_EQ(cp_lang_get(1u << 30, &fn, &file, &line), CP_ENOTFOUND);

    /* no runtime code: the language frames go on top of the native stack */
    uint64_t pcs[CP_MAX_FRAMES] = {0x500, 0x1100, 0x1200, 0x3000};
    CHECK_EQ(cp_lang_join(0, pcs, 4, ids, 2), 6);
    CHECK_EQ(pcs[0], ids[0]);
    CHECK_EQ(pcs[1], ids[1]);
    CHECK_EQ(pcs[2], 0x500);
    CHECK_EQ(pcs[5], 0x3000);

    /* with the runtime's code range: they replace its frames (its outermost one stays) */
    contprof_isolate *iso = contprof_isolate_create("lua", NULL);
    CHECK(iso != NULL);
    contprof_isolate_set_runtime_code(iso, 0x1000, 0x2000);
    uint64_t p2[CP_MAX_FRAMES] = {0x500, 0x1100, 0x1200, 0x3000};
    CHECK_EQ(cp_lang_join(iso->id, p2, 4, ids, 2), 5);
    CHECK_EQ(p2[0], 0x500);
    CHECK_EQ(p2[1], ids[0]);
    CHECK_EQ(p2[2], ids[1]);
    CHECK_EQ(p2[3], 0x1200);
    CHECK_EQ(p2[4], 0x3000);

    /* destroyed isolates are freed by the agent's reap, and their slot reused */
    uint32_t id = iso->id;
    contprof_isolate_destroy(iso);
    CHECK_EQ(atomic_load(&cp_isolates[id - 1].state), CP_ISO_DYING);
    cp_isolates_reap();
    CHECK_EQ(atomic_load(&cp_isolates[id - 1].state), CP_ISO_FREE);
    contprof_isolate *again_iso = contprof_isolate_create("lua2", "k=v");
    CHECK(again_iso != NULL && again_iso->id == id);
    CHECK_STREQ(again_iso->labels, "k=v");
}

/* ------------------------------------------------------------------------------------
 * Kafka with nothing listening */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

TEST(kafka_backlog_drops_oldest)
{
    cp_kafka *k;
    cp_err err = {0};
    /* properties from CONTPROF_KAFKA_* reach librdkafka, which names a bad one */
    CHECK(cp_kafka_create("127.0.0.1:1", "t", 8, "socket.timeout.ms=5000\nno.such.property=1\n", &k,
                          &err) == CP_EKAFKA);
    CHECK_EQ(err.code, CP_EKAFKA);
    CHECK(strstr(err.msg, "no.such.property") != NULL);
    CHECK(cp_kafka_create("127.0.0.1:1", "contprof.profiles", 8, "socket.timeout.ms=5000\n", &k,
                          &err) == 0);
    double t0 = now_s();
    for (int i = 0; i < 20; i++) {
        uint8_t *v = malloc(100), *key = malloc(8);
        memset(v, i, 100);
        memcpy(key, "series-1", 8);
        cp_kafka_send(k, v, 100, key, 8);
        cp_kafka_poll(k);
    }
    CHECK(now_s() - t0 < 0.5); /* never blocks */
    uint64_t d = cp_kafka_take_dropped(k);
    printf("dropped %llu of 20 with a queue of 8\n", (unsigned long long)d);
    CHECK(d >= 12);
    t0 = now_s();
    cp_kafka_destroy(k, 300);
    CHECK(now_s() - t0 < 3.0); /* bounded flush */
}

/* ------------------------------------------------------------------------------------
 * A stream's tables kept between windows (stream.c): epochs */

static uint32_t g_sym_calls;

/* A symbolizer that names each pc after itself and counts its calls (libdw's is window.c's,
 * tested under the real agent in test_agent). */
static uint32_t fake_symbolize(uint64_t pc, cp_sym_line *lines, void *arg)
{
    static char name[2][32];
    (void)arg;
    g_sym_calls++;
    snprintf(name[0], sizeof name[0], "inl_%llx", (unsigned long long)pc);
    snprintf(name[1], sizeof name[1], "fn_%llx", (unsigned long long)pc);
    lines[0] = (cp_sym_line){name[0], NULL, "a.c", 7};
    lines[1] = (cp_sym_line){name[1], NULL, "a.c", 9};
    return 2;
}

/* Encodes one window of stream k with the stacks stacks[0..n) (each nf pcs, 0-terminated
 * list) and decodes it back, as ingest sees it; the window's comment is comment. */
static cp_profile *stream_window(const cp_stream_key *k, cp_symbolize_fn sym, const uint64_t *pcs,
                                 const uint32_t *lens, uint32_t n, const char *comment, int *fresh)
{
    cp_modules_refresh(0);
    cp_stream *s = cp_streams_begin(k, cp_modules_current(), sym, NULL, fresh);
    CHECK(s != NULL);
    cp_profile *p = cp_stream_profile(s);
    CHECK_EQ(p->samples.n, 0);
    CHECK_EQ(p->comments.n, 0);
    if (*fresh) {
        CHECK_EQ(p->sample_types.n, 0);
        CHECK_EQ(cp_profile_add_sample_type(p, "samples", "count"), 0);
    } else {
        CHECK_EQ(p->sample_types.n, 1);
    }
    for (uint32_t i = 0, off = 0; i < n; off += lens[i++]) {
        int64_t v = 1 + i;
        cp_stream_add_sample(s, pcs + off, lens[i], &v);
    }
    CHECK_EQ(cp_stream_seal(s), 0);
    uint32_t cid;
    CHECK_EQ(cp_profile_intern_cstr(p, comment, &cid), 0);
    CHECK_EQ(cp_vec_push(&p->comments, cid), 0);
    cp_buf b = {0};
    CHECK_EQ(cp_pprof_encode(p, 0, &b), 0);
    cp_streams_end(s, 1);
    cp_profile *q = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_pprof_decode(b.data, b.len, NULL, &q, &err), 0);
    cp_buf_close(&b);
    return q;
}

static int str_index(const cp_profile *p, const char *s)
{
    for (uint32_t i = 0; i < p->strs.off.n; i++)
        if (strcmp(cp_profile_str(p, i), s) == 0) return (int)i;
    return -1;
}

/* b's mappings, locations (with lines), functions and strings up to a's window comment
 * start with a's, entry for entry. */
static void check_prefix(const cp_profile *a, const cp_profile *b, const char *a_comment)
{
    CHECK(b->mappings.n >= a->mappings.n);
    for (uint32_t i = 0; i < a->mappings.n; i++) {
        const cp_mapping *x = &a->mappings.v[i], *y = &b->mappings.v[i];
        CHECK(x->start == y->start && x->limit == y->limit && x->offset == y->offset);
        CHECK(x->filename == y->filename && x->build_id == y->build_id && x->flags == y->flags);
    }
    CHECK(b->locations.n >= a->locations.n);
    for (uint32_t i = 0; i < a->locations.n; i++) {
        const cp_location *x = &a->locations.v[i], *y = &b->locations.v[i];
        CHECK_EQ(x->address, y->address);
        CHECK_EQ(x->mapping_id, y->mapping_id);
        CHECK_EQ(x->nlines, y->nlines);
        for (uint32_t j = 0; j < x->nlines; j++) {
            CHECK_EQ(a->lines.v[x->line_off + j].function_id,
                     b->lines.v[y->line_off + j].function_id);
            CHECK_EQ(a->lines.v[x->line_off + j].line, b->lines.v[y->line_off + j].line);
        }
    }
    CHECK(b->functions.n >= a->functions.n);
    for (uint32_t i = 0; i < a->functions.n; i++) {
        const cp_function *x = &a->functions.v[i], *y = &b->functions.v[i];
        CHECK(x->name == y->name && x->system_name == y->system_name);
        CHECK(x->filename == y->filename && x->start_line == y->start_line);
    }
    int cut = str_index(a, a_comment);
    CHECK(cut > 0);
    CHECK((int)b->strs.off.n >= cut);
    for (int i = 0; i < cut; i++)
        CHECK_STREQ(cp_profile_str(a, (uint32_t)i), cp_profile_str(b, (uint32_t)i));
    /* the last window's own strings are gone from the next one's table */
    CHECK_EQ(str_index(b, a_comment), -1);
}

/* The location of pc in q (by its canonical address), or NULL. */
static const cp_location *loc_of(const cp_profile *q, const cp_modules *mods, uint64_t pc)
{
    const cp_module *m = cp_modules_find(mods, pc);
    CHECK(m != NULL);
    uint64_t canon = pc - m->lo + m->file_offset;
    const cp_location *found = NULL;
    for (uint32_t i = 0; i < q->locations.n; i++)
        if (q->locations.v[i].address == canon) {
            const cp_mapping *mp = &q->mappings.v[q->locations.v[i].mapping_id - 1];
            /* canonical mapping: start = file offset, the same size */
            CHECK_EQ(mp->start, m->file_offset);
            CHECK_EQ(mp->limit, m->file_offset + (m->hi - m->lo));
            CHECK(found == NULL);
            found = &q->locations.v[i];
        }
    return found;
}

static void epochs_keep_tables(cp_symbolize_fn sym)
{
    cp_streams_set_bounds(CP_STREAMS_MAX, CP_STREAM_MAX_LOCATIONS, CP_STREAM_MAX_BYTES);
    CHECK_EQ(cp_modules_refresh(1), 0);
    const cp_modules *mods = cp_modules_current();
    uint64_t base = (uint64_t)(uintptr_t)&unit_caller_of_qsort;
    uint64_t libc = (uint64_t)(uintptr_t)dlsym(RTLD_DEFAULT, "lfind");
    CHECK(libc != 0);
    contprof_frame fr = {"lua_fn", "x.lua", 12};
    uint64_t lang;
    CHECK_EQ(cp_lang_ids(&fr, 1, &lang), 1);
    uint64_t A = base + 1, B = base + 2, C = libc + 3, D = base + 5;
    cp_stream_key k = {.iso = 0, .thread = "worker", .kind = 1};
    g_sym_calls = 0;

    /* window 1: A B | C lang */
    uint64_t w1[] = {A, B, C, lang};
    uint32_t l1[] = {2, 2};
    int fresh = 0;
    cp_profile *q1 = stream_window(&k, sym, w1, l1, 2, "dropped_samples=1 w1", &fresh);
    CHECK_EQ(fresh, 1);
    CHECK_EQ(cp_streams_kept(), 1);
    CHECK_EQ(g_sym_calls, sym ? 3u : 0u); /* A, B, C; the language frame has its name */
    CHECK_EQ(q1->locations.n, 4);
    CHECK(loc_of(q1, mods, A) && loc_of(q1, mods, B) && loc_of(q1, mods, C));
    for (uint32_t i = 0; i < q1->mappings.n; i++)
        CHECK_EQ(q1->mappings.v[i].flags, sym ? 15u : 0u);

    /* window 2: A D; C and the language frame are not used but still listed */
    uint64_t w2[] = {A, D};
    uint32_t l2[] = {2};
    cp_profile *q2 = stream_window(&k, sym, w2, l2, 1, "dropped_samples=2 w2", &fresh);
    CHECK_EQ(fresh, 0);
    CHECK_EQ(g_sym_calls, sym ? 4u : 0u); /* only D is new: symbolized once per epoch */
    check_prefix(q1, q2, "dropped_samples=1 w1");
    CHECK_EQ(q2->locations.n, 5); /* dense: A B C lang D */
    const cp_location *la = loc_of(q2, mods, A), *ld = loc_of(q2, mods, D);
    CHECK(la && ld && loc_of(q2, mods, C));
    CHECK_EQ(ld - q2->locations.v, 4); /* appended */
    CHECK_EQ(q2->samples.n, 1);
    CHECK_EQ(q2->samples.v[0].nlocs, 2);
    CHECK_EQ(q2->stack.v[q2->samples.v[0].loc_off], (uint32_t)(la - q2->locations.v) + 1);
    CHECK_EQ(q2->stack.v[q2->samples.v[0].loc_off + 1], 5);
    const cp_location *ll = &q2->locations.v[3];
    CHECK_EQ(ll->address, 0);
    CHECK_EQ(ll->nlines, 1);
    CHECK_STREQ(cp_profile_str(q2, q2->functions.v[q2->lines.v[ll->line_off].function_id - 1].name),
                "lua_fn");
    if (sym) {
        CHECK_EQ(la->nlines, 2);
        char want[32];
        snprintf(want, sizeof want, "fn_%llx", (unsigned long long)A);
        CHECK_STREQ(
            cp_profile_str(q2, q2->functions.v[q2->lines.v[la->line_off + 1].function_id - 1].name),
            want);
    } else {
        CHECK_EQ(la->nlines, 0);
    }

    /* window 3 again starts with window 2's tables */
    uint64_t w3[] = {B};
    uint32_t l3[] = {1};
    cp_profile *q3 = stream_window(&k, sym, w3, l3, 1, "dropped_samples=0 w3", &fresh);
    CHECK_EQ(fresh, 0);
    check_prefix(q2, q3, "dropped_samples=2 w2");
    CHECK_EQ(q3->locations.n, 5);
    CHECK_EQ(g_sym_calls, sym ? 4u : 0u);
    cp_profile_destroy(q1);
    cp_profile_destroy(q2);
    cp_profile_destroy(q3);
    cp_streams_reset();
    CHECK_EQ(cp_streams_kept(), 0);
}

TEST(epochs_keep_tables_symbolized)
{
    epochs_keep_tables(fake_symbolize);
}

TEST(epochs_keep_tables_unsymbolized)
{
    epochs_keep_tables(NULL);
}

TEST(epochs_bounded)
{
    uint64_t base = (uint64_t)(uintptr_t)&unit_caller_of_qsort;
    uint64_t w[] = {base + 1, base + 2, base + 3, base + 4};
    uint32_t two[] = {2}, one[] = {1}, four[] = {4};
    int fresh;
    cp_profile *q;
    cp_stream_key k = {.thread = "t", .kind = 1};

    /* at most 3 locations: kept with 2, a new epoch after the window that passed 3 */
    cp_streams_set_bounds(CP_STREAMS_MAX, 3, CP_STREAM_MAX_BYTES);
    q = stream_window(&k, NULL, w, two, 1, "c1", &fresh);
    CHECK_EQ(fresh, 1);
    CHECK_EQ(cp_streams_kept(), 1);
    cp_profile_destroy(q);
    q = stream_window(&k, NULL, w + 2, two, 1, "c2", &fresh);
    CHECK_EQ(fresh, 0);
    CHECK_EQ(q->locations.n, 4); /* sent whole, then not kept */
    CHECK_EQ(cp_streams_kept(), 0);
    cp_profile_destroy(q);
    q = stream_window(&k, NULL, w + 3, one, 1, "c3", &fresh);
    CHECK_EQ(fresh, 1); /* numbered from 1 again */
    CHECK_EQ(q->locations.n, 1);
    CHECK_EQ(q->stack.v[0], 1);
    cp_profile_destroy(q);

    /* bytes: a bound below the smallest stream keeps nothing */
    cp_streams_set_bounds(CP_STREAMS_MAX, 100, 8);
    q = stream_window(&k, NULL, w, four, 1, "c4", &fresh);
    CHECK_EQ(cp_streams_kept(), 0);
    cp_profile_destroy(q);

    /* two streams kept: the least recently used goes, for a stream of a later window */
    cp_streams_set_bounds(2, 100, CP_STREAM_MAX_BYTES);
    cp_stream_key k1 = {.thread = "a", .kind = 1}, k2 = {.thread = "b", .kind = 1},
                  k3 = {.thread = "a", .kind = 2};
    cp_profile_destroy(stream_window(&k1, NULL, w, one, 1, "x", &fresh));
    cp_profile_destroy(stream_window(&k2, NULL, w, one, 1, "x", &fresh));
    cp_streams_window_done();
    cp_profile_destroy(stream_window(&k1, NULL, w, one, 1, "x", &fresh));
    CHECK_EQ(fresh, 0);
    cp_streams_window_done();
    cp_profile_destroy(stream_window(&k3, NULL, w, one, 1, "x", &fresh)); /* evicts b */
    CHECK_EQ(fresh, 1);
    CHECK_EQ(cp_streams_kept(), 2);
    cp_streams_window_done();
    cp_profile_destroy(stream_window(&k1, NULL, w, one, 1, "x", &fresh));
    CHECK_EQ(fresh, 0);
    cp_profile_destroy(stream_window(&k2, NULL, w, one, 1, "x", &fresh));
    CHECK_EQ(fresh, 1);
    cp_streams_window_done();
    /* three streams in every window, two slots: the two kept continue their epochs (plain
     * least-recently-used would evict each one just before its turn) */
    cp_streams_reset();
    for (int win = 0; win < 3; win++) {
        cp_profile_destroy(stream_window(&k1, NULL, w, one, 1, "x", &fresh));
        CHECK_EQ(fresh, win == 0);
        cp_profile_destroy(stream_window(&k2, NULL, w, one, 1, "x", &fresh));
        CHECK_EQ(fresh, win == 0);
        cp_profile_destroy(stream_window(&k3, NULL, w, one, 1, "x", &fresh));
        CHECK_EQ(fresh, 1);
        CHECK_EQ(cp_streams_kept(), 2);
        cp_streams_window_done();
    }
    /* 0 streams keeps none */
    cp_streams_set_bounds(0, 100, CP_STREAM_MAX_BYTES);
    cp_profile_destroy(stream_window(&k1, NULL, w, one, 1, "x", &fresh));
    cp_profile_destroy(stream_window(&k1, NULL, w, one, 1, "x", &fresh));
    CHECK_EQ(fresh, 1);
    CHECK_EQ(cp_streams_kept(), 0);

    /* an isolate's epoch goes with the isolate (its slot may serve another one) */
    cp_streams_set_bounds(CP_STREAMS_MAX, 100, CP_STREAM_MAX_BYTES);
    contprof_isolate *iso = contprof_isolate_create("epoch", NULL);
    CHECK(iso != NULL);
    cp_stream_key ki = {.iso = iso->id, .kind = 1};
    cp_profile_destroy(stream_window(&ki, NULL, w, one, 1, "x", &fresh));
    cp_profile_destroy(stream_window(&k1, NULL, w, one, 1, "x", &fresh));
    cp_streams_window_done();
    CHECK_EQ(cp_streams_kept(), 2);
    contprof_isolate_destroy(iso);
    cp_streams_window_done();
    CHECK_EQ(cp_streams_kept(), 1);
    cp_isolates_reap();
    cp_streams_reset();
}

/* A copy of the current module snapshot with other dl_iterate_phdr counters. */
static cp_modules *mods_copy(uint64_t dadds, uint64_t dsubs)
{
    const cp_modules *m = cp_modules_current();
    size_t len = sizeof(cp_modules) + m->n * sizeof(cp_module);
    cp_modules *c = malloc(len);
    CHECK(c != NULL);
    memcpy(c, m, len);
    c->adds += dadds;
    c->subs += dsubs;
    return c;
}

TEST(epochs_follow_modules)
{
    cp_streams_set_bounds(CP_STREAMS_MAX, 100, CP_STREAM_MAX_BYTES);
    CHECK_EQ(cp_modules_refresh(1), 0);
    uint64_t pc = (uint64_t)(uintptr_t)&unit_caller_of_qsort + 1;
    cp_stream_key k = {.thread = "t", .kind = 1};
    int fresh;
    int64_t v = 1;
    cp_modules *same = mods_copy(0, 0), *loaded = mods_copy(1, 0), *unloaded = mods_copy(1, 1);
    const cp_modules *seq[] = {cp_modules_current(), same, loaded, unloaded};
    const int want_fresh[] = {1, 0, 0, 1}; /* a load keeps the epoch, an unload ends it */
    for (int i = 0; i < 4; i++) {
        cp_stream *s = cp_streams_begin(&k, seq[i], NULL, NULL, &fresh);
        CHECK(s != NULL);
        CHECK_EQ(fresh, want_fresh[i]);
        if (fresh)
            CHECK_EQ(cp_profile_add_sample_type(cp_stream_profile(s), "samples", "count"), 0);
        cp_stream_add_sample(s, &pc, 1, &v);
        CHECK_EQ(cp_stream_seal(s), 0);
        CHECK_EQ(cp_stream_profile(s)->locations.n, 1);
        cp_streams_end(s, 1);
    }
    cp_streams_reset();
    free(same);
    free(loaded);
    free(unloaded);
}

/* ------------------------------------------------------------------------------------
 * Node's Worker objects (nodeworker.c): Node 20's layout, as seen with gdb in node
 * v20.20.2, built here in memory: a std::string at X - 0x38, threadId at X - 0x10, name_
 * at X. */

typedef struct fake_string {
    uint64_t p, len;
    union {
        char buf[16];
        uint64_t cap;
    } u;
} fake_string;

/* A Worker-like object with name (NULL: a heap name from heap_name) at offset 0x108. */
static void fake_worker(uint8_t *obj, size_t n, uint64_t tid, const char *name,
                        const char *heap_name)
{
    memset(obj, 0xab, n); /* not zero: nothing is found by accident of zeroes */
    fake_string err = {(uintptr_t)obj + 0xd0 + 16, 0, {{0}}};
    memcpy(obj + 0xd0, &err, sizeof(err));
    memcpy(obj + 0xf8, &tid, 8);
    fake_string nm = {0};
    if (name) {
        nm.p = (uintptr_t)obj + 0x108 + 16;
        nm.len = strlen(name);
        memcpy(nm.u.buf, name, nm.len + 1);
    } else {
        nm.p = (uintptr_t)heap_name;
        nm.len = strlen(heap_name);
        nm.u.cap = nm.len;
    }
    memcpy(obj + 0x108, &nm, sizeof(nm));
}

static int read_mem(uintptr_t addr, void *buf, uint32_t n)
{
    memcpy(buf, (const void *)addr, n);
    return 0;
}

TEST(node_worker_objects_read_defensively)
{
    CHECK(cp_nodeworker_is_start("node::worker::Worker::StartThread(v8::FunctionCallbackInfo<"
                                 "v8::Value> const&)::{lambda(void*)#1}::_FUN(void*)"));
    CHECK(cp_nodeworker_is_start(
        "_ZZN4node6worker6Worker11StartThreadERKN2v820FunctionCallbackInfoINS2_5ValueEEEENUlPvE_"
        "4_FUNES8_"));
    CHECK(!cp_nodeworker_is_start("node::worker::Worker::StartThread(v8::FunctionCallbackInfo<"
                                  "v8::Value> const&)"));
    CHECK(!cp_nodeworker_is_start("uv__thread_start"));
    CHECK(!cp_nodeworker_is_start(NULL));

    static _Alignas(16) uint8_t obj[0x200];
    char label[16];
    fake_worker(obj, sizeof(obj), 1, "alpha", NULL);
    CHECK_EQ(cp_nodeworker_label_from(obj, sizeof(obj), (uintptr_t)obj, read_mem, label), 0);
    CHECK_STREQ(label, "alpha");
    /* the same through process_vm_readv */
    memset(label, 0, sizeof(label));
    CHECK_EQ(cp_nodeworker_label((uintptr_t)obj, label), 0);
    CHECK_STREQ(label, "alpha");
    /* no name, and newer Nodes' default: Node's threadId */
    fake_worker(obj, sizeof(obj), 3, "", NULL);
    CHECK_EQ(cp_nodeworker_label_from(obj, sizeof(obj), (uintptr_t)obj, read_mem, label), 0);
    CHECK_STREQ(label, "worker-3");
    fake_worker(obj, sizeof(obj), 12, "WorkerThread", NULL);
    CHECK_EQ(cp_nodeworker_label_from(obj, sizeof(obj), (uintptr_t)obj, read_mem, label), 0);
    CHECK_STREQ(label, "worker-12");
    /* a long name on the heap, cut to 15 bytes, never inside a UTF-8 character */
    static const char long_name[] = "image-resizer-\xc3\xa9t\xc3\xa9-pool";
    fake_worker(obj, sizeof(obj), 2, NULL, long_name);
    CHECK_EQ(cp_nodeworker_label_from(obj, sizeof(obj), (uintptr_t)obj, read_mem, label), 0);
    CHECK_STREQ(label, "image-resizer-");
    CHECK_EQ(cp_nodeworker_label((uintptr_t)obj, label), 0);
    CHECK_STREQ(label, "image-resizer-");
    /* shapes that are not Node 20's Worker: another layout, no label */
    fake_worker(obj, sizeof(obj), 0, "alpha", NULL); /* threadId 0 */
    CHECK_EQ(cp_nodeworker_label_from(obj, sizeof(obj), (uintptr_t)obj, read_mem, label),
             CP_ENOTFOUND);
    fake_worker(obj, sizeof(obj), 1, "al\x01pha", NULL); /* a control byte */
    CHECK_EQ(cp_nodeworker_label_from(obj, sizeof(obj), (uintptr_t)obj, read_mem, label),
             CP_ENOTFOUND);
    fake_worker(obj, sizeof(obj), 1, "alpha", NULL);
    uint64_t bad = 99; /* a short string's length past its buffer */
    memcpy(obj + 0x108 + 8, &bad, 8);
    CHECK_EQ(cp_nodeworker_label_from(obj, sizeof(obj), (uintptr_t)obj, read_mem, label),
             CP_ENOTFOUND);
    memset(obj, 0, sizeof(obj));
    CHECK_EQ(cp_nodeworker_label_from(obj, sizeof(obj), (uintptr_t)obj, read_mem, label),
             CP_ENOTFOUND);
    /* cut short: the fields past the end are not read */
    fake_worker(obj, sizeof(obj), 1, "alpha", NULL);
    CHECK_EQ(cp_nodeworker_label_from(obj, 0x110, (uintptr_t)obj, read_mem, label), CP_ENOTFOUND);
    /* unmapped memory is an error, never a fault; a heap name pointing there is skipped */
    CHECK_EQ(cp_nodeworker_label(4096, label), CP_EIO);
    fake_worker(obj, sizeof(obj), 1, NULL, "a-name-longer-than-15");
    uint64_t nowhere = 4096;
    memcpy(obj + 0x108, &nowhere, 8);
    CHECK_EQ(cp_nodeworker_label((uintptr_t)obj, label), CP_ENOTFOUND);
}

/* The capture poller (watch.c), on its own thread: an answer is handed on once however
 * many polls repeat it, a changed one whole; cp_watch_poll and cp_watch_destroy never wait
 * for a slow server; destroyed with a request in flight, it lets go (ASan: no leak, no use
 * after free). */
static int g_handed;
static atomic_int g_woken;

static void count_handed(const uint8_t *v, size_t len, void *arg)
{
    (void)v, (void)len, (void)arg;
    g_handed++;
}

static void count_woken(void *arg)
{
    (void)arg;
    atomic_fetch_add(&g_woken, 1);
}

static int64_t mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Polls w until g_handed reaches want and the server was asked at least asked times. */
static void poll_until(cp_watch *w, fake_contprofd *f, int want, int asked)
{
    for (int64_t end = mono_now() + 10 * (int64_t)1000000000;; usleep(20000)) {
        cp_watch_poll(w, count_handed, NULL);
        pthread_mutex_lock(&f->mu);
        int n = f->control_requests;
        pthread_mutex_unlock(&f->mu);
        if (g_handed >= want && n >= asked) return;
        CHECK(mono_now() < end);
    }
}

TEST(watch_poller_hands_each_answer_once)
{
    fake_contprofd f;
    fake_contprofd_start(&f, "unused:1");
    cp_capture c = {.id = "one",
                    .tenant = "default",
                    .kind = CP_KIND_CPU,
                    .cpu_hz = 1000,
                    .max_overhead_permille = 20};
    c.selector = (char *)"{isolate=\"a\"}";
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    c.start_ns = (int64_t)now.tv_sec * 1000000000;
    c.end_ns = c.start_ns + 120 * (int64_t)1000000000;
    cp_buf list = {0};
    CHECK(cp_capture_feed_append(&list, &c, NULL) == 0);
    fake_contprofd_control(&f, 200, list.data, list.len, 0);
    cp_watch *w = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_watch_create(f.url, NULL, "127.0.0.1:1", NULL, count_woken, NULL, &w, &err), 0);
    poll_until(w, &f, 1, 4); /* four polls of one answer: handed once */
    CHECK_EQ(g_handed, 1);
    CHECK(atomic_load(&g_woken) >= 1);
    snprintf(c.id, sizeof c.id, "two");
    CHECK(cp_capture_feed_append(&list, &c, NULL) == 0);
    fake_contprofd_control(&f, 200, list.data, list.len, 0);
    poll_until(w, &f, 3, 0); /* the changed answer, whole: one and two */
    CHECK_EQ(g_handed, 3);
    /* both cancelled: the server lists neither, and the empty answer is handed on as a
     * whole list, so the agent ends what it no longer hears of (issue 36) */
    fake_contprofd_control(&f, 200, list.data, 0, 0);
    for (int64_t end = mono_now() + 10 * (int64_t)1000000000;; usleep(20000)) {
        int h = cp_watch_poll(w, count_handed, NULL);
        if (cp_watch_was_whole(w)) {
            CHECK_EQ(h, 0);
            break;
        }
        CHECK(mono_now() < end);
    }
    /* a server that takes 800 ms: the agent thread's calls return at once */
    int n0 = fake_contprofd_control(&f, 200, list.data, list.len, 800);
    for (int64_t end = mono_now() + 5 * (int64_t)1000000000;; usleep(10000)) {
        pthread_mutex_lock(&f.mu);
        int n = f.control_requests;
        pthread_mutex_unlock(&f.mu);
        if (n > n0) break; /* a request in flight */
        CHECK(mono_now() < end);
    }
    int64_t t0 = mono_now();
    cp_watch_poll(w, count_handed, NULL);
    cp_watch_destroy(w);
    int64_t took = mono_now() - t0;
    printf("poll and destroy with a request in flight: %.3f ms\n", took / 1e6);
    CHECK(took < 100000000);
    usleep(1500000); /* the thread ends its request and lets go */
    fake_contprofd_stop(&f);
    cp_buf_close(&list);
}

TEST_MAIN(T(unwind_through_libc), T(unwind_stays_in_bounds), T(unwind_copy_of_stack),
          T(modules_have_build_ids), T(config_from_env), T(config_durations),
          T(isolate_lang_frames), T(kafka_backlog_drops_oldest), T(epochs_keep_tables_symbolized),
          T(epochs_keep_tables_unsymbolized), T(epochs_bounded), T(epochs_follow_modules),
          T(node_worker_objects_read_defensively), T(watch_poller_hands_each_answer_once))
