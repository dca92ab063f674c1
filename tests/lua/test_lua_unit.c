/* In-process tests of the Lua adapter's API: attach/detach/close lifecycles, the coroutine
 * library behaving exactly as stock Lua's once resume and wrap are replaced, a script's
 * own debug hook left alone, deep nesting. The agent samples at 1000 Hz meanwhile. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "contprof.h"
#include "contprof_lua.h"
#include "test.h"

static char g_dir[128];

static void start_agent(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/contprof-lua-unit-%d", (int)getpid());
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf %s && mkdir -p %s", g_dir, g_dir);
    CHECK(system(cmd) == 0);
    contprof_options o;
    memset(&o, 0, sizeof(o));
    o.cpu_hz = 1000;
    o.alloc_rate = 4096;
    o.window_ms = 500;
    o.output_dir = g_dir;
    o.service = "luaunit";
    CHECK(contprof_start(&o) == 0);
}

static void stop_agent(void)
{
    contprof_stop();
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

static lua_State *new_state(void)
{
    lua_State *L = luaL_newstate();
    CHECK(L);
    luaL_openlibs(L);
    return L;
}

/* Runs chunk inside L's isolate; it must return the string "ok". */
static void run_ok(lua_State *L, const char *chunk)
{
    contprof_lua_enter(L);
    int rc = luaL_loadstring(L, chunk);
    if (rc == LUA_OK) rc = lua_pcall(L, 0, 1, 0);
    const char *r = lua_tostring(L, -1);
    if (rc != LUA_OK || !r || strcmp(r, "ok") != 0) fprintf(stderr, "lua: %s\n", r ? r : "?");
    CHECK(rc == LUA_OK && r && strcmp(r, "ok") == 0);
    lua_pop(L, 1);
    contprof_lua_leave(L);
}

TEST(lifecycle)
{
    start_agent();
    lua_State *L = new_state();
    contprof_lua *h = NULL;
    CHECK_EQ(contprof_lua_attach(L, "one", "team=core", &h), 0);
    CHECK(h && contprof_lua_isolate(L));
    CHECK_EQ(contprof_lua_attach(L, "one", NULL, NULL), -EEXIST);
    CHECK_EQ(contprof_lua_attach(L, "", NULL, NULL), -EINVAL);
    run_ok(L, "local t = {} for i = 1, 1e5 do t[i] = {i} end return 'ok'");
    /* detach, attach again under another name, then close while attached */
    contprof_lua_detach(L);
    CHECK(contprof_lua_isolate(L) == NULL);
    run_ok(L, "local t = {} for i = 1, 1e4 do t[i] = {i} end return 'ok'");
    CHECK_EQ(contprof_lua_attach(L, "two", NULL, NULL), 0);
    CHECK(contprof_lua_isolate(L));
    run_ok(L, "local t = {} for i = 1, 1e4 do t[i] = {i} end return 'ok'");
    lua_close(L); /* frees the handle and destroys the isolate */

    /* a state that is never attached: enter/leave/detach do nothing */
    lua_State *M = new_state();
    contprof_lua_detach(M);
    CHECK(contprof_lua_isolate(M) == NULL);
    run_ok(M, "return 'ok'");
    lua_close(M);

    /* many states opened and closed while profiled */
    for (int i = 0; i < 200; i++) {
        lua_State *S = new_state();
        CHECK_EQ(contprof_lua_attach(S, "churn", NULL, NULL), 0);
        run_ok(S, "local s = {} for i = 1, 500 do s[i] = tostring(i) .. 'x' end return 'ok'");
        lua_close(S);
    }
    stop_agent();
}

static const char *coroutine_semantics =
    "local co = coroutine.create(function(a, b)\n"
    "  local c = coroutine.yield(a + b)\n"
    "  local d, e = coroutine.yield(c * 2)\n"
    "  return d + e, 'done'\n"
    "end)\n"
    "local ok, v = coroutine.resume(co, 1, 2); assert(ok and v == 3)\n"
    "ok, v = coroutine.resume(co, 10); assert(ok and v == 20)\n"
    "local ok2, s, d = coroutine.resume(co, 3, 4); assert(ok2 and s == 7 and d == 'done')\n"
    "assert(coroutine.status(co) == 'dead')\n"
    "local okd, msg = coroutine.resume(co)\n"
    "assert(not okd and msg == 'cannot resume dead coroutine')\n"
    "local me; me = coroutine.create(function() return coroutine.resume(me) end)\n"
    "local a, b, c = coroutine.resume(me)\n"
    "assert(a == true and b == false and c == 'cannot resume non-suspended coroutine')\n"
    "local okb, eb = pcall(coroutine.resume, 42)\n"
    "assert(not okb and eb:find('bad argument #1', 1, true) and eb:find('thread expected'))\n"
    "local gen = coroutine.wrap(function() for i = 1, 3 do coroutine.yield(i) end end)\n"
    "assert(gen() == 1 and gen() == 2 and gen() == 3); gen()\n"
    "local okg, eg = pcall(gen); assert(not okg and eg:find('cannot resume dead coroutine'))\n"
    "local w = coroutine.wrap(function() error('oops') end)\n"
    "local okw, ew = pcall(w); assert(not okw and ew:find(':%d+: oops$'))\n"
    "local w2 = coroutine.wrap(function() error({code = 7}) end)\n"
    "local okw2, ew2 = pcall(w2); assert(not okw2 and type(ew2) == 'table' and ew2.code == 7)\n"
    "local closed = false\n"
    "local w3 = coroutine.wrap(function()\n"
    "  local x <close> = setmetatable({}, {__close = function() closed = true end})\n"
    "  coroutine.yield(1); error('x')\n"
    "end)\n"
    "w3(); assert(not pcall(w3)); assert(closed)\n"
    "local co2 = coroutine.wrap(function()\n"
    "  local ok, v = pcall(function() return coroutine.yield(5) + 1 end); return ok, v\n"
    "end)\n"
    "assert(co2() == 5); local o, vv = co2(41); assert(o and vv == 42)\n"
    "local co3 = coroutine.create(function() return coroutine.isyieldable(), coroutine.running() "
    "end)\n"
    "local _, y, r, ismain = coroutine.resume(co3); assert(y and r == co3 and ismain == false)\n"
    "assert(not pcall(coroutine.wrap, 1))\n"
    /* deeper than the adapter's per-thread stack of 32 running states */
    "local function nest(n) if n == 0 then local x = 0 for i = 1, 2e5 do x = x + i end\n"
    "  coroutine.yield(x) return x end\n"
    "  local c = coroutine.wrap(nest); local v = c(n - 1); coroutine.yield(v); return v end\n"
    "local top = coroutine.wrap(nest)\n"
    "for k = 1, 20 do top = coroutine.wrap(nest); assert(top(60) == 20000100000) end\n"
    "return 'ok'\n";

TEST(coroutines_as_stock)
{
    start_agent();
    /* the same script passes without the adapter (stock library) and with it */
    lua_State *S = new_state();
    run_ok(S, coroutine_semantics);
    lua_close(S);
    lua_State *L = new_state();
    CHECK_EQ(contprof_lua_attach(L, "coro", NULL, NULL), 0);
    for (int i = 0; i < 5; i++)
        run_ok(L, coroutine_semantics);
    lua_close(L);
    stop_agent();
}

TEST(script_hook_left_alone)
{
    start_agent();
    lua_State *L = new_state();
    CHECK_EQ(contprof_lua_attach(L, "hooked", NULL, NULL), 0);
    run_ok(L, "local n = 0\n"
              "local function h() n = n + 1 end\n"
              "debug.sethook(h, '', 1000)\n"
              "local t0 = os.clock() local x = 0\n"
              "while os.clock() - t0 < 0.3 do for i = 1, 1000 do x = x + i end end\n"
              "assert(debug.gethook() == h, 'hook replaced')\n"
              "debug.sethook()\n"
              "assert(n > 100, 'hook not called: ' .. n)\n"
              "return 'ok'");
    lua_close(L);
    stop_agent();
}

TEST(nesting_states)
{
    start_agent();
    /* a thread inside A calls into B (e.g. a C function of A's that serves B) */
    lua_State *A = new_state(), *B = new_state();
    CHECK_EQ(contprof_lua_attach(A, "a", NULL, NULL), 0);
    CHECK_EQ(contprof_lua_attach(B, "b", NULL, NULL), 0);
    for (int i = 0; i < 50; i++) {
        contprof_lua_enter(A);
        for (int j = 0; j < 40; j++)
            contprof_lua_enter(B); /* deeper than tracked */
        run_ok(B, "local x = 0 for i = 1, 1e5 do x = x + i end return 'ok'");
        for (int j = 0; j < 40; j++)
            contprof_lua_leave(B);
        run_ok(A, "local x = 0 for i = 1, 1e5 do x = x + i end return 'ok'");
        contprof_lua_leave(A);
    }
    lua_close(A);
    lua_close(B);
    stop_agent();
}

TEST_MAIN(T(lifecycle), T(coroutines_as_stock), T(script_hook_left_alone), T(nesting_states))
