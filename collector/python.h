/* CPython frames in CPU and allocation stacks: the interpreter found in the process
 * (its version, _PyRuntime), the signal-safe walk of the running thread's frame chain into
 * raw words, and their names on the agent thread (README.md "Python"). */
#ifndef CP_PYTHON_H
#define CP_PYTHON_H

#include <stdint.h>
#include <sys/types.h>

/* A raw Python frame in a sample (bit 62, never a native pc nor a CP_LANG_TAG id): the code
 * object's address / 8 in bits 0-44, the instruction's offset in code units in bits
 * 45-61. cp_py_resolve makes it a language frame. */
#define CP_PY_TAG (1ULL << 62)
#define CP_PY_IS_RAW(pc) (((pc) >> 62) == 1)

/* Looks for a CPython in the process (the executable's or a loaded libpython's dynamic
 * symbols _PyRuntime, Py_Version, _PyEval_EvalFrameDefault) and, for a version in the
 * table, turns the handler's walk on. An unknown version is said once on stderr and in
 * cp_py_engine_note; native frames go on. Cheap when nothing changed (one comparison of
 * the snapshot's generation). Not async-signal-safe (dlsym, dladdr); the agent thread or
 * contprof_start. Returns 1 when the walk is on. */
int cp_py_probe(uint64_t modules_gen);

/* "" or "; python=3.11" (walking) or "; python=3.12 unsupported": for the engine string. */
const char *cp_py_engine_note(void);

/* The signal handler's part: walks the calling thread's Python frames (none: returns n at
 * once) and puts them in pcs[0..n) (native, leaf first, capacity max) in place of the
 * _PyEval_EvalFrameDefault frames that run them. tid: the calling thread's (fault-proof
 * reads of memory that is not provably mapped); [stack_lo, stack_hi): its stack. The
 * frames are those of the thread state the thread runs now, a sub-interpreter's too;
 * *interp: that sub-interpreter's id, 0 for the main one or no Python frame. Returns the
 * new number of frames. Async-signal-safe: no lock, no allocation, no call into Python. */
uint32_t cp_py_merge(uint64_t *pcs, uint32_t n, uint32_t max, pid_t tid, uintptr_t stack_lo,
                     uintptr_t stack_hi, uint32_t *interp);

/* A sample's isolate field holding a sub-interpreter's id whose isolate the handler could
 * not find (not made yet): the agent thread makes it (cp_py_interp_isolate) as it drains. */
#define CP_PY_ISO_INTERP (1u << 31)

/* The isolate (its id) of sub-interpreter interp (> 0): "python-interp-N", label
 * interp=N, made on first use when create (allocates: the agent thread or the allocation
 * path under cp_in_agent) and kept for the process's life; 0 when not made yet (create 0:
 * async-signal-safe, atomic loads only) or past the table's 64 interpreters alive at once
 * (their samples keep the thread's isolate). */
uint32_t cp_py_interp_isolate(uint32_t interp, int create);

/* Agent thread, before its rings are drained, at most once a second: the isolates of
 * sub-interpreters no longer in the runtime's list are destroyed (reaped after the window
 * that holds their samples) and their places in the table of 64 freed for new ones. */
void cp_py_interp_reap(void);

/* Agent thread: rewrites raw Python frames of pcs[0..n) as language frames (CP_LANG_TAG
 * ids: qualified name, file, line), reading the code objects fault-proof and caching them
 * per code object; an unreadable one becomes "[python]". Allocates; the caller holds
 * cp_in_agent. */
void cp_py_resolve(uint64_t *pcs, uint32_t n);

typedef struct cp_py_stats {
    int on;              /* the walk is on */
    uint64_t samples;    /* samples with at least one Python frame */
    uint64_t truncated;  /* ... whose chain was cut: deeper than the sample holds */
    uint64_t torn;       /* ... whose chain read an invalid frame (mid-call, torn) */
    uint64_t unresolved; /* raw frames whose code object could not be read */
} cp_py_stats;
void cp_py_get_stats(cp_py_stats *s);

/* The line of the instruction at code unit `unit` in a 3.11 location table lt[0..n) of a
 * code object starting at firstlineno; -1 where the table says none, firstlineno past
 * its end. A parser of untrusted bytes (fuzz_pylinetable). */
int cp_py_line_311(const uint8_t *lt, size_t n, int firstlineno, uint32_t unit);

/* The UTF-8 text of a CPython 3.11 str object whose first 72 bytes are hdr, read with
 * readfn (addr, buf, len: 0 or an error) from the object at addr; into out (cap bytes,
 * NUL-terminated, cut at a character boundary). Returns the length or -1 (not a compact
 * str, unreadable). A parser of untrusted bytes (fuzz_pylinetable). */
typedef int (*cp_py_readfn)(uintptr_t addr, void *buf, size_t len);
int cp_py_str_311(const uint8_t hdr[72], uintptr_t addr, cp_py_readfn readfn, char *out,
                  size_t cap);

#endif
