/* C++ and Rust demangling through libiberty's cplus_demangle_v3 and rust_demangle (both
 * allocate with malloc and return NULL on failure; libiberty's D and Java demanglers,
 * which go through xmalloc and may exit, are never called). */
#include "demangle.h"

#include <libiberty/demangle.h>

int cp_demangle_maybe(const char *name)
{
    return name && name[0] == '_' && (name[1] == 'Z' || name[1] == 'R');
}

char *cp_demangle(const char *name)
{
    if (!cp_demangle_maybe(name)) return NULL;
    /* a legacy Rust name is a valid Itanium one (_ZN...17h<hash>E): Rust first, as
     * cplus_demangle does */
    char *d = rust_demangle(name, DMGL_PARAMS | DMGL_ANSI);
    if (!d && name[1] == 'Z') d = cplus_demangle_v3(name, DMGL_PARAMS | DMGL_ANSI);
    return d;
}
