/* libFuzzer target: Pyroscope's selectors made contprof's (cp_querier_selector, querier.h).
 * Whatever the selector parser takes is translated, and the text made parses again to the
 * same matchers, in order, less those on __profile_type__ and __name__, with service_name
 * as service; what the parser refuses is refused; an __profile_type__ equal to an ID served
 * allows that one type at most. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "querier.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > CP_SELECTOR_MAX + 16) return 0;
    char *in = malloc(size + 1);
    if (!in) return 0;
    memcpy(in, data, size);
    in[size] = 0;
    cp_selector s1 = {0}, s2 = {0};
    cp_err e1 = {0}, e2 = {0};
    cp_buf out = {0};
    uint32_t types = 0;
    int r1 = cp_selector_parse(in, &s1, &e1);
    int r2 = cp_querier_selector(in, &out, &types, &e2);
    if (r1 == CP_ENOMEM || r2 == CP_ENOMEM) goto done;
    if (!r1 != !r2) abort();
    if (r1) goto done;
    if (out.len == 0 || ((const char *)out.data)[out.len - 1]) abort(); /* NUL-terminated */
    if (out.len - 1 > CP_SELECTOR_MAX) goto done; /* escaping grew a value past the limit */
    if (cp_selector_parse((const char *)out.data, &s2, &e2)) abort();
    uint32_t k = 0;
    int exact_type = 0;
    for (uint32_t i = 0; i < s1.n; i++) {
        const cp_matcher *m = &s1.m[i];
        if (!strcmp(m->name, "__profile_type__") || !strcmp(m->name, "__name__")) {
            cp_kind kind;
            const char *st;
            if (m->op == CP_MATCH_EQ && m->name[2] == 'p' &&
                !cp_querier_profile_type(m->value, &kind, &st))
                exact_type = 1;
            continue;
        }
        if (k >= s2.n) abort();
        const cp_matcher *t = &s2.m[k++];
        const char *want = strcmp(m->name, "service_name") ? m->name : "service";
        if (strcmp(t->name, want) || t->op != m->op || strcmp(t->value, m->value)) abort();
    }
    if (k != s2.n) abort();
    if (exact_type && (types & (types - 1))) abort(); /* more than one type */
done:
    cp_selector_close(&s1);
    cp_selector_close(&s2);
    cp_buf_close(&out);
    free(in);
    return 0;
}
