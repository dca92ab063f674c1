/* V8 heap snapshots into retainer profiles: a streaming JSON reader that keeps only the
 * graph, the dominator tree (Cooper, Harvey and Kennedy's iterative algorithm, as DevTools
 * computes it), and the paths of that tree folded by name into a profile. */
#include "heapsnap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "vec.h"

#define MIB (1024.0 * 1024.0)
#define MAX_PASSES 64 /* dominator passes; real heaps settle in under 10 */
#define SMALL 96      /* keys and meta names are short; longer ones are cut (never matched) */

void cp_heapsnap_limits_default(cp_heapsnap_limits *lim)
{
    lim->max_bytes = 512ULL << 20;
    lim->max_depth = 64;
    lim->max_frames = 200000;
    lim->max_children = 1000;
    lim->limit_name = "the heap snapshot memory limit";
}

/* ------------------------------------------------------------------------------------
 * The reader: where in the document a value is decides what is kept of it. */

enum ctx {
    C_SKIP,
    C_TOP,
    C_SNAPSHOT,
    C_META,
    C_NODE_FIELDS,
    C_EDGE_FIELDS,
    C_NODE_TYPES,
    C_EDGE_TYPES,
    C_NODE_TYPE_NAMES,
    C_EDGE_TYPE_NAMES,
    C_NODES,
    C_EDGES,
    C_STRINGS
};

enum state {
    S_VALUE, /* a value comes next */
    S_FIRST, /* right after '[': a value or ']' */
    S_KEY,   /* a key or '}' (right after '{'), or a key (after ',') */
    S_COLON,
    S_AFTER, /* ',' or the container's end */
    S_STR,
    S_ESC,
    S_HEX,
    S_NUM,
    S_LIT,
    S_DONE
};

typedef struct frame {
    uint8_t ctx, is_obj;
    uint32_t index; /* arrays: the element's index */
} frame;

typedef CP_VEC(char *) name_list;

struct cp_heapsnap {
    cp_heapsnap_limits lim;
    int failed; /* the error to repeat, 0 while fine */
    cp_err fail;
    uint64_t offset; /* bytes consumed */
    enum state st;
    frame stack[8]; /* the kept contexts; anything inside C_SKIP only counts depth */
    int depth;
    uint64_t skip_depth; /* open containers inside a skipped value */
    /* the token in progress */
    int str_is_key, str_ctx; /* the string's destination */
    size_t str_start;        /* where a string of C_STRINGS starts in text */
    char small[SMALL];
    size_t small_len;
    uint32_t hex, nhex, high; /* \uXXXX, a pending high surrogate */
    uint64_t num;
    int num_ok; /* digits only so far, and not too large */
    const char *lit;
    size_t lit_pos;
    char key[SMALL]; /* the last key of the innermost kept object */
    /* meta */
    name_list node_fields, edge_fields, node_types, edge_types;
    int nf, ef; /* fields per node and per edge, once meta is read */
    int f_type, f_name, f_size, f_edges, e_type, e_name, e_to;
    uint64_t node_count, edge_count; /* as claimed; 0 = not given */
    /* the graph */
    uint64_t nvals, evals; /* numbers read into nodes and edges */
    uint8_t *ntype;
    uint32_t *nname, *nsize, *nedges;
    uint32_t ncap;
    uint8_t *etype;
    uint32_t *ename, *eto;
    uint32_t ecap;
    cp_buf text;              /* the strings, NUL-terminated */
    CP_VEC(uint32_t) str_off; /* where string i starts in text */
    uint64_t held, peak;
};

int cp_heapsnap_create(const cp_heapsnap_limits *lim, cp_heapsnap **out)
{
    cp_heapsnap *h = calloc(1, sizeof(*h));
    if (!h) return CP_ENOMEM;
    if (lim)
        h->lim = *lim;
    else
        cp_heapsnap_limits_default(&h->lim);
    if (!h->lim.limit_name) h->lim.limit_name = "the heap snapshot memory limit";
    h->st = S_VALUE;
    h->f_type = h->f_name = h->f_size = h->f_edges = -1;
    h->e_type = h->e_name = h->e_to = -1;
    *out = h;
    return 0;
}

static void free_names(name_list *l)
{
    for (uint32_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

void cp_heapsnap_destroy(cp_heapsnap *h)
{
    if (!h) return;
    free_names(&h->node_fields);
    free_names(&h->edge_fields);
    free_names(&h->node_types);
    free_names(&h->edge_types);
    free(h->ntype);
    free(h->nname);
    free(h->nsize);
    free(h->nedges);
    free(h->etype);
    free(h->ename);
    free(h->eto);
    cp_buf_close(&h->text);
    free(h->str_off.v);
    free(h);
}

static int fail(cp_heapsnap *h, int code, cp_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(cp_heapsnap *h, int code, cp_err *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[200];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    h->failed = code;
    cp_err_set(&h->fail, code, "heap snapshot: %s", msg);
    if (err) *err = h->fail;
    return code;
}

static int over_limit(cp_heapsnap *h, cp_err *err, uint64_t more, const char *what)
{
    return fail(h, CP_ELIMIT, err, "%s would hold %.0f MiB, over %s (%.0f MiB)", what,
                (double)(h->held + more) / MIB, h->lim.limit_name, (double)h->lim.max_bytes / MIB);
}

/* Counts more bytes as held; CP_ELIMIT past the limit. */
static int hold(cp_heapsnap *h, cp_err *err, uint64_t more, const char *what)
{
    if (more > h->lim.max_bytes || h->held + more > h->lim.max_bytes)
        return over_limit(h, err, more, what);
    h->held += more;
    if (h->held > h->peak) h->peak = h->held;
    return 0;
}

static void release(cp_heapsnap *h, uint64_t bytes)
{
    h->held = bytes > h->held ? 0 : h->held - bytes;
}

static int index_of(const name_list *l, const char *name)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], name)) return (int)i;
    return -1;
}

/* Node and edge columns grown to hold at least want entries. */
static int grow_nodes(cp_heapsnap *h, uint64_t want, cp_err *err)
{
    if (want <= h->ncap) return 0;
    uint64_t cap = h->ncap ? (uint64_t)h->ncap * 2 : 4096;
    if (cap < want) cap = want;
    if (cap > UINT32_MAX) cap = UINT32_MAX;
    if (want > cap) return fail(h, CP_ELIMIT, err, "more than %u nodes", UINT32_MAX);
    if (hold(h, err, (cap - h->ncap) * 13, "its nodes")) return h->failed;
    uint8_t *t = realloc(h->ntype, cap);
    if (t) h->ntype = t;
    uint32_t *a = realloc(h->nname, cap * 4);
    if (a) h->nname = a;
    uint32_t *b = realloc(h->nsize, cap * 4);
    if (b) h->nsize = b;
    uint32_t *c = realloc(h->nedges, cap * 4);
    if (c) h->nedges = c;
    if (!t || !a || !b || !c) return fail(h, CP_ENOMEM, err, "out of memory for the nodes");
    h->ncap = (uint32_t)cap;
    return 0;
}

static int grow_edges(cp_heapsnap *h, uint64_t want, cp_err *err)
{
    if (want <= h->ecap) return 0;
    uint64_t cap = h->ecap ? (uint64_t)h->ecap * 2 : 16384;
    if (cap < want) cap = want;
    if (cap > UINT32_MAX) cap = UINT32_MAX;
    if (want > cap) return fail(h, CP_ELIMIT, err, "more than %u edges", UINT32_MAX);
    if (hold(h, err, (cap - h->ecap) * 9, "its edges")) return h->failed;
    uint8_t *t = realloc(h->etype, cap);
    if (t) h->etype = t;
    uint32_t *a = realloc(h->ename, cap * 4);
    if (a) h->ename = a;
    uint32_t *b = realloc(h->eto, cap * 4);
    if (b) h->eto = b;
    if (!t || !a || !b) return fail(h, CP_ENOMEM, err, "out of memory for the edges");
    h->ecap = (uint32_t)cap;
    return 0;
}

/* The meta is complete when nodes or edges start: find the fields used. */
static int meta_ready(cp_heapsnap *h, cp_err *err)
{
    if (h->nf) return 0;
    h->nf = (int)h->node_fields.n;
    h->ef = (int)h->edge_fields.n;
    h->f_type = index_of(&h->node_fields, "type");
    h->f_name = index_of(&h->node_fields, "name");
    h->f_size = index_of(&h->node_fields, "self_size");
    h->f_edges = index_of(&h->node_fields, "edge_count");
    h->e_type = index_of(&h->edge_fields, "type");
    h->e_name = index_of(&h->edge_fields, "name_or_index");
    h->e_to = index_of(&h->edge_fields, "to_node");
    if (h->f_type < 0 || h->f_name < 0 || h->f_size < 0 || h->f_edges < 0 || h->e_type < 0 ||
        h->e_name < 0 || h->e_to < 0 || !h->node_types.n || !h->edge_types.n)
        return fail(h, CP_EPARSE, err,
                    "snapshot.meta before byte %llu lacks node_fields type/name/self_size/"
                    "edge_count, edge_fields type/name_or_index/to_node or the type names",
                    (unsigned long long)h->offset);
    if (h->node_count && grow_nodes(h, h->node_count, err)) return h->failed;
    if (h->edge_count && grow_edges(h, h->edge_count, err)) return h->failed;
    return 0;
}

static int put_number(cp_heapsnap *h, int ctx, cp_err *err)
{
    if (ctx != C_NODES && ctx != C_EDGES) return 0;
    if (!h->num_ok)
        return fail(h, CP_EPARSE, err, "byte %llu: a %s value that is not an integer below 2^32",
                    (unsigned long long)h->offset, ctx == C_NODES ? "nodes" : "edges");
    if (meta_ready(h, err)) return h->failed;
    uint32_t v = (uint32_t)h->num;
    if (ctx == C_NODES) {
        uint64_t i = h->nvals / (uint64_t)h->nf;
        int f = (int)(h->nvals % (uint64_t)h->nf);
        if (i >= h->ncap && grow_nodes(h, i + 1, err)) return h->failed;
        if (f == h->f_type) {
            if (v >= h->node_types.n)
                return fail(h, CP_EPARSE, err, "node %llu: type %u of %u types",
                            (unsigned long long)i, v, h->node_types.n);
            h->ntype[i] = (uint8_t)v;
        } else if (f == h->f_name) {
            h->nname[i] = v;
        } else if (f == h->f_size) {
            h->nsize[i] = v;
        } else if (f == h->f_edges) {
            h->nedges[i] = v;
        }
        h->nvals++;
    } else {
        uint64_t i = h->evals / (uint64_t)h->ef;
        int f = (int)(h->evals % (uint64_t)h->ef);
        if (i >= h->ecap && grow_edges(h, i + 1, err)) return h->failed;
        if (f == h->e_type) {
            if (v >= h->edge_types.n)
                return fail(h, CP_EPARSE, err, "edge %llu: type %u of %u types",
                            (unsigned long long)i, v, h->edge_types.n);
            h->etype[i] = (uint8_t)v;
        } else if (f == h->e_name) {
            h->ename[i] = v;
        } else if (f == h->e_to) {
            if (v % (uint32_t)h->nf)
                return fail(h, CP_EPARSE, err, "edge %llu: to_node %u is not a node's start",
                            (unsigned long long)i, v);
            h->eto[i] = v / (uint32_t)h->nf;
        }
        h->evals++;
    }
    return 0;
}

/* A scalar number in the snapshot object: node_count, edge_count. */
static int put_count(cp_heapsnap *h, cp_err *err)
{
    if (!h->num_ok) return 0;
    uint64_t *dst = !strcmp(h->key, "node_count")   ? &h->node_count
                    : !strcmp(h->key, "edge_count") ? &h->edge_count
                                                    : NULL;
    if (!dst) return 0;
    *dst = h->num;
    /* a claim the limit cannot hold is refused before anything is read */
    uint64_t need = h->node_count * 13 + h->edge_count * 9;
    if (need > h->lim.max_bytes) return over_limit(h, err, need, "its claimed graph");
    return 0;
}

static int append_small(cp_heapsnap *h, const char *s, size_t n)
{
    if (h->small_len + n < SMALL) {
        memcpy(h->small + h->small_len, s, n);
        h->small_len += n;
    } else {
        h->small_len = SMALL; /* cut: matches nothing */
    }
    return 0;
}

/* n bytes of the string in progress to where it goes. */
static int str_bytes(cp_heapsnap *h, const char *s, size_t n, cp_err *err)
{
    if (h->str_is_key || (h->str_ctx >= C_NODE_FIELDS && h->str_ctx <= C_EDGE_TYPE_NAMES))
        return append_small(h, s, n);
    if (h->str_ctx != C_STRINGS) return 0;
    if (hold(h, err, n, "its strings")) return h->failed;
    if (cp_buf_append(&h->text, s, n)) return fail(h, CP_ENOMEM, err, "out of memory");
    return 0;
}

static int put_codepoint(cp_heapsnap *h, uint32_t cp, cp_err *err)
{
    char u[4];
    return str_bytes(h, u, cp_utf8_put(cp, u), err);
}

static int name_to(name_list *l, const char *s, size_t n)
{
    if (l->n >= 64) return 0; /* meta lists are short; more are ignored */
    char *c = malloc(n + 1);
    if (!c) return CP_ENOMEM;
    memcpy(c, s, n);
    c[n] = 0;
    if (cp_vec_push(l, c)) {
        free(c);
        return CP_ENOMEM;
    }
    return 0;
}

static int end_string(cp_heapsnap *h, cp_err *err)
{
    if (h->high && put_codepoint(h, 0xfffd, err)) return h->failed;
    h->high = 0;
    if (h->str_is_key) {
        size_t n = h->small_len < SMALL ? h->small_len : 0;
        memcpy(h->key, h->small, n);
        h->key[n] = 0;
        return 0;
    }
    name_list *l = h->str_ctx == C_NODE_FIELDS       ? &h->node_fields
                   : h->str_ctx == C_EDGE_FIELDS     ? &h->edge_fields
                   : h->str_ctx == C_NODE_TYPE_NAMES ? &h->node_types
                   : h->str_ctx == C_EDGE_TYPE_NAMES ? &h->edge_types
                                                     : NULL;
    if (l && h->small_len < SMALL && name_to(l, h->small, h->small_len))
        return fail(h, CP_ENOMEM, err, "out of memory");
    if (h->str_ctx == C_STRINGS) {
        if (h->text.len > UINT32_MAX - 1) return over_limit(h, err, 0, "its strings");
        if (hold(h, err, 5, "its strings")) return h->failed;
        if (cp_vec_push(&h->str_off, (uint32_t)h->str_start))
            return fail(h, CP_ENOMEM, err, "out of memory");
        if (cp_buf_append(&h->text, "", 1)) return fail(h, CP_ENOMEM, err, "out of memory");
    }
    return 0;
}

/* The context of a value about to start inside the innermost kept container. */
static int child_ctx(const cp_heapsnap *h)
{
    if (h->skip_depth) return C_SKIP;
    if (h->depth == 0) return C_TOP;
    const frame *f = &h->stack[h->depth - 1];
    switch (f->ctx) {
    case C_TOP:
        if (!strcmp(h->key, "snapshot")) return C_SNAPSHOT;
        if (!strcmp(h->key, "nodes")) return C_NODES;
        if (!strcmp(h->key, "edges")) return C_EDGES;
        if (!strcmp(h->key, "strings")) return C_STRINGS;
        return C_SKIP;
    case C_SNAPSHOT:
        return !strcmp(h->key, "meta") ? C_META : C_SKIP;
    case C_META:
        if (!strcmp(h->key, "node_fields")) return C_NODE_FIELDS;
        if (!strcmp(h->key, "edge_fields")) return C_EDGE_FIELDS;
        if (!strcmp(h->key, "node_types")) return C_NODE_TYPES;
        if (!strcmp(h->key, "edge_types")) return C_EDGE_TYPES;
        return C_SKIP;
    case C_NODE_TYPES:
        return f->index == 0 ? C_NODE_TYPE_NAMES : C_SKIP;
    case C_EDGE_TYPES:
        return f->index == 0 ? C_EDGE_TYPE_NAMES : C_SKIP;
    case C_NODE_FIELDS:
    case C_EDGE_FIELDS:
    case C_NODE_TYPE_NAMES:
    case C_EDGE_TYPE_NAMES:
    case C_STRINGS:
        return f->ctx; /* their strings */
    case C_NODES:
    case C_EDGES:
        return f->ctx;
    default:
        return C_SKIP;
    }
}

/* What each kept context must be: objects for the top, snapshot and meta, arrays for the rest. */
static int wants_object(int ctx)
{
    return ctx == C_TOP || ctx == C_SNAPSHOT || ctx == C_META;
}

static int open_container(cp_heapsnap *h, int is_obj, cp_err *err)
{
    int ctx = child_ctx(h);
    if (ctx == C_SKIP) { /* a skipped value: only its depth is counted */
        h->skip_depth++;
        return 0;
    }
    if (h->depth && h->stack[h->depth - 1].ctx == ctx)
        return fail(h, CP_EPARSE, err, "byte %llu: a nested value where numbers or strings belong",
                    (unsigned long long)h->offset);
    if (wants_object(ctx) != is_obj)
        return fail(h, CP_EPARSE, err, "byte %llu: %s where %s belongs",
                    (unsigned long long)h->offset, is_obj ? "an object" : "an array",
                    is_obj ? "an array" : "an object");
    if (h->depth == (int)(sizeof(h->stack) / sizeof(h->stack[0])))
        return fail(h, CP_EPARSE, err, "byte %llu: nested too deep", (unsigned long long)h->offset);
    if ((ctx == C_NODES || ctx == C_EDGES) && meta_ready(h, err)) return h->failed;
    h->stack[h->depth++] = (frame){.ctx = (uint8_t)ctx, .is_obj = (uint8_t)is_obj};
    h->key[0] = 0;
    return 0;
}

/* A value ended: the next array element's index, and the top-level document's end. */
static void value_done(cp_heapsnap *h)
{
    if (h->skip_depth) {
        h->st = S_AFTER;
        return;
    }
    if (h->depth == 0) {
        h->st = S_DONE;
        return;
    }
    h->st = S_AFTER;
}

static int close_container(cp_heapsnap *h, int is_obj, cp_err *err)
{
    if (h->skip_depth) {
        h->skip_depth--;
        value_done(h);
        return 0;
    }
    if (h->depth == 0 || h->stack[h->depth - 1].is_obj != is_obj)
        return fail(h, CP_EPARSE, err, "byte %llu: '%c' closes nothing open",
                    (unsigned long long)h->offset, is_obj ? '}' : ']');
    h->depth--;
    h->key[0] = 0;
    value_done(h);
    return 0;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* One value starts with c. */
static int start_value(cp_heapsnap *h, char c, cp_err *err)
{
    if (c == '{' || c == '[') {
        if (open_container(h, c == '{', err)) return h->failed;
        h->st = c == '{' ? S_KEY : S_FIRST;
        return 0;
    }
    int ctx = child_ctx(h);
    if (c == '"') {
        h->str_is_key = 0;
        h->str_ctx = ctx;
        h->small_len = 0;
        h->high = 0;
        h->str_start = h->text.len;
        h->st = S_STR;
        if (ctx == C_NODES || ctx == C_EDGES)
            return fail(h, CP_EPARSE, err, "byte %llu: a string among the %s",
                        (unsigned long long)h->offset, ctx == C_NODES ? "nodes" : "edges");
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        h->num = c == '-' ? 0 : (uint64_t)(c - '0');
        h->num_ok = c != '-';
        h->str_ctx = ctx;
        h->st = S_NUM;
        return 0;
    }
    if (c == 't' || c == 'f' || c == 'n') {
        h->lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
        h->lit_pos = 1;
        h->str_ctx = ctx;
        h->st = S_LIT;
        if (ctx == C_NODES || ctx == C_EDGES)
            return fail(h, CP_EPARSE, err, "byte %llu: a literal among the %s",
                        (unsigned long long)h->offset, ctx == C_NODES ? "nodes" : "edges");
        return 0;
    }
    return fail(h, CP_EPARSE, err, "byte %llu: '%c' where a value belongs",
                (unsigned long long)h->offset, c);
}

static int end_scalar(cp_heapsnap *h, cp_err *err)
{
    if (h->depth && !h->skip_depth && h->stack[h->depth - 1].ctx == C_SNAPSHOT &&
        h->str_ctx == C_SKIP && put_count(h, err))
        return h->failed;
    if (!h->skip_depth && put_number(h, h->str_ctx, err)) return h->failed;
    return 0;
}

static void next_index(cp_heapsnap *h)
{
    if (!h->skip_depth && h->depth && !h->stack[h->depth - 1].is_obj)
        h->stack[h->depth - 1].index++;
}

/* S_AFTER: c (not white space) after a value: a comma, a container's end, or (inside a
 * skipped value) the ':' after a key read as a string. */
static int feed_after(cp_heapsnap *h, char c, cp_err *err)
{
    int in_obj = h->skip_depth ? -1 : h->stack[h->depth - 1].is_obj;
    if (c == ',') {
        next_index(h);
        /* inside a skipped value objects and arrays are not told apart: a key and its ':'
         * read as a string value followed by one */
        h->st = in_obj == 1 ? S_KEY : S_VALUE;
        return 0;
    }
    if (c == ':' && in_obj == -1) {
        h->st = S_VALUE;
        return 0;
    }
    if (c == '}' || c == ']') {
        if (in_obj != -1 && in_obj != (c == '}'))
            return fail(h, CP_EPARSE, err, "byte %llu: '%c' closes nothing open",
                        (unsigned long long)h->offset, c);
        return close_container(h, c == '}', err) ? h->failed : 0;
    }
    return fail(h, CP_EPARSE, err, "byte %llu: '%c' where ',' or an end belongs",
                (unsigned long long)h->offset, c);
}

/* S_STR at buf[*ip]: the run up to the next quote or backslash in one piece, then what
 * ends it. Leaves *ip (and h->offset) at the last byte consumed. */
static int feed_str(cp_heapsnap *h, const char *buf, size_t len, size_t *ip, cp_err *err)
{
    size_t i = *ip, j = i;
    while (j < len && buf[j] != '"' && buf[j] != '\\' && (unsigned char)buf[j] >= 0x20)
        j++;
    if (j > i) {
        if (h->high && put_codepoint(h, 0xfffd, err)) return h->failed;
        h->high = 0;
        if (str_bytes(h, buf + i, j - i, err)) return h->failed;
        h->offset += j - i;
        i = j;
        if (i == len) {
            h->offset--; /* the caller's increment */
            *ip = i - 1;
            return 0;
        }
    }
    *ip = i;
    char c = buf[i];
    if (c == '"') {
        if (end_string(h, err)) return h->failed;
        if (h->str_is_key)
            h->st = S_COLON;
        else
            value_done(h);
        return 0;
    }
    if (c == '\\') {
        h->st = S_ESC;
        return 0;
    }
    return fail(h, CP_EPARSE, err, "byte %llu: a control character in a string",
                (unsigned long long)h->offset);
}

/* S_ESC: the character after a backslash. */
static int feed_esc(cp_heapsnap *h, char c, cp_err *err)
{
    if (c == 'u') {
        h->hex = 0;
        h->nhex = 0;
        h->st = S_HEX;
        return 0;
    }
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
    const char *p = strchr(from, c);
    if (!p || !c)
        return fail(h, CP_EPARSE, err, "byte %llu: bad escape '\\%c'",
                    (unsigned long long)h->offset, c);
    if (h->high && put_codepoint(h, 0xfffd, err)) return h->failed;
    h->high = 0;
    if (str_bytes(h, to + (p - from), 1, err)) return h->failed;
    h->st = S_STR;
    return 0;
}

/* S_HEX: one hex digit of a \u escape; the fourth puts the code point (pairing
 * surrogates, U+FFFD for a lone one). */
static int feed_hex(cp_heapsnap *h, char c, cp_err *err)
{
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0)
        return fail(h, CP_EPARSE, err, "byte %llu: bad \\u escape", (unsigned long long)h->offset);
    h->hex = h->hex << 4 | (uint32_t)d;
    if (++h->nhex < 4) return 0;
    h->st = S_STR;
    uint32_t cp = h->hex;
    if (cp >= 0xd800 && cp < 0xdc00) {
        if (h->high && put_codepoint(h, 0xfffd, err)) return h->failed;
        h->high = cp;
        return 0;
    }
    if (cp >= 0xdc00 && cp < 0xe000) {
        cp = h->high ? 0x10000 + ((h->high - 0xd800) << 10) + (cp - 0xdc00) : 0xfffd;
        h->high = 0;
    } else if (h->high) {
        if (put_codepoint(h, 0xfffd, err)) return h->failed;
        h->high = 0;
    }
    return put_codepoint(h, cp, err) ? h->failed : 0;
}

int cp_heapsnap_feed(cp_heapsnap *h, const char *buf, size_t len, cp_err *err)
{
    if (h->failed) {
        if (err) *err = h->fail;
        return h->failed;
    }
    for (size_t i = 0; i < len; i++, h->offset++) {
        char c = buf[i];
        switch (h->st) {
        case S_VALUE:
        case S_FIRST:
            if (is_ws(c)) break;
            if (h->st == S_FIRST && c == ']') {
                if (close_container(h, 0, err)) return h->failed;
                break;
            }
            if (start_value(h, c, err)) return h->failed;
            break;
        case S_KEY:
            if (is_ws(c)) break;
            if (c == '}') {
                if (close_container(h, 1, err)) return h->failed;
                break;
            }
            if (c != '"')
                return fail(h, CP_EPARSE, err, "byte %llu: '%c' where a key belongs",
                            (unsigned long long)h->offset, c);
            h->str_is_key = 1;
            h->small_len = 0;
            h->high = 0;
            h->st = S_STR;
            break;
        case S_COLON:
            if (is_ws(c)) break;
            if (c != ':')
                return fail(h, CP_EPARSE, err, "byte %llu: '%c' where ':' belongs",
                            (unsigned long long)h->offset, c);
            h->st = S_VALUE;
            break;
        case S_AFTER:
            if (is_ws(c)) break;
            if (feed_after(h, c, err)) return h->failed;
            break;
        case S_STR:
            if (feed_str(h, buf, len, &i, err)) return h->failed;
            break;
        case S_ESC:
            if (feed_esc(h, c, err)) return h->failed;
            break;
        case S_HEX:
            if (feed_hex(h, c, err)) return h->failed;
            break;
        case S_NUM:
            if (c >= '0' && c <= '9') {
                if (h->num_ok) {
                    h->num = h->num * 10 + (uint64_t)(c - '0');
                    if (h->num > UINT32_MAX) h->num_ok = 0;
                }
                break;
            }
            if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
                h->num_ok = 0;
                break;
            }
            if (end_scalar(h, err)) return h->failed;
            value_done(h);
            i--; /* this byte belongs to what follows */
            h->offset--;
            break;
        case S_LIT:
            if (h->lit[h->lit_pos] != c)
                return fail(h, CP_EPARSE, err, "byte %llu: bad literal",
                            (unsigned long long)h->offset);
            if (!h->lit[++h->lit_pos]) value_done(h);
            break;
        case S_DONE:
            if (!is_ws(c))
                return fail(h, CP_EPARSE, err, "byte %llu: text after the snapshot's end",
                            (unsigned long long)h->offset);
            break;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------
 * The graph: dominators and the paths of their tree */

static const char *str_at(const cp_heapsnap *h, uint32_t id)
{
    return id < h->str_off.n ? (const char *)h->text.data + h->str_off.v[id] : "";
}

static int type_is(const name_list *l, uint8_t t, const char *name)
{
    return t < l->n && !strcmp(l->v[t], name);
}

/* The arrays of the dominator pass, all counted against the limit. */
typedef struct graph {
    uint32_t n, m;
    uint32_t *first; /* node i's edges are [first[i], first[i + 1]) */
    uint32_t *post;  /* postorder number; UINT32_MAX: not reached */
    uint32_t *order; /* nodes in postorder */
    uint32_t reached;
    uint32_t *pfirst; /* predecessors of node i: preds[pfirst[i] .. pfirst[i + 1]) */
    uint32_t *preds;
    uint32_t *idom;
    uint32_t *via;    /* the edge from idom[v] to v, if there is one; UINT32_MAX: none */
    uint32_t *script; /* a context's script name (a string id + 1), 0 = none */
    uint8_t weak, shortcut, context_edge, element, hidden_edge;
} graph;

static int essential(const cp_heapsnap *h, const graph *g, uint32_t from, uint32_t e)
{
    uint8_t t = h->etype[e];
    return t != g->weak && (t != g->shortcut || from == 0);
}

static uint32_t *take(cp_heapsnap *h, cp_err *err, uint64_t count, const char *what)
{
    if (hold(h, err, count * 4, what)) return NULL;
    uint32_t *p = malloc(count ? count * 4 : 4);
    if (!p) fail(h, CP_ENOMEM, err, "out of memory for %s", what);
    return p;
}

static void graph_free(cp_heapsnap *h, graph *g)
{
    uint32_t *a[] = {g->first, g->post, g->order, g->pfirst, g->preds, g->idom, g->via, g->script};
    for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
        free(a[i]);
    (void)h;
}

static uint8_t type_id(const name_list *l, const char *name)
{
    int i = index_of(l, name);
    return i < 0 ? 0xff : (uint8_t)i;
}

/* Checks the counts and targets, lays the edges out per node, numbers the nodes the roots
 * reach in postorder (an explicit stack: a heap may be a list a million deep). */
static int build(cp_heapsnap *h, graph *g, cp_err *err)
{
    if (!h->nf)
        return fail(h, CP_EPARSE, err, "no snapshot.meta, nodes and edges (%llu bytes read)",
                    (unsigned long long)h->offset);
    if (h->st != S_DONE)
        return fail(h, CP_EPARSE, err, "truncated at byte %llu", (unsigned long long)h->offset);
    if (h->nvals % (uint64_t)h->nf || h->evals % (uint64_t)h->ef)
        return fail(h, CP_EPARSE, err, "nodes or edges end in the middle of a record");
    uint64_t n = h->nvals / (uint64_t)h->nf, m = h->evals / (uint64_t)h->ef;
    if ((h->node_count && h->node_count != n) || (h->edge_count && h->edge_count != m))
        return fail(h, CP_EPARSE, err,
                    "%llu nodes and %llu edges where the meta says %llu and %llu",
                    (unsigned long long)n, (unsigned long long)m, (unsigned long long)h->node_count,
                    (unsigned long long)h->edge_count);
    if (n == 0) return fail(h, CP_EPARSE, err, "no nodes");
    g->n = (uint32_t)n;
    g->m = (uint32_t)m;
    g->weak = type_id(&h->edge_types, "weak");
    g->shortcut = type_id(&h->edge_types, "shortcut");
    g->context_edge = type_id(&h->edge_types, "context");
    g->element = type_id(&h->edge_types, "element");
    g->hidden_edge = type_id(&h->edge_types, "hidden");
    if (!(g->first = take(h, err, n + 1, "the edge index"))) return h->failed;
    uint64_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        g->first[i] = (uint32_t)at;
        at += h->nedges[i];
        if (at > m)
            return fail(h, CP_EPARSE, err, "node %u: its edge_count passes the %llu edges", i,
                        (unsigned long long)m);
        if (h->nname[i] >= h->str_off.n)
            return fail(h, CP_EPARSE, err, "node %u: name %u of %u strings", i, h->nname[i],
                        h->str_off.n);
    }
    if (at != m)
        return fail(h, CP_EPARSE, err, "the nodes' edge_counts add up to %llu of %llu edges",
                    (unsigned long long)at, (unsigned long long)m);
    g->first[n] = (uint32_t)m;
    for (uint32_t e = 0; e < m; e++) {
        if (h->eto[e] >= n)
            return fail(h, CP_EPARSE, err, "edge %u: to node %u of %u", e, h->eto[e], (uint32_t)n);
        uint8_t t = h->etype[e];
        if (t != g->element && t != g->hidden_edge && h->ename[e] >= h->str_off.n)
            return fail(h, CP_EPARSE, err, "edge %u: name %u of %u strings", e, h->ename[e],
                        h->str_off.n);
    }
    /* postorder from the root, node 0 */
    if (!(g->post = take(h, err, n, "the postorder")) ||
        !(g->order = take(h, err, n, "the postorder")))
        return h->failed;
    uint32_t *stack = take(h, err, 2 * n, "the walk's stack");
    if (!stack) return h->failed;
    memset(g->post, 0xff, n * 4);
    uint32_t sp = 0, count = 0;
    g->post[0] = UINT32_MAX - 1; /* on the stack */
    stack[sp++] = 0;
    stack[sp++] = g->first[0];
    while (sp) {
        uint32_t v = stack[sp - 2], *next = &stack[sp - 1];
        if (*next < g->first[v + 1]) {
            uint32_t e = (*next)++;
            uint32_t w = h->eto[e];
            if (essential(h, g, v, e) && g->post[w] == UINT32_MAX) {
                g->post[w] = UINT32_MAX - 1;
                stack[sp++] = w;
                stack[sp++] = g->first[w];
            }
            continue;
        }
        g->post[v] = count;
        g->order[count++] = v;
        sp -= 2;
    }
    free(stack);
    release(h, 8ULL * n);
    g->reached = count;
    return 0;
}

static uint32_t intersect(const graph *g, uint32_t a, uint32_t b)
{
    while (a != b) {
        while (g->post[a] < g->post[b])
            a = g->idom[a];
        while (g->post[b] < g->post[a])
            b = g->idom[b];
    }
    return a;
}

static int dominators(cp_heapsnap *h, graph *g, uint32_t *passes, cp_err *err)
{
    uint32_t n = g->n;
    if (!(g->pfirst = take(h, err, (uint64_t)n + 1, "the predecessors"))) return h->failed;
    memset(g->pfirst, 0, ((size_t)n + 1) * 4);
    uint64_t np = 0;
    for (uint32_t v = 0; v < n; v++) {
        if (g->post[v] == UINT32_MAX) continue;
        for (uint32_t e = g->first[v]; e < g->first[v + 1]; e++)
            if (essential(h, g, v, e)) {
                g->pfirst[h->eto[e] + 1]++;
                np++;
            }
    }
    for (uint32_t v = 0; v < n; v++)
        g->pfirst[v + 1] += g->pfirst[v];
    if (!(g->preds = take(h, err, np, "the predecessors"))) return h->failed;
    uint32_t *fill = take(h, err, n, "the predecessors");
    if (!fill) return h->failed;
    memcpy(fill, g->pfirst, (size_t)n * 4);
    for (uint32_t v = 0; v < n; v++) {
        if (g->post[v] == UINT32_MAX) continue;
        for (uint32_t e = g->first[v]; e < g->first[v + 1]; e++)
            if (essential(h, g, v, e)) g->preds[fill[h->eto[e]]++] = v;
    }
    free(fill);
    release(h, 4ULL * n);
    if (!(g->idom = take(h, err, n, "the dominators"))) return h->failed;
    memset(g->idom, 0xff, (size_t)n * 4);
    g->idom[0] = 0;
    int changed = 1;
    *passes = 0;
    while (changed) {
        if (++*passes > MAX_PASSES)
            return fail(h, CP_ELIMIT, err, "the dominator tree did not settle in %d passes",
                        MAX_PASSES);
        changed = 0;
        for (uint32_t k = g->reached; k-- > 0;) { /* reverse postorder */
            uint32_t v = g->order[k];
            if (v == 0) continue;
            uint32_t d = UINT32_MAX;
            for (uint32_t i = g->pfirst[v]; i < g->pfirst[v + 1]; i++) {
                uint32_t p = g->preds[i];
                if (g->idom[p] == UINT32_MAX) continue;
                d = d == UINT32_MAX ? p : intersect(g, p, d);
            }
            if (d != UINT32_MAX && g->idom[v] != d) {
                g->idom[v] = d;
                changed = 1;
            }
        }
    }
    return 0;
}

/* For each node the edge its dominator holds it by, if any (its name names the frame), and
 * for each context the script of a function that closes over it. */
static int naming(cp_heapsnap *h, graph *g, cp_err *err)
{
    uint32_t n = g->n;
    if (!(g->via = take(h, err, n, "the frame names")) ||
        !(g->script = take(h, err, n, "the frame names")))
        return h->failed;
    memset(g->via, 0xff, (size_t)n * 4);
    memset(g->script, 0, (size_t)n * 4);
    uint8_t closure = type_id(&h->node_types, "closure");
    for (uint32_t v = 0; v < n; v++) {
        if (g->post[v] == UINT32_MAX) continue;
        uint32_t ctx = UINT32_MAX, shared = UINT32_MAX;
        for (uint32_t e = g->first[v]; e < g->first[v + 1]; e++) {
            uint32_t w = h->eto[e];
            if (g->via[w] == UINT32_MAX && g->idom[w] == v && w != v) g->via[w] = e;
            if (h->ntype[v] != closure || h->etype[e] == g->element ||
                h->etype[e] == g->hidden_edge)
                continue;
            const char *en = str_at(h, h->ename[e]);
            if (!strcmp(en, "context")) ctx = w;
            if (!strcmp(en, "shared")) shared = w;
        }
        if (ctx == UINT32_MAX || shared == UINT32_MAX || g->script[ctx]) continue;
        for (uint32_t e = g->first[shared]; e < g->first[shared + 1]; e++) {
            if (h->etype[e] == g->element || h->etype[e] == g->hidden_edge) continue;
            const char *en = str_at(h, h->ename[e]);
            if (strcmp(en, "script_or_debug_info") && strcmp(en, "script")) continue;
            const char *s = str_at(h, h->nname[h->eto[e]]);
            if (*s) g->script[ctx] = h->nname[h->eto[e]] + 1;
            break;
        }
    }
    return 0;
}

/* The frame of node v (README.md "Heap snapshots"): what it is, and the name it is held
 * by where a property or variable of its dominator holds it. */
static size_t label(const cp_heapsnap *h, const graph *g, uint32_t v, char *out, size_t cap)
{
    const name_list *nt = &h->node_types;
    uint8_t t = h->ntype[v];
    const char *name = str_at(h, h->nname[v]);
    const char *what;
    char buf[160];
    if (g->script[v]) {
        const char *s = str_at(h, g->script[v] - 1), *slash = strrchr(s, '/');
        what = slash && slash[1] ? slash + 1 : s;
        while (*what == ' ')
            what++;
    } else if (type_is(nt, t, "object") || type_is(nt, t, "native")) {
        what = !strncmp(name, "system / ", 9) ? "(system)" : *name ? name : "(object)";
    } else if (type_is(nt, t, "closure")) {
        snprintf(buf, sizeof(buf), "%.140s()", *name ? name : "(anonymous)");
        what = buf;
    } else if (type_is(nt, t, "array")) {
        what = name[0] == '(' ? name : "(array)";
    } else if (type_is(nt, t, "string") || type_is(nt, t, "concatenated string") ||
               type_is(nt, t, "sliced string")) {
        what = "(string)";
    } else if (type_is(nt, t, "number") || type_is(nt, t, "bigint")) {
        what = "(number)";
    } else if (type_is(nt, t, "symbol")) {
        what = "(symbol)";
    } else if (type_is(nt, t, "regexp")) {
        what = "RegExp";
    } else if (type_is(nt, t, "code")) {
        what = "(compiled code)";
    } else if (type_is(nt, t, "synthetic")) {
        what = *name ? name : "(system)";
    } else {
        what = "(system)"; /* hidden, object shape, what a newer V8 adds */
    }
    uint32_t e = g->via[v];
    if (e != UINT32_MAX && !g->script[v] &&
        (h->etype[e] == g->context_edge || type_is(&h->edge_types, h->etype[e], "property") ||
         type_is(&h->edge_types, h->etype[e], "shortcut"))) {
        const char *en = str_at(h, h->ename[e]);
        if (*en && strcmp(en, "__proto__") && strcmp(en, "map"))
            return (size_t)snprintf(out, cap, "%.60s: %.140s", en, what);
    }
    return (size_t)snprintf(out, cap, "%.200s", what);
}

/* The tree of paths: one node per distinct (parent path, frame name). */
typedef struct path {
    uint32_t parent, func, depth, nchildren; /* func: a location id of out */
    uint64_t bytes, objects;
} path;

typedef struct paths {
    CP_VEC(path) v;
    uint64_t *slots; /* (parent << 32 | func) hashed; value = path index + 1 in the low bits */
    uint32_t *slot_path;
    uint32_t nslots;
    CP_VEC(uint32_t) loc_of_str; /* out's string id -> location id, 0 = none yet */
} paths;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static int paths_grow(paths *ps)
{
    uint32_t n = ps->nslots ? ps->nslots * 2 : 1024;
    uint64_t *s = calloc(n, 8);
    uint32_t *sp = calloc(n, 4);
    if (!s || !sp) {
        free(s);
        free(sp);
        return CP_ENOMEM;
    }
    for (uint32_t i = 0; i < ps->nslots; i++) {
        if (!ps->slot_path[i]) continue;
        uint32_t j = (uint32_t)mix(ps->slots[i]) & (n - 1);
        while (sp[j])
            j = (j + 1) & (n - 1);
        s[j] = ps->slots[i];
        sp[j] = ps->slot_path[i];
    }
    free(ps->slots);
    free(ps->slot_path);
    ps->slots = s;
    ps->slot_path = sp;
    ps->nslots = n;
    return 0;
}

/* The location id of a frame named s in out. */
static int frame_loc(cp_profile *out, paths *ps, const char *s, size_t len, uint32_t *loc)
{
    uint32_t sid;
    if (cp_profile_intern(out, s, len, &sid)) return CP_ENOMEM;
    while (ps->loc_of_str.n <= sid)
        if (cp_vec_push(&ps->loc_of_str, 0)) return CP_ENOMEM;
    if (ps->loc_of_str.v[sid]) {
        *loc = ps->loc_of_str.v[sid];
        return 0;
    }
    cp_function f = {.name = sid, .system_name = sid};
    uint32_t fid, lid;
    cp_line ln = {0, 0};
    if (cp_profile_add_function(out, &f, &fid)) return CP_ENOMEM;
    ln.function_id = fid;
    if (cp_profile_add_location(out, 0, 0, &ln, 1, &lid)) return CP_ENOMEM;
    ps->loc_of_str.v[sid] = lid;
    *loc = lid;
    return 0;
}

/* The path under parent named by location loc, made if new (0 = the root path). Returns
 * its index, or UINT32_MAX on out of memory. */
static uint32_t path_child(paths *ps, uint32_t parent, uint32_t loc)
{
    if ((uint64_t)(ps->v.n + 1) * 2 > ps->nslots && paths_grow(ps)) return UINT32_MAX;
    uint64_t key = (uint64_t)parent << 32 | loc;
    uint32_t j = (uint32_t)mix(key) & (ps->nslots - 1);
    while (ps->slot_path[j]) {
        if (ps->slots[j] == key) return ps->slot_path[j] - 1;
        j = (j + 1) & (ps->nslots - 1);
    }
    path p = {.parent = parent, .func = loc, .depth = ps->v.v[parent].depth + 1};
    if (cp_vec_push(&ps->v, p)) return UINT32_MAX;
    ps->v.v[parent].nchildren++;
    ps->slots[j] = key;
    ps->slot_path[j] = ps->v.n;
    return ps->v.n - 1;
}

static uint32_t find_child(const paths *ps, uint32_t parent, uint32_t loc)
{
    if (!ps->nslots) return UINT32_MAX;
    uint64_t key = (uint64_t)parent << 32 | loc;
    uint32_t j = (uint32_t)mix(key) & (ps->nslots - 1);
    while (ps->slot_path[j]) {
        if (ps->slots[j] == key) return ps->slot_path[j] - 1;
        j = (j + 1) & (ps->nslots - 1);
    }
    return UINT32_MAX;
}

static int emit(cp_heapsnap *h, graph *g, cp_profile *out, uint32_t *frames, cp_err *err)
{
    paths ps;
    memset(&ps, 0, sizeof(ps));
    int rc = CP_ENOMEM;
    uint32_t *path_of = take(h, err, g->n, "the paths");
    if (!path_of) return h->failed;
    uint32_t other = 0, deeper = 0;
    path root = {0};
    if (cp_vec_push(&ps.v, root) || frame_loc(out, &ps, "(other)", 7, &other) ||
        frame_loc(out, &ps, "(deeper)", 8, &deeper))
        goto done;
    path_of[0] = 0;
    char name[256];
    for (uint32_t k = g->reached; k-- > 0;) { /* dominators first */
        uint32_t v = g->order[k];
        if (v == 0) continue;
        uint32_t parent = path_of[g->idom[v]], at, loc;
        const path *pp = &ps.v.v[parent];
        if (pp->depth >= h->lim.max_depth) {
            at = parent; /* within "(deeper)" */
        } else {
            if (pp->depth + 1 == h->lim.max_depth) {
                loc = deeper;
            } else {
                size_t len = label(h, g, v, name, sizeof(name));
                if (len >= sizeof(name)) len = sizeof(name) - 1;
                if (frame_loc(out, &ps, name, len, &loc)) goto done;
            }
            at = find_child(&ps, parent, loc);
            if (at == UINT32_MAX) {
                if (pp->nchildren >= h->lim.max_children || ps.v.n >= h->lim.max_frames) {
                    loc = other;
                    at = find_child(&ps, parent, loc);
                }
                if (at == UINT32_MAX && ps.v.n >= h->lim.max_frames + 1000)
                    at = parent; /* the "(other)"s too are bounded */
                else if (at == UINT32_MAX && (at = path_child(&ps, parent, loc)) == UINT32_MAX)
                    goto done;
            }
        }
        path_of[v] = at;
        ps.v.v[at].bytes += h->nsize[v];
        ps.v.v[at].objects++;
    }
    if (cp_profile_add_sample_type(out, "retained_objects", "count") ||
        cp_profile_add_sample_type(out, "retained_space", "bytes") ||
        cp_profile_intern_cstr(out, "space", &out->period_type.type) ||
        cp_profile_intern_cstr(out, "bytes", &out->period_type.unit) ||
        cp_profile_intern_cstr(out, "retained_space", &out->default_sample_type))
        goto done;
    out->period = 1;
    uint32_t *stack = malloc((size_t)(h->lim.max_depth + 2) * 4);
    if (!stack) goto done;
    for (uint32_t i = 1; i < ps.v.n; i++) {
        const path *p = &ps.v.v[i];
        if (!p->objects) continue;
        uint32_t d = 0;
        for (uint32_t j = i; j && d < h->lim.max_depth + 2; j = ps.v.v[j].parent)
            stack[d++] = ps.v.v[j].func;
        int64_t vals[2] = {(int64_t)p->objects, (int64_t)p->bytes};
        if (cp_profile_add_sample(out, stack, d, vals, NULL, 0)) {
            free(stack);
            goto done;
        }
    }
    free(stack);
    *frames = ps.v.n - 1;
    rc = 0;
done:
    free(path_of);
    free(ps.v.v);
    free(ps.slots);
    free(ps.slot_path);
    free(ps.loc_of_str.v);
    if (rc) return fail(h, rc, err, "out of memory for the profile");
    return 0;
}

int cp_heapsnap_finish(cp_heapsnap *h, cp_profile *out, cp_heapsnap_stats *st, cp_err *err)
{
    graph g;
    memset(&g, 0, sizeof(g));
    uint32_t passes = 0, frames = 0;
    int rc = h->failed;
    if (!rc) rc = build(h, &g, err);
    if (!rc) rc = dominators(h, &g, &passes, err);
    if (!rc) rc = naming(h, &g, err);
    if (!rc) rc = emit(h, &g, out, &frames, err);
    if (rc && err && !h->failed) *err = h->fail;
    if (rc && err) *err = h->fail;
    if (st) {
        memset(st, 0, sizeof(*st));
        st->nodes = h->nf ? h->nvals / (uint64_t)h->nf : 0;
        st->edges = h->ef ? h->evals / (uint64_t)h->ef : 0;
        st->strings = h->str_off.n;
        st->reachable = g.reached ? g.reached - 1 : 0; /* the root is no object */
        for (uint32_t k = 0; !rc && k < g.reached; k++)
            if (g.order[k] != 0) st->total_bytes += h->nsize[g.order[k]];
        st->held_bytes = h->peak;
        st->passes = passes;
        st->frames = frames;
    }
    graph_free(h, &g);
    return rc;
}

/* ------------------------------------------------------------------------------------
 * Files */

int cp_heapsnap_looks_like(const void *head, size_t n)
{
    const char *p = head, *end = p + n;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return (size_t)(end - p) >= 11 && !memcmp(p, "{\"snapshot\"", 11);
}

int cp_heapsnap_read_file(const char *path, const cp_heapsnap_limits *lim, cp_profile *out,
                          cp_heapsnap_stats *st, cp_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cp_err_set(err, CP_EIO, "cannot open: %s", strerror(errno));
    cp_heapsnap *h = NULL;
    char *buf = malloc(1 << 20);
    cp_err e = {0};
    struct stat sb;
    int rc = CP_ENOMEM;
    if (!buf || cp_heapsnap_create(lim, &h)) {
        cp_err_set(&e, rc, "out of memory");
        goto done;
    }
    ssize_t n;
    while ((n = read(fd, buf, 1 << 20)) > 0)
        if ((rc = cp_heapsnap_feed(h, buf, (size_t)n, &e))) goto done;
    if (n < 0) {
        rc = cp_err_set(&e, CP_EIO, "read: %s", strerror(errno));
        goto done;
    }
    if ((rc = cp_heapsnap_finish(h, out, st, &e))) goto done;
    if (fstat(fd, &sb) == 0)
        out->time_nanos = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
done:
    if (rc && err) *err = e;
    cp_heapsnap_destroy(h);
    free(buf);
    close(fd);
    return rc;
}
