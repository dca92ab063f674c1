/* A program that looks like a CPython of a version the agent has no layout for: it exports
 * _PyRuntime and Py_Version (3.12.0) as an interpreter's executable does, and is named
 * python-fake. test_python.unsupported_version runs it under the agent. */
#include <time.h>

__attribute__((visibility("default"))) char _PyRuntime[4096];
__attribute__((visibility("default"))) const unsigned long Py_Version = 0x030c00f0;

int main(void)
{
    volatile unsigned long x = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    do {
        for (int i = 0; i < 100000; i++)
            x += (unsigned long)i;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 300000000L);
    return _PyRuntime[0];
}
