/* libFuzzer target: a local client's byte stream as the relay reads it (collector/relay/
 * relayd.c): frames one after another until the input ends or a header is refused; each
 * envelope payload decoded in place, validated and keyed for Kafka as the relay does. The
 * same bytes as a spool batch file (cp_spool_batch_next): every envelope it gives lies
 * inside the input, the walk moves forward and ends. No input may crash, read outside its
 * frame, or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "relay.h"

static void batch_walk(const uint8_t *data, size_t size)
{
    size_t off = 0, len, prev = 0;
    const uint8_t *env;
    int rc;
    while ((rc = cp_spool_batch_next(data, size, &off, &env, &len)) == 1) {
        if (env < data || len == 0 || env + len > data + size || off <= prev) abort();
        prev = off;
    }
    if (rc != 0 && rc != CP_EPARSE) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    batch_walk(data, size);
    size_t off = 0;
    while (size - off >= CP_RELAY_HEADER) {
        uint8_t type;
        uint32_t len;
        cp_err err;
        if (cp_relay_parse_header(data + off, CP_RELAY_FRAME_MAX, &type, &len, &err) != 0) break;
        off += CP_RELAY_HEADER;
        if (len > size - off) break; /* the rest of the frame never came */
        if (type == CP_RELAY_ENVELOPE) {
            /* a copy of exactly the frame: reading past it is ASan's to catch */
            uint8_t *p = malloc(len ? len : 1);
            if (!p) abort();
            memcpy(p, data + off, len);
            cp_envelope e;
            if (cp_envelope_decode_view(p, len, CP_INGEST_MAX_PPROF, &e, &err) == 0) {
                cp_buf key = {0};
                if (cp_envelope_validate(&e, CP_INGEST_MAX_PPROF, &err) == 0 &&
                    cp_envelope_series_key(&e, &key) != 0)
                    abort();
                cp_buf_close(&key);
                cp_envelope_close(&e);
            }
            free(p);
        }
        off += len;
    }
    return 0;
}
