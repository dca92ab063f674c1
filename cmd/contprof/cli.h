/* Subcommands of the `contprof` CLI. Each takes argv with argv[0] = the command name and
 * returns the process exit code (0 ok, 1 failure, 2 usage error). */
#ifndef CP_CLI_H
#define CP_CLI_H

#include "defaults.h" /* CP_DEFAULT_SERVER, CP_DEFAULT_CLIENT_TIMEOUT_NS */

typedef struct cp_cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} cp_cli_command;

int cp_cmd_merge(int argc, char **argv);
int cp_cmd_query(int argc, char **argv);
int cp_cmd_top(int argc, char **argv);
int cp_cmd_series(int argc, char **argv);
int cp_cmd_labels(int argc, char **argv);
int cp_cmd_diff(int argc, char **argv);
int cp_cmd_timeline(int argc, char **argv);
int cp_cmd_symbols(int argc, char **argv);
int cp_cmd_capture(int argc, char **argv);
int cp_cmd_relay(int argc, char **argv);

#endif
