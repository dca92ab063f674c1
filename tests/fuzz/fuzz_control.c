/* libFuzzer target: the control-message decoder accepts or rejects any input without
 * crashing; what it accepts re-encodes and decodes again to the same capture. The input is
 * also read as a capture list (GET /api/v1/control/captures): every message handed on lies
 * inside it and goes through the decoder. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "capture.h"

static const uint8_t *g_lo, *g_hi;

static void one(const uint8_t *v, size_t len, void *arg)
{
    (void)arg;
    if (v < g_lo || v + len > g_hi) abort();
    cp_capture c;
    cp_err err;
    if (cp_capture_decode(v, len, &c, &err) == 0) cp_capture_close(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_capture c, d;
    cp_err err;
    g_lo = data;
    g_hi = data + size;
    int n = cp_capture_feed_split(data, size, one, NULL);
    if (n < -1 || (n > 0 && (size_t)n * 4 > size)) abort();
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
