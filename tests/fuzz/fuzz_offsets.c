/* libFuzzer target: the ingest offsets reader (model/offsets.h) accepts or rejects any JSON
 * without crashing, whether the input is one partition's record or a whole answer of GET
 * /api/v1/ingest/offsets; every record it accepts is written and read again to the same
 * record. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "offsets.h"

static void round_trip(const cp_json *o)
{
    cp_partition_offsets a, b;
    if (cp_offsets_read(o, &a, NULL)) return;
    cp_buf w = {0};
    cp_json *j = NULL;
    if (cp_offsets_write(&w, &a) || cp_json_parse((const char *)w.data, w.len, &j, NULL) ||
        cp_offsets_read(j, &b, NULL))
        abort();
    if (a.partition != b.partition || a.stored != b.stored || a.known_from != b.known_from ||
        a.lost != b.lost || a.nranges != b.nranges)
        abort();
    for (uint32_t k = 0; k < a.nranges; k++)
        if (a.not_stored[k].from != b.not_stored[k].from ||
            a.not_stored[k].to != b.not_stored[k].to ||
            strcmp(a.not_stored[k].why, b.not_stored[k].why))
            abort();
    cp_json_free(j);
    cp_buf_close(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_json *j = NULL;
    if (cp_json_parse((const char *)data, size, &j, NULL)) return 0;
    round_trip(j);
    const cp_json *parts = cp_json_get(j, "partitions");
    for (uint32_t i = 0; parts && parts->type == CP_JSON_ARRAY && i < parts->n; i++)
        round_trip(parts->items[i]);
    cp_json_free(j);
    return 0;
}
