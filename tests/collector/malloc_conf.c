/* Conformance of the malloc family: every entry point, with and without the agent, must
 * give a program exactly what glibc promises (sizes, alignment, usable bytes kept by
 * realloc, zeroing, errno, failures). Prints a deterministic transcript that test_malloc
 * compares between a run without the agent and runs under it; exits 1 if a promise is
 * broken even where both runs would agree.
 *
 *   malloc_conf conf     the transcript
 *   malloc_conf usable   200,000 reallocs of blocks written up to malloc_usable_size */
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE 4096u
#define MAX_FILL ((size_t)8 << 20)

static int broken; /* a promise broken: exit 1 */

/* Hides a size from the compiler, which would refuse (or fold) calls it can see fail. */
static size_t opaque(size_t v)
{
    __asm__("" : "+r"(v));
    return v;
}
#define O(v) opaque((size_t)(v))
static unsigned char ref[MAX_FILL + (1u << 20)];

/* Fills p[0..len) with the pattern starting at phase seed (0..255). */
static void fill(void *p, size_t len, unsigned seed)
{
    memcpy(p, ref + seed, len);
}

static int kept(const void *p, size_t len, unsigned seed)
{
    return memcmp(p, ref + seed, len) == 0;
}

static int aligned(const void *p, size_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

static int all_zero(const unsigned char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i]) return 0;
    return 1;
}

/* ------------------------------------------------------------------------------------
 * Every size through every entry point */

enum {
    K_MALLOC,
    K_CALLOC,
    K_REALLOC_NULL,
    K_REALLOCARRAY_NULL,
    K_MEMALIGN16,
    K_MEMALIGN64,
    K_ALIGNED256,
    K_POSIX8,
    K_POSIX4096,
    K_MEMALIGN8192,
    K_VALLOC,
    K_PVALLOC,
    K_N
};

static const char *const kind_name[K_N] = {"malloc",
                                           "calloc",
                                           "realloc(NULL)",
                                           "reallocarray(NULL)",
                                           "memalign(16)",
                                           "memalign(64)",
                                           "aligned_alloc(256)",
                                           "posix_memalign(8)",
                                           "posix_memalign(4096)",
                                           "memalign(8192)",
                                           "valloc",
                                           "pvalloc"};

static const size_t kind_align[K_N] = {16, 16, 16, 16, 16, 64, 256, 16, 4096, 8192, PAGE, PAGE};

static void *alloc_kind(int k, size_t n)
{
    void *p = NULL;
    switch (k) {
    case K_MALLOC:
        return malloc(n);
    case K_CALLOC:
        return calloc(1, n);
    case K_REALLOC_NULL:
        return realloc(NULL, n);
    case K_REALLOCARRAY_NULL:
        return reallocarray(NULL, 1, n);
    case K_MEMALIGN16:
        return memalign(16, n);
    case K_MEMALIGN64:
        return memalign(64, n);
    case K_ALIGNED256:
        return aligned_alloc(256, n);
    case K_POSIX8:
        return posix_memalign(&p, 8, n) == 0 ? p : NULL;
    case K_POSIX4096:
        return posix_memalign(&p, 4096, n) == 0 ? p : NULL;
    case K_MEMALIGN8192:
        return memalign(8192, n);
    case K_VALLOC:
        return valloc(n);
    case K_PVALLOC:
        return pvalloc(n);
    }
    return NULL;
}

typedef struct counts {
    long sizes, null, misaligned, short_usable, not_zeroed, usable_not_zeroed, errno_touched,
        reallocs, realloc_null, realloc_lost;
} counts;

/* The block p (usable u, written in full with phase seed) goes through realloc to each
 * size of the chain: grow past its usable size, shrink, the same, grow far. Each time the
 * first min(usable before, new size) bytes must be kept; the new block is written in full
 * again. Frees the last block. */
static void realloc_chain(void *p, size_t u, unsigned seed, counts *c)
{
    size_t chain[4] = {u + 1, u / 2 + 1, 0, 2 * u + 4133};
    for (int i = 0; i < 4; i++) {
        size_t n2 = i == 2 ? u : chain[i];
        if (n2 > MAX_FILL) n2 = MAX_FILL;
        errno = 777;
        void *q = realloc(p, n2);
        c->reallocs++;
        if (!q) {
            c->realloc_null++;
            break;
        }
        if (errno != 777) c->errno_touched++;
        if (!kept(q, u < n2 ? u : n2, seed)) c->realloc_lost++;
        p = q;
        u = malloc_usable_size(p);
        if (u < n2) c->short_usable++;
        seed = (seed + 101) & 255;
        fill(p, u, seed);
    }
    free(p);
}

static void one(int k, size_t n, counts *c)
{
    c->sizes++;
    errno = 777;
    unsigned char *p = alloc_kind(k, n);
    if (!p) {
        c->null++;
        return;
    }
    if (errno != 777) c->errno_touched++;
    if (!aligned(p, kind_align[k])) c->misaligned++;
    size_t u = malloc_usable_size(p);
    size_t want = k == K_PVALLOC ? (n + PAGE - 1) / PAGE * PAGE : n;
    if (u < want) c->short_usable++;
    if (k == K_CALLOC) {
        if (!all_zero(p, n)) c->not_zeroed++;
        if (!all_zero(p, u)) c->usable_not_zeroed++;
    }
    unsigned seed = (unsigned)(n * 7 + (size_t)k) & 255;
    fill(p, u, seed);
    realloc_chain(p, u, seed, c);
}

/* Leaves garbage behind in the heap's free chunks, so that calloc must really zero. */
static void dirty_heap(void)
{
    enum { N = 512 };
    void *v[N];
    for (int i = 0; i < N; i++) {
        size_t n = (size_t)(i * 97 % 5000) + 1;
        v[i] = malloc(n);
        if (v[i]) memset(v[i], 0xEE, malloc_usable_size(v[i]));
    }
    for (int i = 0; i < N; i++)
        free(v[i]);
}

static void all_sizes(void)
{
    /* 0..70000: every size up to 4200 through malloc; through every entry point the
     * sizes around each boundary (tcache, fastbins, the interior blocks' 64 KiB, the mmap
     * threshold) and a geometric walk up to 8 MiB */
    static size_t sizes[4096];
    size_t ns = 0;
    for (size_t n = 0; n <= 300; n++)
        sizes[ns++] = n;
    for (size_t n = 301; n <= ((size_t)1 << 20); n += n / 12 + 1)
        sizes[ns++] = n;
    static const size_t edges[] = {1008,   1024,   1032,   4080,   4095,    4096,   4097,  8192,
                                   61440,  65520,  65535,  65536,  65537,   69632,  70000, 131047,
                                   131072, 131073, 135168, 200000, 1048576, 3145745};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        sizes[ns++] = edges[i];
    for (int k = 0; k < K_N; k++) {
        counts c = {0};
        dirty_heap();
        for (size_t i = 0; i < ns; i++)
            one(k, sizes[i], &c);
        if (k == K_MALLOC)
            for (size_t n = 301; n <= 70000; n += n < 4200 ? 1 : 61)
                one(k, n, &c);
        printf("%-22s sizes %ld: null %ld, misaligned %ld, usable<asked %ld, errno touched %ld, "
               "reallocs %ld (null %ld, bytes lost %ld)",
               kind_name[k], c.sizes, c.null, c.misaligned, c.short_usable, c.errno_touched,
               c.reallocs, c.realloc_null, c.realloc_lost);
        if (k == K_CALLOC)
            printf(", not zeroed %ld, usable not zeroed %ld", c.not_zeroed, c.usable_not_zeroed);
        printf("\n");
        broken |= c.null || c.misaligned || c.short_usable || c.errno_touched || c.realloc_null ||
                  c.realloc_lost || c.not_zeroed;
    }
}

/* ------------------------------------------------------------------------------------
 * Edge cases, one line each */

static const char *err_name(int e)
{
    switch (e) {
    case 0:
        return "0";
    case 777:
        return "untouched";
    case ENOMEM:
        return "ENOMEM";
    case EINVAL:
        return "EINVAL";
    case ERANGE:
        return "ERANGE";
    default:
        return "other";
    }
}

/* One allocation that may fail: NULL or not, errno, and the alignment it has (capped). */
static void report(const char *what, void *p, size_t align)
{
    int e = errno;
    printf("%-40s %s, errno %s", what, p ? "block" : "NULL", err_name(e));
    if (p && align) printf(", aligned to %zu: %s", align, aligned(p, align) ? "yes" : "NO");
    printf("\n");
    free(p);
}

#define TRY(expr, align)                                                                           \
    do {                                                                                           \
        errno = 777;                                                                               \
        void *p_ = (expr);                                                                         \
        report(#expr, p_, align);                                                                  \
    } while (0)

static void posix_case(size_t align, size_t n)
{
    void *out = (void *)&posix_case; /* must stay as it is on failure */
    errno = 777;
    int rc = posix_memalign(&out, align, n);
    int e = errno;
    char what[64];
    snprintf(what, sizeof what, "posix_memalign(%zu, %zu)", align, n);
    printf("%-40s %s, errno %s, out %s\n", what, err_name(rc), err_name(e),
           rc ? (out == (void *)&posix_case ? "untouched" : "CHANGED")
              : (aligned(out, align) ? "aligned" : "MISALIGNED"));
    if (rc == 0)
        free(out);
    else if (out != (void *)&posix_case)
        broken = 1;
}

/* realloc/reallocarray that must fail: NULL, ENOMEM, and the block still whole. */
static void failing_realloc(int array)
{
    size_t n = 3000;
    unsigned char *p = malloc(n);
    size_t u = malloc_usable_size(p);
    fill(p, u, 9);
    errno = 777;
    void *q = array ? reallocarray(p, O(SIZE_MAX / 2 + 1), 2) : realloc(p, O(SIZE_MAX - 4096));
    int e = errno;
    printf("%-40s %s, errno %s, block kept: %s\n",
           array ? "reallocarray(p, SIZE_MAX/2+1, 2)" : "realloc(p, SIZE_MAX-4096)",
           q ? "block" : "NULL", err_name(e), kept(p, u, 9) ? "yes" : "NO");
    if (q) {
        broken = 1;
        free(q);
    } else
        free(p);
}

static void edges(void)
{
    errno = 777;
    size_t z = malloc_usable_size(NULL);
    printf("malloc_usable_size(NULL)                 %zu, errno %s\n", z, err_name(errno));
    errno = 777;
    free(NULL);
    printf("free(NULL)                               errno %s\n", err_name(errno));
    void *big = malloc((size_t)4 << 20), *small = malloc(100), *pa = memalign(4096, 100);
    errno = 777;
    free(big);
    free(small);
    free(pa);
    printf("free(4 MiB, 100 B, page-aligned)         errno %s\n", err_name(errno));

    TRY(realloc(NULL, 0), 16);
    TRY(realloc(malloc(100), 0), 0);
    TRY(realloc(memalign(4096, 100), 0), 0);
    TRY(realloc(malloc((size_t)1 << 20), 0), 0);
    TRY(reallocarray(malloc(100), 0, 5), 0);
    TRY(reallocarray(NULL, O(1) << 33, O(1) << 33), 0);
    TRY(malloc(0), 16);
    TRY(calloc(0, 0), 16);

    TRY(malloc(O(SIZE_MAX)), 0);
    TRY(malloc(O(SIZE_MAX / 2 + 1)), 0);
    TRY(malloc(O(PTRDIFF_MAX)), 0);
    TRY(malloc(O(1) << 46), 0);
    TRY(calloc(O(SIZE_MAX / 2 + 1), 2), 0);
    TRY(calloc(O(1) << 33, O(1) << 33), 0);
    TRY(calloc(1, O(1) << 46), 0);
    TRY(calloc(O(1) << 23, O(1) << 23), 0);
    TRY(memalign(64, O(SIZE_MAX - 100)), 0);
    TRY(memalign(4096, O(1) << 46), 0);
    TRY(aligned_alloc(4096, O(SIZE_MAX / 2)), 0);
    TRY(valloc(O(SIZE_MAX - 10)), 0);
    TRY(pvalloc(O(SIZE_MAX - 10)), 0);
    failing_realloc(0);
    failing_realloc(1);

    /* glibc 2.36: aligned_alloc and memalign round an alignment that is not a power of two
     * up to the next one (2.38 made aligned_alloc refuse it with EINVAL) */
    TRY(aligned_alloc(24, 100), 32);
    TRY(aligned_alloc(3, 10), 4);
    TRY(aligned_alloc(48, 1000), 64);
    TRY(aligned_alloc(4095, 10), 4096);
    TRY(aligned_alloc(0, 10), 16);
    TRY(aligned_alloc(1, 10), 16);
    TRY(memalign(24, 100), 32);
    TRY(memalign(6000, 100), 8192);
    TRY(memalign(0, 10), 16);
    TRY(memalign(1, 10), 16);
    TRY(memalign(8, 10), 16);
    TRY(memalign((size_t)1 << 20, 10), (size_t)1 << 20);
    TRY(memalign((size_t)1 << 26, (size_t)1 << 20), (size_t)1 << 26);
    TRY(aligned_alloc((size_t)1 << 21, (size_t)1 << 21), (size_t)1 << 21);
    TRY(aligned_alloc((size_t)1 << 16, 70000), (size_t)1 << 16);
    TRY(memalign(O(1) << 62, 1), 0);
    TRY(memalign(O(SIZE_MAX / 2 + 1), 1), 0);
    TRY(aligned_alloc(O(SIZE_MAX / 2 + 1), 1), 0);

    posix_case(0, 16);
    posix_case(3, 16);
    posix_case(4, 16);
    posix_case(12, 16);
    posix_case(24, 16);
    posix_case(SIZE_MAX / 2 + 3, 16);
    posix_case(8, 0);
    posix_case(16, 16);
    posix_case((size_t)1 << 24, 100);
    posix_case(4096, 70000);
    posix_case(16, O(SIZE_MAX));
    posix_case(4096, O(SIZE_MAX / 2));
    posix_case(SIZE_MAX / 2 + 1, 16);

    static const size_t pv[] = {0, 1, 4095, 4096, 4097, 70000};
    for (size_t i = 0; i < sizeof pv / sizeof pv[0]; i++) {
        errno = 777;
        void *p = pvalloc(pv[i]);
        size_t want = (pv[i] + PAGE - 1) / PAGE * PAGE;
        int e = errno;
        char what[64];
        snprintf(what, sizeof what, "pvalloc(%zu)", pv[i]);
        printf("%-40s usable>=%zu: %s, page-aligned: %s, errno %s\n", what, want,
               p && malloc_usable_size(p) >= want ? "yes" : "NO",
               p && aligned(p, PAGE) ? "yes" : "NO", err_name(e));
        if (!p || malloc_usable_size(p) < want || !aligned(p, PAGE)) broken = 1;
        free(p);
        errno = 777;
        p = valloc(pv[i]);
        e = errno;
        snprintf(what, sizeof what, "valloc(%zu)", pv[i]);
        printf("%-40s usable>=%zu: %s, page-aligned: %s, errno %s\n", what, pv[i],
               p && malloc_usable_size(p) >= pv[i] ? "yes" : "NO",
               p && aligned(p, PAGE) ? "yes" : "NO", err_name(e));
        free(p);
    }

    /* not interposed: they must still reach glibc and see its heap */
    void *keep = malloc((size_t)10 << 20), *keep2 = malloc(1000);
    memset(keep, 1, (size_t)10 << 20);
    struct mallinfo2 mi = mallinfo2();
    /* where the 10 MiB live (mmapped or in the heap) depends on the heap's history */
    printf("%-40s hblkhd+uordblks>=10MiB: %s\n", "mallinfo2()",
           mi.hblkhd + mi.uordblks >= ((size_t)10 << 20) ? "yes" : "NO");
    free(keep);
    free(keep2);
    errno = 777;
    int t = malloc_trim(0);
    printf("%-40s returned 0 or 1: %s, errno %s\n", "malloc_trim(0)",
           t == 0 || t == 1 ? "yes" : "NO", err_name(errno));
    errno = 777;
    int m = mallopt(M_CHECK_ACTION, 3);
    printf("mallopt(M_CHECK_ACTION, 3)               %d, errno %s\n", m, err_name(errno));
}

/* ------------------------------------------------------------------------------------
 * Issue 24: a program writes all the bytes malloc_usable_size promises, then reallocs */

static int usable(void)
{
    long lost = 0, total = 0;
    for (unsigned i = 0; i < 200000; i++) {
        size_t n = 1 + (size_t)(i * 7919u % 3000);
        unsigned char *p = i % 5 == 4 ? calloc(1, n) : i % 5 == 3 ? memalign(64, n) : malloc(n);
        if (!p) return 1;
        size_t u = malloc_usable_size(p);
        unsigned seed = i & 255;
        fill(p, u, seed);
        size_t n2 = i % 3 == 0 ? u + 100 : i % 3 == 1 ? u : n / 2 + 1;
        unsigned char *q = realloc(p, n2);
        if (!q) return 1;
        total++;
        lost += !kept(q, u < n2 ? u : n2, seed);
        free(q);
    }
    printf("realloc after writing the usable size: %ld reallocs, %ld lost bytes\n", total, lost);
    return lost != 0;
}

int main(int argc, char **argv)
{
    for (size_t i = 0; i < sizeof ref; i++)
        ref[i] = (unsigned char)(i * 131 + 7 + (i >> 8));
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "usable") == 0) return usable();
    all_sizes();
    edges();
    return broken;
}
