/* exp, log and llround without libm: the agent (libcontprof.so) links no libm, so that a
 * preloaded process that does not use libm never maps it (collector/README.md, "Light to
 * load"). Accurate to a few ulps over the whole double range; no errno, no exceptions. */
#ifndef CP_FMATH_H
#define CP_FMATH_H

#include <stdint.h>

/* e^x: 0 below -745.2, +inf above 709.8, NaN for NaN. Async-signal-safe, no allocation. */
double cp_math_exp(double x);

/* The natural logarithm: -inf at 0, NaN below 0 or for NaN, +inf at +inf. Async-signal-safe,
 * no allocation. */
double cp_math_log(double x);

/* x rounded to the nearest integer, halfway cases away from zero (as llround); x outside
 * the int64_t range or NaN gives INT64_MIN or INT64_MAX (saturated). Async-signal-safe. */
int64_t cp_math_llround(double x);

#endif
