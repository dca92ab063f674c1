/* The CLI's human views of the API's JSON answers: aligned tables for series, labels,
 * timeline (with a bar column) and diff (like `pprof -top -diff_base`). Values carry their
 * units through the same formatter as `top` (cp_render_value). */
#ifndef CP_QUERY_VIEWS_H
#define CP_QUERY_VIEWS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "vec.h"

/* Each parses json[0..len) (the body of the matching /api/v1 answer) and appends a table
 * to out. Returns 0, CP_EPARSE with err naming what was missing or malformed, or
 * CP_ENOMEM. */

/* GET /api/v1/series: TYPE, one column per label name (service, version, instance and
 * isolate first, then the others by name; "-" where a series has no such label), FIRST,
 * LAST; rows sorted by type (cpu, alloc, inuse), then by their labels. */
int cp_view_series(const char *json, size_t len, cp_buf *out, cp_err *err);

/* GET /api/v1/labels (one column LABEL) or /api/v1/labels/NAME/values (one column, NAME
 * in capitals). */
int cp_view_labels(const char *json, size_t len, cp_buf *out, cp_err *err);

/* GET /api/v1/timeline: a header line, then TIME, one column per sample type with units,
 * and a bar of '#' for the last sample type, 40 wide at the largest point. */
int cp_view_timeline(const char *json, size_t len, cp_buf *out, cp_err *err);

/* GET /api/v1/diff?format=json: the windows and totals, then one row per function with a
 * change, the largest flat change first: signed flat and cum deltas and their share of the
 * base total (pprof -top -diff_base). rows 0 = all. */
int cp_view_diff(const char *json, size_t len, uint32_t rows, cp_buf *out, cp_err *err);

#endif
