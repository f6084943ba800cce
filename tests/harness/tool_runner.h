/* tool_runner.h - runs the tally binary ($TALLY_BIN) as a user would, bounded: a clean rank environment
 * with chosen variables, stdout and stderr together and capped, a wall-clock limit, its peak memory. */
#ifndef TALLY_TEST_TOOL_RUNNER_H
#define TALLY_TEST_TOOL_RUNNER_H

#include <stddef.h>

#define TH_TOOL_OUT_CAP (1 << 16)

typedef struct th_tool {
    int rc;        /* exit status, 128+signal when killed, -1 when it could not be run */
    int timed_out; /* killed at the wall-clock limit */
    double secs;
    long maxrss_kb; /* the largest resident set of the process and its children (getrusage) */
    size_t len;
    char out[TH_TOOL_OUT_CAP]; /* stdout and stderr together; past the cap it is stopped */
} th_tool;

typedef struct th_tool_opts {
    const char *const *env;   /* NAME=VALUE to set, NULL-terminated (or NULL) */
    double wall_s;            /* default 20 */
    void (*child)(void *arg); /* in the child before exec: setrlimit, umask... */
    void *arg;
} th_tool_opts;

/* `tally ARGS...` (args without the program name, NULL-terminated). */
void th_tool_run(const char *const *args, const th_tool_opts *o, th_tool *r);

/* A check on a run: on failure it says what, the exit status, whether the limit killed it, and the
 * first of its output. */
void th_tool_expect(const th_tool *r, int cond, const char *what);

#endif
