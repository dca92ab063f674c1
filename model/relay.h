/* The per-host relay's contract (collector/relay/README.md): how a process hands its
 * envelopes to the host's relay over a Unix stream socket, and the spool directory where
 * they wait, one file each, while the relay is away. Shared by the agent's sink
 * (collector/sink.c), the V8 source and the relay itself.
 *
 * A relay directory DIR holds `relay.sock` (the relay listens there) and `spool/`.
 * Frames, both ways: a 4-byte big-endian length N of what follows, a 1-byte type, N - 1
 * bytes of payload.
 *   'E' (process -> relay): one encoded envelope, signed or not (model/envelope.h).
 *   'A' (relay -> process): the answer to each 'E', in order; payload one status byte.
 *   'C' (process -> relay): asks for the running captures; no payload.
 *   'L' (relay -> process): the answer to 'C': model/capture.h's list (may be empty).
 *   'N' (process -> relay): "name this object for the host" (collector/namecache.h): an
 *       object the process had to name by reading its symbol tables; the relay writes its
 *       names file for the next process. Payload (cp_relay_names_encode); no answer.
 * A relay directory also holds `names/` (collector/namecache.h): the relay's name cache. */
#ifndef CP_RELAY_H
#define CP_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "vec.h"

#define CP_RELAY_SOCKET "relay.sock"
#define CP_RELAY_SPOOL "spool"

/* The largest payload a frame carries: Kafka's 4 MiB message limit of the embedded broker
 * and the default 1 MB of most clusters are lower; 16 MiB leaves room for an external
 * cluster configured higher without letting a client make the relay buffer gigabytes. */
#define CP_RELAY_FRAME_MAX ((uint32_t)16 << 20)
#define CP_RELAY_HEADER 5

enum {
    CP_RELAY_ENVELOPE = 'E',
    CP_RELAY_ACK = 'A',
    CP_RELAY_CAPTURES = 'C',
    CP_RELAY_LIST = 'L',
    CP_RELAY_NAMES = 'N',
};

/* An 'N' frame's payload: u8 flags (CP_NAMECACHE_DEBUG), u8 the CP_ELFNAMES_* source the
 * process named it from, u8 build id length (2..CP_RELAY_NAMES_ID_MAX), the build id, the
 * object's absolute path (the rest: 2..CP_RELAY_NAMES_PATH_MAX bytes, no NUL). */
#define CP_RELAY_NAMES_ID_MAX 64u
#define CP_RELAY_NAMES_PATH_MAX 4095u
#define CP_RELAY_NAMES_MAX (3u + CP_RELAY_NAMES_ID_MAX + CP_RELAY_NAMES_PATH_MAX)

typedef struct cp_relay_names {
    uint8_t flags, source, id_len;
    uint8_t id[CP_RELAY_NAMES_ID_MAX];
    char path[CP_RELAY_NAMES_PATH_MAX + 1]; /* NUL-terminated */
} cp_relay_names;

/* Writes n's payload into out (CP_RELAY_NAMES_MAX bytes); returns its length, or 0 when n
 * does not fit the rules above. */
size_t cp_relay_names_encode(const cp_relay_names *n, uint8_t *out);

/* Reads an 'N' payload (len bytes) into *n. Returns 0, or CP_EINVAL with err naming the
 * problem (a build id length out of range, a path not absolute, empty, too long or holding
 * a NUL, flags unknown). */
int cp_relay_names_parse(const uint8_t *p, size_t len, cp_relay_names *n, cp_err *err);

/* The status byte of an 'A' frame. */
enum {
    CP_RELAY_OK = 0,      /* the relay holds it now: delivered, or spooled by the relay */
    CP_RELAY_REFUSED = 1, /* not an envelope (counted and logged by the relay): never resend */
    CP_RELAY_BUSY = 2,    /* the relay holds too much: the sender spools it itself */
};

/* Writes the 5-byte header of a frame of type carrying payload_len bytes. */
void cp_relay_header(uint8_t hdr[CP_RELAY_HEADER], uint8_t type, uint32_t payload_len);

/* Reads a header: *type and *payload_len. Returns 0, or CP_EINVAL with err naming the
 * problem (a length of 0, a payload over max, a type not in the enum above). */
int cp_relay_parse_header(const uint8_t hdr[CP_RELAY_HEADER], uint32_t max, uint8_t *type,
                          uint32_t *payload_len, cp_err *err);

/* 1 if a relay's socket is in dir on this machine (a directory a server named may be
 * another machine's), else 0. */
int cp_relay_listening(const char *dir);

/* Asks the relay in dir for the running captures (a 'C' frame) and appends its answer,
 * model/capture.h's list, to out. Waits at most timeout_ms in all. Returns 0, or CP_EIO
 * (no relay, time-out, a malformed answer) or CP_ENOMEM with err naming the problem. */
int cp_relay_get_captures(const char *dir, int timeout_ms, cp_buf *out, cp_err *err);

/* ------------------------------------------------------------------------------------
 * The spool: DIR/spool, written by senders that could not reach the relay and by the
 * relay for what Kafka did not take; read and removed by the relay. A file is written as
 * `.tmp-*` and renamed to `SLOT.env` (one envelope) or `SLOT.envs` (a batch: a sender's
 * envelopes of one window, each as a u32 little-endian length and its bytes; one file
 * where there were four, each file's creation and rename being most of what a short
 * process paid with the relay away), SLOT 4 hex digits below CP_SPOOL_SLOTS, never
 * replacing one: the number of waiting files is bounded and the relay never reads half a
 * file. A relay from before batches lists no `.envs`: they wait for one that reads them. */

#define CP_SPOOL_SLOTS 4096u
/* A spool file's payload is at most this large (a bigger envelope is not spooled). */
#define CP_SPOOL_FILE_MAX ((size_t)4 << 20)

/* Opens DIR/spool as a directory fd for cp_spool_write/cp_spool_take (close-on-exec).
 * create: make DIR (0755) and DIR/spool (01733: anyone may add, only the owner list and
 * remove) first if missing (the relay). Refuses, with err naming the path and the reason, a
 * symbolic link, something not a directory, one owned by neither root nor the effective
 * user, and one others may write without the sticky bit. Returns 0 with *dfd, or CP_EIO. */
int cp_spool_open(const char *dir, int create, int *dfd, cp_err *err);

/* Writes one envelope (len bytes) into the spool dfd. Returns 0, CP_ELIMIT (over
 * CP_SPOOL_FILE_MAX, or no free slot found in a few tries: the spool is full, or the file
 * system has less than 1% or 64 MiB free) or CP_EIO, with err naming the reason. */
int cp_spool_write(int dfd, const uint8_t *data, size_t len, cp_err *err);
/* Appends one envelope to batch (framed). Returns 0, CP_ELIMIT (the batch would be over
 * CP_SPOOL_FILE_MAX: write it first; or an empty envelope) or CP_ENOMEM (batch unchanged). */
int cp_spool_batch_add(cp_buf *batch, const uint8_t *env, size_t len);
/* Writes batch (cp_spool_batch_add's) as one SLOT.envs file; as cp_spool_write. */
int cp_spool_write_batch(int dfd, const cp_buf *batch, cp_err *err);
/* The envelope at *off of a batch file's n bytes at p: 1 with *env, *len and *off moved past
 * it, 0 at the end, CP_EPARSE for a frame that is empty or runs past the end. */
int cp_spool_batch_next(const uint8_t *p, size_t n, size_t *off, const uint8_t **env, size_t *len);

/* One spool file found by cp_spool_list. */
typedef struct cp_spool_entry {
    char name[16];
    int64_t mtime_ns;
    int batch; /* SLOT.envs: cp_spool_batch_next */
} cp_spool_entry;

/* Lists up to cap waiting files of dfd, oldest first, into out; *n says how many.
 * Leftover `.tmp-*` files older than a minute (a sender that died writing) are removed.
 * Returns 0 or CP_EIO. */
int cp_spool_list(int dfd, cp_spool_entry *out, size_t cap, size_t *n, cp_err *err);

/* Reads the spool file name (regular, not a link, at most CP_SPOOL_FILE_MAX bytes) into out
 * (appended) and removes it. A file that is not one of these is removed and reported as
 * CP_EINVAL. Returns 0, CP_EINVAL, CP_ENOMEM or CP_EIO (then the file stays). */
int cp_spool_take(int dfd, const char *name, cp_buf *out, cp_err *err);

#endif
