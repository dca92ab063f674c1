/* The defaults more than one stage or command needs: where contprofd listens and clients
 * find it, and how long a command waits for it. A default that one stage owns lives with
 * that stage's options (cp_http_options_default, cp_api_options_default,
 * cp_symbols_options_default, CP_BROKER_DEFAULT_PARTITIONS); contprofd's configuration
 * starts from those, so each value is written once. */
#ifndef CP_MODEL_DEFAULTS_H
#define CP_MODEL_DEFAULTS_H

#define CP_DEFAULT_STR_(x) #x
#define CP_DEFAULT_STR(x) CP_DEFAULT_STR_(x)

/* contprofd's HTTP address: loopback, so that a daemon without tokens serves no one else. */
#define CP_DEFAULT_HOST "127.0.0.1"
#define CP_DEFAULT_PORT 7070
#define CP_DEFAULT_LISTEN CP_DEFAULT_HOST ":" CP_DEFAULT_STR(CP_DEFAULT_PORT)

/* The contprofd every command and `contprof import` talk to without --server. */
#define CP_DEFAULT_SERVER "http://" CP_DEFAULT_LISTEN

/* How long a command waits for contprofd's answer (or, for import, for progress) without
 * --timeout: 2 minutes. */
#define CP_DEFAULT_CLIENT_TIMEOUT_NS (120LL * 1000000000LL)

#endif
