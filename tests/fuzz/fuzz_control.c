/* libFuzzer target: the control-message decoder accepts or rejects any input without
 * crashing; what it accepts re-encodes and decodes again to the same capture. The input is
 * also read as a capture list (GET /api/v1/control/captures): every message handed on lies
 * inside it and goes through the decoder. It goes through the intake (cp_capture_intake)
 * twice: a taken capture is found again, never taken twice. As text, it goes through the
 * engine text reader; what that reads, written again, reads the same. */
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

static cp_capture_slot g_slots[2];

static cp_capture_slot *slot_at(void *arg, int i)
{
    (void)arg;
    return &g_slots[i];
}

static void intake(const uint8_t *data, size_t size)
{
    cp_capture_counts n = {0};
    cp_capture_table t = {.slot = slot_at, .n = 2, .counts = &n, .tenant = "", .heap = 1};
    cp_capture_heard h1, h2;
    /* the tenant the message names is ours: the branches past it are reached */
    cp_capture c;
    cp_err err;
    if (cp_capture_decode(data, size, &c, &err) == 0) {
        static char tenant[CP_TENANT_MAX + 1];
        memcpy(tenant, c.tenant, sizeof tenant);
        t.tenant = tenant;
        cp_capture_close(&c);
    }
    cp_capture_intake(&t, data, size, 1, &h1);
    cp_capture_intake(&t, data, size, 1, &h2);
    if (h1.act == CP_CAPTURE_NEW && (h2.act != CP_CAPTURE_SAME || h2.slot != h1.slot)) abort();
    if (h2.act == CP_CAPTURE_NEW || (g_slots[0].used && g_slots[1].used)) abort();
    for (int i = 0; i < 2; i++)
        cp_capture_slot_close(&g_slots[i]);
}

static void engine_text(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1), again[1024];
    if (!text) return;
    memcpy(text, data, size);
    text[size] = 0;
    cp_capture_engine e, f;
    if (cp_capture_engine_parse(text, &e)) {
        if (!e.reason) abort();
        cp_capture_engine_write(again, sizeof again, "x", &e);
        if (strlen(e.reason) < 512 &&
            (!cp_capture_engine_parse(again, &f) || f.asked != e.asked || f.ran != e.ran))
            abort();
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_capture c, d;
    cp_err err;
    g_lo = data;
    g_hi = data + size;
    intake(data, size);
    engine_text(data, size);
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
