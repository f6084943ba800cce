/* log.c - diagnostics prefixed with "tally[rank N]": errors and warnings always, decisions at log level
 * 1 or 2; to stderr, one write per line so lines of concurrent ranks do not interleave, or to the
 * process's log callback. Level and callback are process-wide, set from a communicator's config. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

static int tally__log_rank = -1;

void tally__log_set_rank(int rank) { tally__log_rank = rank; }

static _Atomic int tally__log_level;
/* The callback is called under the lock: one line at a time, so it need not be thread-safe, and never
 * after tally__log_configure has taken it away. */
static pthread_mutex_t tally__log_lock = PTHREAD_MUTEX_INITIALIZER;
static tally_log_fn tally__log_fn;
static void *tally__log_user;

void tally__log_configure(int level, tally_log_fn fn, void *user) {
    atomic_store_explicit(&tally__log_level, level, memory_order_relaxed);
    pthread_mutex_lock(&tally__log_lock);
    tally__log_fn = fn;
    tally__log_user = user;
    pthread_mutex_unlock(&tally__log_lock);
}

int tally__debug_level(void) { return atomic_load_explicit(&tally__log_level, memory_order_relaxed); }

/* Returns 1 when the callback took the line (without its newline). */
static int tally__log_to_fn(int level, char *line, size_t len) {
    pthread_mutex_lock(&tally__log_lock);
    tally_log_fn fn = tally__log_fn;
    if (fn) {
        line[len - 1] = '\0';
        fn(tally__log_user, level, line);
    }
    pthread_mutex_unlock(&tally__log_lock);
    return fn != NULL;
}

static void tally__log_line(int level, const char *kind, const char *fmt, va_list ap) {
    char line[1200];
    int n;
    if (tally__log_rank >= 0)
        n = snprintf(line, sizeof line, "tally[rank %d] %s: ", tally__log_rank, kind);
    else
        n = snprintf(line, sizeof line, "tally[pid %d] %s: ", (int)getpid(), kind);
    if (n < 0) return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    if (m < 0) return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    if (tally__log_to_fn(level, line, len)) return;
    ssize_t rc = write(2, line, len);
    (void)rc;
}

void tally__log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tally__log_line(TALLY_LOG_ERROR, "error", fmt, ap);
    va_end(ap);
}

void tally__log_notice(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tally__log_line(TALLY_LOG_WARNING, "warning", fmt, ap);
    va_end(ap);
}

void tally__log_debug(int level, const char *fmt, ...) {
    if (tally__debug_level() < level) return;
    va_list ap;
    va_start(ap, fmt);
    tally__log_line(level, "debug", fmt, ap);
    va_end(ap);
}
