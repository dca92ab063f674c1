/* `contprof run`: runs a program under the agent. */
#ifndef CP_CMD_RUN_H
#define CP_CMD_RUN_H

/* argv[0] is the command's own name ("run"); options follow, then "--" and the program:
 *   run [--server URL | --brokers LIST] [--service S] [--version V] [--tenant T]
 *       [--label k=v]... [--cpu-hz N] [--alloc-rate BYTES] [--window DURATION]
 *       [--output-dir DIR] [--topic T] [--no-children] -- CMD [ARGS...]
 * Sets CONTPROF_* and prepends libcontprof to LD_PRELOAD (CONTPROF_LIB overrides which
 * file), then execs CMD. Returns only on error: 2 for usage, 127 if CMD cannot be run. */
int cp_cmd_run(int argc, char **argv);

#endif
