/* Envelope encoding, decoding and validation over protoc-c's generated code. */
#include "envelope.h"
#include "envelope.pb-c.h"
#include "hmac.h"
#include "json.h"
#include "pprof.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>

const char *cp_kind_name(int kind)
{
    switch (kind) {
    case CP_KIND_CPU:
        return "cpu";
    case CP_KIND_ALLOC:
        return "alloc";
    case CP_KIND_INUSE:
        return "inuse";
    case CP_KIND_WALL:
        return "wall";
    case CP_KIND_MUTEX:
        return "mutex";
    case CP_KIND_BLOCK:
        return "block";
    case CP_KIND_GOROUTINES:
        return "goroutines";
    case CP_KIND_HEAP:
        return "heap";
    }
    return NULL;
}

int cp_kind_is_gauge(int kind)
{
    return kind == CP_KIND_INUSE || kind == CP_KIND_GOROUTINES || kind == CP_KIND_HEAP;
}

int cp_kind_parse(const char *name)
{
    for (int k = CP_KIND_CPU; k <= CP_KIND_MAX; k++)
        if (strcmp(cp_kind_name(k), name) == 0) return k;
    return 0;
}

void cp_envelope_close(cp_envelope *e)
{
    free(e->tenant);
    cp_labels_close(&e->labels);
    free(e->producer_id);
    free(e->engine);
    if (!e->pprof_borrowed) free(e->pprof);
    memset(e, 0, sizeof *e);
}

static int tenant_valid(const char *t)
{
    size_t n = 0;
    for (; t[n]; n++) {
        char c = t[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return n > 0 && n <= CP_TENANT_MAX;
}

int cp_envelope_validate(const cp_envelope *e, size_t max_pprof, cp_err *err)
{
    if (e->format_major != CP_ENVELOPE_MAJOR)
        return cp_err_set(err, CP_EVERSION,
                          "envelope format %u.%u is not supported (this reader knows %d.x)",
                          e->format_major, e->format_minor, CP_ENVELOPE_MAJOR);
    if (!e->tenant || !tenant_valid(e->tenant))
        return cp_err_set(err, CP_EENVELOPE, "tenant \"%.64s\" is invalid (1-%d of [A-Za-z0-9_.-])",
                          e->tenant ? e->tenant : "", CP_TENANT_MAX);
    if (e->labels.p.n > CP_LABELS_MAX)
        return cp_err_set(err, CP_EENVELOPE, "%u labels (at most %d)", e->labels.p.n,
                          CP_LABELS_MAX);
    for (uint32_t i = 0; i < e->labels.p.n; i++) {
        const cp_label_pair *l = &e->labels.p.v[i];
        if (!cp_label_name_valid(l->name))
            return cp_err_set(err, CP_EENVELOPE, "label %u: name \"%.64s\" is invalid", i, l->name);
        if (i && strcmp(e->labels.p.v[i - 1].name, l->name) == 0)
            return cp_err_set(err, CP_EENVELOPE, "label \"%s\" appears twice", l->name);
        int bad = cp_label_value_check(l->value);
        if (bad < 0)
            return cp_err_set(err, CP_EENVELOPE, "label \"%s\": value longer than %d bytes",
                              l->name, CP_LABEL_VALUE_MAX);
        if (bad)
            return cp_err_set(err, CP_EENVELOPE,
                              "label \"%s\": control character 0x%02x at byte %d of its value",
                              l->name, (unsigned char)l->value[bad - 1], bad - 1);
    }
    if (!cp_kind_name((int)e->kind))
        return cp_err_set(err, CP_EENVELOPE, "kind %d is unknown (1 cpu, 2 alloc, 3 inuse)",
                          (int)e->kind);
    if (e->window_start_ns <= 0)
        return cp_err_set(err, CP_EENVELOPE, "window_start_ns %lld is not a positive unix time",
                          (long long)e->window_start_ns);
    if (e->window_duration_ns <= 0 || e->window_duration_ns > 86400LL * 1000000000LL)
        return cp_err_set(err, CP_EENVELOPE, "window_duration_ns %lld is out of range (0, 1 day]",
                          (long long)e->window_duration_ns);
    if (!e->producer_id || !e->producer_id[0] || strlen(e->producer_id) > 128)
        return cp_err_set(err, CP_EENVELOPE, "producer_id is empty or longer than 128 bytes");
    if (!e->pprof || e->pprof_len == 0)
        return cp_err_set(err, CP_EENVELOPE, "pprof payload is empty");
    if (max_pprof && e->pprof_len > max_pprof)
        return cp_err_set(err, CP_ELIMIT, "pprof payload is %zu bytes (limit %zu)", e->pprof_len,
                          max_pprof);
    return 0;
}

int cp_envelope_encode(const cp_envelope *e, cp_buf *out)
{
    Contprof__Envelope pb = CONTPROF__ENVELOPE__INIT;
    Contprof__Label ls[CP_LABELS_MAX], *lps[CP_LABELS_MAX];
    if (e->labels.p.n > CP_LABELS_MAX) return CP_EINVAL;
    pb.format_major = e->format_major ? e->format_major : CP_ENVELOPE_MAJOR;
    pb.format_minor = e->format_major ? e->format_minor : CP_ENVELOPE_MINOR;
    pb.tenant = e->tenant ? e->tenant : (char *)CP_DEFAULT_TENANT;
    pb.n_labels = e->labels.p.n;
    pb.labels = lps;
    for (uint32_t i = 0; i < e->labels.p.n; i++) {
        contprof__label__init(&ls[i]);
        ls[i].name = e->labels.p.v[i].name;
        ls[i].value = e->labels.p.v[i].value;
        lps[i] = &ls[i];
    }
    pb.kind = (Contprof__Kind)e->kind;
    pb.window_start_ns = e->window_start_ns;
    pb.window_duration_ns = e->window_duration_ns;
    pb.producer_id = e->producer_id ? e->producer_id : (char *)"";
    pb.sequence = e->sequence;
    pb.dropped_samples = e->dropped_samples;
    pb.dropped_windows = e->dropped_windows;
    pb.cumulative = e->cumulative;
    pb.engine = e->engine ? e->engine : (char *)"";
    pb.pprof.data = e->pprof;
    pb.pprof.len = e->pprof_len;
    size_t n = contprof__envelope__get_packed_size(&pb);
    if (cp_buf_reserve(out, n)) return CP_ENOMEM;
    contprof__envelope__pack(&pb, out->data + out->len);
    out->len += n;
    return 0;
}

/* A string field as a NUL-terminated copy; a NUL inside would silently cut it short. */
static int dup_str(rd f, const char *what, char **out, cp_err *err)
{
    size_t n = (size_t)(f.end - f.p);
    if (memchr(f.p, 0, n)) return cp_err_set(err, CP_EENVELOPE, "%s contains a NUL byte", what);
    /* proto3 strings are UTF-8 */
    if (!cp_utf8_valid(f.p, n)) return cp_err_set(err, CP_EENVELOPE, "%s is not valid UTF-8", what);
    char *s = malloc(n + 1);
    if (!s) return cp_err_set(err, CP_ENOMEM, "out of memory decoding envelope");
    memcpy(s, f.p, n);
    s[n] = 0;
    free(*out); /* a repeated scalar field: the last one wins, as in protobuf */
    *out = s;
    return 0;
}

static int decode_label(rd r, uint32_t i, cp_labels *labels, cp_err *err)
{
    char *name = NULL, *value = NULL;
    int rc = 0;
    while (r.p < r.end && !rc) {
        uint32_t field, wt;
        rd f;
        if (rd_key(&r, &field, &wt) || (wt == WT_LEN ? rd_len(&r, &f) : rd_skip(&r, wt))) {
            rc = cp_err_set(err, CP_EENVELOPE, "label %u: truncated or bad wire format", i);
        } else if ((field == 1 || field == 2) && wt != WT_LEN) {
            rc = cp_err_set(err, CP_EENVELOPE,
                            "label %u: field %u has wire type %u, expected a string", i, field, wt);
        } else if (field == 1) {
            rc = dup_str(f, "label name", &name, err);
        } else if (field == 2) {
            rc = dup_str(f, "label value", &value, err);
        }
    }
    if (!rc && cp_labels_get(labels, name ? name : ""))
        rc = cp_err_set(err, CP_EENVELOPE, "label \"%.64s\" appears twice", name ? name : "");
    if (!rc && cp_labels_set(labels, name ? name : "", value ? value : ""))
        rc = cp_err_set(err, CP_ENOMEM, "out of memory decoding envelope");
    free(name);
    free(value);
    return rc;
}

/* The envelope's own wire decoder (protobuf-c's unpack would copy the payload, the bulk of
 * the message, into a new allocation). borrow: the payload points into buf. */
static int decode(const uint8_t *buf, size_t len, size_t max_pprof, int borrow, cp_envelope *out,
                  cp_err *err)
{
    memset(out, 0, sizeof *out);
    if (max_pprof && len > max_pprof + 65536)
        return cp_err_set(err, CP_ELIMIT, "envelope is %zu bytes (limit %zu)", len,
                          max_pprof + 65536);
    rd r = {buf, buf + len}, pprof = {NULL, NULL};
    uint64_t v[13] = {0};
    uint32_t nlabels = 0;
    int rc = 0;
    while (r.p < r.end) {
        size_t at = (size_t)(r.p - buf);
        uint32_t field, wt;
        rd f = {NULL, NULL};
        if (rd_key(&r, &field, &wt) || (wt == WT_LEN                     ? rd_len(&r, &f)
                                        : wt == WT_VARINT && field <= 12 ? rd_varint(&r, &v[field])
                                                                         : rd_skip(&r, wt))) {
            rc = cp_err_set(err, CP_EENVELOPE,
                            "not a valid envelope protobuf (%zu bytes): truncated or bad wire "
                            "format at byte %zu",
                            len, at);
            goto fail;
        }
        int want_len = field == 3 || field == 4 || field == 8 || field == 13 || field == 15;
        if (field <= 15 && field != 14 && want_len != (wt == WT_LEN)) {
            rc = cp_err_set(err, CP_EENVELOPE,
                            "envelope field %u at byte %zu has wire type %u, expected %s", field,
                            at, wt, want_len ? "length-delimited" : "varint");
            goto fail;
        }
        switch (field) {
        case 3:
            rc = dup_str(f, "tenant", &out->tenant, err);
            break;
        case 4:
            if (++nlabels > CP_LABELS_MAX) {
                rc = cp_err_set(err, CP_EENVELOPE, "more than %d labels", CP_LABELS_MAX);
                break;
            }
            rc = decode_label(f, nlabels - 1, &out->labels, err);
            break;
        case 8:
            rc = dup_str(f, "producer_id", &out->producer_id, err);
            break;
        case 13:
            rc = dup_str(f, "engine", &out->engine, err);
            break;
        case 15:
            pprof = f;
            break;
        }
        if (rc) goto fail;
    }
    out->format_major = (uint32_t)v[1];
    out->format_minor = (uint32_t)v[2];
    if (v[1] != CP_ENVELOPE_MAJOR) {
        rc = cp_err_set(err, CP_EVERSION,
                        "envelope format %llu.%llu is not supported (this reader knows %d.x)",
                        (unsigned long long)v[1], (unsigned long long)v[2], CP_ENVELOPE_MAJOR);
        goto fail;
    }
    if ((!out->tenant && !(out->tenant = strdup(""))) ||
        (!out->producer_id && !(out->producer_id = strdup(""))) ||
        (!out->engine && !(out->engine = strdup("")))) {
        rc = cp_err_set(err, CP_ENOMEM, "out of memory decoding envelope");
        goto fail;
    }
    out->kind = (cp_kind)(int32_t)v[5];
    out->window_start_ns = (int64_t)v[6];
    out->window_duration_ns = (int64_t)v[7];
    out->sequence = v[9];
    out->dropped_samples = v[10];
    out->dropped_windows = v[11];
    out->cumulative = v[12] != 0;
    out->pprof_len = pprof.p ? (size_t)(pprof.end - pprof.p) : 0;
    if (out->pprof_len) {
        if (borrow) {
            out->pprof = (uint8_t *)(uintptr_t)pprof.p;
            out->pprof_borrowed = 1;
        } else {
            if (!(out->pprof = malloc(out->pprof_len))) {
                rc = cp_err_set(err, CP_ENOMEM, "out of memory decoding envelope");
                goto fail;
            }
            memcpy(out->pprof, pprof.p, out->pprof_len);
        }
    }
    if ((rc = cp_envelope_validate(out, max_pprof, err))) goto fail;
    return 0;
fail:
    cp_envelope_close(out);
    return rc;
}

int cp_envelope_decode(const uint8_t *buf, size_t len, size_t max_pprof, cp_envelope *out,
                       cp_err *err)
{
    return decode(buf, len, max_pprof, 0, out, err);
}

int cp_envelope_decode_view(const uint8_t *buf, size_t len, size_t max_pprof, cp_envelope *out,
                            cp_err *err)
{
    return decode(buf, len, max_pprof, 1, out, err);
}

/* ---- the tenant's signature ---------------------------------------------------------- */

int cp_envelope_sign(cp_buf *enc, const char *token)
{
    uint8_t f[CP_ENVELOPE_AUTH_LEN] = {0x82, 0x01, CP_SHA256_LEN}; /* field 16, bytes, 32 */
    cp_hmac_sha256(token, strlen(token), enc->data, enc->len, f + 3);
    return cp_buf_append(enc, f, sizeof f) ? CP_ENOMEM : 0;
}

int cp_envelope_verify(const uint8_t *buf, size_t len, const char *token)
{
    if (len < CP_ENVELOPE_AUTH_LEN) return 0;
    const uint8_t *f = buf + len - CP_ENVELOPE_AUTH_LEN;
    if (f[0] != 0x82 || f[1] != 0x01 || f[2] != CP_SHA256_LEN) return 0;
    uint8_t mac[CP_SHA256_LEN];
    cp_hmac_sha256(token, strlen(token), buf, len - CP_ENVELOPE_AUTH_LEN, mac);
    return cp_ct_equal(mac, f + 3, sizeof mac);
}

int cp_envelope_series_key(const cp_envelope *e, cp_buf *out)
{
    if (cp_buf_printf(out, "%s/%s", e->tenant ? e->tenant : CP_DEFAULT_TENANT,
                      cp_kind_name((int)e->kind) ? cp_kind_name((int)e->kind) : "?"))
        return CP_ENOMEM;
    return cp_labels_format(&e->labels, out);
}

int cp_envelope_pprof(const cp_profile *p, cp_buf *out)
{
    cp_buf raw = {0}, gz = {0};
    if (cp_pprof_encode(p, 0, &raw) != 0) goto fail;
    if (raw.len <= CP_RAW_PPROF_MAX) {
        *out = raw;
        return 0;
    }
    if (cp_gzip(raw.data, raw.len, 1, &gz) != 0) goto fail;
    cp_buf_close(&raw);
    *out = gz;
    return 0;
fail:
    cp_buf_close(&raw);
    cp_buf_close(&gz);
    return CP_ENOMEM;
}
