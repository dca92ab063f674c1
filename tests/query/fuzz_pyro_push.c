/* libFuzzer target: push.v1.PushRequest in protobuf and JSON (query/pyro.h), each profile
 * found split into kinds as the endpoint does, with its series' labels. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pyro.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 20) return 0;
    uint8_t *buf = malloc(size - 1 ? size - 1 : 1);
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    cp_pyro_pushreq pr;
    cp_err err = {0};
    if (!cp_pyro_push_decode(buf, size - 1, data[0] & 1, 1 << 20, &pr, &err)) {
        for (uint32_t i = 0; i < pr.series.n; i++) {
            cp_pyro_batch b = {0};
            (void)cp_pyro_push_labels(&pr.series.v[i].labels, &b, &err);
            for (uint32_t j = 0; j < pr.series.v[i].profiles.n; j++) {
                cp_buf *p = &pr.series.v[i].profiles.v[j];
                (void)cp_pyro_pprof(p->data, p->len, NULL, 0, &b, &err);
            }
            for (uint32_t k = 0; k < b.items.n; k++)
                if (!cp_kind_name(b.items.v[k].kind) ||
                    (b.items.v[k].cumulative && cp_kind_is_gauge(b.items.v[k].kind)))
                    abort();
            cp_pyro_batch_close(&b);
        }
        cp_pyro_push_close(&pr);
    }
    free(buf);
    return 0;
}
