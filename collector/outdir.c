/* The output directory: made (the default only), opened without following a symbolic link
 * and checked through the open fd (fstat), so what is checked is what is written into. */
#include "outdir.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fd.h"

int cp_output_dir_open(const char *path, int is_default, int *out, cp_err *err)
{
    *out = -1;
    if (!path[0]) return cp_err_set(err, CP_EINVAL, "output directory: empty path");
    /* made private if missing (its parent must exist); an existing one is checked as found */
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        cp_err_set(err, CP_EIO, "output directory %s: cannot be made (%s)", path, strerror(e));
        errno = e;
        return CP_EIO;
    }
    int fd = cp_fd_openat(AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        struct stat ls;
        if (lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode))
            return cp_err_set(err, CP_EINVAL, "output directory %s: is a symbolic link", path);
        if (e == ENOTDIR)
            return cp_err_set(err, CP_EINVAL, "output directory %s: not a directory", path);
        cp_err_set(err, CP_EIO, "output directory %s: cannot be opened (%s)", path, strerror(e));
        errno = e;
        return CP_EIO;
    }
    struct stat st;
    uid_t me = geteuid();
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = cp_err_set(err, CP_EIO, "output directory %s: %s", path, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        rc = cp_err_set(err, CP_EINVAL, "output directory %s: not a directory", path);
    else if (st.st_uid != me && (is_default || st.st_uid != 0))
        rc = cp_err_set(err, CP_EINVAL, "output directory %s: owned by uid %u, not by uid %u%s",
                        path, (unsigned)st.st_uid, (unsigned)me, is_default ? "" : " or root");
    else if (is_default && (st.st_mode & (S_IWGRP | S_IWOTH)))
        rc = cp_err_set(err, CP_EINVAL,
                        "output directory %s: writable by group or others "
                        "(mode %03o; chmod 700 it or remove it)",
                        path, (unsigned)(st.st_mode & 0777));
    else if (!is_default && (st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
        rc = cp_err_set(err, CP_EINVAL,
                        "output directory %s: writable by group or others "
                        "and not sticky (mode %03o)",
                        path, (unsigned)(st.st_mode & 0777));
    if (rc != 0) {
        cp_fd_close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}
