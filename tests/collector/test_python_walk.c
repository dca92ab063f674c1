/* The Python walk (collector/python.c) called in-process from an embedded CPython 3.11
 * (Debian's libpython3.11.so), with the GIL and without, in the main interpreter and in a
 * sub-interpreter: the frames and the interpreter id it finds. In the sanitizer build too
 * (the preload tests of test_python are not: an ASan libcontprof cannot be preloaded). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "guard.h"
#include "isolate.h"
#include "python.h"
#include "test.h"
#include "unwind.h"

/* CPython's own allocations live until the process ends: not the agent's leaks (exported:
 * the sanitizer's runtime looks it up) */
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void);
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void)
{
    return "leak:libpython3.11\n";
}

/* What one walk found: the interpreter id and the frames' names, innermost first, joined
 * by ';'. */
typedef struct walked {
    uint32_t interp;
    uint32_t n;
    char names[1024];
} walked;

static void walk_here(walked *w)
{
    pthread_attr_t a;
    void *lo;
    size_t size;
    CHECK(pthread_getattr_np(pthread_self(), &a) == 0);
    CHECK(pthread_attr_getstack(&a, &lo, &size) == 0);
    pthread_attr_destroy(&a);
    uint64_t pcs[CP_MAX_FRAMES];
    /* no native frames: the Python frames go on top, innermost first */
    w->n = cp_py_merge(pcs, 0, CP_MAX_FRAMES, (pid_t)syscall(SYS_gettid), (uintptr_t)lo,
                       (uintptr_t)lo + size, &w->interp);
    cp_in_agent = 1;
    cp_py_resolve(pcs, w->n);
    cp_in_agent = 0;
    size_t o = 0;
    w->names[0] = 0;
    for (uint32_t i = 0; i < w->n; i++) {
        const char *fn = "?", *file;
        int64_t line;
        if (pcs[i] & CP_LANG_TAG) cp_lang_get((uint32_t)(pcs[i] & ~CP_LANG_TAG), &fn, &file, &line);
        o += (size_t)snprintf(w->names + o, sizeof(w->names) - o, "%s%s", i ? ";" : "", fn);
        if (o >= sizeof(w->names)) break;
    }
}

/* pywalk.sample(): walks the calling thread with the GIL held, then with it released;
 * returns (interp, names, interp without the GIL, names without the GIL). */
static PyObject *py_sample(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    walked held, released;
    walk_here(&held);
    Py_BEGIN_ALLOW_THREADS walk_here(&released);
    Py_END_ALLOW_THREADS return Py_BuildValue("(IsIs)", held.interp, held.names, released.interp,
                                              released.names);
}

static PyMethodDef methods[] = {{"sample", py_sample, METH_NOARGS, "walk this thread"},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pywalk", NULL, -1, methods, NULL, NULL, NULL, NULL};

static PyObject *init_pywalk(void)
{
    return PyModule_Create(&module);
}

/* Runs code in the main interpreter and returns the str repr of its global `result`. */
static void run(const char *code, char *out, size_t cap)
{
    PyObject *m = PyImport_AddModule("__main__"), *g = PyModule_GetDict(m);
    PyObject *r = PyRun_String(code, Py_file_input, g, g);
    if (!r) PyErr_Print();
    CHECK(r != NULL);
    Py_DECREF(r);
    PyObject *res = PyDict_GetItemString(g, "result");
    CHECK(res != NULL);
    PyObject *s = PyObject_Repr(res);
    snprintf(out, cap, "%s", PyUnicode_AsUTF8(s));
    Py_DECREF(s);
}

static void start(void)
{
    CHECK(PyImport_AppendInittab("pywalk", init_pywalk) == 0);
    Py_InitializeEx(0);
    CHECK(cp_py_probe(0) == 1);
    CHECK_STREQ(cp_py_engine_note(), "; python=3.11");
}

TEST(main_interpreter)
{
    start();
    char out[4096];
    run("import pywalk\n"
        "def fnMain():\n"
        "    return pywalk.sample()\n"
        "def outer():\n"
        "    return fnMain()\n"
        "result = outer()\n",
        out, sizeof out);
    printf("%s\n", out);
    /* with the GIL and without: the same frames, the main interpreter (0) */
    CHECK_STREQ(out, "(0, 'fnMain;outer;<module>', 0, 'fnMain;outer;<module>')");
}

TEST(sub_interpreter)
{
    start();
    char out[4096];
    run("import pywalk, _xxsubinterpreters as interpreters\n"
        "SUB = '''\n"
        "import pywalk\n"
        "def fnSub():\n"
        "    return pywalk.sample()\n"
        "r = fnSub()\n"
        "assert r[0] > 0 and r[0] == r[2], r\n"
        "assert r[1] == r[3] == 'fnSub;<module>;in_sub;<module>', r\n"
        "'''\n"
        "def in_sub():\n"
        "    sid = interpreters.create()\n"
        "    interpreters.run_string(sid, SUB)\n"
        "    interpreters.run_string(sid, SUB)\n"
        "    interpreters.destroy(sid)\n"
        "    return sid\n"
        "sid = in_sub()\n"
        "result = (int(sid), pywalk.sample())\n",
        out, sizeof out);
    printf("%s\n", out);
    /* the sub-interpreter's frames, then the caller's, with its id (asserted in it; the
     * run_string raises otherwise); back in the main one: interpreter 0 */
    CHECK_STREQ(out, "(1, (0, '<module>', 0, '<module>'))");
    /* a sub-interpreter's isolate: named and labelled by its id, made once */
    uint32_t iso = cp_py_interp_isolate(1, 1);
    CHECK(iso > 0 && iso <= CP_MAX_ISOLATES);
    CHECK_STREQ(cp_isolates[iso - 1].name, "python-interp-1");
    CHECK_STREQ(cp_isolates[iso - 1].labels, "interp=1");
    CHECK_EQ(cp_py_interp_isolate(1, 0), iso);
    CHECK_EQ(cp_py_interp_isolate(2, 0), 0); /* not made: the handler's answer */
}

TEST(thread_in_sub_interpreter)
{
    /* a thread started inside a sub-interpreter: its TSS slot holds its sub-interpreter
     * state (the first it has), labelled by the sub-interpreter's id */
    start();
    char out[4096];
    run("import pywalk, _xxsubinterpreters as interpreters\n"
        "SUB = '''\n"
        "import pywalk, threading\n"
        "out = []\n"
        "def fnThread():\n"
        "    out.append(pywalk.sample())\n"
        "t = threading.Thread(target=fnThread)\n"
        "t.start()\n"
        "t.join()\n"
        "r = out[0]\n"
        "assert r[0] > 0 and r[0] == r[2], r\n"
        "assert r[1] == r[3] == 'fnThread;Thread.run;Thread._bootstrap_inner;Thread._bootstrap', "
        "r\n"
        "'''\n"
        "sid = interpreters.create(isolated=False)  # threads allowed\n"
        "interpreters.run_string(sid, SUB)\n"
        "interpreters.destroy(sid)\n"
        "result = int(sid)\n",
        out, sizeof out);
    printf("%s\n", out);
    CHECK_STREQ(out, "1");
}

TEST_MAIN(T(main_interpreter), T(sub_interpreter), T(thread_in_sub_interpreter))
