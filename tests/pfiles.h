/* Reading what the agent writes in output-dir mode: SERVICE.PID-IMAGE.SEQ.KIND.ISOLATE.pb.gz
 * files, each decoded with the model's decoder, sorted by process and sequence, and the
 * sums over their stacks that the tests check. Shared by the tests that run real programs
 * under the agent (tests/collector, tests/lua). */
#ifndef CP_TEST_PFILES_H
#define CP_TEST_PFILES_H

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pprof.h"
#include "test.h"

typedef struct pfile {
    int pid, seq;
    unsigned long long image; /* the image's token: an exec'd image has the same pid */
    char kind[8], iso[64];
    cp_profile *p;
} pfile;

typedef struct pset {
    pfile *f;
    int n;
} pset;

static int pfile_cmp(const void *a, const void *b)
{
    const pfile *x = a, *y = b;
    if (x->pid != y->pid) return x->pid - y->pid;
    if (x->image != y->image) return x->image < y->image ? -1 : 1;
    return x->seq - y->seq;
}

/* Loads every finished profile file of dir into s (which it initialises). */
static void pset_load(const char *dir, pset *s)
{
    memset(s, 0, sizeof(*s));
    DIR *d = opendir(dir);
    CHECK(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, ".pb.gz") || strstr(e->d_name, ".tmp")) continue;
        char name[256], *tok[8], *save;
        snprintf(name, sizeof(name), "%s", e->d_name);
        int nt = 0;
        for (char *t = strtok_r(name, ".", &save); t && nt < 8; t = strtok_r(NULL, ".", &save))
            tok[nt++] = t;
        CHECK(nt == 7);
        s->f = realloc(s->f, (size_t)(s->n + 1) * sizeof(pfile));
        CHECK(s->f);
        pfile *f = &s->f[s->n++];
        f->pid = atoi(tok[1]);
        const char *dash = strchr(tok[1], '-');
        f->image = dash ? strtoull(dash + 1, NULL, 16) : 0;
        f->seq = atoi(tok[2]);
        snprintf(f->kind, sizeof(f->kind), "%s", tok[3]);
        snprintf(f->iso, sizeof(f->iso), "%s", tok[4]);
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        cp_buf b = {0};
        CHECK(cp_read_file(path, &b, NULL) == 0);
        cp_err err = {0};
        int rc = cp_pprof_decode(b.data, b.len, NULL, &f->p, &err);
        if (rc != 0) fprintf(stderr, "%s: %s\n", path, err.msg);
        CHECK(rc == 0);
        cp_buf_close(&b);
    }
    closedir(d);
    qsort(s->f, (size_t)s->n, sizeof(pfile), pfile_cmp);
}

/* An empty output directory /tmp/contprof-TAG-PID for the agent: its path in dir and
 * "CONTPROF_OUTPUT_DIR=..." in env (each at least 300 bytes). */
static inline void pset_dir_make(const char *tag, char *dir, char *env)
{
    snprintf(dir, 256, "/tmp/contprof-%s-%d", tag, (int)getpid());
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf %.300s", dir);
    CHECK(system(cmd) == 0);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(env, 300, "CONTPROF_OUTPUT_DIR=%.256s", dir);
}

static inline void pset_dir_remove(const char *dir)
{
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf %.300s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void pset_free(pset *s)
{
    for (int i = 0; i < s->n; i++)
        cp_profile_destroy(s->f[i].p);
    free(s->f);
}

/* The function name of location loc_id's first line, or "". */
static inline const char *loc_func(const cp_profile *p, uint32_t loc_id)
{
    const cp_location *l = &p->locations.v[loc_id - 1];
    if (!l->nlines) return "";
    const cp_line *ln = &p->lines.v[l->line_off];
    if (!ln->function_id) return "";
    return cp_profile_str(p, p->functions.v[ln->function_id - 1].name);
}

/* Does location loc_id have function fn on any of its lines? A location holds a frame and
 * the frames inlined into it (innermost first): a sample in clock_gettime called from
 * thread_cpu inlined into burn_solo is in burn_solo, though burn_solo is its second line. */
static inline int loc_has_func(const cp_profile *p, uint32_t loc_id, const char *fn)
{
    const cp_location *l = &p->locations.v[loc_id - 1];
    for (uint32_t k = 0; k < l->nlines; k++) {
        const cp_line *ln = &p->lines.v[l->line_off + k];
        if (ln->function_id &&
            !strcmp(cp_profile_str(p, p->functions.v[ln->function_id - 1].name), fn))
            return 1;
    }
    return 0;
}

/* Sum of value column t over samples whose stack contains function fn, inlined or not
 * (NULL: all). */
static inline int64_t func_total(const cp_profile *p, const char *fn, int t)
{
    int64_t sum = 0;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        const cp_sample *s = &p->samples.v[i];
        int hit = fn == NULL;
        for (uint32_t j = 0; j < s->nlocs && !hit; j++)
            hit = loc_has_func(p, p->stack.v[s->loc_off + j], fn);
        if (hit) sum += cp_profile_sample_values(p, i)[t];
    }
    return sum;
}

/* Sums column t of every profile of kind (and isolate, if not NULL) over stacks with fn. */
static inline int64_t sum_kind(const pset *s, const char *kind, const char *iso, const char *fn,
                               int t)
{
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->f[i].kind, kind) && (!iso || !strcmp(s->f[i].iso, iso)))
            sum += func_total(s->f[i].p, fn, t);
    return sum;
}

#endif
