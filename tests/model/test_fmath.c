/* model/fmath.c against libm: exp and log within 2 ulps over their ranges, llround exactly
 * (halfway cases, large values, saturation). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fmath.h"
#include "test.h"

static uint64_t rng = 88172645463325252ULL;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* the distance in ulps between two finite doubles of the same sign */
static uint64_t ulps(double a, double b)
{
    int64_t x, y;
    memcpy(&x, &a, 8);
    memcpy(&y, &b, 8);
    return x > y ? (uint64_t)(x - y) : (uint64_t)(y - x);
}

TEST(exp_matches_libm)
{
    uint64_t worst = 0;
    for (int i = 0; i < 200000; i++) {
        double x = ((double)(next() >> 11) / 9007199254740992.0) * 1454.0 - 745.0;
        if (i % 4 == 0) x /= 1000.0; /* near 0, where the sampler asks */
        double want = exp(x), got = cp_math_exp(x);
        if (want == 0 || want < 2.2250738585072014e-308) {
            CHECK(got <= 2.2250738585072014e-308 * 1.0001); /* subnormal: absolute */
            continue;
        }
        uint64_t u = ulps(want, got);
        if (u > worst) worst = u;
    }
    CHECK(worst <= 2);
    CHECK(cp_math_exp(0) == 1.0);
    CHECK(cp_math_exp(-800) == 0.0);
    CHECK(isinf(cp_math_exp(710)));
    CHECK(isnan(cp_math_exp(NAN)));
}

TEST(log_matches_libm)
{
    uint64_t worst = 0;
    for (int i = 0; i < 200000; i++) {
        double x;
        uint64_t r = next();
        if (i % 2) {
            x = ((r >> 11) + 0.5) / 9007199254740992.0; /* (0,1): the sampler's draws */
        } else {
            uint64_t b = r & 0x7fefffffffffffffULL; /* any finite positive double */
            memcpy(&x, &b, 8);
            if (x == 0) continue;
        }
        double want = log(x), got = cp_math_log(x);
        if (fabs(want) < 1e-300) continue;
        uint64_t u = ulps(want, got);
        if (u > worst) worst = u;
    }
    CHECK(worst <= 2);
    CHECK(cp_math_log(1.0) == 0.0);
    CHECK(isinf(cp_math_log(0.0)) && cp_math_log(0.0) < 0);
    CHECK(isnan(cp_math_log(-1.0)));
    CHECK(fabs(cp_math_log(4.9406564584124654e-324) - log(4.9406564584124654e-324)) < 1e-12);
}

TEST(llround_matches_libm)
{
    static const double v[] = {0.0,
                               0.5,
                               -0.5,
                               1.5,
                               -1.5,
                               2.5,
                               0.49999999999999994,
                               -0.49999999999999994,
                               4503599627370495.5,
                               4503599627370497.0,
                               -4503599627370495.5,
                               1e18,
                               -1e18,
                               123456.789,
                               -0.0};
    for (unsigned i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        CHECK_EQ(cp_math_llround(v[i]), (int64_t)llround(v[i]));
    for (int i = 0; i < 100000; i++) {
        double x = ((double)(int64_t)next() / 9223372036854775808.0) * 1e12;
        CHECK_EQ(cp_math_llround(x), (int64_t)llround(x));
    }
    CHECK(cp_math_llround(1e300) == INT64_MAX);
    CHECK(cp_math_llround(-1e300) == INT64_MIN);
}

TEST_MAIN(T(exp_matches_libm), T(log_matches_libm), T(llround_matches_libm))
