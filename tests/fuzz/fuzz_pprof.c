/* libFuzzer target: the pprof decoder must reject or accept any input without crashing,
 * leaking or reading out of bounds; what it accepts must re-encode, decode again to the
 * same shape, and merge with itself. With lazy ids and locations it must accept exactly
 * the same inputs once every lazy sample's ids and lazy location are decoded, and give the
 * same ids and locations; the time field it peeks without decoding must be the decoded one. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "merge.h"
#include "pprof.h"

/* Decodes with lazy ids: fails, or some lazy sample's ids fail, exactly when the eager
 * decode failed (p NULL); otherwise every sample's ids are p's. */
static void lazy_agrees(const uint8_t *data, size_t size, const cp_pprof_limits *lim,
                        const cp_profile *p)
{
    cp_pprof_decoder *d = cp_pprof_decoder_create(lim);
    cp_profile *q = cp_profile_create();
    cp_pprof_lazy lz = {0};
    cp_err err;
    if (!d || !q) abort();
    int ok = cp_pprof_decoder_decode_lazy(d, data, size, q, &lz, &err) == 0;
    /* lazy locations: all parsed (a caller skips only what it checked before), the same as
     * the eager ones */
    uint32_t from = 0;
    if (ok && cp_pprof_lazy_locations(q, &lz, from, 0, &err) != 0) ok = 0;
    for (uint32_t i = lz.nloc ? from : 0; ok && p && i < q->locations.n; i++) {
        const cp_location *a = &q->locations.v[i], *b = &p->locations.v[i];
        if (a->address != b->address || a->mapping_id != b->mapping_id || a->nlines != b->nlines)
            abort();
        for (uint32_t k = 0; k < a->nlines; k++)
            if (q->lines.v[a->line_off + k].function_id != p->lines.v[b->line_off + k].function_id)
                abort();
    }
    uint32_t *ids = NULL;
    for (uint32_t i = 0; ok && i < q->samples.n; i++) {
        const cp_sample *s = &q->samples.v[i];
        const uint32_t *got = s->nlocs ? q->stack.v + s->loc_off : NULL;
        long n = s->nlocs;
        if (i < lz.ids.n && lz.ids.v[i].p) {
            free(ids);
            if (!(ids = malloc(((size_t)lz.ids.v[i].len + 8) * sizeof *ids))) abort();
            uint32_t k = 0;
            n = cp_pprof_lazy_ids(q, &lz, i, ids, &k, &err) ? -1 : (long)k;
            got = ids;
        }
        if (n < 0) {
            ok = 0;
        } else if (p) {
            const cp_sample *e = &p->samples.v[i];
            if ((long)e->nlocs != n || (n && memcmp(got, p->stack.v + e->loc_off, (size_t)n * 4)))
                abort();
        }
    }
    if (ok != (p != NULL)) abort();
    free(ids);
    cp_pprof_lazy_close(&lz);
    cp_profile_destroy(q);
    cp_pprof_decoder_destroy(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_pprof_limits lim;
    cp_pprof_limits_default(&lim);
    lim.max_bytes = 4u << 20; /* keep gzip bombs cheap */
    cp_profile *p = NULL;
    cp_err err;
    int rc = cp_pprof_decode(data, size, &lim, &p, &err);
    lazy_agrees(data, size, &lim, rc == 0 ? p : NULL);
    /* the time field peeked without decoding (contprof import's order) is the decoder's */
    int64_t t = 0;
    int prc = cp_pprof_peek_time(data, size, &t);
    if (rc == 0 && prc == 0 && t != p->time_nanos) abort();
    if (rc != 0) return 0;
    cp_buf b = {0};
    if (cp_pprof_encode(p, 0, &b) == 0) {
        cp_profile *q = NULL;
        if (cp_pprof_decode(b.data, b.len, NULL, &q, &err) != 0) abort();
        if (q->samples.n != p->samples.n || q->locations.n != p->locations.n) abort();
        cp_profile_destroy(q);
    }
    cp_buf_close(&b);
    cp_merger *m = cp_merger_create();
    if (m && cp_merger_add(m, p, &err) == 0 && cp_merger_add(m, p, &err) == 0) {
        cp_profile *out = cp_merger_finish(m);
        cp_profile_destroy(out);
    }
    cp_merger_destroy(m);
    cp_profile_destroy(p);
    return 0;
}
