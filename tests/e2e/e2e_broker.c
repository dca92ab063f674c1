/* e2e_broker: contprofd's embedded broker (ingest/broker.c, the same librdkafka mock
 * cluster) hosted in a process of its own, so that the end-to-end test can stop and start
 * contprofd while the broker and what it holds stay up, as a real Kafka would.
 * usage: e2e_broker  -- prints "bootstrap LIST" on stdout, runs until SIGINT/SIGTERM. */
#include <signal.h>
#include <stdio.h>

#include "broker.h"

int main(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    /* blocked before librdkafka starts its threads, so sigwait below receives them */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    cp_broker *b = NULL;
    cp_err err = {0};
    if (cp_broker_create(NULL, &b, &err)) {
        fprintf(stderr, "e2e_broker: %s\n", err.msg);
        return 1;
    }
    printf("bootstrap %s\n", cp_broker_bootstraps(b));
    fflush(stdout);
    int sig;
    sigwait(&set, &sig);
    cp_broker_destroy(b);
    return 0;
}
