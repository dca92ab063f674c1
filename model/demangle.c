/* C++ and Rust demangling through libiberty's cplus_demangle_v3 and rust_demangle (both
 * allocate with malloc and return NULL on failure; libiberty's D and Java demanglers,
 * which go through xmalloc and may exit, are never called). C++20 requires-clauses, which
 * Debian 12's libiberty (20230104) cannot read, are cut off (see cp_demangle). */
#include "demangle.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <libiberty/demangle.h>

static atomic_uint_fast64_t g_cut, g_failed;

int cp_demangle_maybe(const char *name)
{
    return name && name[0] == '_' && (name[1] == 'Z' || name[1] == 'R');
}

/* A C++ name libiberty refused: for each 'Q' (a requires-clause, C++20, as recent Clang and
 * GCC mangle constrained templates), the name before it, closed with the fewest 'E's that
 * make it a name libiberty reads: "ns::f<args>" without the clause, nor the parameters
 * after it (their substitutions may point into the clause). A 'Q' inside an identifier cuts
 * the identifier short, which libiberty refuses, so the first that reads is the clause.
 * NULL when no cut reads. */
static char *demangle_cut(const char *name)
{
    size_t n = strlen(name);
    if (n > 4096) return NULL; /* bounded work: a few demangles per 'Q' */
    char *buf = malloc(n + 8);
    if (!buf) return NULL;
    char *d = NULL;
    for (const char *q = strchr(name + 2, 'Q'); q && !d; q = strchr(q + 1, 'Q')) {
        size_t k = (size_t)(q - name);
        memcpy(buf, name, k);
        for (int closers = 0; closers <= 4 && !d; closers++) {
            memset(buf + k, 'E', (size_t)closers);
            buf[k + (size_t)closers] = 0;
            d = cplus_demangle_v3(buf, DMGL_PARAMS | DMGL_ANSI);
        }
    }
    free(buf);
    return d;
}

char *cp_demangle(const char *name)
{
    if (!cp_demangle_maybe(name)) return NULL;
    /* a legacy Rust name is a valid Itanium one (_ZN...17h<hash>E): Rust first, as
     * cplus_demangle does */
    char *d = rust_demangle(name, DMGL_PARAMS | DMGL_ANSI);
    if (!d && name[1] == 'Z') d = cplus_demangle_v3(name, DMGL_PARAMS | DMGL_ANSI);
    if (!d && name[1] == 'Z' && strchr(name + 2, 'Q')) {
        d = demangle_cut(name);
        if (d) atomic_fetch_add_explicit(&g_cut, 1, memory_order_relaxed);
    }
    if (!d) atomic_fetch_add_explicit(&g_failed, 1, memory_order_relaxed);
    return d;
}

void cp_demangle_counts(uint64_t *cut, uint64_t *failed)
{
    *cut = atomic_load_explicit(&g_cut, memory_order_relaxed);
    *failed = atomic_load_explicit(&g_failed, memory_order_relaxed);
}
