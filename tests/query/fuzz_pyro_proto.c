/* libFuzzer target: the protobuf reader and writer of querier.v1 (query/pbjson.h) over a
 * recursive schema holding every field type: whatever decodes must encode, and the encoding
 * must decode and encode again to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pbjson.h"

extern const cp_pbj_msg g_node;
static const cp_pbj_field g_node_f[] = {
    {1, "name", CP_PBJ_STRING, 0, NULL}, {2, "values", CP_PBJ_INT64, 1, NULL},
    {3, "kind", CP_PBJ_ENUM, 0, NULL},   {4, "flag", CP_PBJ_BOOL, 0, NULL},
    {5, "x", CP_PBJ_DOUBLE, 0, NULL},    {6, "kids", CP_PBJ_MSG, 1, &g_node},
    {7, "one", CP_PBJ_MSG, 0, &g_node},  {8, "tags", CP_PBJ_STRING, 1, NULL},
    {9, "start", CP_PBJ_INT64, 0, NULL},
};
const cp_pbj_msg g_node = {"fuzz.Node", g_node_f, sizeof g_node_f / sizeof g_node_f[0]};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    cp_json *j = NULL, *j2 = NULL;
    cp_err err = {0};
    if (cp_pbj_decode(&g_node, data, size, &j, &err)) return 0;
    cp_buf a = {0}, b = {0};
    if (cp_pbj_encode(&g_node, j, &a, &err)) abort();
    if (cp_pbj_decode(&g_node, a.data, a.len, &j2, &err)) abort();
    if (cp_pbj_encode(&g_node, j2, &b, &err)) abort();
    if (a.len != b.len || (a.len && memcmp(a.data, b.data, a.len))) abort();
    cp_buf_close(&a);
    cp_buf_close(&b);
    cp_json_free(j);
    cp_json_free(j2);
    return 0;
}
