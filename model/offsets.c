/* The ingest offsets record's JSON writer and reader (offsets.h). */
#include "offsets.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int cp_offsets_write(cp_buf *b, const cp_partition_offsets *p)
{
    int rc = cp_buf_printf(b,
                           "{\"partition\":%d,\"stored\":%" PRId64 ",\"known_from\":%" PRId64
                           ",\"lost\":%" PRIu64 ",\"not_stored\":[",
                           p->partition, p->stored, p->known_from, p->lost);
    for (uint32_t k = 0; k < p->nranges && k < CP_OFFSETS_RANGES && !rc; k++) {
        const cp_offsets_range *r = &p->not_stored[k];
        rc = cp_buf_printf(b, "%s{\"from\":%" PRId64 ",\"to\":%" PRId64 ",\"why\":\"", k ? "," : "",
                           r->from, r->to);
        if (!rc) rc = cp_json_escape(b, r->why, strnlen(r->why, sizeof r->why));
        if (!rc) rc = cp_buf_printf(b, "\"}");
    }
    if (!rc) rc = cp_buf_printf(b, "]}");
    return rc;
}

/* The integer member key of o into *v; CP_EPARSE naming it when it is missing or not an
 * integer. */
static int int_member(const cp_json *o, const char *what, const char *key, int64_t *v, cp_err *err)
{
    const cp_json *j = cp_json_get(o, key);
    if (!j || j->type != CP_JSON_NUMBER || !j->is_int)
        return cp_err_set(err, CP_EPARSE, "%s: \"%s\" %s", what, key,
                          j ? "is not an integer" : "is missing");
    *v = j->i64;
    return 0;
}

int cp_offsets_read(const cp_json *o, cp_partition_offsets *out, cp_err *err)
{
    memset(out, 0, sizeof *out);
    if (!o || o->type != CP_JSON_OBJECT)
        return cp_err_set(err, CP_EPARSE, "a partition's offsets: not an object");
    int64_t part = 0, lost = 0;
    int rc = int_member(o, "a partition's offsets", "partition", &part, err);
    if (rc) return rc;
    if (part < 0 || part > INT32_MAX)
        return cp_err_set(err, CP_EPARSE, "partition %" PRId64 ": out of range", part);
    out->partition = (int32_t)part;
    char what[48];
    snprintf(what, sizeof what, "partition %d", out->partition);
    if ((rc = int_member(o, what, "stored", &out->stored, err)) ||
        (rc = int_member(o, what, "known_from", &out->known_from, err)) ||
        (rc = int_member(o, what, "lost", &lost, err)))
        return rc;
    if (lost < 0) return cp_err_set(err, CP_EPARSE, "%s: \"lost\" is negative", what);
    out->lost = (uint64_t)lost;
    const cp_json *ns = cp_json_get(o, "not_stored");
    if (!ns || ns->type != CP_JSON_ARRAY)
        return cp_err_set(err, CP_EPARSE, "%s: \"not_stored\" %s", what,
                          ns ? "is not an array" : "is missing");
    if (ns->n > CP_OFFSETS_RANGES)
        return cp_err_set(err, CP_EPARSE, "%s: %u not_stored ranges (at most %d)", what, ns->n,
                          CP_OFFSETS_RANGES);
    for (uint32_t k = 0; k < ns->n; k++) {
        const cp_json *r = ns->items[k];
        cp_offsets_range *o_r = &out->not_stored[k];
        snprintf(what, sizeof what, "partition %d, not_stored[%u]", out->partition, k);
        if (!r || r->type != CP_JSON_OBJECT)
            return cp_err_set(err, CP_EPARSE, "%s: not an object", what);
        if ((rc = int_member(r, what, "from", &o_r->from, err)) ||
            (rc = int_member(r, what, "to", &o_r->to, err)))
            return rc;
        if (o_r->to < o_r->from)
            return cp_err_set(err, CP_EPARSE, "%s: to %" PRId64 " is below from %" PRId64, what,
                              o_r->to, o_r->from);
        const cp_json *y = cp_json_get(r, "why");
        if (!y || y->type != CP_JSON_STRING)
            return cp_err_set(err, CP_EPARSE, "%s: \"why\" %s", what,
                              y ? "is not a string" : "is missing");
        if (strlen(y->str) >= sizeof o_r->why)
            return cp_err_set(err, CP_EPARSE, "%s: \"why\" is %zu bytes (at most %d)", what,
                              strlen(y->str), CP_OFFSETS_WHY - 1);
        memcpy(o_r->why, y->str, strlen(y->str) + 1);
        out->nranges = k + 1;
    }
    return 0;
}
