/* Helpers for the query tests: building profiles from folded stacks. */
#ifndef CP_QTEST_H
#define CP_QTEST_H

#include <string.h>

#include "profile.h"
#include "test.h"

/* Finds or adds a function named name with one location for it; returns the location id. */
static inline uint32_t qt_loc(cp_profile *p, const char *name, size_t n)
{
    for (uint32_t i = 0; i < p->functions.n; i++) {
        const char *s = cp_profile_str(p, p->functions.v[i].name);
        if (strlen(s) == n && memcmp(s, name, n) == 0) {
            for (uint32_t l = 0; l < p->locations.n; l++) {
                const cp_location *loc = &p->locations.v[l];
                if (loc->nlines && p->lines.v[loc->line_off].function_id == i + 1) return l + 1;
            }
        }
    }
    cp_function f = {0};
    CHECK(cp_profile_intern(p, name, n, &f.name) == 0);
    f.system_name = f.name;
    CHECK(cp_profile_intern_cstr(p, "main.go", &f.filename) == 0);
    uint32_t fid, lid;
    CHECK(cp_profile_add_function(p, &f, &fid) == 0);
    cp_line line = {.function_id = fid, .line = 10};
    CHECK(cp_profile_add_location(p, 0x1000 + 16 * (uint64_t)p->locations.n, 0, &line, 1, &lid) ==
          0);
    return lid;
}

/* Adds a sample for a folded stack "root;...;leaf" with the given values. */
static inline void qt_add(cp_profile *p, const char *folded, int64_t v0, int64_t v1)
{
    uint32_t locs[128], n = 0;
    const char *s = folded;
    while (*s) {
        const char *e = strchr(s, ';');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        CHECK(n < 128);
        locs[n++] = qt_loc(p, s, len);
        s += len;
        if (*s == ';') s++;
    }
    /* pprof stacks are leaf first. */
    for (uint32_t i = 0; i < n / 2; i++) {
        uint32_t t = locs[i];
        locs[i] = locs[n - 1 - i];
        locs[n - 1 - i] = t;
    }
    int64_t vals[2] = {v0, v1};
    CHECK(cp_profile_add_sample(p, locs, n, vals, NULL, 0) == 0);
}

/* A new cpu-like profile (samples/count, cpu/nanoseconds, period 10 ms). */
static inline cp_profile *qt_cpu_profile(void)
{
    cp_profile *p = cp_profile_create();
    CHECK(p);
    CHECK(cp_profile_add_sample_type(p, "samples", "count") == 0);
    CHECK(cp_profile_add_sample_type(p, "cpu", "nanoseconds") == 0);
    CHECK(cp_profile_intern_cstr(p, "cpu", &p->period_type.type) == 0);
    CHECK(cp_profile_intern_cstr(p, "nanoseconds", &p->period_type.unit) == 0);
    p->period = 10000000;
    return p;
}

#endif
