/* On-demand captures (issue 29, model/capture.h): the agent's table of the captures it
 * heard on the control topic, the threads they boost, the capture windows they ship. Agent
 * thread only; above window.c, below agent.c (README.md "Captures"). */
#ifndef CP_COLLECTOR_CAPTABLE_H
#define CP_COLLECTOR_CAPTABLE_H

#include <stdint.h>

#include "thread.h"
#include "window.h"

/* The fastest CPU rate a capture runs at (Hz): the per-thread ring holds CP_RING samples
 * and the agent drains it every 50 ms while a capture runs. */
#define CP_CAPTABLE_MAX_HZ 1000
/* The agent's tick while a capture runs. */
#define CP_CAPTABLE_TICK_NS (50 * (int64_t)1000000)
/* Longest capture window: envelopes at least this often while a capture runs. */
#define CP_CAPTABLE_WINDOW_NS (1000 * (int64_t)1000000)
/* A thread found running a captured API isolate stays boosted this long after. */
#define CP_CAPTABLE_API_STICKY_NS (1000 * (int64_t)1000000)
/* At most this many threads boosted at once (each may keep a perf fd above the floor). */
#define CP_CAPTABLE_MAX_THREADS 128
/* The CPU a sample costs the host, for max_overhead_permille: the collector bench's
 * us_per_sample (13 us), rounded up. */
#define CP_CAPTABLE_SAMPLE_COST_NS 15000

/* Before the rings are drained: brings the control consumer up (brokers known,
 * CONTPROF_CAPTURES not 0) or rebuilds it, reads what it fetched, ends captures that are
 * cancelled or past their end, and sets the rate of every live thread whose isolate
 * matches a capture now (and back for those that no longer do). Never blocks. */
void cp_captable_update(const char *brokers);

/* A drained CPU sample of thread t whose event was boosted (its period differs from the
 * agent's) or whose isolate is captured: into the matching captures' tables, and into the
 * always-on window at the agent's own period (boosted periods accumulate until they make
 * one), so the always-on CPU time is unchanged. */
void cp_captable_add_cpu(cp_thread *t, const cp_sample_rec *r);

/* 1 if a drained sample of t must go through cp_captable_add_cpu. */
static inline int cp_captable_routes(const cp_thread *t, const cp_sample_rec *r)
{
    return (r->period_ns && r->period_ns != cp_period_ns) || t->boost_ns || t->acc_ns ||
           t->cap_mask || t->api_mask;
}

/* After the drain: emits the capture windows that are due (CP_CAPTABLE_WINDOW_NS) and the
 * last ones of ended captures; all = 1: every capture's window now (the image ends: exec,
 * _exit); end = 1: and every capture ends (the agent stops). instance and producer are the
 * agent's; capture envelopes carry producer + "/capture" and their own sequence, so the
 * always-on envelopes are not renumbered. */
void cp_captable_flush(const char *instance, const char *producer, int all, int end,
                       cp_emit_fn emit, void *arg);

/* The control topic's counts since start (errors, messages ignored: undecodable, other
 * tenant, bad signature, over when first seen; captures over the table), as a pprof
 * comment for the contprof-agent profile; "" while all are 0. Valid until the next call. */
const char *cp_captable_stats(void);

/* Registers the agent thread's wake-up (agent.c), called on a librdkafka thread when a
 * control message arrives: the capture starts without waiting for the agent's tick. */
void cp_captable_set_wake(void (*wake)(void *));

/* 1 while a capture runs (the agent then ticks every CP_CAPTABLE_TICK_NS). */
int cp_captable_active(void);

/* Unboosts every thread and destroys the consumer (the agent stops). */
void cp_captable_stop(void);

/* After fork in the child: a new instance hears captures anew. */
void cp_captable_after_fork_child(void);

#endif
