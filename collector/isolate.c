/* The isolate table (contprof_isolate_*) and the language frames that walkers report,
 * interned once per process (cp_lang_*). */
#include "isolate.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "guard.h"
#include "unwind.h"
#include "vec.h"

struct contprof_isolate cp_isolates[CP_MAX_ISOLATES] CP_BIG;
/* Slots ever claimed (they are taken lowest first): cp_isolates_reap reads no further, so a
 * window's end touches no page of the table past them (288 KiB: 72 page faults a window). */
static atomic_uint g_iso_hwm;

/* ------------------------------------------------------------------------------------
 * Language frames interned by contprof_safepoint */

typedef struct lang_frame {
    char *function, *file;
    int64_t line;
} lang_frame;

#define LANG_MAX 65536u
static pthread_mutex_t g_lang_mu = PTHREAD_MUTEX_INITIALIZER;
static lang_frame *g_lang;
static uint32_t g_lang_n;
static uint32_t *g_lang_idx; /* 2 * LANG_MAX slots: id + 1 */

static uint64_t lang_hash(const char *fn, const char *file, int64_t line)
{
    uint64_t h = cp_hash_bytes(fn, strlen(fn), (uint64_t)line);
    return file ? cp_hash_bytes(file, strlen(file), h) : h;
}

int cp_lang_intern(const contprof_frame *f, uint32_t *id)
{
    int rc = 0;
    pthread_mutex_lock(&g_lang_mu);
    if (!g_lang) {
        g_lang = calloc(LANG_MAX, sizeof(*g_lang));
        g_lang_idx = calloc(2 * LANG_MAX, sizeof(uint32_t));
        if (!g_lang || !g_lang_idx) {
            free(g_lang);
            free(g_lang_idx);
            g_lang = NULL;
            g_lang_idx = NULL;
            rc = CP_ENOMEM;
            goto out;
        }
    }
    uint32_t mask = 2 * LANG_MAX - 1;
    for (uint32_t i = (uint32_t)lang_hash(f->function, f->file, f->line) & mask;;
         i = (i + 1) & mask) {
        uint32_t v = g_lang_idx[i];
        if (!v) {
            if (g_lang_n == LANG_MAX) {
                rc = CP_ELIMIT;
                goto out;
            }
            lang_frame *l = &g_lang[g_lang_n];
            l->function = strdup(f->function);
            l->file = f->file ? strdup(f->file) : NULL;
            l->line = f->line;
            if (!l->function || (f->file && !l->file)) {
                free(l->function);
                free(l->file);
                rc = CP_ENOMEM;
                goto out;
            }
            g_lang_idx[i] = ++g_lang_n;
            *id = g_lang_n - 1;
            goto out;
        }
        lang_frame *l = &g_lang[v - 1];
        if (l->line == f->line && strcmp(l->function, f->function) == 0 &&
            ((!l->file && !f->file) || (l->file && f->file && strcmp(l->file, f->file) == 0))) {
            *id = v - 1;
            goto out;
        }
    }
out:
    pthread_mutex_unlock(&g_lang_mu);
    return rc;
}

int cp_lang_get(uint32_t id, const char **function, const char **file, int64_t *line)
{
    pthread_mutex_lock(&g_lang_mu);
    int rc = CP_ENOTFOUND;
    if (g_lang && id < g_lang_n) {
        /* entries are never freed or moved: the pointers stay valid */
        *function = g_lang[id].function;
        *file = g_lang[id].file;
        *line = g_lang[id].line;
        rc = 0;
    }
    pthread_mutex_unlock(&g_lang_mu);
    return rc;
}

/* ------------------------------------------------------------------------------------
 * Isolate API */

CONTPROF_EXTERN contprof_isolate *contprof_isolate_create(const char *name, const char *labels)
{
    if (!name || !*name) return NULL;
    int saved = cp_in_agent;
    cp_in_agent = 1;
    for (uint32_t i = 0; i < CP_MAX_ISOLATES; i++) {
        int expect = CP_ISO_FREE;
        struct contprof_isolate *iso = &cp_isolates[i];
        if (!atomic_compare_exchange_strong(&iso->state, &expect, 3)) continue;
        unsigned hwm = atomic_load(&g_iso_hwm);
        while (hwm < i + 1 && !atomic_compare_exchange_weak(&g_iso_hwm, &hwm, i + 1)) {
        }
        iso->id = i + 1;
        iso->name = strdup(name);
        iso->labels = labels ? strdup(labels) : NULL;
        atomic_store(&iso->walker, NULL);
        atomic_store(&iso->walker_arg, NULL);
        atomic_store(&iso->request, NULL);
        atomic_store(&iso->request_arg, NULL);
        atomic_store(&iso->code_lo, 0);
        atomic_store(&iso->code_hi, 0);
        if (!iso->name || (labels && !iso->labels)) {
            free(iso->name);
            free(iso->labels);
            iso->name = iso->labels = NULL;
            atomic_store(&iso->state, CP_ISO_FREE);
            cp_in_agent = saved;
            return NULL;
        }
        atomic_store(&iso->state, CP_ISO_LIVE);
        cp_in_agent = saved;
        return iso;
    }
    cp_in_agent = saved;
    return NULL;
}

CONTPROF_EXTERN void contprof_isolate_destroy(contprof_isolate *iso)
{
    if (!iso) return;
    atomic_store(&iso->walker, NULL);
    atomic_store(&iso->request, NULL);
    atomic_store(&iso->state, CP_ISO_DYING); /* freed by the agent after its last window */
}

CONTPROF_EXTERN void contprof_isolate_set_walker(contprof_isolate *iso, contprof_walker fn,
                                                 void *arg)
{
    if (!iso) return;
    atomic_store(&iso->walker, NULL);
    atomic_store(&iso->walker_arg, arg);
    atomic_store(&iso->walker, fn);
}

CONTPROF_EXTERN void contprof_isolate_set_request(contprof_isolate *iso,
                                                  contprof_safepoint_request fn, void *arg)
{
    if (!iso) return;
    atomic_store(&iso->request, NULL);
    atomic_store(&iso->request_arg, arg);
    atomic_store(&iso->request, fn);
}

int cp_lang_ids(const contprof_frame *fr, int n, uint64_t *ids)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        uint32_t id;
        if (fr[i].function && cp_lang_intern(&fr[i], &id) == 0) ids[m++] = CP_LANG_TAG | id;
    }
    return m;
}

CONTPROF_EXTERN void contprof_isolate_set_runtime_code(contprof_isolate *iso, uintptr_t lo,
                                                       uintptr_t hi)
{
    if (!iso) return;
    atomic_store(&iso->code_hi, 0);
    atomic_store(&iso->code_lo, lo);
    atomic_store(&iso->code_hi, lo < hi ? hi : 0);
}

uint32_t cp_lang_join(uint32_t iso, uint64_t *pcs, uint32_t n, const uint64_t *ids, uint32_t m)
{
    uintptr_t lo = 0, hi = 0;
    if (iso && iso <= CP_MAX_ISOLATES) {
        hi = atomic_load(&cp_isolates[iso - 1].code_hi);
        lo = atomic_load(&cp_isolates[iso - 1].code_lo);
    }
    uint32_t first = n, last = n; /* innermost and outermost frames in the runtime */
    if (lo < hi && m > 0)
        for (uint32_t i = 0; i < n; i++)
            if (pcs[i] >= lo && pcs[i] < hi) {
                if (first == n) first = i;
                last = i;
            }
    uint64_t out[CP_MAX_FRAMES];
    uint32_t k = 0;
    if (first == n) first = last = 0; /* not through the runtime: all native below */
    for (uint32_t i = 0; i < first && k < CP_MAX_FRAMES; i++)
        out[k++] = pcs[i];
    for (uint32_t i = 0; i < m && k < CP_MAX_FRAMES; i++)
        out[k++] = ids[i];
    for (uint32_t i = last; i < n && k < CP_MAX_FRAMES; i++)
        out[k++] = pcs[i];
    memcpy(pcs, out, k * sizeof(uint64_t));
    return k;
}

void cp_isolates_reap(void)
{
    unsigned n = atomic_load(&g_iso_hwm);
    for (uint32_t i = 0; i < n && i < CP_MAX_ISOLATES; i++) {
        struct contprof_isolate *iso = &cp_isolates[i];
        if (atomic_load(&iso->state) != CP_ISO_DYING) continue;
        free(iso->name);
        free(iso->labels);
        iso->name = iso->labels = NULL;
        atomic_store(&iso->state, CP_ISO_FREE);
    }
}

void cp_lang_atfork_prepare(void)
{
    pthread_mutex_lock(&g_lang_mu);
}

void cp_lang_atfork_parent(void)
{
    pthread_mutex_unlock(&g_lang_mu);
}

void cp_lang_atfork_child(void)
{
    pthread_mutex_unlock(&g_lang_mu);
}
