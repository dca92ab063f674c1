/* `contprof run`: translates options into CONTPROF_* variables, asks contprofd for its
 * brokers when given --server, says why when the agent cannot enter the program, puts
 * libcontprof.so in LD_PRELOAD and execs the program. */
#include "cmd_run.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "http_client.h"
#include "relay.h"
#include "times.h"

#ifndef CP_LIBCONTPROF_BUILD
#define CP_LIBCONTPROF_BUILD ""
#endif
#ifndef CP_LIBCONTPROF_INSTALLED
#define CP_LIBCONTPROF_INSTALLED "/usr/local/lib/libcontprof.so.0"
#endif

static int usage_to(FILE *f, int rc)
{
    fprintf(f,
            "usage: contprof run [--server URL] [--relay DIR | --brokers LIST] [--service S]\n"
            "         [--version V]\n"
            "         [--tenant T] [--label k=v]... [--cpu-hz N] [--alloc-rate BYTES]\n"
            "         [--window DURATION] [--output-dir DIR] [--topic T] [--no-children]\n"
            "         [--symbolize agent|server]\n"
            "         [--token T (or CONTPROF_TOKEN): contprofd's bearer token]\n"
            "         -- CMD [ARGS...]\n"
            "  --window D   window length: 500ms, 10s (default), 1m; a bare number is seconds\n"
            "  --output-dir DIR  window files; without a server or brokers by default\n"
            "               $XDG_RUNTIME_DIR/contprof or ${TMPDIR:-/tmp}/contprof-UID; made 0700\n"
            "               if missing; refused if a symbolic link, another user's, or writable\n"
            "               by others and not sticky\n"
            "  --relay DIR  the host's relay (default: the server's, when it runs here)\n"
            "  --brokers L  each process its own Kafka producer instead of the relay\n\n"
            "examples:\n"
            "  contprof run --server http://127.0.0.1:7070 --service api --version 1.4 -- ./api\n"
            "  contprof run --output-dir /tmp/prof --window 1m -- ./batch-job\n");
    return rc;
}

static int usage(void)
{
    return usage_to(stderr, 2);
}

static const char *lib_path(void)
{
    const char *env = getenv("CONTPROF_LIB");
    if (env && *env) return env;
    if (CP_LIBCONTPROF_BUILD[0] && access(CP_LIBCONTPROF_BUILD, R_OK) == 0)
        return CP_LIBCONTPROF_BUILD;
    return CP_LIBCONTPROF_INSTALLED;
}

/* ------------------------------------------------------------------------------------
 * Programs the agent cannot enter: the loader never preloads it into a static program,
 * nor (secure execution) into a set-user-ID, set-group-ID or file-capability one started
 * by a user it elevates, and a Go program without cgo makes no call the agent hooks. */

/* Where execvp would find file: into out (cap bytes). 0, or -1 if not found. */
static int resolve_path(const char *file, char *out, size_t cap)
{
    if (strchr(file, '/')) {
        snprintf(out, cap, "%s", file);
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        if ((size_t)snprintf(out, cap, "%.*s%s%s", (int)n, path, n ? "/" : "", file) < cap) {
            struct stat st;
            if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0) return 0;
        }
        if (!end) break;
        path = end + 1;
    }
    return -1;
}

/* What an ELF file says about itself, as far as the checks need. */
typedef struct elf_facts {
    int elf, class64, interp, libc, go;
} elf_facts;

static int read_at(int fd, void *buf, size_t len, uint64_t off)
{
    return pread(fd, buf, len, (off_t)off) == (ssize_t)len ? 0 : -1;
}

/* Reads the headers of the program at path: PT_INTERP, DT_NEEDED libc, and the sections a
 * Go toolchain writes (.note.go.buildid, .go.buildinfo, .gopclntab), which stay in
 * stripped binaries. Anything unreadable leaves a fact unset (no message rather than a
 * wrong one). */
static void elf_read(const char *path, elf_facts *f)
{
    memset(f, 0, sizeof(*f));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    Elf64_Ehdr eh;
    if (read_at(fd, &eh, sizeof(eh), 0) != 0 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) goto out;
    f->elf = 1;
    if (eh.e_ident[EI_CLASS] != ELFCLASS64) goto out;
    f->class64 = 1;
    uint64_t dyn_off = 0, dyn_size = 0;
    for (unsigned i = 0; i < eh.e_phnum && i < 256; i++) {
        Elf64_Phdr ph;
        if (read_at(fd, &ph, sizeof(ph), eh.e_phoff + (uint64_t)i * eh.e_phentsize) != 0) break;
        if (ph.p_type == PT_INTERP) f->interp = 1;
        if (ph.p_type == PT_DYNAMIC) dyn_off = ph.p_offset, dyn_size = ph.p_filesz;
    }
    /* sections: names, and the dynamic string table for DT_NEEDED */
    Elf64_Shdr strsh;
    if (eh.e_shnum == 0 || eh.e_shnum > 4096 || eh.e_shstrndx >= eh.e_shnum ||
        read_at(fd, &strsh, sizeof(strsh), eh.e_shoff + (uint64_t)eh.e_shstrndx * eh.e_shentsize))
        goto out;
    uint64_t dynstr_off = 0, dynstr_size = 0;
    for (unsigned i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh;
        char name[32] = "";
        if (read_at(fd, &sh, sizeof(sh), eh.e_shoff + (uint64_t)i * eh.e_shentsize) != 0) break;
        if (sh.sh_name >= strsh.sh_size) continue;
        ssize_t n = pread(fd, name, sizeof(name) - 1, (off_t)(strsh.sh_offset + sh.sh_name));
        if (n <= 0) continue;
        name[n] = 0;
        if (!strcmp(name, ".note.go.buildid") || !strcmp(name, ".go.buildinfo") ||
            !strcmp(name, ".gopclntab"))
            f->go = 1;
        if (!strcmp(name, ".dynstr")) dynstr_off = sh.sh_offset, dynstr_size = sh.sh_size;
    }
    for (uint64_t o = 0; dynstr_size && o + sizeof(Elf64_Dyn) <= dyn_size && o < (1u << 20);
         o += sizeof(Elf64_Dyn)) {
        Elf64_Dyn d;
        if (read_at(fd, &d, sizeof(d), dyn_off + o) != 0 || d.d_tag == DT_NULL) break;
        if (d.d_tag != DT_NEEDED || d.d_un.d_val >= dynstr_size) continue;
        char name[64] = "";
        ssize_t n = pread(fd, name, sizeof(name) - 1, (off_t)(dynstr_off + d.d_un.d_val));
        if (n <= 0) continue;
        name[n] = 0;
        if (!strncmp(name, "libc.so", 7)) f->libc = 1;
    }
out:
    close(fd);
}

/* The interpreter of a "#!" script at path, into out (resolved through PATH after
 * /usr/bin/env). 0, or -1 when path is no script. */
static int script_interp(const char *path, char *out, size_t cap)
{
    char line[256] = "";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, line, sizeof(line) - 1);
    close(fd);
    if (n < 3 || line[0] != '#' || line[1] != '!') return -1;
    line[n] = 0;
    char *save, *interp = strtok_r(line + 2, " \t\r\n", &save);
    if (!interp) return -1;
    if (!strcmp(interp, "/usr/bin/env") || !strcmp(interp, "/bin/env")) {
        char *arg = strtok_r(NULL, " \t\r\n", &save);
        while (arg && arg[0] == '-') /* env -S, -i... */
            arg = strtok_r(NULL, " \t\r\n", &save);
        if (!arg) return -1;
        return resolve_path(arg, out, cap);
    }
    snprintf(out, cap, "%s", interp);
    return 0;
}

/* Why the agent will not be in the process that execs file, or NULL. */
static const char *why_no_profile(const char *file, char *shown, size_t cap)
{
    char path[4096];
    if (resolve_path(file, path, sizeof(path)) != 0) return NULL; /* execvp will say */
    snprintf(shown, cap, "%s", path);
    char interp[4096];
    for (int depth = 0; depth < 4 && script_interp(path, interp, sizeof(interp)) == 0; depth++) {
        snprintf(path, sizeof(path), "%s", interp);
        snprintf(shown, cap, "%s (the interpreter of %s)", interp, file);
    }
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    /* Secure execution: the loader ignores LD_PRELOAD's paths when exec raises the
     * process's privileges (AT_SECURE): set-user-ID to another user, set-group-ID to another
     * group, or file capabilities for a non-root user. Not on a nosuid mount. */
    struct statvfs vfs;
    int nosuid = statvfs(path, &vfs) == 0 && (vfs.f_flag & ST_NOSUID);
    if (!nosuid && (st.st_mode & S_ISUID) && st.st_uid != getuid())
        return "is set-user-ID: the loader ignores LD_PRELOAD for it (secure execution)";
    if (!nosuid && (st.st_mode & S_ISGID) && (st.st_mode & S_IXGRP) && st.st_gid != getgid())
        return "is set-group-ID: the loader ignores LD_PRELOAD for it (secure execution)";
    if (!nosuid && getuid() != 0 && getxattr(path, "security.capability", NULL, 0) > 0)
        return "has file capabilities: the loader ignores LD_PRELOAD for it (secure execution)";
    elf_facts f;
    elf_read(path, &f);
    if (!f.elf) return NULL;
    if (!f.class64) return "is not a 64-bit program: libcontprof.so cannot be loaded into it";
    if (f.go && !(f.interp && f.libc))
        return "is a Go program built without cgo: it makes no call the agent can see "
               "(nor does it load it)";
    if (!f.interp) return "is statically linked: no loader to preload the agent into it";
    return NULL;
}

int cp_cmd_run(int argc, char **argv)
{
    static const struct {
        const char *opt, *env;
    } simple[] = {
        {"--service", "CONTPROF_SERVICE"},       {"--version", "CONTPROF_VERSION"},
        {"--tenant", "CONTPROF_TENANT"},         {"--cpu-hz", "CONTPROF_CPU_HZ"},
        {"--alloc-rate", "CONTPROF_ALLOC_RATE"}, {"--window", "CONTPROF_WINDOW"},
        {"--output-dir", "CONTPROF_OUTPUT_DIR"}, {"--topic", "CONTPROF_TOPIC"},
        {"--token", "CONTPROF_TOKEN"},           {"--relay", "CONTPROF_RELAY"},
    };
    const char *server = NULL;
    char labels[4096] = "";
    const char *old_labels = getenv("CONTPROF_LABELS");
    if (old_labels) snprintf(labels, sizeof(labels), "%s", old_labels);
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-') break;
        if (strcmp(a, "--no-children") == 0) {
            setenv("CONTPROF_CHILDREN", "0", 1);
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return usage_to(stdout, 0);
        if (i + 1 >= argc) return usage();
        const char *v = argv[++i];
        if (strcmp(a, "--window") == 0) {
            /* The CLI's grammar (a bare number is seconds), handed to the agent in ms. */
            int64_t d;
            cp_err err = {0};
            if (cp_parse_duration(v, 0, &d, &err)) {
                fprintf(stderr, "contprof run: --window: %s\n", err.msg);
                return 2;
            }
            char ms[32];
            snprintf(ms, sizeof ms, "%lldms", (long long)(d < 1000000 ? 1 : d / 1000000));
            setenv("CONTPROF_WINDOW", ms, 1);
            continue;
        }
        int done = 0;
        for (size_t k = 0; k < sizeof(simple) / sizeof(simple[0]); k++)
            if (strcmp(a, simple[k].opt) == 0) {
                setenv(simple[k].env, v, 1);
                done = 1;
            }
        if (done) continue;
        if (strcmp(a, "--brokers") == 0) {
            unsetenv("CONTPROF_RELAY"); /* asked for Kafka from each process */
            setenv("CONTPROF_BROKERS", v, 1);
        } else if (strcmp(a, "--server") == 0) {
            server = v;
        } else if (strcmp(a, "--symbolize") == 0) {
            if (strcmp(v, "agent") != 0 && strcmp(v, "server") != 0) {
                fprintf(stderr, "contprof run: --symbolize %s: expected agent or server\n", v);
                return 2;
            }
            setenv("CONTPROF_SYMBOLIZE", v, 1);
        } else if (strcmp(a, "--label") == 0) {
            if (!strchr(v, '=')) {
                fprintf(stderr, "contprof run: --label %s: expected k=v\n", v);
                return 2;
            }
            size_t l = strlen(labels);
            snprintf(labels + l, sizeof(labels) - l, "%s%s", l ? "," : "", v);
        } else {
            fprintf(stderr, "contprof run: unknown option %s\n", a);
            return usage();
        }
    }
    if (i >= argc) return usage();
    if (labels[0]) setenv("CONTPROF_LABELS", labels, 1);
    if (server) {
        /* Captures are asked of the server; windows go to its relay when it runs on this
         * host, else to its brokers (asked again whenever they stay unreachable: a restarted
         * contprofd may have them on a new port). */
        setenv("CONTPROF_SERVER", server, 1);
        char brokers[1024], relay[1024];
        cp_err err = {0};
        if (getenv("CONTPROF_RELAY") && *getenv("CONTPROF_RELAY")) {
            /* --relay (or the environment) names the relay: nothing to ask */
        } else if (cp_http_get_transport(server, getenv("CONTPROF_TOKEN"), brokers, sizeof(brokers),
                                         relay, sizeof(relay), 5000, &err) != 0) {
            /* the agent keeps asking in the background */
            fprintf(stderr,
                    "contprof run: %s did not give its brokers yet (%s); the agent will "
                    "retry\n",
                    server, err.msg);
        } else if (relay[0] && cp_relay_listening(relay)) {
            setenv("CONTPROF_RELAY", relay, 1);
        } else {
            setenv("CONTPROF_BROKERS", brokers, 1);
        }
    }
    const char *lib = lib_path();
    const char *pl = getenv("LD_PRELOAD");
    char preload[4096];
    if (pl && *pl)
        snprintf(preload, sizeof(preload), "%s:%s", lib, pl);
    else
        snprintf(preload, sizeof(preload), "%s", lib);
    setenv("LD_PRELOAD", preload, 1);
    char shown[8192];
    const char *why = why_no_profile(argv[i], shown, sizeof(shown));
    if (why)
        fprintf(stderr, "contprof run: %s %s; no profile will come from it; running it anyway\n",
                shown, why);
    execvp(argv[i], argv + i);
    fprintf(stderr, "contprof run: %s: %s\n", argv[i], strerror(errno));
    return 127;
}
