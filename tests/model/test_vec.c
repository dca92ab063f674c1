/* Containers and whole-file I/O (model/vec.c): errors name the path and the cause. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "vec.h"

TEST(files_round_trip_and_errors_name_the_path)
{
    char dir[] = "/tmp/cp-vec-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[64];
    snprintf(path, sizeof path, "%s/f", dir);
    cp_err err = {0};
    CHECK_EQ(cp_write_file(path, "abc\0def", 7, &err), 0);
    cp_buf b = {0};
    CHECK_EQ(cp_buf_append(&b, "x", 1), 0);
    CHECK_EQ(cp_read_file(path, &b, &err), 0); /* appends */
    CHECK_EQ(b.len, 8);
    CHECK(memcmp(b.data, "xabc\0def", 8) == 0);
    cp_buf_close(&b);
    CHECK(b.data == NULL && b.len == 0);

    char missing[80];
    snprintf(missing, sizeof missing, "%s/missing", dir);
    CHECK_EQ(cp_read_file(missing, &b, &err), CP_EIO);
    CHECK_EQ(err.code, CP_EIO);
    CHECK_CONTAINS(err.msg, "cannot read ");
    CHECK_CONTAINS(err.msg, "/missing: No such file or directory");
    CHECK_EQ(cp_write_file(dir, "x", 1, &err), CP_EIO); /* a directory */
    CHECK_CONTAINS(err.msg, "cannot write /tmp/cp-vec-");
    CHECK_CONTAINS(err.msg, "Is a directory");
    CHECK_EQ(cp_read_file(missing, &b, NULL), CP_EIO); /* err may be NULL */
    cp_buf_close(&b);
    unlink(path);
    rmdir(dir);
}

TEST(buf_printf_and_steal)
{
    cp_buf b = {0};
    CHECK_EQ(cp_buf_printf(&b, "%d-%s", 42, "x"), 0);
    CHECK_EQ(b.len, 4);
    CHECK_EQ(b.data[4], 0); /* NUL after the text, not counted */
    size_t n = 0;
    uint8_t *d = cp_buf_steal(&b, &n);
    CHECK(n == 4 && memcmp(d, "42-x", 4) == 0);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
    free(d);
    CP_VEC(int) v = {0};
    for (int i = 0; i < 1000; i++)
        CHECK_EQ(cp_vec_push(&v, i), 0);
    CHECK(v.n == 1000 && v.v[999] == 999 && v.cap >= 1000);
    free(v.v);
}

TEST_MAIN(T(files_round_trip_and_errors_name_the_path), T(buf_printf_and_steal))
