/* opqueue.h - the communication thread of both gradient-sync engines (DDP's buckets, ZeRO's gathers
 * and reductions): queued operations run one at a time in the order posted, on it or on a waiter. */
#ifndef TALLY_DP_OPQUEUE_H
#define TALLY_DP_OPQUEUE_H

#include <pthread.h>

#define TALLY__OPQ_CAP 256

/* One operation: fn(ctx, a, b), returning 0 or a TALLY_E_* code. */
typedef int (*tally__op_fn)(void *ctx, int a, int b);

typedef struct tally__opq {
    pthread_t thread;
    int started; /* 0: operations run inline, in post (no thread; "no overlap") */
    pthread_mutex_t mu;
    pthread_cond_t posted, finished;
    struct {
        tally__op_fn fn;
        int a, b;
    } op[TALLY__OPQ_CAP];
    long head, tail; /* tickets: op[t % CAP] for head <= t < tail are queued or running */
    int busy;        /* op[head] is running (on the thread or on a waiter) */
    void *ctx;
    int stop, err;
    char errmsg[1024];
    double wait_s; /* the caller's time in tally__opq_wait, including operations it ran itself */
} tally__opq;

/* threaded: start the thread; else run every operation inline when posted. */
int tally__opq_init(tally__opq *q, void *ctx, int threaded);
void tally__opq_free(tally__opq *q);
/* Queues fn(ctx, a, b) and returns its ticket (>= 0), or the first error (< 0) of an earlier one. */
long tally__opq_post(tally__opq *q, tally__op_fn fn, int a, int b);
/* Until operation `ticket` and all before it have run; returns the first error (with its message set
 * on this thread) or 0. The waiter runs queued operations the thread has not started itself: handing
 * them over would only add two thread switches (on a busy core, a scheduling delay each) to a wait
 * that has nothing else to do. A ticket < 0 returns at once. */
int tally__opq_wait(tally__opq *q, long ticket);
/* Waits for everything queued. */
int tally__opq_drain(tally__opq *q);
/* The first error of any operation so far (its message set on this thread), or 0; does not wait. */
int tally__opq_failed(tally__opq *q);

#endif
