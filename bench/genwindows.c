/* genwindows: writes realistic CPU windows as gzip'd pprof files, for the delivery test and
 * the import benchmark (tests/e2e/delivery_test.c, bench/import/run.sh).
 * usage: genwindows DIR N [NSTACKS [NSAMPLES [STEP_S]]]
 * N consecutive 10 s windows of one service (the synthetic 2,000-stack service of
 * bench/synth.h by default, 1,000 samples each, about 60 KB gzip'd), ending 10 minutes ago,
 * named w00000.pb.gz ... in DIR. A large NSTACKS and NSAMPLES make one big profile. STEP_S
 * (default 10) spaces the windows' starts: 60 spreads 1,440 windows over a day. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pprof.h"
#include "synth.h"

#define SEC 1000000000LL

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: genwindows DIR N [NSTACKS [NSAMPLES [STEP_S]]]\n");
        return 2;
    }
    int n = atoi(argv[2]);
    uint32_t nstacks = argc > 3 ? (uint32_t)atoi(argv[3]) : 2000;
    uint32_t nsamples = argc > 4 ? (uint32_t)atoi(argv[4]) : 1000;
    int64_t step = argc > 5 ? atoi(argv[5]) : 10;
    if (step < 10) step = 10;
    cp_synth *sy = cp_synth_create(42, nstacks);
    if (!sy || n <= 0) return 1;
    int64_t t0 = ((int64_t)time(NULL) / 10 * 10 - 600 - step * n) * SEC;
    for (int i = 0; i < n; i++) {
        cp_profile *w = cp_synth_cpu_window(sy, nsamples, t0 + (int64_t)i * step * SEC, 10 * SEC);
        cp_buf b = {0};
        char path[4096];
        snprintf(path, sizeof path, "%s/w%05d.pb.gz", argv[1], i);
        if (!w || cp_pprof_encode(w, 6, &b) || cp_write_file(path, b.data, b.len, NULL)) {
            fprintf(stderr, "genwindows: %s: cannot write\n", path);
            return 1;
        }
        cp_buf_close(&b);
        cp_profile_destroy(w);
    }
    cp_synth_destroy(sy);
    return 0;
}
