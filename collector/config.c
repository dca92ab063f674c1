/* The agent's configuration: contprof_options fields first, CONTPROF_* environment
 * variables for what they leave unset, then defaults. No allocation. */
#include "config.h"
#include "guard.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "times.h"
#include "envelope.h" /* CP_TOPIC_PROFILES */

cp_config cp_cfg CP_BIG;

static void copy(char *dst, size_t cap, const char *opt, const char *env, const char *def)
{
    const char *v = opt && opt[0] ? opt : NULL;
    if (!v && env) v = getenv(env);
    if (!v || !v[0]) v = def;
    if (!v) v = "";
    snprintf(dst, cap, "%s", v);
}

int cp_config_duration(const char *name, const char *s, int64_t bare_max, int64_t *out_ns,
                       cp_err *err)
{
    cp_err e = {0};
    if (cp_parse_duration(s, 0, out_ns, &e) != 0)
        return cp_err_set(err, CP_EPARSE, "%s='%s': %s", name, s, e.msg);
    if (bare_max > 0 && s[strspn(s, "0123456789.")] == 0 && strtod(s, NULL) >= (double)bare_max)
        return cp_err_set(err, CP_EPARSE,
                          "%s='%s': a bare number is seconds, and one of %lld or more meant "
                          "milliseconds in earlier versions: write the unit (%sms or %ss)",
                          name, s, (long long)bare_max, s, s);
    return 0;
}

static int64_t env_int(const char *name, int64_t def)
{
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end) return def;
    return v;
}

/* The process's name (its main thread's): on the main thread (a preloaded program's
 * constructor) by prctl, elsewhere (contprof_start from another thread) from /proc, read
 * without stdio: fopen would make the process's first malloc (the heap set up) in a
 * program that may never allocate. Why prctl first: opening /proc/self/comm cost a short
 * process 20-30 us here (its /proc inodes are built on first use). */
static void program_name(char *out, size_t cap)
{
    char own[16] = "";
    if (getpid() == (pid_t)syscall(SYS_gettid) && prctl(PR_GET_NAME, own, 0, 0, 0) == 0 && own[0]) {
        snprintf(out, cap, "%s", own);
        return;
    }
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, out, cap - 1) : -1;
    if (fd >= 0) close(fd);
    out[n > 0 ? n : 0] = 0;
    out[strcspn(out, "\n")] = 0;
    if (!out[0]) snprintf(out, cap, "unknown");
}

/* Collects CONTPROF_KAFKA_<NAME>=value variables as librdkafka "name=value" lines (the
 * agent's SASL/SSL settings); CONTPROF_KAFKA_QUEUE is the agent's own. What does not fit
 * in cap is left out whole. */
static void kafka_props_from_env(char *out, size_t cap)
{
    extern char **environ;
    size_t len = 0;
    out[0] = 0;
    for (char **e = environ; e && *e; e++) {
        const char *v = *e;
        if (strncmp(v, "CONTPROF_KAFKA_", 15) != 0 || strncmp(v, "CONTPROF_KAFKA_QUEUE=", 21) == 0)
            continue;
        const char *eq = strchr(v, '=');
        if (!eq || eq == v + 15) continue;
        size_t need = strlen(v + 15) + 1; /* "name=value\n" */
        if (len + need + 1 > cap) continue;
        for (const char *c = v + 15; c < eq; c++)
            out[len++] = *c == '_' ? '.' : (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
        size_t vl = strlen(eq);
        memcpy(out + len, eq, vl);
        len += vl;
        out[len++] = '\n';
        out[len] = 0;
    }
}

/* The default output directory, this effective user's own: $XDG_RUNTIME_DIR/contprof when
 * XDG_RUNTIME_DIR is an absolute path to a directory of ours that nobody else may enter
 * (systemd's /run/user/UID, 0700), else ${TMPDIR:-/tmp}/contprof-EUID. Why per user: a
 * shared name in /tmp can be made first by another user (or be a symbolic link planted by
 * one), who then receives every later user's profiles; outdir.c checks what is found. */
static void default_output_dir(char *out, size_t cap)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    if (xdg && xdg[0] == '/' && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) &&
        st.st_uid == geteuid() && (st.st_mode & 077) == 0) {
        snprintf(out, cap, "%s/contprof", xdg);
        return;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(out, cap, "%s/contprof-%u", tmp && *tmp ? tmp : "/tmp", (unsigned)geteuid());
}

int cp_config_load(cp_config *c, const contprof_options *o, cp_err *err)
{
    static const contprof_options none;
    if (!o) o = &none;
    memset(c, 0, sizeof(*c));
    char prog[64];
    program_name(prog, sizeof(prog));
    copy(c->service, sizeof(c->service), o->service, "CONTPROF_SERVICE", prog);
    copy(c->version, sizeof(c->version), o->version, "CONTPROF_VERSION", "");
    copy(c->tenant, sizeof(c->tenant), o->tenant, "CONTPROF_TENANT", "default");
    copy(c->labels, sizeof(c->labels), o->labels, "CONTPROF_LABELS", "");
    copy(c->brokers, sizeof(c->brokers), o->brokers, "CONTPROF_BROKERS", "");
    copy(c->server, sizeof(c->server), o->server, "CONTPROF_SERVER", "");
    copy(c->token, sizeof(c->token), NULL, "CONTPROF_TOKEN", "");
    copy(c->topic, sizeof(c->topic), o->topic, "CONTPROF_TOPIC", CP_TOPIC_PROFILES);
    copy(c->output_dir, sizeof(c->output_dir), o->output_dir, "CONTPROF_OUTPUT_DIR", "");
    copy(c->relay_dir, sizeof(c->relay_dir), NULL, "CONTPROF_RELAY", "");

    if (!c->output_dir[0] && !c->brokers[0] && !c->server[0] && !c->relay_dir[0]) {
        /* no transport at all: keep the windows for offline use */
        default_output_dir(c->output_dir, sizeof(c->output_dir));
        c->output_dir_default = 1;
    }

    int64_t hz = o->cpu_hz ? o->cpu_hz : env_int("CONTPROF_CPU_HZ", 100);
    if (hz < 0) hz = 0;
    if (hz > 1000) hz = 1000;
    c->cpu_hz = (int)hz;

    int64_t rate = o->alloc_rate ? o->alloc_rate : env_int("CONTPROF_ALLOC_RATE", 524288);
    c->alloc_rate = rate < 0 ? 0 : rate;

    c->window_ns = o->window_ms > 0 ? o->window_ms * 1000000 : (int64_t)10 * 1000000000;
    const char *w = getenv("CONTPROF_WINDOW");
    if (o->window_ms <= 0 && w && *w &&
        cp_config_duration("CONTPROF_WINDOW", w, CP_WINDOW_BARE_MAX, &c->window_ns, err) != 0)
        return CP_EPARSE;
    if (c->window_ns < CP_WINDOW_MIN_NS) c->window_ns = CP_WINDOW_MIN_NS;

    int ch = o->children;
    if (!ch) ch = env_int("CONTPROF_CHILDREN", 1) ? 1 : -1;
    c->children = ch > 0;
    c->captures = env_int("CONTPROF_CAPTURES", 1) != 0;
    c->python = env_int("CONTPROF_PYTHON", 1) != 0;

    if (getenv("CONTPROF_FLUSH_MS"))
        return cp_err_set(err, CP_EPARSE,
                          "CONTPROF_FLUSH_MS='%s': renamed CONTPROF_FLUSH, a duration "
                          "(CONTPROF_FLUSH=%sms)",
                          getenv("CONTPROF_FLUSH_MS"), getenv("CONTPROF_FLUSH_MS"));
    c->flush_ns = 1000000000;
    const char *f = getenv("CONTPROF_FLUSH");
    if (f && *f && cp_config_duration("CONTPROF_FLUSH", f, 0, &c->flush_ns, err) != 0)
        return CP_EPARSE;
    if (c->flush_ns > CP_FLUSH_MAX_NS)
        return cp_err_set(err, CP_EPARSE,
                          "CONTPROF_FLUSH='%s': at most 1h (the program waits "
                          "that long at exit)",
                          f);
    c->kafka_queue = (int)env_int("CONTPROF_KAFKA_QUEUE", 256);
    if (c->kafka_queue < 2) c->kafka_queue = 2;
    const char *eng = getenv("CONTPROF_CPU_ENGINE");
    c->cpu_engine = !eng                        ? CP_ENGINE_AUTO
                    : strcmp(eng, "timer") == 0 ? CP_ENGINE_TIMER
                    : strcmp(eng, "perf") == 0  ? CP_ENGINE_PERF
                                                : CP_ENGINE_AUTO;
    const char *sy = getenv("CONTPROF_SYMBOLIZE");
    c->symbolize_server = sy && strcmp(sy, "server") == 0;
    c->symbolize_lines = sy && strcmp(sy, "lines") == 0;
    const char *di = getenv("CONTPROF_DEBUGINFO");
    c->debuginfo = !di || !*di            ? CP_DEBUGINFO_NAMES
                   : strcmp(di, "1") == 0 ? CP_DEBUGINFO_ALL
                                          : CP_DEBUGINFO_NONE;
    const char *nc = getenv("CONTPROF_NAMES_CACHE");
    if (nc && *nc && strcmp(nc, "0") != 0 && strcmp(nc, "1") != 0)
        return cp_err_set(err, CP_EPARSE,
                          "CONTPROF_NAMES_CACHE='%s': 0 (names read from each object) or 1 "
                          "(the relay's name cache, the default)",
                          nc);
    c->names_cache = !nc || strcmp(nc, "0") != 0;
    c->symbolize_budget_ns = CP_SYMBOLIZE_BUDGET_NS;
    const char *bu = getenv("CONTPROF_SYMBOLIZE_BUDGET");
    if (bu && *bu && strcmp(bu, "0") != 0 &&
        cp_config_duration("CONTPROF_SYMBOLIZE_BUDGET", bu, 0, &c->symbolize_budget_ns, err) != 0)
        return CP_EPARSE;
    if (bu && strcmp(bu, "0") == 0) c->symbolize_budget_ns = 0;
    kafka_props_from_env(c->kafka_props, sizeof(c->kafka_props));
    return 0;
}
