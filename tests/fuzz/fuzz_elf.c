/* libFuzzer target: the ELF reader of server-side symbolization (query/symtab.c) must
 * refuse or accept any upload without crashing, leaking, reading out of bounds or passing
 * its size bound; a table it builds must open and answer lookups anywhere. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "symtab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a private copy: libelf sees exactly size bytes, so any overread is ASan's to catch */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    cp_buf tab = {0};
    char id[CP_BUILD_ID_HEX_MAX + 1];
    cp_err err;
    const size_t max_table = 1u << 20;
    if (cp_symtab_build(copy, size, max_table, &tab, id, &err) == 0) {
        if (tab.len > max_table || strlen(id) < 2) abort();
        cp_symtab t;
        if (cp_symtab_open(&t, tab.data, tab.len, &err) != 0) abort();
        cp_symframe fr[CP_SYMTAB_MAX_FRAMES];
        for (uint64_t off = 0; off < size + 4096; off += 1 + off / 8) {
            uint32_t n = cp_symtab_lookup(&t, off, fr, CP_SYMTAB_MAX_FRAMES);
            if (n > CP_SYMTAB_MAX_FRAMES) abort();
            for (uint32_t i = 0; i < n; i++)
                if (!fr[i].name || !fr[i].file) abort();
        }
    }
    cp_buf_close(&tab);
    free(copy);
    return 0;
}
