/* Control messages: encode, decode, validate (see capture.h). */
#include "capture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control.pb-c.h"
#include "selector.h"

void cp_capture_close(cp_capture *c)
{
    free(c->selector);
    memset(c, 0, sizeof *c);
}

static int id_char(int ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-';
}

int cp_capture_validate(const cp_capture *c, cp_err *err)
{
    size_t n = strnlen(c->id, sizeof c->id);
    if (n == 0 || n > CP_CAPTURE_ID_MAX)
        return cp_err_set(err, CP_EINVAL, "capture id must be 1 to %d characters",
                          CP_CAPTURE_ID_MAX);
    for (size_t i = 0; i < n; i++)
        if (!id_char((unsigned char)c->id[i]))
            return cp_err_set(err, CP_EINVAL,
                              "capture id has byte 0x%02x at %zu: only A-Z a-z 0-9 . _ - allowed",
                              (unsigned char)c->id[i], i);
    if (!c->tenant[0]) return cp_err_set(err, CP_EINVAL, "capture %s has no tenant", c->id);
    if (!c->selector) return cp_err_set(err, CP_EINVAL, "capture %s has no selector", c->id);
    if (strlen(c->selector) > CP_SELECTOR_MAX)
        return cp_err_set(err, CP_EINVAL, "capture %s: selector longer than %d bytes", c->id,
                          CP_SELECTOR_MAX);
    cp_selector s;
    cp_err se;
    if (cp_selector_parse(c->selector, &s, &se))
        return cp_err_set(err, CP_EINVAL, "capture %s: selector: %s", c->id, se.msg);
    cp_selector_close(&s);
    if (c->kind == CP_KIND_CPU) {
        if (c->cpu_hz < 1 || c->cpu_hz > CP_CAPTURE_HZ_CEIL)
            return cp_err_set(err, CP_EINVAL, "capture %s: cpu_hz %u is outside 1..%d", c->id,
                              c->cpu_hz, CP_CAPTURE_HZ_CEIL);
    } else if (c->kind == CP_KIND_ALLOC) {
        if (c->alloc_rate <= 0)
            return cp_err_set(err, CP_EINVAL, "capture %s: alloc_rate %lld must be positive", c->id,
                              (long long)c->alloc_rate);
    } else if (c->kind != CP_KIND_HEAP) {
        return cp_err_set(err, CP_EINVAL, "capture %s: kind %d is neither cpu, alloc nor heap",
                          c->id, (int)c->kind);
    }
    if (c->start_ns <= 0 || c->end_ns <= c->start_ns ||
        c->end_ns - c->start_ns > CP_CAPTURE_DURATION_CEIL_NS)
        return cp_err_set(err, CP_EINVAL,
                          "capture %s: start %lld and end %lld ns are not a range of at most 24 h",
                          c->id, (long long)c->start_ns, (long long)c->end_ns);
    return 0;
}

int cp_capture_encode(const cp_capture *c, const char *token, cp_buf *out)
{
    int rc = cp_capture_validate(c, NULL);
    if (rc) return rc;
    Contprof__Capture pb = CONTPROF__CAPTURE__INIT;
    pb.format_major = CP_CAPTURE_MAJOR;
    pb.id = (char *)c->id;
    pb.tenant = (char *)c->tenant;
    pb.selector = c->selector;
    pb.kind = (Contprof__Kind)c->kind;
    pb.cpu_hz = c->cpu_hz;
    pb.alloc_rate = c->alloc_rate;
    pb.start_ns = c->start_ns;
    pb.end_ns = c->end_ns;
    pb.cancelled = c->cancelled != 0;
    pb.max_overhead_permille = c->max_overhead_permille;
    size_t n = contprof__capture__get_packed_size(&pb);
    if (cp_buf_reserve(out, n)) return CP_ENOMEM;
    contprof__capture__pack(&pb, out->data + out->len);
    out->len += n;
    if (token && token[0]) return cp_envelope_sign(out, token);
    return 0;
}

static int copy_str(const char *src, char *dst, size_t cap, const char *what, cp_err *err)
{
    size_t n = strlen(src);
    if (n >= cap)
        return cp_err_set(err, CP_EINVAL, "capture %s is %zu bytes (limit %zu)", what, n, cap - 1);
    memcpy(dst, src, n + 1);
    return 0;
}

int cp_capture_decode(const uint8_t *buf, size_t len, cp_capture *out, cp_err *err)
{
    memset(out, 0, sizeof *out);
    Contprof__Capture *pb = contprof__capture__unpack(NULL, len, buf);
    if (!pb)
        return cp_err_set(err, CP_EENVELOPE,
                          "not a valid capture protobuf (%zu bytes): truncated or bad wire format",
                          len);
    int rc;
    if (pb->format_major != CP_CAPTURE_MAJOR) {
        rc = cp_err_set(err, CP_EVERSION,
                        "control format %u is not supported (this reader knows %d)",
                        pb->format_major, CP_CAPTURE_MAJOR);
        goto done;
    }
    if ((rc = copy_str(pb->id, out->id, sizeof out->id, "id", err)) ||
        (rc = copy_str(pb->tenant, out->tenant, sizeof out->tenant, "tenant", err)))
        goto done;
    if (!(out->selector = strdup(pb->selector))) {
        rc = cp_err_set(err, CP_ENOMEM, "out of memory decoding capture");
        goto done;
    }
    out->kind = (cp_kind)pb->kind;
    out->cpu_hz = pb->cpu_hz;
    out->alloc_rate = pb->alloc_rate;
    out->start_ns = pb->start_ns;
    out->end_ns = pb->end_ns;
    out->cancelled = pb->cancelled;
    out->max_overhead_permille = pb->max_overhead_permille;
    rc = cp_capture_validate(out, err);
done:
    contprof__capture__free_unpacked(pb, NULL);
    if (rc) cp_capture_close(out);
    return rc;
}

int cp_capture_feed_append(cp_buf *out, const cp_capture *c, const char *token)
{
    cp_buf m = {0}; /* on its own: a signature covers its whole buffer */
    int rc = cp_capture_encode(c, token, &m);
    uint8_t len[4] = {(uint8_t)(m.len >> 24), (uint8_t)(m.len >> 16), (uint8_t)(m.len >> 8),
                      (uint8_t)m.len};
    size_t at = out->len;
    if (!rc && (cp_buf_append(out, len, 4) || cp_buf_append(out, m.data, m.len))) {
        out->len = at;
        rc = CP_ENOMEM;
    }
    cp_buf_close(&m);
    return rc;
}

int cp_capture_feed_split(const uint8_t *body, size_t len,
                          void (*fn)(const uint8_t *value, size_t len, void *arg), void *arg)
{
    size_t at = 0;
    int n = 0;
    while (at < len) { /* checked whole first: a malformed answer hands on nothing */
        if (len - at < 4) return -1;
        size_t l = (size_t)body[at] << 24 | (size_t)body[at + 1] << 16 | (size_t)body[at + 2] << 8 |
                   body[at + 3];
        if (l > len - at - 4) return -1;
        at += 4 + l;
        n++;
    }
    for (at = 0; at < len;) {
        size_t l = (size_t)body[at] << 24 | (size_t)body[at + 1] << 16 | (size_t)body[at + 2] << 8 |
                   body[at + 3];
        fn(body + at + 4, l, arg);
        at += 4 + l;
    }
    return n;
}

int64_t cp_capture_plan_hz(const cp_capture *c, int64_t max_hz, int64_t sample_cost_ns,
                           const char *source, char *reason, size_t cap)
{
    int64_t hz = c->cpu_hz;
    if (hz > max_hz) {
        hz = max_hz;
        snprintf(reason, cap, "%s samples at most %lld Hz", source, (long long)max_hz);
    }
    if (c->max_overhead_permille && sample_cost_ns > 0) {
        /* the extra CPU, in 1/1000 of the captured CPU: hz samples a CPU-second */
        int64_t max = (int64_t)c->max_overhead_permille * 1000000 / sample_cost_ns;
        if (max < 1) max = 1;
        if (hz > max) {
            hz = max;
            snprintf(reason, cap,
                     "captures.max_overhead_permille (contprofd --config) gives this capture "
                     "%u permille: %lld Hz at ~%lld us a sample (%s)",
                     c->max_overhead_permille, (long long)hz, (long long)(sample_cost_ns / 1000),
                     source);
        }
    }
    return hz;
}

/* ------------------------------------------------------------------------------------
 * The intake (capture.h) */

void cp_capture_slot_close(cp_capture_slot *s)
{
    cp_selector_close(&s->sel);
    cp_capture_close(&s->c);
    memset(s, 0, sizeof *s);
}

static int changed(const cp_capture *was, const cp_capture *now)
{
    return was->end_ns != now->end_ns || was->cpu_hz != now->cpu_hz ||
           was->alloc_rate != now->alloc_rate ||
           was->max_overhead_permille != now->max_overhead_permille;
}

void cp_capture_intake(const cp_capture_table *t, const uint8_t *v, size_t len, int64_t now_ns,
                       cp_capture_heard *out)
{
    memset(out, 0, sizeof *out);
    out->slot = -1;
    cp_capture c;
    if (cp_capture_decode(v, len, &c, &out->err) != 0) {
        t->counts->bad++;
        out->act = CP_CAPTURE_BAD;
        return;
    }
    memcpy(out->id, c.id, sizeof out->id);
    out->cancelled = c.cancelled;
    cp_capture_slot *k = NULL;
    int at = -1;
    if (strcmp(c.tenant, t->tenant) != 0) {
        t->counts->foreign++;
        out->act = CP_CAPTURE_FOREIGN;
        goto done;
    }
    if (t->token && t->token[0] && !cp_envelope_verify(v, len, t->token)) {
        t->counts->badsig++;
        out->act = CP_CAPTURE_BADSIG;
        goto done;
    }
    if (c.kind == CP_KIND_HEAP && !t->heap) {
        out->act = CP_CAPTURE_SKIPPED;
        goto done;
    }
    for (int i = 0; i < t->n && !k; i++) {
        cp_capture_slot *s = t->slot(t->arg, i);
        if (s->used && !strcmp(s->c.id, c.id)) k = s, at = i;
    }
    if (k) {
        out->slot = at;
        out->act = CP_CAPTURE_SAME;
        if (k->ended) goto done;
        if (!cp_capture_live(&c, now_ns)) {
            k->ended = 1;
            out->act = CP_CAPTURE_ENDED;
        } else if (c.kind == k->c.kind && changed(&k->c, &c)) {
            /* a poller hands on unchanged states too: only a change re-plans */
            k->c.end_ns = c.end_ns;
            k->c.cpu_hz = c.cpu_hz;
            k->c.alloc_rate = c.alloc_rate;
            k->c.max_overhead_permille = c.max_overhead_permille;
            out->act = CP_CAPTURE_UPDATED;
        }
        goto done;
    }
    if (!cp_capture_live(&c, now_ns)) {
        t->counts->expired++;
        out->act = CP_CAPTURE_EXPIRED;
        goto done;
    }
    for (int i = 0; i < t->n && !k; i++) {
        cp_capture_slot *s = t->slot(t->arg, i);
        if (!s->used) k = s, at = i;
    }
    if (!k) {
        t->counts->full++;
        out->act = CP_CAPTURE_FULL;
        goto done;
    }
    cp_err se;
    if (cp_selector_parse(c.selector, &k->sel, &se) != 0) {
        t->counts->bad++;
        out->act = CP_CAPTURE_BAD;
        out->err = se; /* the selector's own sentence (decode checked it: rare) */
        goto done;
    }
    k->c = c;
    memset(&c, 0, sizeof c); /* its selector is the slot's now */
    k->used = 1;
    k->ended = 0;
    out->slot = at;
    out->act = CP_CAPTURE_NEW;
done:
    cp_capture_close(&c);
}

/* ------------------------------------------------------------------------------------
 * The engine text of capture windows (capture.h) */

#define ENGINE_CAPTURE " capture asked="
#define ENGINE_COST " cost_us_per_s="
#define ENGINE_PERMILLE " cost_permille="
#define ENGINE_REASON " reason="

int cp_capture_engine_write(char *out, size_t cap, const char *engine, const cp_capture_engine *e)
{
    char cost[96] = "", permille[48] = "";
    if (e->has_cost) snprintf(cost, sizeof cost, ENGINE_COST "%.0f", e->cost_us_per_s);
    if (e->has_permille)
        snprintf(permille, sizeof permille, ENGINE_PERMILLE "%.1f", e->cost_permille);
    int why = e->reason && e->reason[0];
    return snprintf(out, cap, "%s" ENGINE_CAPTURE "%lld ran=%lld%s%s%s%s", engine,
                    (long long)e->asked, (long long)e->ran, cost, permille,
                    why ? ENGINE_REASON : "", why ? e->reason : "");
}

int cp_capture_engine_parse(const char *text, cp_capture_engine *e)
{
    memset(e, 0, sizeof *e);
    e->reason = "";
    const char *s = text ? strstr(text, ENGINE_CAPTURE) : NULL;
    if (!s) return 0;
    long long a = 0, r = 0;
    int used = 0;
    if (sscanf(s, ENGINE_CAPTURE "%lld ran=%lld%n", &a, &r, &used) != 2 || !used) return 0;
    e->asked = a;
    e->ran = r;
    s += used;
    int n = 0;
    if (sscanf(s, ENGINE_COST "%lf%n", &e->cost_us_per_s, &n) == 1 && n) {
        e->has_cost = 1;
        s += n;
    }
    n = 0;
    if (sscanf(s, ENGINE_PERMILLE "%lf%n", &e->cost_permille, &n) == 1 && n) {
        e->has_permille = 1;
        s += n;
    }
    if (!strncmp(s, ENGINE_REASON, sizeof ENGINE_REASON - 1))
        e->reason = s + sizeof ENGINE_REASON - 1;
    return 1;
}
