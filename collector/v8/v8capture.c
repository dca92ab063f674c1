/* Captures in the V8 source (README "Captures"; contract model/capture.h): the control
 * topic heard, each capture's rate planned, the windows cut for the isolates it matches;
 * and the scheduled heap snapshots (--heap-snapshot-every). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "log.h"
#include "times.h"
#include "v8cpu.h"
#include "v8source_int.h"

#define CAP_WINDOW_NS (900 * 1000000LL)   /* a capture window is cut at this age (<= 1 s) */
#define CAP_MAX_HZ 1000                   /* V8's profiler: 1 ms at most */
#define CAP_SAMPLE_COST_US 100            /* V8's cost per sample, measured (README) */
#define WATCH_RETRY_NS (5 * 1000000000LL) /* a control consumer that failed */

/* The rate capture k runs at on an isolate: the asked one unless a bound or the
 * always-on interval says otherwise (k->reason). */
static void cap_plan(v8cap *k)
{
    k->reason[0] = 0;
    int64_t base = cp_v8src.o->cpu_interval_us;
    if (k->s.c.kind == CP_KIND_HEAP) { /* one snapshot per isolate */
        k->interval_us = 0;
        k->ran = 1;
        return;
    }
    if (k->s.c.kind == CP_KIND_ALLOC) {
        /* the heap sampler is not restarted: its in-use samples would be lost */
        k->interval_us = 0;
        k->ran = cp_v8src.o->heap_interval;
        if (k->ran != k->s.c.alloc_rate)
            snprintf(k->reason, sizeof(k->reason), "%s",
                     cp_v8src.o->heap_interval > 0
                         ? "v8 heap sampler kept at contprof v8 --heap-interval (inuse kept)"
                         : "v8 heap sampler off (contprof v8 --heap-interval 0)");
        return;
    }
    if (base <= 0) {
        k->interval_us = 0;
        k->ran = 0;
        snprintf(k->reason, sizeof(k->reason),
                 "v8 CPU profiler off (contprof v8 --cpu-interval 0)");
        return;
    }
    int64_t hz = cp_capture_plan_hz(&k->s.c, CAP_MAX_HZ, CAP_SAMPLE_COST_US * 1000, "the v8 source",
                                    k->reason, sizeof(k->reason));
    int64_t iv = 1000000 / hz;
    if (iv >= base) { /* at or below the always-on rate: the always-on run serves it */
        if (iv > base)
            snprintf(k->reason, sizeof(k->reason),
                     "the always-on rate (contprof v8 --cpu-interval) is higher");
        iv = base;
    }
    k->interval_us = iv;
    k->ran = 1000000 / iv;
}

static cp_capture_slot *slot_of(void *arg, int i)
{
    (void)arg;
    return &cp_v8src.caps[i].s;
}

static void on_control(const uint8_t *v, size_t len, void *arg)
{
    (void)arg;
    const char *tenant =
        cp_v8src.o->tenant && cp_v8src.o->tenant[0] ? cp_v8src.o->tenant : CP_DEFAULT_TENANT;
    cp_capture_table t = {
        .slot = slot_of,
        .n = CAP_SLOTS,
        .counts = &cp_v8src.ctl,
        .tenant = tenant,
        .token = cp_v8src.o->token,
        .heap = 1, /* heap snapshots are this source's */
    };
    cp_capture_heard h;
    cp_capture_intake(&t, v, len, cp_now_ns(), &h);
    v8cap *k = h.slot >= 0 ? &cp_v8src.caps[h.slot] : NULL;
    switch (h.act) {
    case CP_CAPTURE_BAD:
        if (!h.id[0])
            cp_log_debug("v8: control message ignored: %s", h.err.msg);
        else
            cp_log_warn("v8: capture %s ignored: selector: %s", h.id, h.err.msg);
        break;
    case CP_CAPTURE_BADSIG:
        cp_log_warn("v8: capture %s ignored: its signature does not verify with our token", h.id);
        break;
    case CP_CAPTURE_ENDED:
        cp_log_info("v8: capture %s ended (%s)", h.id, h.cancelled ? "cancelled" : "past");
        break;
    case CP_CAPTURE_UPDATED:
        cap_plan(k);
        break;
    case CP_CAPTURE_NEW:
        cap_plan(k);
        cp_log_info("v8: capture %s heard: %s %s, asked %lld, runs at %lld%s%s", k->s.c.id,
                    cp_kind_name(k->s.c.kind), k->s.c.selector,
                    (long long)(k->s.c.kind == CP_KIND_CPU     ? k->s.c.cpu_hz
                                : k->s.c.kind == CP_KIND_ALLOC ? k->s.c.alloc_rate
                                                               : 1),
                    (long long)k->ran, k->reason[0] ? ": " : "", k->reason);
        break;
    case CP_CAPTURE_FULL:
        if (cp_v8src.ctl.full == 1)
            cp_log_warn("v8: more than %d captures at once: capture %s and later ones are "
                        "not run by this source",
                        CAP_SLOTS, h.id);
        break;
    default:
        break;
    }
}

/* The running captures of kind (slot bits) whose selector matches s's labels. */
uint64_t cp_v8_caps_kind(const session *s, int64_t now, cp_kind kind)
{
    uint64_t m = 0;
    cp_labels l = {0};
    int have = 0;
    for (int i = 0; i < CAP_SLOTS; i++) {
        const v8cap *k = &cp_v8src.caps[i];
        if (!k->s.used || k->s.ended || !cp_capture_live(&k->s.c, now) || k->s.c.kind != kind ||
            (kind == CP_KIND_CPU && !k->interval_us))
            continue;
        if (!have && cp_v8_session_labels(s, &l) != 0) break;
        have = 1;
        if (cp_selector_match(&k->s.sel, &l)) m |= 1ULL << i;
    }
    cp_labels_close(&l);
    return m;
}

uint64_t cp_v8_caps_of(const session *s, int64_t now)
{
    return cp_v8_caps_kind(s, now, CP_KIND_CPU);
}

/* The interval a run serving caps uses: the finest of theirs, else the always-on one. */
int64_t cp_v8_interval_of(uint64_t caps)
{
    int64_t iv = cp_v8src.o->cpu_interval_us;
    for (int i = 0; i < CAP_SLOTS; i++)
        if ((caps & (1ULL << i)) && cp_v8src.caps[i].interval_us < iv)
            iv = cp_v8src.caps[i].interval_us;
    return iv;
}

/* A copy of profile (a run at a finer interval) holding one sample each time the time its
 * samples stand for reaches base_us (*acc carries the rest to the next run), converted at
 * base_us: the always-on window keeps its rate and its CPU seconds. A sample stands for
 * V8's time since the one before (timeDeltas), at most base_us, as V8's sampler at base_us
 * would count it: V8 falls short of a fine interval under load (README), so counting the
 * interval per sample would shrink the always-on CPU. "(idle)" samples pass nothing. NULL
 * on out of memory (or when profile is not an object). */
cp_json *cp_v8_thin_profile(const cp_json *profile, int64_t base_us, int64_t *acc)
{
    if (!cp_json_is(profile, CP_JSON_OBJECT)) return NULL;
    const cp_json *nodes = cp_json_get(profile, "nodes");
    const cp_json *samples = cp_json_get(profile, "samples");
    const cp_json *deltas = cp_json_get(profile, "timeDeltas");
    cp_json *out = cp_json_new(CP_JSON_OBJECT);
    cp_json *ns = cp_json_new(CP_JSON_ARRAY), *nd = cp_json_new(CP_JSON_ARRAY);
    if (!out || !ns || !nd) goto fail;
    for (uint32_t k = 0; k < profile->n; k++) /* the rest as it is: nodes, times */
        if (strcmp(profile->keys[k], "samples") && strcmp(profile->keys[k], "timeDeltas") &&
            cp_json_add(out, profile->keys[k], cp_json_copy(profile->items[k])))
            goto fail;
    int64_t idle[8];
    size_t nidle = 0;
    for (size_t i = 0; i < cp_json_len(nodes) && nidle < 8; i++) {
        const cp_json *n = cp_json_at(nodes, i);
        const char *fn = cp_v8_jstr(cp_json_get(n, "callFrame"), "functionName");
        const cp_json *id = cp_json_get(n, "id");
        if (fn && !strcmp(fn, "(idle)") && cp_json_is_int(id)) idle[nidle++] = id->i64;
    }
    int64_t t = 0;
    for (size_t i = 0; i < cp_json_len(samples) && i < cp_json_len(deltas); i++) {
        const cp_json *sm = cp_json_at(samples, i), *d = cp_json_at(deltas, i);
        int64_t dt = cp_json_is_int(d) ? d->i64 : 0;
        t += dt;
        int is_idle = 0;
        for (size_t j = 0; j < nidle && cp_json_is_int(sm); j++)
            is_idle |= sm->i64 == idle[j];
        if (is_idle) continue;
        *acc += dt < 0 ? 0 : dt > base_us ? base_us : dt;
        if (*acc < base_us) continue;
        *acc -= base_us;
        if (cp_json_add(ns, NULL, cp_json_copy(sm)) || cp_json_add(nd, NULL, cp_json_new_int(t)))
            goto fail;
        t = 0;
    }
    int rc = cp_json_add(out, "samples", ns); /* takes ns, even on failure */
    ns = NULL;
    if (!rc) rc = cp_json_add(out, "timeDeltas", nd);
    nd = NULL;
    if (rc) goto fail;
    return out;
fail:
    cp_json_free(ns);
    cp_json_free(nd);
    cp_json_free(out);
    return NULL;
}

/* The engine text of capture k's windows: the rate, what the capture cost the isolate so
 * far (README "Captures", "Cost"), the reason last (it runs to the end of the text). */
void cp_v8_cap_engine(const v8cap *k, const session *s, int64_t ran_us, char *out, size_t cap)
{
    int64_t ran = ran_us > 0 ? 1000000 / ran_us : 0;
    const char *why = k->reason;
    if (!why[0] && ran != k->ran) why = "another capture of this isolate runs faster";
    cp_capture_engine e = {.asked = k->s.c.cpu_hz, .ran = ran, .reason = why};
    if (s->cap_counting && s->cap_wall_ns > 0) {
        /* the sampler's CPU per wall second in the capture's runs, less the always-on
         * runs' (measured over >= 1 s, else V8's cost per tick taken as the same) */
        double rate = (double)s->cap_prof_ns / (double)s->cap_wall_ns;
        double base = s->base_wall_ns >= 1000000000LL
                          ? (double)s->base_prof_ns / (double)s->base_wall_ns
                          : rate * (double)s->cap_run_us / (double)cp_v8src.o->cpu_interval_us;
        e.has_cost = 1;
        e.cost_us_per_s = (rate - base) * 1e6;
        if (s->cap_cpu_ns > 0) {
            e.has_permille = 1;
            e.cost_permille =
                (rate - base) * (double)s->cap_wall_ns * 1000.0 / (double)s->cap_cpu_ns;
        }
    }
    (void)cp_capture_engine_write(out, cap, "v8-inspector", &e);
}

int cp_v8_profiler_start(session *s, cp_err *err)
{
    int before[64], after[64];
    size_t nb = s->pid > 0 ? cp_v8_sampler_threads(s->pid, before, 64) : 0;
    int64_t cpu0;
    s->sampler_tid = 0;
    s->run_cpu0_ns = s->pid > 0 && cp_v8_cpu_ns(s->pid, s->tid, &cpu0) == 0 ? cpu0 : -1;
    int rc = cp_v8_call(s, "Profiler.start", NULL, NULL, err);
    if (rc != 0 || s->pid <= 0) return rc;
    /* V8 starts the run's sampler thread before it answers; calls are one at a time, so
     * the one thread new since is this run's (two new: not told apart, not measured) */
    size_t na = cp_v8_sampler_threads(s->pid, after, 64), fresh = 0;
    for (size_t i = 0; i < na; i++) {
        int old = 0;
        for (size_t j = 0; j < nb && !old; j++)
            old = after[i] == before[j];
        if (!old && fresh++ == 0) s->sampler_tid = after[i];
    }
    if (fresh != 1) s->sampler_tid = 0;
    return 0;
}

void cp_v8_profiler_cost(session *s)
{
    int64_t prof, cpu1, wall = cp_now_ns() - s->run_start_ns;
    int tid = s->sampler_tid;
    s->sampler_tid = 0;
    if (!s->run_caps) s->cap_counting = 0;
    if (tid <= 0 || wall <= 0 || cp_v8_cpu_ns(s->pid, tid, &prof) != 0) return;
    if (!s->run_caps) {
        s->base_prof_ns += prof;
        s->base_wall_ns += wall;
        return;
    }
    if (!s->cap_counting) { /* a capture (or several) begins on this isolate */
        s->cap_prof_ns = s->cap_wall_ns = s->cap_cpu_ns = 0;
        s->cap_counting = 1;
    }
    s->cap_prof_ns += prof;
    s->cap_wall_ns += wall;
    s->cap_run_us = s->run_interval_us;
    if (s->run_cpu0_ns >= 0 && cp_v8_cpu_ns(s->pid, s->tid, &cpu1) == 0)
        s->cap_cpu_ns += cpu1 - s->run_cpu0_ns;
}

/* --heap-snapshot-every D: each isolate's snapshot every D, the first D after it attached,
 * and never more often than its last pause allows: a pause of P waits 100 P (the isolate
 * paused at most 1% of the time, the schedule's CPU budget). */
void cp_v8_heap_schedule_tick(void)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    int64_t every = cp_v8src.o->heap_snapshot_every_ns;
    if (every <= 0) return;
    for (int i = 0; i < cp_v8src.nhosts; i++)
        for (conn *c = cp_v8src.hosts[i].conns; c; c = c->next)
            for (session *s = c->sessions; s; s = s->next) {
                if (!cp_v8_session_running(s)) continue;
                int64_t now = cp_mono_ns();
                if (!s->snap_next_ns) s->snap_next_ns = now + every;
                if (now < s->snap_next_ns) continue;
                int64_t pause_ms = cp_v8_heap_snapshot(s, NULL);
                int64_t wait = pause_ms > 0 ? pause_ms * 100 * 1000000 : 0;
                s->snap_next_ns = cp_mono_ns() + (wait > every ? wait : every);
            }
}

/* Every loop: hears control messages, cuts capture windows (at most 1 s, the last at the
 * capture's end), switches isolates' runs as captures start and end. */
void cp_v8_captures_tick(void)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    if (!cp_v8src.brokers[0]) return;
    int64_t mono = cp_mono_ns();
    if (!cp_v8src.watch && mono >= cp_v8src.watch_retry_at) {
        cp_err e = {0};
        /* the control topic: this process is not a host, a consumer costs no host CPU */
        if (cp_watch_create(NULL, NULL, cp_v8src.brokers, NULL, NULL, NULL, &cp_v8src.watch, &e) !=
            0) {
            cp_log_warn("v8: no control consumer (captures not heard), retried in 5 s: %s", e.msg);
            cp_v8src.watch_retry_at = mono + WATCH_RETRY_NS;
        }
    }
    if (cp_v8src.watch) {
        (void)cp_watch_poll(cp_v8src.watch, on_control, NULL);
        const char *last = NULL;
        uint64_t errs = cp_watch_take_errors(cp_v8src.watch, &last);
        if (errs)
            cp_log_debug("v8: control consumer: %llu errors, last %s", (unsigned long long)errs,
                         last);
    }
    int64_t now = cp_now_ns();
    uint64_t live = 0;
    for (int i = 0; i < CAP_SLOTS; i++) {
        v8cap *k = &cp_v8src.caps[i];
        if (k->s.used && !k->s.ended && !cp_capture_live(&k->s.c, now)) k->s.ended = 1;
        if (k->s.used) live |= 1ULL << i;
    }
    if (!live) return;
    for (int i = 0; i < cp_v8src.nhosts; i++)
        for (conn *c = cp_v8src.hosts[i].conns; c; c = c->next)
            for (session *s = c->sessions; s; s = s->next) {
                if (!cp_v8_session_running(s)) continue;
                uint64_t want = cp_v8_caps_of(s, cp_now_ns());
                if (want != s->run_caps ||
                    (s->run_caps && cp_now_ns() - s->run_start_ns >= CAP_WINDOW_NS))
                    cp_v8_cpu_cycle(s, 1);
                want = s->heap_on ? cp_v8_caps_kind(s, cp_now_ns(), CP_KIND_ALLOC) : 0;
                if (cp_v8_session_alive(s) &&
                    (want != s->alloc_caps ||
                     (s->alloc_caps && cp_now_ns() - s->alloc_start_ns >= CAP_WINDOW_NS)))
                    cp_v8_alloc_cycle(s, want);
                /* heap captures: one snapshot each, the first time the isolate matches */
                want = cp_v8_caps_kind(s, cp_now_ns(), CP_KIND_HEAP) & ~s->heap_done;
                for (int b = 0; want && b < CAP_SLOTS && cp_v8_session_alive(s); b++)
                    if (want & (1ULL << b)) {
                        s->heap_done |= 1ULL << b;
                        (void)cp_v8_heap_snapshot(s, cp_v8src.caps[b].s.c.id);
                    }
            }
    /* ended captures whose last windows every isolate has sent are forgotten */
    for (int i = 0; i < CAP_SLOTS; i++) {
        v8cap *k = &cp_v8src.caps[i];
        if (!k->s.used || !k->s.ended) continue;
        int held = 0;
        for (int h = 0; h < cp_v8src.nhosts; h++)
            for (conn *c = cp_v8src.hosts[h].conns; c; c = c->next)
                for (session *s = c->sessions; s; s = s->next)
                    held |= cp_v8_session_alive(s) &&
                            ((s->run_caps | s->alloc_caps) & (1ULL << i)) != 0;
        if (held) continue;
        /* a cancelled one is kept until its end: a repeated message does not restart it */
        if (k->s.c.end_ns > now) continue;
        cp_capture_slot_close(&k->s);
        memset(k, 0, sizeof(*k));
        for (int h = 0; h < cp_v8src.nhosts; h++) /* the slot may serve another heap capture */
            for (conn *c = cp_v8src.hosts[h].conns; c; c = c->next)
                for (session *s = c->sessions; s; s = s->next)
                    s->heap_done &= ~(1ULL << i);
    }
}

void cp_v8_captures_close(void)
{
    cp_watch_destroy(cp_v8src.watch);
    cp_v8src.watch = NULL;
    const cp_capture_counts *n = &cp_v8src.ctl;
    if (n->bad + n->foreign + n->badsig + n->expired + n->full)
        cp_log_info("v8: control messages ignored: %llu undecodable, %llu other tenants, %llu "
                    "badly signed, %llu ended or cancelled, %llu over %d captures",
                    (unsigned long long)n->bad, (unsigned long long)n->foreign,
                    (unsigned long long)n->badsig, (unsigned long long)n->expired,
                    (unsigned long long)n->full, CAP_SLOTS);
    for (int i = 0; i < CAP_SLOTS; i++)
        cp_capture_slot_close(&cp_v8src.caps[i].s);
}
