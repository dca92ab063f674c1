/* Protobuf messages as JSON trees and back, by a schema of field numbers: how querier.c
 * speaks Connect's application/proto with the handlers it has for application/json (the
 * request decoded into the tree its JSON would parse to; the JSON answer encoded). Pure,
 * over memory; the schemas themselves are querier.c's. */
#ifndef CP_QUERY_PBJSON_H
#define CP_QUERY_PBJSON_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"

typedef enum cp_pbj_type {
    CP_PBJ_STRING, /* wire 2; JSON string */
    CP_PBJ_INT64,  /* wire 0 (two's complement); JSON number or string of digits */
    CP_PBJ_ENUM,   /* wire 0; JSON number */
    CP_PBJ_BOOL,   /* wire 0; JSON true/false */
    CP_PBJ_DOUBLE, /* wire 1; JSON number */
    CP_PBJ_MSG     /* wire 2; JSON object of .msg */
} cp_pbj_type;

typedef struct cp_pbj_msg cp_pbj_msg;
typedef struct cp_pbj_field {
    uint32_t num;
    const char *name; /* the JSON name (camelCase, as proto3 JSON writes it) */
    cp_pbj_type type;
    int repeated;          /* JSON array; int64s written packed, read packed or not */
    const cp_pbj_msg *msg; /* CP_PBJ_MSG */
} cp_pbj_field;

struct cp_pbj_msg {
    const char *name; /* for error messages: "querier.v1.SelectSeriesRequest" */
    const cp_pbj_field *f;
    uint32_t n;
};

/* Decodes the message m from p[0..len) into a JSON object tree (*out, the caller's:
 * cp_json_free); fields not in m are skipped, a repeated field's occurrences gathered in one
 * array, a scalar's last one kept. CP_EPARSE naming the message, field and byte offset
 * (bad wire type for the field, truncated, nesting past 16), or CP_ENOMEM. */
int cp_pbj_decode(const cp_pbj_msg *m, const uint8_t *p, size_t len, cp_json **out, cp_err *err);

/* Appends the encoding of object j as message m to out: members not in m are skipped, zero
 * scalars and empty strings left out as proto3 does. CP_EINVAL naming the member whose value
 * has the wrong JSON type, or CP_ENOMEM (out then holds part of it). */
int cp_pbj_encode(const cp_pbj_msg *m, const cp_json *j, cp_buf *out, cp_err *err);

#endif
