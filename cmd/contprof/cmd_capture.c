/* `contprof capture`: an on-demand, high-resolution capture of the isolates a selector
 * names (POST /api/v1/captures), followed until its last windows are stored, then written
 * as one merged pprof ({capture="ID"} over the capture's range). Exit 0 only when every
 * matched isolate ran for the whole duration at the rate asked. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "http_client.h"
#include "json.h"
#include "times.h"

/* After the end: how long the last windows may take to be stored (agents flush at the
 * end, windows are at most 1 s, ingest batches within ~1 s). */
#define GRACE_NS (4 * 1000000000LL)
#define HEAP_SETTLE_NS (3 * 1000000000LL)
#define HEAP_GRACE_NS (120 * 1000000000LL)

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: contprof capture --select SEL [--type cpu|alloc|heap] [--duration D] [--hz N]\n"
        "                        [--alloc-rate BYTES] [-o FILE] [--server URL] [--token T]\n"
        "  --select SEL      the isolates, e.g. '{service=\"edge\",isolate=\"counter\"}'\n"
        "  --type T          cpu (default), alloc, or heap (one V8 heap snapshot of each\n"
        "                    matched isolate, through contprof v8: what holds the memory)\n"
        "  --duration D      how long (default 30s; at most the server's captures.max_duration)\n"
        "  --hz N            cpu samples per CPU-second (default 1000)\n"
        "  --alloc-rate B    alloc: mean bytes between samples\n"
        "  -o FILE           the merged pprof (default capture-ID.pb.gz)\n"
        "  --server URL      contprofd (default %s, or CONTPROF_SERVER)\n"
        "  --token T         bearer token (or CONTPROF_TOKEN)\n"
        "Prints the processes and isolates matched as they appear, progress on a terminal,\n"
        "then the file and its link in the web UI. Exit 0: every matched isolate ran for\n"
        "the whole duration at the rate asked; 1: some did not (named, with the reason),\n"
        "or the selector matched nothing; 2: bad arguments.\n"
        "example: contprof capture --select '{service=\"edge\",isolate=\"counter\"}' --type cpu "
        "--duration 30s --hz 1000 -o counter.pb.gz\n",
        CP_DEFAULT_SERVER);
}

static int enc_param(cp_buf *b, const char *name, const char *v)
{
    if (!v || !*v) return 0;
    return cp_buf_printf(b, "&%s=", name) || cp_url_encode(b, v);
}

/* An isolate's labels as {a="b",...}. */
static void labels_text(const cp_json *labels, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "{");
    for (uint32_t i = 0; labels && i < labels->n && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%s=\"%s\"", i ? "," : "", labels->keys[i],
                              cp_json_str(labels->items[i], ""));
    if (n < cap) snprintf(out + n, cap - n, "}");
}

static int is_true(const cp_json *j)
{
    return j && j->type == CP_JSON_BOOL && j->num != 0;
}

/* GET /api/v1/captures/ID; NULL (printed) on failure. */
static cp_json *get_capture(const char *server, const char *token, const char *id)
{
    char pq[160];
    snprintf(pq, sizeof pq, "/api/v1/captures/%s", id);
    cp_http_result r;
    cp_err err = {0};
    if (cp_http_get(server, pq, token, 30000, 16u << 20, &r, &err)) {
        fprintf(stderr, "contprof capture: %s\n", err.msg);
        return NULL;
    }
    cp_json *j = NULL;
    if (r.status != 200 || cp_json_parse((const char *)r.body.data, r.body.len, &j, NULL)) {
        fprintf(stderr, "contprof capture: GET %s: HTTP %d %s\n", pq, r.status,
                (char *)r.body.data);
        cp_json_free(j);
        j = NULL;
    } else if (r.partial[0]) {
        fprintf(stderr, "contprof capture: partial answer: nodes %s did not answer\n", r.partial);
    }
    cp_buf_close(&r.body);
    return j;
}

/* What the command line asks for. */
typedef struct capture_args {
    const char *server, *token, *sel, *type, *duration, *hz, *alloc_rate, *out;
} capture_args;

/* Reads argv into *a, checked; returns -1 to go on, else the status to exit with. */
static int parse_args(int argc, char **argv, capture_args *a)
{
    *a = (capture_args){.server = getenv("CONTPROF_SERVER"),
                        .token = getenv("CONTPROF_TOKEN"),
                        .type = "cpu",
                        .duration = "30s"};
    if (!a->server || !*a->server) a->server = CP_DEFAULT_SERVER;
    static const struct option opts[] = {{"select", required_argument, 0, 'S'},
                                         {"type", required_argument, 0, 'y'},
                                         {"duration", required_argument, 0, 'd'},
                                         {"hz", required_argument, 0, 'z'},
                                         {"alloc-rate", required_argument, 0, 'a'},
                                         {"output", required_argument, 0, 'o'},
                                         {"server", required_argument, 0, 's'},
                                         {"token", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'S':
            a->sel = optarg;
            break;
        case 'y':
            a->type = optarg;
            break;
        case 'd':
            a->duration = optarg;
            break;
        case 'z':
            a->hz = optarg;
            break;
        case 'a':
            a->alloc_rate = optarg;
            break;
        case 'o':
            a->out = optarg;
            break;
        case 's':
            a->server = optarg;
            break;
        case 't':
            a->token = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    int64_t dur_ns;
    cp_err err = {0};
    if (!a->sel || !*a->sel) {
        fprintf(stderr, "contprof capture: --select is required\n");
        usage(stderr);
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "contprof capture: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (strcmp(a->type, "cpu") && strcmp(a->type, "alloc") && strcmp(a->type, "heap")) {
        fprintf(stderr, "contprof capture: --type %s: a capture is cpu, alloc or heap\n", a->type);
        return 2;
    }
    if (cp_parse_duration(a->duration, 0, &dur_ns, &err)) {
        fprintf(stderr, "contprof capture: --duration: %s\n", err.msg);
        return 2;
    }
    return -1;
}

/* A capture as the server accepted it. */
typedef struct started {
    char id[80];
    int64_t start_ns, end_ns;
} started;

/* POST /api/v1/captures: the capture asked for, into *s; 0 or 1 (reported). */
static int start_capture(const capture_args *a, started *s)
{
    cp_err err = {0};
    cp_buf pq = {0};
    if (cp_buf_printf(&pq, "/api/v1/captures?type=%s", a->type) ||
        enc_param(&pq, "select", a->sel) || enc_param(&pq, "duration", a->duration) ||
        enc_param(&pq, "hz", a->hz) || enc_param(&pq, "alloc_rate", a->alloc_rate) ||
        cp_buf_append(&pq, "", 1)) {
        fprintf(stderr, "contprof capture: out of memory\n");
        cp_buf_close(&pq);
        return 1;
    }
    cp_http_result r;
    int rc =
        cp_http_post(a->server, (const char *)pq.data, a->token, NULL, 0, 30000, 1 << 20, &r, &err);
    cp_buf_close(&pq);
    if (rc) {
        fprintf(stderr, "contprof capture: %s\n", err.msg);
        return 1;
    }
    cp_json *cap = NULL;
    if (r.status != 201 || cp_json_parse((const char *)r.body.data, r.body.len, &cap, NULL)) {
        fprintf(stderr, "contprof capture: HTTP %d %s", r.status, (char *)r.body.data);
        cp_buf_close(&r.body);
        cp_json_free(cap);
        return 1;
    }
    cp_buf_close(&r.body);
    snprintf(s->id, sizeof s->id, "%s", cp_json_str(cp_json_get(cap, "id"), ""));
    s->start_ns = cp_json_int(cp_json_get(cap, "start_ns"), 0);
    s->end_ns = cp_json_int(cp_json_get(cap, "end_ns"), 0);
    cp_json_free(cap);
    return 0;
}

/* Follows the capture until its end plus the grace, or earlier once every reached
 * isolate's last window is in after the end: prints each isolate matched, and a progress
 * bar on a terminal. Returns the capture's last state (the caller frees it), or NULL
 * (reported). */
static cp_json *follow_capture(const capture_args *a, const started *s)
{
    int tty = isatty(2);
    char seen[64][512];
    uint32_t nseen = 0;
    cp_json *j = NULL;
    /* A heap capture is one snapshot per isolate, which V8 may take long to write (~150 ms
     * per MB of heap, seconds more under load): from the end on, it waits until no new
     * isolate came in for HEAP_SETTLE_NS, at most HEAP_GRACE_NS. */
    int heap = !strcmp(a->type, "heap");
    int64_t last_new_ns = cp_now_ns();
    for (;;) {
        cp_json_free(j);
        if (!(j = get_capture(a->server, a->token, s->id))) return NULL;
        int64_t now = cp_now_ns();
        const cp_json *iso = cp_json_get(j, "isolates");
        uint64_t samples = 0;
        int all_in = now >= s->end_ns;
        for (uint32_t i = 0; iso && i < iso->n; i++) {
            const cp_json *x = iso->items[i];
            if (!is_true(cp_json_get(x, "reached"))) continue;
            char lt[512];
            labels_text(cp_json_get(x, "labels"), lt, sizeof lt);
            samples += (uint64_t)cp_json_int(cp_json_get(x, "samples"), 0);
            if (cp_json_int(cp_json_get(x, "last_end_ns"), 0) < s->end_ns - 250000000LL) all_in = 0;
            int known = 0;
            for (uint32_t k = 0; k < nseen && !known; k++)
                known = strcmp(seen[k], lt) == 0;
            if (known || nseen >= 64) continue;
            snprintf(seen[nseen++], sizeof seen[0], "%s", lt);
            last_new_ns = now;
            if (tty) fprintf(stderr, "\r\033[K");
            printf("matched %s (asked %" PRId64 ", running at %" PRId64 ")\n", lt,
                   cp_json_int(cp_json_get(x, "asked"), 0), cp_json_int(cp_json_get(x, "ran"), 0));
            fflush(stdout);
        }
        if (tty) {
            double el = (double)(now - s->start_ns) / 1e9,
                   total = (double)(s->end_ns - s->start_ns) / 1e9;
            if (el > total) el = total;
            int w = 30, filled = (int)(w * el / (total > 0 ? total : 1));
            fprintf(stderr, "\r\033[K[%.*s%*s] %.0f/%.0f s  %u isolate(s)  %" PRIu64 " samples%s",
                    filled, "==============================", w - filled, "", el, total, nseen,
                    samples, now >= s->end_ns ? "  waiting for the last windows" : "");
            fflush(stderr);
        }
        if (heap ? (nseen && now >= s->end_ns && now >= last_new_ns + HEAP_SETTLE_NS) ||
                       now >= s->end_ns + HEAP_GRACE_NS
                 : (all_in && nseen) || now >= s->end_ns + GRACE_NS)
            break;
        usleep(500000);
    }
    if (tty) fprintf(stderr, "\r\033[K");
    return j;
}

/* The merged profile of the capture's series over its range, written to --output (or
 * capture-ID.pb.gz); 0 or 1 (reported). */
static int write_profile(const capture_args *a, const started *s)
{
    char selc[128];
    snprintf(selc, sizeof selc, "{capture=\"%s\"}", s->id);
    /* a minute each side: agents stamp windows with their own clocks, contprofd the capture
     * with its own (the profile's duration is this range, its samples the capture's) */
    int64_t from_s = s->start_ns / 1000000000LL - 60, to_s = s->end_ns / 1000000000LL + 60;
    cp_buf q = {0};
    cp_buf_printf(&q, "/api/v1/profile?type=%s&format=pprof&from=%" PRId64 "&to=%" PRId64, a->type,
                  from_s, to_s);
    enc_param(&q, "select", selc);
    cp_buf_append(&q, "", 1);
    cp_http_result r;
    cp_err err = {0};
    int rc = cp_http_get(a->server, (const char *)q.data, a->token, 60000, 0, &r, &err);
    cp_buf_close(&q);
    char path[200];
    const char *out = a->out;
    if (!out) snprintf(path, sizeof path, "capture-%s.pb.gz", s->id), out = path;
    int status = 0;
    if (rc || r.status != 200) {
        fprintf(stderr, "contprof capture: the profile: %s\n",
                rc ? err.msg : (const char *)r.body.data);
        status = 1;
    } else if (cp_write_file(out, r.body.data, r.body.len, &err)) {
        fprintf(stderr, "contprof capture: %s\n", err.msg);
        status = 1;
    } else {
        cp_buf link = {0};
        cp_buf_printf(&link, "%s/?type=%s&from=%" PRId64 "&to=%" PRId64, a->server, a->type, from_s,
                      to_s);
        enc_param(&link, "select", selc);
        cp_buf_append(&link, "", 1);
        printf("wrote %s (%zu bytes)\nview: %s\n", out, r.body.len, (const char *)link.data);
        cp_buf_close(&link);
    }
    if (!rc) cp_buf_close(&r.body);
    return status;
}

/* The verdict on the capture's last state j: 0 only when every matched isolate ran for
 * the whole duration at the rate asked and every node answered; each shortfall reported. */
static int verdict(const capture_args *a, const cp_json *j)
{
    int status = 0;
    const cp_json *iso = cp_json_get(j, "isolates");
    if (!iso || iso->n == 0) {
        fprintf(stderr,
                "contprof capture: the selector %s matched no isolate (no process sent "
                "a window of it, and none answered the capture)\n",
                a->sel);
        status = 1;
    }
    for (uint32_t i = 0; iso && i < iso->n; i++) {
        const cp_json *x = iso->items[i];
        char lt[512];
        labels_text(cp_json_get(x, "labels"), lt, sizeof lt);
        const char *why = cp_json_str(cp_json_get(x, "reason"), "");
        /* the measured cost, when the agent says it (the V8 source) */
        const cp_json *us = cp_json_get(x, "cost_us_per_s"), *pm = cp_json_get(x, "cost_permille");
        if (us && us->type == CP_JSON_NUMBER && pm && pm->type == CP_JSON_NUMBER)
            printf("cost on %s: %.1f ms of CPU per second, %.1f permille of its CPU\n", lt,
                   us->num / 1000.0, pm->num);
        else if (us && us->type == CP_JSON_NUMBER)
            printf("cost on %s: %.1f ms of CPU per second\n", lt, us->num / 1000.0);
        if (!is_true(cp_json_get(x, "reached"))) {
            fprintf(stderr, "contprof capture: not reached: %s: %s\n", lt, why);
            status = 1;
        } else if (!is_true(cp_json_get(x, "whole"))) {
            fprintf(stderr, "contprof capture: short: %s: %s\n", lt, why);
            status = 1;
        } else if (!is_true(cp_json_get(x, "ok"))) {
            fprintf(stderr, "contprof capture: %s ran at %" PRId64 " instead of %" PRId64 ": %s\n",
                    lt, cp_json_int(cp_json_get(x, "ran"), 0),
                    cp_json_int(cp_json_get(x, "asked"), 0), why);
            status = 1;
        }
    }
    if (is_true(cp_json_get(j, "partial"))) {
        const cp_json *m = cp_json_get(j, "missing_peers");
        for (uint32_t i = 0; m && i < m->n; i++)
            fprintf(stderr, "contprof capture: partial: node %s did not answer\n",
                    cp_json_str(m->items[i], "?"));
        status = 1;
    }
    return status;
}

int cp_cmd_capture(int argc, char **argv)
{
    capture_args a;
    started s;
    int status = parse_args(argc, argv, &a);
    if (status >= 0) return status;
    if (start_capture(&a, &s)) return 1;
    printf("capture %s: %s %s for %s\n", s.id, a.type, a.sel, a.duration);
    fflush(stdout);
    cp_json *j = follow_capture(&a, &s);
    if (!j) return 1;
    status = write_profile(&a, &s);
    status |= verdict(&a, j);
    cp_json_free(j);
    return status;
}
