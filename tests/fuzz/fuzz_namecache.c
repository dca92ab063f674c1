/* libFuzzer target: the host's name cache files (collector/namecache.c) the agent maps from
 * the relay's names/: any bytes are refused or read without reading out of bounds, and
 * every name a lookup answers lies inside the file and ends in its NUL. The build id and
 * flags asked for are the input's own (so the header check passes and the entries are
 * reached). The same bytes as an 'N' frame's payload (model/relay.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "namecache.h"
#include "relay.h"

static void check_name(const uint8_t *data, size_t size, const char *nm, size_t len)
{
    if (!nm) return;
    const uint8_t *p = (const uint8_t *)nm;
    if (p < data || p + len >= data + size || p[len] != 0 || len == 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_relay_names n;
    if (cp_relay_names_parse(data, size, &n, NULL) == 0 &&
        (n.path[0] != '/' || strlen(n.path) + 3u + n.id_len != size))
        abort();
    if (size < 33) return 0;
    uint32_t id_len = data[12] <= CP_NAMECACHE_ID_MAX ? data[12] : 0;
    cp_namecache c;
    if (cp_namecache_parse(data, size, data + 32, id_len, data[13], &c) != 0) return 0;
    uint64_t total = (uint64_t)c.nfunc + c.nplt;
    for (uint64_t i = 0; i < total && i < 4096; i++) {
        uint64_t lo;
        uint32_t sz;
        memcpy(&lo, data + CP_NAMECACHE_HEADER + i * CP_NAMECACHE_ENTRY, 8);
        memcpy(&sz, data + CP_NAMECACHE_HEADER + i * CP_NAMECACHE_ENTRY + 8, 4);
        uint64_t at[] = {lo, lo - 1, lo + sz, lo + sz - 1, lo + sz / 2, UINT64_MAX, 0};
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
            size_t len = 0;
            const char *nm = cp_namecache_lookup(&c, at[k], &len);
            check_name(data, size, nm, len);
        }
    }
    return 0;
}
