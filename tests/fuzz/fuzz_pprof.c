/* libFuzzer target: the pprof decoder must reject or accept any input without crashing,
 * leaking or reading out of bounds; what it accepts must re-encode, decode again to the
 * same shape, and merge with itself. */
#include <stdint.h>
#include <stdlib.h>
#include "merge.h"
#include "pprof.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_pprof_limits lim;
    cp_pprof_limits_default(&lim);
    lim.max_bytes = 4u << 20; /* keep gzip bombs cheap */
    cp_profile *p = NULL;
    cp_err err;
    if (cp_pprof_decode(data, size, &lim, &p, &err) != 0) return 0;
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
