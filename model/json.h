/* JSON, the one copy every stage uses: the escaping of strings the API and renderers write,
 * and a small reader that parses an answer of the API into a tree (the CLI's tables, the
 * brokers client). Not for untrusted giant input: depth is bounded, sizes are the
 * caller's (the response limit of http_client.h). */
#ifndef CP_JSON_H
#define CP_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "vec.h"

typedef enum cp_json_type {
    CP_JSON_NULL,
    CP_JSON_BOOL,
    CP_JSON_NUMBER,
    CP_JSON_STRING,
    CP_JSON_ARRAY,
    CP_JSON_OBJECT
} cp_json_type;

typedef struct cp_json cp_json;
struct cp_json {
    cp_json_type type;
    double num;      /* NUMBER (and BOOL: 0 or 1) */
    int64_t i64;     /* NUMBER: exact when is_int */
    int is_int;      /* NUMBER without fraction or exponent that fits an int64_t */
    char *str;       /* STRING, NUL-terminated (embedded NULs refused) */
    uint32_t n;      /* ARRAY, OBJECT: number of members */
    char **keys;     /* OBJECT: member names */
    cp_json **items; /* ARRAY, OBJECT: members */
};

/* Appends s[0..n) JSON-escaped (without the quotes) to b: '"', '\\' and control bytes
 * (and DEL) escaped, everything else (UTF-8 included) copied. Returns 0 or CP_ENOMEM (b
 * may then hold part of the text). */
int cp_json_escape(cp_buf *b, const char *s, size_t n);

/* Writes code point cp as UTF-8 into out (U+FFFD for a surrogate or anything past
 * U+10FFFF); returns its length, 1 to 4. The one encoder behind every reader's \u escapes
 * and strings (this one, sourcemap.c, heapsnap.c, collector/python.c). */
size_t cp_utf8_put(uint32_t cp, char out[4]);

/* Parses text[0..len) (one value, whitespace around it allowed). On success *out is the
 * caller's (cp_json_free). CP_EPARSE with err naming the byte offset, or CP_ENOMEM. */
int cp_json_parse(const char *text, size_t len, cp_json **out, cp_err *err);
/* Frees a tree from cp_json_parse, strings and members included. NULL is fine. */
void cp_json_free(cp_json *j);

/* The member key of object o, or NULL (also when o is NULL or not an object). */
const cp_json *cp_json_get(const cp_json *o, const char *key);
/* The string of j, or def when j is not a string. */
const char *cp_json_str(const cp_json *j, const char *def);
/* The number of j as int64_t (rounded), or def when j is not a number. */
int64_t cp_json_int(const cp_json *j, int64_t def);

#endif
