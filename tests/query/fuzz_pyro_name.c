/* libFuzzer target: Pyroscope's name= (app{k=v,...}) and its from/until times (query/pyro.h):
 * the whole input as a name and as a time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pyro.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 16384) return 0;
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    cp_pyro_batch b = {0};
    cp_err err = {0};
    if (!cp_pyro_parse_name(s, &b, &err)) {
        /* what was kept is what ingest takes */
        if (!cp_labels_get(&b.labels, CP_LABEL_SERVICE)) abort();
        for (uint32_t i = 0; i < b.labels.p.n; i++)
            if (!cp_label_name_valid(b.labels.p.v[i].name) ||
                cp_label_value_check(b.labels.p.v[i].value))
                abort();
        if (b.labels.p.n > CP_LABELS_MAX) abort();
    }
    cp_pyro_batch_close(&b);
    int64_t t = 0;
    if (!cp_pyro_parse_time(s, 1764000000000000000LL, &t, &err) && t < 0) abort();
    free(s);
    return 0;
}
