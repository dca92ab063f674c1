/* libFuzzer target: V8 heap snapshots (model/heapsnap.c) fed in two chunks cut where the
 * first byte says, then turned into a retainer profile, under a 64 MiB limit. No input may
 * crash, hang, hold more than the limit or leak. */
#include <stdint.h>
#include <stdlib.h>

#include "heapsnap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t cut = data[0] < size ? data[0] : size - 1;
    data++;
    size--;
    if (cut > size) cut = size;
    cp_heapsnap_limits lim;
    cp_heapsnap_limits_default(&lim);
    lim.max_bytes = 64 << 20;
    lim.max_depth = 16;
    lim.max_frames = 1000;
    lim.max_children = 50;
    cp_heapsnap *h;
    if (cp_heapsnap_create(&lim, &h)) abort();
    cp_err err;
    cp_profile *p = cp_profile_create();
    if (!p) abort();
    if (cp_heapsnap_feed(h, (const char *)data, cut, &err) == 0 &&
        cp_heapsnap_feed(h, (const char *)data + cut, size - cut, &err) == 0) {
        cp_heapsnap_stats st;
        if (cp_heapsnap_finish(h, p, &st, &err) == 0 &&
            cp_profile_total(p, 1) != (int64_t)st.total_bytes)
            abort(); /* every reachable byte is in the profile */
    }
    cp_profile_destroy(p);
    cp_heapsnap_destroy(h);
    return 0;
}
