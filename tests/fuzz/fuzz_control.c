/* libFuzzer target: the control-message decoder accepts or rejects any input without
 * crashing; what it accepts re-encodes and decodes again to the same capture. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "control.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_capture c, d;
    cp_err err;
    if (cp_capture_decode(data, size, &c, &err) != 0) return 0;
    cp_buf b = {0};
    if (cp_capture_encode(&c, "k", &b) != 0) abort();
    if (cp_capture_decode(b.data, b.len, &d, &err) != 0) abort();
    if (strcmp(d.id, c.id) || strcmp(d.selector, c.selector) || d.end_ns != c.end_ns ||
        d.cpu_hz != c.cpu_hz || d.kind != c.kind)
        abort();
    cp_capture_close(&d);
    cp_buf_close(&b);
    cp_capture_close(&c);
    return 0;
}
