/* `contprof relay`: the per-host relay run alone (collector/relay/README.md), for hosts
 * without contprofd; configs/contprof-relay.service runs it under systemd. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "log.h"
#include "relayd.h"

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: contprof relay --dir DIR (--server URL | --brokers LIST) [--token T]\n"
               "         [--sign] [--topic T] [--queue N]\n"
               "  --dir DIR       relay.sock and spool/ (processes: CONTPROF_RELAY=DIR)\n"
               "  --server URL    contprofd: asked for its brokers and the capture list\n"
               "  --brokers LIST  Kafka bootstrap servers (instead of asking --server)\n"
               "  --token T       contprofd's bearer token (or CONTPROF_TOKEN)\n"
               "  --sign          sign envelopes that arrive unsigned with --token\n"
               "  --queue N       envelopes held for Kafka before the spool (default 10000)\n"
               "example:\n"
               "  contprof relay --dir /run/contprof --server http://contprof.internal:7070\n");
    return rc;
}

static volatile sig_atomic_t g_stop;

static void on_stop(int sig)
{
    (void)sig;
    g_stop = 1;
}

int cp_cmd_relay(int argc, char **argv)
{
    static const struct option opts[] = {{"dir", required_argument, 0, 'd'},
                                         {"server", required_argument, 0, 's'},
                                         {"brokers", required_argument, 0, 'b'},
                                         {"token", required_argument, 0, 't'},
                                         {"sign", no_argument, 0, 'S'},
                                         {"topic", required_argument, 0, 'T'},
                                         {"queue", required_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    cp_relay_options o = {.token = getenv("CONTPROF_TOKEN")};
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'd':
            o.dir = optarg;
            break;
        case 's':
            o.server = optarg;
            break;
        case 'b':
            o.brokers = optarg;
            break;
        case 't':
            o.token = optarg;
            break;
        case 'S':
            o.sign = 1;
            break;
        case 'T':
            o.topic = optarg;
            break;
        case 'q': {
            char *end;
            long q = strtol(optarg, &end, 10);
            if (*end || q < 2 || q > 1000000) {
                fprintf(stderr, "contprof relay: --queue %s: expected 2 to 1000000\n", optarg);
                return 2;
            }
            o.queue = (int)q;
            break;
        }
        case 'h':
            return usage(stdout, 0);
        default:
            return usage(stderr, 2);
        }
    }
    if (!o.dir || (!o.server && !o.brokers)) {
        fprintf(stderr, "contprof relay: --dir and one of --server or --brokers are needed\n");
        return usage(stderr, 2);
    }
    if (o.sign && !(o.token && *o.token)) {
        fprintf(stderr, "contprof relay: --sign needs --token (or CONTPROF_TOKEN)\n");
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_stop};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    cp_relay *r = NULL;
    cp_err err = {0};
    if (cp_relay_create(&o, &r, &err) != 0 || cp_relay_start(r, &err) != 0) {
        fprintf(stderr, "contprof relay: %s\n", err.msg);
        cp_relay_destroy(r, 0);
        return 1;
    }
    cp_log_info("relay at %s (CONTPROF_RELAY=%s), to %s", o.dir, o.dir,
                o.brokers ? o.brokers : o.server);
    /* The counters, once a minute when they moved: a relay alone has no /metrics. */
    cp_relay_stats last = {0};
    for (int tick = 0; !g_stop; tick++) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
        if (tick % 600 != 599) continue;
        cp_relay_stats st;
        cp_relay_get_stats(r, &st);
        if (!memcmp(&st, &last, sizeof(st))) continue;
        last = st;
        cp_log_info("relay: %llu connections, %llu envelopes taken, %llu delivered, %llu spooled, "
                    "%llu drained, %llu refused, %llu lost, %lld pending; names files %llu built, "
                    "%llu refused, %llu evicted",
                    (unsigned long long)st.connections, (unsigned long long)st.accepted,
                    (unsigned long long)st.delivered, (unsigned long long)st.spooled,
                    (unsigned long long)st.drained, (unsigned long long)st.refused,
                    (unsigned long long)st.lost, (long long)st.pending,
                    (unsigned long long)st.names_built, (unsigned long long)st.names_refused,
                    (unsigned long long)st.names_evicted);
    }
    cp_relay_stats st;
    cp_relay_get_stats(r, &st);
    cp_log_info("relay: stopping after %llu envelopes taken, %llu lost; Kafka gets 5 s, the "
                "rest goes to the spool",
                (unsigned long long)st.accepted, (unsigned long long)st.lost);
    cp_relay_destroy(r, 5 * (int64_t)1000000000);
    return 0;
}
