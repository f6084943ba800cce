/* mock_tp.h - an in-process transport for testing algorithms: N ranks as threads, messages through
 * per-(src,dst) FIFO mailboxes, transport.h's rules checked on every exchange, hangs turned into failures. */
#ifndef TALLY_TEST_MOCK_TP_H
#define TALLY_TEST_MOCK_TP_H

#include "coll/coll.h"

typedef struct mock_world mock_world;

typedef struct mock_stats {
    unsigned long long exchanges;  /* exchange calls */
    unsigned long long sends;      /* messages sent */
    unsigned long long bytes_sent; /* payload bytes sent */
} mock_stats;

/* A rank's body: runs on its own thread with its context; returns 0 or a TALLY_E_* code. */
typedef int (*mock_rank_fn)(const tally__ctx *c, void *arg);

/* n ranks (2..64) on n persistent threads. An exchange waiting longer than timeout_s fails the run. */
mock_world *mock_world_new(int n, double timeout_s);
void mock_world_free(mock_world *w);

/* Runs fn on every rank at once and waits for all; rc[r] gets rank r's return (rc may be NULL).
 * Returns 0, or -1 when a rule was broken or an exchange timed out (mock_failure says what). */
int mock_run(mock_world *w, mock_rank_fn fn, void *arg, int *rc);
const char *mock_failure(const mock_world *w);
/* Every rank's transport as shm's on a crowded host (1: tally__tp.fan_out and ctx.crowded set), or as
 * a plain one (0, the default): algorithms that post their rounds together there take both paths. */
void mock_fan_out(mock_world *w, int on);
/* Counters of rank r for the last mock_run. */
mock_stats mock_stats_of(const mock_world *w, int r);

#endif
