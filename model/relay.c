/* The relay's frames and its spool directory (relay.h). */
#include "relay.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

void cp_relay_header(uint8_t hdr[CP_RELAY_HEADER], uint8_t type, uint32_t payload_len)
{
    uint32_t n = payload_len + 1;
    hdr[0] = (uint8_t)(n >> 24);
    hdr[1] = (uint8_t)(n >> 16);
    hdr[2] = (uint8_t)(n >> 8);
    hdr[3] = (uint8_t)n;
    hdr[4] = type;
}

int cp_relay_parse_header(const uint8_t hdr[CP_RELAY_HEADER], uint32_t max, uint8_t *type,
                          uint32_t *payload_len, cp_err *err)
{
    uint32_t n = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (n == 0) return cp_err_set(err, CP_EINVAL, "relay frame: length 0 (no type byte)");
    if (n - 1 > max)
        return cp_err_set(err, CP_EINVAL, "relay frame: payload of %u bytes, over the %u allowed",
                          n - 1, max);
    uint8_t t = hdr[4];
    if (t != CP_RELAY_ENVELOPE && t != CP_RELAY_ACK && t != CP_RELAY_CAPTURES &&
        t != CP_RELAY_LIST && t != CP_RELAY_NAMES)
        return cp_err_set(err, CP_EINVAL, "relay frame: unknown type 0x%02x", t);
    *type = t;
    *payload_len = n - 1;
    return 0;
}

size_t cp_relay_names_encode(const cp_relay_names *n, uint8_t *out)
{
    size_t pl = strnlen(n->path, sizeof(n->path));
    if (n->id_len < 2 || n->id_len > CP_RELAY_NAMES_ID_MAX || pl < 2 ||
        pl > CP_RELAY_NAMES_PATH_MAX || n->path[0] != '/' || n->flags > 1)
        return 0;
    out[0] = n->flags;
    out[1] = n->source;
    out[2] = n->id_len;
    memcpy(out + 3, n->id, n->id_len);
    memcpy(out + 3 + n->id_len, n->path, pl);
    return 3 + n->id_len + pl;
}

int cp_relay_names_parse(const uint8_t *p, size_t len, cp_relay_names *n, cp_err *err)
{
    memset(n, 0, sizeof(*n));
    if (len < 3) return cp_err_set(err, CP_EINVAL, "names frame: %zu bytes, under its header", len);
    if (p[0] > 1) return cp_err_set(err, CP_EINVAL, "names frame: unknown flags 0x%02x", p[0]);
    if (p[2] < 2 || p[2] > CP_RELAY_NAMES_ID_MAX || (size_t)3 + p[2] > len)
        return cp_err_set(err, CP_EINVAL,
                          "names frame: build id of %u bytes (2..%u, inside the frame)", p[2],
                          CP_RELAY_NAMES_ID_MAX);
    size_t pl = len - 3 - p[2];
    const uint8_t *path = p + 3 + p[2];
    if (pl < 2 || pl > CP_RELAY_NAMES_PATH_MAX)
        return cp_err_set(err, CP_EINVAL, "names frame: path of %zu bytes (2..%u)", pl,
                          CP_RELAY_NAMES_PATH_MAX);
    if (path[0] != '/') return cp_err_set(err, CP_EINVAL, "names frame: path not absolute");
    if (memchr(path, 0, pl)) return cp_err_set(err, CP_EINVAL, "names frame: path holds a NUL");
    n->flags = p[0];
    n->source = p[1];
    n->id_len = p[2];
    memcpy(n->id, p + 3, p[2]);
    memcpy(n->path, path, pl);
    n->path[pl] = 0;
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sends or receives len bytes on the non-blocking fd by deadline (CLOCK_MONOTONIC ms). */
static int io_all(int fd, uint8_t *p, size_t len, int sending, int64_t deadline)
{
    while (len > 0) {
        ssize_t n = sending ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return -1;
        int64_t left = deadline - now_ms();
        struct pollfd pf = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
        if (left <= 0 || poll(&pf, 1, (int)left) < 0) return -1;
    }
    return 0;
}

int cp_relay_listening(const char *dir)
{
    char path[1100];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, CP_RELAY_SOCKET);
    return stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

int cp_relay_get_captures(const char *dir, int timeout_ms, cp_buf *out, cp_err *err)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(a.sun_path, sizeof(a.sun_path), "%s/%s", dir, CP_RELAY_SOCKET) >=
        sizeof(a.sun_path))
        return cp_err_set(err, CP_EIO, "relay %s: path too long", dir);
    int64_t deadline = now_ms() + timeout_ms;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return cp_err_set(err, CP_EIO, "relay %s: socket: %s", dir, strerror(errno));
    uint8_t hdr[CP_RELAY_HEADER];
    cp_relay_header(hdr, CP_RELAY_CAPTURES, 0);
    uint8_t type = 0;
    uint32_t len = 0;
    int rc = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
        rc = cp_err_set(err, CP_EIO, "relay %s: %s", a.sun_path, strerror(errno));
    else if (io_all(fd, hdr, sizeof(hdr), 1, deadline) || io_all(fd, hdr, sizeof(hdr), 0, deadline))
        rc = cp_err_set(err, CP_EIO, "relay %s: no answer within %d ms", a.sun_path, timeout_ms);
    else if (cp_relay_parse_header(hdr, 1u << 20, &type, &len, err) || type != CP_RELAY_LIST)
        rc = cp_err_set(err, CP_EIO, "relay %s: a malformed answer to a capture request", dir);
    else if (cp_buf_reserve(out, len))
        rc = cp_err_set(err, CP_ENOMEM, "relay %s: out of memory", dir);
    else if (io_all(fd, out->data + out->len, len, 0, deadline))
        rc = cp_err_set(err, CP_EIO, "relay %s: the capture list was cut short", dir);
    else
        out->len += len;
    close(fd);
    return rc;
}

/* ------------------------------------------------------------------------------------
 * The spool */

/* What makes a directory safe to write into or read from: a real directory (not a link:
 * opened O_NOFOLLOW), owned by root or by us, and if others may write into it, sticky (so
 * that they cannot remove or replace our files). */
static int dir_check(int fd, const char *path, cp_err *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return cp_err_set(err, CP_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return cp_err_set(err, CP_EIO, "%s: not a directory", path);
    if (st.st_uid != 0 && st.st_uid != geteuid())
        return cp_err_set(err, CP_EIO, "%s: owned by uid %u, neither root nor us (uid %u)", path,
                          (unsigned)st.st_uid, (unsigned)geteuid());
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
        return cp_err_set(err, CP_EIO, "%s: writable by others without the sticky bit (mode %o)",
                          path, (unsigned)(st.st_mode & 07777));
    return 0;
}

static int open_dir(const char *path, cp_err *err, int *out)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return cp_err_set(err, CP_EIO, "%s: %s", path,
                          errno == ELOOP || errno == ENOTDIR ? "a symbolic link or not a directory"
                                                             : strerror(errno));
    int rc = dir_check(fd, path, err);
    if (rc) {
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

int cp_spool_open(const char *dir, int create, int *dfd, cp_err *err)
{
    *dfd = -1;
    char path[1024];
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, CP_RELAY_SPOOL) >= sizeof(path))
        return cp_err_set(err, CP_EIO, "relay directory %.64s...: path too long", dir);
    if (create) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return cp_err_set(err, CP_EIO, "%s: %s", dir, strerror(errno));
        int top;
        int rc = open_dir(dir, err, &top);
        if (rc) return rc;
        /* 01733: any user's process may add a file, only the relay lists and removes
         * (the umask is bypassed by the fchmod) */
        if (mkdirat(top, CP_RELAY_SPOOL, 01733) == 0) {
            int s = openat(top, CP_RELAY_SPOOL, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (s >= 0) {
                fchmod(s, 01733);
                close(s);
            }
        } else if (errno != EEXIST) {
            close(top);
            return cp_err_set(err, CP_EIO, "%s: %s", path, strerror(errno));
        }
        close(top);
    }
    return open_dir(path, err, dfd);
}

static uint64_t rnd64(void)
{
    static _Thread_local uint64_t s;
    if (!s) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^
            (uint64_t)(uintptr_t)&s;
        if (!s) s = 1;
    }
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
}

/* The file system holding the spool keeps room for everything else on it. */
static int room_left(int dfd)
{
    struct statvfs v;
    if (fstatvfs(dfd, &v) != 0) return 1; /* cannot tell: the write itself will say */
    uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize, total = (uint64_t)v.f_blocks * v.f_frsize;
    return avail >= ((uint64_t)64 << 20) && avail >= total / 100;
}

/* Writes data as a new spool file SLOT.suffix. */
static int spool_file(int dfd, const uint8_t *data, size_t len, const char *suffix, cp_err *err)
{
    if (len > CP_SPOOL_FILE_MAX)
        return cp_err_set(err, CP_ELIMIT, "spool: %zu bytes, over the %zu a file holds", len,
                          CP_SPOOL_FILE_MAX);
    if (!room_left(dfd))
        return cp_err_set(err, CP_ELIMIT, "spool: its file system has under 1%% or 64 MiB free");
    char tmp[64];
    snprintf(tmp, sizeof(tmp), ".tmp-%d-%016llx", (int)getpid(), (unsigned long long)rnd64());
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return cp_err_set(err, CP_EIO, "spool: %s: %s", tmp, strerror(errno));
    int e = cp_write_all(fd, data, len);
    close(fd);
    if (e) {
        unlinkat(dfd, tmp, 0);
        return cp_err_set(err, CP_EIO, "spool: writing %s: %s", tmp, strerror(e));
    }
    /* A few random slots: a full spool (or nearly) refuses rather than scanning it. */
    for (int attempt = 0; attempt < 8; attempt++) {
        char name[16];
        snprintf(name, sizeof(name), "%04x.%s", (unsigned)(rnd64() % CP_SPOOL_SLOTS), suffix);
        if (renameat2(dfd, tmp, dfd, name, RENAME_NOREPLACE) == 0) return 0;
        if (errno == EEXIST) continue;
        if (errno != EINVAL && errno != ENOSYS) break;
        /* no RENAME_NOREPLACE here: link() refuses an existing name too */
        if (linkat(dfd, tmp, dfd, name, 0) == 0) {
            unlinkat(dfd, tmp, 0);
            return 0;
        }
        if (errno != EEXIST) break;
    }
    e = errno;
    unlinkat(dfd, tmp, 0);
    if (e == EEXIST)
        return cp_err_set(err, CP_ELIMIT, "spool: full (no free slot of %u found)", CP_SPOOL_SLOTS);
    return cp_err_set(err, CP_EIO, "spool: %s", strerror(e));
}

int cp_spool_write(int dfd, const uint8_t *data, size_t len, cp_err *err)
{
    return spool_file(dfd, data, len, "env", err);
}

int cp_spool_write_batch(int dfd, const cp_buf *batch, cp_err *err)
{
    return spool_file(dfd, batch->data, batch->len, "envs", err);
}

int cp_spool_batch_add(cp_buf *batch, const uint8_t *env, size_t len)
{
    if (len == 0 || len > CP_SPOOL_FILE_MAX - 4 || batch->len > CP_SPOOL_FILE_MAX - 4 - len)
        return CP_ELIMIT;
    uint8_t n[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), (uint8_t)(len >> 24)};
    if (cp_buf_reserve(batch, 4 + len) != 0) return CP_ENOMEM;
    cp_buf_append(batch, n, 4);
    cp_buf_append(batch, env, len);
    return 0;
}

int cp_spool_batch_next(const uint8_t *p, size_t n, size_t *off, const uint8_t **env, size_t *len)
{
    if (*off == n) return 0;
    if (*off > n || n - *off < 4) return CP_EPARSE;
    const uint8_t *h = p + *off;
    size_t l = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
    if (l == 0 || l > n - *off - 4) return CP_EPARSE;
    *env = h + 4;
    *len = l;
    *off += 4 + l;
    return 1;
}

static int entry_cmp(const void *a, const void *b)
{
    const cp_spool_entry *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* 1: SLOT.env, 2: SLOT.envs (a batch), 0: not a spool file's name. */
static int slot_name(const char *n)
{
    size_t l = strlen(n);
    if ((l != 8 || strcmp(n + 4, ".env") != 0) && (l != 9 || strcmp(n + 4, ".envs") != 0)) return 0;
    for (int i = 0; i < 4; i++)
        if (!strchr("0123456789abcdef", n[i])) return 0;
    return l == 8 ? 1 : 2;
}

int cp_spool_list(int dfd, cp_spool_entry *out, size_t cap, size_t *n, cp_err *err)
{
    *n = 0;
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return cp_err_set(err, CP_EIO, "spool: listing: %s", strerror(errno));
    }
    rewinddir(d);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        struct stat st;
        int tmp = !strncmp(de->d_name, ".tmp-", 5), kind = tmp ? 0 : slot_name(de->d_name);
        if (!tmp && !kind) continue;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        int64_t mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        if (tmp) {
            if (now.tv_sec - st.st_mtim.tv_sec > 60) unlinkat(dfd, de->d_name, 0);
            continue;
        }
        /* a slot name is 8 or 9 bytes (slot_name), the entry's name holds 16 */
        if (*n < cap) {
            memcpy(out[*n].name, de->d_name, 10);
            out[*n].mtime_ns = mt;
            out[*n].batch = kind == 2;
            (*n)++;
        } else {
            /* keep the cap oldest: replace the newest kept if this one is older */
            size_t newest = 0;
            for (size_t i = 1; i < cap; i++)
                if (out[i].mtime_ns > out[newest].mtime_ns) newest = i;
            if (cap && mt < out[newest].mtime_ns) {
                memcpy(out[newest].name, de->d_name, 10);
                out[newest].mtime_ns = mt;
                out[newest].batch = kind == 2;
            }
        }
    }
    closedir(d);
    qsort(out, *n, sizeof(*out), entry_cmp);
    return 0;
}

int cp_spool_take(int dfd, const char *name, cp_buf *out, cp_err *err)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP) {
            unlinkat(dfd, name, 0);
            return cp_err_set(err, CP_EINVAL, "spool: %s is a symbolic link: removed", name);
        }
        return cp_err_set(err, CP_EIO, "spool: %s: %s", name, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > CP_SPOOL_FILE_MAX) {
        close(fd);
        unlinkat(dfd, name, 0);
        return cp_err_set(err, CP_EINVAL,
                          "spool: %s is not a regular file of at most %zu bytes: removed", name,
                          CP_SPOOL_FILE_MAX);
    }
    size_t len = (size_t)st.st_size;
    if (cp_buf_reserve(out, len) != 0) {
        close(fd);
        return cp_err_set(err, CP_ENOMEM, "spool: %s: out of memory for %zu bytes", name, len);
    }
    size_t off = 0;
    while (off < len) {
        ssize_t r = read(fd, out->data + out->len + off, len - off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        off += (size_t)r;
    }
    close(fd);
    if (off < len) return cp_err_set(err, CP_EIO, "spool: %s: short read", name);
    out->len += len;
    unlinkat(dfd, name, 0);
    return 0;
}
