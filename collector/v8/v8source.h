/* The V8 source: attaches to V8 hosts (workerd, node) through their inspector, runs V8's
 * CPU profiler and sampling heap profiler on every isolate continuously, and emits each
 * isolate's cpu, alloc and inuse windows with the native agent's envelope, labels and
 * transports (gzip'd pprof files in a directory, Kafka). One thread; `contprof v8` is its
 * front end (cmd/contprof/cmd_v8.c). */
#ifndef CP_V8SOURCE_H
#define CP_V8SOURCE_H

#include <signal.h>
#include <stdint.h>

#include "error.h"

#define CP_V8_MAX_HOSTS 16

typedef struct cp_v8_options {
    const char *inspectors[CP_V8_MAX_HOSTS]; /* "HOST:PORT" each */
    int ninspectors;
    const char *output_dir;         /* NULL or "": no files */
    const char *brokers;            /* NULL or "": none */
    const char *server;             /* contprofd URL asked for brokers when brokers is empty */
    const char *relay_dir;          /* the host's relay (collector/sink.h): wins over brokers */
    const char *topic;              /* NULL: contprof.profiles */
    const char *tenant;             /* NULL: default */
    const char *service;            /* label service (required) */
    const char *instance;           /* NULL: HOSTNAME:PORT of the inspector */
    const char *labels;             /* NULL or "k=v,k=v": added to every envelope */
    int64_t window_ns;              /* default 10 s */
    int64_t cpu_interval_us;        /* V8's CPU sampling interval, default 10000; 0: off */
    int64_t heap_interval;          /* bytes between heap samples, default 512 KiB; 0: off */
    int64_t heap_snapshot_max_mb;   /* a heap capture's parser memory (model/heapsnap.h); 0: 512 */
    int64_t heap_snapshot_every_ns; /* a scheduled heap snapshot of each isolate; 0: off */
    int exit_when_gone;             /* stop once every host was seen and none answers */
    int allow_remote;               /* inspectors off loopback allowed */
    int no_source_maps;             /* no Debugger domain, frames as V8 names them */
    const char *source_map_dir;     /* NULL, or where NAME.map is looked for too */
    const char *token; /* the tenant's token: signs envelopes, asks the server, checks captures */
    int no_captures;   /* the control topic is not read (no captures) */
    volatile sig_atomic_t *stop; /* set (by a signal handler) to stop after a last window */
} cp_v8_options;

/* Runs the source until *o->stop is set (or, with exit_when_gone, the hosts are gone),
 * then emits the window in progress of every isolate still attached and returns 0. A host
 * that refuses or drops a connection is retried with backoff (0.25 s doubling to 10 s);
 * a malformed message is logged, naming the target and the problem, and skipped. Returns
 * CP_EINVAL (bad options, err saying which), CP_EKAFKA/CP_EIO (transport could not start)
 * or CP_ENOMEM. Progress and every loss go to stderr through model/log.h. */
int cp_v8_run(const cp_v8_options *o, cp_err *err);

#endif
