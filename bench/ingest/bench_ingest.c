/* Ingest benchmark: realistic 10 s CPU windows (2,000 distinct stacks of depth 10-60 in the
 * service, 1,000 samples per window, raw pprof in the envelope and lz4 on the topic, as
 * the agent sends them) produced to the embedded broker (librdkafka mock cluster) and
 * consumed by cp_ingest into a store with synced LevelDB writes. Also the same decode +
 * store path on one thread without Kafka, for gzip'd and raw payloads.
 *   bench_ingest DIR [WINDOWS [direct|direct-raw|transport|kafka]]   (only that part, for
 *   profiling; direct-raw: the raw payloads of the direct part)
 * With CP_BENCH_UNSYMBOLIZED=1 the windows are as CONTPROF_SYMBOLIZE=server sends them:
 * addresses and a mapping with a build ID, no functions or lines.
 * Prints key value lines, and for the Kafka runs the CPU per window of each thread (by
 * name: ingest names its threads cp-ingest and cp-decodeN). */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "broker.h"
#include "envelope.h"
#include "ingest.h"
#include "pprof.h"
#include "store.h"
#include "synth.h"
#include "clock.h"

#define T0 1704067200000000000LL
#define SEC 1000000000LL
#define NDISTINCT 32
#define NSERIES 8
#define STALL_S 60

/* one instance's encodings of the distinct windows it sends (the others stay empty) */
static cp_buf payload[NSERIES][NDISTINCT], rawload[NSERIES][NDISTINCT];
static int use_raw;
static long nwin;
static cp_ingest *ing;
static const char *bootstraps;
static const char *self; /* argv[0], to start the producer */

static double proc_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static void envelope_for(long i, cp_buf *enc, cp_buf *key)
{
    cp_envelope e = {0};
    char inst[16];
    snprintf(inst, sizeof inst, "i%ld", i % NSERIES);
    e.tenant = "default";
    cp_labels_set(&e.labels, "service", "bench");
    cp_labels_set(&e.labels, "instance", inst);
    e.kind = CP_KIND_CPU;
    e.window_start_ns = T0 + (i / NSERIES) * 10 * SEC;
    e.window_duration_ns = 10 * SEC;
    e.producer_id = inst;
    e.sequence = (uint64_t)(i / NSERIES);
    const cp_buf *pl = use_raw ? rawload[i % NSERIES] : payload[i % NSERIES];
    e.pprof = pl[(i * 7) % NDISTINCT].data;
    e.pprof_len = pl[(i * 7) % NDISTINCT].len;
    enc->len = key->len = 0;
    cp_envelope_encode(&e, enc);
    cp_envelope_series_key(&e, key);
    cp_labels_close(&e.labels);
}

/* The agents' side, in a child process of its own (`bench_ingest --produce BOOTSTRAPS N`)
 * so that its CPU (building envelopes, librdkafka's lz4 compression) is not counted as
 * ingest's. It produces N envelopes, staying at most 64 ahead of the consumer, whose
 * progress the parent writes to stdin as one line per count: the mock cluster keeps only
 * about 5 MiB per partition. */
static int produce_main(const char *brokers, long n)
{
    char es[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", brokers, es, sizeof es);
    rd_kafka_conf_set(c, "linger.ms", "2", es, sizeof es);
    rd_kafka_conf_set(c, "compression.type", "lz4", es, sizeof es); /* as the agent does */
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, es, sizeof es);
    if (!rk) {
        fprintf(stderr, "bench_ingest producer: %s\n", es);
        return 1;
    }
    cp_buf enc = {0}, key = {0};
    long consumed = 0;
    char line[64];
    for (long i = 0; i < n; i++) {
        while (consumed + 64 <= i) {
            rd_kafka_poll(rk, 0);
            if (!fgets(line, sizeof line, stdin)) return 1; /* the parent went away */
            consumed = atol(line);
        }
        envelope_for(i, &enc, &key);
        while (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(CP_TOPIC_PROFILES),
                                 RD_KAFKA_V_VALUE(enc.data, enc.len),
                                 RD_KAFKA_V_KEY(key.data, key.len),
                                 RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END))
            rd_kafka_poll(rk, 10);
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_flush(rk, 60000);
    rd_kafka_destroy(rk);
    cp_buf_close(&enc);
    cp_buf_close(&key);
    return 0;
}

/* The window as CONTPROF_SYMBOLIZE=server sends it: the same samples, locations with
 * addresses only, in the mappings of four objects (the PIE executable, libstdc++, libm,
 * libc; each with a build ID, no HAS_* flags), canonical (start = file offset, as the
 * agent's cp_profile_canonicalize leaves them); a string table of the sample types, file
 * names and build IDs only. Returns NULL on out of memory. */
static cp_profile *unsymbolized(const cp_profile *w)
{
    static const struct {
        const char *file, *build_id;
        uint64_t offset;
    } obj[4] = {
        {"/usr/bin/service", "5f0c3e1a9b7d2c4e6f8a0b1c2d3e4f5a6b7c8d9e", 0x5000},
        {"/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30",
         "e2a3c0ffee0123456789abcdef0123456789abcd", 0x9a000},
        {"/usr/lib/x86_64-linux-gnu/libm.so.6", "0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c", 0xe000},
        {"/usr/lib/x86_64-linux-gnu/libc.so.6", "82ce4e6e4ef08fa58a3535f7437bd3e592db5ac0",
         0x26000},
    };
    cp_profile *u = cp_profile_create();
    if (!u) return NULL;
    for (uint32_t t = 0; t < w->sample_types.n; t++)
        if (cp_profile_add_sample_type(u, cp_profile_str(w, w->sample_types.v[t].type),
                                       cp_profile_str(w, w->sample_types.v[t].unit)))
            goto fail;
    if (cp_profile_intern_cstr(u, cp_profile_str(w, w->period_type.type), &u->period_type.type) ||
        cp_profile_intern_cstr(u, cp_profile_str(w, w->period_type.unit), &u->period_type.unit))
        goto fail;
    u->period = w->period;
    u->time_nanos = w->time_nanos;
    u->duration_nanos = w->duration_nanos;
    uint32_t mid[4];
    for (int i = 0; i < 4; i++) {
        cp_mapping m = {
            .start = obj[i].offset, .limit = obj[i].offset + 0x2000000, .offset = obj[i].offset};
        if (cp_profile_intern_cstr(u, obj[i].file, &m.filename) ||
            cp_profile_intern_cstr(u, obj[i].build_id, &m.build_id) ||
            cp_profile_add_mapping(u, &m, &mid[i]))
            goto fail;
    }
    /* ids stay as in w: location i + 1 of w is location i + 1 of u. A frame's object
     * follows from the frame (its address), not from its place in this window's table:
     * the same frame is in the same object in every window, as in a real process. */
    for (uint32_t i = 0; i < w->locations.n; i++) {
        uint64_t f = w->locations.v[i].address >> 12;
        int o = f % 8 < 5 ? 0 : f % 8 < 7 ? 1 + (int)(f % 2) : 3;
        uint32_t id;
        if (cp_profile_add_location(u, obj[o].offset + (w->locations.v[i].address & 0xffffff),
                                    mid[o], NULL, 0, &id))
            goto fail;
    }
    for (uint32_t i = 0; i < w->samples.n; i++) {
        const cp_sample *s = &w->samples.v[i];
        if (cp_profile_add_sample(u, w->stack.v + s->loc_off, s->nlocs,
                                  cp_profile_sample_values(w, i), NULL, 0))
            goto fail;
    }
    return u;
fail:
    cp_profile_destroy(u);
    return NULL;
}

/* The payloads: the synthetic service's NDISTINCT windows (symbolized, or unsymbolized
 * with CP_BENCH_UNSYMBOLIZED=1), each instance numbering its own stream's tables as the
 * agent does, in its steady state: its epoch has already seen every frame of the windows it
 * sends (a first pass over them), so each window lists them all. CP_BENCH_FRESH_IDS=1 numbers
 * every window on its own instead (the agent before stable tables: no window shares bytes
 * of ids with the previous one). */
static void make_payloads(void)
{
    const char *u = getenv("CP_BENCH_UNSYMBOLIZED"), *fr = getenv("CP_BENCH_FRESH_IDS");
    int unsym = u && strcmp(u, "1") == 0, fresh = fr && strcmp(fr, "1") == 0;
    cp_synth *sy = cp_synth_create(42, 2000);
    cp_profile *w[NDISTINCT];
    for (int i = 0; i < NDISTINCT; i++) {
        w[i] = cp_synth_cpu_window(sy, 1000, T0, 10 * SEC);
        if (w[i] && unsym) {
            cp_profile *uw = unsymbolized(w[i]);
            cp_profile_destroy(w[i]);
            w[i] = uw;
        }
        if (!w[i]) goto nomem;
    }
    cp_synth_destroy(sy);
    for (int k = 0; k < NSERIES; k++) {
        cp_profile *e = cp_profile_create();
        if (!e) goto nomem;
        for (uint32_t t = 0; t < w[0]->sample_types.n; t++)
            if (cp_profile_add_sample_type(e, cp_profile_str(w[0], w[0]->sample_types.v[t].type),
                                           cp_profile_str(w[0], w[0]->sample_types.v[t].unit)))
                goto nomem;
        if (cp_profile_intern_cstr(e, cp_profile_str(w[0], w[0]->period_type.type),
                                   &e->period_type.type) ||
            cp_profile_intern_cstr(e, cp_profile_str(w[0], w[0]->period_type.unit),
                                   &e->period_type.unit))
            goto nomem;
        e->period = w[0]->period;
        for (int pass = fresh ? 1 : 0; pass < 2; pass++)
            for (int j = 0; j < NDISTINCT; j++) {
                int d = (j * NSERIES + k) * 7 % NDISTINCT; /* the windows instance k sends */
                if (pass == 1 && payload[k][d].len) continue;
                if (cp_synth_stream_add(e, w[d])) goto nomem;
                e->time_nanos = w[d]->time_nanos;
                e->duration_nanos = w[d]->duration_nanos;
                if (pass == 1) {
                    cp_pprof_encode(fresh ? w[d] : e, 6, &payload[k][d]);
                    cp_pprof_encode(fresh ? w[d] : e, 0, &rawload[k][d]);
                }
                cp_profile_next_window(e, e->strs.off.n);
            }
        cp_profile_destroy(e);
    }
    for (int i = 0; i < NDISTINCT; i++)
        cp_profile_destroy(w[i]);
    return;
nomem:
    fprintf(stderr, "bench_ingest: out of memory\n");
    exit(1);
}

/* Mean bytes of the payloads made. */
static double mean_len(cp_buf (*pl)[NDISTINCT])
{
    double sum = 0;
    int n = 0;
    for (int k = 0; k < NSERIES; k++)
        for (int i = 0; i < NDISTINCT; i++)
            if (pl[k][i].len) {
                sum += (double)pl[k][i].len;
                n++;
            }
    return n ? sum / n : 0;
}

/* CPU seconds of each of this process's threads, by thread id, with its name ("main" for
 * the bench's own thread, which polls the stats; LevelDB's background thread keeps the
 * process's name). */
#define MAX_THREADS 64
typedef struct thread_cpu {
    int tid;
    char name[24];
    double cpu;
} thread_cpu;

static int threads_snap(thread_cpu *t)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;
    while (d && (de = readdir(d)) && n < MAX_THREADS) {
        if (de->d_name[0] == '.') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        char *open = strchr(buf, '('), *close = strrchr(buf, ')');
        unsigned long ut = 0, st = 0;
        if (!open || !close || close - open - 1 >= (long)sizeof t[n].name ||
            sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
            continue;
        t[n].tid = atoi(de->d_name);
        if (t[n].tid == (int)getpid()) {
            strcpy(t[n].name, "main");
        } else {
            memcpy(t[n].name, open + 1, (size_t)(close - open - 1));
            t[n].name[close - open - 1] = 0;
            for (char *c = t[n].name; *c; c++)
                if (*c == ' ') *c = '_';
        }
        t[n].cpu = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
        n++;
    }
    if (d) closedir(d);
    return n;
}

/* CPU seconds of this process's threads whose name starts with prefix (librdkafka names
 * the mock cluster's thread "rdk:mock"). */
static double threads_cpu_s(const char *prefix)
{
    thread_cpu t[MAX_THREADS];
    int n = threads_snap(t);
    double sum = 0;
    for (int i = 0; i < n; i++)
        if (!strncmp(t[i].name, prefix, strlen(prefix))) sum += t[i].cpu;
    return sum;
}

/* One timed run through Kafka: from the first message consumed to the last. */
typedef struct run {
    long counted;      /* messages after the first */
    double wall, cpu;  /* seconds; cpu = this whole process */
    double broker_cpu; /* of which the embedded broker's thread */
    /* CPU in the run by thread name (summed over its threads) */
    thread_cpu th[MAX_THREADS];
    int nth;
} run;

/* r->th: each thread's CPU now less its CPU in a (a thread started since counts from 0),
 * summed by name. */
static void threads_delta(run *r, const thread_cpu *a, int na)
{
    thread_cpu b[MAX_THREADS];
    int nb = threads_snap(b);
    r->nth = 0;
    for (int i = 0; i < nb; i++) {
        double cpu = b[i].cpu;
        for (int j = 0; j < na; j++)
            if (a[j].tid == b[i].tid) cpu -= a[j].cpu;
        int k = 0;
        while (k < r->nth && strcmp(r->th[k].name, b[i].name))
            k++;
        if (k == r->nth) {
            r->th[k] = b[i];
            r->th[k].cpu = 0;
            r->nth++;
        }
        r->th[k].cpu += cpu;
    }
}

/* A step of the consuming side: does some work (or waits a little), then returns the
 * messages consumed so far, or -1 on failure. */
typedef long (*step_fn)(void *arg);

/* Starts the agents' side in a child process and runs step until nwin messages are
 * consumed, telling the child how far the consumer is; then finish (if any) is timed too.
 * No progress for STALL_S seconds fails the run (describe, if any, says where it stood). */
static int drive(const char *brokers, step_fn step, void (*finish)(void *),
                 void (*describe)(void *), void *arg, run *r)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --produce '%s' %ld", self, brokers, nwin);
    signal(SIGPIPE, SIG_IGN);     /* the producer exits once it has sent everything */
    FILE *prod = popen(cmd, "w"); /* its stdin: our progress */
    if (!prod) {
        fprintf(stderr, "bench_ingest: cannot start the producer\n");
        return -1;
    }
    long told = -1, m0 = -1, done;
    double start = 0, cstart = 0, bstart = 0;
    thread_cpu tstart[MAX_THREADS];
    int ntstart = 0;
    /* the clock starts with the first message (joining the group takes seconds) */
    double moved = now_s();
    while ((done = step(arg)) >= 0 && done < nwin) {
        if (done != told) moved = now_s();
        if (now_s() - moved > STALL_S) { /* a hang must fail the bench, not stop it */
            fprintf(stderr, "bench_ingest: no progress for %d s at %ld of %ld messages\n", STALL_S,
                    done, nwin);
            if (describe) describe(arg);
            done = -1;
            break;
        }
        if (m0 < 0 && done > 0) {
            start = now_s();
            cstart = proc_cpu();
            bstart = threads_cpu_s("rdk:mock");
            ntstart = threads_snap(tstart);
            m0 = done;
        }
        if (done != told) {
            fprintf(prod, "%ld\n", done);
            fflush(prod);
            told = done;
        }
    }
    threads_delta(r, tstart, ntstart); /* before finish stops (and ends) threads */
    double cfinish = proc_cpu();
    if (finish) finish(arg);
    r->wall = now_s() - start;
    r->cpu = proc_cpu() - cstart;
    r->broker_cpu = threads_cpu_s("rdk:mock") - bstart;
    if (r->nth < MAX_THREADS) { /* the last batch's write, the threads' ends */
        snprintf(r->th[r->nth].name, sizeof r->th[r->nth].name, "stop");
        r->th[r->nth++].cpu = proc_cpu() - cfinish;
    }
    r->counted = nwin - m0;
    if (pclose(prod) != 0 || done < 0) {
        fprintf(stderr, "bench_ingest: %s failed\n", done < 0 ? "the consumer" : "the producer");
        return -1;
    }
    return 0;
}

static void report(const char *name, const run *r)
{
    printf("%s_windows_per_s %.0f\n", name, (double)r->counted / r->wall);
    /* the whole process: consumer, librdkafka, the embedded broker, the store (the
     * agents' side runs in the child) */
    printf("%s_windows_per_cpu_s %.0f\n", name, (double)r->counted / r->cpu);
    /* without the embedded broker's thread: in production the broker is another machine */
    printf("%s_windows_per_cpu_s_nobroker %.0f\n", name,
           (double)r->counted / (r->cpu - r->broker_cpu));
    /* where the CPU went: microseconds per window, by thread name */
    for (int i = 0; i < r->nth; i++)
        if (r->th[i].cpu > 0)
            printf("%s_thread_us_per_window:%s %.1f\n", name, r->th[i].name,
                   1e6 * r->th[i].cpu / (double)r->counted);
}

/* The transport alone: a consumer in its own group that reads and drops every message. */
typedef struct transport {
    rd_kafka_t *rk;
    long got;
} transport;

static int transport_open(transport *t, const char *brokers, cp_err *err)
{
    char es[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", brokers, es, sizeof es);
    rd_kafka_conf_set(c, "group.id", "bench-transport", es, sizeof es);
    rd_kafka_conf_set(c, "auto.offset.reset", "earliest", es, sizeof es);
    rd_kafka_conf_set(c, "fetch.wait.max.ms", "50", es, sizeof es); /* as ingest */
    if (!(t->rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, es, sizeof es)))
        return cp_err_set(err, CP_EKAFKA, "transport consumer: %s", es);
    rd_kafka_poll_set_consumer(t->rk);
    rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(tl, CP_TOPIC_PROFILES, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(t->rk, tl);
    rd_kafka_topic_partition_list_destroy(tl);
    return e ? cp_err_set(err, CP_EKAFKA, "transport consumer: %s", rd_kafka_err2str(e)) : 0;
}

static long transport_step(void *arg)
{
    transport *t = arg;
    rd_kafka_message_t *m = rd_kafka_consumer_poll(t->rk, 10);
    if (m) {
        if (!m->err && m->len > 0) t->got++;
        rd_kafka_message_destroy(m);
    }
    return t->got;
}

static void transport_close(transport *t)
{
    rd_kafka_consumer_close(t->rk);
    rd_kafka_destroy(t->rk);
}

static long ingest_step(void *arg)
{
    cp_ingest_stats st;
    cp_ingest_get_stats(arg, &st);
    if (st.failed) {
        fprintf(stderr, "bench_ingest: %s\n", st.error);
        return -1;
    }
    usleep(5000); /* this thread's CPU counts as ingest's: wake up rarely */
    return (long)(st.messages + st.gap);
}

static void ingest_describe(void *arg)
{
    cp_ingest_stats st;
    cp_ingest_get_stats(arg, &st);
    fprintf(stderr,
            "bench_ingest: ingest at messages %llu windows %llu gap %llu skipped %llu "
            "duplicates %llu lag %lld partitions %u batches %llu\n",
            (unsigned long long)st.messages, (unsigned long long)st.windows,
            (unsigned long long)st.gap, (unsigned long long)st.skipped,
            (unsigned long long)st.duplicates, (long long)st.lag, st.partitions,
            (unsigned long long)st.batches);
}

static void ingest_finish(void *arg)
{
    cp_ingest_stop(arg); /* writes the last batch */
}

/* The store's stack cache: the share of samples found in it (lazy ids only). */
static void stack_cache_report(const char *name, cp_store *s)
{
    cp_store_stats st;
    cp_store_get_stats(s, &st);
    uint64_t n = st.stack_cache_hits + st.stack_cache_misses;
    printf("%s_stack_cache_hit_pct %.1f\n", name,
           n ? 100.0 * (double)st.stack_cache_hits / (double)n : 0.0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_ingest DIR [WINDOWS]\n");
        return 2;
    }
    if (!strcmp(argv[1], "--produce") && argc == 4) {
        use_raw = 1;
        make_payloads();
        return produce_main(argv[2], atol(argv[3]));
    }
    self = argv[0];
    cp_ingest_malloc_policy(); /* as contprofd */
    nwin = argc > 2 ? atol(argv[2]) : 3000;
    make_payloads();
    printf("gzip_bytes_per_window %.0f\n", mean_len(payload));
    printf("raw_bytes_per_window %.0f\n", mean_len(rawload));
    char path[512];
    cp_err err = {0};

    /* 1. decode + store on this thread, no Kafka: gzip'd payloads, then raw ones (an
     * agent may send raw pprof and let Kafka's lz4 compress the batch) */
    const char *mode = argc > 3 ? argv[3] : NULL;       /* one part only, for profiling */
    int raw_only = mode && !strcmp(mode, "direct-raw"); /* the raw half alone, for profiling */
    if (raw_only) mode = "direct";
    for (use_raw = raw_only; use_raw < 2 && (!mode || !strcmp(mode, "direct")); use_raw++) {
        snprintf(path, sizeof path, "%s/direct%d", argv[1], use_raw);
        cp_store_options so = {.path = path};
        cp_store *s = NULL;
        if (cp_store_open(&so, &s, &err)) goto fail;
        cp_store_batch *b = cp_store_batch_create(s);
        cp_pprof_decoder *dec = cp_pprof_decoder_create(NULL);
        cp_profile *p = cp_profile_create();
        cp_pprof_lazy lz = {0}; /* as ingest decodes */
        cp_buf enc = {0}, key = {0};
        long ndirect = nwin < 2000 ? nwin : 2000;
        double t0 = now_s(), c0 = thread_cpu_s();
        for (long i = 0; i < ndirect; i++) {
            envelope_for(i, &enc, &key);
            cp_envelope e;
            if (cp_envelope_decode_view(enc.data, enc.len, 64u << 20, &e, &err) ||
                cp_pprof_decoder_decode_lazy(dec, e.pprof, e.pprof_len, p, &lz, &err) ||
                cp_store_batch_add_lazy(b, &e, p, &lz, 0, &err))
                goto fail;
            cp_envelope_close(&e);
            if (i % 512 == 511 && cp_store_batch_commit(b, &err)) goto fail;
        }
        if (cp_store_batch_commit(b, &err)) goto fail;
        double t1 = now_s(), c1 = thread_cpu_s();
        printf("direct%s_windows %ld\n", use_raw ? "_raw" : "", ndirect);
        printf("direct%s_windows_per_s %.0f\n", use_raw ? "_raw" : "", (double)ndirect / (t1 - t0));
        printf("direct%s_windows_per_cpu_s %.0f\n", use_raw ? "_raw" : "",
               (double)ndirect / (c1 - c0));
        stack_cache_report(use_raw ? "direct_raw" : "direct", s);
        cp_pprof_lazy_close(&lz);
        cp_store_batch_destroy(b);
        cp_pprof_decoder_destroy(dec);
        cp_profile_destroy(p);
        cp_store_close(s);
        cp_buf_close(&enc);
        cp_buf_close(&key);
    }
    use_raw = 1; /* the agent sends raw pprof and lets Kafka's lz4 compress the batch */
    if (mode && !strcmp(mode, "direct")) return 0;

    /* 2. the transport alone: a plain consumer that drops what it reads (a baseline for
     * the row below: what librdkafka's fetch and lz4 cost before ingest does anything) */
    if (!mode || !strcmp(mode, "transport")) {
        cp_broker *br = NULL;
        if (cp_broker_create(NULL, &br, &err)) goto fail;
        transport t = {0};
        if (transport_open(&t, cp_broker_bootstraps(br), &err)) goto fail;
        run r;
        if (drive(cp_broker_bootstraps(br), transport_step, NULL, NULL, &t, &r)) return 1;
        report("transport", &r);
        transport_close(&t);
        cp_broker_destroy(br);
    }

    if (mode && !strcmp(mode, "transport")) return 0;

    /* 3. through Kafka into the store */
    cp_broker *br = NULL;
    if (cp_broker_create(NULL, &br, &err)) goto fail;
    bootstraps = cp_broker_bootstraps(br);
    snprintf(path, sizeof path, "%s/kafka", argv[1]);
    cp_store_options so = {.path = path};
    cp_store *s = NULL;
    if (cp_store_open(&so, &s, &err)) goto fail;
    cp_ingest_options io = {.brokers = bootstraps, .batch_max_messages = 512, .batch_max_ms = 200};
    const char *dt = getenv("CP_BENCH_DECODE_THREADS"); /* ingest's default: one per CPU */
    if (dt) io.decode_threads = (uint32_t)atoi(dt);
    if (cp_ingest_create(&io, s, &ing, &err) || cp_ingest_start(ing, &err)) goto fail;
    run r;
    if (drive(bootstraps, ingest_step, ingest_finish, ingest_describe, ing, &r)) return 1;
    cp_ingest_stats st;
    cp_ingest_get_stats(ing, &st);
    printf("kafka_windows %llu\n", (unsigned long long)st.windows);
    printf("kafka_batches %llu\n", (unsigned long long)st.batches);
    printf("kafka_gap %llu\n", (unsigned long long)st.gap);
    report("kafka", &r);
    stack_cache_report("kafka", s);
    cp_ingest_destroy(ing);
    cp_store_close(s);
    cp_broker_destroy(br);
    for (int k = 0; k < NSERIES; k++)
        for (int i = 0; i < NDISTINCT; i++) {
            cp_buf_close(&payload[k][i]);
            cp_buf_close(&rawload[k][i]);
        }
    return st.windows + st.gap == (uint64_t)nwin ? 0 : 1;
fail:
    fprintf(stderr, "bench_ingest: %s\n", err.msg);
    return 1;
}
