/* The CLI's client commands: `contprof query | top | series | labels | diff | timeline`
 * build a request to contprofd's HTTP API from flags, and print or save the answer.
 *
 * Output rule (one for every command, terminal or not): series, labels, timeline and diff
 * print aligned tables; `-o json` (or `--format json`) prints the API's JSON exactly as it
 * came. `-o` also takes a file name (anything but json and table), as it always did. Times
 * and durations are checked here with the server's grammar (model/times.h) before anything
 * is sent, so a bad flag is named as the flag. Server errors are printed as they came, with
 * exit status 1. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "http_client.h"
#include "times.h"
#include "views.h"

#define DIFF_ROWS 20

typedef struct qopts {
    const char *server, *token, *out;
    const char *type, *select, *from, *to, *format;
    const char *focus, *ignore, *max_nodes, *sample_type, *step;
    const char *base_select, *base_from, *base_to;
    int64_t timeout_ms;
    int json, table;   /* -o json / -o table (or --format json|table) */
    int allow_partial; /* a cluster's answer without some nodes' parts exits 0 */
} qopts;

enum {
    O_SERVER = 256,
    O_TOKEN,
    O_TYPE,
    O_SELECT,
    O_FROM,
    O_TO,
    O_FORMAT,
    O_FOCUS,
    O_IGNORE,
    O_MAXNODES,
    O_SAMPLE,
    O_STEP,
    O_BSELECT,
    O_BFROM,
    O_BTO,
    O_TIMEOUT,
    O_ALLOW_PARTIAL
};

static const struct option g_opts[] = {{"server", required_argument, 0, O_SERVER},
                                       {"token", required_argument, 0, O_TOKEN},
                                       {"type", required_argument, 0, O_TYPE},
                                       {"select", required_argument, 0, O_SELECT},
                                       {"from", required_argument, 0, O_FROM},
                                       {"to", required_argument, 0, O_TO},
                                       {"format", required_argument, 0, O_FORMAT},
                                       {"focus", required_argument, 0, O_FOCUS},
                                       {"ignore", required_argument, 0, O_IGNORE},
                                       {"max-nodes", required_argument, 0, O_MAXNODES},
                                       {"sample-type", required_argument, 0, O_SAMPLE},
                                       {"step", required_argument, 0, O_STEP},
                                       {"base-select", required_argument, 0, O_BSELECT},
                                       {"base-from", required_argument, 0, O_BFROM},
                                       {"base-to", required_argument, 0, O_BTO},
                                       {"timeout", required_argument, 0, O_TIMEOUT},
                                       {"allow-partial", no_argument, 0, O_ALLOW_PARTIAL},
                                       {"output", required_argument, 0, 'o'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};

/* ---- help --------------------------------------------------------------------------- */

typedef struct cmd_help {
    const char *name, *synopsis, *what, *examples;
} cmd_help;

static const cmd_help g_help[] = {
    {"query", "[--format pprof|json|folded|top] [-o FILE|json]",
     "The merged profile of [from, to) for the selector: gzip'd pprof (default; needs -o FILE\n"
     "on a terminal), the JSON call tree, folded stacks or the top table.",
     "  contprof query --type cpu --select '{service=\"api\"}' --from -15m -o cpu.pb.gz\n"
     "  go tool pprof -http=: cpu.pb.gz\n"
     "  contprof query --type inuse --from now-1h --format folded > stacks.txt\n"},
    {"top", "[--max-nodes N] [--focus RE] [--ignore RE] [-o json]",
     "The table view of a window, like `pprof -top`: flat, flat%, sum%, cum, cum%, name.",
     "  contprof top --type cpu --select '{service=\"api\",isolate=~\"worker.*\"}' --from -1h\n"
     "  contprof top --type alloc --from 2026-11-29T14:00:00Z --to 2026-11-29T14:20:00Z\n"},
    {"series", "[-o json]",
     "The series with windows in [from, to) (default: all of time): type, labels, first and\n"
     "last window.",
     "  contprof series --select '{service=\"api\"}'\n"
     "  contprof series --from -15m -o json | jq '.series[].labels'\n"},
    {"labels", "[NAME] [-o json]", "The label names, or with NAME the values of that label.",
     "  contprof labels\n"
     "  contprof labels version\n"},
    {"diff",
     "[--base-select S] [--base-from T] [--base-to T] [--max-nodes ROWS] [--format "
     "table|json|pprof]",
     "The target (--select, --from, --to) against the base (--base-*, defaulting to the\n"
     "target's): the functions that changed most, with signed deltas and their share of the\n"
     "base total, like `pprof -top -diff_base` (--max-nodes rows, default 20, 0 = all).\n"
     "--format pprof -o FILE writes pprof's -base profile.",
     "  contprof diff --type cpu --select '{service=\"api\",version=\"1.4\"}' \\\n"
     "                --base-select '{service=\"api\",version=\"1.3\"}' --from -1h\n"
     "  contprof diff --type cpu --from -1m --base-from -2m --base-to -1m\n"},
    {"timeline", "[--step D] [-o json]",
     "Totals per step over [from, to): time, each sample type with units, and a bar scaled\n"
     "to the largest point. Default step: about 300 points.",
     "  contprof timeline --type alloc --select '{service=\"api\"}' --from -6h --step 5m\n"
     "  contprof timeline --type cpu --from now-15m --step 10s\n"},
};

static void usage(FILE *f, const char *cmd)
{
    const cmd_help *h = NULL;
    for (size_t i = 0; i < sizeof g_help / sizeof g_help[0]; i++)
        if (strcmp(g_help[i].name, cmd) == 0) h = &g_help[i];
    fprintf(
        f,
        "usage: contprof %s [--server URL] [--token T] [--type cpu|alloc|inuse]\n"
        "           [--select SELECTOR] [--from T] [--to T] %s\n\n%s\n\n"
        "  --server URL   contprofd's HTTP address (default %s, or CONTPROF_SERVER)\n"
        "  --token T      bearer token (or CONTPROF_TOKEN)\n"
        "  --type K       cpu (default), alloc or inuse\n"
        "  --select S     Prometheus-style selector, e.g. '{service=\"api\",version!=\"1.2\"}'\n"
        "  --from/--to T  RFC 3339, unix seconds, now, now-15m or -1h (default: the last hour)\n"
        "  --timeout D    give up after D (default 2m; a bare number is seconds)\n"
        "  --allow-partial  exit 0 on a cluster's partial answer (some nodes' data missing;\n"
        "                 printed either way, with a warning; default: exit 3)\n"
        "  -o json        the API's JSON as it comes (also --format json); -o FILE writes to\n"
        "                 FILE. Without json, series, labels, timeline and diff print\n"
        "                 tables, whether or not stdout is a terminal.\n\n"
        "examples:\n%s",
        cmd, h ? h->synopsis : "", h ? h->what : "", CP_DEFAULT_SERVER, h ? h->examples : "");
}

/* ---- options ------------------------------------------------------------------------ */

static int bad_flag(const char *cmd, const char *flag, const char *why)
{
    fprintf(stderr, "contprof %s: %s: %s\n", cmd, flag, why);
    return 2;
}

/* Checks times and durations with the server's grammar, so errors name the flag. */
static int check_times(const char *cmd, const qopts *o)
{
    const char *names[] = {"--from", "--to", "--base-from", "--base-to"};
    const char *vals[] = {o->from, o->to, o->base_from, o->base_to};
    int64_t now = cp_now_ns(), t;
    cp_err err = {0};
    for (int i = 0; i < 4; i++)
        if (vals[i] && cp_parse_time(vals[i], now, &t, &err))
            return bad_flag(cmd, names[i], err.msg);
    if (o->step && cp_parse_duration(o->step, 0, &t, &err)) return bad_flag(cmd, "--step", err.msg);
    return 0;
}

/* 0 ok, 1 help shown, 2 usage error (reported). */
static int parse_opts(int argc, char **argv, qopts *o)
{
    memset(o, 0, sizeof *o);
    o->server = getenv("CONTPROF_SERVER");
    if (!o->server || !*o->server) o->server = CP_DEFAULT_SERVER;
    o->token = getenv("CONTPROF_TOKEN");
    o->timeout_ms = CP_DEFAULT_CLIENT_TIMEOUT_NS / 1000000;
    int c;
    cp_err err = {0};
    int64_t d;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", g_opts, NULL)) != -1) {
        switch (c) {
        case O_SERVER:
            o->server = optarg;
            break;
        case O_TOKEN:
            o->token = optarg;
            break;
        case O_TYPE:
            o->type = optarg;
            break;
        case O_SELECT:
            o->select = optarg;
            break;
        case O_FROM:
            o->from = optarg;
            break;
        case O_TO:
            o->to = optarg;
            break;
        case O_FORMAT:
            o->format = optarg;
            break;
        case O_FOCUS:
            o->focus = optarg;
            break;
        case O_IGNORE:
            o->ignore = optarg;
            break;
        case O_MAXNODES:
            o->max_nodes = optarg;
            break;
        case O_SAMPLE:
            o->sample_type = optarg;
            break;
        case O_STEP:
            o->step = optarg;
            break;
        case O_BSELECT:
            o->base_select = optarg;
            break;
        case O_BFROM:
            o->base_from = optarg;
            break;
        case O_BTO:
            o->base_to = optarg;
            break;
        case O_TIMEOUT:
            if (cp_parse_duration(optarg, 0, &d, &err))
                return bad_flag(argv[0], "--timeout", err.msg);
            o->timeout_ms = d / 1000000 ? d / 1000000 : 1;
            break;
        case O_ALLOW_PARTIAL:
            o->allow_partial = 1;
            break;
        case 'o':
            if (strcmp(optarg, "json") == 0)
                o->json = 1, o->table = 0;
            else if (strcmp(optarg, "table") == 0)
                o->table = 1, o->json = 0;
            else
                o->out = optarg;
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 1;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (o->format && strcmp(o->format, "json") == 0) o->json = 1;
    if (o->format && strcmp(o->format, "table") == 0) o->table = 1;
    if (o->json && o->table) return bad_flag(argv[0], "-o", "json and table asked for at once");
    return check_times(argv[0], o);
}

/* For series, labels and timeline: --format may only name the output. */
static int only_table_or_json(const char *cmd, const qopts *o)
{
    if (o->format && strcmp(o->format, "json") && strcmp(o->format, "table"))
        return bad_flag(cmd, "--format", "expected table (default) or json");
    return 0;
}

static int add_param(cp_buf *b, const char *name, const char *value)
{
    if (!value) return 0;
    int rc = cp_buf_printf(b, "%c%s=", memchr(b->data, '?', b->len) ? '&' : '?', name);
    return rc ? rc : cp_url_encode(b, value);
}

/* ---- requests and answers ----------------------------------------------------------- */

/* GETs path with the request's parameters. 0 with r filled on a 2xx answer; otherwise 1,
 * the cause printed (the server's answer as it came). */
static int fetch(const char *cmd, const qopts *o, cp_buf *pq, cp_http_result *r)
{
    if (cp_buf_append(pq, "", 1)) return 1;
    cp_err err = {0};
    if (cp_http_get(o->server, (const char *)pq->data, o->token, o->timeout_ms, 0, r, &err)) {
        fprintf(stderr, "contprof %s: %s\n", cmd, err.msg);
        return 1;
    }
    if (r->status >= 400 || r->status < 200) {
        fprintf(stderr, "contprof %s: server answered %d: ", cmd, r->status);
        fwrite(r->body.data, 1, r->body.len, stderr);
        if (!r->body.len || r->body.data[r->body.len - 1] != '\n') fputc('\n', stderr);
        cp_buf_close(&r->body);
        return 1;
    }
    if (r->partial[0]) /* a cluster answered without some nodes' parts: never silently */
        fprintf(stderr,
                "contprof %s: warning: partial answer: no part from %s (their data is "
                "missing)\n",
                cmd, r->partial);
    return 0;
}

static int emit(const char *cmd, const qopts *o, const void *data, size_t len)
{
    if (cp_write_file(o->out ? o->out : "-", data, len, NULL)) {
        fprintf(stderr, "contprof %s: cannot write %s\n", cmd, o->out ? o->out : "stdout");
        return 1;
    }
    return 0;
}

typedef int (*view_fn)(const char *json, size_t len, uint32_t rows, cp_buf *out, cp_err *err);

/* Fetches, then prints the JSON as it came (-o json) or the table view of it. A partial
 * answer (a cluster without some nodes' parts) is printed too, but exits 3 unless
 * --allow-partial: a script must not take half the data for all of it (issue 36). */
static int answer(const char *cmd, const qopts *o, cp_buf *pq, view_fn view, uint32_t rows)
{
    cp_http_result r;
    if (fetch(cmd, o, pq, &r)) return 1;
    int rc;
    if (o->json || !view) {
        rc = emit(cmd, o, r.body.data, r.body.len);
    } else {
        cp_buf t = {0};
        cp_err err = {0};
        rc = view((const char *)r.body.data, r.body.len, rows, &t, &err);
        if (rc) fprintf(stderr, "contprof %s: %s\n", cmd, err.msg);
        rc = rc ? 1 : emit(cmd, o, t.data, t.len);
        cp_buf_close(&t);
    }
    cp_buf_close(&r.body);
    if (!rc && r.partial[0] && !o->allow_partial) {
        fprintf(stderr, "contprof %s: exit 3: the answer is partial (--allow-partial accepts it)\n",
                cmd);
        rc = 3;
    }
    return rc;
}

static int view_series(const char *j, size_t n, uint32_t rows, cp_buf *out, cp_err *err)
{
    (void)rows;
    return cp_view_series(j, n, out, err);
}

static int view_labels(const char *j, size_t n, uint32_t rows, cp_buf *out, cp_err *err)
{
    (void)rows;
    return cp_view_labels(j, n, out, err);
}

static int view_timeline(const char *j, size_t n, uint32_t rows, cp_buf *out, cp_err *err)
{
    (void)rows;
    return cp_view_timeline(j, n, out, err);
}

static int common(cp_buf *b, const qopts *o)
{
    return add_param(b, "type", o->type) || add_param(b, "select", o->select) ||
           add_param(b, "from", o->from) || add_param(b, "to", o->to);
}

/* ---- commands ----------------------------------------------------------------------- */

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
    const char *format = o.json                 ? "json"
                         : force_format         ? force_format
                         : o.format && !o.table ? o.format
                                                : default_format;
    if (strcmp(format, "pprof") == 0 && !o.out && isatty(1)) {
        fprintf(stderr,
                "contprof %s: not writing a binary pprof to a terminal; use -o FILE or "
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
    rc = rc ? 1 : answer(argv[0], &o, &b, NULL, 0);
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
    qopts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    if (o.json || (o.format && strcmp(o.format, "table") != 0))
        return profile_like(argc, argv, "/api/v1/diff", NULL, "json");
    if (optind < argc) {
        fprintf(stderr, "contprof %s: unexpected argument \"%s\"\n", argv[0], argv[optind]);
        return 2;
    }
    /* The table: the whole tree as JSON (--max-nodes counts rows here, not tree nodes). */
    uint32_t rows = DIFF_ROWS;
    if (o.max_nodes) {
        char *end;
        long v = strtol(o.max_nodes, &end, 10);
        if (*end || end == o.max_nodes || v < 0 || v > 100000000)
            return bad_flag(argv[0], "--max-nodes", "expected a number of rows (0 = all)");
        rows = (uint32_t)v;
    }
    cp_buf b = {0};
    rc = cp_buf_printf(&b, "/api/v1/diff") || common(&b, &o) || add_param(&b, "format", "json") ||
         add_param(&b, "focus", o.focus) || add_param(&b, "ignore", o.ignore) ||
         add_param(&b, "sample_type", o.sample_type) ||
         add_param(&b, "base_select", o.base_select) || add_param(&b, "base_from", o.base_from) ||
         add_param(&b, "base_to", o.base_to);
    rc = rc ? 1 : answer(argv[0], &o, &b, cp_view_diff, rows);
    cp_buf_close(&b);
    return rc;
}

int cp_cmd_series(int argc, char **argv)
{
    qopts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    if (only_table_or_json(argv[0], &o)) return 2;
    cp_buf b = {0};
    rc = cp_buf_printf(&b, "/api/v1/series") || common(&b, &o);
    rc = rc ? 1 : answer(argv[0], &o, &b, view_series, 0);
    cp_buf_close(&b);
    return rc;
}

int cp_cmd_timeline(int argc, char **argv)
{
    qopts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    if (only_table_or_json(argv[0], &o)) return 2;
    cp_buf b = {0};
    rc = cp_buf_printf(&b, "/api/v1/timeline") || common(&b, &o) || add_param(&b, "step", o.step);
    rc = rc ? 1 : answer(argv[0], &o, &b, view_timeline, 0);
    cp_buf_close(&b);
    return rc;
}

int cp_cmd_labels(int argc, char **argv)
{
    qopts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    if (only_table_or_json(argv[0], &o)) return 2;
    cp_buf b = {0};
    if (optind < argc) {
        rc = cp_buf_printf(&b, "/api/v1/labels/") || cp_url_encode(&b, argv[optind]) ||
             cp_buf_printf(&b, "/values");
    } else {
        rc = cp_buf_printf(&b, "/api/v1/labels");
    }
    rc = rc ? 1 : answer(argv[0], &o, &b, view_labels, 0);
    cp_buf_close(&b);
    return rc;
}
