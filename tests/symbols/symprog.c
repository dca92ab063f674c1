/* The program of the server-side symbolization test: two hot functions, built -O2 without
 * frame pointers; the test runs a stripped copy under the agent and uploads this unstripped
 * build to contprofd afterwards. Usage: symprog SECONDS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile uint64_t sink;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Mixing in a loop the compiler cannot fold: most of the CPU time. */
__attribute__((noinline)) uint64_t symprog_hash_spin(uint64_t seed, int rounds)
{
    uint64_t h = seed;
    for (int i = 0; i < rounds; i++) {
        h ^= h >> 33;
        h *= 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
    }
    return h;
}

/* A second hot function, about half the first one's time. */
__attribute__((noinline)) uint64_t symprog_table_walk(uint64_t *t, size_t n, int rounds)
{
    uint64_t s = 0;
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < n; i++)
            s += t[(i * 7 + (size_t)r) % n] ^ (uint64_t)i;
    return s;
}

/* Mangled names (asm labels) for the server-side demangling test: C++, Rust v0, legacy
 * Rust. Tiny, called once a round. */
uint64_t symprog_cxx(uint64_t x) __asm__("_ZN3foo3barEv");
uint64_t symprog_rust_v0(uint64_t x) __asm__("_RNvCs1234_7mycrate4main");
uint64_t symprog_rust_legacy(uint64_t x) __asm__("_ZN7mycrate6legacy17h0123456789abcdefE");
__attribute__((noinline)) uint64_t symprog_cxx(uint64_t x)
{
    return symprog_hash_spin(x, 100);
}
__attribute__((noinline)) uint64_t symprog_rust_v0(uint64_t x)
{
    return symprog_hash_spin(x + 1, 100);
}
__attribute__((noinline)) uint64_t symprog_rust_legacy(uint64_t x)
{
    return symprog_hash_spin(x + 2, 100);
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 3;
    uint64_t *t = malloc(4096 * sizeof *t);
    if (!t) return 1;
    for (size_t i = 0; i < 4096; i++)
        t[i] = i * 0x9e3779b97f4a7c15ULL;
    double end = now_s() + secs;
    while (now_s() < end) {
        sink += symprog_hash_spin(sink + 1, 200000);
        sink += symprog_table_walk(t, 4096, 25);
        sink += symprog_cxx(sink) + symprog_rust_v0(sink) + symprog_rust_legacy(sink);
    }
    free(t);
    printf("%llu\n", (unsigned long long)sink);
    return 0;
}
