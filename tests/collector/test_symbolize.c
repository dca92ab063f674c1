/* Symbolization in the agent (issue 24): function names from ELF symbol tables without
 * libdw (.symtab, .dynsym of a stripped program, libc's separate debug file under
 * /usr/lib/debug), the contprof-agent isolate with the agent's own CPU, the per-window
 * symbolization budget; and elfnames.c on truncated and damaged files. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "elfnames.h"
#include "error.h"
#include "pprof.h"
#include "profile.h"
#include "proc.h"
#include "test.h"
#include "pfiles.h"

static char g_dir[300], g_env_dir[300];

static void make_dir(void)
{
    pset_dir_make("sym", g_dir, g_env_dir);
}

static void remove_dir(void)
{
    pset_dir_remove(g_dir);
}

#define PRELOAD "LD_PRELOAD=" CP_LIB

/* Runs prog mode secs under the agent with env extra (NULL-terminated, may be NULL) and
 * loads the profiles into s. Returns the program's output. */
static const char *run_sym(const char *prog, const char *mode, const char *secs,
                           const char *const *extra, pset *s)
{
    static char out[4096];
    make_dir();
    const char *env[16] = {PRELOAD, g_env_dir, "CONTPROF_WINDOW=1s"};
    int n = 3;
    for (int i = 0; extra && extra[i] && n < 15; i++)
        env[n++] = extra[i];
    env[n] = NULL;
    const char *args[] = {mode, secs, NULL};
    int st = run_capture(prog, args, NULL, env, out, sizeof(out));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pset_load(g_dir, s);
    CHECK(s->n > 0);
    return out;
}

/* CPU of isolate iso's samples with a frame named fn. */
static int64_t cpu_of(const pset *s, const char *iso, const char *fn)
{
    return sum_kind(s, "cpu", iso, fn, 1);
}

/* CPU of all of isolate iso's samples. */
static int64_t cpu_all(const pset *s, const char *iso)
{
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->f[i].kind, "cpu") || strcmp(s->f[i].iso, iso)) continue;
        const cp_profile *p = s->f[i].p;
        for (uint32_t j = 0; j < p->samples.n; j++)
            sum += cp_profile_sample_values(p, j)[1];
    }
    return sum;
}

/* Whether function fn is under most of isolate iso's CPU (the burn loops are the programs'
 * work; the amount of CPU depends on the machine's load, the share does not). */
static int most_cpu_in(const pset *s, const char *iso, const char *fn)
{
    int64_t in = cpu_of(s, iso, fn), all = cpu_all(s, iso);
    printf("%s: %lld of %lld ns\n", fn, (long long)in, (long long)all);
    return all > 0 && in * 10 > all * 8;
}

/* Functions named in cpu profiles of iso whose name contains sub. */
static int names_containing(const pset *s, const char *iso, const char *sub)
{
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->f[i].kind, "cpu") || strcmp(s->f[i].iso, iso)) continue;
        const cp_profile *p = s->f[i].p;
        for (uint32_t j = 0; j < p->functions.n; j++)
            n += strstr(cp_profile_str(p, p->functions.v[j].name), sub) != NULL;
    }
    return n;
}

static long long comment_num(const cp_profile *p, const char *name)
{
    char key[64];
    snprintf(key, sizeof(key), "%s=", name);
    for (uint32_t i = 0; i < p->comments.n; i++) {
        const char *c = strstr(cp_profile_str(p, p->comments.v[i]), key);
        if (c) return atoll(c + strlen(key));
    }
    return -1;
}

/* ------------------------------------------------------------------------------------
 * Names without libdw */

/* A static function is only in .symtab: named by default, and libdw never mapped (the
 * program checks its own maps after two windows). */
TEST(names_from_symtab)
{
    pset s;
    const char *out = run_sym(CPSYM, "local", "2.5", NULL, &s);
    printf("%s", out);
    CHECK(most_cpu_in(&s, "cpsym", "symwork_local_burn"));
    CHECK_STREQ(out, "libdw=0\n");
    pset_free(&s);
    remove_dir();
}

/* A stripped program (no .symtab) still names its exported functions from .dynsym. */
TEST(stripped_names_from_dynsym)
{
    pset s;
    const char *out = run_sym(CPSYM_STRIPPED, "exported", "2.5", NULL, &s);
    printf("%s", out);
    CHECK(most_cpu_in(&s, "cpsym_stripped", "symwork_exported_burn"));
    CHECK_STREQ(out, "libdw=0\n");
    pset_free(&s);
    remove_dir();
}

/* libc's own functions (msort_with_tmp is in no .dynsym) are named from libc6-dbg's
 * separate debug file by default. */
TEST(libc_internals_from_debug_file)
{
    pset s;
    run_sym(CPSYM, "qsort", "2", NULL, &s);
    int msort = names_containing(&s, "cpsym", "msort_with_tmp");
    printf("msort_with_tmp functions %d\n", msort);
    CHECK(msort > 0);
    CHECK(most_cpu_in(&s, "cpsym", "qsort_r"));
    pset_free(&s);
    remove_dir();
}

/* CONTPROF_DEBUGINFO=0: no separate debug file, libc's internals stay addresses. */
TEST(debuginfo_off_leaves_libc_internals)
{
    pset s;
    const char *extra[] = {"CONTPROF_DEBUGINFO=0", NULL};
    run_sym(CPSYM, "qsort", "1", extra, &s);
    CHECK_EQ(names_containing(&s, "cpsym", "msort_with_tmp"), 0);
    CHECK(cpu_of(&s, "cpsym", "qsort_r") > 0); /* exported: from .dynsym */
    pset_free(&s);
    remove_dir();
}

/* C++ and Rust (v0 and legacy) symbols are demangled by the agent with libiberty, in a C
 * program (no C++ runtime, so no __cxa_demangle in the process). */
TEST(cxx_and_rust_names_demangled)
{
    pset s;
    run_sym(CPSYM, "mangled", "2.5", NULL, &s);
    int64_t cxx = cpu_of(&s, "cpsym", "foo::bar()"), v0 = cpu_of(&s, "cpsym", "mycrate::main"),
            legacy = cpu_of(&s, "cpsym", "mycrate::legacy");
    printf("foo::bar() %lld, mycrate::main %lld, mycrate::legacy %lld ns\n", (long long)cxx,
           (long long)v0, (long long)legacy);
    CHECK(cxx > 0);
    CHECK(v0 > 0);
    CHECK(legacy > 0);
    CHECK_EQ(names_containing(&s, "cpsym", "_ZN"), 0);
    CHECK_EQ(names_containing(&s, "cpsym", "_RNv"), 0);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * The agent's own CPU */

TEST(agent_isolate_cpu)
{
    pset s;
    run_sym(CPSYM, "local", "2.5", NULL, &s);
    int windows = 0;
    int64_t total = 0;
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.f[i].iso, "contprof-agent")) continue;
        CHECK_STREQ(s.f[i].kind, "cpu"); /* cpu only */
        windows++;
        const cp_profile *p = s.f[i].p;
        for (uint32_t j = 0; j < p->samples.n; j++)
            total += cp_profile_sample_values(p, j)[1];
    }
    int64_t sym = cpu_of(&s, "contprof-agent", "contprof:symbolize");
    int64_t build = cpu_of(&s, "contprof-agent", "contprof:build");
    int64_t root = cpu_of(&s, "contprof-agent", "contprof");
    printf("%d windows of contprof-agent: %lld ns (symbolize %lld, build %lld)\n", windows,
           (long long)total, (long long)sym, (long long)build);
    CHECK(windows >= 3); /* one a window: two windows of 1 s, and the last at exit */
    CHECK(total > 0);
    CHECK(sym > 0);
    CHECK(build > 0);
    CHECK_EQ(root, total); /* every pseudo-frame is under the root "contprof" */
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * The budget */

TEST(budget_counted_when_spent)
{
    pset s;
    const char *extra[] = {"CONTPROF_SYMBOLIZE_BUDGET=1ns", NULL};
    run_sym(CPSYM, "local", "2.5", extra, &s);
    long long over = 0;
    for (int i = 0; i < s.n; i++) {
        long long c = comment_num(s.f[i].p, "unsymbolized_over_budget");
        if (c > over) over = c;
    }
    printf("unsymbolized_over_budget up to %lld\n", over);
    CHECK(over > 0);
    /* the pcs over the budget are addresses in their mapping, with no function */
    int unnamed = 0;
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.f[i].kind, "cpu") || strcmp(s.f[i].iso, "cpsym")) continue;
        const cp_profile *p = s.f[i].p;
        for (uint32_t j = 0; j < p->locations.n; j++)
            unnamed += p->locations.v[j].mapping_id && !p->locations.v[j].nlines;
    }
    printf("%d locations unnamed\n", unnamed);
    CHECK(unnamed > 0);
    pset_free(&s);
    remove_dir();
}

TEST(budget_default_not_hit)
{
    pset s;
    run_sym(CPSYM, "local", "1.5", NULL, &s);
    for (int i = 0; i < s.n; i++)
        CHECK_EQ(comment_num(s.f[i].p, "unsymbolized_over_budget"), -1);
    pset_free(&s);
    remove_dir();
}

/* ------------------------------------------------------------------------------------
 * elfnames.c on files: a good one, then every truncation and damaged headers */

static void copy_prefix(const char *from, const char *to, size_t len, long flip_at)
{
    FILE *f = fopen(from, "rb");
    CHECK(f != NULL);
    char *buf = malloc(len ? len : 1);
    CHECK(buf != NULL);
    size_t n = fread(buf, 1, len, f);
    fclose(f);
    if (flip_at >= 0 && (size_t)flip_at < n) buf[flip_at] ^= 0x5a;
    FILE *o = fopen(to, "wb");
    CHECK(o != NULL);
    CHECK(fwrite(buf, 1, n, o) == n);
    fclose(o);
    free(buf);
}

TEST(elfnames_files)
{
    cp_elfnames *t = NULL;
    CHECK_EQ(cp_elfnames_create(CPSYM, NULL, 0, NULL, &t), 0);
    CHECK_EQ(cp_elfnames_source(t), CP_ELFNAMES_SYMTAB);
    CHECK(cp_elfnames_count(t) > 3);
    size_t len = 0;
    CHECK(cp_elfnames_lookup(t, 0, &len) == NULL);
    cp_elfnames_destroy(t);
    CHECK_EQ(cp_elfnames_create(CPSYM_STRIPPED, NULL, 0, NULL, &t), 0);
    CHECK_EQ(cp_elfnames_source(t), CP_ELFNAMES_DYNSYM);
    cp_elfnames_destroy(t);
    CHECK(cp_elfnames_create("/nonexistent/x", NULL, 0, NULL, &t) != 0 && !t);
    CHECK(cp_elfnames_create("/proc/self/maps", NULL, 0, NULL, &t) != 0 && !t);
    CHECK(cp_elfnames_create("/dev/null", NULL, 0, NULL, &t) != 0 && !t);

    /* every prefix length near the headers and section tables, and a sample of the rest;
     * then single bytes flipped: never a crash, a table or an error */
    struct stat st;
    CHECK(stat(CPSYM, &st) == 0);
    size_t size = (size_t)st.st_size;
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "/tmp/contprof-elfnames-%d", (int)getpid());
    int tables = 0, errors = 0;
    for (size_t len = 0; len <= size; len += len < 256 ? 1 : len > size - 4096 ? 7 : 997) {
        copy_prefix(CPSYM, tmp, len, -1);
        int rc = cp_elfnames_create(tmp, NULL, 0, NULL, &t);
        if (rc == 0) {
            tables++;
            cp_elfnames_destroy(t);
        } else {
            errors++;
            CHECK(t == NULL);
        }
    }
    for (long at = 0; at < (long)size; at += at < 128 ? 1 : 509) {
        copy_prefix(CPSYM, tmp, size, at);
        if (cp_elfnames_create(tmp, NULL, 0, NULL, &t) == 0) {
            size_t len = 0;
            const char *nm = cp_elfnames_lookup(t, 0x1000, &len);
            CHECK(!nm || strlen(nm) >= len);
            cp_elfnames_destroy(t);
        }
    }
    unlink(tmp);
    printf("truncated copies: %d tables, %d errors\n", tables, errors);
    CHECK(errors > 0);
}

/* The PLT stubs of path as objdump names them ("qsort@plt" at its address), into addrs and
 * names (at most cap); PLT0 ("qsort@plt-0x10") left out. Returns how many. */
static int objdump_plt(const char *path, uint64_t *addrs, char (*names)[128], int cap)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "objdump -d -j .plt -j .plt.sec -j .plt.got %s 2>/dev/null", path);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof(line), p)) {
        unsigned long long a;
        char nm[128];
        if (sscanf(line, "%llx <%127[^>]>:", &a, nm) != 2) continue;
        if (!strstr(nm, "@plt") || strchr(nm, '-') || strchr(nm, '+') || n >= cap) continue;
        addrs[n] = a;
        snprintf(names[n++], 128, "%s", nm);
    }
    pclose(p);
    return n;
}

/* A pc in a PLT stub is the stub `func@plt` (binutils' name, from the stub's GOT slot and its
 * relocation), never `_init`, the sizeless symbol before .plt that used to reach over every
 * stub (~3% of a Python profile); by table and by scan alike. cpsym (with .symtab, _init
 * local), cpsym_stripped (.dynsym), python3 (Debian's, stripped; when installed). */
static void check_plt(const char *path)
{
    static uint64_t addrs[8192], pcs[8192];
    static char names[8192][128];
    static char *scanned[8192];
    int n = objdump_plt(path, addrs, names, 8192);
    printf("%s: %d stubs\n", path, n);
    CHECK(n > 0);
    cp_elfnames *t = NULL;
    CHECK_EQ(cp_elfnames_create(path, NULL, 0, NULL, &t), 0);
    int same = 0;
    for (int i = 0; i < n; i++) {
        pcs[i] = addrs[i] + 3; /* inside the stub */
        size_t len = 0;
        const char *nm = cp_elfnames_lookup(t, pcs[i], &len);
        CHECK(nm != NULL);
        if (i < 3 || strncmp(nm, names[i], len) != 0 || len != strlen(names[i]))
            printf("  %#llx: objdump %s, ours %.*s\n", (unsigned long long)pcs[i], names[i],
                   (int)len, nm);
        CHECK(strncmp(nm, "_init", len) != 0);
        same += len == strlen(names[i]) && !strncmp(nm, names[i], len);
    }
    cp_elfnames_destroy(t);
    printf("  %d of %d as objdump names them\n", same, n);
    CHECK_EQ(same, n);
    CHECK_EQ(cp_elfnames_scan(path, NULL, 0, NULL, pcs, (uint32_t)n, scanned, NULL), 0);
    for (int i = 0; i < n; i++) {
        CHECK(scanned[i] != NULL);
        CHECK_STREQ(scanned[i], names[i]);
        free(scanned[i]);
    }
}

TEST(plt_stubs_named)
{
    check_plt(CPSYM);
    check_plt(CPSYM_STRIPPED);
    /* Debian's: python3 (494 stubs), and libraries with .plt.got (GLOB_DAT slots) */
    const char *debian[] = {"/usr/bin/python3.11", "/usr/lib/x86_64-linux-gnu/libz.so.1",
                            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"};
    for (size_t i = 0; i < sizeof(debian) / sizeof(debian[0]); i++)
        if (access(debian[i], R_OK) == 0) check_plt(debian[i]);
}

/* A copy of cpsym whose .plt claims 2^62 bytes at an address near the top: the table is
 * built at once (one "[plt]" over the section, no loop over its entries), never a fault. */
TEST(plt_hostile_size)
{
    FILE *f = fopen(CPSYM, "rb");
    CHECK(f);
    static uint8_t b[1 << 20];
    size_t n = fread(b, 1, sizeof(b), f);
    fclose(f);
    CHECK(n > 64 && n < sizeof(b));
    uint64_t shoff;
    uint16_t shnum, shstrndx;
    memcpy(&shoff, b + 0x28, 8);
    memcpy(&shnum, b + 0x3c, 2);
    memcpy(&shstrndx, b + 0x3e, 2);
    CHECK(shoff + (uint64_t)shnum * 64 <= n);
    uint64_t stroff;
    memcpy(&stroff, b + shoff + (uint64_t)shstrndx * 64 + 0x18, 8);
    int patched = 0;
    for (int i = 0; i < shnum; i++) {
        uint8_t *h = b + shoff + (uint64_t)i * 64;
        uint32_t nm;
        memcpy(&nm, h, 4);
        if (strcmp((const char *)b + stroff + nm, ".plt") != 0) continue;
        for (int variant = 0; variant < 2; variant++) {
            uint64_t size = (uint64_t)1 << 62, addr = variant ? ~(uint64_t)0 - 4096 : 0x1020;
            memcpy(h + 0x20, &size, 8);
            memcpy(h + 0x10, &addr, 8);
            char tmp[256];
            snprintf(tmp, sizeof(tmp), "/tmp/contprof-plt-%d", (int)getpid());
            FILE *o = fopen(tmp, "wb");
            CHECK(o && fwrite(b, 1, n, o) == n);
            fclose(o);
            cp_elfnames *t = NULL;
            CHECK_EQ(cp_elfnames_create(tmp, NULL, 0, NULL, &t), 0);
            size_t len = 0;
            const char *nm2 = cp_elfnames_lookup(t, 0x1033, &len);
            printf("variant %d: 0x1033 is %.*s\n", variant, nm2 ? (int)len : 6,
                   nm2 ? nm2 : "(none)");
            cp_elfnames_destroy(t);
            char *names[1] = {NULL};
            uint64_t va[1] = {0x1033};
            CHECK_EQ(cp_elfnames_scan(tmp, NULL, 0, NULL, va, 1, names, NULL), 0);
            free(names[0]);
            unlink(tmp);
            patched++;
        }
    }
    CHECK_EQ(patched, 2);
}

TEST_MAIN(T(plt_stubs_named), T(plt_hostile_size), T(names_from_symtab),
          T(stripped_names_from_dynsym), T(libc_internals_from_debug_file),
          T(debuginfo_off_leaves_libc_internals), T(cxx_and_rust_names_demangled),
          T(agent_isolate_cpu), T(budget_counted_when_spent), T(budget_default_not_hit),
          T(elfnames_files))
