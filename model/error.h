/* Error codes shared by every stage, and the error record that carries a message naming
 * the thing that was wrong. Functions return 0 or a negative CP_E* code. */
#ifndef CP_ERROR_H
#define CP_ERROR_H

#include <stddef.h>

/* One table defines every code and its generic message (libuv's UV_ERRNO_MAP habit). */
#define CP_ERRNO_MAP(X)                                                                            \
    X(NOMEM, "out of memory")                                                                      \
    X(INVAL, "invalid argument")                                                                   \
    X(PPROF, "malformed pprof profile")                                                            \
    X(LIMIT, "input exceeds a configured limit")                                                   \
    X(GZIP, "bad gzip data")                                                                       \
    X(INCOMPAT, "profiles cannot be merged")                                                       \
    X(ENVELOPE, "malformed envelope")                                                              \
    X(VERSION, "unsupported format version")                                                       \
    X(IO, "I/O error")                                                                             \
    X(STORE, "store error")                                                                        \
    X(KAFKA, "kafka error")                                                                        \
    X(NOTFOUND, "not found")                                                                       \
    X(PARSE, "parse error")

typedef enum {
    CP_OK = 0,
#define CP_ERR_ENUM_(name, msg) CP_E##name,
    CP__EFIRST = -1000,
    CP_ERRNO_MAP(CP_ERR_ENUM_)
#undef CP_ERR_ENUM_
} cp_errno;

/* The generic message of a code ("unknown error" for anything else). */
const char *cp_strerror(int code);
/* The code's name, such as "PPROF". */
const char *cp_errname(int code);

/* A caller-owned error record. Functions that can fail for reasons a person must see take
 * a cp_err * (which may be NULL) and fill msg with a sentence naming the field, the index
 * and the value involved. */
typedef struct cp_err {
    int code;
    char msg[256];
} cp_err;

/* Exceptions to "0 or a negative code, results through out-parameters", each for a reason:
 * - Constructors come in two shapes. One that can fail for a reason a person must see is
 *   int x_create(opts, T **out, cp_err *err) (cp_store_open, cp_ingest_create,
 *   cp_http_server_create, cp_fanout_create, cp_broker_create); one whose only failure is
 *   CP_ENOMEM is either int x_create(..., T **out) (cp_gzipper_create, cp_metrics_create),
 *   or, the exception, T *x_create(...) returning NULL: cp_profile_create,
 *   cp_merger_create, cp_pprof_decoder_create, cp_store_batch_create, cp_symbols_create,
 *   cp_api_create. There NULL can mean nothing but out of memory, so a code would add
 *   nothing, and the profile's and the decoder's are called from the agent and every test
 *   (collector/ included) in that shape.
 * - cp_store_batch_add returns CP_STORE_DUPLICATE (1), a success that stored nothing
 *   (store.h): ingest counts it and goes on, as SQLite's SQLITE_DONE is no error; being
 *   positive it cannot be taken for a CP_E* code.
 * Static helpers may return -1 internally; a bare -1 or -errno never crosses a header. */

/* Sets err (if not NULL) to code and a printf-formatted message; returns code. */
int cp_err_set(cp_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
