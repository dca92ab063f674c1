/* The `contprof` command line: a table of subcommands. Offline commands (merge) work on
 * files; the others talk to a contprofd. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const cp_cli_command commands[] = {
    {"merge", cp_cmd_merge, "merge pprof files (raw or gzip) into one: pprof, top or folded"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: contprof COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'contprof COMMAND --help' describes one command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, argv[1]) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "contprof: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
