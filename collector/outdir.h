/* The output directory of window files, opened once and checked before anything is
 * written into it (README.md "Files"): files are then made relative to its fd, so a path
 * swapped after the check cannot redirect them. Layer 1: it reads fd.h. */
#ifndef CP_OUTDIR_H
#define CP_OUTDIR_H

#include "error.h"

/* Opens directory path as an agent fd (fd.h: above the floor, close-on-exec, hidden from
 * the host) without following a symbolic link in its last component, made 0700 first if
 * missing (not its parents), and checks it:
 *   - is_default (the agent picked the path, config.c): owned by the effective uid and
 *     writable by nobody else;
 *   - else (CONTPROF_OUTPUT_DIR): owned by the effective uid or root, and writable by
 *     group or others only if sticky (as /tmp).
 * Returns 0 with *out (the caller closes it with cp_fd_close), or CP_EIO / CP_EINVAL with
 * err "output directory PATH: REASON" (the directory is then not to be used; after CP_EIO
 * errno is the system's error, EMFILE when no fd is left). Any thread;
 * allocates nothing. */
int cp_output_dir_open(const char *path, int is_default, int *out, cp_err *err);

#endif
