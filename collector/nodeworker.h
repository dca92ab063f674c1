/* Node.js worker_threads as isolates: a Worker's thread is recognized by its start routine
 * (the lambda node::worker::Worker::StartThread hands to uv_thread_create_ex, seen through
 * the pthread_create hook), and its argument, the node::worker::Worker, is read for the
 * worker's name option and thread id. Nothing in the host cooperates, so the object is
 * read defensively: with process_vm_readv (an unmapped address is an error, never a
 * fault) and only where its fields have the shape README.md "Isolates" describes. A leaf;
 * agent thread only. */
#ifndef CP_NODEWORKER_H
#define CP_NODEWORKER_H

#include <stdint.h>

/* Whether symbol, a function name mangled or demangled, is the start routine Node gives a
 * Worker's thread (node::worker::Worker::StartThread's lambda). */
int cp_nodeworker_is_start(const char *symbol);

/* Reads the node::worker::Worker at addr (in this process) and writes its isolate label to
 * label: the worker's name option (cut to 15 bytes on a UTF-8 boundary), or
 * "worker-THREADID" (Node's threadId) when it has none or Node's default "WorkerThread".
 * Returns 0; CP_ENOTFOUND when no field has the expected shape (another Node layout);
 * CP_EIO when the memory cannot be read (errno set, e.g. EPERM under a seccomp policy). */
int cp_nodeworker_label(uintptr_t addr, char label[16]);

/* The same on a copy: obj holds n bytes read from addr (so that pointers into the object
 * can be recognized); heap strings are read through read_fn. Exposed for the unit test. */
typedef int (*cp_nodeworker_read_fn)(uintptr_t addr, void *buf, uint32_t n);
int cp_nodeworker_label_from(const uint8_t *obj, uint32_t n, uintptr_t addr,
                             cp_nodeworker_read_fn read_fn, char label[16]);

#endif
