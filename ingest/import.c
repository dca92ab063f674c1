/* `contprof import`: reads pprof files (raw or gzip'd), wraps each in an envelope (a Go heap
 * profile becomes a cumulative alloc envelope and an inuse envelope) and produces them to
 * contprof.profiles, keyed by series so a series stays on one partition. */
#include "import.h"
#include "envelope.h"
#include "error.h"
#include "pprof.h"
#include "times.h"

#include <errno.h>
#include <librdkafka/rdkafka.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOPIC "contprof.profiles"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: contprof import [--server URL | --brokers LIST] [--tenant T] [--service S]\n"
            "                       [--label k=v]... [--at TIME --duration D] FILE...\n"
            "  --server URL    ask contprofd (GET /api/v1/brokers) where Kafka is\n"
            "                  (default http://127.0.0.1:7070)\n"
            "  --brokers LIST  Kafka bootstrap servers, host:port,...\n"
            "  --tenant T      tenant (default \"default\")\n"
            "  --token T       contprofd's bearer token for the tenant (or CONTPROF_TOKEN)\n"
            "  --service S     service label (default \"import\")\n"
            "  --label k=v     another label (repeatable; at most %d labels with service,\n"
            "                  values at most %d bytes: ingest's limits, checked before sending)\n"
            "  --at TIME       window start instead of the profile's time_nanos: RFC 3339,\n"
            "                  unix seconds, now, now-15m or -1h (the query API's grammar)\n"
            "  --duration D    window length (10s, 1m, ...; a bare number is seconds; at most\n"
            "                  1d) instead of duration_nanos\n\n"
            "examples:\n"
            "  contprof import --server http://127.0.0.1:7070 --service legacy *.pb.gz\n"
            "  contprof import --service api --label version=1.4 --at now-10s --duration 10s "
            "cpu.pb.gz\n",
            CP_LABELS_MAX, CP_LABEL_VALUE_MAX);
}

/* GET URL/api/v1/brokers -> {"brokers":"h:p,..."}. A small HTTP/1.0 client: we write the
 * request and only read the status line and a JSON string field of the body. */
static char *ask_server(const char *url, const char *token, char *why, size_t whylen)
{
    const char *h = url;
    if (!strncmp(h, "http://", 7))
        h += 7;
    else if (strstr(h, "://")) {
        snprintf(why, whylen, "only http:// servers are supported: %s", url);
        return NULL;
    }
    char host[256], port[16] = "80";
    size_t hl = strcspn(h, ":/");
    if (hl >= sizeof host) hl = sizeof host - 1;
    memcpy(host, h, hl);
    host[hl] = 0;
    if (h[hl] == ':')
        snprintf(port, sizeof port, "%.*s", (int)strcspn(h + hl + 1, "/"), h + hl + 1);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int ge = getaddrinfo(host, port, &hints, &ai);
    if (ge) {
        snprintf(why, whylen, "%s: %s", url, gai_strerror(ge));
        return NULL;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        snprintf(why, whylen, "cannot connect to %s: %s", url, strerror(errno));
        return NULL;
    }
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "GET /api/v1/brokers HTTP/1.0\r\nHost: %s\r\nAccept: application/json\r\n"
                     "%s%.256s%s\r\n",
                     host, token ? "Authorization: Bearer " : "", token ? token : "",
                     token ? "\r\n" : "");
    if (n < 0 || n >= (int)sizeof req || write(fd, req, (size_t)n) != n) {
        close(fd);
        snprintf(why, whylen, "%s: write failed", url);
        return NULL;
    }
    char buf[65536];
    size_t len = 0;
    ssize_t r;
    while (len < sizeof buf - 1 && (r = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t)r;
    close(fd);
    buf[len] = 0;
    int status = 0;
    if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1 || status != 200) {
        snprintf(why, whylen, "%s/api/v1/brokers answered %.80s", url, buf);
        return NULL;
    }
    char *body = strstr(buf, "\r\n\r\n");
    char *k = body ? strstr(body, "\"brokers\"") : NULL;
    char *q = k ? strchr(k + 9, '"') : NULL;
    char *e = q ? strchr(q + 1, '"') : NULL;
    if (!e) {
        snprintf(why, whylen, "%s/api/v1/brokers: no \"brokers\" in the answer", url);
        return NULL;
    }
    *e = 0;
    return strdup(q + 1);
}

typedef struct imp {
    rd_kafka_t *rk;
    int failed, delivered;
    const char *tenant, *service;
    const char *token; /* signs each envelope (NULL = unsigned) */
    char **labels; /* k=v */
    int nlabels;
    int64_t at, dur;
    char producer[128];
    uint64_t seq;
} imp;

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    imp *im = opaque;
    if (m->err) {
        im->failed++;
        fprintf(stderr, "contprof import: delivery failed: %s\n", rd_kafka_err2str(m->err));
    } else {
        im->delivered++;
    }
}

static int has_type(const cp_profile *p, const char *t)
{
    return cp_profile_find_type(p, t) >= 0;
}

/* 1, with the cause printed, if ingest would refuse the envelope e (encoded as enc): the
 * consumer's own checks (cp_envelope_validate, then decoding with its default size limit),
 * run before sending, so that nothing ingest sends to the DLQ is reported delivered. */
static int refused(const char *file, const cp_envelope *e, const cp_buf *enc)
{
    cp_envelope v = *e, back = {0};
    cp_err err = {0};
    v.format_major = CP_ENVELOPE_MAJOR;
    v.format_minor = CP_ENVELOPE_MINOR;
    int rc = cp_envelope_validate(&v, CP_INGEST_MAX_PPROF, &err);
    if (!rc) rc = cp_envelope_decode_view(enc->data, enc->len, CP_INGEST_MAX_PPROF, &back, &err);
    cp_envelope_close(&back);
    if (rc)
        fprintf(stderr, "contprof import: %s: not sent, ingest would refuse it: %s\n", file,
                err.msg);
    return rc != 0;
}

/* Produces one envelope of kind with profile p (encoded raw; Kafka compresses). */
static int send_one(imp *im, const char *file, cp_kind kind, int cumulative, const cp_profile *p)
{
    cp_envelope e = {0};
    cp_buf pp = {0}, enc = {0}, key = {0};
    int rc = 0;
    e.tenant = (char *)im->tenant;
    e.kind = kind;
    e.window_start_ns = im->at ? im->at : p->time_nanos;
    e.window_duration_ns = im->dur ? im->dur : p->duration_nanos;
    if (!e.window_start_ns) {
        fprintf(stderr, "contprof import: %s: the profile has no time_nanos; give --at\n", file);
        return 1;
    }
    if (e.window_duration_ns <= 0) e.window_duration_ns = 10000000000LL;
    e.producer_id = im->producer;
    e.sequence = ++im->seq;
    e.cumulative = cumulative;
    if (cp_labels_set(&e.labels, "service", im->service)) rc = 1;
    for (int i = 0; i < im->nlabels && !rc; i++) {
        const char *eq = strchr(im->labels[i], '=');
        char name[CP_LABEL_NAME_MAX + 1];
        snprintf(name, sizeof name, "%.*s", (int)(eq - im->labels[i]), im->labels[i]);
        rc = cp_labels_set(&e.labels, name, eq + 1) != 0;
    }
    if (!rc) rc = cp_pprof_encode(p, 0, &pp) != 0;
    e.pprof = pp.data;
    e.pprof_len = pp.len;
    if (!rc) rc = cp_envelope_encode(&e, &enc) != 0 || cp_envelope_series_key(&e, &key) != 0;
    if (!rc && refused(file, &e, &enc)) {
        rc = 1;
        goto done;
    }
    if (!rc && im->token) rc = cp_envelope_sign(&enc, im->token) != 0;
    if (rc) {
        fprintf(stderr, "contprof import: %s: out of memory\n", file);
    } else {
        for (int tries = 0;; tries++) {
            rd_kafka_resp_err_t ke = rd_kafka_producev(
                im->rk, RD_KAFKA_V_TOPIC(TOPIC), RD_KAFKA_V_VALUE(enc.data, enc.len),
                RD_KAFKA_V_KEY(key.data, key.len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                RD_KAFKA_V_END);
            if (!ke) break;
            if (ke != RD_KAFKA_RESP_ERR__QUEUE_FULL || tries > 600) {
                fprintf(stderr, "contprof import: %s: %s\n", file, rd_kafka_err2str(ke));
                rc = 1;
                break;
            }
            rd_kafka_poll(im->rk, 100);
        }
    }
done:
    cp_labels_close(&e.labels);
    cp_buf_close(&pp);
    cp_buf_close(&enc);
    cp_buf_close(&key);
    return rc;
}

static int import_file(imp *im, const char *file)
{
    cp_buf b = {0};
    if (cp_read_file(file, &b)) {
        fprintf(stderr, "contprof import: cannot read %s: %s\n", file, strerror(errno));
        return 1;
    }
    cp_profile *p = NULL;
    cp_err err = {0};
    int rc = cp_pprof_decode(b.data, b.len, NULL, &p, &err);
    cp_buf_close(&b);
    if (rc) {
        fprintf(stderr, "contprof import: %s: %s\n", file, err.msg);
        return 1;
    }
    int alloc = has_type(p, "alloc_objects") && has_type(p, "alloc_space");
    int inuse = has_type(p, "inuse_objects") && has_type(p, "inuse_space");
    if (alloc || inuse) {
        if (alloc) {
            cp_profile *a = cp_profile_clone(p);
            const char *t[2] = {"alloc_objects", "alloc_space"};
            rc = !a || cp_profile_select_types(a, t, 2, &err) ||
                 send_one(im, file, CP_KIND_ALLOC, 1, a);
            cp_profile_destroy(a);
        }
        if (inuse && !rc) {
            cp_profile *u = cp_profile_clone(p);
            const char *t[2] = {"inuse_objects", "inuse_space"};
            rc = !u || cp_profile_select_types(u, t, 2, &err) ||
                 send_one(im, file, CP_KIND_INUSE, 0, u);
            cp_profile_destroy(u);
        }
    } else if (p->sample_types.n) {
        /* CPU and anything else sampled over time (samples/count + cpu/nanoseconds, ...) */
        rc = send_one(im, file, CP_KIND_CPU, 0, p);
    } else {
        fprintf(stderr, "contprof import: %s: the profile has no sample types\n", file);
        rc = 1;
    }
    cp_profile_destroy(p);
    return rc;
}

/* Ingest's limits on labels, checked before anything is sent: distinct names (service
 * and every --label; a repeated name keeps its last value) at most CP_LABELS_MAX, the
 * service's value at most CP_LABEL_VALUE_MAX bytes. 0, or 2 with the cause printed. */
static int check_labels(const imp *im)
{
    cp_labels l = {0};
    int rc = cp_labels_set(&l, "service", im->service);
    for (int i = 0; i < im->nlabels && !rc; i++) {
        const char *eq = strchr(im->labels[i], '=');
        char name[CP_LABEL_NAME_MAX + 1];
        snprintf(name, sizeof name, "%.*s", (int)(eq - im->labels[i]), im->labels[i]);
        rc = cp_labels_set(&l, name, eq + 1);
    }
    uint32_t n = l.p.n;
    cp_labels_close(&l);
    if (rc) {
        fprintf(stderr, "contprof import: out of memory\n");
        return 1;
    }
    if (n > CP_LABELS_MAX) {
        fprintf(stderr,
                "contprof import: %u distinct labels (service and --label): ingest accepts at "
                "most %d labels per series\n",
                n, CP_LABELS_MAX);
        return 2;
    }
    if (strlen(im->service) > CP_LABEL_VALUE_MAX) {
        fprintf(stderr,
                "contprof import: --service: the value is %zu bytes, over the limit of %d bytes "
                "per label value\n",
                strlen(im->service), CP_LABEL_VALUE_MAX);
        return 2;
    }
    return 0;
}

int cp_cmd_import(int argc, char **argv)
{
    imp im = {0};
    const char *server = NULL, *brokers = NULL, *token = getenv("CONTPROF_TOKEN");
    im.tenant = CP_DEFAULT_TENANT;
    im.service = "import";
    char **files = calloc((size_t)argc + 1, sizeof *files);
    im.labels = calloc((size_t)argc + 1, sizeof *im.labels);
    int nfiles = 0, rc = 0;
    char *fetched = NULL;
    if (!files || !im.labels) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            goto out;
        } else if (a[0] == '-' && a[1] == '-' && !v) {
            fprintf(stderr, "contprof import: %s needs a value\n", a);
            rc = 2;
            goto out;
        } else if (!strcmp(a, "--server"))
            server = argv[++i];
        else if (!strcmp(a, "--brokers"))
            brokers = argv[++i];
        else if (!strcmp(a, "--tenant"))
            im.tenant = argv[++i];
        else if (!strcmp(a, "--token"))
            token = argv[++i];
        else if (!strcmp(a, "--service"))
            im.service = argv[++i];
        else if (!strcmp(a, "--label")) {
            const char *eq = strchr(v, '=');
            char name[CP_LABEL_NAME_MAX + 2] = {0};
            if (eq && (size_t)(eq - v) <= CP_LABEL_NAME_MAX) memcpy(name, v, (size_t)(eq - v));
            if (!eq || !cp_label_name_valid(name)) {
                fprintf(stderr,
                        "contprof import: --label %s: expected name=value with a name "
                        "like [A-Za-z_][A-Za-z0-9_]*\n",
                        v);
                rc = 2;
                goto out;
            }
            if (strlen(eq + 1) > CP_LABEL_VALUE_MAX) {
                fprintf(stderr,
                        "contprof import: --label %s: the value is %zu bytes, over the limit of "
                        "%d bytes per label value\n",
                        name, strlen(eq + 1), CP_LABEL_VALUE_MAX);
                rc = 2;
                goto out;
            }
            im.labels[im.nlabels++] = argv[++i];
        } else if (!strcmp(a, "--at") || !strcmp(a, "--duration")) {
            cp_err err = {0};
            if (a[2] == 'a' ? cp_parse_time(argv[++i], cp_now_ns(), &im.at, &err)
                            : cp_parse_duration(argv[++i], 0, &im.dur, &err)) {
                fprintf(stderr, "contprof import: %s: %s\n", a, err.msg);
                rc = 2;
                goto out;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "contprof import: unknown option %s\n", a);
            usage(stderr);
            rc = 2;
            goto out;
        } else {
            files[nfiles++] = argv[i];
        }
    }
    if (!nfiles) {
        usage(stderr);
        rc = 2;
        goto out;
    }
    if ((rc = check_labels(&im)) != 0) goto out;
    if (server && brokers) {
        fprintf(stderr, "contprof import: give --server or --brokers, not both\n");
        rc = 2;
        goto out;
    }
    if (!brokers) {
        char why[300];
        fetched = ask_server(server ? server : "http://127.0.0.1:7070",
                             token && *token ? token : NULL, why, sizeof why);
        if (!fetched) {
            fprintf(stderr, "contprof import: %s\n", why);
            rc = 1;
            goto out;
        }
        brokers = fetched;
    }
    im.token = token && *token ? token : NULL;
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(im.producer, sizeof im.producer, "import-%s-%d-%lld", host, (int)getpid(),
             (long long)time(NULL));
    char es[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if (rd_kafka_conf_set(c, "bootstrap.servers", brokers, es, sizeof es) ||
        rd_kafka_conf_set(c, "enable.idempotence", "true", es, sizeof es) ||
        rd_kafka_conf_set(c, "compression.type", "lz4", es, sizeof es) ||
        rd_kafka_conf_set(c, "message.max.bytes", "16777216", es, sizeof es) ||
        rd_kafka_conf_set(c, "message.timeout.ms", "60000", es, sizeof es)) {
        fprintf(stderr, "contprof import: kafka: %s\n", es);
        rd_kafka_conf_destroy(c);
        rc = 1;
        goto out;
    }
    rd_kafka_conf_set_dr_msg_cb(c, dr_cb);
    rd_kafka_conf_set_opaque(c, &im);
    im.rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, es, sizeof es);
    if (!im.rk) {
        fprintf(stderr, "contprof import: kafka: %s\n", es);
        rd_kafka_conf_destroy(c);
        rc = 1;
        goto out;
    }
    int bar = nfiles >= 20 && isatty(2), bad = 0;
    for (int i = 0; i < nfiles; i++) {
        bad += import_file(&im, files[i]) != 0;
        rd_kafka_poll(im.rk, 0);
        if (bar && (i % 8 == 0 || i == nfiles - 1)) {
            int w = 40, done = (i + 1) * w / nfiles;
            fprintf(stderr, "\r[%.*s%*s] %d/%d files", done,
                    "########################################", w - done, "", i + 1, nfiles);
        }
    }
    if (bar) fputc('\n', stderr);
    rd_kafka_resp_err_t fe = rd_kafka_flush(im.rk, 60000);
    if (fe)
        fprintf(stderr, "contprof import: %s: %d messages not delivered\n", rd_kafka_err2str(fe),
                rd_kafka_outq_len(im.rk));
    fprintf(stderr, "contprof import: %d envelope(s) from %d file(s) delivered to %s%s\n",
            im.delivered, nfiles - bad, brokers,
            bad ? "; some files were skipped (see above)" : "");
    rc = bad || im.failed || fe ? 1 : 0;
out:
    if (im.rk) rd_kafka_destroy(im.rk);
    free(fetched);
    free(files);
    free(im.labels);
    return rc;
}
