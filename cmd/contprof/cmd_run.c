/* `contprof run`: translates options into CONTPROF_* variables, asks contprofd for its
 * brokers when given --server, puts libcontprof.so in LD_PRELOAD and execs the program. */
#include "cmd_run.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http_client.h"
#include "times.h"

#ifndef CP_LIBCONTPROF_BUILD
#define CP_LIBCONTPROF_BUILD ""
#endif
#ifndef CP_LIBCONTPROF_INSTALLED
#define CP_LIBCONTPROF_INSTALLED "/usr/local/lib/libcontprof.so.0"
#endif

static int usage_to(FILE *f, int rc)
{
    fprintf(f,
            "usage: contprof run [--server URL | --brokers LIST] [--service S] [--version V]\n"
            "         [--tenant T] [--label k=v]... [--cpu-hz N] [--alloc-rate BYTES]\n"
            "         [--window DURATION] [--output-dir DIR] [--topic T] [--no-children]\n"
            "         [--symbolize agent|server]\n"
            "         [--token T (or CONTPROF_TOKEN): contprofd's bearer token]\n"
            "         -- CMD [ARGS...]\n"
            "  --window D   window length: 500ms, 10s (default), 1m; a bare number is seconds\n\n"
            "examples:\n"
            "  contprof run --server http://127.0.0.1:7070 --service api --version 1.4 -- ./api\n"
            "  contprof run --output-dir /tmp/prof --window 1m -- ./batch-job\n");
    return rc;
}

static int usage(void)
{
    return usage_to(stderr, 2);
}

static const char *lib_path(void)
{
    const char *env = getenv("CONTPROF_LIB");
    if (env && *env) return env;
    if (CP_LIBCONTPROF_BUILD[0] && access(CP_LIBCONTPROF_BUILD, R_OK) == 0)
        return CP_LIBCONTPROF_BUILD;
    return CP_LIBCONTPROF_INSTALLED;
}

int cp_cmd_run(int argc, char **argv)
{
    static const struct {
        const char *opt, *env;
    } simple[] = {
        {"--brokers", "CONTPROF_BROKERS"}, {"--service", "CONTPROF_SERVICE"},
        {"--version", "CONTPROF_VERSION"}, {"--tenant", "CONTPROF_TENANT"},
        {"--cpu-hz", "CONTPROF_CPU_HZ"},   {"--alloc-rate", "CONTPROF_ALLOC_RATE"},
        {"--window", "CONTPROF_WINDOW"},   {"--output-dir", "CONTPROF_OUTPUT_DIR"},
        {"--topic", "CONTPROF_TOPIC"},     {"--token", "CONTPROF_TOKEN"},
    };
    const char *server = NULL;
    char labels[4096] = "";
    const char *old_labels = getenv("CONTPROF_LABELS");
    if (old_labels) snprintf(labels, sizeof(labels), "%s", old_labels);
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-') break;
        if (strcmp(a, "--no-children") == 0) {
            setenv("CONTPROF_CHILDREN", "0", 1);
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return usage_to(stdout, 0);
        if (i + 1 >= argc) return usage();
        const char *v = argv[++i];
        if (strcmp(a, "--window") == 0) {
            /* The CLI's grammar (a bare number is seconds), handed to the agent in ms. */
            int64_t d;
            cp_err err = {0};
            if (cp_parse_duration(v, 0, &d, &err)) {
                fprintf(stderr, "contprof run: --window: %s\n", err.msg);
                return 2;
            }
            char ms[32];
            snprintf(ms, sizeof ms, "%lldms", (long long)(d < 1000000 ? 1 : d / 1000000));
            setenv("CONTPROF_WINDOW", ms, 1);
            continue;
        }
        int done = 0;
        for (size_t k = 0; k < sizeof(simple) / sizeof(simple[0]); k++)
            if (strcmp(a, simple[k].opt) == 0) {
                setenv(simple[k].env, v, 1);
                done = 1;
            }
        if (done) continue;
        if (strcmp(a, "--server") == 0) {
            server = v;
        } else if (strcmp(a, "--symbolize") == 0) {
            if (strcmp(v, "agent") != 0 && strcmp(v, "server") != 0) {
                fprintf(stderr, "contprof run: --symbolize %s: expected agent or server\n", v);
                return 2;
            }
            setenv("CONTPROF_SYMBOLIZE", v, 1);
        } else if (strcmp(a, "--label") == 0) {
            if (!strchr(v, '=')) {
                fprintf(stderr, "contprof run: --label %s: expected k=v\n", v);
                return 2;
            }
            size_t l = strlen(labels);
            snprintf(labels + l, sizeof(labels) - l, "%s%s", l ? "," : "", v);
        } else {
            fprintf(stderr, "contprof run: unknown option %s\n", a);
            return usage();
        }
    }
    if (i >= argc) return usage();
    if (labels[0]) setenv("CONTPROF_LABELS", labels, 1);
    if (server) {
        /* The agent asks the server again whenever the brokers stay unreachable (a
         * restarted contprofd may have them on a new port). */
        setenv("CONTPROF_SERVER", server, 1);
        char brokers[1024];
        cp_err err = {0};
        if (cp_http_get_brokers(server, getenv("CONTPROF_TOKEN"), brokers, sizeof(brokers), 5000,
                                &err) == 0)
            setenv("CONTPROF_BROKERS", brokers, 1);
        else /* the agent keeps asking in the background */
            fprintf(stderr,
                    "contprof run: %s did not give its brokers yet (%s); the agent will "
                    "retry\n",
                    server, err.msg);
    }
    const char *lib = lib_path();
    const char *pl = getenv("LD_PRELOAD");
    char preload[4096];
    if (pl && *pl)
        snprintf(preload, sizeof(preload), "%s:%s", lib, pl);
    else
        snprintf(preload, sizeof(preload), "%s", lib);
    setenv("LD_PRELOAD", preload, 1);
    execvp(argv[i], argv + i);
    fprintf(stderr, "contprof run: %s: %s\n", argv[i], strerror(errno));
    return 127;
}
