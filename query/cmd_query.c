/* The CLI's client commands: `contprof query | top | series | labels | diff | timeline`
 * build a request to contprofd's HTTP API from flags, and print or save the answer. Server
 * errors are printed as they came, with exit status 1. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "client.h"

#define DEFAULT_SERVER "http://127.0.0.1:7070"

typedef struct qopts {
    const char *server, *token, *out;
    const char *type, *select, *from, *to, *format;
    const char *focus, *ignore, *max_nodes, *sample_type, *step;
    const char *base_select, *base_from, *base_to;
    long timeout_s;
} qopts;

enum {
    O_SERVER = 256, O_TOKEN, O_TYPE, O_SELECT, O_FROM, O_TO, O_FORMAT, O_FOCUS, O_IGNORE,
    O_MAXNODES, O_SAMPLE, O_STEP, O_BSELECT, O_BFROM, O_BTO, O_TIMEOUT
};

static const struct option g_opts[] = {
    {"server", required_argument, 0, O_SERVER},   {"token", required_argument, 0, O_TOKEN},
    {"type", required_argument, 0, O_TYPE},       {"select", required_argument, 0, O_SELECT},
    {"from", required_argument, 0, O_FROM},       {"to", required_argument, 0, O_TO},
    {"format", required_argument, 0, O_FORMAT},   {"focus", required_argument, 0, O_FOCUS},
    {"ignore", required_argument, 0, O_IGNORE},   {"max-nodes", required_argument, 0, O_MAXNODES},
    {"sample-type", required_argument, 0, O_SAMPLE}, {"step", required_argument, 0, O_STEP},
    {"base-select", required_argument, 0, O_BSELECT}, {"base-from", required_argument, 0, O_BFROM},
    {"base-to", required_argument, 0, O_BTO},     {"timeout", required_argument, 0, O_TIMEOUT},
    {"output", required_argument, 0, 'o'},        {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

static void usage(FILE *f, const char *cmd)
{
    fprintf(f,
            "usage: contprof %s [--server URL] [--token T] [--type cpu|alloc|inuse]\n"
            "           [--select SELECTOR] [--from T] [--to T] [--format F] [-o FILE]\n"
            "           [--focus RE] [--ignore RE] [--max-nodes N] [--sample-type NAME]\n"
            "           [--step D] [--base-select S] [--base-from T] [--base-to T]\n"
            "  --server URL   contprofd's HTTP address (default %s, or CONTPROF_SERVER)\n"
            "  --token T      bearer token (or CONTPROF_TOKEN)\n"
            "  --select S     Prometheus-style selector, e.g. '{service=\"api\",version!=\"1.2\"}'\n"
            "  --from/--to T  RFC 3339, unix seconds, now, now-15m or -1h (default: the last hour)\n"
            "  query:    the merged profile; --format pprof (default), json, folded or top\n"
            "  top:      the table view, like pprof -top (--max-nodes rows)\n"
            "  series:   series with windows in [from, to) (JSON)\n"
            "  labels:   label names, or with NAME the values of one label (JSON)\n"
            "  diff:     target window/selector against --base-*; --format json (default) or pprof\n"
            "  timeline: totals per --step (JSON)\n",
            cmd, DEFAULT_SERVER);
}

static int parse_opts(int argc, char **argv, qopts *o)
{
    memset(o, 0, sizeof *o);
    o->server = getenv("CONTPROF_SERVER");
    if (!o->server || !*o->server) o->server = DEFAULT_SERVER;
    o->token = getenv("CONTPROF_TOKEN");
    o->timeout_s = 120;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", g_opts, NULL)) != -1) {
        switch (c) {
        case O_SERVER: o->server = optarg; break;
        case O_TOKEN: o->token = optarg; break;
        case O_TYPE: o->type = optarg; break;
        case O_SELECT: o->select = optarg; break;
        case O_FROM: o->from = optarg; break;
        case O_TO: o->to = optarg; break;
        case O_FORMAT: o->format = optarg; break;
        case O_FOCUS: o->focus = optarg; break;
        case O_IGNORE: o->ignore = optarg; break;
        case O_MAXNODES: o->max_nodes = optarg; break;
        case O_SAMPLE: o->sample_type = optarg; break;
        case O_STEP: o->step = optarg; break;
        case O_BSELECT: o->base_select = optarg; break;
        case O_BFROM: o->base_from = optarg; break;
        case O_BTO: o->base_to = optarg; break;
        case O_TIMEOUT: o->timeout_s = atol(optarg); break;
        case 'o': o->out = optarg; break;
        case 'h': usage(stdout, argv[0]); return 1;
        default: usage(stderr, argv[0]); return 2;
        }
    }
    if (o->timeout_s <= 0) o->timeout_s = 120;
    return 0;
}

static int add_param(cp_buf *b, const char *name, const char *value)
{
    if (!value) return 0;
    int rc = cp_buf_printf(b, "%c%s=", memchr(b->data, '?', b->len) ? '&' : '?', name);
    return rc ? rc : cp_url_encode(b, value);
}

/* GETs path with the request's parameters and writes the answer to -o or stdout. */
static int fetch(const char *cmd, const qopts *o, cp_buf *pq)
{
    if (cp_buf_append(pq, "", 1)) return 1;
    cp_http_result r;
    cp_err err = {0};
    if (cp_http_get(o->server, (const char *)pq->data, o->token, o->timeout_s * 1000, 0, &r,
                    &err)) {
        fprintf(stderr, "contprof %s: %s\n", cmd, err.msg);
        return 1;
    }
    int status = 0;
    if (r.status >= 400 || r.status < 200) {
        fprintf(stderr, "contprof %s: server answered %d: ", cmd, r.status);
        fwrite(r.body.data, 1, r.body.len, stderr);
        if (!r.body.len || r.body.data[r.body.len - 1] != '\n') fputc('\n', stderr);
        status = 1;
    } else if (cp_write_file(o->out ? o->out : "-", r.body.data, r.body.len)) {
        fprintf(stderr, "contprof %s: cannot write %s\n", cmd, o->out ? o->out : "stdout");
        status = 1;
    }
    cp_buf_close(&r.body);
    return status;
}

static int common(cp_buf *b, const qopts *o)
{
    return add_param(b, "type", o->type) || add_param(b, "select", o->select) ||
           add_param(b, "from", o->from) || add_param(b, "to", o->to);
}

static int profile_like(int argc, char **argv, const char *path, const char *force_format,
                        const char *default_format)
{
    qopts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    if (optind < argc) {
        fprintf(stderr, "contprof %s: unexpected argument \"%s\"\n", argv[0], argv[optind]);
        return 2;
    }
    const char *format = force_format ? force_format : o.format ? o.format : default_format;
    if (strcmp(format, "pprof") == 0 && !o.out && isatty(1)) {
        fprintf(stderr, "contprof %s: not writing a binary pprof to a terminal; use -o FILE or "
                        "--format top|folded|json\n",
                argv[0]);
        return 2;
    }
    cp_buf b = {0};
    rc = cp_buf_printf(&b, "%s", path) || common(&b, &o) || add_param(&b, "format", format) ||
         add_param(&b, "focus", o.focus) || add_param(&b, "ignore", o.ignore) ||
         add_param(&b, "max_nodes", o.max_nodes) || add_param(&b, "sample_type", o.sample_type) ||
         add_param(&b, "base_select", o.base_select) || add_param(&b, "base_from", o.base_from) ||
         add_param(&b, "base_to", o.base_to);
    rc = rc ? 1 : fetch(argv[0], &o, &b);
    cp_buf_close(&b);
    return rc;
}

int cp_cmd_query(int argc, char **argv)
{
    return profile_like(argc, argv, "/api/v1/profile", NULL, "pprof");
}

int cp_cmd_top(int argc, char **argv)
{
    return profile_like(argc, argv, "/api/v1/profile", "top", "top");
}

int cp_cmd_diff(int argc, char **argv)
{
    return profile_like(argc, argv, "/api/v1/diff", NULL, "json");
}

int cp_cmd_series(int argc, char **argv)
{
    qopts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    cp_buf b = {0};
    rc = cp_buf_printf(&b, "/api/v1/series") || common(&b, &o);
    rc = rc ? 1 : fetch(argv[0], &o, &b);
    cp_buf_close(&b);
    return rc;
}

int cp_cmd_timeline(int argc, char **argv)
{
    qopts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    cp_buf b = {0};
    rc = cp_buf_printf(&b, "/api/v1/timeline") || common(&b, &o) || add_param(&b, "step", o.step);
    rc = rc ? 1 : fetch(argv[0], &o, &b);
    cp_buf_close(&b);
    return rc;
}

int cp_cmd_labels(int argc, char **argv)
{
    qopts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    cp_buf b = {0};
    if (optind < argc) {
        rc = cp_buf_printf(&b, "/api/v1/labels/") || cp_url_encode(&b, argv[optind]) ||
             cp_buf_printf(&b, "/values");
    } else {
        rc = cp_buf_printf(&b, "/api/v1/labels");
    }
    rc = rc ? 1 : fetch(argv[0], &o, &b);
    cp_buf_close(&b);
    return rc;
}
