/* post.h - the gradient-sync engine's operations on the communicator's one ordered engine (coll/async.c):
 * posted in the same sequence on every rank, tickets in post order, waits that report the first error. */
#ifndef TALLY_DP_POST_H
#define TALLY_DP_POST_H

#include <pthread.h>
#include <tally.h>

#include "../coll/async.h"
#include "../core/sig.h"

/* Operations posted and not yet waited for, at most: a post beyond it first waits for the oldest. */
#define TALLY__POST_CAP 256

/* One operation of the engine's own: fn(ctx, a, b), returning 0 or a TALLY_E_* code. */
typedef int (*tally__post_op_fn)(void *ctx, int a, int b);

/* What an operation's bytes count as: the gradients' reductions are reported apart. */
enum { TALLY__POST_GRAD, TALLY__POST_PARAM, TALLY__POST_KINDS };

typedef struct tally__post_op {
    struct tally__post *p;
    tally__post_op_fn fn; /* NULL: a plain collective, posted as tally_i* */
    void *ctx;
    int a, b, kind;
    tally_request *req;
} tally__post_op;

typedef struct tally__post {
    tally_comm *comm;
    int overlap; /* 0: every operation runs inline when posted and no thread starts ("no overlap") */
    tally__post_op op[TALLY__POST_CAP];
    long done, tail;    /* tickets: op[t % CAP] for done <= t < tail are posted and not yet waited for */
    pthread_mutex_t mu; /* err, errmsg, closing: an operation's failure is recorded by whoever ran it */
    int err, closing;
    char errmsg[1024];
    double comm_s;                               /* in the operations, whichever thread ran them */
    unsigned long long bytes[TALLY__POST_KINDS]; /* sent by them, by kind */
    double wait_s; /* the caller's time waiting for operations or running them (inline, or as the waiter) */
} tally__post;

/* overlap: post to the communication thread; else run every operation inline when posted. */
void tally__post_init(tally__post *p, tally_comm *comm, int overlap);
/* Waits for what is posted (operations of the engine's own not yet begun are skipped: the engine is
 * going), then frees. Safe on a zeroed one. */
void tally__post_free(tally__post *p);
/* Posts fn(ctx, a, b) and returns its ticket (>= 0), or the first error (< 0) of an earlier operation
 * (after which the engine's own operations are skipped, not run). */
long tally__post_fn(tally__post *p, tally__post_op_fn fn, void *ctx, int a, int b, int kind);
/* Posts a plain collective (tally_iallreduce & co.) the same way. */
long tally__post_call(tally__post *p, const tally__call *call, int kind);
/* Until operation `ticket` and all before it are done; the first error (its message set on this thread)
 * or 0. The waiter runs queued operations the thread has not started itself (coll/async.c). A ticket < 0
 * returns at once. */
int tally__post_wait(tally__post *p, long ticket);
/* Waits for everything posted. */
int tally__post_drain(tally__post *p);
/* The first error of the operations done so far (its message set on this thread), or 0; does not wait. */
int tally__post_failed(tally__post *p);

#endif
