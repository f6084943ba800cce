/* log.h - diagnostics to stderr or the log callback, prefixed with the rank: errors always, decisions
 * at log level 1 (TALLY_DEBUG=1). The library never writes to stdout. */
#ifndef TALLY_CORE_LOG_H
#define TALLY_CORE_LOG_H

#include <tally.h>

/* The rank shown in log lines (-1 before rendezvous). */
void tally__log_set_rank(int rank);
/* The process's log level (0 quiet, 1 decisions, 2 verbose; 0 until set) and callback (NULL: stderr),
 * from the config of the communicator made while no other lived (comm.c). */
void tally__log_configure(int level, tally_log_fn fn, void *user);
int tally__debug_level(void);
void tally__log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Something the user should know that is not an error (a step skipped, a fallback taken). */
void tally__log_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tally__log_debug(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
