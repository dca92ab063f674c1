/* GET /api/v1/brokers over a plain TCP socket, bounded in time and size. */
#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int wait_fd(int fd, short ev, long long deadline)
{
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0) return -1;
        struct pollfd p = {.fd = fd, .events = ev};
        int rc = poll(&p, 1, (int)left);
        if (rc > 0) return 0;
        if (rc < 0 && errno != EINTR) return -1;
        if (rc == 0) return -1;
    }
}

static int connect_to(const char *host, const char *port, long long deadline)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) == 0) {
            int e = 0;
            socklen_t l = sizeof(e);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l) == 0 && e == 0) break;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

int cp_http_get_brokers(const char *url, const char *token, char *out, size_t cap, int timeout_ms)
{
    long long deadline = now_ms() + timeout_ms;
    if (strncmp(url, "http://", 7) != 0) return CP_EIO;
    const char *h = url + 7;
    size_t hl = strcspn(h, "/");
    char hostport[256], host[256], port[16] = "80";
    if (hl == 0 || hl >= sizeof(hostport)) return CP_EIO;
    memcpy(hostport, h, hl);
    hostport[hl] = 0;
    const char *prefix = h + hl;
    size_t pl = strlen(prefix);
    while (pl > 0 && prefix[pl - 1] == '/')
        pl--;
    char *colon = strrchr(hostport, ':');
    if (colon && !strchr(colon, ']')) {
        *colon = 0;
        snprintf(port, sizeof(port), "%s", colon + 1);
    }
    snprintf(host, sizeof(host), "%s", hostport);
    if (host[0] == '[') { /* [v6]:port */
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = 0;
    }
    int fd = connect_to(host, port, deadline);
    if (fd < 0) return CP_EIO;
    char req[1536];
    int n = snprintf(req, sizeof(req),
                     "GET %.*s/api/v1/brokers HTTP/1.1\r\nHost: %s\r\nAccept: application/json"
                     "\r\n%s%.256s%sConnection: close\r\n\r\n",
                     (int)pl, prefix, hostport, token && *token ? "Authorization: Bearer " : "",
                     token && *token ? token : "", token && *token ? "\r\n" : "");
    if (n < 0 || n >= (int)sizeof(req)) {
        close(fd);
        return CP_EIO;
    }
    int off = 0;
    while (off < n) {
        if (wait_fd(fd, POLLOUT, deadline) != 0) goto io;
        ssize_t w = send(fd, req + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w < 0 && errno != EINTR && errno != EAGAIN) goto io;
        if (w > 0) off += (int)w;
    }
    char resp[16384];
    size_t len = 0;
    for (;;) {
        if (len == sizeof(resp) - 1) break;
        if (wait_fd(fd, POLLIN, deadline) != 0) goto io;
        ssize_t r = recv(fd, resp + len, sizeof(resp) - 1 - len, 0);
        if (r == 0) break;
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            goto io;
        }
        len += (size_t)r;
    }
    close(fd);
    resp[len] = 0;
    int status = 0;
    if (sscanf(resp, "HTTP/1.%*d %d", &status) != 1 || status != 200) return CP_EIO;
    const char *body = strstr(resp, "\r\n\r\n");
    if (!body) return CP_EPARSE;
    const char *k = strstr(body, "\"brokers\"");
    if (!k) return CP_EPARSE;
    k += 9;
    while (*k == ' ' || *k == ':' || *k == '\t' || *k == '\r' || *k == '\n')
        k++;
    if (*k != '"') return CP_EPARSE;
    k++;
    size_t o = 0;
    while (*k && *k != '"') {
        if (*k == '\\' && k[1]) k++;
        if (o + 1 >= cap) return CP_EPARSE;
        out[o++] = *k++;
    }
    if (*k != '"' || o == 0) return CP_EPARSE;
    out[o] = 0;
    return 0;
io:
    close(fd);
    return CP_EIO;
}
