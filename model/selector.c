/* Prometheus-style label selectors: parsing {name op "value", ...} into matchers whose
 * regexes are anchored POSIX extended expressions, and matching label sets against them.
 * Errors name the byte offset where the text stopped making sense. */
#include "selector.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ------------------------------------------------------------------------ */

typedef struct sel_parser {
    const char *s;
    size_t pos, len;
    cp_err *err;
} sel_parser;

static void skip_ws(sel_parser *p)
{
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                               p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static int is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_name_char(char c)
{
    return is_name_start(c) || (c >= '0' && c <= '9');
}

/* A printable description of the byte at pos, for error messages. */
static const char *describe(const sel_parser *p, char tmp[8])
{
    if (p->pos >= p->len) return "end of selector";
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c >= 0x20 && c < 0x7f) {
        tmp[0] = '\'';
        tmp[1] = (char)c;
        tmp[2] = '\'';
        tmp[3] = 0;
    } else {
        static const char hex[] = "0123456789abcdef";
        tmp[0] = '0';
        tmp[1] = 'x';
        tmp[2] = hex[c >> 4];
        tmp[3] = hex[c & 15];
        tmp[4] = 0;
    }
    return tmp;
}

static int expected(sel_parser *p, const char *what)
{
    char tmp[8];
    return cp_err_set(p->err, CP_EPARSE, "selector: expected %s at byte %zu, found %s", what,
                      p->pos, describe(p, tmp));
}

static int parse_name(sel_parser *p, char **out)
{
    size_t start = p->pos;
    if (p->pos >= p->len || !is_name_start(p->s[p->pos])) return expected(p, "a label name");
    while (p->pos < p->len && is_name_char(p->s[p->pos]))
        p->pos++;
    size_t n = p->pos - start;
    if (n > CP_LABEL_NAME_MAX)
        return cp_err_set(p->err, CP_EPARSE,
                          "selector: label name at byte %zu is %zu bytes long (limit %d)", start, n,
                          CP_LABEL_NAME_MAX);
    char *s = malloc(n + 1);
    if (!s) return cp_err_set(p->err, CP_ENOMEM, "selector: out of memory");
    memcpy(s, p->s + start, n);
    s[n] = 0;
    *out = s;
    return 0;
}

/* A quoted string: "..." or '...' with \\ \" \' \n \t \r escapes, or `...` raw. */
static int parse_string(sel_parser *p, char **out)
{
    if (p->pos >= p->len || (p->s[p->pos] != '"' && p->s[p->pos] != '\'' && p->s[p->pos] != '`'))
        return expected(p, "a quoted label value");
    size_t start = p->pos;
    char q = p->s[p->pos++];
    char *buf = malloc(p->len - p->pos + 1);
    if (!buf) return cp_err_set(p->err, CP_ENOMEM, "selector: out of memory");
    size_t n = 0;
    for (;;) {
        if (p->pos >= p->len) {
            free(buf);
            return cp_err_set(p->err, CP_EPARSE,
                              "selector: string opened at byte %zu is not closed", start);
        }
        char c = p->s[p->pos];
        if (c == q) {
            p->pos++;
            break;
        }
        if (c == '\\' && q != '`') {
            if (p->pos + 1 >= p->len) {
                p->pos++;
                continue; /* reported as unclosed on the next turn */
            }
            char e = p->s[p->pos + 1];
            switch (e) {
            case '\\':
                c = '\\';
                break;
            case '"':
                c = '"';
                break;
            case '\'':
                c = '\'';
                break;
            case 'n':
                c = '\n';
                break;
            case 't':
                c = '\t';
                break;
            case 'r':
                c = '\r';
                break;
            default:
                /* Keep unknown escapes as they are: regexes need \. and \d-like text. */
                buf[n++] = '\\';
                c = e;
                break;
            }
            p->pos += 2;
            buf[n++] = c;
            continue;
        }
        if (c == '\n' && q != '`') {
            free(buf);
            return cp_err_set(p->err, CP_EPARSE,
                              "selector: newline inside the string opened at byte %zu", start);
        }
        buf[n++] = c;
        p->pos++;
    }
    buf[n] = 0;
    if (n > CP_LABEL_VALUE_MAX) {
        free(buf);
        return cp_err_set(p->err, CP_EPARSE,
                          "selector: value at byte %zu is %zu bytes long (limit %d)", start, n,
                          CP_LABEL_VALUE_MAX);
    }
    *out = buf;
    return 0;
}

/* ---- regex complexity guard -------------------------------------------------------- */

#define RE_MAX_COST 10000
#define RE_MAX_DEPTH 64
#define RE_MAX_BOUND 255

typedef struct re_frame {
    uint64_t total; /* cost of this group so far */
    uint64_t last;  /* cost of the latest atom (what a quantifier applies to) */
    int quantified; /* the latest atom already has a quantifier */
    /* Whether things can match the empty string: glibc's matcher takes exponential time on
     * a repeated group that can, such as (()+){84} or (a*)*. */
    int last_nullable; /* the latest atom */
    int seq_before;    /* the current alternative, up to the latest atom */
    int seq_nullable;  /* the current alternative, latest atom included */
    int any_nullable;  /* some earlier alternative of this group */
} re_frame;

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

int cp_regex_check(const char *re, cp_err *err)
{
    return cp_regex_check_cost(re, RE_MAX_COST, err);
}

int cp_regex_check_cost(const char *re, uint64_t max_cost, cp_err *err)
{
    if (max_cost > RE_MAX_COST) max_cost = RE_MAX_COST;
    re_frame st[RE_MAX_DEPTH + 1];
    int sp = 0;
    memset(&st[0], 0, sizeof st[0]);
    st[0].seq_nullable = 1;
    size_t n = strlen(re);
    for (size_t i = 0; i < n; i++) {
        re_frame *f = &st[sp];
        char c = re[i];
        uint64_t atom = 0;
        int nullable = 0; /* of the atom being added */
        if (c == '\\') {
            if (i + 1 < n && re[i + 1] >= '1' && re[i + 1] <= '9')
                return cp_err_set(err, CP_EPARSE,
                                  "regular expression uses a backreference at byte %zu (not "
                                  "supported)",
                                  i);
            i++;
            atom = 1;
            /* GNU's zero-width escapes (word boundaries, buffer ends) match nothing */
            nullable = i < n && strchr("bB<>`'", re[i]) != NULL;
        } else if (c == '^' || c == '$') {
            atom = 1;
            nullable = 1; /* anchors match nothing */
        } else if (c == '[') {
            size_t j = i + 1;
            if (j < n && re[j] == '^') j++;
            if (j < n && re[j] == ']') j++;
            while (j < n && re[j] != ']') {
                if (re[j] == '[' && j + 1 < n &&
                    (re[j + 1] == ':' || re[j + 1] == '.' || re[j + 1] == '=')) {
                    char close = re[j + 1];
                    j += 2;
                    while (j + 1 < n && !(re[j] == close && re[j + 1] == ']'))
                        j++;
                    j += 2;
                } else {
                    j++;
                }
            }
            i = j < n ? j : n; /* an unclosed bracket is left to regcomp to report */
            atom = 1;
        } else if (c == '(') {
            if (sp == RE_MAX_DEPTH)
                return cp_err_set(err, CP_EPARSE,
                                  "regular expression nests groups deeper than %d at byte %zu",
                                  RE_MAX_DEPTH, i);
            sp++;
            memset(&st[sp], 0, sizeof st[sp]);
            st[sp].seq_nullable = 1;
            continue;
        } else if (c == ')' && sp == 0) {
            /* it would close the group the selector wraps the expression in (^(...)$):
             * another match than written, and a repetition after it over all before */
            return cp_err_set(err, CP_EPARSE, "regular expression has an unmatched ')' at byte %zu",
                              i);
        } else if (c == ')') {
            atom = st[sp].total ? st[sp].total : 1;
            nullable = st[sp].any_nullable || st[sp].seq_nullable;
            sp--;
            f = &st[sp];
        } else if (c == '|') {
            f->last = 0;
            f->quantified = 0;
            f->any_nullable |= f->seq_nullable;
            f->seq_nullable = 1;
            f->last_nullable = 0;
            continue;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            uint64_t factor = c == '+' ? 2 : 1;
            size_t at = i;
            int min_zero = 0; /* an interval {0,n} */
            if (c == '{') {
                size_t j = i + 1;
                uint64_t lo = 0, hi = 0;
                int dl = 0, dh = 0, comma = 0;
                while (j < n && re[j] >= '0' && re[j] <= '9' && dl < 6)
                    lo = lo * 10 + (uint64_t)(re[j++] - '0'), dl++;
                if (j < n && re[j] == ',') {
                    comma = 1;
                    j++;
                    while (j < n && re[j] >= '0' && re[j] <= '9' && dh < 6)
                        hi = hi * 10 + (uint64_t)(re[j++] - '0'), dh++;
                }
                /* glibc also reads "{,n}" as an interval, {0,n} */
                if (j >= n || re[j] != '}' || (!dl && !(comma && dh))) {
                    atom = 1; /* not an interval: a literal brace (or regcomp's error) */
                    goto add;
                }
                min_zero = lo == 0;
                if (!comma) hi = lo;
                if (comma && !dh) hi = lo + 1;
                if (lo > RE_MAX_BOUND || hi > RE_MAX_BOUND)
                    return cp_err_set(err, CP_EPARSE,
                                      "regular expression repeats more than %d times at byte %zu",
                                      RE_MAX_BOUND, at);
                factor = (hi > lo ? hi : lo) + 1;
                i = j;
            }
            if (f->quantified)
                return cp_err_set(err, CP_EPARSE,
                                  "regular expression has stacked repetition operators at byte %zu",
                                  at);
            int repeats = c == '*' || c == '+' || (c == '{' && factor > 2);
            if (f->last_nullable && repeats)
                return cp_err_set(err, CP_EPARSE,
                                  "regular expression repeats a group that can match nothing at "
                                  "byte %zu",
                                  at);
            if (c == '*' || c == '?' || (c == '{' && min_zero)) { /* the atom may be absent */
                f->last_nullable = 1;
                f->seq_nullable = f->seq_before;
            }
            if (f->last) {
                uint64_t grown = sat_mul(f->last, factor);
                f->total = f->total - f->last + grown;
                f->last = grown;
            }
            f->quantified = 1;
            goto check;
        } else {
            atom = 1;
        }
    add:
        f->total += atom;
        f->last = atom;
        f->quantified = 0;
        f->last_nullable = nullable;
        f->seq_before = f->seq_nullable;
        f->seq_nullable = f->seq_nullable && nullable;
    check:
        if (f->total > max_cost)
            return cp_err_set(err, CP_EPARSE,
                              "regular expression too complex at byte %zu (expands past %llu "
                              "nodes)",
                              i, (unsigned long long)max_cost);
    }
    return 0;
}

static void matcher_close(cp_matcher *m)
{
    free(m->name);
    free(m->value);
    if (m->has_re) regfree(&m->re);
    memset(m, 0, sizeof *m);
}

static int parse_matcher(sel_parser *p, cp_matcher *m)
{
    int rc = parse_name(p, &m->name);
    if (rc) return rc;
    skip_ws(p);
    size_t oppos = p->pos;
    const char *s = p->s + p->pos;
    size_t rest = p->len - p->pos;
    if (rest >= 2 && s[0] == '=' && s[1] == '~') {
        m->op = CP_MATCH_RE;
        p->pos += 2;
    } else if (rest >= 2 && s[0] == '!' && s[1] == '~') {
        m->op = CP_MATCH_NRE;
        p->pos += 2;
    } else if (rest >= 2 && s[0] == '!' && s[1] == '=') {
        m->op = CP_MATCH_NE;
        p->pos += 2;
    } else if (rest >= 1 && s[0] == '=') {
        m->op = CP_MATCH_EQ;
        p->pos += 1;
    } else {
        return expected(p, "one of = != =~ !~ after the label name");
    }
    skip_ws(p);
    size_t vpos = p->pos;
    rc = parse_string(p, &m->value);
    if (rc) return rc;
    if (m->op == CP_MATCH_RE || m->op == CP_MATCH_NRE) {
        cp_err rerr = {0};
        if (cp_regex_check(m->value, &rerr))
            return cp_err_set(p->err, CP_EPARSE, "selector: value at byte %zu: %s", vpos, rerr.msg);
        size_t n = strlen(m->value);
        char *anchored = malloc(n + 5);
        if (!anchored) return cp_err_set(p->err, CP_ENOMEM, "selector: out of memory");
        anchored[0] = '^';
        anchored[1] = '(';
        memcpy(anchored + 2, m->value, n);
        memcpy(anchored + 2 + n, ")$", 3);
        int rrc = regcomp(&m->re, anchored, REG_EXTENDED | REG_NOSUB);
        free(anchored);
        if (rrc) {
            char msg[128];
            regerror(rrc, NULL, msg, sizeof msg);
            return cp_err_set(p->err, CP_EPARSE,
                              "selector: bad regular expression at byte %zu (operator at byte "
                              "%zu): %s",
                              vpos, oppos, msg);
        }
        m->has_re = 1;
    }
    return 0;
}

int cp_selector_parse(const char *text, cp_selector *out, cp_err *err)
{
    memset(out, 0, sizeof *out);
    if (!text) text = "";
    sel_parser p = {.s = text, .pos = 0, .len = strlen(text), .err = err};
    if (p.len > CP_SELECTOR_MAX)
        return cp_err_set(err, CP_EPARSE, "selector: %zu bytes long (limit %d)", p.len,
                          CP_SELECTOR_MAX);
    CP_VEC(cp_matcher) ms = {0};
    int rc = 0;
    skip_ws(&p);
    int braces = 0;
    if (p.pos < p.len && p.s[p.pos] == '{') {
        braces = 1;
        p.pos++;
    }
    for (;;) {
        skip_ws(&p);
        if (p.pos >= p.len) {
            if (braces) {
                rc = expected(&p, "'}'");
                goto fail;
            }
            break;
        }
        if (braces && p.s[p.pos] == '}') {
            p.pos++;
            skip_ws(&p);
            if (p.pos < p.len) {
                rc = expected(&p, "end of selector after '}'");
                goto fail;
            }
            break;
        }
        if (ms.n >= CP_LABELS_MAX) {
            rc = cp_err_set(err, CP_EPARSE, "selector: more than %d matchers at byte %zu",
                            CP_LABELS_MAX, p.pos);
            goto fail;
        }
        cp_matcher m = {0};
        rc = parse_matcher(&p, &m);
        if (rc) {
            matcher_close(&m);
            goto fail;
        }
        if (cp_vec_push(&ms, m)) {
            matcher_close(&m);
            rc = cp_err_set(err, CP_ENOMEM, "selector: out of memory");
            goto fail;
        }
        skip_ws(&p);
        if (p.pos < p.len && p.s[p.pos] == ',') {
            p.pos++;
            continue;
        }
        if (p.pos >= p.len && !braces) break;
        if (p.pos < p.len && braces && p.s[p.pos] == '}') continue;
        rc = expected(&p, braces ? "',' or '}'" : "',' or end of selector");
        goto fail;
    }
    out->m = ms.v;
    out->n = ms.n;
    return 0;
fail:
    for (uint32_t i = 0; i < ms.n; i++)
        matcher_close(&ms.v[i]);
    free(ms.v);
    return rc;
}

void cp_selector_close(cp_selector *s)
{
    if (!s) return;
    for (uint32_t i = 0; i < s->n; i++)
        matcher_close(&s->m[i]);
    free(s->m);
    s->m = NULL;
    s->n = 0;
}

/* ---- matching ----------------------------------------------------------------------- */

int cp_matcher_match(const cp_matcher *m, const char *value)
{
    if (!value) value = "";
    switch (m->op) {
    case CP_MATCH_EQ:
        return strcmp(value, m->value) == 0;
    case CP_MATCH_NE:
        return strcmp(value, m->value) != 0;
    case CP_MATCH_RE:
        return m->has_re && regexec(&m->re, value, 0, NULL, 0) == 0;
    case CP_MATCH_NRE:
        return m->has_re && regexec(&m->re, value, 0, NULL, 0) != 0;
    }
    return 0;
}

int cp_selector_match(const cp_selector *s, const cp_labels *l)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (!cp_matcher_match(&s->m[i], cp_labels_get(l, s->m[i].name))) return 0;
    return 1;
}
