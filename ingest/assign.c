/* Static partition ownership: the `cluster.partitions` grammar and the partition list the
 * ingest assigns itself in place of a consumer group's assignment. */
#include "assign.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Reads a partition number at *s; -1 if there is none or it is out of range. */
static long number(const char **s)
{
    if (!isdigit((unsigned char)**s)) return -1;
    long v = 0;
    while (isdigit((unsigned char)**s)) {
        v = v * 10 + (**s - '0');
        if (v >= CP_ASSIGN_MAX_PARTITION) return -1;
        (*s)++;
    }
    return v;
}

int cp_assign_parse(const char *spec, int32_t **out, int64_t **start, uint32_t *n, cp_err *err)
{
    *out = NULL;
    if (start) *start = NULL;
    *n = 0;
    uint8_t seen[CP_ASSIGN_MAX_PARTITION] = {0};
    int64_t at[CP_ASSIGN_MAX_PARTITION]; /* a handed-over partition's start; -1 = none */
    uint32_t count = 0;
    const char *s = spec ? spec : "";
    while (*s) {
        while (*s == ' ')
            s++;
        const char *item = s;
        long a = number(&s), b = a;
        long long from = -1;
        if (a >= 0 && *s == '-') {
            s++;
            b = number(&s);
        } else if (a >= 0 && *s == '@' && isdigit((unsigned char)s[1])) {
            char *end;
            errno = 0;
            from = strtoll(s + 1, &end, 10);
            s = end;
            if (errno == ERANGE) a = -1; /* an offset past 2^63: bad item */
        }
        while (*s == ' ')
            s++;
        int again = 0; /* a partition named twice, in any two items */
        for (long p = a; a >= 0 && p <= b && !again; p++)
            again = seen[p];
        if (a < 0 || b < a || (*s && *s != ',') || again) {
            size_t l = strcspn(item, ",");
            return cp_err_set(err, CP_EPARSE,
                              "cluster.partitions '%.64s': bad item '%.*s' (expected partition "
                              "numbers 0..%d, ranges like 0-3 and handed-over partitions like "
                              "5@OFFSET, separated by commas, each partition once)",
                              spec, (int)(l > 32 ? 32 : l), item, CP_ASSIGN_MAX_PARTITION - 1);
        }
        for (long p = a; p <= b; p++) {
            at[p] = -1;
            seen[p] = 1;
            count++;
        }
        if (from >= 0) at[a] = from;
        if (*s == ',') s++;
    }
    if (!count)
        return cp_err_set(err, CP_EPARSE, "cluster.partitions '%.64s': no partition given",
                          spec ? spec : "");
    int32_t *v = malloc(count * sizeof *v);
    int64_t *st = start ? malloc(count * sizeof *st) : NULL;
    if (!v || (start && !st)) {
        free(v);
        free(st);
        return cp_err_set(err, CP_ENOMEM, "out of memory");
    }
    uint32_t k = 0;
    for (int32_t p = 0; p < CP_ASSIGN_MAX_PARTITION; p++)
        if (seen[p]) {
            if (st) st[k] = at[p];
            v[k++] = p;
        }
    *out = v;
    if (start) *start = st;
    *n = k;
    return 0;
}

rd_kafka_topic_partition_list_t *cp_assign_list(const char *topic, const char *spec, cp_err *err)
{
    int32_t *v;
    int64_t *st;
    uint32_t n;
    if (cp_assign_parse(spec, &v, &st, &n, err)) return NULL;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    for (uint32_t i = 0; l && i < n; i++)
        rd_kafka_topic_partition_list_add(l, topic, v[i])->offset =
            st[i] >= 0 ? st[i] : RD_KAFKA_OFFSET_INVALID;
    free(v);
    free(st);
    if (!l) cp_err_set(err, CP_ENOMEM, "out of memory");
    return l;
}
