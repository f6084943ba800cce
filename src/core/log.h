/* log.h - diagnostics to stderr, prefixed with the rank: errors always, decisions with TALLY_DEBUG=1.
 * The library never writes to stdout. */
#ifndef TALLY_CORE_LOG_H
#define TALLY_CORE_LOG_H

/* The rank shown in log lines (-1 before rendezvous). */
void tally__log_set_rank(int rank);
/* TALLY_DEBUG level: 0 quiet, 1 decisions, 2 verbose. */
int tally__debug_level(void);
void tally__log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Something the user should know that is not an error (a step skipped, a fallback taken). */
void tally__log_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tally__log_debug(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
