/* The result lines of the query benchmarks (report.h). */
#include "report.h"

#include <stdio.h>
#include <string.h>

int cp_bench_row(int name_width, int floor_width, const char *name, double v, const char *unit,
                 const char *cmp, double floor)
{
    char fl[64] = "-";
    const char *ok = "-";
    int good = 1;
    if (cmp) {
        snprintf(fl, sizeof fl, "%s %g%s", cmp, floor, unit);
        good = strcmp(cmp, "<=") == 0   ? v <= floor
               : strcmp(cmp, ">=") == 0 ? v >= floor
                                        : v == floor;
        ok = good ? "ok" : "FAIL";
    }
    printf("%-*s | %12.3f%s | %*s | %s\n", name_width, name, v, unit, floor_width, fl, ok);
    fflush(stdout);
    return !good;
}
