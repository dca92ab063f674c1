/* One address, one name: the agent's tables (collector/elfnames.c, read with pread) and the
 * server's (query/symtab.c, from the uploaded bytes) built from the same real objects must
 * name every symbol's address alike (model/README.md "ELF symbols"). */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elfnames.h"
#include "symtab.h"
#include "test.h"
#include "vec.h"

enum { FUNC_BYTES = 24 };

/* Checks one address both ways; returns 1 if it has a name. */
static int same_at(const cp_elfnames *a, const cp_symtab *s, uint64_t va, const char *path)
{
    size_t len = 0;
    const char *an = cp_elfnames_lookup(a, va, &len);
    const char *sn = cp_symtab_function_at(s, va);
    if (!an != !sn || (an && (strlen(sn) != len || memcmp(an, sn, len) != 0))) {
        fprintf(stderr, "%s: 0x%llx: agent '%.*s', server '%s'\n", path, (unsigned long long)va,
                an ? (int)len : 6, an ? an : "(none)", sn ? sn : "(none)");
        return -1;
    }
    return an != NULL;
}

/* Builds both tables of the object at path and compares the names at the first and last
 * byte of every entry of each; returns the number of entries compared. */
static uint32_t compare(const char *path)
{
    cp_elfnames *a = NULL;
    int rc = cp_elfnames_create(path, NULL, 0, NULL, &a);
    if (rc != 0) fprintf(stderr, "%s: agent table: %s\n", path, cp_strerror(rc));
    CHECK_EQ(rc, 0);
    cp_buf bytes = {0}, tab = {0};
    CHECK_EQ(cp_read_file(path, &bytes, NULL), 0);
    char id[CP_BUILD_ID_HEX_MAX + 1];
    cp_err err = {0};
    rc = cp_symtab_build(bytes.data, bytes.len, (size_t)1 << 30, &tab, id, &err);
    if (rc != 0) fprintf(stderr, "%s: server table: %s\n", path, err.msg);
    CHECK_EQ(rc, 0);
    cp_symtab s;
    CHECK_EQ(cp_symtab_open(&s, tab.data, tab.len, &err), 0);
    uint32_t compared = 0, bad = 0;
    for (int plt = 0; plt < 2; plt++) /* the agent's functions, then its stubs */
        for (uint32_t i = 0;; i++) {
            uint64_t lo, hi;
            const char *nm;
            size_t len;
            if (cp_elfnames_entry(a, plt, i, &lo, &hi, &nm, &len) != 0) break;
            bad += same_at(a, &s, lo, path) < 0;
            if (hi != UINT64_MAX) bad += same_at(a, &s, hi - 1, path) < 0;
            compared++;
        }
    for (uint32_t i = 0; i < s.nfunc; i++) { /* the server's entries */
        const uint8_t *f = s.funcs + (size_t)i * FUNC_BYTES;
        uint64_t lo = cp_ld64(f), hi = cp_ld64(f + 8);
        bad += same_at(a, &s, lo, path) < 0;
        if (hi != UINT64_MAX) bad += same_at(a, &s, hi - 1, path) < 0;
        compared++;
    }
    fprintf(stderr, "%s: %u functions, %u stubs, %u server entries, %u disagree\n", path,
            cp_elfnames_count(a), cp_elfnames_plt_count(a), s.nfunc, bad);
    CHECK_EQ(bad, 0);
    cp_buf_close(&tab);
    cp_buf_close(&bytes);
    cp_elfnames_destroy(a);
    return compared;
}

/* The profiled test program (.symtab, PLT stubs) and this test; the program's stripped copy
 * (no function in its .dynsym) is refused by both. */
TEST(test_programs_named_alike)
{
    CHECK(compare(SYMPROG) > 3);
    cp_elfnames *a = NULL;
    CHECK_EQ(cp_elfnames_create(SYMPROG_STRIPPED, NULL, 0, NULL, &a), CP_ENOTFOUND);
    cp_buf bytes = {0}, tab = {0};
    CHECK_EQ(cp_read_file(SYMPROG_STRIPPED, &bytes, NULL), 0);
    char id[CP_BUILD_ID_HEX_MAX + 1];
    cp_err err = {0};
    CHECK_EQ(cp_symtab_build(bytes.data, bytes.len, (size_t)1 << 30, &tab, id, &err), CP_EPARSE);
    CHECK(strstr(err.msg, "no function symbols") != NULL);
    cp_buf_close(&bytes);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n] = 0;
    CHECK(compare(self) > 100);
}

static int find_libc(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    if (strstr(info->dlpi_name, "/libc.so.6")) {
        snprintf(arg, 4096, "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

/* libc (its .dynsym, versioned names, aliases at one address, .plt.sec stubs) and its
 * detached debug file (.symtab with locals, NOBITS stubs), as Debian's libc6-dbg ships it. */
TEST(libc_and_its_debug_file_named_alike)
{
    char libc[4096] = "";
    dl_iterate_phdr(find_libc, libc);
    CHECK(libc[0]);
    CHECK(compare(libc) > 1000);
    cp_buf bytes = {0}, tab = {0};
    CHECK_EQ(cp_read_file(libc, &bytes, NULL), 0);
    char id[CP_BUILD_ID_HEX_MAX + 1];
    cp_err err = {0};
    CHECK_EQ(cp_symtab_build(bytes.data, bytes.len, (size_t)1 << 30, &tab, id, &err), 0);
    cp_buf_close(&tab);
    cp_buf_close(&bytes);
    char debug[300];
    snprintf(debug, sizeof debug, "/usr/lib/debug/.build-id/%.2s/%s.debug", id, id + 2);
    struct stat st;
    if (stat(debug, &st) != 0) fprintf(stderr, "%s missing: install libc6-dbg\n", debug);
    CHECK(stat(debug, &st) == 0);
    CHECK(compare(debug) > 1000);
}

TEST_MAIN(T(test_programs_named_alike), T(libc_and_its_debug_file_named_alike))
