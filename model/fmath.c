/* exp, log and llround without libm (fmath.h): range reduction to a small interval and a
 * polynomial there, with the exponent handled in the bits of the double. */
#include "fmath.h"

#include <string.h>

static uint64_t bits(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

static double from_bits(uint64_t u)
{
    double x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

/* 2^k for -1022 <= k <= 1023 */
static double pow2(int k)
{
    return from_bits((uint64_t)(k + 1023) << 52);
}

#define LN2_HI 6.93147180369123816490e-01 /* ln 2, the high 32 bits: k * LN2_HI is exact */
#define LN2_LO 1.90821492927058770002e-10
#define INV_LN2 1.44269504088896338700e+00

double cp_math_exp(double x)
{
    if (x != x) return x;
    if (x > 709.782712893384) return from_bits(0x7ff0000000000000ULL);
    if (x < -745.1332191019412) return 0.0;
    /* x = k ln2 + r, |r| <= ln2 / 2 */
    double kd = x * INV_LN2;
    int k = (int)(kd < 0 ? kd - 0.5 : kd + 0.5);
    double r = (x - k * LN2_HI) - k * LN2_LO;
    /* e^r by its Taylor series to r^13 / 13! (the next term is below 2^-60 at |r| = 0.347) */
    double p = 1.0 / 6227020800.0;
    static const double inv_fact[] = {1.0 / 479001600.0,
                                      1.0 / 39916800.0,
                                      1.0 / 3628800.0,
                                      1.0 / 362880.0,
                                      1.0 / 40320.0,
                                      1.0 / 5040.0,
                                      1.0 / 720.0,
                                      1.0 / 120.0,
                                      1.0 / 24.0,
                                      1.0 / 6.0,
                                      1.0 / 2.0,
                                      1.0,
                                      1.0};
    for (unsigned i = 0; i < sizeof(inv_fact) / sizeof(inv_fact[0]); i++)
        p = p * r + inv_fact[i];
    /* times 2^k, in two steps where 2^k alone is not a normal double */
    if (k > 1023) return p * pow2(1023) * pow2(k - 1023);
    if (k < -1022) return p * pow2(-1022) * pow2(k + 1022);
    return p * pow2(k);
}

double cp_math_log(double x)
{
    if (x != x) return x;
    if (x < 0) return from_bits(0x7ff8000000000000ULL);
    if (x == 0) return -from_bits(0x7ff0000000000000ULL);
    uint64_t u = bits(x);
    if ((u >> 52) == 0x7ff) return x; /* +inf */
    int e = 0;
    if ((u >> 52) == 0) {         /* subnormal: scale into the normal range first */
        x *= 18014398509481984.0; /* 2^54 */
        u = bits(x);
        e = -54;
    }
    /* x = m 2^e with m in [sqrt(1/2), sqrt(2)) */
    e += (int)(u >> 52) - 1023;
    double m = from_bits((u & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e++;
    }
    /* log m = 2 atanh(f), f = (m - 1) / (m + 1), |f| <= 0.1716: the series to f^23 */
    double f = (m - 1.0) / (m + 1.0), f2 = f * f;
    double s = 1.0 / 23.0;
    for (int n = 21; n >= 1; n -= 2)
        s = s * f2 + 1.0 / n;
    return e * LN2_HI + (2.0 * f * s + e * LN2_LO);
}

int64_t cp_math_llround(double x)
{
    if (x != x) return INT64_MIN;
    if (x >= 9223372036854775807.0) return INT64_MAX;
    if (x <= -9223372036854775808.0) return INT64_MIN;
    if (x >= 4503599627370496.0 || x <= -4503599627370496.0) return (int64_t)x; /* integral */
    int64_t t = (int64_t)x; /* toward zero; x - t is exact below 2^52 */
    double d = x - (double)t;
    if (d >= 0.5) t++;
    if (d <= -0.5) t--;
    return t;
}
