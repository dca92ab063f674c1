/* The host's name cache (collector/namecache.h, the relay's names/): the file format against
 * elfnames.c's own tables, byte for byte (real objects: this test, libc with its debug
 * file); damaged, truncated and untrusted files refused; and the relay's 'N' frames, a real
 * relay in this process taking them over its socket, the hostile ones refused and counted.
 * In the sanitizer build too (no program runs under the agent here: test_namecache_agent). */
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "elfnames.h"
#include "namecache.h"
#include "relay.h"
#include "relayd.h"
#include "test.h"

static char g_dir[128];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cp-namecache-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", g_dir, g_dir);
    CHECK(system(cmd) == 0);
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "chmod -R u+w %s 2>/dev/null; rm -rf %s", g_dir, g_dir);
    CHECK(system(cmd) == 0);
}

/* The path of the mapped object whose name contains part (libc.so.6). */
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

static const char *libc_path(void)
{
    g_found[0] = 0;
    dl_iterate_phdr(find_obj, "libc.so");
    CHECK(g_found[0] == '/');
    return g_found;
}

/* The build id of the file at path. */
static uint32_t file_id(const char *path, uint8_t *id)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    uint32_t len = 0;
    CHECK_EQ(cp_namecache_file_build_id(fd, (uint64_t)st.st_size, id, &len), 0);
    close(fd);
    return len;
}

/* Every address that matters for t's entries (each start, end - 1, end, the middle, and
 * just below the start) named by the cache file c as by t, byte for byte. Returns how many
 * addresses were compared. */
static uint64_t same_names(const cp_elfnames *t, const cp_namecache *c)
{
    uint64_t compared = 0;
    for (int plt = 0; plt < 2; plt++) {
        uint32_t n = plt ? cp_elfnames_plt_count(t) : cp_elfnames_count(t);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t lo, hi;
            const char *nm;
            size_t len;
            CHECK_EQ(cp_elfnames_entry(t, plt, i, &lo, &hi, &nm, &len), 0);
            uint64_t at[] = {lo, lo - 1, hi - 1, hi, lo + (hi - lo) / 2};
            for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
                size_t l1 = 0, l2 = 0;
                const char *a = cp_elfnames_lookup(t, at[k], &l1);
                const char *b = cp_namecache_lookup(c, at[k], &l2);
                if (!a != !b || (a && (l1 != l2 || memcmp(a, b, l1) != 0))) {
                    fprintf(stderr, "at 0x%llx: elfnames '%.*s', cache '%.*s'\n",
                            (unsigned long long)at[k], a ? (int)l1 : 6, a ? a : "(none)",
                            b ? (int)l2 : 6, b ? b : "(none)");
                    CHECK(0);
                }
                compared++;
            }
        }
    }
    return compared;
}

/* The file for path's table (debug: with the debug directory), checked against the table. */
static void roundtrip(const char *path, unsigned flags, cp_buf *file, uint8_t *id, uint32_t *idl)
{
    *idl = file_id(path, id);
    cp_elfnames *t = NULL;
    CHECK_EQ(cp_elfnames_create(path, id, *idl,
                                (flags & CP_NAMECACHE_DEBUG) ? CP_NAMECACHE_DEBUG_DIR : NULL, &t),
             0);
    *file = (cp_buf){0};
    CHECK_EQ(cp_namecache_encode(t, id, *idl, flags, file), 0);
    cp_namecache c;
    CHECK_EQ(cp_namecache_parse(file->data, file->len, id, *idl, flags, &c), 0);
    CHECK_EQ(c.nfunc, cp_elfnames_count(t));
    CHECK_EQ(c.nplt, cp_elfnames_plt_count(t));
    CHECK_EQ(c.source, cp_elfnames_source(t));
    uint64_t n = same_names(t, &c);
    printf("%s%s: %u functions, %u stubs, %zu bytes, %llu addresses compared (source %d)\n", path,
           flags ? " (debug dir)" : "", c.nfunc, c.nplt, file->len, (unsigned long long)n,
           c.source);
    CHECK(c.nfunc > 100);
    cp_elfnames_destroy(t);
}

/* libc (its debug file's .symtab when libc6-dbg is there, else .dynsym), with and without
 * the debug directory, and this test's own .symtab: the cache names every address as the
 * table does, versions stripped and "func@plt" stubs alike. */
TEST(file_names_like_elfnames_byte_for_byte)
{
    uint8_t id[CP_NAMECACHE_ID_MAX];
    uint32_t idl;
    cp_buf f = {0};
    roundtrip(libc_path(), CP_NAMECACHE_DEBUG, &f, id, &idl);
    cp_buf_close(&f);
    roundtrip(libc_path(), 0, &f, id, &idl);
    cp_buf_close(&f);
    roundtrip("/proc/self/exe", 0, &f, id, &idl);
    cp_buf_close(&f);
}

/* A file damaged in any of its parts is refused as a whole: truncated at any length, a
 * byte of the header changed, another build id or flags, a name offset out of the names,
 * starts out of order, names not ending in a NUL. */
TEST(damaged_files_are_refused_whole)
{
    uint8_t id[CP_NAMECACHE_ID_MAX];
    uint32_t idl;
    cp_buf f = {0};
    roundtrip("/proc/self/exe", 0, &f, id, &idl);
    cp_namecache c;
    for (size_t n = 0; n < f.len; n += n < 256 ? 1 : 61)
        CHECK(cp_namecache_parse(f.data, n, id, idl, 0, &c) != 0);
    CHECK(cp_namecache_parse(f.data, f.len - 1, id, idl, 0, &c) != 0);
    for (size_t i = 0; i < CP_NAMECACHE_HEADER; i++) {
        if (i >= 32 + idl && i < 96) continue; /* the id's zero padding is not read */
        if (i == 14 || i == 15 || (i >= 28 && i < 32)) continue; /* source, padding */
        uint8_t *d = malloc(f.len);
        CHECK(d);
        memcpy(d, f.data, f.len);
        d[i] ^= 0x41;
        if (cp_namecache_parse(d, f.len, id, idl, 0, &c) == 0) {
            fprintf(stderr, "header byte %zu changed: accepted\n", i);
            CHECK(0);
        }
        free(d);
    }
    uint8_t other[CP_NAMECACHE_ID_MAX];
    memcpy(other, id, idl);
    other[0] ^= 1;
    CHECK(cp_namecache_parse(f.data, f.len, other, idl, 0, &c) != 0);
    CHECK(cp_namecache_parse(f.data, f.len, id, idl, CP_NAMECACHE_DEBUG, &c) != 0);
    CHECK(cp_namecache_parse(f.data, f.len, id, idl - 1, 0, &c) != 0);
    /* entry 1's name offset past the names; entry 1's start below entry 0's */
    uint8_t *d = malloc(f.len);
    CHECK(d);
    memcpy(d, f.data, f.len);
    uint32_t bad = 0xfffffff0u;
    memcpy(d + CP_NAMECACHE_HEADER + CP_NAMECACHE_ENTRY + 12, &bad, 4);
    CHECK(cp_namecache_parse(d, f.len, id, idl, 0, &c) != 0);
    memcpy(d, f.data, f.len);
    memcpy(d + CP_NAMECACHE_HEADER + CP_NAMECACHE_ENTRY, d + CP_NAMECACHE_HEADER, 8);
    CHECK(cp_namecache_parse(d, f.len, id, idl, 0, &c) != 0);
    memcpy(d, f.data, f.len);
    d[f.len - 1] = 'x';
    CHECK(cp_namecache_parse(d, f.len, id, idl, 0, &c) != 0);
    memcpy(d, f.data, f.len);
    CHECK_EQ(cp_namecache_parse(d, f.len, id, idl, 0, &c), 0); /* the copy itself is fine */
    free(d);
    char key[CP_NAMECACHE_KEY_MAX];
    CHECK_EQ(cp_namecache_key(id, idl, 0, key), 0);
    CHECK(strstr(key, "-nodebug") != NULL);
    CHECK_EQ(cp_namecache_key(id, idl, CP_NAMECACHE_DEBUG, key), 0);
    CHECK_EQ(strlen(key), 2 * idl);
    CHECK(cp_namecache_key(id, 1, 0, key) != 0);
    cp_buf_close(&f);
}

/* The agent's trust rule on disk: a file in place maps and names; a link in its place, a
 * file others may write, a linked or world-writable directory are refused, naming why. */
TEST(untrusted_files_and_directories_are_refused)
{
    make_dir();
    uint8_t id[CP_NAMECACHE_ID_MAX];
    uint32_t idl;
    cp_buf f = {0};
    roundtrip("/proc/self/exe", 0, &f, id, &idl);
    char names[300], key[CP_NAMECACHE_KEY_MAX], path[600], cmd[2048];
    snprintf(names, sizeof names, "%s/%s", g_dir, CP_NAMECACHE_DIR);
    CHECK(mkdir(names, 0755) == 0);
    CHECK_EQ(cp_namecache_key(id, idl, 0, key), 0);
    snprintf(path, sizeof path, "%s/%s", names, key);
    int dfd;
    cp_err err = {0};
    CHECK_EQ(cp_namecache_dir_open(g_dir, &dfd, &err), 0);
    CHECK_EQ(cp_namecache_write(dfd, key, f.data, f.len, &err), 0);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644);
    cp_namecache c;
    CHECK_EQ(cp_namecache_open(dfd, id, idl, 0, &c), 0);
    CHECK(c.mapped && c.nfunc > 100);
    cp_namecache_close(&c);
    CHECK_EQ(cp_namecache_open_path(g_dir, id, idl, 0, &c), 0); /* the agent's way */
    CHECK(c.mapped && c.nfunc > 100);
    cp_namecache_close(&c);
    CHECK_EQ(cp_namecache_open(dfd, id, idl, CP_NAMECACHE_DEBUG, &c), CP_ENOTFOUND);
    /* others may write it */
    CHECK(chmod(path, 0666) == 0);
    CHECK_EQ(cp_namecache_open(dfd, id, idl, 0, &c), CP_EPARSE);
    CHECK_EQ(cp_namecache_open_path(g_dir, id, idl, 0, &c), CP_EPARSE);
    CHECK(chmod(path, 0644) == 0);
    /* a link in its place (to a good copy) */
    snprintf(cmd, sizeof cmd, "mv '%s' '%s/copy' && ln -s '%s/copy' '%s'", path, g_dir, g_dir,
             path);
    CHECK(system(cmd) == 0);
    CHECK_EQ(cp_namecache_open(dfd, id, idl, 0, &c), CP_EPARSE);
    CHECK_EQ(cp_namecache_open_path(g_dir, id, idl, 0, &c), CP_EPARSE);
    close(dfd);
    /* the directory writable by others; a link for the directory */
    CHECK(chmod(names, 0777) == 0);
    CHECK(cp_namecache_dir_open(g_dir, &dfd, &err) != 0);
    CHECK_CONTAINS(err.msg, "writable by its group or others");
    CHECK_EQ(cp_namecache_dir_check(g_dir, &err), CP_EIO); /* the agent's check, no fd */
    CHECK_CONTAINS(err.msg, "writable by its group or others");
    CHECK(chmod(names, 0755) == 0);
    CHECK_EQ(cp_namecache_dir_check(g_dir, &err), 0);
    snprintf(cmd, sizeof cmd, "mv '%s' '%s/real' && ln -s '%s/real' '%s'", names, g_dir, g_dir,
             names);
    CHECK(system(cmd) == 0);
    CHECK(cp_namecache_dir_open(g_dir, &dfd, &err) != 0);
    CHECK_CONTAINS(err.msg, "a link or not a directory");
    CHECK_EQ(cp_namecache_dir_check(g_dir, &err), CP_EIO);
    CHECK_CONTAINS(err.msg, "a link or not a directory");
    cp_buf_close(&f);
    remove_dir();
}

/* 'N' payloads: what the agent writes reads back; a relative path, a NUL in it, a build id
 * too short or past the frame, unknown flags are refused by name. */
TEST(names_frames_parse_and_refuse)
{
    cp_relay_names n = {.flags = 1, .source = 2, .id_len = 20}, back;
    memset(n.id, 0xab, 20);
    snprintf(n.path, sizeof n.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
    uint8_t p[CP_RELAY_NAMES_MAX];
    size_t len = cp_relay_names_encode(&n, p);
    CHECK_EQ(len, 3 + 20 + strlen(n.path));
    cp_err err = {0};
    CHECK_EQ(cp_relay_names_parse(p, len, &back, &err), 0);
    CHECK_STREQ(back.path, n.path);
    CHECK(back.id_len == 20 && back.flags == 1 && back.source == 2 && !memcmp(back.id, n.id, 20));
    snprintf(n.path, sizeof n.path, "relative/libc.so.6");
    CHECK_EQ(cp_relay_names_encode(&n, p), 0);
    memcpy(p + 23, "relative", 8);
    CHECK(cp_relay_names_parse(p, len, &back, &err) != 0);
    CHECK_CONTAINS(err.msg, "not absolute");
    p[23] = '/';
    p[26] = 0;
    CHECK(cp_relay_names_parse(p, len, &back, &err) != 0);
    CHECK_CONTAINS(err.msg, "NUL");
    p[2] = 1;
    CHECK(cp_relay_names_parse(p, len, &back, &err) != 0);
    CHECK_CONTAINS(err.msg, "build id of 1 bytes");
    p[2] = 200;
    CHECK(cp_relay_names_parse(p, len, &back, &err) != 0);
    p[2] = 20;
    p[0] = 7;
    CHECK(cp_relay_names_parse(p, len, &back, &err) != 0);
    CHECK_CONTAINS(err.msg, "unknown flags");
    CHECK(cp_relay_names_parse(p, 2, &back, &err) != 0);
}

/* ------------------------------------------------------------------------------------
 * The relay taking 'N' frames */

static int connect_relay(const char *rdir)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/relay.sock", rdir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

static void send_names(int fd, const char *path, const uint8_t *id, uint32_t idl, int source)
{
    cp_relay_names n = {
        .flags = CP_NAMECACHE_DEBUG, .source = (uint8_t)source, .id_len = (uint8_t)idl};
    memcpy(n.id, id, idl);
    snprintf(n.path, sizeof n.path, "%s", path);
    uint8_t p[CP_RELAY_NAMES_MAX], hdr[CP_RELAY_HEADER];
    size_t len = cp_relay_names_encode(&n, p);
    if (!len) { /* a relative path: framed by hand, as a hostile client would */
        p[0] = n.flags, p[1] = n.source, p[2] = n.id_len;
        memcpy(p + 3, id, idl);
        memcpy(p + 3 + idl, path, strlen(path));
        len = 3 + idl + strlen(path);
    }
    cp_relay_header(hdr, CP_RELAY_NAMES, (uint32_t)len);
    CHECK(write(fd, hdr, sizeof hdr) == (ssize_t)sizeof hdr);
    CHECK(write(fd, p, len) == (ssize_t)len);
}

/* Waits up to 10 s for the relay's counters to reach built and refused. */
static void wait_stats(cp_relay *r, uint64_t built, uint64_t refused)
{
    cp_relay_stats st;
    for (int i = 0; i < 1000; i++) {
        cp_relay_get_stats(r, &st);
        if (st.names_built >= built && st.names_refused >= refused) break;
        usleep(10000);
    }
    if (st.names_built != built || st.names_refused != refused)
        fprintf(stderr, "names built %llu (want %llu), refused %llu (want %llu)\n",
                (unsigned long long)st.names_built, (unsigned long long)built,
                (unsigned long long)st.names_refused, (unsigned long long)refused);
    CHECK_EQ(st.names_built, built);
    CHECK_EQ(st.names_refused, refused);
}

/* A real relay: libc asked by name is built into names/ (0755 directory, 0644 file) and
 * names as elfnames.c does; asked again, nothing is read; a relative path, a build id that
 * is not the file's, a file others may write and a source the relay cannot match are
 * refused and counted; a flood on one connection stops at 16 frames; a damaged file is
 * built again when asked; the directory is kept within its bounds, oldest first. */
TEST(relay_builds_names_and_refuses_hostile_frames)
{
    make_dir();
    char rdir[300];
    snprintf(rdir, sizeof rdir, "%s/r", g_dir);
    cp_relay_options o = {.dir = rdir, .names_max_files = 3};
    cp_relay *r = NULL;
    cp_err err = {0};
    CHECK_EQ(cp_relay_create(&o, &r, &err), 0);
    CHECK_EQ(cp_relay_start(r, &err), 0);
    char names[400];
    snprintf(names, sizeof names, "%s/names", rdir);
    struct stat st;
    CHECK(lstat(names, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0755);

    const char *libc = libc_path();
    uint8_t id[CP_NAMECACHE_ID_MAX];
    uint32_t idl = file_id(libc, id);
    cp_elfnames *t = NULL;
    CHECK_EQ(cp_elfnames_create(libc, id, idl, CP_NAMECACHE_DEBUG_DIR, &t), 0);
    int fd = connect_relay(rdir);
    send_names(fd, libc, id, idl, cp_elfnames_source(t));
    wait_stats(r, 1, 0);
    int dfd;
    CHECK_EQ(cp_namecache_dir_open(rdir, &dfd, &err), 0);
    cp_namecache c;
    CHECK_EQ(cp_namecache_open(dfd, id, idl, CP_NAMECACHE_DEBUG, &c), 0);
    CHECK(same_names(t, &c) > 1000);
    cp_namecache_close(&c);
    send_names(fd, libc, id, idl, cp_elfnames_source(t)); /* there: nothing built */
    /* hostile: a relative path; another object under libc's id; another id for libc */
    send_names(fd, "lib/libc.so.6", id, idl, 1);
    uint8_t other[CP_NAMECACHE_ID_MAX];
    memcpy(other, id, idl);
    other[3] ^= 0x10;
    send_names(fd, libc, other, idl, cp_elfnames_source(t));
    char self[4096];
    CHECK(realpath("/proc/self/exe", self) != NULL);
    send_names(fd, self, other, idl, 2);
    /* a planted claim for an id already cached changes nothing (the file is there) */
    send_names(fd, self, id, idl, 2);
    wait_stats(r, 1, 3);
    /* a file others may write (and one only its owner reads): not published */
    char mine[400];
    snprintf(mine, sizeof mine, "%s/copy.so", g_dir);
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && chmod 0666 '%s'", libc, mine, mine);
    CHECK(system(cmd) == 0);
    send_names(fd, mine, other, idl, cp_elfnames_source(t)); /* refused before its id is read */
    wait_stats(r, 1, 4);
    CHECK(unlink(mine) == 0);
    char key[CP_NAMECACHE_KEY_MAX], kpath[600];
    CHECK_EQ(cp_namecache_key(id, idl, CP_NAMECACHE_DEBUG, key), 0);
    snprintf(kpath, sizeof kpath, "%s/%s", names, key);
    /* damaged (truncated in place by someone with the relay's rights): built again */
    CHECK(truncate(kpath, 200) == 0);
    CHECK_EQ(cp_namecache_open(dfd, id, idl, CP_NAMECACHE_DEBUG, &c), CP_EPARSE);
    usleep(1100000); /* the next second: the per-second budget again */
    send_names(fd, libc, id, idl, cp_elfnames_source(t));
    wait_stats(r, 2, 4);
    CHECK_EQ(cp_namecache_open(dfd, id, idl, CP_NAMECACHE_DEBUG, &c), 0);
    cp_namecache_close(&c);
    /* a source that differs (the process saw a debug file the relay does not, say) */
    CHECK(unlink(kpath) == 0);
    send_names(fd, libc, id, idl, cp_elfnames_source(t) == 1 ? 3 : 1);
    wait_stats(r, 2, 5);
    close(fd);
    /* a flood on one connection: 16 frames taken (each refused here: relative), the rest
     * refused without a look */
    usleep(1100000);
    fd = connect_relay(rdir);
    for (int i = 0; i < 24; i++)
        send_names(fd, "x/y", id, idl, 1);
    wait_stats(r, 2, 5 + 24);
    close(fd);
    /* bounds: 3 files at most here; a 4th evicts the oldest (libc's was refused last, for
     * its source: remembered, not read again; so other objects) */
    usleep(1100000);
    fd = connect_relay(rdir);
    cp_relay_stats rs;
    const char *objs[] = {"/proc/self/exe", "/lib/x86_64-linux-gnu/libm.so.6",
                          "/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libz.so.1"};
    for (int i = 0; i < 4; i++) {
        char real[4096];
        CHECK(realpath(objs[i], real) != NULL);
        uint8_t oid[CP_NAMECACHE_ID_MAX];
        uint32_t ol = file_id(real, oid);
        cp_elfnames *ot = NULL;
        CHECK_EQ(cp_elfnames_create(real, oid, ol, CP_NAMECACHE_DEBUG_DIR, &ot), 0);
        send_names(fd, real, oid, ol, cp_elfnames_source(ot));
        cp_elfnames_destroy(ot);
        usleep(50000);
    }
    for (int i = 0; i < 500; i++) {
        cp_relay_get_stats(r, &rs);
        if (rs.names_evicted) break;
        usleep(10000);
    }
    printf("built %llu refused %llu evicted %llu\n", (unsigned long long)rs.names_built,
           (unsigned long long)rs.names_refused, (unsigned long long)rs.names_evicted);
    CHECK(rs.names_evicted >= 1);
    snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -le 3", names);
    CHECK(system(cmd) == 0);
    close(fd);
    close(dfd);
    cp_elfnames_destroy(t);
    cp_relay_destroy(r, 0);
    remove_dir();
}

TEST_MAIN(T(file_names_like_elfnames_byte_for_byte), T(damaged_files_are_refused_whole),
          T(untrusted_files_and_directories_are_refused), T(names_frames_parse_and_refuse),
          T(relay_builds_names_and_refuses_hostile_frames))
