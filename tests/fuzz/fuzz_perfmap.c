/* libFuzzer target: the agent's perf map reader (collector/perfmap.c) reads a file the host
 * writes: any bytes, appended in two parts (a line may be cut between them), must be read
 * without crashing, leaking or reading out of bounds; every lookup answers a name inside
 * what was read, and every name splits; the same bytes as a command line and NODE_OPTIONS
 * are read for the flags behind the map. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perfmap.h"

static void append(const char *path, const uint8_t *d, size_t n)
{
    FILE *f = fopen(path, "ab");
    if (!f) abort();
    if (n && fwrite(d, 1, n, f) != n) abort();
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/cp-fuzz-perfmap-%d", (int)getpid());
    unlink(path);
    cp_perfmap_reset();
    /* the same bytes as a command line and as NODE_OPTIONS (the flags behind the map) */
    char *opts = malloc(size + 1);
    if (!opts) return 0;
    memcpy(opts, data, size);
    opts[size] = 0;
    if (cp_perfmap_needs_native_stack((const char *)data, size, opts) > 1) abort();
    free(opts);
    size_t half = size / 2;
    append(path, data, half);
    (void)cp_perfmap_refresh(path);
    append(path, data + half, size - half);
    (void)cp_perfmap_refresh(path);
    cp_perfmap_stats st;
    cp_perfmap_get_stats(&st);
    if (st.entries > CP_PERFMAP_MAX_ENTRIES) abort();
    for (uint64_t a = 0; a < (1u << 20); a += 1 + a / 4) {
        const char *name;
        size_t len;
        uint32_t slot;
        if (cp_perfmap_lookup(a, &name, &len, &slot) != 0) continue;
        if (len > 1024) abort();
        cp_perfmap_name n;
        cp_perfmap_split(name, len, &n);
        if (strlen(n.function) >= sizeof(n.function) || !n.function[0]) abort();
        cp_perfmap_set_tag(slot, cp_perfmap_get_tag(slot) + 1);
    }
    cp_perfmap_split((const char *)data, size, &(cp_perfmap_name){0});
    cp_perfmap_reset();
    unlink(path);
    return 0;
}
