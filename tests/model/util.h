/* Helpers for model tests: a canonical text form of a profile (independent of ids and
 * order) so that two profiles can be compared for equal content. */
#ifndef CP_TEST_MODEL_UTIL_H
#define CP_TEST_MODEL_UTIL_H

#include "profile.h"
#include <stdlib.h>
#include <string.h>

static int cmp_lines_(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every sample as "leaf<-...<-root|labels|v1,v2" sorted; the caller frees the result. */
static inline char *canonical(const cp_profile *p)
{
    char **rows = calloc(p->samples.n + 1, sizeof *rows);
    size_t total = 1;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        cp_buf b = {0};
        const cp_sample *s = &p->samples.v[i];
        for (uint32_t k = 0; k < s->nlocs; k++) {
            const cp_location *l = &p->locations.v[p->stack.v[s->loc_off + k] - 1];
            for (uint32_t j = 0; j < l->nlines; j++) {
                const cp_line *ln = &p->lines.v[l->line_off + j];
                const cp_function *f = &p->functions.v[ln->function_id - 1];
                cp_buf_printf(&b, "%s:%s:%lld<-", cp_profile_str(p, f->name),
                              cp_profile_str(p, f->filename), (long long)ln->line);
            }
            if (!l->nlines) cp_buf_printf(&b, "0x%llx<-", (unsigned long long)l->address);
        }
        cp_buf_printf(&b, "|");
        for (uint32_t k = 0; k < s->nlabels; k++) {
            const cp_label *lb = &p->labels.v[s->label_off + k];
            cp_buf_printf(&b, "%s=%s/%lld,", cp_profile_str(p, lb->key), cp_profile_str(p, lb->str),
                          (long long)lb->num);
        }
        cp_buf_printf(&b, "|");
        for (uint32_t k = 0; k < p->sample_types.n; k++)
            cp_buf_printf(&b, "%lld,", (long long)cp_profile_sample_values(p, i)[k]);
        cp_buf_append(&b, "", 1);
        rows[i] = (char *)b.data;
        total += b.len + 1;
    }
    qsort(rows, p->samples.n, sizeof *rows, cmp_lines_);
    /* merge equal rows is not needed: a merged profile has unique keys */
    char *out = malloc(total), *w = out;
    for (uint32_t i = 0; i < p->samples.n; i++) {
        size_t n = strlen(rows[i]);
        memcpy(w, rows[i], n);
        w[n] = '\n';
        w += n + 1;
        free(rows[i]);
    }
    *w = 0;
    free(rows);
    return out;
}

#endif
