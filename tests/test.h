/* A tiny test harness: TEST(name) functions, CHECK macros, and a main that runs one named
 * test (ctest starts each test in its own process, so a crash hides nothing) or, with no
 * argument, every test in forked children. Register with cp_add_tests() in CMake. */
#ifndef CP_TEST_H
#define CP_TEST_H

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct cp_test {
    const char *name;
    void (*fn)(void);
} cp_test;

#define TEST(name) static void name(void)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld != %lld)\n", __FILE__,         \
                    __LINE__, #a, #b, a_, b_);                                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_STREQ(a, b)                                                                          \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (strcmp(a_, b_) != 0) {                                                                 \
            fprintf(stderr, "%s:%d: CHECK_STREQ failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__,   \
                    a_, b_);                                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Checks that haystack contains needle (for error messages that must name the problem). */
#define CHECK_CONTAINS(hay, needle)                                                                \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        if (!strstr(h_, n_)) {                                                                     \
            fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, h_,     \
                    n_);                                                                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Reads a child's standard output from fd until EOF into out (NUL-terminated, at most
 * cap - 1 bytes kept; the rest is read and dropped so the child never blocks), closes fd
 * and waits for the child. Returns its wait status, or -1 if waitpid failed. */
static inline int cp_test_collect(int fd, pid_t pid, char *out, size_t cap)
{
    size_t len = 0;
    char sink[4096];
    ssize_t k;
    for (;;) {
        int room = len + 1 < cap;
        k = room ? read(fd, out + len, cap - 1 - len) : read(fd, sink, sizeof sink);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        if (room) len += (size_t)k;
    }
    out[len] = 0;
    close(fd);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return st;
}

static inline int cp_test_main(const cp_test *tests, size_t n, int argc, char **argv)
{
    if (argc > 1) {
        for (size_t i = 0; i < n; i++)
            if (strcmp(tests[i].name, argv[1]) == 0) {
                tests[i].fn();
                printf("ok %s\n", tests[i].name);
                return 0;
            }
        fprintf(stderr, "no test named %s\n", argv[1]);
        return 2;
    }
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            tests[i].fn();
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        printf("%s %s\n", ok ? "ok" : "FAIL", tests[i].name);
        failed += !ok;
    }
    printf("%zu passed, %d failed\n", n - (size_t)failed, failed);
    return failed != 0;
}

#define TEST_MAIN(...)                                                                             \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        static const cp_test tests_[] = {__VA_ARGS__};                                             \
        return cp_test_main(tests_, sizeof tests_ / sizeof tests_[0], argc, argv);                 \
    }
#define T(name)                                                                                    \
    {                                                                                              \
#name, name                                                                                \
    }

#endif
