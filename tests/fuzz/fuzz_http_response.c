/* libFuzzer target: the HTTP client's response reader (model/http_client.c) over a real
 * loopback connection. A server thread answers each request with the input, cut into
 * writes of 1-8 bytes (the first byte picks the size) so that every state of the reader
 * meets a boundary. The client must answer within its deadline, never read outside its
 * buffers, and on success hand back a NUL-terminated body within the limit; on failure no
 * body. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http_client.h"

#define MAX_BODY 4096

static int g_listen = -1, g_port;
static const uint8_t *g_data;
static size_t g_size;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_served; /* responses sent, for the caller to wait on */

static void *serve(void *arg)
{
    (void)arg;
    for (;;) {
        int c = accept(g_listen, NULL, NULL);
        if (c < 0) continue;
        char req[4096];
        size_t got = 0;
        while (got < sizeof req - 1) { /* the request, up to its blank line */
            ssize_t n = recv(c, req + got, sizeof req - 1 - got, 0);
            if (n <= 0) break;
            got += (size_t)n;
            req[got] = 0;
            if (strstr(req, "\r\n\r\n")) break;
        }
        size_t step = g_size ? (size_t)(g_data[0] & 7) + 1 : 1;
        for (size_t o = 0; o < g_size; o += step) {
            size_t n = g_size - o < step ? g_size - o : step;
            if (send(c, g_data + o, n, MSG_NOSIGNAL) < 0) break;
        }
        close(c);
        pthread_mutex_lock(&g_mu);
        g_served++;
        pthread_cond_broadcast(&g_cv);
        pthread_mutex_unlock(&g_mu);
    }
    return NULL;
}

static void start(void)
{
    g_listen = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (g_listen < 0 || bind(g_listen, (struct sockaddr *)&a, sizeof a) ||
        getsockname(g_listen, (struct sockaddr *)&a, &l) || listen(g_listen, 4))
        abort();
    g_port = ntohs(a.sin_port);
    pthread_t th;
    if (pthread_create(&th, NULL, serve, NULL)) abort();
    pthread_detach(th);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_listen < 0) start();
    pthread_mutex_lock(&g_mu);
    int before = g_served;
    g_data = data;
    g_size = size;
    pthread_mutex_unlock(&g_mu);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", g_port);
    cp_http_result r;
    cp_err err = {0};
    int rc = cp_http_get(url, "/", NULL, 10000, MAX_BODY, &r, &err);
    if (rc == 0) {
        if (!r.body.data || r.body.data[r.body.len] != 0 || r.body.len > MAX_BODY) abort();
        if (r.status < 100 || r.status > 999) abort();
        cp_buf_close(&r.body);
    } else {
        if (r.body.data || !err.msg[0]) abort();
        if (rc != CP_EIO && rc != CP_ELIMIT && rc != CP_ENOMEM) abort();
    }
    /* the server is done with data before the next input replaces it */
    pthread_mutex_lock(&g_mu);
    while (g_served == before)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    return 0;
}
