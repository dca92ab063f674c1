/* The result lines the query benchmarks print: one row per measure, with its floor (the
 * ratio or bound it must hold) and whether it held. */
#ifndef CP_BENCH_QUERY_REPORT_H
#define CP_BENCH_QUERY_REPORT_H

/* Prints "name | value unit | cmp floor unit | ok/FAIL", name and floor padded to their
 * widths, and flushes stdout. cmp is "<=", ">=" or "==" against floor, or NULL for a measure
 * without a floor (then "-"). Returns 1 if a floor was given and missed, else 0. */
int cp_bench_row(int name_width, int floor_width, const char *name, double v, const char *unit,
                 const char *cmp, double floor);

#endif
