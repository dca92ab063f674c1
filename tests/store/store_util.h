/* Helpers for store and ingest tests: temporary directories, envelopes, totals. */
#ifndef CP_TEST_STORE_UTIL_H
#define CP_TEST_STORE_UTIL_H

#include <dirent.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "envelope.h"
#include "profile.h"
#include "selector.h"
#include "test.h"

#define T0 1700000000000000000LL /* 2023-11-14T22:13:20Z */
#define SEC 1000000000LL

/* A fresh directory under $TMPDIR (or /tmp); removed by rmtree. */
static inline char *tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *p = malloc(512);
    snprintf(p, 512, "%s/cp-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    CHECK(mkdtemp(p));
    return p;
}

/* Removes p and frees the string (from tmpdir). */
static inline void rmtree(char *p)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", p);
    free(p);
}

static inline uint64_t dir_bytes(const char *path)
{
    uint64_t n = 0;
    DIR *d = opendir(path);
    struct dirent *de;
    char p[1024];
    while (d && (de = readdir(d))) {
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) n += (uint64_t)st.st_size;
    }
    if (d) closedir(d);
    return n;
}

/* Fills e (owned strings) for tenant/kind/window/producer/seq with labels "k=v,k=v". */
static inline void make_env(cp_envelope *e, const char *tenant, cp_kind kind, const char *labels,
                            int64_t start, int64_t dur, const char *producer, uint64_t seq)
{
    memset(e, 0, sizeof *e);
    e->format_major = CP_ENVELOPE_MAJOR;
    e->tenant = strdup(tenant);
    e->kind = kind;
    e->window_start_ns = start;
    e->window_duration_ns = dur;
    e->producer_id = strdup(producer);
    e->sequence = seq;
    char *l = strdup(labels), *save = NULL;
    for (char *kv = strtok_r(l, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        CHECK(eq);
        *eq = 0;
        CHECK(cp_labels_set(&e->labels, kv, eq + 1) == 0);
    }
    free(l);
}

/* A selector built by hand (the text parser belongs to query/): ops "=", "!=", "=~", "!~". */
static inline void sel_add(cp_selector *s, const char *name, const char *op, const char *value)
{
    s->m = realloc(s->m, sizeof *s->m * (s->n + 1));
    cp_matcher *m = &s->m[s->n++];
    memset(m, 0, sizeof *m);
    m->name = strdup(name);
    m->value = strdup(value);
    m->op = !strcmp(op, "=")    ? CP_MATCH_EQ
            : !strcmp(op, "!=") ? CP_MATCH_NE
            : !strcmp(op, "=~") ? CP_MATCH_RE
                                : CP_MATCH_NRE;
    if (m->op == CP_MATCH_RE || m->op == CP_MATCH_NRE) {
        char re[600];
        snprintf(re, sizeof re, "^(%s)$", value);
        CHECK(regcomp(&m->re, re, REG_EXTENDED | REG_NOSUB) == 0);
        m->has_re = 1;
    }
}

static inline void sel_free(cp_selector *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        free(s->m[i].name);
        free(s->m[i].value);
        if (s->m[i].has_re) regfree(&s->m[i].re);
    }
    free(s->m);
    s->m = NULL;
    s->n = 0;
}

#endif
