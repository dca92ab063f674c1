/* libFuzzer target: query strings, then every value as a time and as a duration. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 16384) return 0;
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    cp_params p = {0};
    cp_err err = {0};
    if (cp_params_parse(s, &p, &err) == 0) {
        for (uint32_t i = 0; i < p.p.n; i++) {
            int64_t t;
            cp_parse_time(p.p.v[i].value, 1764000000000000000LL, &t, &err);
            cp_parse_duration(p.p.v[i].value, 0, &t, &err);
            char buf[40];
            cp_format_time(t, buf, sizeof buf);
        }
    }
    cp_params_close(&p);
    free(s);
    return 0;
}
