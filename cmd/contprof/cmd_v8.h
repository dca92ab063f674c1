/* `contprof v8`: the V8 source's front end (collector/v8/). */
#ifndef CP_CMD_V8_H
#define CP_CMD_V8_H

/* Parses `contprof v8` flags and runs the source until SIGINT/SIGTERM. Returns the exit
 * code: 0, 1 (the source failed), 2 (usage). */
int cp_cmd_v8(int argc, char **argv);

#endif
