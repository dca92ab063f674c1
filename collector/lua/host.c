/* contprof-lua-host: a small multi-isolate Lua host. Each script runs in its own lua_State
 * (one contprof isolate each); a pool of worker threads serves requests for any state, so
 * states move between threads. Used by the tests, the benchmark and the demo.
 *
 * A script's main chunk runs once when its state is opened; each request then calls its
 * global handle(arg). If handle returns the string "close", the host closes the state
 * (while the agent profiles it) and opens it again from the script. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "contprof.h"
#include "contprof_lua.h"

#define MAX_SCRIPTS 64

typedef struct script {
    char name[64];
    const char *path;
    lua_State *L;
    pthread_mutex_t mu;
    long requests, errors, reopens;
    long moves; /* requests served by another thread than the one before */
    pthread_t last;
    char last_error[256];
} script;

static struct {
    script s[MAX_SCRIPTS];
    int n;
    int threads;
    double seconds;
    long max_requests;
    lua_Integer arg;
    int agent;
    const char *labels;
    atomic_long next, done;
    atomic_int stop;
} H = {.threads = 2, .seconds = 5, .arg = 1000, .agent = 1};

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_secs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int traceback(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
    return 1;
}

/* Runs the function on top with one argument (or none if narg is 0) under a traceback
 * handler; on error, records the message in s. Returns the Lua status. */
static int call(script *s, lua_State *L, int narg, int nres)
{
    int base = lua_gettop(L) - narg;
    lua_pushcfunction(L, traceback);
    lua_insert(L, base);
    int rc = lua_pcall(L, narg, nres, base);
    lua_remove(L, base);
    if (rc != LUA_OK) {
        const char *m = lua_tostring(L, -1);
        snprintf(s->last_error, sizeof(s->last_error), "%s", m ? m : "?");
        for (char *c = s->last_error; *c; c++)
            if (*c == '\n' || *c == '\t') *c = ' '; /* one line per script in the report */
        lua_pop(L, 1);
    }
    return rc;
}

/* Opens the state of s, attaches it and runs the script's main chunk inside it. */
static int open_state(script *s)
{
    lua_State *L = luaL_newstate();
    if (!L) return -ENOMEM;
    luaL_openlibs(L);
    if (H.agent) {
        int rc = contprof_lua_attach(L, s->name, H.labels, NULL);
        if (rc != 0) fprintf(stderr, "host: %s: attach: %s\n", s->name, strerror(-rc));
    }
    contprof_lua_enter(L);
    int rc = luaL_loadfile(L, s->path);
    if (rc == LUA_OK) {
        rc = call(s, L, 0, 0);
    } else {
        snprintf(s->last_error, sizeof(s->last_error), "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    contprof_lua_leave(L);
    if (rc != LUA_OK) {
        fprintf(stderr, "host: %s: %s\n", s->path, s->last_error);
        lua_close(L);
        return -EINVAL;
    }
    s->L = L;
    return 0;
}

/* One request: handle(arg) inside the state's isolate. Called with s->mu held. */
static void serve(script *s)
{
    lua_State *L = s->L;
    if (!L) return;
    contprof_lua_enter(L);
    int close_it = 0;
    if (lua_getglobal(L, "handle") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(s->last_error, sizeof(s->last_error), "no global function handle");
        s->errors++;
    } else {
        lua_pushinteger(L, H.arg);
        if (call(s, L, 1, 1) != LUA_OK) {
            s->errors++;
        } else {
            const char *r = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            close_it = r && strcmp(r, "close") == 0;
            lua_pop(L, 1);
        }
    }
    s->requests++;
    contprof_lua_leave(L);
    if (close_it) { /* closed while the agent profiles it, then opened again */
        lua_close(L);
        s->L = NULL;
        s->reopens++;
        if (open_state(s) != 0) s->errors++;
    }
}

static void *worker(void *arg)
{
    (void)arg;
    double end = mono() + H.seconds;
    while (!atomic_load(&H.stop)) {
        if (H.max_requests > 0 ? atomic_load(&H.done) >= H.max_requests : mono() >= end) break;
        long i = atomic_fetch_add(&H.next, 1) % H.n;
        script *s = &H.s[i];
        pthread_mutex_lock(&s->mu);
        if (s->requests > 0 && !pthread_equal(s->last, pthread_self())) s->moves++;
        s->last = pthread_self();
        serve(s);
        pthread_mutex_unlock(&s->mu);
        atomic_fetch_add(&H.done, 1);
    }
    return NULL;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: contprof-lua-host [-t THREADS] [-d SECONDS | -n REQUESTS] [-a ARG] [-A]\n"
            "                         [-l LABELS] NAME=SCRIPT.lua...\n"
            "  -t  worker threads (default 2)     -d  run time (default 5 s)\n"
            "  -n  stop after this many requests  -a  integer passed to handle (1000)\n"
            "  -A  without the agent              -l  extra labels k=v,k2=v2 of every isolate\n"
            "The agent reads CONTPROF_* from the environment (e.g. CONTPROF_OUTPUT_DIR).\n");
}

int main(int argc, char **argv)
{
    int c;
    while ((c = getopt(argc, argv, "t:d:n:a:Al:h")) != -1) {
        switch (c) {
        case 't':
            H.threads = atoi(optarg);
            break;
        case 'd':
            H.seconds = atof(optarg);
            break;
        case 'n':
            H.max_requests = atol(optarg);
            break;
        case 'a':
            H.arg = (lua_Integer)atoll(optarg);
            break;
        case 'A':
            H.agent = 0;
            break;
        case 'l':
            H.labels = optarg;
            break;
        default:
            usage();
            return 2;
        }
    }
    if (optind >= argc || H.threads < 1 || H.threads > 256) {
        usage();
        return 2;
    }
    for (int i = optind; i < argc && H.n < MAX_SCRIPTS; i++) {
        script *s = &H.s[H.n++];
        const char *eq = strchr(argv[i], '=');
        if (!eq || eq == argv[i] || (size_t)(eq - argv[i]) >= sizeof(s->name)) {
            usage();
            return 2;
        }
        memcpy(s->name, argv[i], (size_t)(eq - argv[i]));
        s->path = eq + 1;
        pthread_mutex_init(&s->mu, NULL);
    }
    if (H.agent) {
        int rc = contprof_start(NULL);
        if (rc != 0) fprintf(stderr, "host: agent did not start (%d); running without\n", rc);
    }
    for (int i = 0; i < H.n; i++)
        if (open_state(&H.s[i]) != 0) return 1;

    double t0 = mono(), c0 = cpu_secs();
    pthread_t th[256];
    int started = 0;
    for (int i = 0; i < H.threads; i++) {
        if (pthread_create(&th[i], NULL, worker, NULL) != 0) break;
        started++;
    }
    if (!started) return 1;
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    double wall = mono() - t0, cpu = cpu_secs() - c0;

    /* the agent's last window sees every state still open */
    if (H.agent) contprof_stop();
    long total = 0;
    for (int i = 0; i < H.n; i++) {
        script *s = &H.s[i];
        total += s->requests;
        printf("script %s requests %ld errors %ld reopens %ld moves %ld%s%s\n", s->name,
               s->requests, s->errors, s->reopens, s->moves, s->errors ? " last_error " : "",
               s->errors ? s->last_error : "");
        if (s->L) lua_close(s->L);
        pthread_mutex_destroy(&s->mu);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("total requests %ld wall %.3f cpu %.3f rate %.1f maxrss_kb %ld\n", total, wall, cpu,
           wall > 0 ? (double)total / wall : 0.0, ru.ru_maxrss);
    printf("ok\n");
    return 0;
}
