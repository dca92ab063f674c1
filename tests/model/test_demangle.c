/* model/demangle.c: C++ (Itanium) and Rust names through libiberty; a small C++20 program
 * (cxx20.cc, g++ -std=c++20) with constrained templates demangled whole; names with a C++20
 * requires-clause, which Debian 12's libiberty refuses (as recent Clang mangles them, seen
 * in workerd's V8), demangled without the clause; the rest left mangled and counted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demangle.h"
#include "test.h"

static void demangles_to(const char *name, const char *want)
{
    char *d = cp_demangle(name);
    printf("%s -> %s\n", name, d ? d : "(null)");
    if (want) {
        CHECK(d);
        CHECK_STREQ(d, want);
    } else {
        CHECK(!d);
    }
    free(d);
}

TEST(cxx_and_rust_names)
{
    demangles_to("_ZN3foo3barEv", "foo::bar()");
    demangles_to("_RNvCs1234_7mycrate4main", "mycrate::main");
    demangles_to("_ZN7mycrate6legacy17h0123456789abcdefE", "mycrate::legacy");
    demangles_to("_ZN5QueueIiE4pushEi", "Queue<int>::push(int)"); /* a Q in an identifier */
    demangles_to("main", NULL);
    demangles_to("_Zgarbage", NULL);
}

/* Every function symbol g++ -std=c++20 gave cxx20.cc is demangled whole. */
TEST(cxx20_program_demangled)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "nm --defined-only %s", CP_CXX20);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    char line[4096];
    int mangled = 0, found = 0;
    static const char *const want[] = {"int twice<int>(int)", "int thrice<int>(int)",
                                       "double half<double>(double)",
                                       "int Box::get<int>(int) const", "make_lambda()"};
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        const char *name = strrchr(line, ' ');
        if (!name || strncmp(name + 1, "_Z", 2) != 0) continue;
        char type = name[-1];
        if (type != 'T' && type != 't' && type != 'W') continue;
        char *d = cp_demangle(name + 1);
        printf("%s -> %s\n", name + 1, d ? d : "(null)");
        CHECK(d);
        mangled++;
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            found += strcmp(d, want[i]) == 0;
        free(d);
    }
    CHECK(pclose(p) == 0);
    CHECK(mangled >= 6); /* the lambda's call operator too */
    CHECK_EQ(found, 5);
}

/* A requires-clause ("Q", C++20) as recent Clang mangles it: libiberty 20230104 refuses
 * the name, so it comes without the clause and the parameters after it; counted. */
TEST(requires_clause_cut_and_counted)
{
    uint64_t cut0, failed0, cut1, failed1;
    cp_demangle_counts(&cut0, &failed0);
    demangles_to("_ZN2v88internal11HandleScope14CloseAndEscapeINS0_5UnionIJNS0_3SmiENS0_"
                 "10HeapNumberEEEENS0_6HandleEQsr3stdE16is_convertible_vIT0_IT_ENS0_"
                 "12DirectHandleISB_EEEEESC_SC_",
                 "v8::internal::HandleScope::CloseAndEscape<v8::internal::Union<v8::internal::"
                 "Smi, v8::internal::HeapNumber>, v8::internal::Handle>");
    /* a constrained template parameter ("Tk", also new): left mangled */
    demangles_to("_ZN7workerd3jsg13MemoryTracker5trackITkNS0_14MemoryRetainerENS0_4NodeEEEvPKT_",
                 NULL);
    cp_demangle_counts(&cut1, &failed1);
    CHECK_EQ(cut1 - cut0, 1);
    CHECK_EQ(failed1 - failed0, 1);
}

TEST_MAIN(T(cxx_and_rust_names), T(cxx20_program_demangled), T(requires_clause_cut_and_counted))
