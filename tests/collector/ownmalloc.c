/* A program with an allocator of its own, as workerd (tcmalloc) has: malloc and friends
 * defined in the executable, which the loader binds before a preloaded library's. It
 * allocates and burns a little CPU, then prints how many of its mallocs it served. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static unsigned long served;

/* exported (the build hides symbols by default), as workerd's are: nm -D shows T malloc */
#define EXPORT __attribute__((visibility("default")))

EXPORT void *malloc(size_t n)
{
    served++;
    return __libc_malloc(n);
}

EXPORT void *calloc(size_t n, size_t m)
{
    return __libc_calloc(n, m);
}

EXPORT void *realloc(void *p, size_t n)
{
    return __libc_realloc(p, n);
}

EXPORT void free(void *p)
{
    __libc_free(p);
}

int main(void)
{
    volatile unsigned long x = 0;
    for (int i = 0; i < 2000; i++) {
        char *p = malloc(64 << 10);
        memset(p, i, 64 << 10);
        x += (unsigned char)p[i];
        free(p);
    }
    for (unsigned long i = 0; i < 100000000UL; i++)
        x += i;
    printf("served %lu\n", served);
    return 0;
}
