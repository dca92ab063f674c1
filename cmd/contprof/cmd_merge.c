/* `contprof merge`: merges pprof files offline with the streaming merger; V8 heap snapshots
 * among them are read as retainer profiles (model/heapsnap.h). */
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "heapsnap.h"
#include "merge.h"
#include "pload.h"
#include "pprof.h"
#include "render.h"

#include <unistd.h>

static void merge_usage(FILE *f)
{
    fprintf(
        f,
        "usage: contprof merge [-o OUT] [--format pprof|top|folded] [--sample-index TYPE] FILE...\n"
        "  Merges pprof profiles (raw or gzip'd) following pprof's rules. V8 heap snapshots\n"
        "  (.heapsnapshot: DevTools, v8.writeHeapSnapshot) are read as retainer profiles:\n"
        "  each object's bytes under the path of what keeps it alive (retained_space).\n"
        "  -o OUT             write here instead of stdout\n"
        "  --format pprof     gzip'd pprof, like `pprof -proto` (default)\n"
        "  --format top       flat/cum table, like `pprof -top`\n"
        "  --format folded    folded stacks, one line per stack\n"
        "  --sample-index T   sample type for top/folded (default: the profile's default)\n"
        "\nexamples:\n"
        "  contprof merge -o merged.pb.gz a.pb.gz b.pb.gz\n"
        "  contprof merge --format top a.pb.gz b.pb.gz\n"
        "  contprof merge --format top app.heapsnapshot\n");
}

/* Input i: a heap snapshot converted, anything else as pprof bytes. */
static int read_input(void *ctx, size_t i, cp_buf *out, cp_err *err)
{
    const char *path = ((char **)ctx)[i];
    char head[64];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? pread(fd, head, sizeof(head), 0) : -1;
    if (fd >= 0) close(fd);
    if (n <= 0 || !cp_heapsnap_looks_like(head, (size_t)n))
        return cp_pload_read_file(ctx, i, out, err);
    cp_heapsnap_limits lim;
    cp_heapsnap_limits_default(&lim);
    lim.limit_name = "contprof merge's heap snapshot limit";
    cp_profile *p = cp_profile_create();
    if (!p) return cp_err_set(err, CP_ENOMEM, "out of memory");
    int rc = cp_heapsnap_read_file(path, &lim, p, NULL, err);
    if (!rc && (rc = cp_pprof_encode(p, 0, out))) cp_err_set(err, rc, "out of memory");
    cp_profile_destroy(p);
    return rc;
}

int cp_cmd_merge(int argc, char **argv)
{
    static const struct option opts[] = {{"output", required_argument, 0, 'o'},
                                         {"format", required_argument, 0, 'f'},
                                         {"sample-index", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *out_path = "-", *format = "pprof", *sample_index = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out_path = optarg;
            break;
        case 'f':
            format = optarg;
            break;
        case 's':
            sample_index = optarg;
            break;
        case 'h':
            merge_usage(stdout);
            return 0;
        default:
            merge_usage(stderr);
            return 2;
        }
    }
    if (strcmp(format, "pprof") && strcmp(format, "top") && strcmp(format, "folded")) {
        fprintf(stderr, "contprof merge: unknown format \"%s\" (pprof, top or folded)\n", format);
        return 2;
    }
    if (optind >= argc) {
        merge_usage(stderr);
        return 2;
    }
    cp_merger *m = cp_merger_create();
    cp_buf out = {0};
    cp_profile *merged = NULL;
    cp_err err = {0};
    int status = 1;
    if (!m) goto done;
    size_t bad = 0;
    if (cp_pload_merge((size_t)(argc - optind), read_input, argv + optind, NULL, 0, m, &bad,
                       &err)) {
        fprintf(stderr, "contprof merge: %s: %s\n", argv[optind + (int)bad], err.msg);
        goto done;
    }
    if (!(merged = cp_merger_finish(m))) goto done;
    int rc;
    if (!strcmp(format, "pprof")) {
        /* gzip level 1, like the HTTP API: a third of level 6's time, ~9% more bytes */
        rc = cp_pprof_encode(merged, 1, &out);
    } else {
        int idx = cp_render_find_index(merged, sample_index);
        if (idx < 0) {
            fprintf(stderr, "contprof merge: sample type \"%s\" is not in the profiles\n",
                    sample_index ? sample_index : "");
            goto done;
        }
        rc = !strcmp(format, "top") ? cp_render_top(merged, idx, 0, &out)
                                    : cp_render_folded(merged, idx, &out);
    }
    if (rc) {
        fprintf(stderr, "contprof merge: %s\n", cp_strerror(rc));
        goto done;
    }
    if (cp_write_file(out_path, out.data, out.len, NULL)) {
        fprintf(stderr, "contprof merge: cannot write %s\n", out_path);
        goto done;
    }
    status = 0;
done:
    cp_profile_destroy(merged);
    cp_merger_destroy(m);
    cp_buf_close(&out);
    return status;
}
