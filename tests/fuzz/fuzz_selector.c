/* libFuzzer target: selector parsing and matching on arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "selector.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > CP_SELECTOR_MAX + 16) return 0;
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    cp_selector sel;
    cp_err err = {0};
    if (cp_selector_parse(s, &sel, &err) == 0) {
        cp_labels l = {0};
        cp_labels_set(&l, "service", "api");
        cp_labels_set(&l, "isolate", "worker-1");
        cp_selector_match(&sel, &l);
        cp_labels_close(&l);
        cp_selector_close(&sel);
    } else if (!err.msg[0]) {
        abort(); /* every failure must say why */
    }
    free(s);
    return 0;
}
