/* The host's threads and their CPU, from /proc (the parsing is v8conv.c's, pure and
 * fuzzed; here only the reading). */
#include "v8cpu.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "v8conv.h"

/* Reads at most cap - 1 bytes of path into buf (NUL-terminated); 0 or -1. */
static int read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return n ? 0 : -1;
}

static uint64_t listening_inode(unsigned port)
{
    static const char *const files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    char line[512];
    uint64_t ino = 0;
    for (int i = 0; i < 2 && !ino; i++) {
        FILE *f = fopen(files[i], "re");
        if (!f) continue;
        while (!ino && fgets(line, sizeof(line), f))
            (void)cp_v8_tcp_listener(line, port, &ino);
        fclose(f);
    }
    return ino;
}

int cp_v8_listener_pid(unsigned port)
{
    uint64_t ino = listening_inode(port);
    if (!ino) return 0;
    char want[64];
    snprintf(want, sizeof(want), "socket:[%llu]", (unsigned long long)ino);
    DIR *proc = opendir("/proc");
    if (!proc) return 0;
    int found = 0;
    struct dirent *pe;
    while (!found && (pe = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(pe->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char dir[64];
        snprintf(dir, sizeof(dir), "/proc/%ld/fd", pid);
        DIR *fds = opendir(dir); /* another user's: EACCES, skipped */
        if (!fds) continue;
        struct dirent *fe;
        while (!found && (fe = readdir(fds)) != NULL) {
            if (fe->d_name[0] == '.') continue;
            char path[128], link[80];
            snprintf(path, sizeof(path), "%s/%.20s", dir, fe->d_name);
            ssize_t n = readlink(path, link, sizeof(link) - 1);
            if (n <= 0) continue;
            link[n] = 0;
            if (!strcmp(link, want)) found = (int)pid;
        }
        closedir(fds);
    }
    closedir(proc);
    return found;
}

int cp_v8_cpu_ns(int pid, int tid, int64_t *ns)
{
    char path[96], text[1024];
    if (tid > 0)
        snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", pid, tid);
    else
        snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    if (pid <= 0 || read_small(path, text, sizeof(text)) != 0) return CP_EIO;
    if (tid > 0) return cp_v8_schedstat_ns(text, ns);
    int64_t ticks;
    long hz = sysconf(_SC_CLK_TCK);
    if (cp_v8_stat_ticks(text, &ticks) != 0) return CP_EPARSE;
    *ns = ticks * (1000000000 / (hz > 0 ? hz : 100));
    return 0;
}

size_t cp_v8_sampler_threads(int pid, int *tids, size_t cap)
{
    char path[96], comm[64];
    snprintf(path, sizeof(path), "/proc/%d/task", pid);
    DIR *d = pid > 0 ? opendir(path) : NULL;
    if (!d) return 0;
    size_t n = 0;
    struct dirent *de;
    while (n < cap && (de = readdir(d)) != NULL) {
        char *end;
        long tid = strtol(de->d_name, &end, 10);
        if (*end || tid <= 0) continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%ld/comm", pid, tid);
        if (read_small(path, comm, sizeof(comm)) == 0 && !strcmp(comm, "v8:ProfEvntProc\n"))
            tids[n++] = (int)tid;
    }
    closedir(d);
    return n;
}
