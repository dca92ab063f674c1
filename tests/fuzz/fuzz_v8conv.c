/* libFuzzer target: everything the V8 source reads from an inspector (collector/v8/
 * v8conv.c): the /json/list answer, each message, a Node worker's wrapped message, and
 * the CPU and sampling heap profiles converted to pprof; and the /proc texts read to weigh
 * CPU windows (thread-self, net/tcp lines, schedstat, stat). Any bytes must be refused with an
 * error or converted into a profile that encodes, without crashing, leaking or reading out
 * of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pprof.h"
#include "v8conv.h"

static void convert(const cp_json *prof)
{
    cp_err e = {0};
    cp_profile *p = NULL;
    int64_t span;
    uint64_t mark = 3;
    cp_buf b = {0};
    if (cp_v8_cpu_profile(prof, 1000, &p, &span, &e) == 0) {
        if (!p || span < 0 || cp_pprof_encode(p, 0, &b) != 0) abort();
        cp_profile_destroy(p);
        cp_buf_close(&b);
    } else if (p || !e.msg[0]) {
        abort(); /* an error names its problem and leaves nothing behind */
    }
    for (int alloc = 0; alloc < 2; alloc++) {
        p = NULL;
        memset(&e, 0, sizeof(e));
        if (cp_v8_heap_profile(prof, 524288, alloc, &mark, &p, &e) == 0) {
            if (!p || cp_pprof_encode(p, 0, &b) != 0) abort();
            cp_profile_destroy(p);
            cp_buf_close(&b);
        } else if (p || !e.msg[0]) {
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_err e = {0};
    cp_v8_target *tv = NULL;
    size_t nt = 0;
    if (cp_v8_targets_parse((const char *)data, size, &tv, &nt, &e) == 0) {
        for (size_t i = 0; i < nt; i++) {
            char iso[128];
            if (!tv[i].id[0] || tv[i].path[0] != '/') abort();
            cp_v8_isolate_of(tv[i].title, iso, sizeof(iso));
            if (!iso[0]) abort();
        }
        free(tv);
    }
    /* the /proc texts (v8cpu.c reads them; a NUL-terminated copy, as read there) */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    int pid, tid;
    uint64_t ino;
    int64_t ns;
    memset(&e, 0, sizeof(e));
    if (cp_v8_thread_self_parse(text, &pid, &tid, &e) == 0 ? pid <= 0 || tid <= 0 : !e.msg[0])
        abort();
    if (cp_v8_tcp_listener(text, 0x2405, &ino) && !ino) abort();
    if (cp_v8_schedstat_ns(text, &ns) == 0 && ns < 0) abort();
    if (cp_v8_stat_ticks(text, &ns) == 0 && ns < 0) abort();
    free(text);
    cp_json *m = NULL;
    memset(&e, 0, sizeof(e));
    if (cp_v8_message_parse((const char *)data, size, &m, &e) != 0) {
        if (m || !e.msg[0]) abort();
        return 0;
    }
    /* as the source reads a message: a wrapped worker message, an attached worker's title,
     * a reply holding a profile */
    const cp_json *params = cp_json_get(m, "params");
    const char *sid;
    cp_json *inner = NULL;
    if (cp_v8_worker_message(params, &sid, &inner, &e) == 0) {
        if (!sid || !cp_json_is(inner, CP_JSON_OBJECT)) abort();
        convert(cp_json_get(cp_json_get(inner, "result"), "profile"));
        cp_json_free(inner);
    }
    const cp_json *title = cp_json_get(cp_json_get(params, "workerInfo"), "title");
    char iso[128];
    cp_v8_worker_isolate(cp_json_str(title, NULL), iso, sizeof(iso));
    if (!iso[0]) abort();
    convert(cp_json_get(cp_json_get(m, "result"), "profile"));
    convert(m);
    cp_json_free(m);
    return 0;
}
