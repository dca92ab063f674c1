/* The agent's configuration: contprof_options, then CONTPROF_* variables, then defaults
 * (README.md "Environment"). Durations read model/times.h's grammar: a bare number is
 * seconds. A leaf: it knows nothing of the other modules. */
#ifndef CP_CONFIG_H
#define CP_CONFIG_H

#include <stdint.h>

#include "contprof.h"
#include "error.h"

/* CPU engines (CONTPROF_CPU_ENGINE): auto picks by rate (thread.c cp_cpu_start). */
enum { CP_ENGINE_AUTO, CP_ENGINE_PERF, CP_ENGINE_TIMER };

/* CONTPROF_DEBUGINFO: separate debug files (/usr/lib/debug/.build-id) read for nothing (0),
 * for function names only (unset: their symbol tables are small), or also for libdw's
 * file:line with CONTPROF_SYMBOLIZE=lines (1: their DWARF is large). */
enum { CP_DEBUGINFO_NONE, CP_DEBUGINFO_NAMES, CP_DEBUGINFO_ALL };

/* The default CONTPROF_SYMBOLIZE_BUDGET: 1% of the default 10 s window. */
#define CP_SYMBOLIZE_BUDGET_NS ((int64_t)100 * 1000000)

/* The shortest window, and the shortest bare number that CONTPROF_WINDOW refuses: every
 * bare number of 100 or more meant milliseconds before the agent read seconds (the old
 * reader clamped to 100 ms), so such a value would now silently mean a window of minutes
 * or hours. */
#define CP_WINDOW_MIN_NS ((int64_t)100 * 1000000)
#define CP_WINDOW_BARE_MAX 100

/* The longest CONTPROF_FLUSH: the program's exit waits that long for Kafka at most. */
#define CP_FLUSH_MAX_NS ((int64_t)3600 * 1000000000)

typedef struct cp_config {
    char service[128], version[128], tenant[64];
    char labels[1024];  /* "k=v,k=v" */
    int cpu_hz;         /* 0: off */
    int64_t alloc_rate; /* 0: off */
    int64_t window_ns;
    char brokers[1024], server[512], topic[256], output_dir[1024];
    char relay_dir[1024]; /* CONTPROF_RELAY: the host's relay (model/relay.h); wins over brokers */
    /* output_dir is the default (config.c default_output_dir), not CONTPROF_OUTPUT_DIR: made
     * if missing and checked more strictly (outdir.h) */
    int output_dir_default;
    char token[256]; /* CONTPROF_TOKEN: contprofd's bearer token (asking for the brokers) */
    int children;
    int captures;         /* CONTPROF_CAPTURES (default 1): watch the control topic (captable.c) */
    int python;           /* CONTPROF_PYTHON (default 1): walk CPython's frames (python.c) */
    int64_t flush_ns;     /* CONTPROF_FLUSH: bound on the Kafka flush at exit */
    int kafka_queue;      /* envelopes waiting in the agent plus librdkafka */
    int cpu_engine;       /* CONTPROF_CPU_ENGINE: CP_ENGINE_AUTO, _PERF or _TIMER */
    int symbolize_server; /* CONTPROF_SYMBOLIZE=server: no names, no libdw (window.c) */
    int symbolize_lines;  /* CONTPROF_SYMBOLIZE=lines: libdw, file:line and inline frames */
    int debuginfo;        /* CONTPROF_DEBUGINFO: CP_DEBUGINFO_* */
    int names_cache;      /* CONTPROF_NAMES_CACHE (default 1): the relay's names/ (namecache.h) */
    /* CONTPROF_SYMBOLIZE_BUDGET: the agent thread's CPU for naming pcs per window (0: no
     * bound); the pcs over it stay addresses for that window (window.c) */
    int64_t symbolize_budget_ns;
    /* librdkafka properties from CONTPROF_KAFKA_<NAME>=value (NAME lowercased, '_' -> '.';
     * e.g. CONTPROF_KAFKA_SECURITY_PROTOCOL=SASL_SSL), as "name=value\n" lines. */
    char kafka_props[4096];
} cp_config;

/* Fills c from opts (may be NULL) and the environment. Returns 0, or CP_EPARSE with err
 * (may be NULL) naming the variable and its value: a duration that model/times.h's grammar
 * refuses, a bare CONTPROF_WINDOW of CP_WINDOW_BARE_MAX or more (an old millisecond
 * value), CONTPROF_FLUSH over CP_FLUSH_MAX_NS, or CONTPROF_FLUSH_MS (renamed
 * CONTPROF_FLUSH). c is then unusable: the agent
 * does not start. Allocates nothing (the constructor calls it before main). */
int cp_config_load(cp_config *c, const contprof_options *opts, cp_err *err);

/* Reads variable name's value s as an agent duration (model/times.h's grammar, a bare
 * number is seconds) into *out_ns. bare_max > 0: a bare number of bare_max or more is
 * refused (see CP_WINDOW_BARE_MAX). Returns 0 or CP_EPARSE with err (may be NULL) starting
 * "NAME='S': ". */
int cp_config_duration(const char *name, const char *s, int64_t bare_max, int64_t *out_ns,
                       cp_err *err);

/* The configuration of the running agent: written by contprof_start before any thread of
 * the agent's exists, read-only afterwards. */
extern cp_config cp_cfg;

#endif
