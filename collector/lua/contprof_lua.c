/* The Lua adapter: each attached lua_State is a contprof isolate. CPU samples get their Lua
 * stack at the next VM instruction through a one-shot count hook that the agent's signal
 * handler arms (Lua's ldebug.c: lua_sethook "can be called during a signal"; lua.c arms its
 * SIGINT hook the same way); allocations go through a wrapped lua_Alloc that samples them with the
 * agent's byte countdown and walks the Lua stack before the block is handed to Lua. */
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "contprof_lua.h"

#define TLS_IE __attribute__((tls_model("initial-exec"))) __thread

/* Names of functions that Lua cannot name from their call site (called from C, like a
 * host's entry point, or through pcall): found among the globals at a hook, where the
 * Lua API may be used, and remembered for allocation samples, where it may not. */
#define NAMES 128
typedef struct fn_name {
    char source[64]; /* "" = empty slot */
    int line;
    char name[40]; /* "" = not a global */
} fn_name;

struct contprof_lua {
    contprof_isolate *_Atomic iso; /* NULL once detached */
    lua_State *main;
    void *main_block; /* the block lua_close frees last: the state itself */
    lua_Alloc orig;
    void *orig_ud;
    fn_name names[NAMES]; /* only touched by the thread running the state */
};

/* ------------------------------------------------------------------------------------
 * What this thread runs: a small stack of (state, lua_State) entries, pushed by
 * contprof_lua_enter and by the coroutine wrappers. The signal handler reads the top. */

#define RUN_MAX 32
enum { RUN_ENTER = 1, RUN_RESUME = 2 };

typedef struct run_ent {
    contprof_lua *h;
    lua_State *L;
    int kind;
} run_ent;

static TLS_IE run_ent t_run[RUN_MAX];
static TLS_IE volatile unsigned t_depth;

static unsigned run_push(contprof_lua *h, lua_State *L, int kind)
{
    unsigned d = t_depth;
    if (d < RUN_MAX) t_run[d] = (run_ent){.h = h, .L = L, .kind = kind};
    atomic_signal_fence(memory_order_seq_cst); /* the entry before the depth */
    t_depth = d + 1;
    return d;
}

static void run_restore(unsigned d)
{
    atomic_signal_fence(memory_order_seq_cst);
    t_depth = d;
}

/* The top entry if it belongs to h, else NULL (another state, nothing, or overflow). */
static const run_ent *run_top(const contprof_lua *h)
{
    unsigned d = t_depth;
    if (d == 0 || d > RUN_MAX) return NULL;
    const run_ent *e = &t_run[d - 1];
    return e->h == h ? e : NULL;
}

/* ------------------------------------------------------------------------------------
 * Walking the Lua stack */

#define FN_CAP 96
#define FILE_CAP 160
#define WALK_MAX 32

typedef struct frame_buf {
    char function[FN_CAP];
    char file[FILE_CAP];
} frame_buf;

_Static_assert(sizeof(((fn_name *)0)->name) <= FN_CAP, "a cached name fits a frame");

/* The frames' strings must outlive the walker (the agent copies them afterwards). */
static __thread frame_buf t_buf[WALK_MAX];

/* The walk runs at every sample: plain copies, not snprintf. */
static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
}

static void copy_tail(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) src += n - (cap - 1); /* keep the end of long paths: the file name */
    copy_str(dst, cap, src);
}

static fn_name *name_slot(contprof_lua *h, const char *source, int line)
{
    uint32_t x = 2166136261u ^ (uint32_t)line;
    for (const char *c = source; *c; c++)
        x = (x ^ (uint8_t)*c) * 16777619u;
    for (uint32_t i = 0; i < NAMES; i++) {
        fn_name *e = &h->names[(x + i) % NAMES];
        if (!e->source[0] || (e->line == line && strncmp(e->source, source, 63) == 0)) return e;
    }
    return &h->names[x % NAMES]; /* full: reuse */
}

/* The global variable holding the function of frame ar, into e (api: the Lua API may be
 * called, i.e. at a hook or between calls, never inside the allocator). */
static void find_global(lua_State *L, lua_Debug *ar, fn_name *e)
{
    e->name[0] = 0;
    if (!lua_checkstack(L, 4)) return; /* never raises */
    int top = lua_gettop(L);
    lua_Debug fa = *ar;
    if (!lua_getinfo(L, "f", &fa)) return;
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
    if (lua_type(L, -1) == LUA_TTABLE) {
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            if (lua_type(L, -2) == LUA_TSTRING && lua_rawequal(L, -1, top + 1)) {
                snprintf(e->name, sizeof(e->name), "%s", lua_tostring(L, -2));
                break;
            }
            lua_pop(L, 1);
        }
    }
    lua_settop(L, top);
}

/* One frame of L at level into out (strings in buf); 0 if it is skipped. */
static int describe(contprof_lua *h, lua_State *L, lua_Debug *ar, int api, frame_buf *buf,
                    contprof_frame *out)
{
    if (!lua_getinfo(L, "Sln", ar)) return 0;
    if (ar->what[0] == 'C') { /* a C function: only when Lua knows its name */
        if (!ar->name) return 0;
        copy_str(buf->function, FN_CAP, ar->name);
        *out = (contprof_frame){.function = buf->function, .file = "[C]", .line = 0};
        return 1;
    }
    const char *src = ar->source && ar->source[0] == '@' ? ar->source + 1 : ar->short_src;
    copy_tail(buf->file, FILE_CAP, src);
    if (ar->what[0] == 'm')
        copy_str(buf->function, FN_CAP, "main chunk");
    else if (ar->name && ar->name[0] && ar->name[0] != '?')
        copy_str(buf->function, FN_CAP, ar->name);
    else {
        fn_name *e = name_slot(h, ar->source, ar->linedefined);
        if (!e->source[0] && api) {
            find_global(L, ar, e);
            snprintf(e->source, sizeof(e->source), "%s", ar->source);
            e->line = ar->linedefined;
        }
        if (e->source[0] && e->name[0])
            memcpy(buf->function, e->name, sizeof(e->name)); /* NUL-terminated */
        else
            snprintf(buf->function, FN_CAP, "%s:%d", ar->short_src, ar->linedefined);
    }
    *out = (contprof_frame){.function = buf->function,
                            .file = buf->file,
                            .line = ar->currentline > 0 ? ar->currentline : 0};
    return 1;
}

/* Innermost first: the running coroutine, then whoever resumed it, down to the entry of
 * the state on this thread. Only states this thread is running are read. */
static int walk(contprof_lua *h, contprof_frame *out, int max, int api)
{
    unsigned d = t_depth;
    if (d == 0 || d > RUN_MAX || max <= 0) return 0;
    if (max > WALK_MAX) max = WALK_MAX;
    int n = 0;
    for (unsigned i = d; i-- > 0 && n < max;) {
        const run_ent *e = &t_run[i];
        if (e->h != h) break;
        lua_Debug ar;
        for (int level = 0; n < max && lua_getstack(e->L, level, &ar); level++)
            n += describe(h, e->L, &ar, api, &t_buf[n], &out[n]);
        if (e->kind == RUN_ENTER) break;
    }
    return n;
}

static int walker(void *arg, contprof_frame *out, int max)
{
    contprof_lua *h = arg;
    if (!run_top(h)) return 0;   /* a sample left over from a state this thread left */
    return walk(h, out, max, 1); /* at the hook or at contprof_lua_leave */
}

/* ------------------------------------------------------------------------------------
 * CPU: the safe-point request (signal handler) and the one-shot hook */

static void hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    /* off first: a signal arriving from here on re-arms it and is served below or by the
     * next instruction */
    if (lua_gethook(L) == hook) lua_sethook(L, NULL, 0, 0);
    contprof_safepoint();
}

/* In the signal handler, on the sampled thread: arm the hook of the lua_State it runs. */
static void request(void *arg)
{
    const run_ent *e = run_top(arg);
    if (!e) return;
    lua_Hook cur = lua_gethook(e->L);
    if (cur && cur != hook) return; /* the script's own hook: wait for contprof_lua_leave */
    lua_sethook(e->L, hook, LUA_MASKCOUNT, 1);
}

/* ------------------------------------------------------------------------------------
 * Allocations */

static void release(contprof_lua *h)
{
    contprof_isolate *iso = atomic_exchange(&h->iso, NULL);
    if (iso) {
        contprof_isolate_set_request(iso, NULL, NULL);
        contprof_isolate_set_walker(iso, NULL, NULL);
        contprof_isolate_destroy(iso);
    }
}

/* Called by the agent before a sampled block is allocated: while Lua grows its stack,
 * the frames point into the old one until the call returns. No Lua API here. */
static int alloc_walker(void *arg, contprof_frame *out, int max)
{
    contprof_lua *h = arg;
    if (!atomic_load_explicit(&h->iso, memory_order_relaxed) || !run_top(h)) return 0;
    return walk(h, out, max, 0);
}

static void *contprof_lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    contprof_lua *h = ud;
    void *r = contprof_alloc_through((contprof_realloc_fn)h->orig, h->orig_ud, ptr, osize, nsize,
                                     alloc_walker, h);
    if (nsize == 0 && ptr && ptr == h->main_block) { /* lua_close is done with the state */
        release(h);
        free(h);
    }
    return r;
}

static contprof_lua *handle_of(lua_State *L)
{
    void *ud = NULL;
    lua_Alloc f = lua_getallocf(L, &ud);
    return f == contprof_lua_alloc ? ud : NULL;
}

/* ------------------------------------------------------------------------------------
 * Coroutines: lcorolib's resume and wrap, plus the bookkeeping of which one runs */

static int resume_in(lua_State *L, lua_State *co, int narg)
{
    if (!lua_checkstack(co, narg)) {
        lua_pushliteral(L, "too many arguments to resume");
        return -1;
    }
    lua_xmove(L, co, narg);
    contprof_lua *h = lua_touserdata(L, lua_upvalueindex(1));
    unsigned d = run_push(h, co, RUN_RESUME);
    int nres = 0;
    int status = lua_resume(co, L, narg, &nres);
    run_restore(d);
    if (status == LUA_OK || status == LUA_YIELD) {
        if (!lua_checkstack(L, nres + 1)) {
            lua_pop(co, nres);
            lua_pushliteral(L, "too many results to resume");
            return -1;
        }
        lua_xmove(co, L, nres);
        return nres;
    }
    lua_xmove(co, L, 1); /* the error object */
    return -1;
}

static int co_resume(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTHREAD); /* the message of Debian's 5.4.4 */
    lua_State *co = lua_tothread(L, 1);
    int r = resume_in(L, co, lua_gettop(L) - 1);
    if (r < 0) {
        lua_pushboolean(L, 0);
        lua_insert(L, -2);
        return 2;
    }
    lua_pushboolean(L, 1);
    lua_insert(L, -(r + 1));
    return r + 1;
}

static int co_wrapped(lua_State *L)
{
    lua_State *co = lua_tothread(L, lua_upvalueindex(2));
    int r = resume_in(L, co, lua_gettop(L));
    if (r < 0) {
        int st = lua_status(co);
        if (st != LUA_OK && st != LUA_YIELD) { /* error in the coroutine: close it */
            st = lua_resetthread(co);
            lua_xmove(co, L, 1);
        }
        if (st != LUA_ERRMEM && lua_type(L, -1) == LUA_TSTRING) {
            luaL_where(L, 1);
            lua_insert(L, -2);
            lua_concat(L, 2);
        }
        return lua_error(L);
    }
    return r;
}

static int co_wrap(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_State *co = lua_newthread(L);
    lua_pushvalue(L, 1);
    lua_xmove(L, co, 1);
    lua_pushcclosure(L, co_wrapped, 2);
    return 1;
}

/* Replaces resume and wrap in the coroutine library table (global and package.loaded
 * share it). Returns 0, or -ENOMEM (raised by Lua, caught here). */
static int patch_protected(lua_State *L)
{
    contprof_lua *h = lua_touserdata(L, 1);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    if (lua_getfield(L, -1, LUA_COLIBNAME) == LUA_TTABLE) {
        lua_pushlightuserdata(L, h);
        lua_pushcclosure(L, co_resume, 1);
        lua_setfield(L, -2, "resume");
        lua_pushlightuserdata(L, h);
        lua_pushcclosure(L, co_wrap, 1);
        lua_setfield(L, -2, "wrap");
    }
    return 0;
}

/* ------------------------------------------------------------------------------------
 * The interpreter's code: its native frames give way to the Lua frames */

static uintptr_t g_code_lo, g_code_hi;
static pthread_once_t g_code_once = PTHREAD_ONCE_INIT;

static int find_segment(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    uintptr_t pc = (uintptr_t)arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (pc < lo || pc >= hi) continue;
        /* Lua linked into the program itself: its range would swallow the host's frames */
        if (info->dlpi_name && info->dlpi_name[0]) {
            g_code_lo = lo;
            g_code_hi = hi;
        }
        return 1;
    }
    return 0;
}

static void find_code(void)
{
    dl_iterate_phdr(find_segment, (void *)(uintptr_t)&lua_pcallk);
}

/* ------------------------------------------------------------------------------------
 * API */

int contprof_lua_attach(lua_State *L, const char *name, const char *labels, contprof_lua **out)
{
    if (out) *out = NULL;
    if (!L || !name || !*name) return -EINVAL;
    contprof_lua *h = handle_of(L);
    int fresh = h == NULL;
    if (h && atomic_load(&h->iso)) return -EEXIST;
    if (fresh) {
        h = calloc(1, sizeof(*h));
        if (!h) return -ENOMEM;
        lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
        h->main = lua_tothread(L, -1);
        lua_pop(L, 1);
        h->main_block = lua_getextraspace(h->main);
        h->orig = lua_getallocf(L, &h->orig_ud);
    }
    contprof_isolate *iso = contprof_isolate_create(name, labels);
    if (!iso) {
        if (fresh) free(h);
        return -ENOSPC;
    }
    if (fresh) {
        if (!lua_checkstack(L, 2)) goto nomem;
        lua_pushcfunction(L, patch_protected);
        lua_pushlightuserdata(L, h);
        if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
            lua_pop(L, 1);
            goto nomem;
        }
        lua_setallocf(L, contprof_lua_alloc, h);
    }
    pthread_once(&g_code_once, find_code);
    contprof_isolate_set_runtime_code(iso, g_code_lo, g_code_hi);
    contprof_isolate_set_walker(iso, walker, h);
    contprof_isolate_set_request(iso, request, h);
    atomic_store(&h->iso, iso);
    if (out) *out = h;
    return 0;
nomem:
    contprof_isolate_destroy(iso);
    free(h);
    return -ENOMEM;
}

void contprof_lua_detach(lua_State *L)
{
    contprof_lua *h = L ? handle_of(L) : NULL;
    if (h) release(h);
}

void contprof_lua_enter(lua_State *L)
{
    contprof_lua *h = handle_of(L);
    if (!h) return;
    contprof_isolate *iso = atomic_load_explicit(&h->iso, memory_order_acquire);
    run_push(h, L, RUN_ENTER);
    if (iso) contprof_isolate_enter(iso);
}

void contprof_lua_leave(lua_State *L)
{
    contprof_lua *h = handle_of(L);
    if (!h) return;
    /* A sample still waiting for a hook that did not come: served now, while this
     * thread is still in the isolate. */
    contprof_safepoint();
    unsigned d = t_depth;
    /* back to below the innermost enter of this state (a longjmp may have skipped the
     * end of a resume) */
    unsigned i = d > RUN_MAX ? RUN_MAX : d;
    while (i > 0 && !(t_run[i - 1].h == h && t_run[i - 1].kind == RUN_ENTER))
        i--;
    if (d > RUN_MAX || i == 0) {
        if (d > 0) run_restore(d - 1);
    } else {
        run_restore(i - 1);
    }
    if (atomic_load_explicit(&h->iso, memory_order_acquire)) contprof_isolate_leave();
    if (lua_gethook(L) == hook) lua_sethook(L, NULL, 0, 0);
}

contprof_isolate *contprof_lua_isolate(lua_State *L)
{
    contprof_lua *h = L ? handle_of(L) : NULL;
    return h ? atomic_load(&h->iso) : NULL;
}
