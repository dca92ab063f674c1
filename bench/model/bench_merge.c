/* Benchmark: decode and merge N realistic gzip'd CPU windows from files.
 *   bench_merge gen DIR N     writes DIR/w00000.pb.gz ... (2,000 stacks, 1,000 samples each)
 *   bench_merge merge DIR N [THREADS]
 *                             prints the best of 5 runs of read+decode+merge+encode, in
 *                             seconds, decoding on THREADS threads (default 1) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "merge.h"
#include "pload.h"
#include "pprof.h"
#include "synth.h"
#include "clock.h"

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: bench_merge gen|merge DIR N\n");
        return 2;
    }
    const char *dir = argv[2];
    int n = atoi(argv[3]);
    char path[4096];
    if (!strcmp(argv[1], "gen")) {
        cp_synth *s = cp_synth_create(42, 2000);
        size_t bytes = 0;
        for (int i = 0; i < n; i++) {
            cp_profile *p = cp_synth_cpu_window(s, 1000, 1700000000000000000LL + i * 10000000000LL,
                                                10000000000LL);
            cp_buf b = {0};
            if (!p || cp_pprof_encode(p, 6, &b)) return 1;
            snprintf(path, sizeof path, "%s/w%05d.pb.gz", dir, i);
            if (cp_write_file(path, b.data, b.len, NULL)) return 1;
            bytes += b.len;
            cp_buf_close(&b);
            cp_profile_destroy(p);
        }
        printf("%d windows, %.1f KB each on average\n", n, (double)bytes / n / 1024);
        cp_synth_destroy(s);
        return 0;
    }
    int threads = argc == 5 ? atoi(argv[4]) : 1;
    char **paths = calloc((size_t)n, sizeof *paths);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/w%05d.pb.gz", dir, i);
        paths[i] = strdup(path);
    }
    double best = 1e9;
    int64_t total = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        cp_merger *m = cp_merger_create();
        cp_err err;
        size_t bad = 0;
        if (cp_pload_merge((size_t)n, cp_pload_read_file, paths, NULL, threads, m, &bad, &err)) {
            fprintf(stderr, "%s: %s\n", paths[bad], err.msg);
            return 1;
        }
        cp_profile *out = cp_merger_finish(m);
        cp_buf enc = {0};
        cp_pprof_encode(out, 1,
                        &enc); /* as `contprof merge` does; pprof -proto writes its result too */
        double t = now_s() - t0;
        if (t < best) best = t;
        total = cp_profile_total(out, 0);
        cp_buf_close(&enc);
        cp_profile_destroy(out);
        cp_merger_destroy(m);
    }
    if (total != (int64_t)n * 1000) {
        fprintf(stderr, "merged %lld samples, want %lld\n", (long long)total, (long long)n * 1000);
        return 1;
    }
    printf("%.6f\n", best);
    return 0;
}
