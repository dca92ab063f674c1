/* Demangled names for C++ (Itanium) and Rust (legacy and v0) symbols, with libiberty's
 * demanglers (linked statically, hidden): used by the agent (collector/window.c) and by
 * contprofd's symbol tables (query/symtab.c). */
#ifndef CP_DEMANGLE_H
#define CP_DEMANGLE_H

#include <stdint.h>

/* Whether name looks mangled (_Z..., _R...): a cheap test before cp_demangle. */
int cp_demangle_maybe(const char *name);

/* name demangled with parameters ("v8::internal::JsonStringifier::Serialize_<false>(...)",
 * "mycrate::main"; a legacy Rust name without its ::h<hash>), or NULL when name is not a
 * mangled C++ or Rust name libiberty reads, or out of memory. A C++ name with a C++20
 * requires-clause ("...EQsr3std...", which libiberty 20230104 refuses) comes without the
 * clause and the parameters after it ("v8::internal::HandleScope::CloseAndEscape<...>").
 * The caller frees the result. Never exits or aborts (libiberty's xmalloc paths are not
 * reached: only the malloc-based C++ and Rust demanglers are called). Thread-safe;
 * allocates. */
char *cp_demangle(const char *name);

/* Names demangled by cutting a requires-clause, and names left mangled (cp_demangle gave
 * NULL for a _Z/_R name), since the process started. */
void cp_demangle_counts(uint64_t *cut, uint64_t *failed);

#endif
