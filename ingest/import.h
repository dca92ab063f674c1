/* `contprof import`: sends existing pprof files through Kafka as envelopes. */
#ifndef CP_IMPORT_H
#define CP_IMPORT_H

/* contprof import [--server URL | --brokers LIST] [--tenant T] [--service S]
 *                 [--label k=v]... [--at TIME --duration D] FILE...
 * Returns the process exit code (0 when every file was delivered). argv[0] is "import". */
int cp_cmd_import(int argc, char **argv);

#endif
