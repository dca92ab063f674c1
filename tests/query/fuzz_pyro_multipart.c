/* libFuzzer target: multipart/form-data bodies (query/pyro.h). The input's first line is the
 * Content-Type, the rest the body; every part found must lie inside the body. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pyro.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 20) return 0;
    const uint8_t *nl = memchr(data, '\n', size < 300 ? size : 300);
    size_t cl = nl ? (size_t)(nl - data) : 0;
    char ct[301];
    memcpy(ct, data, cl);
    ct[cl] = 0;
    size_t off = nl ? cl + 1 : 0, len = size - off;
    /* the body in its own allocation, so that ASan sees any read past it */
    uint8_t *body = malloc(len ? len : 1);
    if (!body) return 0;
    memcpy(body, data + off, len);
    cp_pyro_part parts[CP_PYRO_MAX_PARTS];
    int n = 0;
    cp_err err = {0};
    if (!cp_pyro_multipart(ct, body, len, parts, &n, &err)) {
        if (n < 0 || n > CP_PYRO_MAX_PARTS) abort();
        for (int i = 0; i < n; i++)
            if (parts[i].data < body || parts[i].data + parts[i].len > body + len ||
                !parts[i].name[0])
                abort();
    }
    free(body);
    return 0;
}
