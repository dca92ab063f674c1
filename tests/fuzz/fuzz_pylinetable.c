/* libFuzzer target: the agent's readers of CPython 3.11 data (collector/python.c), which read
 * memory of the host's interpreter that may be torn or reused: a location table (any bytes)
 * asked for the line of every code unit, and a str object (a 72-byte header, then its data)
 * read through a bounded reader. Neither may read past what it was given, loop without end
 * or write past its output. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "python.h"

static const uint8_t *g_mem;
static size_t g_len;

/* The object sits at address 4096; memory beyond the input is unreadable. */
static int bounded_read(uintptr_t addr, void *buf, size_t len)
{
    if (addr < 4096 || addr - 4096 > g_len || len > g_len - (addr - 4096)) return -1;
    memcpy(buf, g_mem + (addr - 4096), len);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8) return 0;
    int32_t first;
    memcpy(&first, data, 4);
    uint32_t units = (uint32_t)data[4] | (uint32_t)data[5] << 8;
    const uint8_t *lt = data + 8;
    size_t n = size - 8;
    uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan sees any read past it */
    if (!copy) return 0;
    memcpy(copy, lt, n);
    for (uint32_t u = 0; u <= units && u < 512; u++)
        (void)cp_py_line_311(copy, n, first, u);
    free(copy);

    if (size >= 72) {
        g_mem = data;
        g_len = size;
        char out[64];
        int k = cp_py_str_311(data, 4096, bounded_read, out, sizeof out);
        if (k >= (int)sizeof out || (k >= 0 && strlen(out) != (size_t)k)) abort();
    }
    return 0;
}
