/* A fake contprofd for the collector's tests: a thread that answers, on a loopback port,
 * GET /api/v1/brokers with the broker list it holds now, GET /api/v1/control/captures with
 * the status and body it holds (404 until set: an older contprofd), after a delay if set,
 * and anything else 404. */
#ifndef CP_TEST_FAKE_CONTPROFD_H
#define CP_TEST_FAKE_CONTPROFD_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test.h"

typedef struct fake_contprofd {
    int fd;
    pthread_t th;
    pthread_mutex_t mu;
    char brokers[256]; /* what GET /api/v1/brokers answers now */
    char last_req[1024];
    int requests;       /* of /api/v1/brokers */
    int control_status; /* what /api/v1/control/captures answers: 0 = 404 */
    char control[4096]; /* its body, control_len bytes */
    size_t control_len;
    int control_delay_ms; /* before answering it */
    int control_requests;
    volatile int stop;
    char url[64]; /* http://127.0.0.1:PORT */
} fake_contprofd;

static inline void *fake_contprofd_serve(void *arg)
{
    fake_contprofd *f = arg;
    while (!f->stop) {
        struct pollfd p = {.fd = f->fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        int c = accept(f->fd, NULL, NULL);
        if (c < 0) continue;
        char req[1024];
        ssize_t n = recv(c, req, sizeof(req) - 1, 0);
        req[n > 0 ? n : 0] = 0;
        pthread_mutex_lock(&f->mu);
        snprintf(f->last_req, sizeof(f->last_req), "%s", req);
        char resp[sizeof(f->control) + 512];
        size_t rl = 0;
        int delay = 0;
        if (strstr(req, "GET /api/v1/brokers")) {
            f->requests++;
            char body[300];
            snprintf(body, sizeof(body), "{\"brokers\": \"%s\"}", f->brokers);
            rl = (size_t)snprintf(resp, sizeof(resp),
                                  "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%s", strlen(body),
                                  body);
        } else if (strstr(req, "GET /api/v1/control/captures") && f->control_status) {
            f->control_requests++;
            delay = f->control_delay_ms;
            rl = (size_t)snprintf(resp, sizeof(resp),
                                  "HTTP/1.1 %d X\r\nContent-Type: application/octet-stream\r\n"
                                  "Content-Length: %zu\r\n\r\n",
                                  f->control_status, f->control_len);
            memcpy(resp + rl, f->control, f->control_len);
            rl += f->control_len;
        } else {
            if (strstr(req, "GET /api/v1/control/captures")) f->control_requests++;
            rl = (size_t)snprintf(resp, sizeof(resp),
                                  "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        }
        pthread_mutex_unlock(&f->mu);
        if (delay) usleep((useconds_t)delay * 1000);
        if (send(c, resp, rl, MSG_NOSIGNAL) < 0) perror("send");
        close(c);
    }
    return NULL;
}

/* Starts f answering brokers; f->url is where. */
static inline void fake_contprofd_start(fake_contprofd *f, const char *brokers)
{
    memset(f, 0, sizeof(*f));
    pthread_mutex_init(&f->mu, NULL);
    snprintf(f->brokers, sizeof(f->brokers), "%s", brokers);
    f->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(f->fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    socklen_t l = sizeof(a);
    CHECK(getsockname(f->fd, (struct sockaddr *)&a, &l) == 0);
    CHECK(listen(f->fd, 8) == 0);
    CHECK(pthread_create(&f->th, NULL, fake_contprofd_serve, f) == 0);
    snprintf(f->url, sizeof(f->url), "http://127.0.0.1:%d", ntohs(a.sin_port));
}

/* Answers brokers from now on; returns how many requests came before. */
static inline int fake_contprofd_move(fake_contprofd *f, const char *brokers)
{
    pthread_mutex_lock(&f->mu);
    snprintf(f->brokers, sizeof(f->brokers), "%s", brokers);
    int n = f->requests;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* Answers /api/v1/control/captures with status and body[0..len) from now on, after
 * delay_ms; returns how many requests of it came before. */
static inline int fake_contprofd_control(fake_contprofd *f, int status, const void *body,
                                         size_t len, int delay_ms)
{
    CHECK(len <= sizeof(f->control));
    pthread_mutex_lock(&f->mu);
    f->control_status = status;
    if (len) memcpy(f->control, body, len);
    f->control_len = len;
    f->control_delay_ms = delay_ms;
    int n = f->control_requests;
    pthread_mutex_unlock(&f->mu);
    return n;
}

static inline void fake_contprofd_stop(fake_contprofd *f)
{
    f->stop = 1;
    pthread_join(f->th, NULL);
    close(f->fd);
}

#endif
