/* The in-memory profile: pprof's data model in flat arrays with dense ids, shared by every
 * stage. Ids of mappings, locations and functions are index + 1 (0 means none); strings
 * are ids into the profile's own table, where id 0 is always "". */
#ifndef CP_PROFILE_H
#define CP_PROFILE_H

#include <stdint.h>
#include <stddef.h>

#include "error.h"
#include "vec.h"

typedef struct cp_value_type {
    uint32_t type, unit; /* string ids */
} cp_value_type;

enum {
    CP_MAP_HAS_FUNCTIONS = 1,
    CP_MAP_HAS_FILENAMES = 2,
    CP_MAP_HAS_LINE_NUMBERS = 4,
    CP_MAP_HAS_INLINE_FRAMES = 8,
};

typedef struct cp_mapping {
    uint64_t start, limit, offset;
    uint32_t filename, build_id; /* string ids */
    uint32_t flags;              /* CP_MAP_HAS_* */
} cp_mapping;

typedef struct cp_line {
    uint32_t function_id;
    int64_t line;
} cp_line;

typedef struct cp_location {
    uint64_t address;
    uint32_t mapping_id;       /* 0 = none */
    uint32_t line_off, nlines; /* into cp_profile.lines; leaf (inlined) first */
    uint32_t is_folded;
} cp_location;

typedef struct cp_function {
    uint32_t name, system_name, filename; /* string ids */
    int64_t start_line;
} cp_function;

typedef struct cp_label {
    uint32_t key, str; /* string ids; str 0 for numeric labels */
    uint32_t num_unit; /* string id */
    int64_t num;
} cp_label;

typedef struct cp_sample {
    uint32_t loc_off, nlocs;     /* into cp_profile.stack: location ids, leaf first */
    uint32_t label_off, nlabels; /* into cp_profile.labels */
} cp_sample;

/* The string table with an intern index. Strings are stored NUL-terminated. */
typedef struct cp_strtab {
    char *buf;
    size_t len, cap;
    CP_VEC(uint32_t) off; /* offset of string i in buf */
    uint64_t *slots;      /* open addressing: hash << 32 | (string id + 1), 0 = empty */
    uint32_t nslots;
} cp_strtab;

typedef struct cp_profile {
    cp_strtab strs;
    CP_VEC(cp_value_type) sample_types;
    cp_value_type period_type;
    int64_t period, time_nanos, duration_nanos;
    uint32_t drop_frames, keep_frames, default_sample_type; /* string ids */
    CP_VEC(uint32_t) comments;                              /* string ids */
    CP_VEC(cp_mapping) mappings;
    CP_VEC(cp_location) locations;
    CP_VEC(cp_line) lines;
    CP_VEC(cp_function) functions;
    CP_VEC(cp_sample) samples;
    CP_VEC(uint32_t) stack;  /* location ids of all samples, back to back */
    CP_VEC(int64_t) values;  /* samples.n * sample_types.n, row-major */
    CP_VEC(cp_label) labels; /* labels of all samples, back to back */
} cp_profile;

/* Allocates an empty profile (string 0 = ""). Returns NULL on out of memory (the NULL-or-object
 * constructor: error.h, "Exceptions"). */
cp_profile *cp_profile_create(void);
/* Frees p and everything it owns; NULL is fine. */
void cp_profile_destroy(cp_profile *p);
/* Makes p empty again, keeping its allocations for reuse. */
void cp_profile_reset(cp_profile *p);

/* String id -> NUL-terminated string, valid until p changes. Out-of-range ids give "". */
const char *cp_profile_str(const cp_profile *p, uint32_t id);
/* Interns s (len bytes, need not be NUL-terminated) and returns its id in *id. */
int cp_profile_intern(cp_profile *p, const char *s, size_t len, uint32_t *id);
static inline int cp_profile_intern_cstr(cp_profile *p, const char *s, uint32_t *id)
{
    size_t n = 0;
    while (s[n])
        n++;
    return cp_profile_intern(p, s, n, id);
}
/* Appends a string without looking it up (duplicates allowed; used by the decoder, which
 * must keep the input's ids). */
int cp_profile_append_str(cp_profile *p, const char *s, size_t len);

/* Starts the next window of a stream that keeps its tables between windows (stable ids,
 * as the agent numbers an epoch): drops the samples (their location ids, values and
 * labels), the comments, the time and duration, and every string from id nstrings on (the
 * last window's own, such as its comments). Sample types, period, mappings, locations,
 * lines, functions and strings [0, nstrings) keep their ids, so the next window's tables
 * start with this one's. */
void cp_profile_next_window(cp_profile *p, uint32_t nstrings);

/* --- building a profile -----------------------------------------------------------
 * Each add returns 0 or CP_ENOMEM and the new id (index + 1) through *id. */
int cp_profile_add_sample_type(cp_profile *p, const char *type, const char *unit);
int cp_profile_add_function(cp_profile *p, const cp_function *f, uint32_t *id);
int cp_profile_add_mapping(cp_profile *p, const cp_mapping *m, uint32_t *id);
/* Adds a location with nlines lines (leaf first). */
int cp_profile_add_location(cp_profile *p, uint64_t address, uint32_t mapping_id,
                            const cp_line *lines, uint32_t nlines, uint32_t *id);
/* Adds a sample: nlocs location ids (leaf first), sample_types.n values, labels. */
int cp_profile_add_sample(cp_profile *p, const uint32_t *locs, uint32_t nlocs,
                          const int64_t *values, const cp_label *labels, uint32_t nlabels);

/* The sample_types.n values of sample i (borrowed from p; NULL when there are no types). */
static inline const int64_t *cp_profile_sample_values(const cp_profile *p, uint32_t i)
{
    return p->sample_types.n ? p->values.v + (size_t)i * p->sample_types.n : NULL;
}

/* Index of the sample type named type (e.g. "cpu"), or -1. */
int cp_profile_find_type(const cp_profile *p, const char *type);

/* Multiplies every value by factor (rounded to nearest). Used for unbiasing and diffs
 * (factor -1). */
void cp_profile_scale(cp_profile *p, double factor);

/* Keeps only the sample types named in types[0..n) in that order; samples whose kept
 * values are all zero are dropped. Returns CP_EINVAL (naming the type) if one is missing. */
int cp_profile_select_types(cp_profile *p, const char *const *types, size_t n, cp_err *err);

/* Sum of value column t over all samples. */
int64_t cp_profile_total(const cp_profile *p, uint32_t t);

/* Deep copy. Returns NULL on out of memory. */
cp_profile *cp_profile_clone(const cp_profile *p);

/* --- position-independent frame identity -----------------------------------------
 * A frame in a mapped object is identified by the object (build ID; its file name where
 * there is none) and its file offset, address - start + offset: the same in every process
 * that maps the object, wherever ASLR put it. The canonical form of an object's mapping
 * has start = offset and limit = offset + size, so an address in it is its file offset
 * and the formula above still holds (as does pprof's rule that a location's address lies
 * in its mapping's [start, limit)). Mappings of no object (anonymous memory, JIT code,
 * [heap], [stack]) keep their run-time addresses: nothing else identifies them. */

/* Whether a mapping with this file name (len bytes) and build ID (len bytes) names an
 * object: a build ID, or a file name other than the kernel's names for anonymous memory
 * ("[anon:...]", "[heap]", "//anon", "/memfd:...", ...). */
int cp_mapping_names_object(const char *filename, size_t filename_len, size_t build_id_len);

/* Puts *m, a mapping of an object, in canonical form and returns what to add (mod 2^64)
 * to an address of m to get its canonical address: offset - start. A mapping with
 * limit < start (no size to keep) is left as it is (returns 0). Idempotent. */
uint64_t cp_mapping_canonicalize(cp_mapping *m);

/* Canonicalizes every object mapping of p and every nonzero address in one, in place (ids
 * and everything else unchanged; address 0 means none given and stays 0). Two processes of one
 * binary then give identical mappings and location addresses. */
void cp_profile_canonicalize(cp_profile *p);

/* Writes the name of an unsymbolized location of p, "module+0xOFFSET" (module = the base
 * name of its mapping's file, else its build ID; "[module]" for address 0) or "0xADDRESS"
 * when its mapping names no object, into out (NUL-terminated, truncated to len). Returns
 * the length written. */
size_t cp_location_label(const cp_profile *p, const cp_location *l, char *out, size_t len);

#endif
