/* The V8 source's loop and wiring (v8source.h): the hosts named, where windows go, and
 * each turn's discovery, windows, sink, captures and schedule. The jobs are in
 * v8inspector.c (connections and calls), v8session.c (isolates), v8capture.c (captures)
 * and v8emit.c (envelopes); v8source_int.h is what they share. */
#include "v8source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http_client.h"
#include "log.h"
#include "relay.h"
#include "times.h"
#include "v8source_int.h"

cp_v8src_state cp_v8src;

/* ------------------------------------------------------------------------------------
 * The loop. */

static int parse_inspector(host *h, const char *spec, int allow_remote, cp_err *err)
{
    const char *colon = strrchr(spec, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == spec || *end || port <= 0 || port > 65535 ||
        (size_t)(colon - spec) >= sizeof(h->addr))
        return cp_err_set(err, CP_EINVAL, "--inspector %s: not HOST:PORT", spec);
    memset(h, 0, sizeof(*h));
    snprintf(h->addr, sizeof(h->addr), "%.*s", (int)(colon - spec), spec);
    h->port = (int)port;
    snprintf(h->hostport, sizeof(h->hostport), "%s:%d", h->addr, h->port);
    if (!allow_remote && strncmp(h->addr, "127.", 4) && strcmp(h->addr, "localhost") &&
        strcmp(h->addr, "::1") && strcmp(h->addr, "[::1]"))
        return cp_err_set(err, CP_EINVAL,
                          "--inspector %s: not a loopback address (an inspector runs code for "
                          "whoever reaches it; --allow-remote to insist)",
                          spec);
    return 0;
}

int cp_v8_run(const cp_v8_options *o, cp_err *err)
{
    int rc = 0;
    memset(&cp_v8src, 0, sizeof(cp_v8src));
    cp_v8src.o = o;
    if (!o->service || !o->service[0]) return cp_err_set(err, CP_EINVAL, "--service is required");
    if (o->ninspectors <= 0) return cp_err_set(err, CP_EINVAL, "no --inspector given");
    if (o->window_ns <= 0 || o->cpu_interval_us < 0 || o->heap_interval < 0 ||
        (!o->cpu_interval_us && !o->heap_interval))
        return cp_err_set(err, CP_EINVAL,
                          "the window must be > 0, and the CPU or the heap "
                          "interval too (0 turns one profiler off)");
    gethostname(cp_v8src.hostname, sizeof(cp_v8src.hostname) - 1);
    snprintf(cp_v8src.producer, sizeof(cp_v8src.producer), "%s:%d:v8", cp_v8src.hostname,
             (int)getpid());
    for (int i = 0; i < o->ninspectors && i < CP_V8_MAX_HOSTS; i++) {
        if ((rc = parse_inspector(&cp_v8src.hosts[i], o->inspectors[i], o->allow_remote, err)))
            return rc;
        host *h = &cp_v8src.hosts[i];
        if (o->instance && o->instance[0])
            snprintf(h->instance, sizeof(h->instance), "%s", o->instance);
        else
            snprintf(h->instance, sizeof(h->instance), "%s:%d", cp_v8src.hostname, h->port);
        cp_v8src.nhosts++;
    }
    if (o->output_dir && o->output_dir[0]) mkdir(o->output_dir, 0755);
    /* Where windows go, as the agent's: the relay named, else the server's when it runs on
     * this host, else Kafka (brokers given or the server's, asked again when they stay
     * unreachable: a restarted contprofd may have them on a new port). */
    char brokers[1024] = "", relay[1024] = "";
    if (o->relay_dir && o->relay_dir[0]) snprintf(relay, sizeof(relay), "%s", o->relay_dir);
    if (o->brokers && o->brokers[0])
        snprintf(brokers, sizeof(brokers), "%s", o->brokers);
    else if (o->server && o->server[0] &&
             (rc = cp_http_get_transport(o->server, o->token, brokers, sizeof(brokers),
                                         relay[0] ? NULL : relay, sizeof(relay), 5000, err)))
        return rc;
    if (relay[0] && !cp_relay_listening(relay) && !(o->relay_dir && o->relay_dir[0]))
        relay[0] = 0; /* the server's relay is another host's */
    if (brokers[0] && !o->no_captures)
        snprintf(cp_v8src.brokers, sizeof(cp_v8src.brokers), "%s", brokers);
    if (!brokers[0] && !relay[0] && !(o->output_dir && o->output_dir[0]))
        return cp_err_set(err, CP_EINVAL,
                          "nowhere to send windows: --output-dir, --server, --relay or "
                          "--brokers");
    cp_sink_options so = {
        .relay_dir = relay,
        .brokers = brokers,
        .server = o->server,
        .token = o->token,
        .topic = o->topic,
        .kafka_queue = 10000,
    };
    if ((brokers[0] || relay[0]) && (rc = cp_sink_create(&so, &cp_v8src.sink, err))) return rc;

    if ((rc = cp_v8_inspector_open(err))) {
        cp_sink_destroy(cp_v8src.sink, 0);
        cp_v8src.sink = NULL;
        return rc;
    }

    int64_t next_window = cp_now_ns() + o->window_ns;
    while (!*o->stop) {
        int64_t now = cp_mono_ns();
        int gone = 1;
        for (int i = 0; i < cp_v8src.nhosts; i++) {
            host *h = &cp_v8src.hosts[i];
            if (now >= h->next_poll) cp_v8_discover(h);
            cp_v8_maintain(h);
            if (!h->seen || h->answering || h->conns) gone = 0;
        }
        if (cp_now_ns() >= next_window) {
            cp_v8_windows_end(NULL, 0);
            next_window += o->window_ns;
            if (next_window < cp_now_ns()) next_window = cp_now_ns() + o->window_ns;
        }
        if (cp_v8src.sink) {
            cp_sink_tick(cp_v8src.sink);
            uint64_t kd = cp_sink_take_dropped(cp_v8src.sink);
            if (kd)
                cp_log_warn("v8: %llu windows lost on the way (Kafka's backlog full or refused by "
                            "the broker, the relay's spool full): counted in the next envelope",
                            (unsigned long long)kd);
            cp_v8src.dropped_windows += kd;
        }
        cp_v8_captures_tick();
        cp_v8_heap_schedule_tick();
        if (o->exit_when_gone && gone) {
            cp_log_info("v8: every inspector is gone: stopping");
            break;
        }
        cp_v8_inspector_service();
    }
    /* the last window of every isolate still attached */
    for (int i = 0; i < cp_v8src.nhosts; i++)
        cp_v8_flush_lost(&cp_v8src.hosts[i]);
    cp_v8_windows_end(NULL, 1);
    for (int i = 0; i < cp_v8src.nhosts; i++)
        for (conn *c = cp_v8src.hosts[i].conns; c; c = c->next)
            for (session *s = c->sessions; s; s = s->next)
                if (cp_v8_session_running(s) || s->state == SESSION_LOST) {
                    cp_v8_session_report(s);
                    if (cp_v8_session_running(s))
                        cp_v8_session_set(s, SESSION_DONE, "the source stops");
                }
    for (int i = 0; i < cp_v8src.nhosts; i++)
        cp_v8_flush_lost(&cp_v8src.hosts[i]);
    cp_v8_captures_close();
    cp_v8src.dropped_windows += cp_sink_destroy(cp_v8src.sink, 5 * (int64_t)1000000000);
    cp_v8src.sink = NULL;
    if (cp_v8src.dropped_windows)
        cp_log_warn("v8: %llu windows lost and not reported in any envelope (isolates gone "
                    "for good, transport)",
                    (unsigned long long)cp_v8src.dropped_windows);
    cp_v8_inspector_close(); /* its callbacks still see the connections */
    for (int i = 0; i < cp_v8src.nhosts; i++)
        while (cp_v8src.hosts[i].conns) {
            conn *c = cp_v8src.hosts[i].conns;
            cp_v8src.hosts[i].conns = c->next;
            cp_v8_conn_free(c);
        }
    return 0;
}
