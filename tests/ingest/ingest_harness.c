/* A process that ingests from the test's mock cluster into a store until it has caught up:
 * the SIGKILL test starts it again and again and kills it at random moments.
 * usage: ingest_harness DIR BOOTSTRAPS
 * Prints "progress" after each committed batch of this run and "done" once caught up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ingest.h"
#include "store.h"

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    cp_store_options so = {.path = argv[1]};
    cp_store *s = NULL;
    cp_err err = {0};
    if (cp_store_open(&so, &s, &err)) {
        fprintf(stderr, "harness: %s\n", err.msg);
        return 1;
    }
    char group[64];
    /* a fresh group per run: offsets live in the store, and a killed member's session
     * need not expire first */
    snprintf(group, sizeof group, "harness-%d", (int)getpid());
    static const char *const props[] = {"session.timeout.ms", "6000", NULL};
    cp_ingest_options o = {.brokers = argv[2],
                           .group_id = group,
                           .kafka_props = props,
                           .batch_max_messages = 16,
                           .batch_max_ms = 20};
    cp_ingest *in = NULL;
    if (cp_ingest_create(&o, s, &in, &err) || cp_ingest_start(in, &err)) {
        fprintf(stderr, "harness: %s\n", err.msg);
        return 1;
    }
    uint64_t last = 0;
    for (int i = 0; i < 6000; i++) {
        cp_ingest_stats st;
        cp_ingest_get_stats(in, &st);
        if (st.failed) {
            fprintf(stderr, "harness: %s\n", st.error);
            return 1;
        }
        if (st.batches > last) {
            last = st.batches;
            printf("progress %llu\n", (unsigned long long)st.windows);
            fflush(stdout);
        }
        if (st.partitions > 0 && st.lag == 0) {
            cp_ingest_destroy(in);
            cp_store_close(s);
            printf("done\n");
            fflush(stdout);
            return 0;
        }
        usleep(5000);
    }
    fprintf(stderr, "harness: did not catch up in 30 s\n");
    return 1;
}
