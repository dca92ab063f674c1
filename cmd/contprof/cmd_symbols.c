/* `contprof symbols upload`: sends ELF binaries or separate debug files, or JavaScript
 * source maps, to contprofd, which keeps their symbol tables per tenant and build ID (maps
 * per generated script) and names frames with them at query time (profiles stored before
 * the upload included). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "http_client.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: contprof symbols upload [--server URL] [--token T] [--tenant T] FILE...\n"
            "  FILE          an ELF binary (unstripped) or its separate debug file, or a\n"
            "                source map (SCRIPT.js.map: for the V8 frames of SCRIPT.js)\n"
            "  --server URL  contprofd's HTTP address (default %s, or CONTPROF_SERVER)\n"
            "  --token T     bearer token (or CONTPROF_TOKEN); it decides the tenant\n"
            "  --tenant T    fail unless the token's tenant is T\n",
            CP_DEFAULT_SERVER);
}

int cp_cmd_symbols(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "upload") != 0) {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            usage(stdout);
            return 0;
        }
        usage(stderr);
        return 2;
    }
    const char *server = getenv("CONTPROF_SERVER"), *token = getenv("CONTPROF_TOKEN");
    const char *tenant = NULL;
    if (!server || !*server) server = CP_DEFAULT_SERVER;
    static const struct option opts[] = {{"server", required_argument, 0, 's'},
                                         {"token", required_argument, 0, 't'},
                                         {"tenant", required_argument, 0, 'T'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    argc--, argv++; /* past "symbols": argv[0] is "upload" */
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            server = optarg;
            break;
        case 't':
            token = optarg;
            break;
        case 'T':
            tenant = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "contprof symbols upload: no FILE given\n");
        usage(stderr);
        return 2;
    }
    int status = 0;
    for (int i = optind; i < argc; i++) {
        /* the file's name keys a source map without "file" (the server ignores it for ELF) */
        const char *base = strrchr(argv[i], '/');
        base = base ? base + 1 : argv[i];
        cp_buf path = {0};
        if (cp_buf_printf(&path, "/api/v1/symbols?name=") || cp_url_encode(&path, base) ||
            (tenant && (cp_buf_printf(&path, "&tenant=") || cp_url_encode(&path, tenant))) ||
            cp_buf_append(&path, "", 1)) {
            fprintf(stderr, "contprof symbols upload: out of memory\n");
            cp_buf_close(&path);
            return 1;
        }
        cp_buf file = {0};
        if (cp_read_file(argv[i], &file, NULL)) {
            fprintf(stderr, "contprof symbols upload: cannot read %s\n", argv[i]);
            cp_buf_close(&path);
            status = 1;
            continue;
        }
        cp_http_result res;
        cp_err err = {0};
        int rc = cp_http_post(server, (const char *)path.data, token, file.data, file.len, 600000,
                              1 << 20, &res, &err);
        cp_buf_close(&file);
        cp_buf_close(&path);
        if (rc) {
            fprintf(stderr, "contprof symbols upload: %s: %s\n", argv[i], err.msg);
            status = 1;
            continue;
        }
        FILE *to = res.status == 200 ? stdout : stderr;
        fprintf(to, "%s: ", argv[i]);
        if (res.status != 200) fprintf(to, "HTTP %d ", res.status);
        fwrite(res.body.data, 1, res.body.len, to);
        if (!res.body.len || res.body.data[res.body.len - 1] != '\n') fputc('\n', to);
        if (res.status != 200) status = 1;
        /* kept by the node asked, not by every node of its cluster: never silently */
        if (res.status == 200 && res.partial[0]) {
            fprintf(stderr,
                    "contprof symbols upload: %s: warning: partial upload: not kept by %s "
                    "(frames stored there stay unnamed; upload again once it is back)\n",
                    argv[i], res.partial);
            status = 1;
        }
        cp_buf_close(&res.body);
    }
    return status;
}
