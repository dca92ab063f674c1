/* contprof_lua.h: profiles each lua_State of a Lua 5.4 host as its own contprof isolate,
 * with Lua frames in its CPU samples and in its sampled allocations. Built on the isolate
 * API of contprof.h; the agent itself is started by the host (contprof_start). */
#ifndef CONTPROF_LUA_H
#define CONTPROF_LUA_H

#include <lua.h>

#include "contprof.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct contprof_lua contprof_lua;

/* Attaches the state of L (any thread of it) as isolate `name` with extra labels
 * "k=v,k2=v2" (may be NULL), and from now on:
 * - wraps its allocator (lua_setallocf): its blocks are sampled like malloc, carry the
 *   Lua stack, and leave the inuse profile when Lua frees them;
 * - replaces coroutine.resume and coroutine.wrap by equivalents that tell the profiler
 *   which coroutine runs (call it after the coroutine library is open, e.g. after
 *   luaL_openlibs);
 * - CPU samples taken while a thread is between contprof_lua_enter and _leave for this
 *   state get the Lua stack at the next VM instruction (a one-shot count hook that the
 *   signal handler arms).
 * Call it on a thread that owns L (no other thread runs it meanwhile), before loading
 * scripts so that what they build while loading is attributed. Returns 0 or a negative
 * errno-style code (-ENOMEM; -EEXIST if already attached; -ENOSPC if the agent has no
 * isolate left); on failure the state is unchanged. The handle (in *out, may be NULL)
 * belongs to the state: it stays valid until lua_close(L), which frees it and destroys
 * the isolate; lua_close must not be called between contprof_lua_enter and _leave. */
int contprof_lua_attach(lua_State *L, const char *name, const char *labels, contprof_lua **out);

/* Stops attributing the state: destroys its isolate and removes the CPU hooks. The
 * allocator wrapper stays (blocks sampled earlier are still matched when Lua frees them)
 * and the handle is freed by lua_close. No thread may be inside the state. Safe on a
 * state that is not attached. */
void contprof_lua_detach(lua_State *L);

/* Marks the calling thread as running code of L's state (L may be any of its threads, e.g.
 * a coroutine the host resumes) until contprof_lua_leave(L). Call them around every entry
 * into the state (lua_pcall, lua_resume, ...) by a thread of a pool; they nest. Cheap:
 * thread-local stores. No effect on states that are not attached. */
void contprof_lua_enter(lua_State *L);
void contprof_lua_leave(lua_State *L);

/* The isolate of an attached state, or NULL. */
contprof_isolate *contprof_lua_isolate(lua_State *L);

#ifdef __cplusplus
}
#endif

#endif
