/* Unit tests of collector modules called directly (no interposition, so they also run in
 * the ASan+UBSan build): the CFI unwinder through libc code without frame pointers, the
 * configuration parser, the Kafka backlog with no reachable broker, and the brokers
 * lookup over HTTP. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <search.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "collector_int.h"
#include "kafka.h"
#include "test.h"
#include "unwind.h"

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
    CHECK_EQ(cp_parse_duration_ms("10s"), 10000);
    CHECK_EQ(cp_parse_duration_ms("250ms"), 250);
    CHECK_EQ(cp_parse_duration_ms("2m"), 120000);
    CHECK_EQ(cp_parse_duration_ms("1500"), 1500);
    CHECK_EQ(cp_parse_duration_ms("abc"), -1);
    CHECK_EQ(cp_parse_duration_ms("5 s"), -1);
    setenv("CONTPROF_SERVICE", "checkout", 1);
    setenv("CONTPROF_CPU_HZ", "5000", 1);
    setenv("CONTPROF_WINDOW", "3s", 1);
    setenv("CONTPROF_ALLOC_RATE", "-1", 1);
    cp_config c;
    cp_config_load(&c, NULL);
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
    cp_config_load(&c, NULL);
    CHECK_EQ(c.cpu_engine, CP_ENGINE_PERF);
    setenv("CONTPROF_CPU_ENGINE", "timer", 1);
    cp_config_load(&c, NULL);
    CHECK_EQ(c.cpu_engine, CP_ENGINE_TIMER);
    setenv("CONTPROF_CPU_ENGINE", "auto", 1);
    cp_config_load(&c, NULL);
    CHECK_EQ(c.cpu_engine, CP_ENGINE_AUTO);
    unsetenv("CONTPROF_CPU_ENGINE");
    setenv("CONTPROF_KAFKA_SECURITY_PROTOCOL", "SASL_SSL", 1);
    setenv("CONTPROF_KAFKA_QUEUE", "64", 1); /* the agent's own, not a Kafka property */
    cp_config_load(&c, NULL);
    CHECK_STREQ(c.kafka_props, "security.protocol=SASL_SSL\n");
    CHECK_EQ(c.kafka_queue, 64);
    unsetenv("CONTPROF_KAFKA_SECURITY_PROTOCOL");
    unsetenv("CONTPROF_KAFKA_QUEUE");
    contprof_options o = {.service = "api", .cpu_hz = 99, .window_ms = 500};
    cp_config_load(&c, &o);
    CHECK_STREQ(c.service, "api"); /* options win over the environment */
    CHECK_EQ(c.cpu_hz, 99);
    CHECK_EQ(c.window_ns, 500000000LL);
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
    char err[256];
    /* properties from CONTPROF_KAFKA_* reach librdkafka, which names a bad one */
    CHECK(cp_kafka_create("127.0.0.1:1", "t", 8, "socket.timeout.ms=5000\nno.such.property=1\n", &k,
                          err, sizeof(err)) == CP_EKAFKA);
    CHECK(strstr(err, "no.such.property") != NULL);
    CHECK(cp_kafka_create("127.0.0.1:1", "contprof.profiles", 8, "socket.timeout.ms=5000\n", &k, err,
                          sizeof(err)) == 0);
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

TEST_MAIN(T(unwind_through_libc), T(unwind_stays_in_bounds), T(modules_have_build_ids),
          T(config_from_env), T(kafka_backlog_drops_oldest))
