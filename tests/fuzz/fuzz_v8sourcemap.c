/* libFuzzer target: the V8 source's source map reader (model/sourcemap.c): a map's
 * JSON and its base64 VLQ mappings, looked up and applied to a call frame, and the data:
 * URL that carries an inline map. The reader is the map's own JSON reader (no tree), within
 * a byte budget. Any bytes must be refused with an error or give lookups
 * inside the map, without crashing, leaking or reading out of bounds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sourcemap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_err e = {0};
    cp_v8_smap *m = NULL;
    /* a small byte budget as well (the server's symbols.max_table_bytes): refused with
     * CP_ELIMIT naming it, or held within it, exactly as counted */
    cp_v8_smap_limits lim = {.max_bytes = 4096, .max_bytes_name = "fuzz.budget"};
    int rc = cp_v8_smap_create_within((const char *)data, size, &lim, &m, &e);
    if (rc == 0) {
        if (cp_v8_smap_bytes(m) > 4096) abort();
        cp_v8_smap_destroy(m);
        m = NULL;
    } else if (m || !e.msg[0] || (rc == CP_ELIMIT && !strstr(e.msg, "limit"))) {
        abort();
    }
    memset(&e, 0, sizeof e);
    if (cp_v8_smap_create((const char *)data, size, &m, &e) == 0) {
        if (cp_v8_smap_bytes(m) > CP_V8_SMAP_MAX_RATIO * size + CP_V8_SMAP_MIN_BUDGET) abort();
        for (uint32_t line = 0; line < 64; line++)
            for (uint32_t col = 0; col < 4096; col += 1 + col / 2) {
                cp_v8_smap_pos pos;
                if (cp_v8_smap_lookup(m, line, col, &pos) != 0) continue;
                if (!pos.source || pos.gen_column > col) abort();
                (void)strlen(pos.source);
                if (pos.name) (void)strlen(pos.name);
            }
        /* frames at many positions: names, and classes read from sourcesContent */
        for (int line = 0; line < 8; line++)
            for (int col = 0; col < 96; col += 3) {
                char text[128];
                snprintf(text, sizeof text,
                         "{\"functionName\":\"%s\",\"url\":\"w.js\",\"lineNumber\":%d,"
                         "\"columnNumber\":%d}",
                         col % 2 ? "u" : "", line, col);
                cp_json *f = NULL;
                if (cp_json_parse(text, strlen(text), &f, NULL)) abort();
                int rc = cp_v8_smap_apply(m, f);
                if (rc < 0 && rc != CP_ENOMEM) abort();
                if (!cp_json_str(cp_json_get(f, "url"), NULL) ||
                    !cp_json_str(cp_json_get(f, "functionName"), NULL))
                    abort();
                cp_json_free(f);
            }
        cp_v8_smap_destroy(m);
    } else if (m || !e.msg[0]) {
        abort();
    }
    /* the input as a data: URL (NUL-terminated, as it arrives in a JSON string) */
    char *url = malloc(size + 1);
    if (!url) return 0;
    memcpy(url, data, size);
    url[size] = 0;
    cp_buf b = {0};
    memset(&e, 0, sizeof(e));
    if (cp_v8_data_url_decode(url, &b, &e) == 0) {
        if (b.len > size) abort();
    } else if (!e.msg[0]) {
        abort();
    }
    cp_buf_close(&b);
    free(url);
    return 0;
}
