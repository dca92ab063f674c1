/* On-demand captures: the server's captures object and its endpoints (captures.h). The
 * record is the store's, the agents hear of it on the control topic, and the answer is
 * read back through the request's readers, so a cluster's captures are answered from
 * every node. */
#include "captures.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "envelope.h"
#include "fanout.h"
#include "http_client.h"
#include "json.h"
#include "log.h"
#include "selector.h"

void cp_captures_options_default(cp_captures_options *o)
{
    memset(o, 0, sizeof *o);
    o->max_concurrent = 4;
    o->max_duration_ns = 5LL * 60 * 1000000000;
    o->max_hz = 1000;
    o->min_alloc_rate = 4096;
    o->max_overhead_permille = 20;
}

uint32_t cp_captures_budget_permille(const cp_captures_options *o, int64_t duration_ns)
{
    if (duration_ns <= 0) duration_ns = 1;
    double b = (double)o->max_overhead_permille * (double)o->max_duration_ns / (double)duration_ns;
    if (b < o->max_overhead_permille) b = o->max_overhead_permille;
    return b > 1000 ? 1000 : (uint32_t)b;
}

/* Where a limit is changed: contprofd's config file. */
static const char *conf_of(const cp_captures_options *o)
{
    return o->config_file && o->config_file[0] ? o->config_file
                                               : "contprofd's --config file (none given)";
}

struct cp_captures {
    cp_captures_options o; /* config_file and tenant_tokens: the object's copies */
    /* Counting a tenant's running captures and storing a new one is one step: two requests
     * at once cannot both take the last slot. */
    pthread_mutex_t start_mu;
    /* The records polling agents read (GET /api/v1/control/captures): every tenant's
     * running ones (an agent ends a capture its poll no longer lists), at most
     * captures.max_concurrent a tenant whatever the history; read again from the store only
     * when its records changed (cp_store_captures_gen) or one of them ended, so that a poll
     * costs no LevelDB scan. */
    pthread_mutex_t live_mu;
    int live_valid;
    uint64_t live_gen;
    int64_t live_first_end_ns; /* past it, one has ended */
    cp_store_capture_list live;
};

/* The first token of tenant (signs its control messages), or NULL. */
static const char *token_of(const cp_captures *cs, const char *tenant)
{
    for (const char *const *t = cs->o.tenant_tokens; t && t[0]; t += 2)
        if (strcmp(t[0], tenant) == 0) return t[1];
    return NULL;
}

int cp_captures_create(const cp_captures_options *o, cp_captures **out)
{
    *out = NULL;
    cp_captures *cs = calloc(1, sizeof *cs);
    if (!cs) return CP_ENOMEM;
    cs->o = *o;
    cs->o.config_file = NULL;
    cs->o.tenant_tokens = NULL;
    pthread_mutex_init(&cs->start_mu, NULL);
    pthread_mutex_init(&cs->live_mu, NULL);
    if (o->config_file && !(cs->o.config_file = strdup(o->config_file))) goto fail;
    size_t n = 0;
    while (o->tenant_tokens && o->tenant_tokens[n])
        n++;
    if (n) {
        char **t = calloc(n + 1, sizeof *t);
        if (!t) goto fail;
        cs->o.tenant_tokens = (const char *const *)t;
        for (size_t i = 0; i < n; i++)
            if (!(t[i] = strdup(o->tenant_tokens[i]))) goto fail;
    }
    *out = cs;
    return 0;
fail:
    cp_captures_destroy(cs);
    return CP_ENOMEM;
}

void cp_captures_destroy(cp_captures *cs)
{
    if (!cs) return;
    for (char *const *t = (char *const *)cs->o.tenant_tokens; t && *t; t++)
        free(*t);
    free((void *)cs->o.tenant_tokens);
    free((char *)cs->o.config_file);
    cp_store_capture_list_close(&cs->live);
    pthread_mutex_destroy(&cs->start_mu);
    pthread_mutex_destroy(&cs->live_mu);
    free(cs);
}

/* How far ahead of this node's clock a peer's record may start (the nodes' clocks differ). */
#define CP_CAPTURES_PEER_SKEW_NS (60LL * 1000000000)

/* Ended and cancelled records kept per tenant, for GET /api/v1/captures/ID after the end;
 * older ones are removed as new captures start, so history never grows the work of a start
 * or the list (issue 36). */
#define CP_CAPTURES_KEEP_ENDED 100

static int by_end(const void *a, const void *b)
{
    const cp_capture *x = *(const cp_capture *const *)a, *y = *(const cp_capture *const *)b;
    return x->end_ns < y->end_ns ? -1 : x->end_ns > y->end_ns;
}

/* Under start_mu: the tenant's running captures into *running, and its ended and
 * cancelled records beyond CP_CAPTURES_KEEP_ENDED removed, oldest end first. 0, or an error
 * in err. */
static int running_and_prune(cp_store *store, const char *tenant, int64_t now, uint32_t *running,
                             cp_err *err)
{
    cp_store_capture_list l = {0};
    int rc = cp_store_captures(store, tenant, &l, err);
    *running = 0;
    const cp_capture **old = rc ? NULL : calloc(l.n + 1, sizeof *old);
    uint32_t nold = 0;
    if (!rc && !old) rc = cp_err_set(err, CP_ENOMEM, "capture records");
    for (uint32_t i = 0; !rc && i < l.n; i++) {
        if (cp_capture_live(&l.v[i], now))
            (*running)++;
        else
            old[nold++] = &l.v[i];
    }
    if (!rc && nold > CP_CAPTURES_KEEP_ENDED) {
        qsort(old, nold, sizeof *old, by_end);
        for (uint32_t i = 0; !rc && i < nold - CP_CAPTURES_KEEP_ENDED; i++)
            rc = cp_store_delete_capture(store, tenant, old[i]->id, err);
    }
    free(old);
    cp_store_capture_list_close(&l);
    return rc;
}

static int json_str(cp_buf *b, const char *s)
{
    if (cp_buf_append(b, "\"", 1) || cp_json_escape(b, s, strlen(s)) || cp_buf_append(b, "\"", 1))
        return CP_ENOMEM;
    return 0;
}

static void oom(cp_http_response *r)
{
    cp_buf_close(&r->body);
    cp_http_error(r, 503, "out of memory while answering");
}

static const char *state_of(const cp_capture *c, int64_t now)
{
    if (cp_capture_live(c, now)) return "running";
    return c->cancelled ? "cancelled" : "done";
}

/* The capture's own members (no braces). */
static int capture_json(cp_buf *b, const cp_capture *c, int64_t now)
{
    char f[40], t[40];
    cp_format_time(c->start_ns, f, sizeof f);
    cp_format_time(c->end_ns, t, sizeof t);
    int rc = cp_buf_printf(b, "\"id\":");
    if (!rc) rc = json_str(b, c->id);
    if (!rc) rc = cp_buf_printf(b, ",\"tenant\":");
    if (!rc) rc = json_str(b, c->tenant);
    if (!rc) rc = cp_buf_printf(b, ",\"select\":");
    if (!rc) rc = json_str(b, c->selector ? c->selector : "");
    if (!rc)
        rc = cp_buf_printf(
            b,
            ",\"type\":\"%s\",\"hz\":%u,\"alloc_rate\":%" PRId64
            ",\"start\":\"%s\",\"end\":\"%s\",\"start_ns\":%" PRId64 ",\"end_ns\":%" PRId64
            ",\"duration_seconds\":%.3f,\"max_overhead_permille\":%u,"
            "\"state\":\"%s\"",
            cp_kind_name(c->kind), c->kind == CP_KIND_CPU ? c->cpu_hz : 0,
            c->kind == CP_KIND_ALLOC ? c->alloc_rate : 0, f, t, c->start_ns, c->end_ns,
            (double)(c->end_ns - c->start_ns) / 1e9, c->max_overhead_permille, state_of(c, now));
    return rc;
}

/* ---- POST --------------------------------------------------------------------------- */

static void new_id(char *out, size_t cap)
{
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = (uint32_t)cp_mono_ns();
    snprintf(out, cap, "c%" PRIx64 "-%08x", (uint64_t)cp_now_ns() / 1000000, rnd);
}

/* A peer's record within this node's limits, as a new capture here would be: 0, or -1
 * with a 400 naming the key. What a node keeps it serves its polling agents, so a record
 * is never trusted further than a request (issue 36). */
static int peer_record_in_limits(const cp_captures_options *o, const cp_capture *cap, int64_t now,
                                 cp_http_response *r)
{
    const char *id = cap->id;
    if (cap->end_ns <= cap->start_ns || cap->end_ns - cap->start_ns > o->max_duration_ns)
        cp_http_error(r, 400,
                      "capture record %s from a peer: duration %.0f s is outside the limit "
                      "captures.max_duration (%.0f s)",
                      id, (double)(cap->end_ns - cap->start_ns) / 1e9,
                      (double)o->max_duration_ns / 1e9);
    else if (cap->start_ns > now + CP_CAPTURES_PEER_SKEW_NS)
        cp_http_error(r, 400, "capture record %s from a peer starts %.0f s from now", id,
                      (double)(cap->start_ns - now) / 1e9);
    else if (cap->kind == CP_KIND_CPU && (cap->cpu_hz == 0 || cap->cpu_hz > o->max_hz))
        cp_http_error(r, 400,
                      "capture record %s from a peer: hz %u is outside the limit "
                      "captures.max_hz (%u)",
                      id, cap->cpu_hz, o->max_hz);
    else if (cap->kind == CP_KIND_ALLOC && cap->alloc_rate < o->min_alloc_rate)
        cp_http_error(r, 400,
                      "capture record %s from a peer: alloc_rate %" PRId64
                      " is under the limit captures.min_alloc_rate (%" PRId64 ")",
                      id, cap->alloc_rate, o->min_alloc_rate);
    else if (cap->max_overhead_permille == 0 ||
             cap->max_overhead_permille >
                 cp_captures_budget_permille(o, cap->end_ns - cap->start_ns))
        cp_http_error(r, 400,
                      "capture record %s from a peer: max_overhead_permille %u is outside "
                      "1..%u, the budget captures.max_overhead_permille (%u in %s) gives its "
                      "duration",
                      id, cap->max_overhead_permille,
                      cp_captures_budget_permille(o, cap->end_ns - cap->start_ns),
                      o->max_overhead_permille, conf_of(o));
    else
        return 0;
    return -1;
}

/* A peer passes a record on (its node published it): kept if it is within this node's
 * limits, counted against captures.max_concurrent under the same lock as a new capture; a
 * cancelled record stays cancelled. */
static void keep_peer_record(cp_captures *cs, const cp_http_request *req, const cp_query *q,
                             cp_http_response *r)
{
    cp_capture cap, old;
    cp_err err = {0};
    int64_t now = cp_now_ns();
    if (cp_capture_decode(req->body, req->body_len, &cap, &err)) {
        cp_http_error(r, 400, "capture record from a peer: %s", err.msg);
        return;
    }
    if (strcmp(cap.tenant, q->tenant) != 0) {
        cp_http_error(r, 403, "capture record of tenant '%s' sent as tenant '%s'", cap.tenant,
                      q->tenant);
        cp_capture_close(&cap);
        return;
    }
    if (cp_capture_validate(&cap, &err)) {
        cp_http_error(r, 400, "capture record %s from a peer: %s", cap.id, err.msg);
        cp_capture_close(&cap);
        return;
    }
    if (!cap.cancelled && peer_record_in_limits(&cs->o, &cap, now, r)) {
        cp_capture_close(&cap);
        return;
    }
    pthread_mutex_lock(&cs->start_mu);
    int rc = cp_store_get_capture(cs->o.store, cap.tenant, cap.id, &old, &err);
    int known = rc == 0, was_cancelled = known && old.cancelled;
    if (known) cp_capture_close(&old);
    uint32_t running = 0;
    if ((rc == 0 || rc == CP_ENOTFOUND) && !known && cp_capture_live(&cap, now))
        rc = running_and_prune(cs->o.store, cap.tenant, now, &running, &err);
    if (rc && rc != CP_ENOTFOUND)
        cp_http_error(r, 500, "%s", err.msg);
    else if (was_cancelled && !cap.cancelled)
        cp_http_error(
            r, 409, "capture %s is cancelled here: a cancelled capture does not run again", cap.id);
    else if (!known && cp_capture_live(&cap, now) && running >= cs->o.max_concurrent)
        cp_http_error(r, 429,
                      "capture record %s from a peer: tenant %s has %u captures running here, "
                      "the limit captures.max_concurrent is %u",
                      cap.id, cap.tenant, running, cs->o.max_concurrent);
    else if (cp_store_put_capture(cs->o.store, &cap, &err))
        cp_http_error(r, 500, "%s", err.msg);
    else if (cp_buf_printf(&r->body, "{\"kept\":true}\n"))
        oom(r);
    pthread_mutex_unlock(&cs->start_mu);
    cp_capture_close(&cap);
}

/* Stores cap, passes it on to the peers and publishes it. 0, or an error answer set. */
static int store_and_publish(cp_captures *cs, const cp_query *q, cp_fanout_req *fr,
                             const cp_capture *cap, cp_http_response *r)
{
    cp_err err = {0};
    if (cp_store_put_capture(cs->o.store, cap, &err)) {
        cp_http_error(r, err.code == CP_EINVAL ? 400 : 500, "%s", err.msg);
        return -1;
    }
    cp_buf rec = {0};
    if (cp_capture_encode(cap, NULL, &rec) ||
        cp_fanout_upload(fr, q, "/api/v1/captures", rec.data, rec.len, &err)) {
        cp_buf_close(&rec);
        oom(r);
        return -1;
    }
    cp_buf_close(&rec);
    if (cs->o.publish(cs->o.publish_arg, cap, token_of(cs, cap->tenant), &err)) {
        cp_log_error("capture %s of tenant %s: %s", cap->id, cap->tenant, err.msg);
        if (!cap->cancelled) { /* never heard of: not running, not resumed at a restart */
            cp_capture dead = *cap;
            dead.cancelled = 1;
            cp_err e2 = {0};
            if (cp_store_put_capture(cs->o.store, &dead, &e2))
                cp_log_error("capture %s: %s", cap->id, e2.msg);
        }
        cp_http_error(r, 503, "the capture could not be written to the control topic: %s", err.msg);
        return -1;
    }
    return 0;
}

void cp_captures_post(cp_captures *cs, const cp_http_request *req, const cp_query *q,
                      const cp_params *pa, cp_fanout_req *fr, cp_http_response *r)
{
    /* a peer passing a record on: by the cluster token only */
    if (cp_fanout_is_peer(cs->o.fanout, req)) {
        keep_peer_record(cs, req, q, r);
        return;
    }
    const cp_captures_options *o = &cs->o;
    if (!o->publish) {
        cp_http_error(r, 503, "this server does not run captures (no control topic)");
        return;
    }
    const char *sel = cp_params_get(pa, "select"), *ty = cp_params_get(pa, "type"),
               *du = cp_params_get(pa, "duration"), *hz = cp_params_get(pa, "hz"),
               *ar = cp_params_get(pa, "alloc_rate");
    cp_err err = {0};
    cp_capture cap = {0};
    int64_t now = cp_now_ns();
    if (!sel || !*sel) {
        cp_http_error(r, 400,
                      "select= is required: the isolates to capture, e.g. "
                      "{service=\"edge\",isolate=\"counter\"}");
        return;
    }
    if (strstr(sel, CP_CAPTURE_LABEL)) {
        cp_selector s = {0};
        int named = 0;
        if (!cp_selector_parse(sel, &s, NULL))
            for (uint32_t i = 0; i < s.n; i++)
                named |= strcmp(s.m[i].name, CP_CAPTURE_LABEL) == 0;
        cp_selector_close(&s);
        if (named) {
            cp_http_error(r, 400,
                          "select: a capture selects isolates; the label '%s' is a "
                          "capture's own",
                          CP_CAPTURE_LABEL);
            return;
        }
    }
    cap.kind = !ty || !*ty ? CP_KIND_CPU : (cp_kind)cp_kind_parse(ty);
    if (cap.kind != CP_KIND_CPU && cap.kind != CP_KIND_ALLOC && cap.kind != CP_KIND_HEAP) {
        cp_http_error(r, 400, "bad type '%.32s' (a capture is cpu, alloc or heap)", ty);
        return;
    }
    int64_t dur = 30LL * 1000000000;
    if (du && *du && cp_parse_duration(du, 0, &dur, &err)) {
        cp_http_error(r, 400, "duration: %s", err.msg);
        return;
    }
    if (dur > o->max_duration_ns) {
        cp_http_error(r, 400,
                      "duration %.0f s is over the limit captures.max_duration (%.0f s in %s)",
                      (double)dur / 1e9, (double)o->max_duration_ns / 1e9, conf_of(o));
        return;
    }
    if (hz && *hz && cap.kind != CP_KIND_CPU) {
        cp_http_error(r, 400, "hz= is for type=cpu; type=alloc takes alloc_rate=BYTES");
        return;
    }
    if (ar && *ar && cap.kind != CP_KIND_ALLOC) {
        cp_http_error(r, 400, "alloc_rate= is for type=alloc; type=cpu takes hz=");
        return;
    }
    if (cap.kind == CP_KIND_HEAP) {
        /* one heap snapshot of each matched V8 isolate, taken by `contprof v8` */
    } else if (cap.kind == CP_KIND_CPU) {
        unsigned long long v = o->max_hz < 1000 ? o->max_hz : 1000;
        char *end = NULL;
        if (hz && *hz && ((v = strtoull(hz, &end, 10)), *end || hz[0] == '-' || v == 0)) {
            cp_http_error(r, 400,
                          "bad hz '%.32s' (a positive whole number of samples per "
                          "CPU-second)",
                          hz);
            return;
        }
        if (v > o->max_hz) {
            cp_http_error(r, 400, "hz %llu is over the limit captures.max_hz (%u in %s)", v,
                          o->max_hz, conf_of(o));
            return;
        }
        cap.cpu_hz = (uint32_t)v;
    } else {
        long long v = o->min_alloc_rate > 4096 ? o->min_alloc_rate : 4096;
        char *end = NULL;
        if (ar && *ar && ((v = strtoll(ar, &end, 10)), *end || v <= 0)) {
            cp_http_error(r, 400, "bad alloc_rate '%.32s' (mean bytes between samples, > 0)", ar);
            return;
        }
        if (v < o->min_alloc_rate) {
            cp_http_error(r, 400,
                          "alloc_rate %lld is under the limit captures.min_alloc_rate (%" PRId64
                          " bytes between samples in %s)",
                          v, o->min_alloc_rate, conf_of(o));
            return;
        }
        cap.alloc_rate = v;
    }
    new_id(cap.id, sizeof cap.id);
    snprintf(cap.tenant, sizeof cap.tenant, "%s", q->tenant);
    cap.start_ns = now;
    cap.end_ns = now + dur;
    cap.max_overhead_permille = cp_captures_budget_permille(o, dur);
    if (!(cap.selector = strdup(sel))) {
        oom(r);
        return;
    }
    if (cp_capture_validate(&cap, &err)) {
        cp_http_error(r, 400, "%s", err.msg);
        cp_capture_close(&cap);
        return;
    }
    /* the limit on running captures: counted and taken under one lock */
    pthread_mutex_lock(&cs->start_mu);
    uint32_t running = 0;
    int rc = running_and_prune(cs->o.store, cap.tenant, now, &running, &err);
    if (rc)
        cp_http_error(r, 500, "%s", err.msg);
    else if (running >= o->max_concurrent)
        cp_http_error(r, 429,
                      "tenant %s has %u captures running: the limit captures.max_concurrent is "
                      "%u in %s (wait for one to end, or DELETE /api/v1/captures/ID)",
                      cap.tenant, running, o->max_concurrent, conf_of(o));
    else if (!store_and_publish(cs, q, fr, &cap, r)) {
        r->status = 201;
        cp_log_info("capture %s of tenant %s started: %s %s for %.1f s", cap.id, cap.tenant,
                    cp_kind_name(cap.kind), cap.selector, (double)dur / 1e9);
        if (cp_buf_printf(&r->body, "{") || capture_json(&r->body, &cap, now) ||
            cp_buf_printf(&r->body, "}\n"))
            oom(r);
    }
    pthread_mutex_unlock(&cs->start_mu);
    cp_capture_close(&cap);
}

/* ---- GET, DELETE -------------------------------------------------------------------- */

/* The tenant's capture records into *l: 0, or -1 with a 500 set. */
static int tenant_captures(cp_captures *cs, const cp_query *q, cp_store_capture_list *l,
                           cp_http_response *r)
{
    cp_err err = {0};
    if (!cp_store_captures(cs->o.store, q->tenant, l, &err)) return 0;
    cp_http_error(r, 500, "%s", err.msg);
    return -1;
}

/* Under cs->live_mu: cs->live holds every tenant's running records. 0, or an error in
 * err. */
static int live_refresh(cp_captures *cs, int64_t now, cp_err *err)
{
    uint64_t gen =
        cp_store_captures_gen(cs->o.store); /* before the read: a write during it shows */
    if (cs->live_valid && gen == cs->live_gen && now < cs->live_first_end_ns) return 0;
    cp_store_capture_list all = {0};
    int rc = cp_store_captures(cs->o.store, NULL, &all, err);
    if (rc) return rc;
    cp_store_capture_list_close(&cs->live);
    cs->live_valid = 1;
    cs->live_gen = gen;
    cs->live_first_end_ns = INT64_MAX;
    for (uint32_t i = 0; i < all.n; i++) {
        int live = cp_capture_live(&all.v[i], now);
        if (live && !cp_vec_push(&cs->live, all.v[i])) {
            if (all.v[i].end_ns < cs->live_first_end_ns) cs->live_first_end_ns = all.v[i].end_ns;
            memset(&all.v[i], 0, sizeof all.v[i]); /* cs->live's now */
        } else if (live) {
            cs->live_valid = 0; /* out of memory: read again next time */
        }
    }
    cp_store_capture_list_close(&all);
    return cs->live_valid ? 0 : cp_err_set(err, CP_ENOMEM, "capture records");
}

void cp_captures_control(cp_captures *cs, const cp_query *q, cp_http_response *r)
{
    int64_t now = cp_now_ns();
    cp_err err = {0};
    const char *token = token_of(cs, q->tenant);
    pthread_mutex_lock(&cs->live_mu);
    int rc = live_refresh(cs, now, &err);
    if (rc) {
        pthread_mutex_unlock(&cs->live_mu);
        cp_http_error(r, rc == CP_ENOMEM ? 503 : 500, "%s", err.msg);
        return;
    }
    for (uint32_t i = 0; !rc && i < cs->live.n; i++)
        if (cp_capture_live(&cs->live.v[i], now) && strcmp(cs->live.v[i].tenant, q->tenant) == 0)
            rc = cp_capture_feed_append(&r->body, &cs->live.v[i], token);
    pthread_mutex_unlock(&cs->live_mu);
    if (rc) {
        oom(r);
        return;
    }
    snprintf(r->content_type, sizeof r->content_type, "application/octet-stream");
}

void cp_captures_list(cp_captures *cs, const cp_query *q, cp_http_response *r)
{
    cp_store_capture_list l = {0};
    if (tenant_captures(cs, q, &l, r)) return;
    int64_t now = cp_now_ns();
    int rc = cp_buf_printf(&r->body, "{\"captures\":[");
    for (uint32_t i = 0; !rc && i < l.n; i++) {
        rc = cp_buf_printf(&r->body, "%s{", i ? "," : "");
        if (!rc) rc = capture_json(&r->body, &l.v[i], now);
        if (!rc) rc = cp_buf_append(&r->body, "}", 1);
    }
    if (!rc) rc = cp_buf_printf(&r->body, "],\"count\":%u}\n", l.n);
    cp_store_capture_list_close(&l);
    if (rc) oom(r);
}

/* The capture named by the path (/api/v1/captures/ID) into *cap; 0, or -1 with a 404. */
static int load(cp_captures *cs, const cp_http_request *req, const cp_query *q, cp_capture *cap,
                cp_http_response *r)
{
    const char *id = req->path + strlen("/api/v1/captures/");
    cp_err err = {0};
    int rc = cp_store_get_capture(cs->o.store, q->tenant, id, cap, &err);
    if (rc == CP_ENOTFOUND) {
        cp_http_error(r, 404, "no capture '%.64s'", id);
        return -1;
    }
    if (rc) {
        cp_http_error(r, 500, "%s", err.msg);
        return -1;
    }
    return 0;
}

/* The labels of s without the capture label, formatted (the isolate's identity). */
static char *isolate_key(const cp_series_info *s)
{
    cp_labels l = {0};
    cp_buf b = {0};
    int rc = 0;
    for (uint32_t i = 0; !rc && i < s->labels.p.n; i++)
        if (strcmp(s->labels.p.v[i].name, CP_CAPTURE_LABEL) != 0)
            rc = cp_labels_set(&l, s->labels.p.v[i].name, s->labels.p.v[i].value);
    if (!rc) rc = cp_labels_format(&l, &b);
    if (!rc) rc = cp_buf_append(&b, "", 1);
    cp_labels_close(&l);
    if (rc) {
        cp_buf_close(&b);
        return NULL;
    }
    return (char *)b.data;
}

static int labels_json(cp_buf *b, const cp_labels *l)
{
    int rc = cp_buf_printf(b, "{");
    uint32_t n = 0;
    for (uint32_t j = 0; !rc && j < l->p.n; j++) {
        if (strcmp(l->p.v[j].name, CP_CAPTURE_LABEL) == 0) continue;
        if (n++) rc = cp_buf_append(b, ",", 1);
        if (!rc) rc = json_str(b, l->p.v[j].name);
        if (!rc) rc = cp_buf_append(b, ":", 1);
        if (!rc) rc = json_str(b, l->p.v[j].value);
    }
    return rc ? rc : cp_buf_printf(b, "}");
}

/* One isolate of the answer; *complete cleared if it did not run whole at the rate asked. */
static int isolate_json(cp_buf *b, const cp_capture *cap, const cp_series_info *got,
                        const cp_series_info *want, int64_t now, int *complete)
{
    const cp_series_info *s = got ? got : want;
    int rc = cp_buf_printf(b, "{\"labels\":");
    if (!rc) rc = labels_json(b, &s->labels);
    if (!got) {
        *complete = 0;
        return rc ? rc
                  : cp_buf_printf(b,
                                  ",\"reached\":false,\"whole\":false,\"ok\":false,\"reason\":\"no "
                                  "capture window from this isolate: its agent did not "
                                  "hear the capture or cannot capture\"}");
    }
    cp_capture_engine said_e;
    int said = cp_capture_engine_parse(got->cap_engine, &said_e);
    int64_t asked = said_e.asked, ran = said_e.ran;
    char reason[512];
    snprintf(reason, sizeof reason, "%s", said_e.reason);
    int64_t until =
        now - CP_CAPTURES_HEAR_NS < cap->end_ns ? now - CP_CAPTURES_HEAR_NS : cap->end_ns;
    /* a heap capture is one snapshot: its window is the whole of it */
    int whole =
        cap->kind == CP_KIND_HEAP || (got->first_ns <= cap->start_ns + CP_CAPTURES_HEAR_NS &&
                                      got->cap_end_ns >= until - CP_CAPTURES_END_NS);
    int rate_ok = said && asked == ran;
    if (!whole || !rate_ok) *complete = 0;
    if (!said)
        snprintf(reason, sizeof reason, "the agent's windows do not say the rate they ran at");
    else if (!whole && !reason[0])
        snprintf(reason, sizeof reason, "its windows cover %.1f s of the capture's %.1f s",
                 (double)(got->cap_end_ns - got->first_ns) / 1e9,
                 (double)(until - cap->start_ns) / 1e9);
    char f[40], t[40];
    cp_format_time(got->first_ns, f, sizeof f);
    cp_format_time(got->cap_end_ns, t, sizeof t);
    if (!rc)
        rc = cp_buf_printf(
            b,
            ",\"reached\":true,\"first\":\"%s\",\"last_end\":\"%s\",\"first_ns\":%" PRId64
            ",\"last_end_ns\":%" PRId64 ",\"windows\":%u,\"samples\":%" PRIu64 ",\"asked\":%" PRId64
            ",\"ran\":%" PRId64 ",\"whole\":%s,\"ok\":%s,\"reason\":",
            f, t, got->first_ns, got->cap_end_ns, got->cap_windows, got->cap_samples, asked, ran,
            whole ? "true" : "false", whole && rate_ok ? "true" : "false");
    if (!rc) rc = json_str(b, reason);
    /* what the capture cost the isolate, when its agent measured it (engine text: the V8
     * source's cost_us_per_s, cost_permille of its CPU; collector/v8/README.md "Cost") */
    if (!rc)
        rc = said_e.has_cost ? cp_buf_printf(b, ",\"cost_us_per_s\":%.0f", said_e.cost_us_per_s)
                             : cp_buf_printf(b, ",\"cost_us_per_s\":null");
    if (!rc)
        rc = said_e.has_permille ? cp_buf_printf(b, ",\"cost_permille\":%.1f", said_e.cost_permille)
                                 : cp_buf_printf(b, ",\"cost_permille\":null");
    if (!rc) rc = cp_buf_printf(b, ",\"engine\":");
    if (!rc) rc = json_str(b, got->cap_engine ? got->cap_engine : "");
    return rc ? rc : cp_buf_append(b, "}", 1);
}

/* Series of sel (text) in [from, to) through the request's readers. */
static int series_of(const cp_query *rq, cp_reader *rd, const char *sel, int64_t from, int64_t to,
                     cp_series_list *out, cp_http_response *r)
{
    cp_query q = *rq;
    memset(&q.sel, 0, sizeof q.sel);
    q.select = sel;
    q.from_ns = from;
    q.to_ns = to;
    q.kind = 0;
    cp_err err = {0};
    if (cp_selector_parse(sel, &q.sel, &err)) {
        cp_http_error(r, 400, "capture selector %s: %s", sel, err.msg);
        return -1;
    }
    int rc = rd->series(rd, &q, out, &err);
    cp_query_close(&q);
    if (rc) cp_http_error(r, rc == CP_ELIMIT ? 503 : 500, "%s", err.msg);
    return rc ? -1 : 0;
}

void cp_captures_get(cp_captures *cs, const cp_http_request *req, const cp_query *q,
                     cp_fanout_req *fr, cp_http_response *r)
{
    cp_capture cap;
    if (load(cs, req, q, &cap, r)) return;
    int64_t now = cp_now_ns();
    char sel[CP_CAPTURE_ID_MAX + 32];
    snprintf(sel, sizeof sel, "{%s=\"%s\"}", CP_CAPTURE_LABEL, cap.id);
    cp_series_list got = {0}, want = {0};
    char **gk = NULL, **wk = NULL;
    int complete = 1, rc = 0;
    /* the capture's windows; and the always-on series its selector names around it (their
     * windows are 10 s long: one that started before the capture was alive in it) */
    if (series_of(q, &fr->reader, sel, cap.start_ns - 60 * 1000000000LL,
                  cap.end_ns + 60 * 1000000000LL, &got, r) ||
        series_of(q, &fr->reader, cap.selector, cap.start_ns - 10 * 1000000000LL,
                  (now < cap.end_ns ? now : cap.end_ns) + 1, &want, r))
        goto out;
    gk = calloc(got.n + 1, sizeof *gk);
    wk = calloc(want.n + 1, sizeof *wk);
    if (!gk || !wk) goto nomem;
    for (uint32_t i = 0; i < got.n; i++)
        if (got.v[i].kind == cap.kind && !(gk[i] = isolate_key(&got.v[i]))) goto nomem;
    for (uint32_t i = 0; i < want.n; i++)
        if (want.v[i].kind == cap.kind && !(wk[i] = isolate_key(&want.v[i]))) goto nomem;
    cp_buf *b = &r->body;
    rc = cp_buf_printf(b, "{");
    if (!rc) rc = capture_json(b, &cap, now);
    if (!rc) rc = cp_buf_printf(b, ",\"isolates\":[");
    uint32_t n = 0, reached = 0;
    for (uint32_t i = 0; !rc && i < got.n; i++) {
        if (!gk[i]) continue;
        if (n++) rc = cp_buf_append(b, ",", 1);
        if (!rc) rc = isolate_json(b, &cap, &got.v[i], NULL, now, &complete);
        reached++;
    }
    for (uint32_t i = 0; !rc && i < want.n; i++) {
        if (!wk[i]) continue;
        int found = 0;
        for (uint32_t j = 0; j < got.n && !found; j++)
            found = gk[j] && strcmp(gk[j], wk[i]) == 0;
        if (found) continue;
        if (n++) rc = cp_buf_append(b, ",", 1);
        if (!rc) rc = isolate_json(b, &cap, NULL, &want.v[i], now, &complete);
    }
    if (!rc)
        rc = cp_buf_printf(b, "],\"matched\":%u,\"reached\":%u,\"complete\":%s}\n", n, reached,
                           n && complete ? "true" : "false");
    if (rc) goto nomem;
    goto out;
nomem:
    oom(r);
out:
    for (uint32_t i = 0; gk && i < got.n; i++)
        free(gk[i]);
    for (uint32_t i = 0; wk && i < want.n; i++)
        free(wk[i]);
    free(gk);
    free(wk);
    cp_series_list_close(&got);
    cp_series_list_close(&want);
    cp_capture_close(&cap);
}

void cp_captures_delete(cp_captures *cs, const cp_http_request *req, const cp_query *q,
                        cp_fanout_req *fr, cp_http_response *r)
{
    cp_capture cap;
    if (load(cs, req, q, &cap, r)) return;
    int64_t now = cp_now_ns();
    if (!cs->o.publish) {
        cp_http_error(r, 503, "this server does not run captures (no control topic)");
    } else if (cp_capture_live(&cap, now)) {
        cap.cancelled = 1;
        if (!store_and_publish(cs, q, fr, &cap, r)) cp_log_info("capture %s cancelled", cap.id);
    }
    if (r->status < 400 && (cp_buf_printf(&r->body, "{") || capture_json(&r->body, &cap, now) ||
                            cp_buf_printf(&r->body, "}\n")))
        oom(r);
    cp_capture_close(&cap);
}

/* ---- start-up ----------------------------------------------------------------------- */

/* Every stored capture still live published again; the others that ended lately logged. */
static void republish(cp_captures *cs)
{
    cp_store_capture_list l = {0};
    cp_err err = {0};
    if (!cs->o.publish) return; /* no control topic: nothing runs */
    if (cp_store_captures(cs->o.store, NULL, &l, &err)) {
        cp_log_error("captures: cannot read the stored captures: %s", err.msg);
        return;
    }
    int64_t now = cp_now_ns();
    uint32_t resumed = 0;
    for (uint32_t i = 0; i < l.n; i++) {
        const cp_capture *c = &l.v[i];
        if (!cp_capture_live(c, now)) {
            /* ended: reported once, at the first start after its end */
            if (c->end_ns > now - 24LL * 3600 * 1000000000)
                cp_log_info("capture %s of tenant %s %s at %.3f (its answer stays at GET "
                            "/api/v1/captures/%s)",
                            c->id, c->tenant, c->cancelled ? "was cancelled" : "ended",
                            (double)c->end_ns / 1e9, c->id);
            continue;
        }
        if (cs->o.publish(cs->o.publish_arg, c, token_of(cs, c->tenant), &err))
            cp_log_error("capture %s of tenant %s still runs until %.3f but could not be "
                         "published again: %s",
                         c->id, c->tenant, (double)c->end_ns / 1e9, err.msg);
        else {
            cp_log_info("capture %s of tenant %s resumed after the restart (%.1f s left)", c->id,
                        c->tenant, (double)(c->end_ns - now) / 1e9);
            resumed++;
        }
    }
    if (l.n) cp_log_info("captures: %u stored, %u resumed", l.n, resumed);
    cp_store_capture_list_close(&l);
}

/* A running capture a peer holds: kept here if this node does not hold it. */
typedef struct pulled {
    cp_store *store;
    const char *tenant, *token;
    uint32_t kept;
} pulled;

static void keep_pulled(const uint8_t *v, size_t len, void *arg)
{
    pulled *p = arg;
    cp_capture c, have;
    cp_err err = {0};
    if (cp_capture_decode(v, len, &c, &err)) {
        cp_log_warn("captures: a peer's capture does not decode (skipped): %s", err.msg);
        return;
    }
    if (strcmp(c.tenant, p->tenant) != 0 || (p->token && !cp_envelope_verify(v, len, p->token))) {
        cp_log_warn("captures: a peer sent capture %s of tenant %s unsigned or for another "
                    "tenant (skipped)",
                    c.id, c.tenant);
    } else if (cp_store_get_capture(p->store, c.tenant, c.id, &have, &err) == CP_ENOTFOUND) {
        if (cp_store_put_capture(p->store, &c, &err))
            cp_log_error("captures: keeping peer capture %s: %s", c.id, err.msg);
        else
            p->kept++;
    } else {
        cp_capture_close(&have);
    }
    cp_capture_close(&c);
}

/* The captures running on the peers that this node does not hold, kept. */
static void pull_peers(cp_captures *cs)
{
    cp_store *store = cs->o.store;
    const cp_fanout *f = cs->o.fanout;
    const char *const *tenant_tokens = cs->o.tenant_tokens;
    uint32_t ntokens = 0;
    while (tenant_tokens && tenant_tokens[2 * ntokens])
        ntokens++;
    uint32_t ntenants = ntokens ? ntokens : 1;
    for (uint32_t i = 0; i < cp_fanout_npeers(f); i++) {
        const char *peer = cp_fanout_peer(f, i);
        pulled p = {store, CP_DEFAULT_TENANT, NULL, 0};
        for (uint32_t t = 0; t < ntenants; t++) {
            if (ntokens) {
                p.tenant = tenant_tokens[2 * t];
                p.token = tenant_tokens[2 * t + 1];
            }
            cp_http_result r;
            cp_err err = {0};
            if (cp_http_get(peer, "/api/v1/control/captures", p.token, 1000, 1u << 20, &r, &err)) {
                cp_log_warn("captures: peer %s not asked for its running captures: %s", peer,
                            err.msg);
                break;
            }
            if (r.status != 200 ||
                cp_capture_feed_split(r.body.data, r.body.len, keep_pulled, &p) < 0)
                cp_log_warn("captures: peer %s answered %d, not a capture list, for tenant %s",
                            peer, r.status, p.tenant);
            cp_buf_close(&r.body);
        }
        if (p.kept) cp_log_info("captures: %u running on peer %s kept here", p.kept, peer);
    }
}

void cp_captures_resume(cp_captures *cs)
{
    republish(cs);
    pull_peers(cs);
}
