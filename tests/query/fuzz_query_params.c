/* libFuzzer target: query strings, then every value as a time and as a duration, then the
 * whole string as each kind of endpoint's query (cp_query_parse), for a tenant and a peer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "params.h"

/* The forms of the API's endpoints (query/api.c), all parameters allowed. */
static void parse_queries(const cp_params *p)
{
    static const char *const params[] = {"type",        "select",      "from",      "to",
                                         "format",      "focus",       "ignore",    "max_nodes",
                                         "sample_type", "base_select", "base_from", "base_to",
                                         "step",        "tenant",      NULL};
    static const char *const formats[] = {"json", "pprof", NULL};
    static const unsigned flags[] = {CP_FORM_KIND | CP_FORM_WINDOW | CP_FORM_SELECT | CP_FORM_BASE,
                                     CP_FORM_KIND | CP_FORM_WINDOW | CP_FORM_SELECT | CP_FORM_STEP,
                                     CP_FORM_ANY_KIND | CP_FORM_ALL_TIME | CP_FORM_SELECT, 0};
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++)
        for (int peer = 0; peer < 2; peer++) {
            cp_query_form form = {params, f ? NULL : formats, flags[f]};
            cp_query_env env = {peer ? "" : "acme",
                                1764000000000000000LL,
                                0,
                                400LL * 86400 * 1000000000LL,
                                0,
                                11000};
            cp_query_req q;
            cp_http_response r = {0};
            cp_query_parse(p, &form, &env, &q, &r);
            cp_query_req_close(&q);
            cp_buf_close(&r.body);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 16384) return 0;
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    cp_params p = {0};
    cp_err err = {0};
    if (cp_params_parse(s, &p, &err) == 0) {
        for (uint32_t i = 0; i < p.p.n; i++) {
            int64_t t = 0; /* both parses may fail */
            cp_parse_time(p.p.v[i].value, 1764000000000000000LL, &t, &err);
            cp_parse_duration(p.p.v[i].value, 0, &t, &err);
            char buf[40];
            cp_format_time(t, buf, sizeof buf);
        }
        parse_queries(&p);
    }
    cp_params_close(&p);
    free(s);
    return 0;
}
