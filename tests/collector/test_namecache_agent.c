/* The host's name cache with real programs (collector/relay/README.md "Names"): a real relay
 * (in this process, on its socket), cpsym under the agent handing it windows and writing
 * them to files too. The first process names its frames from the objects and asks the relay
 * for their names files; the next one names them from the files (names_from_cache in its
 * comments) and every name equals what a process with the cache off gives. A damaged,
 * truncated, foreign or linked file, and a names directory others may write, leave the
 * names as they were without the cache. */
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "elfnames.h"
#include "namecache.h"
#include "pfiles.h"
#include "proc.h"
#include "relay.h"
#include "relayd.h"
#include "test.h"

static char g_dir[128], g_rdir[200], g_names[260];
static cp_relay *g_relay;

static char g_found[4096];
static int find_obj(struct dl_phdr_info *info, size_t size, void *part)
{
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, part)) {
        snprintf(g_found, sizeof g_found, "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

/* The names file's path of the object at path (with the debug directory, as by default). */
static void key_path(const char *path, char *out, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    uint8_t id[CP_NAMECACHE_ID_MAX];
    uint32_t len = 0;
    CHECK_EQ(cp_namecache_file_build_id(fd, (uint64_t)st.st_size, id, &len), 0);
    close(fd);
    char key[CP_NAMECACHE_KEY_MAX];
    CHECK_EQ(cp_namecache_key(id, len, CP_NAMECACHE_DEBUG, key), 0);
    snprintf(out, cap, "%s/%s", g_names, key);
}

static void relay_up(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cp-namecache-agent-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", g_dir, g_dir);
    CHECK(system(cmd) == 0);
    snprintf(g_rdir, sizeof g_rdir, "%s/r", g_dir);
    snprintf(g_names, sizeof g_names, "%s/names", g_rdir);
    cp_relay_options o = {.dir = g_rdir};
    cp_err err = {0};
    CHECK_EQ(cp_relay_create(&o, &g_relay, &err), 0);
    CHECK_EQ(cp_relay_start(g_relay, &err), 0);
}

static void relay_down(void)
{
    cp_relay_destroy(g_relay, 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
}

/* What one process named: "build id+offset in file=name" for every location of its CPU
 * profiles in a mapping with a build id, sorted; and its names_from_cache (-1: none). */
typedef struct named {
    char **v;
    int n;
    long long from_cache, read; /* the agent's names_from_cache= and names_read= */
} named;

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs cpsym qsort under the agent (extra: one more "K=V", or NULL) with the relay and an
 * output directory; stderr into DIR/err. */
static void run(const char *extra, named *out)
{
    char outdir[300], env_out[320], env_relay[300], errf[300];
    snprintf(outdir, sizeof outdir, "%s/out", g_dir);
    snprintf(errf, sizeof errf, "%s/err", g_dir);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir %s", outdir, outdir);
    CHECK(system(cmd) == 0);
    snprintf(env_out, sizeof env_out, "CONTPROF_OUTPUT_DIR=%s", outdir);
    snprintf(env_relay, sizeof env_relay, "CONTPROF_RELAY=%s", g_rdir);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0 || dup2(fd, 1) < 0) _exit(126);
        char *env[] = {"LD_PRELOAD=" CP_LIB,     env_out,       env_relay, "CONTPROF_CPU_HZ=1000",
                       "CONTPROF_SERVICE=names", (char *)extra, NULL};
        char *argv[] = {CPSYM, "qsort", "0.6", NULL};
        execve(CPSYM, argv, env);
        _exit(127);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pset s;
    pset_load(outdir, &s);
    CHECK(s.n > 0);
    memset(out, 0, sizeof(*out));
    out->from_cache = out->read = -1;
    for (int i = 0; i < s.n; i++) {
        const cp_profile *p = s.f[i].p;
        for (uint32_t c = 0; c < p->comments.n; c++) {
            const char *k = strstr(cp_profile_str(p, p->comments.v[c]), "names_from_cache=");
            if (k && sscanf(k, "names_from_cache=%lld names_read=%lld", &out->from_cache,
                            &out->read) != 2)
                CHECK(0);
        }
        if (strcmp(s.f[i].kind, "cpu")) continue;
        for (uint32_t l = 1; l <= p->locations.n; l++) {
            const cp_location *loc = &p->locations.v[l - 1];
            if (!loc->mapping_id) continue;
            const cp_mapping *m = &p->mappings.v[loc->mapping_id - 1];
            const char *bid = cp_profile_str(p, m->build_id);
            if (!*bid) continue;
            char line[1200];
            snprintf(line, sizeof line, "%s+%llx=%s", bid,
                     (unsigned long long)(loc->address - m->start + m->offset), loc_func(p, l));
            out->v = realloc(out->v, (size_t)(out->n + 1) * sizeof(char *));
            CHECK(out->v);
            out->v[out->n++] = strdup(line);
        }
    }
    pset_free(&s);
    qsort(out->v, (size_t)out->n, sizeof(char *), str_cmp);
}

static void named_free(named *x)
{
    for (int i = 0; i < x->n; i++)
        free(x->v[i]);
    free(x->v);
}

/* Every address both processes named has the same name in both; returns how many, and
 * how many of them had a name at all. */
static int same_names(const named *a, const named *b, int *with_name)
{
    int common = 0;
    *with_name = 0;
    for (int i = 0; i < a->n; i++) {
        const char *eq = strchr(a->v[i], '=');
        for (int j = 0; j < b->n; j++) {
            const char *eq2 = strchr(b->v[j], '=');
            if (eq - a->v[i] != eq2 - b->v[j] || strncmp(a->v[i], b->v[j], (size_t)(eq - a->v[i])))
                continue;
            if (strcmp(eq, eq2) != 0) {
                fprintf(stderr, "named differently: %s / %s\n", a->v[i], b->v[j]);
                CHECK(0);
            }
            common++;
            *with_name += eq[1] != 0;
            break;
        }
    }
    return common;
}

/* Does any location carry fn? */
static int has_name(const named *a, const char *fn)
{
    for (int i = 0; i < a->n; i++)
        if (!strcmp(strchr(a->v[i], '=') + 1, fn)) return 1;
    return 0;
}

/* Asks the relay for the names of CP_LIB (the agent's own frames are in some windows and not
 * others: with its file there, the objects a process reads are cpsym's and libc's only). */
static void cache_agent_lib(void)
{
    char real[4096], key[600];
    CHECK(realpath(CP_LIB, real) != NULL);
    key_path(real, key, sizeof key);
    int fd = open(real, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    cp_relay_names n = {.flags = CP_NAMECACHE_DEBUG};
    uint32_t len = 0;
    CHECK_EQ(cp_namecache_file_build_id(fd, (uint64_t)st.st_size, n.id, &len), 0);
    close(fd);
    n.id_len = (uint8_t)len;
    cp_elfnames *t = NULL;
    CHECK_EQ(cp_elfnames_create(real, n.id, len, CP_NAMECACHE_DEBUG_DIR, &t), 0);
    n.source = (uint8_t)cp_elfnames_source(t);
    cp_elfnames_destroy(t);
    snprintf(n.path, sizeof n.path, "%s", real);
    uint8_t p[CP_RELAY_NAMES_MAX], hdr[CP_RELAY_HEADER];
    size_t pl = cp_relay_names_encode(&n, p);
    CHECK(pl > 0);
    cp_relay_header(hdr, CP_RELAY_NAMES, (uint32_t)pl);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    CHECK(strlen(g_rdir) + 12 < sizeof a.sun_path);
    memcpy(a.sun_path, g_rdir, strlen(g_rdir));
    memcpy(a.sun_path + strlen(g_rdir), "/relay.sock", 12);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(write(s, hdr, sizeof hdr) == (ssize_t)sizeof hdr && write(s, p, pl) == (ssize_t)pl);
    for (int i = 0; i < 1000 && access(key, F_OK) != 0; i++)
        usleep(10000);
    CHECK(access(key, F_OK) == 0);
    close(s);
}

/* Waits up to 10 s for path to be the good file again, good (the relay built it again). */
static void wait_good(const char *path, const cp_buf *good)
{
    for (int i = 0; i < 1000; i++) {
        struct stat st;
        cp_buf b = {0};
        int ok = lstat(path, &st) == 0 && S_ISREG(st.st_mode) &&
                 cp_read_file(path, &b, NULL) == 0 && b.len == good->len &&
                 !memcmp(b.data, good->data, b.len);
        cp_buf_close(&b);
        if (ok) return;
        usleep(10000);
    }
    CHECK(0);
}

/* Writes data as the names file path (a temporary renamed over it, as the relay does). */
static void plant(const char *path, const void *data, size_t len)
{
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.planting", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    CHECK(write(fd, data, len) == (ssize_t)len);
    close(fd);
    CHECK(rename(tmp, path) == 0);
}

/* The first process fills the cache, the second names from it, and both name every address
 * as a process with the cache off does; the relay built cpsym's and libc's files (libc's
 * from its debug file: msort_with_tmp is named). */
TEST(second_process_names_from_the_cache)
{
    relay_up();
    char cpsym_key[600], libc_key[600];
    key_path(CPSYM, cpsym_key, sizeof cpsym_key);
    g_found[0] = 0;
    dl_iterate_phdr(find_obj, "libc.so");
    CHECK(g_found[0] == '/');
    key_path(g_found, libc_key, sizeof libc_key);

    named first, second, off;
    run(NULL, &first);
    CHECK_EQ(first.from_cache, 0); /* nothing cached yet: cpsym and libc read */
    CHECK(first.read >= 2);
    for (int i = 0; i < 1000 && (access(cpsym_key, F_OK) || access(libc_key, F_OK)); i++)
        usleep(10000);
    CHECK(access(cpsym_key, F_OK) == 0);
    CHECK(access(libc_key, F_OK) == 0);
    run(NULL, &second);
    run("CONTPROF_NAMES_CACHE=0", &off);
    printf("first: %d locations; second: %d, names_from_cache=%lld; cache off: %d\n", first.n,
           second.n, second.from_cache, off.n);
    /* cpsym and libc at least; an object only this run sampled (ld.so at start-up, the
     * agent's own library) is read, as it was not cached yet: CI at load read one more */
    CHECK(second.from_cache >= 2);
    CHECK_EQ(off.from_cache, 0);
    CHECK(off.read >= 2);
    CHECK(has_name(&second, "msort_with_tmp") || has_name(&second, "qsort_r"));
    int wn, common = same_names(&second, &off, &wn);
    printf("second / off: %d addresses in common, %d named\n", common, wn);
    CHECK(common >= 5 && wn >= 5);
    common = same_names(&first, &off, &wn);
    CHECK(common >= 5);
    named_free(&first);
    named_free(&second);
    named_free(&off);
    relay_down();
}

/* cpsym's file damaged four ways (truncated, a name offset out of range, libc's file under
 * cpsym's name, a link to a good copy): not used (one object fewer from the cache), names
 * as with the cache off; the relay builds it again when the process asks. A names directory
 * others may write: not used, said on stderr. */
TEST(damaged_or_untrusted_cache_gives_todays_names)
{
    relay_up();
    char cpsym_key[600], libc_key[600];
    key_path(CPSYM, cpsym_key, sizeof cpsym_key);
    g_found[0] = 0;
    dl_iterate_phdr(find_obj, "libc.so");
    key_path(g_found, libc_key, sizeof libc_key);
    named warm, good, off;
    cache_agent_lib();
    run(NULL, &warm);
    for (int i = 0; i < 1000 && (access(cpsym_key, F_OK) || access(libc_key, F_OK)); i++)
        usleep(10000);
    /* every object from the cache; an object only this run sampled (ld.so, at load) is read
     * and its file built for the next run: at most three runs */
    run(NULL, &good);
    for (int i = 0; i < 2 && good.read != 0; i++) {
        named_free(&good);
        usleep(500000);
        run(NULL, &good);
    }
    CHECK(good.from_cache >= 2);
    CHECK_EQ(good.read, 0);
    run("CONTPROF_NAMES_CACHE=0", &off);
    cp_buf cpsym_file = {0}, libc_file = {0};
    CHECK_EQ(cp_read_file(cpsym_key, &cpsym_file, NULL), 0);
    CHECK_EQ(cp_read_file(libc_key, &libc_file, NULL), 0);

    for (int how = 0; how < 4; how++) {
        static const char *what[] = {"truncated", "bad name offset", "libc's file", "a link"};
        if (how == 0) {
            plant(cpsym_key, cpsym_file.data, cpsym_file.len / 2);
        } else if (how == 1) {
            uint8_t *d = malloc(cpsym_file.len);
            CHECK(d);
            memcpy(d, cpsym_file.data, cpsym_file.len);
            uint32_t bad = 0x7fffffff;
            memcpy(d + CP_NAMECACHE_HEADER + 12, &bad, 4);
            plant(cpsym_key, d, cpsym_file.len);
            free(d);
        } else if (how == 2) {
            plant(cpsym_key, libc_file.data, libc_file.len);
        } else {
            char copy[700];
            snprintf(copy, sizeof copy, "%s/good-copy", g_dir);
            plant(copy, cpsym_file.data, cpsym_file.len);
            CHECK(unlink(cpsym_key) == 0);
            CHECK(symlink(copy, cpsym_key) == 0);
        }
        named bad;
        run(NULL, &bad);
        int wn, common = same_names(&bad, &off, &wn);
        printf("%s: names_from_cache=%lld names_read=%lld, %d addresses as with the cache off\n",
               what[how], bad.from_cache, bad.read, common);
        /* cpsym read from its own symbols (and asked of the relay: wait_good below), libc
         * from the cache; an object only this run sampled is read too (not cached yet: a
         * run beside other tests read one more) */
        CHECK(bad.read >= 1);
        CHECK(bad.from_cache >= 1);
        CHECK(common >= 5 && wn >= 5);
        named_free(&bad);
        wait_good(cpsym_key, &cpsym_file); /* the process asked: the relay built it again */
    }

    /* the names directory writable by others */
    CHECK(chmod(g_names, 0777) == 0);
    named open_dir;
    run(NULL, &open_dir);
    CHECK(chmod(g_names, 0755) == 0);
    char errf[300], err[8192];
    snprintf(errf, sizeof errf, "%s/err", g_dir);
    slurp(errf, err, sizeof err);
    CHECK_CONTAINS(err, "names directory");
    CHECK_CONTAINS(err, "writable by its group or others: not used");
    CHECK_EQ(open_dir.from_cache, 0);
    CHECK(open_dir.read >= 2);
    int wn, common = same_names(&open_dir, &off, &wn);
    CHECK(common >= 5 && wn >= 5);
    named_free(&open_dir);
    cp_buf_close(&cpsym_file);
    cp_buf_close(&libc_file);
    named_free(&warm);
    named_free(&good);
    named_free(&off);
    relay_down();
}

TEST_MAIN(T(second_process_names_from_the_cache), T(damaged_or_untrusted_cache_gives_todays_names))
