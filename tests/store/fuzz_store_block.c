/* libFuzzer target for what the store reads back from disk: blocks (cp_block_it) and
 * dictionary entries (cp_dict_load). A damaged database must give errors, never crashes.
 * The first input byte picks the parser. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t sel = data[0];
    data++, size--;
    if (sel < 128) {
        cp_buf scratch = {0};
        cp_block_it it;
        if (cp_block_it_init(&it, data, size, &scratch, NULL) == 0) {
            uint32_t id;
            int64_t vals[CP_MAX_TYPES];
            while (cp_block_it_next(&it, &id, vals) == 1) {
            }
        }
        cp_acc a;
        cp_acc_init(&a, 0);
        cp_block_load(&a, data, size, &scratch, NULL);
        cp_acc_close(&a);
        cp_buf_close(&scratch);
    } else {
        static const uint8_t kinds[] = {CP_D_STRING, CP_D_FUNCTION, CP_D_MAPPING, CP_D_LOCATION,
                                        CP_D_STACK};
        cp_dict d;
        if (cp_dict_init(&d)) return 0;
        d.tenant = "fuzz";
        d.tenant_len = 4;
        uint8_t kind = kinds[sel % 5];
        uint32_t id = kind == CP_D_STRING ? 1 : 1;
        /* and as a format-1 store's entry, canonicalized at open */
        if (cp_dict_load(&d, kind, id, data, size, NULL) == 0) (void)cp_dict_canonicalize(&d);
        cp_dict_close(&d);
    }
    return 0;
}
