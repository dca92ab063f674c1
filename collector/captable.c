/* On-demand captures: control messages read from the control consumer (watch.c), decoded
 * and checked (tenant, signature, end); a fixed table of CP_WINDOW_CAPTURE_SLOTS running captures;
 * per tick, the live threads whose isolate matches one run their CPU event at the
 * capture's period (cp_thread_boost) or sample allocations at its rate; their samples
 * are split between the capture's windows and the always-on window. */
#include "captable.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "config.h"
#include "capture.h"
#include "fd.h"
#include "guard.h"
#include "isolate.h"
#include "selector.h"
#include "times.h"
#include "watch.h"

typedef struct cap {
    cp_capture_slot s;  /* the intake's part (model/capture.h) */
    uint32_t heard;     /* C.poll_no of the poll that last handed it on */
    int64_t period_ns;  /* cpu: the period run */
    int64_t alloc_rate; /* alloc: the mean bytes run */
    int64_t ran;        /* what the envelopes say was run (Hz or bytes) */
    char reason[160];
    int64_t win_start; /* realtime ns */
    uint64_t over_threads;
} cap;

static struct {
    cap c[CP_WINDOW_CAPTURE_SLOTS];
    uint64_t live;    /* slots used and not ended */
    uint64_t used;    /* slots used */
    uint32_t gen;     /* bumped when the set of captures changes, and every second */
    uint32_t poll_no; /* bumped before each cp_watch_poll */
    int64_t next_gen; /* mono ns */
    int boosted;      /* threads possibly boosted (the thread pass runs) */
    cp_watch *w;
    cp_watch_wake_fn wake;
    int64_t next_try; /* mono ns: next attempt at creating the consumer */
    unsigned fd_revocations;
    uint64_t seq;
    char producer[200];
    uint64_t errors;
    cp_capture_counts n; /* the intake's: bad, other tenant, signature, expired, over table */
    int said_full, said_err;
} C CP_BIG;

static uint64_t iso_mask[CP_MAX_ISOLATES] CP_BIG;
static uint32_t iso_gen[CP_MAX_ISOLATES] CP_BIG;

/* ------------------------------------------------------------------------------------
 * Control messages */

/* Off the live set (ended: by the intake, its end, a server's list or the agent's stop). */
static void unlive(cap *k)
{
    C.live &= ~(1ULL << (k - C.c));
    C.gen++;
}

static void end_capture(cap *k)
{
    if (!k->s.ended) {
        k->s.ended = 1;
        unlive(k);
    }
}

/* The rate a capture runs at: the asked one unless the agent's bound, the engine or
 * max_overhead_permille say otherwise (then reason says which). */
static void plan(cap *k)
{
    k->reason[0] = 0;
    if (k->s.c.kind == CP_KIND_ALLOC) {
        k->alloc_rate = k->s.c.alloc_rate;
        k->ran = k->alloc_rate;
        if (cp_cfg.alloc_rate <= 0) {
            k->ran = 0;
            snprintf(k->reason, sizeof(k->reason), "allocation sampling is off in this agent");
        } else if (k->alloc_rate > cp_cfg.alloc_rate) {
            /* never sparser than the always-on rate: the always-on totals are thinned from
             * the capture's samples */
            k->alloc_rate = cp_cfg.alloc_rate;
            k->ran = k->alloc_rate;
            snprintf(k->reason, sizeof(k->reason), "the agent samples every %lld bytes already",
                     (long long)cp_cfg.alloc_rate);
        }
        return;
    }
    int64_t hz = k->s.c.cpu_hz;
    if (cp_cfg.cpu_hz <= 0 || cp_period_ns <= 0) {
        k->period_ns = 0;
        k->ran = 0;
        snprintf(k->reason, sizeof(k->reason), "cpu sampling is off in this agent");
        return;
    }
    hz = cp_capture_plan_hz(&k->s.c, CP_CAPTABLE_MAX_HZ, CP_CAPTABLE_SAMPLE_COST_NS, "the agent",
                            k->reason, sizeof(k->reason));
    if (1000000000 / hz > cp_period_ns) {
        /* slower than the always-on rate: the isolate keeps that rate, its samples go to
         * the capture too */
        hz = 1000000000 / cp_period_ns;
        snprintf(k->reason, sizeof(k->reason), "the agent samples at %lld Hz already",
                 (long long)hz);
    }
    k->period_ns = 1000000000 / hz;
    k->ran = hz;
}

static cp_capture_slot *slot_of(void *arg, int i)
{
    (void)arg;
    return &C.c[i].s;
}

static void on_message(const uint8_t *v, size_t len, void *arg)
{
    (void)arg;
    /* heap captures are V8 heap snapshots, `contprof v8`'s: a native program has none */
    cp_capture_table t = {
        .slot = slot_of,
        .n = CP_WINDOW_CAPTURE_SLOTS,
        .counts = &C.n,
        .tenant = cp_cfg.tenant,
        .token = cp_cfg.token,
        .heap = 0,
    };
    int64_t now = cp_now_ns();
    cp_capture_heard h;
    cp_capture_intake(&t, v, len, now, &h);
    cap *k = h.slot >= 0 ? &C.c[h.slot] : NULL;
    if (k) k->heard = C.poll_no;
    switch (h.act) {
    case CP_CAPTURE_ENDED:
        unlive(k);
        break;
    case CP_CAPTURE_UPDATED:
        plan(k);
        C.gen++;
        break;
    case CP_CAPTURE_NEW:
        k->win_start = now;
        plan(k);
        C.live |= 1ULL << h.slot;
        C.used |= 1ULL << h.slot;
        C.gen++;
        C.boosted = 1;
        break;
    case CP_CAPTURE_FULL:
        if (!C.said_full++)
            fprintf(stderr,
                    "contprof: more than %d captures at once; capture %s and later ones are not "
                    "run by this process (counted)\n",
                    CP_WINDOW_CAPTURE_SLOTS, h.id);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------------------------------
 * Matching */

static uint64_t match_labels(const cp_labels *l)
{
    uint64_t m = 0;
    for (int i = 0; i < CP_WINDOW_CAPTURE_SLOTS; i++)
        if ((C.live & (1ULL << i)) && cp_selector_match(&C.c[i].s.sel, l)) m |= 1ULL << i;
    return m;
}

static const char *g_instance = "";

/* The captures matching isolate iso (0: the thread isolate named thread). */
static uint64_t match(uint32_t iso, const char *thread)
{
    if (!C.live) return 0;
    cp_labels l = {0};
    uint64_t m = 0;
    if (cp_window_isolate_labels(iso, thread, g_instance, &l) == 0) m = match_labels(&l);
    cp_labels_close(&l);
    return m;
}

static uint64_t iso_captures(uint32_t iso)
{
    if (!iso || iso > CP_MAX_ISOLATES || !C.live) return 0;
    if (atomic_load(&cp_isolates[iso - 1].state) != CP_ISO_LIVE) return 0;
    if (iso_gen[iso - 1] != C.gen) {
        iso_mask[iso - 1] = match(iso, "");
        iso_gen[iso - 1] = C.gen;
    }
    return iso_mask[iso - 1] & C.live;
}

static uint64_t thread_captures(cp_thread *t)
{
    if (!C.live) return t->cap_mask = 0;
    if (t->cap_gen != C.gen || strncmp(t->cap_name, t->name, 16) != 0) {
        memcpy(t->cap_name, t->name, 16);
        t->cap_mask = match(0, t->name);
        t->cap_gen = C.gen;
    }
    return t->cap_mask & C.live;
}

/* ------------------------------------------------------------------------------------
 * Boosting */

/* Every live thread at the rate of the captures its isolate matches now: its own (thread
 * name) and, decision for API isolates (contprof_isolate_enter), one it was found running
 * at a tick in the last CP_CAPTABLE_API_STICKY_NS (a runtime switches isolates faster than
 * the agent ticks); the shortest period and the smallest allocation rate of them win. */
static void boost_threads(void)
{
    unsigned n = atomic_load(&cp_threads_hwm), boosted = 0;
    int any = 0;
    int64_t mono = cp_mono_ns();
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t || atomic_load(&t->state) != CP_T_LIVE) continue;
        uint64_t m = thread_captures(t);
        unsigned d = atomic_load(&t->iso_depth);
        uint64_t am = d ? iso_captures(t->iso_stack[(d > 16 ? 16 : d) - 1]) : 0;
        if (am) {
            t->api_mask = am;
            t->api_until = mono + CP_CAPTABLE_API_STICKY_NS;
        }
        if (mono < t->api_until)
            m |= t->api_mask & C.live;
        else
            t->api_mask = 0;
        int64_t period = 0, rate = 0;
        for (int s = 0; s < CP_WINDOW_CAPTURE_SLOTS; s++) {
            if (!(m & (1ULL << s))) continue;
            cap *k = &C.c[s];
            if (k->s.c.kind == CP_KIND_CPU && k->period_ns && (!period || k->period_ns < period))
                period = k->period_ns;
            if (k->s.c.kind == CP_KIND_ALLOC && k->alloc_rate > 0 &&
                (!rate || k->alloc_rate < rate))
                rate = k->alloc_rate;
        }
        if ((period || rate) && boosted >= CP_CAPTABLE_MAX_THREADS) {
            for (int s = 0; s < CP_WINDOW_CAPTURE_SLOTS; s++)
                if (m & (1ULL << s)) C.c[s].over_threads++;
            period = rate = 0;
        }
        if (period == cp_period_ns) period = 0;
        if (period != t->boost_ns) {
            int perf = 0;
            int64_t eff = cp_thread_boost(t, period, &perf);
            if (period && eff && !perf && period < 4000000) {
                /* the timer engine expires on the 4 ms scheduler tick */
                for (int s = 0; s < CP_WINDOW_CAPTURE_SLOTS; s++) {
                    cap *k = &C.c[s];
                    if (!(m & (1ULL << s)) || k->s.c.kind != CP_KIND_CPU || k->ran <= 250) continue;
                    k->ran = 250;
                    snprintf(k->reason, sizeof(k->reason),
                             "perf events refused: posix-cpu-timer runs on the 4 ms tick");
                }
            }
        }
        if (atomic_load_explicit(&t->alloc_boost, memory_order_relaxed) != rate)
            atomic_store(&t->alloc_boost, rate);
        if (period || rate) boosted++;
        if (period || rate || t->boost_ns || t->acc_ns) any = 1;
    }
    C.boosted = any;
}

/* ------------------------------------------------------------------------------------
 * The tick */

static void watch_tick(const char *brokers)
{
    int64_t now = cp_mono_ns();
    if (C.w && atomic_load(&cp_fd_revocations) != C.fd_revocations) {
        /* the host took one of the agent's fd numbers: librdkafka's sockets cannot move */
        cp_watch_destroy(C.w);
        C.w = NULL;
        C.next_try = 0;
    }
    /* a server to poll (with the relay there are no brokers), else the control topic */
    if (!C.w && ((brokers && brokers[0]) || cp_cfg.server[0] || cp_cfg.relay_dir[0]) &&
        now >= C.next_try) {
        cp_err err = {0};
        C.fd_revocations = atomic_load(&cp_fd_revocations);
        /* The host's relay asks contprofd once for every process (relay/README.md); a
         * process holding a token of its own asks the server itself: a relay serves the
         * captures of one tenant, the one its token names. */
        char relay[sizeof(cp_cfg.relay_dir) + 8];
        snprintf(relay, sizeof(relay), "%s%s", CP_WATCH_RELAY_PREFIX, cp_cfg.relay_dir);
        const char *server =
            cp_cfg.relay_dir[0] && (!cp_cfg.token[0] || !cp_cfg.server[0]) ? relay : cp_cfg.server;
        if (cp_watch_create(server, cp_cfg.token, brokers, cp_cfg.kafka_props, C.wake, NULL, &C.w,
                            &err) != 0) {
            C.errors++;
            C.next_try = now + 5 * (int64_t)1000000000;
            if (!C.said_err++) fprintf(stderr, "contprof: captures: %s (retrying)\n", err.msg);
        }
    }
    if (!C.w) return;
    C.poll_no++;
    cp_watch_poll(C.w, on_message, NULL);
    /* a server lists the running captures only: one it no longer lists has ended or been
     * cancelled (its record left the list) */
    if (cp_watch_was_whole(C.w))
        for (int i = 0; i < CP_WINDOW_CAPTURE_SLOTS; i++)
            if (C.c[i].s.used && !C.c[i].s.ended && C.c[i].heard != C.poll_no) end_capture(&C.c[i]);
    C.errors += cp_watch_take_errors(C.w, NULL);
}

void cp_captable_update(const char *brokers)
{
    CP_ASSERT_AGENT_THREAD();
    if (!cp_cfg.captures) return;
    watch_tick(brokers);
    if (!C.used && !C.boosted) return;
    int64_t now = cp_now_ns(), mono = cp_mono_ns();
    for (int i = 0; i < CP_WINDOW_CAPTURE_SLOTS; i++)
        if ((C.live & (1ULL << i)) && !cp_capture_live(&C.c[i].s.c, now)) end_capture(&C.c[i]);
    if (mono >= C.next_gen) { /* isolates and thread names come and go */
        C.gen++;
        C.next_gen = mono + 1000000000;
    }
    boost_threads();
}

void cp_captable_add_cpu(cp_thread *t, const cp_sample_rec *r)
{
    CP_ASSERT_AGENT_THREAD();
    int64_t period = r->period_ns > 0 ? r->period_ns : cp_period_ns;
    int64_t ns = (int64_t)r->weight * period;
    uint64_t m = r->isolate ? iso_captures(r->isolate) : thread_captures(t);
    for (int s = 0; m && s < CP_WINDOW_CAPTURE_SLOTS; s++)
        if ((m & (1ULL << s)) && C.c[s].s.c.kind == CP_KIND_CPU)
            cp_window_add_capture_cpu((unsigned)s, r, t->name, ns);
    if (period == cp_period_ns) {
        cp_window_add_cpu(r, t->name);
        return;
    }
    /* the always-on window at its own period: one sample (this one's stack) each time the
     * boosted CPU time reaches a period, weighted by the periods it holds */
    t->acc_ns += ns;
    if (t->acc_ns < cp_period_ns) return;
    cp_sample_rec c;
    c.isolate = r->isolate;
    c.nframes = r->nframes;
    c.weight = (uint64_t)(t->acc_ns / cp_period_ns);
    c.period_ns = cp_period_ns;
    memcpy(c.pcs, r->pcs, r->nframes * sizeof(uint64_t));
    t->acc_ns -= (int64_t)c.weight * cp_period_ns;
    cp_window_add_cpu(&c, t->name);
}

static void engine_text(const cap *k, char *out, size_t cap_)
{
    char reason[224] = ""; /* k->reason (160), "; " and the bound's sentence */
    if (k->over_threads)
        snprintf(reason, sizeof(reason),
                 "%s%sthreads over the agent's bound of %d were not boosted", k->reason,
                 k->reason[0] ? "; " : "", CP_CAPTABLE_MAX_THREADS);
    else
        snprintf(reason, sizeof(reason), "%s", k->reason);
    cp_capture_engine e = {
        .asked = k->s.c.kind == CP_KIND_CPU ? (int64_t)k->s.c.cpu_hz : k->s.c.alloc_rate,
        .ran = k->ran,
        .reason = reason,
    };
    (void)cp_capture_engine_write(out, cap_, cp_engine, &e);
}

static void free_slot(cap *k)
{
    int s = (int)(k - C.c);
    cp_window_drop_capture((unsigned)s);
    cp_capture_slot_close(&k->s);
    memset(k, 0, sizeof(*k));
    C.used &= ~(1ULL << s);
    C.live &= ~(1ULL << s);
}

void cp_captable_flush(const char *instance, const char *producer, int all, int end,
                       cp_emit_fn emit, void *arg)
{
    CP_ASSERT_AGENT_THREAD();
    g_instance = instance;
    if (!C.used) return;
    snprintf(C.producer, sizeof(C.producer), "%s/capture", producer);
    int64_t now = cp_now_ns();
    if (end)
        for (int i = 0; i < CP_WINDOW_CAPTURE_SLOTS; i++)
            if (C.c[i].s.used) end_capture(&C.c[i]);
    /* allocation captures: the boosted buckets are taken once for all of them */
    int alloc_due = 0;
    for (int i = 0; i < CP_WINDOW_CAPTURE_SLOTS; i++) {
        cap *k = &C.c[i];
        if (k->s.used && k->s.c.kind == CP_KIND_ALLOC &&
            (all || k->s.ended || now - k->win_start >= CP_CAPTABLE_WINDOW_NS))
            alloc_due = 1;
    }
    cp_alloc_bucket *b = NULL, *mine = NULL;
    uint32_t nb = 0;
    uint64_t *bm = NULL;
    if (alloc_due) {
        uint32_t want = cp_alloc_nbuckets() + 64;
        b = malloc((size_t)want * sizeof(*b));
        mine = malloc((size_t)want * sizeof(*mine));
        bm = calloc(want, sizeof(*bm));
        if (b && mine && bm) nb = cp_alloc_snapshot_boosted(b, want);
        for (uint32_t j = 0; j < nb; j++)
            bm[j] = b[j].isolate ? iso_captures(b[j].isolate) : match(0, b[j].thread);
    }
    for (int i = 0; i < CP_WINDOW_CAPTURE_SLOTS; i++) {
        cap *k = &C.c[i];
        if (!k->s.used) continue;
        int due = all || k->s.ended || now - k->win_start >= CP_CAPTABLE_WINDOW_NS;
        if (k->s.c.kind == CP_KIND_ALLOC) due = alloc_due;
        if (!due) continue;
        char engine[256];
        engine_text(k, engine, sizeof(engine));
        cp_window_capture w = {
            .start_ns = k->win_start,
            .end_ns = now,
            .instance = instance,
            .producer_id = C.producer,
            .sequence = &C.seq,
            .id = k->s.c.id,
            .kind = k->s.c.kind,
            .period = k->s.c.kind == CP_KIND_CPU ? k->period_ns : k->alloc_rate,
            .engine = engine,
        };
        if (k->s.c.kind == CP_KIND_ALLOC) {
            uint32_t nm = 0;
            for (uint32_t j = 0; j < nb; j++)
                if (bm[j] & (1ULL << i)) mine[nm++] = b[j];
            w.buckets = mine;
            w.nbuckets = nm;
        }
        (void)cp_window_finish_capture((unsigned)i, &w, emit, arg);
        k->win_start = now;
        if (k->s.ended) free_slot(k);
    }
    free(b);
    free(mine);
    free(bm);
}

const char *cp_captable_stats(void)
{
    CP_ASSERT_AGENT_THREAD();
    static char buf[200];
    buf[0] = 0;
    if (C.errors || C.n.bad || C.n.foreign || C.n.badsig || C.n.expired || C.n.full)
        snprintf(buf, sizeof(buf),
                 "control_errors=%llu control_bad=%llu control_other_tenant=%llu "
                 "control_bad_signature=%llu control_expired=%llu captures_over_table=%llu",
                 (unsigned long long)C.errors, (unsigned long long)C.n.bad,
                 (unsigned long long)C.n.foreign, (unsigned long long)C.n.badsig,
                 (unsigned long long)C.n.expired, (unsigned long long)C.n.full);
    return buf;
}

void cp_captable_set_wake(void (*wake)(void *))
{
    C.wake = wake;
}

int cp_captable_active(void)
{
    return C.used != 0 || C.boosted;
}

void cp_captable_stop(void)
{
    CP_ASSERT_AGENT_THREAD();
    unsigned n = atomic_load(&cp_threads_hwm);
    for (unsigned i = 0; i < n && i < CP_MAX_THREADS; i++) {
        cp_thread *t = atomic_load(&cp_threads[i]);
        if (!t || atomic_load(&t->state) != CP_T_LIVE) continue;
        int perf;
        if (t->boost_ns) cp_thread_boost(t, 0, &perf);
        atomic_store(&t->alloc_boost, 0);
    }
    C.boosted = 0;
    /* the slots in use only: reading the others would fault in pages never written */
    for (uint64_t m = C.used; m; m &= m - 1)
        free_slot(&C.c[__builtin_ctzll(m)]);
    cp_watch_destroy(C.w);
    C.w = NULL;
    C.next_try = 0;
}

void cp_captable_after_fork_child(void)
{
    /* the parent's agent thread may have been changing the table: forget it (lost once) */
    cp_watch_abandon(C.w);
    cp_watch_wake_fn wake = C.wake;
    uint32_t gen = C.gen;
    /* Only the slots in use and the fields after the table are cleared, and iso_gen is made
     * stale by the generation rather than zeroed: a page the parent never wrote stays
     * unwritten (a fork child that never hears a capture pays no fault for the table). */
    for (uint64_t m = C.used | C.live; m; m &= m - 1)
        memset(&C.c[__builtin_ctzll(m)], 0, sizeof(C.c[0]));
    memset((char *)&C + sizeof(C.c), 0, sizeof(C) - sizeof(C.c));
    C.wake = wake;
    C.gen = gen + 1; /* every iso_gen entry is at most gen */
}
