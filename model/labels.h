/* Label sets: sorted name=value pairs that identify a series (service, version, instance,
 * isolate and free-form labels). */
#ifndef CP_LABELS_H
#define CP_LABELS_H

#include <stdint.h>
#include "vec.h"

typedef struct cp_label_pair {
    char *name, *value; /* owned by the set */
} cp_label_pair;

/* Zero-initialise ({0}) before use; cp_labels_close frees. Kept sorted by name. */
typedef struct cp_labels {
    CP_VEC(cp_label_pair) p;
} cp_labels;

/* Well-known label names. */
#define CP_LABEL_SERVICE "service"
#define CP_LABEL_VERSION "version"
#define CP_LABEL_INSTANCE "instance"
#define CP_LABEL_ISOLATE "isolate"

#define CP_LABEL_NAME_MAX 128
#define CP_LABEL_VALUE_MAX 1024
#define CP_LABELS_MAX 64

/* Frees every name and value and leaves l empty (reusable). A zeroed l is fine. */
void cp_labels_close(cp_labels *l);
/* Frees the n pairs of v (their names and values) and v itself: the one way any array of
 * name=value pairs is freed (cp_labels_close, query parameters). NULL with n = 0 is fine. */
void cp_label_pairs_free(cp_label_pair *v, uint32_t n);
/* Sets name to value (copies both), replacing an existing value. 0 or CP_ENOMEM. */
int cp_labels_set(cp_labels *l, const char *name, const char *value);
/* The value of name, or NULL. */
const char *cp_labels_get(const cp_labels *l, const char *name);
/* Sets every label of src in dst (copies; dst's other labels stay). 0 or CP_ENOMEM. */
int cp_labels_copy(cp_labels *dst, const cp_labels *src);
/* Writes {a="b",c="d"} (values escaped as in Prometheus) to out. */
int cp_labels_format(const cp_labels *l, cp_buf *out);
/* 1 if name matches [A-Za-z_][A-Za-z0-9_]* and is at most CP_LABEL_NAME_MAX bytes. */
int cp_label_name_valid(const char *name);
/* 0 if value may be a label value: at most CP_LABEL_VALUE_MAX bytes and no ASCII control
 * character (a newline or an escape in a value would forge lines and colours in every text
 * answer, log and terminal that shows it); else the offset of the first bad byte + 1, or
 * -1 when it is too long. */
int cp_label_value_check(const char *value);
/* Replaces each ASCII control character in l's values with '?', so that a producer whose
 * names come from elsewhere (a thread's name, a runtime's isolate) never sends a set that
 * ingest refuses. Returns how many bytes it replaced. */
unsigned cp_labels_scrub(cp_labels *l);

#endif
