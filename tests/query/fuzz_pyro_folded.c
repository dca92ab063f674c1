/* libFuzzer target: folded text (query/pyro.h) under each of its units and aggregations;
 * a profile made of it must encode and decode as pprof. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pprof.h"
#include "pyro.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 20) return 0;
    static const char *const units[] = {"samples",      "objects",          "bytes", "goroutines",
                                        "lock_samples", "lock_nanoseconds", "bogus"};
    cp_pyro_folded_opts o = {units[data[0] % 7], data[0] & 0x80 ? "average" : "sum",
                             (data[0] >> 3) % 5 * 50};
    uint8_t *text = malloc(size - 1 ? size - 1 : 1);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    cp_pyro_batch b = {0};
    cp_err err = {0};
    if (!cp_pyro_folded(text, size - 1, &o, &b, &err)) {
        if (b.items.n != 1 || !b.items.v[0].p->samples.n) abort();
        cp_buf enc = {0};
        cp_profile *back = NULL;
        if (cp_pprof_encode(b.items.v[0].p, 0, &enc)) abort();
        if (cp_pprof_decode(enc.data, enc.len, NULL, &back, &err)) abort();
        cp_profile_destroy(back);
        cp_buf_close(&enc);
    }
    cp_pyro_batch_close(&b);
    free(text);
    return 0;
}
