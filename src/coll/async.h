/* async.h - ordered non-blocking operations: a communicator's requests (its collectives and the library's
 * own operations), run one at a time in the order posted on its communication thread or by a waiter. */
#ifndef TALLY_COLL_ASYNC_H
#define TALLY_COLL_ASYNC_H

#include <stddef.h>
#include <tally.h>

/* One collective call, as its entry point took it. */
typedef struct tally__call {
    int coll; /* TALLY__ALLREDUCE, ... (core/sig.h) */
    const void *send;
    void *recv; /* the data of a broadcast */
    size_t count;
    tally_dtype t;
    tally_op op;
    int root;
    /* alltoallv's: size entries each (a non-blocking call's point into its request, which copied them) */
    const size_t *sendcounts, *sdispls, *recvcounts, *rdispls;
    /* What runs a call comm.c's own bodies do not (rooted.c's: reduce, gather, scatter, alltoall, alltoallv),
     * as comm.c's dispatch would; called through here so comm.c does not depend on rooted.c. */
    int (*body)(tally_comm *c, const struct tally__call *a);
} tally__call;

typedef struct tally__async tally__async;

/* What comm.c calls of a communicator's engine, through the slot (async.c calls comm.c, not the reverse):
 * pending: 1 while requests are queued or running, so a blocking call must wait its turn (0 on the thread
 * running one of the library's operations: its blocking calls are part of it); through: a blocking call
 * behind them, posted then waited for; stop: runs what is queued (abandon, from abort: the collectives fail
 * at once on the fault, the library's operations fail unrun), stops and joins the thread and frees the
 * engine (free and abort call it before the communicator goes; not from a request's callback). */
typedef struct tally__async_ops {
    int (*pending)(tally__async *e);
    int (*through)(tally__async *e, const tally__call *a);
    void (*stop)(tally__async *e, int abandon);
} tally__async_ops;
typedef struct tally__async_slot {
    tally__async *e; /* NULL until the first non-blocking call */
    const tally__async_ops *ops;
} tally__async_slot;

/* An operation of the library's own (a codec's encode, collective and decode; a sequence of collectives):
 * 0 or a TALLY_E_* code with its message set on the thread that ran it. */
typedef int (*tally__async_fn)(void *ctx);
/* Posts fn(ctx) behind the communicator's pending requests, under the rules of tally_iallreduce's: one
 * at a time in the order posted, run on the communication thread or by a waiter, its error its request's,
 * failed by abort, completed by free. Its blocking collectives on this communicator run inside it. */
int tally__async_post_fn(tally_comm *c, tally__async_fn fn, void *ctx, tally_request **req);
/* Posts a collective call as its non-blocking entry point (tally_iallreduce ...) does. */
int tally__async_post_call(tally_comm *c, const tally__call *a, tally_request **req);
/* A done request's operation: the seconds it ran and the bytes its communicator sent meanwhile (0 while
 * it is not done). */
void tally__request_cost(const tally_request *r, double *secs, unsigned long long *bytes);

/* A request completed from outside the queue (point-to-point: src/coll/p2p.c): made pending, completed
 * once with its result, message and (for a receive, else -1) the sender's rank; tally_wait, _test,
 * _on_done, _free and tally_request_source take it as any other. */
int tally__request_external(tally_request **req);
void tally__request_complete(tally_request *req, int rc, const char *msg, int source);
/* What a waiter on an external request runs before it sleeps: fn(arg, &done) may progress the request on
 * the waiter's thread (a receive's messages read there); 0 from it, or its return, and the wait goes on. */
void tally__request_progress(tally_request *req, int (*fn)(void *arg, _Atomic int *done), void *arg);

/* comm.c: runs the call on this thread, as the blocking entry point does (its message names world ranks
 * in a split); the blocking entry point itself (behind pending requests, as tally_allreduce ...); and
 * where the communicator keeps its engine. */
int tally__comm_run(tally_comm *c, const tally__call *a);
int tally__comm_call(tally_comm *c, const tally__call *a);
tally__async_slot *tally__comm_async(tally_comm *c);

#endif
