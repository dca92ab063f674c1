/* Logging for the daemons and the CLI: one line per event on stderr with a timestamp. The
 * agent library does not log through this except at start-up and on fatal misconfiguration. */
#ifndef CP_LOG_H
#define CP_LOG_H

enum { CP_LOG_ERROR, CP_LOG_WARN, CP_LOG_INFO, CP_LOG_DEBUG };

/* Messages above this level are dropped; default CP_LOG_INFO (CONTPROF_LOG=debug|...). */
extern int cp_log_level;

/* Writes one line "<RFC 3339 time> <level> <message>" (cut at 1 KiB) to stderr if level is
 * at most cp_log_level. Thread-safe (one write per line). Not async-signal-safe. */
void cp_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define cp_log_error(...) cp_log(CP_LOG_ERROR, __VA_ARGS__)
#define cp_log_warn(...) cp_log(CP_LOG_WARN, __VA_ARGS__)
#define cp_log_info(...) cp_log(CP_LOG_INFO, __VA_ARGS__)
#define cp_log_debug(...) cp_log(CP_LOG_DEBUG, __VA_ARGS__)

#endif
