/* "Agent thread only", asserted (collector/guard.h, Debug and sanitizer builds): with an
 * agent thread alive, a host thread calling the perf map's reader, the ELF name tables or
 * the capture listener (watch.h) dies naming the function and both threads; the agent
 * thread itself, and any thread while there is no agent, runs them. */
#include <pthread.h>
#include <semaphore.h>

#include "elfnames.h"
#include "guard.h"
#include "perfmap.h"
#include "proc.h"
#include "test.h"
#include "watch.h"

static sem_t g_ready, g_done;

/* The agent thread: marks itself as the agent's, runs fn if given, and lives until told. */
static void *agent(void *fn)
{
    cp_guard_agent_thread_begin(1);
    if (fn) ((void (*)(void *))fn)(NULL);
    sem_post(&g_ready);
    sem_wait(&g_done);
    return NULL;
}

static void refresh(void *arg)
{
    (void)arg;
    (void)cp_perfmap_refresh("/dev/null");
}

static void names(void *arg)
{
    (void)arg;
    cp_elfnames *t = NULL;
    (void)cp_elfnames_create("/proc/self/exe", NULL, 0, NULL, &t);
    cp_elfnames_destroy(t);
}

/* A real poller of a server nobody answers at (its requests fail at once and are retried),
 * made and destroyed. */
static void listen_for_captures(void *arg)
{
    (void)arg;
    cp_watch *w = NULL;
    (void)cp_watch_create("http://127.0.0.1:1", NULL, "", NULL, NULL, NULL, &w, NULL);
    cp_watch_destroy(w);
}

/* In the child: an agent thread starts, then this (host) thread calls fn. */
static void host_calls(void *fn)
{
    sem_init(&g_ready, 0, 0);
    sem_init(&g_done, 0, 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, agent, NULL) == 0);
    sem_wait(&g_ready);
    ((void (*)(void *))fn)(NULL);
    printf("not reached: the check did not fire\n");
    fflush(stdout);
}

static void dies_on_a_host_thread(void (*fn)(void *), const char *func)
{
    char out[4096];
    int st = run_in_child(host_calls, (void *)fn, out, sizeof out);
    check_died_of_assert(st, out, func);
    CHECK_CONTAINS(out, "agent thread only: called on thread ");
}

TEST(perfmap_refresh_on_a_host_thread_dies)
{
    dies_on_a_host_thread(refresh, "cp_perfmap_refresh");
}

TEST(elfnames_on_a_host_thread_dies)
{
    dies_on_a_host_thread(names, "cp_elfnames_create");
}

TEST(capture_listener_on_a_host_thread_dies)
{
    dies_on_a_host_thread(listen_for_captures, "cp_watch_create");
}

/* In the child: the agent thread runs both itself; with no agent, this thread does too. */
static void agent_calls(void *arg)
{
    (void)arg;
    refresh(NULL);
    names(NULL);
    listen_for_captures(NULL);
    sem_init(&g_ready, 0, 0);
    sem_init(&g_done, 0, 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, agent, (void *)refresh) == 0);
    sem_wait(&g_ready);
    sem_post(&g_done);
    pthread_join(th, NULL);
    CHECK(pthread_create(&th, NULL, agent, (void *)names) == 0);
    sem_wait(&g_ready);
    sem_post(&g_done);
    pthread_join(th, NULL);
    CHECK(pthread_create(&th, NULL, agent, (void *)listen_for_captures) == 0);
    sem_wait(&g_ready);
    sem_post(&g_done);
    pthread_join(th, NULL);
    printf("ran\n");
    fflush(stdout);
}

TEST(agent_thread_and_no_agent_run_them)
{
    char out[4096];
    int st = run_in_child(agent_calls, NULL, out, sizeof out);
    printf("%s", out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_CONTAINS(out, "ran\n");
}

TEST_MAIN(T(perfmap_refresh_on_a_host_thread_dies), T(elfnames_on_a_host_thread_dies),
          T(capture_listener_on_a_host_thread_dies), T(agent_thread_and_no_agent_run_them))
