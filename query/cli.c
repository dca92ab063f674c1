/* The `contprof` command line: a table of subcommands. Offline commands (merge) work on
 * files; the others talk to a contprofd. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
/* `run` (the agent launcher) and `import` come from other stages; CMake defines these when
 * their libraries exist, so the CLI links either way. */
#ifdef CP_HAVE_CMD_RUN
#include "cmd_run.h"
#endif
#ifdef CP_HAVE_CMD_IMPORT
#include "import.h"
#endif

static const cp_cli_command commands[] = {
    {"merge", cp_cmd_merge, "merge pprof files (raw or gzip) into one: pprof, top or folded"},
    {"query", cp_cmd_query, "the merged profile of a window from contprofd (pprof, json, ...)"},
    {"top", cp_cmd_top, "the table view of a window, like pprof -top"},
    {"series", cp_cmd_series, "series with data in a window"},
    {"labels", cp_cmd_labels, "label names, or the values of one label"},
    {"diff", cp_cmd_diff, "compare two windows or two selections (json or pprof)"},
    {"timeline", cp_cmd_timeline, "totals per step over a window"},
    {"symbols", cp_cmd_symbols, "upload ELF binaries or debug files: contprofd names their frames"},
#ifdef CP_HAVE_CMD_RUN /* from collector/ (cpcollector_cli) */
    {"run", cp_cmd_run, "run a program under the profiling agent"},
#endif
#ifdef CP_HAVE_CMD_IMPORT /* from ingest/ (cpingest_cli) */
    {"import", cp_cmd_import, "send existing pprof files to contprofd through Kafka"},
#endif
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
