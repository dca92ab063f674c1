/* `contprof run`: runs a program under the agent. */
#ifndef CP_CMD_RUN_H
#define CP_CMD_RUN_H

/* argv[0] is the command's own name ("run"); options follow, then "--" and the program:
 *   run [--server URL | --brokers LIST] [--service S] [--version V] [--tenant T]
 *       [--label k=v]... [--cpu-hz N] [--alloc-rate BYTES] [--window DURATION]
 *       [--output-dir DIR] [--topic T] [--no-children] -- CMD [ARGS...]
 * Sets CONTPROF_* and prepends libcontprof to LD_PRELOAD (CONTPROF_LIB overrides which
 * file), then execs CMD. When CMD (or its #! interpreter) is one the agent cannot enter
 * (static, secure execution for this caller, Go without cgo, 32-bit), says why in one line
 * on stderr first and execs it all the same. Returns only on error: 2 for usage, 127 if
 * CMD cannot be run. */
int cp_cmd_run(int argc, char **argv);

#endif
