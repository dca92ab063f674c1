/* `contprof v8`: flags into cp_v8_options, SIGINT/SIGTERM into a last window and exit. */
#include "cmd_v8.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "times.h"
#include "v8source.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static int usage_to(FILE *f, int rc)
{
    fprintf(
        f,
        "usage: contprof v8 --inspector HOST:PORT [--inspector HOST:PORT ...]\n"
        "                  [--output-dir DIR] [--server URL] [--relay DIR | --brokers LIST] "
        "[--topic T]\n"
        "                  [--service S] [--instance I] [--tenant T] [--label k=v ...]\n"
        "                  [--window D] [--cpu-interval D] [--heap-interval BYTES]\n"
        "                  [--heap-snapshot-max-mb N] [--heap-snapshot-every D]\n"
        "                  [--source-map-dir DIR] [--no-source-maps]\n"
        "                  [--exit-when-gone] [--allow-remote] [--token T] [--no-captures]\n"
        "Attaches to every isolate of V8 hosts (workerd --inspector-addr, node --inspect)\n"
        "and emits each isolate's cpu, alloc and inuse windows, labelled isolate=NAME and\n"
        "runtime=v8. Defaults: --service v8, --window 10s, --cpu-interval 10ms,\n"
        "--heap-interval 524288 (0 turns either profiler off). SIGINT/SIGTERM emit the\n"
        "window in progress and stop. Frames of scripts with a source map (inline, next to\n"
        "the script, or DIR/NAME.map) read as their original files, lines and names.\n"
        "With Kafka, captures (contprof capture) are heard on the control topic; with\n"
        "--token (or CONTPROF_TOKEN) only those signed with it; --no-captures: none.\n"
        "examples:\n"
        "  contprof v8 --inspector 127.0.0.1:9229 --service api --server http://127.0.0.1:8080\n"
        "  contprof top --type cpu --select '{service=\"api\",runtime=\"v8\",isolate=\"main\"}'\n");
    return rc;
}

int cp_cmd_v8(int argc, char **argv)
{
    cp_v8_options o = {
        .service = "v8",
        .window_ns = 10 * 1000000000LL,
        .cpu_interval_us = 10000, /* always on: 1 ms costs workerd ~10% (collector/v8/README.md) */
        .heap_interval = 512 * 1024,
        .stop = &stop_flag,
    };
    char labels[4096] = "";
    cp_err err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage_to(stdout, 0);
        if (!strcmp(a, "--exit-when-gone")) {
            o.exit_when_gone = 1;
            continue;
        }
        if (!strcmp(a, "--no-source-maps")) {
            o.no_source_maps = 1;
            continue;
        }
        if (!strcmp(a, "--no-captures")) {
            o.no_captures = 1;
            continue;
        }
        if (!strcmp(a, "--allow-remote")) {
            o.allow_remote = 1;
            continue;
        }
        if (i + 1 >= argc) return usage_to(stderr, 2);
        const char *v = argv[++i];
        int64_t d;
        if (!strcmp(a, "--inspector")) {
            if (o.ninspectors >= CP_V8_MAX_HOSTS) {
                fprintf(stderr, "contprof v8: at most %d --inspector\n", CP_V8_MAX_HOSTS);
                return 2;
            }
            o.inspectors[o.ninspectors++] = v;
        } else if (!strcmp(a, "--output-dir")) {
            o.output_dir = v;
        } else if (!strcmp(a, "--server")) {
            o.server = v;
        } else if (!strcmp(a, "--relay")) {
            o.relay_dir = v;
        } else if (!strcmp(a, "--brokers")) {
            o.brokers = v;
        } else if (!strcmp(a, "--source-map-dir")) {
            o.source_map_dir = v;
        } else if (!strcmp(a, "--token")) {
            o.token = v;
        } else if (!strcmp(a, "--topic")) {
            o.topic = v;
        } else if (!strcmp(a, "--service")) {
            o.service = v;
        } else if (!strcmp(a, "--instance")) {
            o.instance = v;
        } else if (!strcmp(a, "--tenant")) {
            o.tenant = v;
        } else if (!strcmp(a, "--label")) {
            size_t n = strlen(labels);
            if (!strchr(v, '=') || n + strlen(v) + 2 > sizeof(labels)) {
                fprintf(stderr, "contprof v8: --label %s: not k=v (or too many)\n", v);
                return 2;
            }
            snprintf(labels + n, sizeof(labels) - n, "%s%s", n ? "," : "", v);
        } else if (!strcmp(a, "--window") || !strcmp(a, "--cpu-interval")) {
            if (cp_parse_duration(v, !strcmp(a, "--cpu-interval"), &d, &err)) {
                fprintf(stderr, "contprof v8: %s: %s\n", a, err.msg);
                return 2;
            }
            if (!strcmp(a, "--window"))
                o.window_ns = d;
            else
                o.cpu_interval_us = d == 0 ? 0 : d / 1000 > 0 ? d / 1000 : 1; /* 0: off */
        } else if (!strcmp(a, "--heap-snapshot-every")) {
            if (cp_parse_duration(v, 0, &d, &err) || d < 1000000000LL) {
                fprintf(stderr, "contprof v8: --heap-snapshot-every %s: %s\n", v,
                        err.msg[0] ? err.msg : "at least 1s");
                return 2;
            }
            o.heap_snapshot_every_ns = d;
        } else if (!strcmp(a, "--heap-snapshot-max-mb")) {
            char *end;
            long long m = strtoll(v, &end, 10);
            if (*end || m <= 0 || end == v || m > (1LL << 20)) {
                fprintf(stderr, "contprof v8: --heap-snapshot-max-mb %s: not a size in MiB\n", v);
                return 2;
            }
            o.heap_snapshot_max_mb = m;
        } else if (!strcmp(a, "--heap-interval")) {
            char *end;
            long long b = strtoll(v, &end, 10);
            if (*end || b < 0 || end == v) {
                fprintf(stderr, "contprof v8: --heap-interval %s: not a byte count\n", v);
                return 2;
            }
            o.heap_interval = b;
        } else {
            fprintf(stderr, "contprof v8: unknown flag %s\n", a);
            return usage_to(stderr, 2);
        }
    }
    o.labels = labels;
    if (!o.token) o.token = getenv("CONTPROF_TOKEN");
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int rc = cp_v8_run(&o, &err);
    if (rc) {
        fprintf(stderr, "contprof v8: %s\n", err.msg[0] ? err.msg : cp_strerror(rc));
        return rc == CP_EINVAL ? 2 : 1;
    }
    return 0;
}
