/* Node.js worker_threads as isolates: recognizing a Worker's thread by its start routine
 * and reading the worker's name and thread id from the node::worker::Worker object,
 * defensively (README.md "Isolates"). */
#include "nodeworker.h"
#include "guard.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "error.h"

int cp_nodeworker_is_start(const char *symbol)
{
    if (!symbol) return 0;
    /* demangled: "node::worker::Worker::StartThread(...)::{lambda(void*)#1}::_FUN(void*)";
     * mangled: "_ZZN4node6worker6Worker11StartThread...UlPvE_4_FUNES..." */
    const char *d = strstr(symbol, "node::worker::Worker::StartThread(");
    if (d) return strstr(d, "lambda") != NULL;
    const char *m = strstr(symbol, "N4node6worker6Worker11StartThread");
    return m && symbol[0] == '_' && symbol[1] == 'Z' && strstr(m, "Ul") != NULL;
}

/* How much of the object is searched, and the bounds of a plausible field. */
#define OBJ_MAX 1024
#define STR_MAX 4096
#define TID_MAX 100000000u /* "worker-" and 8 digits fill a label */

static uint64_t u64_at(const uint8_t *obj, uint32_t off)
{
    uint64_t v;
    memcpy(&v, obj + off, 8);
    return v;
}

/* Whether obj[off..off+32) has the shape of a libstdc++ std::string (pointer, length, then
 * the inline buffer or the capacity) of an object at addr: a short string points into its
 * own buffer, NUL-terminated there; a long one has capacity ≥ length. */
static int string_shaped(const uint8_t *obj, uint32_t n, uintptr_t addr, uint32_t off)
{
    if (off + 32 > n) return 0;
    uint64_t p = u64_at(obj, off), len = u64_at(obj, off + 8);
    if (p == (uint64_t)addr + off + 16) return len <= 15 && obj[off + 16 + len] == 0;
    uint64_t cap = u64_at(obj, off + 16);
    return p >= 4096 && len > 15 && len < STR_MAX && cap >= len && cap < ((uint64_t)1 << 30);
}

/* Whether s[0..len) is text a name can be: no control bytes, no NUL. */
static int printable(const char *s, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
    return 1;
}

/* Copies name[0..len) into label, cut to 15 bytes at a UTF-8 character boundary. */
static void set_label(char label[16], const char *name, uint64_t len)
{
    if (len > 15) {
        len = 15;
        while (len > 0 && ((unsigned char)name[len] & 0xc0) == 0x80)
            len--;
    }
    memcpy(label, name, len);
    label[len] = 0;
}

int cp_nodeworker_label_from(const uint8_t *obj, uint32_t n, uintptr_t addr,
                             cp_nodeworker_read_fn read_fn, char label[16])
{
    /* Node 20's Worker ends its scalars with (libstdc++, x86-64):
     *   std::string custom_error_str_; int exit_code_; uint64_t thread_id_;
     *   uintptr_t stack_base_; std::string name_;
     * i.e. a string at X - 0x38, Node's threadId at X - 0x10 and name_ at X. The first
     * offset X where all three have their shape is taken; none: another layout. */
    for (uint32_t x = 0x38; x + 32 <= n; x += 8) {
        uint64_t tid = u64_at(obj, x - 0x10);
        if (tid == 0 || tid >= TID_MAX) continue;
        if (!string_shaped(obj, n, addr, x - 0x38) || !string_shaped(obj, n, addr, x)) continue;
        uint64_t p = u64_at(obj, x), len = u64_at(obj, x + 8);
        char name[STR_MAX + 1];
        if (p == (uint64_t)addr + x + 16) {
            memcpy(name, obj + x + 16, len);
        } else {
            if (read_fn(p, name, (uint32_t)len + 1) != 0) continue;
            if (name[len] != 0) continue;
        }
        name[len] = 0;
        if (!printable(name, len)) continue;
        /* no name, or the default newer Nodes give (README.md "Isolates"): Node's threadId,
         * stable for a program that starts its workers in one order */
        if (len == 0 || strcmp(name, "WorkerThread") == 0)
            snprintf(label, 16, "worker-%u", (unsigned)(tid % TID_MAX)); /* ≤ 8 digits */
        else
            set_label(label, name, len);
        return 0;
    }
    return CP_ENOTFOUND;
}

/* Reads n bytes at addr of this process; 0, or CP_EIO with errno (a short read: EFAULT). */
static int read_self(uintptr_t addr, void *buf, uint32_t n)
{
    struct iovec local = {buf, n}, remote = {(void *)addr, n};
    ssize_t k = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (k == (ssize_t)n) return 0;
    if (k >= 0) errno = EFAULT;
    return CP_EIO;
}

int cp_nodeworker_label(uintptr_t addr, char label[16])
{
    CP_ASSERT_AGENT_THREAD();
    uint8_t obj[OBJ_MAX];
    if (!addr) return CP_ENOTFOUND;
    /* The object may end just before an unmapped page: the read is split at the page
     * boundary, so that what is mapped is read (process_vm_readv never splits an element). */
    uintptr_t page_end = (addr | 4095) + 1;
    size_t first = page_end - addr < OBJ_MAX ? page_end - addr : OBJ_MAX;
    struct iovec local = {obj, OBJ_MAX};
    struct iovec remote[2] = {{(void *)addr, first}, {(void *)page_end, OBJ_MAX - first}};
    ssize_t k = process_vm_readv(getpid(), &local, 1, remote, first < OBJ_MAX ? 2 : 1, 0);
    if (k <= 0) {
        if (k == 0) errno = EFAULT;
        return CP_EIO;
    }
    return cp_nodeworker_label_from(obj, (uint32_t)k, addr, read_self, label);
}
