/* Prometheus-style label selectors: {service="api",isolate=~"worker.*",version!="1.2"}. */
#ifndef CP_SELECTOR_H
#define CP_SELECTOR_H

#include <regex.h>
#include "error.h"
#include "labels.h"

typedef enum cp_match_op { CP_MATCH_EQ, CP_MATCH_NE, CP_MATCH_RE, CP_MATCH_NRE } cp_match_op;

typedef struct cp_matcher {
    char *name, *value; /* owned */
    cp_match_op op;
    int has_re; /* re compiled (anchored, extended) for RE and NRE */
    regex_t re;
} cp_matcher;

typedef struct cp_selector {
    cp_matcher *m; /* owned */
    uint32_t n;
} cp_selector;

#define CP_SELECTOR_MAX 4096 /* bytes of selector text */

/* Parses text ("" and "{}" select everything). On failure out is empty, the code is
 * CP_EPARSE and err says what was expected at which byte. */
int cp_selector_parse(const char *text, cp_selector *out, cp_err *err);
/* Frees what cp_selector_parse built (compiled regexes included); s is left empty. */
void cp_selector_close(cp_selector *s);
/* Refuses regular expressions that would make glibc's regcomp blow up (stacked repetition
 * operators such as "a++*", bounds over 255, nested repetitions expanding past 10,000
 * nodes, nesting deeper than 64): CP_EPARSE with err naming the byte offset within re.
 * Used for selectors and for every other regex a user sends (focus, ignore). */
int cp_regex_check(const char *re, cp_err *err);
/* The same with a lower expansion budget than 10,000: glibc's regexec costs grow with the
 * square of the expanded size (".{0,255}" repeated 39 times takes seconds per 100-byte
 * string), so regexes run against many long strings (focus, ignore) get a smaller one. */
int cp_regex_check_cost(const char *re, uint64_t max_cost, cp_err *err);
/* 1 if value (NULL = label absent, matched as "") satisfies m. */
int cp_matcher_match(const cp_matcher *m, const char *value);
/* 1 if every matcher holds for l. */
int cp_selector_match(const cp_selector *s, const cp_labels *l);

#endif
