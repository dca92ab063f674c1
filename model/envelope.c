/* Envelope encoding, decoding and validation over protoc-c's generated code. */
#include "envelope.h"
#include "envelope.pb-c.h"

#include <stdlib.h>
#include <string.h>

const char *cp_kind_name(int kind)
{
    switch (kind) {
    case CP_KIND_CPU: return "cpu";
    case CP_KIND_ALLOC: return "alloc";
    case CP_KIND_INUSE: return "inuse";
    }
    return NULL;
}

int cp_kind_parse(const char *name)
{
    for (int k = CP_KIND_CPU; k <= CP_KIND_INUSE; k++)
        if (strcmp(cp_kind_name(k), name) == 0) return k;
    return 0;
}

void cp_envelope_close(cp_envelope *e)
{
    free(e->tenant);
    cp_labels_close(&e->labels);
    free(e->producer_id);
    free(e->engine);
    free(e->pprof);
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
        return cp_err_set(err, CP_EVERSION, "envelope format %u.%u is not supported (this reader knows %d.x)",
                          e->format_major, e->format_minor, CP_ENVELOPE_MAJOR);
    if (!e->tenant || !tenant_valid(e->tenant))
        return cp_err_set(err, CP_EENVELOPE, "tenant \"%.64s\" is invalid (1-%d of [A-Za-z0-9_.-])",
                          e->tenant ? e->tenant : "", CP_TENANT_MAX);
    if (e->labels.p.n > CP_LABELS_MAX)
        return cp_err_set(err, CP_EENVELOPE, "%u labels (at most %d)", e->labels.p.n, CP_LABELS_MAX);
    for (uint32_t i = 0; i < e->labels.p.n; i++) {
        const cp_label_pair *l = &e->labels.p.v[i];
        if (!cp_label_name_valid(l->name))
            return cp_err_set(err, CP_EENVELOPE, "label %u: name \"%.64s\" is invalid", i, l->name);
        if (i && strcmp(e->labels.p.v[i - 1].name, l->name) == 0)
            return cp_err_set(err, CP_EENVELOPE, "label \"%s\" appears twice", l->name);
        if (strlen(l->value) > CP_LABEL_VALUE_MAX)
            return cp_err_set(err, CP_EENVELOPE, "label \"%s\": value longer than %d bytes", l->name, CP_LABEL_VALUE_MAX);
    }
    if (!cp_kind_name((int)e->kind))
        return cp_err_set(err, CP_EENVELOPE, "kind %d is unknown (1 cpu, 2 alloc, 3 inuse)", (int)e->kind);
    if (e->window_start_ns <= 0)
        return cp_err_set(err, CP_EENVELOPE, "window_start_ns %lld is not a positive unix time", (long long)e->window_start_ns);
    if (e->window_duration_ns <= 0 || e->window_duration_ns > 86400LL * 1000000000LL)
        return cp_err_set(err, CP_EENVELOPE, "window_duration_ns %lld is out of range (0, 1 day]", (long long)e->window_duration_ns);
    if (!e->producer_id || !e->producer_id[0] || strlen(e->producer_id) > 128)
        return cp_err_set(err, CP_EENVELOPE, "producer_id is empty or longer than 128 bytes");
    if (!e->pprof || e->pprof_len == 0)
        return cp_err_set(err, CP_EENVELOPE, "pprof payload is empty");
    if (max_pprof && e->pprof_len > max_pprof)
        return cp_err_set(err, CP_ELIMIT, "pprof payload is %zu bytes (limit %zu)", e->pprof_len, max_pprof);
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

int cp_envelope_decode(const uint8_t *buf, size_t len, size_t max_pprof, cp_envelope *out,
                       cp_err *err)
{
    memset(out, 0, sizeof *out);
    if (max_pprof && len > max_pprof + 65536)
        return cp_err_set(err, CP_ELIMIT, "envelope is %zu bytes (limit %zu)", len, max_pprof + 65536);
    Contprof__Envelope *pb = contprof__envelope__unpack(NULL, len, buf);
    if (!pb)
        return cp_err_set(err, CP_EENVELOPE, "not a valid envelope protobuf (%zu bytes): truncated or bad wire format", len);
    int rc = CP_ENOMEM;
    out->format_major = pb->format_major;
    out->format_minor = pb->format_minor;
    if (pb->format_major != CP_ENVELOPE_MAJOR) {
        rc = cp_err_set(err, CP_EVERSION, "envelope format %u.%u is not supported (this reader knows %d.x)",
                        pb->format_major, pb->format_minor, CP_ENVELOPE_MAJOR);
        goto fail;
    }
    if (pb->n_labels > CP_LABELS_MAX) {
        rc = cp_err_set(err, CP_EENVELOPE, "%zu labels (at most %d)", pb->n_labels, CP_LABELS_MAX);
        goto fail;
    }
    if (!(out->tenant = strdup(pb->tenant)) || !(out->producer_id = strdup(pb->producer_id)) ||
        !(out->engine = strdup(pb->engine)))
        goto nomem;
    for (size_t i = 0; i < pb->n_labels; i++) {
        if (cp_labels_get(&out->labels, pb->labels[i]->name)) {
            rc = cp_err_set(err, CP_EENVELOPE, "label \"%.64s\" appears twice", pb->labels[i]->name);
            goto fail;
        }
        if (cp_labels_set(&out->labels, pb->labels[i]->name, pb->labels[i]->value)) goto nomem;
    }
    out->kind = (cp_kind)pb->kind;
    out->window_start_ns = pb->window_start_ns;
    out->window_duration_ns = pb->window_duration_ns;
    out->sequence = pb->sequence;
    out->dropped_samples = pb->dropped_samples;
    out->dropped_windows = pb->dropped_windows;
    out->cumulative = pb->cumulative;
    out->pprof_len = pb->pprof.len;
    if (pb->pprof.len) {
        if (!(out->pprof = malloc(pb->pprof.len))) goto nomem;
        memcpy(out->pprof, pb->pprof.data, pb->pprof.len);
    }
    if ((rc = cp_envelope_validate(out, max_pprof, err))) goto fail;
    contprof__envelope__free_unpacked(pb, NULL);
    return 0;
nomem:
    rc = cp_err_set(err, CP_ENOMEM, "out of memory decoding envelope");
fail:
    contprof__envelope__free_unpacked(pb, NULL);
    cp_envelope_close(out);
    return rc;
}

int cp_envelope_series_key(const cp_envelope *e, cp_buf *out)
{
    if (cp_buf_printf(out, "%s/%s", e->tenant ? e->tenant : CP_DEFAULT_TENANT,
                      cp_kind_name((int)e->kind) ? cp_kind_name((int)e->kind) : "?"))
        return CP_ENOMEM;
    return cp_labels_format(&e->labels, out);
}
