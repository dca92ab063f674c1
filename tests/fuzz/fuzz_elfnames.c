/* libFuzzer target: one input through both back ends of model/elfread.h, the agent's
 * (collector/elfnames.c: pread on a memfd, a table and a one-pass scan) and the server's
 * (query/symtab.c: the bytes in memory). Neither may crash, leak or read out of bounds;
 * when both accept the input, they must give every address the same name, and the agent's
 * scan the names its table gives. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "elfnames.h"
#include "symtab.h"
#include "vec.h"

enum { FUNC_BYTES = 24, NPROBE = 64 };

/* The two names of va, agent (an, len bytes) and other, differ: says so and aborts. */
static void differ(const char *what, uint64_t va, const char *an, size_t len, const char *other)
{
    fprintf(stderr, "0x%llx: agent '%.*s', %s '%s'\n", (unsigned long long)va, an ? (int)len : 6,
            an ? an : "(none)", what, other ? other : "(none)");
    abort();
}

static int same_name(const char *an, size_t len, const char *other)
{
    return !an == !other && (!an || (strlen(other) == len && memcmp(an, other, len) == 0));
}

/* Both back ends name va alike (model/README.md "ELF symbols"): fatal, as what ASan and
 * UBSan find in either. */
static void same(const cp_elfnames *a, const cp_symtab *s, uint64_t va)
{
    size_t len = 0;
    const char *an = cp_elfnames_lookup(a, va, &len);
    const char *sn = s ? cp_symtab_function_at(s, va) : NULL;
    if (s && !same_name(an, len, sn)) differ("server", va, an, len, sn);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz_elfnames", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    cp_elfnames *a = NULL;
    if (cp_elfnames_create(path, NULL, 0, NULL, &a) == 0) {
        uint8_t *copy = malloc(size ? size : 1); /* exactly size bytes: overreads are ASan's */
        cp_buf tab = {0};
        char id[CP_BUILD_ID_HEX_MAX + 1];
        cp_err err;
        cp_symtab st, *s = NULL;
        if (copy) {
            memcpy(copy, data, size);
            if (cp_symtab_build(copy, size, 1u << 24, &tab, id, &err) == 0 &&
                cp_symtab_open(&st, tab.data, tab.len, &err) == 0)
                s = &st;
        }
        /* every entry's ends, both ways; then a scan of some of them */
        uint64_t probe[NPROBE];
        uint32_t np = 0;
        for (int plt = 0; plt < 2; plt++)
            for (uint32_t i = 0;; i++) {
                uint64_t lo, hi;
                const char *nm;
                size_t len;
                if (cp_elfnames_entry(a, plt, i, &lo, &hi, &nm, &len) != 0) break;
                same(a, s, lo);
                same(a, s, hi - 1);
                if (np < NPROBE && (np == 0 || lo > probe[np - 1])) probe[np++] = lo;
            }
        for (uint32_t i = 0; s && i < s->nfunc; i++) {
            const uint8_t *f = s->funcs + (size_t)i * FUNC_BYTES;
            same(a, s, cp_ld64(f));
            same(a, s, cp_ld64(f + 8) - 1);
        }
        /* the agent's one-pass scan gives the names its table gives (elfnames.h) */
        char *names[NPROBE];
        if (np && cp_elfnames_scan(path, NULL, 0, NULL, probe, np, names, NULL) == 0)
            for (uint32_t i = 0; i < np; i++) {
                size_t len = 0;
                const char *tn = cp_elfnames_lookup(a, probe[i], &len);
                if (!same_name(tn, len, names[i])) differ("scan", probe[i], tn, len, names[i]);
                free(names[i]);
            }
        cp_buf_close(&tab);
        free(copy);
        cp_elfnames_destroy(a);
    }
    close(fd);
    return 0;
}
