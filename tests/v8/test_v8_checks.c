/* The V8 source's debug-build checks (collector/v8/v8source_int.h) fire where a rule is
 * broken on purpose: a session or a connection moved along no edge of its state diagram,
 * and the callback
 * rule (no call, no emission, no state but gone from inside a libwebsockets callback).
 * Each case runs in a forked child, which must die of SIGABRT naming the function and the
 * condition. Registered only when CONTPROF_ASSERTS is on (tests/v8/CMakeLists.txt). */
#include <signal.h>
#include <stdio.h>

#include "check.h"
#include "proc.h"
#include "test.h"
#include "v8source_int.h"

#if !CP_ASSERTS_ON
#error "test_v8_checks.c needs CONTPROF_ASSERTS (tests/v8/CMakeLists.txt)"
#endif

static void session_at(session *s, session_state st)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->isolate, sizeof(s->isolate), "alpha");
    s->state = st;
}

/* A move of a session from `from` to `to`, inside a callback when in_callback. */
typedef struct move {
    session_state from, to;
    int in_callback;
} move;

static void make_move(void *arg)
{
    const move *m = arg;
    session s;
    session_at(&s, m->from);
    if (m->in_callback) cp_v8_callback_enter();
    cp_v8_session_set(&s, m->to, "test");
}

TEST(a_move_off_the_diagram_dies)
{
    char out[4096];
    move back = {SESSION_RUNNING, SESSION_STARTING, 0}, revive = {SESSION_LOST, SESSION_RUNNING, 0};
    int st = run_in_child(make_move, &back, out, sizeof out);
    check_died_of_assert(st, out, "cp_v8_session_set");
    CHECK_CONTAINS(out, "legal_edges[s->state] & EDGE(to)");
    st = run_in_child(make_move, &revive, out, sizeof out);
    check_died_of_assert(st, out, "cp_v8_session_set");
}

/* A connection moved along no edge of its diagram: ENDED back to OPEN, CLOSED to OPEN
 * without connecting. */
static void make_conn_move(void *arg)
{
    const conn_state *m = arg;
    static host h;
    static conn c;
    c.h = &h;
    c.state = m[0];
    cp_v8_conn_set(&c, m[1], "test");
}

TEST(a_connection_move_off_the_diagram_dies)
{
    char out[4096];
    conn_state revive[2] = {CONN_ENDED, CONN_OPEN}, skip[2] = {CONN_CLOSED, CONN_OPEN};
    int st = run_in_child(make_conn_move, revive, out, sizeof out);
    check_died_of_assert(st, out, "cp_v8_conn_set");
    CHECK_CONTAINS(out, "conn_edges[c->state] & CONN_EDGE(to)");
    st = run_in_child(make_conn_move, skip, out, sizeof out);
    check_died_of_assert(st, out, "cp_v8_conn_set");
}

/* Inside a callback: a call to the isolate (never reaching the socket: the check comes
 * first), or an emission. */
static void in_a_callback(void *arg)
{
    const char *what = arg;
    session s;
    session_at(&s, SESSION_RUNNING);
    cp_v8_callback_enter();
    if (!strcmp(what, "call"))
        (void)cp_v8_call(&s, "Profiler.stop", NULL, NULL, NULL);
    else
        cp_v8_emit(&s, cp_profile_create(), CP_KIND_CPU, 1, 2, 0);
}

static void gone_in_callback(void *arg)
{
    session *s = arg;
    cp_v8_callback_enter();
    cp_v8_session_gone(s, "test");
    cp_v8_callback_leave();
}

TEST(the_callback_rule_holds)
{
    char out[4096];
    int st = run_in_child(in_a_callback, "call", out, sizeof out);
    check_died_of_assert(st, out, "cp_v8_call_within");
    CHECK_CONTAINS(out, "cp_v8_in_callback()");
    st = run_in_child(in_a_callback, "emit", out, sizeof out);
    check_died_of_assert(st, out, "cp_v8_emit_as");
    move start = {SESSION_STARTING, SESSION_RUNNING, 1}; /* a legal edge, not in a callback */
    st = run_in_child(make_move, &start, out, sizeof out);
    check_died_of_assert(st, out, "cp_v8_session_set");
    CHECK_CONTAINS(out, "to == SESSION_LOST");
    /* what a callback may do: mark a session gone */
    session s;
    session_at(&s, SESSION_RUNNING);
    gone_in_callback(&s);
    CHECK_EQ((int)s.state, (int)SESSION_LOST);
    CHECK_EQ(cp_v8_in_callback(), 0);
}

TEST_MAIN(T(a_move_off_the_diagram_dies), T(a_connection_move_off_the_diagram_dies),
          T(the_callback_rule_holds))
