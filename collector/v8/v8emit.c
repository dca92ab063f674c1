/* Emission of the V8 source: a window of an isolate becomes the agent's envelope (labels,
 * producer, sequence, losses) and goes to --output-dir's files and the sink
 * (collector/sink.c, shared with the agent); and the cpu windows' weighing by the CPU
 * their threads used. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "envelope.h"
#include "log.h"
#include "times.h"
#include "v8cpu.h"
#include "v8source_int.h"

/* ------------------------------------------------------------------------------------
 * Envelopes: the agent's envelope, labels and transports. */

static void sanitize(char *dst, size_t cap, const char *s)
{
    size_t i = 0;
    for (; s && s[i] && i + 1 < cap; i++) {
        char ch = s[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '-';
        dst[i] = ok ? ch : '_';
    }
    dst[i] = 0;
    if (!i && cap > 1) snprintf(dst, cap, "_");
}

static int write_file(const cp_envelope *e, const session *s, const char *capture)
{
    char iso[64], svc[64], cap[CP_CAPTURE_ID_MAX + 10] = "", path[1500], tmp[1510];
    if (capture) snprintf(cap, sizeof(cap), ".capture-%s", capture);
    sanitize(iso, sizeof(iso), s->isolate);
    sanitize(svc, sizeof(svc), cp_v8src.o->service);
    cp_buf gz = {0};
    if (cp_gzip(e->pprof, e->pprof_len, 1, &gz) != 0) return CP_ENOMEM;
    snprintf(path, sizeof(path), "%s/%s.%d-%llx.%06llu.%s.%s%s.pb.gz", cp_v8src.o->output_dir, svc,
             (int)getpid(), (unsigned long long)s->token, (unsigned long long)e->sequence,
             cp_kind_name(e->kind), iso, cap);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size_t off = 0;
    while (fd >= 0 && off < gz.len) {
        ssize_t w = write(fd, gz.data + off, gz.len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    int ok = fd >= 0 && off == gz.len;
    if (fd >= 0 && close(fd) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        cp_log_warn("v8: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    cp_buf_close(&gz);
    return ok ? 0 : CP_EIO;
}

/* "k=v,k=v" into l. */
static int add_labels_text(cp_labels *l, const char *text)
{
    if (!text || !text[0]) return 0;
    char *copy = strdup(text), *save = NULL;
    if (!copy) return CP_ENOMEM;
    int rc = 0;
    for (char *kv = strtok_r(copy, ",", &save); kv && !rc; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = 0;
        rc = cp_labels_set(l, kv, eq + 1);
    }
    free(copy);
    return rc;
}

/* s's labels: --label, service, instance, isolate, runtime. */
int cp_v8_session_labels(const session *s, cp_labels *l)
{
    int rc;
    if ((rc = add_labels_text(l, cp_v8src.o->labels)) ||
        (rc = cp_labels_set(l, CP_LABEL_SERVICE, cp_v8src.o->service)) ||
        (rc = cp_labels_set(l, CP_LABEL_INSTANCE, s->c->h->instance)) ||
        (rc = cp_labels_set(l, CP_LABEL_ISOLATE, s->isolate)) ||
        (rc = cp_labels_set(l, "runtime", "v8")))
        return rc;
    return 0;
}

/* Wraps p (destroyed here) in an envelope of s and hands it on; with capture (a running
 * capture's id), a capture window: label capture=ID, the given engine text, the session's
 * capture producer and sequence. */
void cp_v8_emit_as(session *s, cp_profile *p, cp_kind kind, int64_t start_ns, int64_t end_ns,
                   uint64_t dropped_samples, const char *capture, const char *engine)
{
    CP_V8_ASSERT_OUTSIDE_CALLS();
    cp_envelope e = {0};
    cp_buf buf = {0};
    int rc = CP_ENOMEM;
    p->time_nanos = start_ns;
    p->duration_nanos = end_ns - start_ns;
    if (cp_envelope_pprof(p, &buf) != 0) goto fail; /* raw, gzip'd when large */
    e.tenant = strdup(cp_v8src.o->tenant && cp_v8src.o->tenant[0] ? cp_v8src.o->tenant
                                                                  : CP_DEFAULT_TENANT);
    e.producer_id = strdup(capture ? s->cap_producer : s->producer);
    e.engine = strdup(engine ? engine : "v8-inspector");
    if (!e.tenant || !e.producer_id || !e.engine) goto fail;
    if ((rc = cp_v8_session_labels(s, &e.labels)) ||
        (capture && (rc = cp_labels_set(&e.labels, CP_CAPTURE_LABEL, capture))))
        goto fail;
    e.kind = kind;
    e.window_start_ns = start_ns;
    e.window_duration_ns = end_ns > start_ns ? end_ns - start_ns : 1;
    /* one sequence per producer: contprofd stores a (producer, sequence) once */
    e.sequence = capture ? s->cap_sequence++ : s->sequence++;
    e.dropped_samples = dropped_samples;
    /* losses no isolate holds (Kafka's backlog full, isolates gone for good) ride along
     * the always-on windows */
    e.dropped_windows = capture ? 0 : s->dropped_windows + cp_v8src.dropped_windows;
    e.pprof = cp_buf_steal(&buf, &e.pprof_len);
    rc = 0;
    if (cp_v8src.o->output_dir && cp_v8src.o->output_dir[0] && write_file(&e, s, capture) != 0)
        rc = CP_EIO;
    if (cp_v8src.sink)
        cp_sink_send(cp_v8src.sink, &e); /* its losses: cp_sink_take_dropped, each turn */
    if (rc == 0 && !capture) s->dropped_windows = cp_v8src.dropped_windows = 0; /* reported */
fail:
    if (rc) {
        char when[64];
        cp_format_time(start_ns, when, sizeof(when));
        if (!capture) s->dropped_windows++;
        cp_log_warn("v8: isolate %s: %s%s %s window from %s (%lld ms) lost: %s", s->isolate,
                    capture ? "capture " : "", capture ? capture : "", cp_kind_name(kind), when,
                    (long long)((end_ns - start_ns) / 1000000), cp_strerror(rc));
    }
    cp_buf_close(&buf);
    cp_envelope_close(&e);
    cp_profile_destroy(p);
}

void cp_v8_emit(session *s, cp_profile *p, cp_kind kind, int64_t start_ns, int64_t end_ns,
                uint64_t dropped_samples)
{
    cp_v8_emit_as(s, p, kind, start_ns, end_ns, dropped_samples, NULL, NULL);
}

/* ------------------------------------------------------------------------------------
 * CPU seconds: a V8 sample stands for its thread's wall time (waiting for a CPU too), so
 * each cpu window is weighed by the CPU the isolate's thread used in it, split among the
 * isolates sharing that thread by their samples. */

/* The sum of column col of p's samples. */
static int64_t column_sum(const cp_profile *p, int col)
{
    int64_t sum = 0;
    for (uint32_t i = 0; col >= 0 && i < p->samples.n; i++)
        sum += cp_profile_sample_values(p, i)[col];
    return sum;
}

/* Labels p's time as wall time (its second sample type and the default: wall). */
static void label_wall(cp_profile *p, const char *why)
{
    uint32_t w, c;
    int col = cp_profile_find_type(p, "cpu");
    if (col < 0 || cp_profile_intern_cstr(p, "wall", &w) || cp_profile_intern_cstr(p, why, &c) ||
        cp_vec_push(&p->comments, c))
        return;
    p->sample_types.v[col].type = w;
    p->default_sample_type = w;
}

/* Weighs the pending cpu windows of v[0..n) (ended together): each window's cpu column is
 * scaled to its share of the CPU its thread used since that session's last mark. */
void cp_v8_weigh_pending(session **v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        session *s = v[i];
        int64_t now = -1;
        if (s->pid > 0) {
            /* one reading per thread, shared by the isolates on it */
            for (size_t j = 0; j < i && now < 0; j++)
                if (v[j]->pid == s->pid && v[j]->tid == s->tid) now = v[j]->cpu_read;
            if (now < 0 && cp_v8_cpu_ns(s->pid, s->tid, &now) != 0) now = -1;
        }
        s->cpu_read = now;
    }
    for (size_t i = 0; i < n; i++) {
        session *s = v[i];
        int64_t now = s->cpu_read;
        if (!s->pend) { /* a window lost: its CPU is not carried into the next */
            s->cpu_mark_ns = now;
            continue;
        }
        int col = cp_profile_find_type(s->pend, "cpu");
        char note[320];
        if (s->pid > 0 && col >= 0 && (now < 0 || s->cpu_mark_ns < 0)) {
            /* A thread read before and gone now (a worker's last window): its series is
             * cpu, so the window stays cpu, unscaled. Labelled wall, the store would refuse
             * it for its series' types (DLQ). */
            snprintf(s->pend_engine, sizeof(s->pend_engine), "v8-inspector cpu=intervals");
            snprintf(note, sizeof(note),
                     "cpu: thread %d's CPU could not be read (it ended): V8's sampling intervals "
                     "as they are, waiting for a CPU included",
                     s->tid > 0 ? s->tid : s->pid);
            uint32_t c;
            if (cp_profile_intern_cstr(s->pend, note, &c) == 0)
                (void)cp_vec_push(&s->pend->comments, c);
            if (now >= 0) s->cpu_mark_ns = now;
            continue;
        }
        if (now < 0 || s->cpu_mark_ns < 0 || col < 0) {
            snprintf(s->pend_engine, sizeof(s->pend_engine), "v8-inspector wall");
            snprintf(note, sizeof(note),
                     "wall: each sample weighs one sampling interval of its thread's time, "
                     "waiting for a CPU included (%s)",
                     s->pid > 0 ? "no cpu column" : "the host is not a process of this machine");
            label_wall(s->pend, note);
            if (now >= 0) s->cpu_mark_ns = now;
            continue;
        }
        int64_t used = now > s->cpu_mark_ns ? now - s->cpu_mark_ns : 0;
        s->cpu_mark_ns = now;
        int64_t mine = column_sum(s->pend, 0), all = 0;
        for (size_t j = 0; j < n; j++)
            if (v[j]->pend && v[j]->pid == s->pid && v[j]->tid == s->tid)
                all += column_sum(v[j]->pend, 0);
        int64_t share = all > 0 ? (int64_t)((double)used * (double)mine / (double)all) : 0;
        int64_t said = column_sum(s->pend, col);
        if (said > 0) {
            double f = (double)share / (double)said;
            for (uint32_t k = 0; k < s->pend->samples.n; k++) {
                int64_t *val = s->pend->values.v + (size_t)k * s->pend->sample_types.n + col;
                *val = llround((double)*val * f);
            }
        }
        snprintf(s->pend_engine, sizeof(s->pend_engine), "v8-inspector cpu=%s",
                 s->tid > 0 ? "thread" : "process");
        snprintf(note, sizeof(note),
                 "cpu: %s %d used %lld us in this window (%s), this isolate's share %lld of %lld "
                 "samples; V8's intervals said %lld us",
                 s->tid > 0 ? "thread" : "process", s->tid > 0 ? s->tid : s->pid,
                 (long long)(used / 1000), s->tid > 0 ? "schedstat" : "stat utime+stime",
                 (long long)mine, (long long)all, (long long)(said / 1000));
        uint32_t c;
        if (cp_profile_intern_cstr(s->pend, note, &c) == 0)
            (void)cp_vec_push(&s->pend->comments, c);
    }
}
