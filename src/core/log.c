/* log.c - stderr diagnostics prefixed with "tally[rank N]": warnings always, decisions when
 * TALLY_DEBUG is set. One write per line so lines of concurrent ranks do not interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int tally__log_rank = -1;

void tally__log_set_rank(int rank) { tally__log_rank = rank; }

/* Lazily, without touching the thread's error message: any value but 1 or 2 logs nothing here, and
 * tally_comm_init refuses it through tally__debug_check (env.c). */
int tally__debug_level(void) {
    static int level = -1;
    if (level < 0) {
        const char *s = getenv("TALLY_DEBUG");
        level = s && (!strcmp(s, "1") || !strcmp(s, "2")) ? s[0] - '0' : 0;
    }
    return level;
}

static void tally__log_line(const char *kind, const char *fmt, va_list ap) {
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
    ssize_t rc = write(2, line, len);
    (void)rc;
}

void tally__log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tally__log_line("error", fmt, ap);
    va_end(ap);
}

void tally__log_notice(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tally__log_line("warning", fmt, ap);
    va_end(ap);
}

void tally__log_debug(int level, const char *fmt, ...) {
    if (tally__debug_level() < level) return;
    va_list ap;
    va_start(ap, fmt);
    tally__log_line("debug", fmt, ap);
    va_end(ap);
}
