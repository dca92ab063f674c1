/* Python frames (issue 38): real CPython 3.11 programs under the agent, black-box through
 * its pprof files. Debian's /usr/bin/python3 (the interpreter inside the executable) always;
 * pyenv's 3.11 (through libpython3.11.so) where the machine has it. And the parsers of
 * interpreter data (location table, str objects) on hand-made bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pfiles.h"
#include "pprof.h"
#include "proc.h"
#include "profile.h"
#include "python.h"
#include "test.h"

#define DEBIAN_PY "/usr/bin/python3"
#define PYENV_PY "/root/.pyenv/versions/3.11.7/bin/python3"

static char g_dir[300], g_env_dir[300];

/* Runs py on script (tests/collector/py/) with args under the agent at hz, the profiles
 * into s; returns the program's output. */
static const char *run_py(const char *py, const char *script, const char *arg, const char *hz,
                          pset *s)
{
    static char out[1 << 16];
    pset_dir_make("py", g_dir, g_env_dir);
    char path[512], hzv[64];
    snprintf(path, sizeof(path), "%s/tests/collector/py/%s", getenv("CP_SOURCE_DIR"), script);
    snprintf(hzv, sizeof(hzv), "CONTPROF_CPU_HZ=%s", hz);
    const char *env[] = {"LD_PRELOAD=" CP_LIB, g_env_dir, "CONTPROF_WINDOW=1s", hzv,
                         "PATH=/usr/bin:/bin", NULL};
    const char *args[] = {path, arg, NULL};
    int st = run_capture(py, args, NULL, env, out, sizeof(out));
    printf("%s", out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pset_load(g_dir, s);
    CHECK(s->n > 0);
    return out;
}

static int is_prog_cpu(const pfile *f)
{
    return !strcmp(f->kind, "cpu") && strcmp(f->iso, "contprof-agent") != 0;
}

/* CPU (ns) of the program's samples with function fn. */
static int64_t cpu_with(const pset *s, const char *fn)
{
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++)
        if (is_prog_cpu(&s->f[i])) sum += func_total(s->f[i].p, fn, 1);
    return sum;
}

/* CPU of the program's samples with function fn in isolates whose name starts with iso
 * (NULL: any). */
static int64_t cpu_in(const pset *s, const char *fn, const char *iso)
{
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++)
        if (is_prog_cpu(&s->f[i]) && (!iso || !strncmp(s->f[i].iso, iso, strlen(iso))))
            sum += func_total(s->f[i].p, fn, 1);
    return sum;
}

static int64_t cpu_all(const pset *s)
{
    return cpu_with(s, NULL);
}

/* The file and line of function fn's first location seen, or 0. */
static int64_t line_of(const pset *s, const char *fn, const char **file)
{
    for (int i = 0; i < s->n; i++) {
        const cp_profile *p = s->f[i].p;
        for (uint32_t j = 0; j < p->locations.n; j++) {
            const cp_location *l = &p->locations.v[j];
            if (!l->nlines) continue;
            const cp_line *ln = &p->lines.v[l->line_off];
            const cp_function *f = &p->functions.v[ln->function_id - 1];
            if (ln->function_id && !strcmp(cp_profile_str(p, f->name), fn)) {
                *file = cp_profile_str(p, f->filename);
                return ln->line;
            }
        }
    }
    return 0;
}

/* CPU of samples where a frame whose function contains inner is leafward of a frame of
 * function outer (exactly), with (need_native) a native frame (one with a mapping)
 * between them. */
static int64_t cpu_under(const pset *s, const char *inner, const char *outer, int need_native)
{
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++) {
        if (!is_prog_cpu(&s->f[i])) continue;
        const cp_profile *p = s->f[i].p;
        for (uint32_t j = 0; j < p->samples.n; j++) {
            const cp_sample *sm = &p->samples.v[j];
            int seen_inner = 0, native = 0;
            for (uint32_t k = 0; k < sm->nlocs; k++) {
                uint32_t loc = p->stack.v[sm->loc_off + k];
                if (strstr(loc_func(p, loc), inner)) {
                    seen_inner = 1;
                    native = 0;
                } else if (seen_inner && !strcmp(loc_func(p, loc), outer)) {
                    if (!need_native || native) sum += cp_profile_sample_values(p, j)[1];
                    break;
                } else if (p->locations.v[loc - 1].mapping_id) {
                    native = 1;
                }
            }
        }
    }
    return sum;
}

/* The Python counters of the last cpu profile's comments ("python_samples=N ..."). */
static int64_t comment_value(const pset *s, const char *key)
{
    int64_t v = -1;
    for (int i = 0; i < s->n; i++) {
        const cp_profile *p = s->f[i].p;
        for (uint32_t c = 0; c < p->comments.n; c++) {
            const char *t = strstr(cp_profile_str(p, p->comments.v[c]), key);
            if (t && t[strlen(key)] == '=') v = strtoll(t + strlen(key) + 1, NULL, 10);
        }
    }
    return v;
}

static int has_engine(const pset *s, const char *needle)
{
    for (int i = 0; i < s->n; i++) {
        const cp_profile *p = s->f[i].p;
        for (uint32_t c = 0; c < p->comments.n; c++) {
            const char *t = cp_profile_str(p, p->comments.v[c]);
            if (!strncmp(t, "engine=", 7) && strstr(t, needle)) return 1;
        }
    }
    return 0;
}

static int have(const char *py)
{
    if (access(py, X_OK) == 0) return 1;
    printf("skipped: %s is absent\n", py);
    return 0;
}

/* ------------------------------------------------------------------------------------
 * A 3:1 program */

static void ratio_case(const char *py)
{
    pset s;
    run_py(py, "ratio.py", "4", "1000", &s); /* ~4,000 samples: 3.0 ± 0.1 */
    int64_t three = cpu_with(&s, "three"), one = cpu_with(&s, "one"), all = cpu_all(&s);
    const char *file = "";
    int64_t line = line_of(&s, "spin", &file);
    printf("three %lld one %lld all %lld ratio %.3f; spin at %s:%lld\n", (long long)three,
           (long long)one, (long long)all, one ? (double)three / (double)one : 0.0, file,
           (long long)line);
    CHECK(has_engine(&s, "; python=3.11"));
    CHECK(one > 0);
    CHECK((double)three / (double)one >= 2.7 && (double)three / (double)one <= 3.3);
    CHECK((three + one) * 10 >= all * 9); /* nearly all the CPU is under them */
    CHECK(strstr(file, "ratio.py") != NULL);
    CHECK(line >= 8 && line <= 12); /* spin's body: the executing line, not the def */
    CHECK(cpu_with(&s, "<module>") * 10 >= all * 9);
    CHECK(comment_value(&s, "python_samples") > 0);
    pset_free(&s);
    pset_dir_remove(g_dir);
}

TEST(ratio_debian)
{
    ratio_case(DEBIAN_PY);
}

TEST(ratio_libpython)
{
    if (have(PYENV_PY)) ratio_case(PYENV_PY);
}

/* ------------------------------------------------------------------------------------
 * C under Python, Python under C */

static void calls_case(const char *py)
{
    pset s;
    run_py(py, "calls.py", "3", "100", &s);
    int64_t all = cpu_all(&s), comp = cpu_with(&s, "compress_many"),
            sortm = cpu_with(&s, "sort_many");
    /* libz's deflate under the Python function that called zlib.compress, through the
     * zlib module's C */
    int64_t defl = cpu_under(&s, "deflate", "compress_many", 1);
    /* the key function under list.sort's C under sort_many */
    int64_t key = cpu_under(&s, "sort_key", "sort_many", 1);
    printf("all %lld compress_many %lld (deflate under it %lld) sort_many %lld (sort_key "
           "under it %lld)\n",
           (long long)all, (long long)comp, (long long)defl, (long long)sortm, (long long)key);
    CHECK(comp > all / 10);
    CHECK(defl * 2 > comp);
    CHECK(key > 0);
    CHECK(sortm > all / 20);
    pset_free(&s);
    pset_dir_remove(g_dir);
}

TEST(calls_debian)
{
    calls_case(DEBIAN_PY);
}

TEST(calls_libpython)
{
    if (have(PYENV_PY)) calls_case(PYENV_PY);
}

/* ------------------------------------------------------------------------------------
 * A thread pool: each worker thread's Python stack */

static void pool_case(const char *py)
{
    pset s;
    run_py(py, "pool.py", "1", "100", &s);
    int64_t all = cpu_all(&s), a = cpu_with(&s, "work_a"), b = cpu_with(&s, "work_b"),
            c = cpu_with(&s, "work_c"), w = cpu_with(&s, "_worker");
    printf("all %lld work_a %lld work_b %lld work_c %lld _worker %lld\n", (long long)all,
           (long long)a, (long long)b, (long long)c, (long long)w);
    /* each worker burns 1 s of its own CPU: a fifth of the whole at least, each */
    CHECK(a * 5 > all && b * 5 > all && c * 5 > all);
    /* under the pool's worker loop (concurrent/futures/thread.py) */
    CHECK(w * 10 >= (a + b + c) * 9);
    pset_free(&s);
    pset_dir_remove(g_dir);
}

TEST(pool_debian)
{
    pool_case(DEBIAN_PY);
}

/* ------------------------------------------------------------------------------------
 * A sub-interpreter: its own isolate, labelled by its id */

TEST(subinterpreter_debian)
{
    pset s;
    const char *out = run_py(DEBIAN_PY, "subinterp.py", "2", "200", &s);
    CHECK_CONTAINS(out, "done");
    int64_t all = cpu_all(&s), main_ = cpu_with(&s, "fnMain"), sub = cpu_with(&s, "fnSub"),
            sub_iso = cpu_in(&s, "fnSub", "python-interp-"),
            main_iso = cpu_in(&s, "fnMain", "python-interp-"),
            sub_spin = cpu_under(&s, "spin", "fnSub", 0),
            sub_caller = cpu_under(&s, "fnSub", "in_sub", 1),
            sub_deflate = cpu_under(&s, "deflate", "fnSub", 1);
    printf("all %lld fnMain %lld (in a sub-interpreter's isolate %lld) fnSub %lld (in one %lld; "
           "spin under it %lld, deflate %lld; under in_sub %lld)\n",
           (long long)all, (long long)main_, (long long)main_iso, (long long)sub,
           (long long)sub_iso, (long long)sub_spin, (long long)sub_deflate, (long long)sub_caller);
    for (int i = 0; i < s.n; i++)
        if (is_prog_cpu(&s.f[i]))
            printf("  isolate %s: fnMain %lld fnSub %lld\n", s.f[i].iso,
                   (long long)func_total(s.f[i].p, "fnMain", 1),
                   (long long)func_total(s.f[i].p, "fnSub", 1));
    /* both functions, each a good part of the CPU (the GIL is shared: ~2 s between them) */
    CHECK(main_ * 10 > all && sub * 10 > all);
    /* fnSub only in the sub-interpreter's isolate, fnMain never there */
    CHECK(sub_iso == sub);
    CHECK(main_iso == 0);
    /* the sub-interpreter's own Python frames (its module's spin under fnSub; libz's
     * deflate, run without the GIL, under it too), and under them the main interpreter's
     * frames that called run_string, C in between */
    CHECK(sub_spin > 0 && sub_deflate > 0);
    CHECK((sub_spin + sub_deflate) * 10 >= sub * 9);
    CHECK(sub_caller * 10 >= sub * 9);
    pset_free(&s);
    pset_dir_remove(g_dir);
}

/* ------------------------------------------------------------------------------------
 * Allocation stacks: the allocation path walks the same frames */

TEST(alloc_debian)
{
    pset s;
    /* 4 s, not 2: allocation stacks are named when their window is built, here at exit
     * after the interpreter freed its code, so a frame no CPU drain named before reads
     * [python] (collector/README.md, "Limits"): under load more do (a CI run beside other
     * jobs read make_buffers for 59.7% at 2 s); a longer run gives the drains more time */
    run_py(DEBIAN_PY, "alloc.py", "4", "100", &s);
    int64_t all = sum_kind(&s, "alloc", NULL, NULL, 1),
            bufs = sum_kind(&s, "alloc", NULL, "make_buffers", 1),
            small = sum_kind(&s, "alloc", NULL, "small_objects", 1),
            mod = sum_kind(&s, "alloc", NULL, "<module>", 1);
    printf("alloc bytes %lld: make_buffers %lld small_objects %lld <module> %lld\n", (long long)all,
           (long long)bufs, (long long)small, (long long)mod);
    /* the 64 KiB buffers reach malloc, under the function that made them; small_objects'
     * tuples do not (pymalloc), its list's growing array does */
    CHECK(all > 0);
    CHECK(bufs * 10 >= all * 6);
    CHECK(bufs > small * 2);
    CHECK(mod * 10 >= all * 6); /* the rest: the interpreter starting, imports */
    pset_free(&s);
    pset_dir_remove(g_dir);
}

/* ------------------------------------------------------------------------------------
 * Frames rewritten under a 1 kHz sampler: no crash, no hang */

static void hostile_case(const char *py)
{
    pset s;
    const char *out = run_py(py, "hostile.py", "3", "1000", &s);
    CHECK_CONTAINS(out, "done");
    int64_t all = cpu_all(&s);
    printf("all %lld gens %lld fan %lld recurse %lld exceptions %lld; python_samples %lld "
           "truncated %lld torn %lld unresolved %lld\n",
           (long long)all, (long long)cpu_with(&s, "gens"), (long long)cpu_with(&s, "fan"),
           (long long)cpu_with(&s, "recurse"), (long long)cpu_with(&s, "exceptions"),
           (long long)comment_value(&s, "python_samples"),
           (long long)comment_value(&s, "python_truncated"),
           (long long)comment_value(&s, "python_torn"),
           (long long)comment_value(&s, "python_unresolved"));
    /* recursion to the limit: a sample deeper than the walk keeps its innermost frames
     * (deep), so under load recurse itself may be in none */
    CHECK(cpu_with(&s, "gens") > 0 && (cpu_with(&s, "recurse") > 0 || cpu_with(&s, "deep") > 0));
    CHECK(cpu_with(&s, "genexpr") > 0 || cpu_with(&s, "gen") > 0);
    /* the sub-interpreters made and destroyed meanwhile were sampled in their own
     * isolates (the first 64 of them; their frames mostly "[python]": their code died with
     * them before the agent's tick) */
    int64_t sub = cpu_in(&s, NULL, "python-interp-");
    printf("in sub-interpreters' isolates %lld (subwork named in them %lld)\n", (long long)sub,
           (long long)cpu_in(&s, "subwork", "python-interp-"));
    CHECK(sub > 0);
    /* more than the table's 64 made one after the other: the isolates of those gone are
     * ended and their places taken by new ones */
    const char *m = strstr(out, "last id ");
    CHECK(m != NULL);
    long last = strtol(m + 8, NULL, 10), top = 0;
    for (int i = 0; i < s.n; i++)
        if (!strncmp(s.f[i].iso, "python-interp-", 14) && atol(s.f[i].iso + 14) > top)
            top = atol(s.f[i].iso + 14);
    printf("last sub-interpreter %ld, highest labelled %ld\n", last, top);
    CHECK(last <= 70 || top > 64);
    CHECK(comment_value(&s, "python_samples") > 0);
    /* recursion to the limit is deeper than a sample holds: counted */
    CHECK(comment_value(&s, "python_truncated") > 0);
    pset_free(&s);
    pset_dir_remove(g_dir);
}

TEST(hostile_debian)
{
    hostile_case(DEBIAN_PY);
}

TEST(hostile_libpython)
{
    if (have(PYENV_PY)) hostile_case(PYENV_PY);
}

/* ------------------------------------------------------------------------------------
 * CPython's own test suite with Python frames walked at 1 kHz: the same outcomes */

TEST(python_suite_frames)
{
    if (access("/usr/lib/python3.11/test/test_json/__init__.py", R_OK) != 0) {
        fprintf(stderr, "CPython's test suite is missing: sh .ci/deps installs "
                        "libpython3.11-testsuite\n");
        CHECK(0);
    }
    pset_dir_make("pysuite", g_dir, g_env_dir);
    char script[512];
    snprintf(script, sizeof script, "%s/tests/collector/pysuite.py", getenv("CP_SOURCE_DIR"));
    const char *args[] = {script, CP_LIB, g_dir, "CONTPROF_CPU_HZ=1000", NULL};
    /* a quarter of the suite: test_malloc_hosts.python_suite_rate_1 runs all of it with
     * every allocation's Python stack walked and 1 kHz CPU sampling too */
    const char *env[] = {"PYSUITE_MODULES=test_json test_re test_string test_dict test_set "
                         "test_struct test_zlib test_pickle test_csv test_enum test_typing "
                         "test_sort test_codecs test_argparse",
                         NULL};
    static char out[1 << 16];
    int st = run_capture(DEBIAN_PY, args, NULL, env, out, sizeof out);
    printf("%s", out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(out, "\n0 test cases differ");
    pset s;
    char windows[320];
    snprintf(windows, sizeof windows, "%s/windows", g_dir);
    pset_load(windows, &s);
    /* the suite's own functions named: unittest's runner and test methods */
    int64_t all = cpu_all(&s), run = cpu_with(&s, "TestCase.run");
    printf("all %lld under TestCase.run %lld python_samples %lld\n", (long long)all, (long long)run,
           (long long)comment_value(&s, "python_samples"));
    CHECK(run * 2 > all);
    pset_free(&s);
    pset_dir_remove(g_dir);
}

/* ------------------------------------------------------------------------------------
 * A CPython of another version: named once, native frames go on */

TEST(unsupported_version)
{
    pset s;
    pset_dir_make("pyfake", g_dir, g_env_dir);
    static char out[8192];
    const char *env[] = {"LD_PRELOAD=" CP_LIB, g_env_dir, "CONTPROF_WINDOW=1s",
                         "PATH=/usr/bin:/bin", NULL};
    const char *args[] = {"-c", "exec " CP_PYFAKE " 2>&1", NULL};
    int st = run_capture("/bin/sh", args, NULL, env, out, sizeof(out));
    printf("%s", out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(out, "contprof: CPython 3.12 unsupported: only 3.11's frames are read");
    pset_load(g_dir, &s);
    CHECK(has_engine(&s, "; python=3.12 unsupported"));
    CHECK(cpu_with(&s, "main") > 0); /* native frames, as before */
    CHECK(comment_value(&s, "python_samples") == -1);
    pset_free(&s);
    pset_dir_remove(g_dir);
}

/* ------------------------------------------------------------------------------------
 * The parsers, on bytes made by hand */

TEST(linetable_parser)
{
    /* firstlineno 10: 2 units on line 10 (short form, code 0), 3 units one line down
     * (ONE_LINE1: code 11, two column bytes), 1 unit with no location (code 15), 2 units
     * 5 lines down (NO_COLUMNS, code 13, svarint 10), 1 unit 2 lines up (LONG, code 14,
     * svarint -2 = 5, then end line, columns) */
    const uint8_t lt[] = {0x80 | (0 << 3) | 1,
                          0x05,
                          0x80 | (11 << 3) | 2,
                          4,
                          9,
                          0x80 | (15 << 3) | 0,
                          0x80 | (13 << 3) | 1,
                          10,
                          0x80 | (14 << 3) | 0,
                          5,
                          0,
                          1,
                          2};
    CHECK_EQ(cp_py_line_311(lt, sizeof lt, 10, 0), 10);
    CHECK_EQ(cp_py_line_311(lt, sizeof lt, 10, 1), 10);
    CHECK_EQ(cp_py_line_311(lt, sizeof lt, 10, 2), 11);
    CHECK_EQ(cp_py_line_311(lt, sizeof lt, 10, 4), 11);
    CHECK_EQ(cp_py_line_311(lt, sizeof lt, 10, 5), -1);
    CHECK_EQ(cp_py_line_311(lt, sizeof lt, 10, 6), 16);
    CHECK_EQ(cp_py_line_311(lt, sizeof lt, 10, 8), 14);
    CHECK_EQ(cp_py_line_311(lt, sizeof lt, 10, 9), 10); /* past the end: firstlineno */
    CHECK_EQ(cp_py_line_311(lt, 0, 7, 0), 7);
    /* a varint that never ends, a cut entry: no read past the bytes (ASan, fuzz) */
    const uint8_t bad[] = {0x80 | (13 << 3), 0x7f, 0x7f, 0x7f};
    CHECK_EQ(cp_py_line_311(bad, sizeof bad, 3, 5), 3);
}

static const uint8_t *g_str_mem;
static uintptr_t g_str_addr;
static size_t g_str_len;

static int fake_read(uintptr_t addr, void *buf, size_t len)
{
    if (addr < g_str_addr || addr + len > g_str_addr + g_str_len) return -1;
    memcpy(buf, g_str_mem + (addr - g_str_addr), len);
    return 0;
}

TEST(str_parser)
{
    uint8_t obj[128] = {0};
    int64_t len = 5;
    uint32_t state = (1u << 2) | (1u << 5) | (1u << 6); /* kind 1, compact, ascii */
    memcpy(obj + 16, &len, 8);
    memcpy(obj + 32, &state, 4);
    memcpy(obj + 48, "hello", 5);
    g_str_mem = obj, g_str_addr = 0x10000, g_str_len = sizeof obj;
    char out[64];
    CHECK_EQ(cp_py_str_311(obj, 0x10000, fake_read, out, sizeof out), 5);
    CHECK_STREQ(out, "hello");
    /* compact UCS-2 "é€": UTF-8 out */
    state = (2u << 2) | (1u << 5);
    len = 2;
    memcpy(obj + 16, &len, 8);
    memcpy(obj + 32, &state, 4);
    uint16_t u[2] = {0xe9, 0x20ac};
    memcpy(obj + 72, u, 4);
    CHECK_EQ(cp_py_str_311(obj, 0x10000, fake_read, out, sizeof out), 5);
    CHECK_STREQ(out, "\xc3\xa9\xe2\x82\xac");
    /* longer than the memory: refused, not read past */
    len = 1000;
    memcpy(obj + 16, &len, 8);
    CHECK_EQ(cp_py_str_311(obj, 0x10000, fake_read, out, sizeof out), -1);
    /* not compact (a legacy string): refused */
    state = (1u << 2);
    memcpy(obj + 32, &state, 4);
    CHECK_EQ(cp_py_str_311(obj, 0x10000, fake_read, out, sizeof out), -1);
}

TEST_MAIN(T(ratio_debian), T(ratio_libpython), T(calls_debian), T(calls_libpython), T(pool_debian),
          T(subinterpreter_debian), T(alloc_debian), T(hostile_debian), T(hostile_libpython),
          T(python_suite_frames), T(unsupported_version), T(linetable_parser), T(str_parser))
