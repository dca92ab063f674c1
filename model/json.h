/* JSON, the one reader and the one escaper of every stage: the escaping of strings the API,
 * the renderers and the V8 source write; a reader that parses text into a tree (the API's
 * answers for the CLI and the brokers client, the V8 inspector's messages and profiles);
 * small builders and a compact writer for trees built or edited in place.
 * Limits: objects and arrays nest at most CP_JSON_MAX_DEPTH deep (the parser recurses);
 * sizes are the caller's (the response limit of http_client.h, the V8 source's message
 * limit). Refused, with the byte offset: anything RFC 8259 does not allow (trailing text,
 * control bytes in strings, bad escapes, a lone high surrogate), "\u0000" (strings are
 * NUL-terminated) and, with CP_JSON_UTF8, strings that are not valid UTF-8. Numbers are
 * doubles, integers that fit an int64_t also exact. Objects are member lists: lookups are
 * linear (fine for the few members every reader's objects hold), duplicate keys kept (the
 * first wins). */
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
/* 1 when p[0..n) is UTF-8 as RFC 3629 defines it (shortest forms only, no surrogates, at
 * most U+10FFFF), else 0. The one check behind CP_JSON_UTF8 and the envelope's strings. */
int cp_utf8_valid(const void *p, size_t n);

/* Parses text[0..len) (one value, whitespace around it allowed). On success *out is the
 * caller's (cp_json_free). CP_EPARSE with err naming the byte offset, or CP_ENOMEM. */
int cp_json_parse(const char *text, size_t len, cp_json **out, cp_err *err);
/* Objects and arrays open at once that a parse accepts: the API's trees (two levels a
 * frame) of 500-frame stacks; V8's sampling heap profiles record at most 128 frames (a
 * reply 261 levels deep, node 20). ~200 bytes of stack a level. */
#define CP_JSON_MAX_DEPTH 1024
/* cp_json_parse's flag: refuse a string that is not valid UTF-8 (overlong forms, surrogates
 * and anything past U+10FFFF included), naming its byte offset. */
#define CP_JSON_UTF8 1u
/* cp_json_parse with flags (0 or CP_JSON_UTF8). */
int cp_json_parse_flags(const char *text, size_t len, unsigned flags, cp_json **out, cp_err *err);
/* Frees a tree (parsed or built), strings and members included. NULL is fine. */
void cp_json_free(cp_json *j);

/* The member key of object o, or NULL (also when o is NULL or not an object). */
const cp_json *cp_json_get(const cp_json *o, const char *key);
/* The string of j, or def when j is not a string. */
const char *cp_json_str(const cp_json *j, const char *def);
/* The number of j as int64_t (rounded), or def when j is not a number. */
int64_t cp_json_int(const cp_json *j, int64_t def);
/* The number of j, or def when j is not a number. */
double cp_json_num(const cp_json *j, double def);
/* 1 when j is not NULL and of type t. */
int cp_json_is(const cp_json *j, cp_json_type t);
/* 1 when j is a number without fraction or exponent that fits an int64_t (j->i64). */
int cp_json_is_int(const cp_json *j);
/* The number of members of array a (0 when a is NULL or not an array). */
size_t cp_json_len(const cp_json *a);
/* Member i of array a, or NULL (out of range, a NULL or not an array). */
const cp_json *cp_json_at(const cp_json *a, size_t i);

/* Building and editing trees (the caller's, as from cp_json_parse; free with cp_json_free). */

/* A new empty value of type t (NULL, false, 0, "" need members set by the caller); NULL on
 * out of memory. */
cp_json *cp_json_new(cp_json_type t);
/* A new integer number, or a new string holding a copy of s; NULL on out of memory. */
cp_json *cp_json_new_int(int64_t v);
cp_json *cp_json_new_str(const char *s);
/* Appends v to array a, or to object a under a copy of key. Takes v, even on failure (v
 * NULL: CP_ENOMEM, so a constructor's result can be passed unchecked). 0 or CP_ENOMEM. */
int cp_json_add(cp_json *a, const char *key, cp_json *v);
/* Sets member key of object o to v, replacing (and freeing) the first member of that
 * name or adding one. Takes v as cp_json_add does. 0, CP_EINVAL (o not an object) or
 * CP_ENOMEM. */
int cp_json_set(cp_json *o, const char *key, cp_json *v);
/* Removes the first member key of object o and returns it (now the caller's), or NULL. */
cp_json *cp_json_take(cp_json *o, const char *key);
/* A deep copy of j (NULL on out of memory, or for NULL). */
cp_json *cp_json_copy(const cp_json *j);
/* Appends j as compact JSON text to b (integers exact, other numbers with 17 significant
 * digits, non-finite ones as null). 0 or CP_ENOMEM. */
int cp_json_write(cp_buf *b, const cp_json *j);

#endif
