/* libFuzzer target: the envelope decoder accepts or rejects any input without crashing;
 * what it accepts re-encodes and decodes again to the same fields. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "envelope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_envelope e, d;
    cp_err err;
    if (cp_envelope_decode(data, size, 1 << 20, &e, &err) != 0) return 0;
    cp_buf b = {0};
    if (cp_envelope_encode(&e, &b) == 0) {
        if (cp_envelope_decode(b.data, b.len, 1 << 20, &d, &err) != 0) abort();
        if (strcmp(d.tenant, e.tenant) || d.labels.p.n != e.labels.p.n ||
            d.pprof_len != e.pprof_len || d.sequence != e.sequence)
            abort();
        cp_envelope_close(&d);
    }
    cp_buf_close(&b);
    cp_envelope_close(&e);
    return 0;
}
