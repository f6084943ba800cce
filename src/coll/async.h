/* async.h - non-blocking collectives: a communicator's requests, run one at a time in the order posted
 * on its communication thread (started by the first one), or by a waiter that finds the thread idle. */
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
} tally__call;

typedef struct tally__async tally__async;

/* What comm.c calls of a communicator's engine, through the slot (async.c calls comm.c, not the reverse):
 * pending: 1 while requests are queued or running, so a blocking call must wait its turn; through: a
 * blocking call behind them, posted then waited for; stop: runs what is queued (after an abort each
 * fails at once), stops and joins the thread and frees the engine (free and abort call it before the
 * communicator goes; not from a request's callback). */
typedef struct tally__async_ops {
    int (*pending)(tally__async *e);
    int (*through)(tally__async *e, const tally__call *a);
    void (*stop)(tally__async *e);
} tally__async_ops;
typedef struct tally__async_slot {
    tally__async *e; /* NULL until the first non-blocking call */
    const tally__async_ops *ops;
} tally__async_slot;

/* comm.c: runs the call on this thread, as the blocking entry point does (its message names world ranks
 * in a split); and where the communicator keeps its engine. */
int tally__comm_run(tally_comm *c, const tally__call *a);
tally__async_slot *tally__comm_async(tally_comm *c);

#endif
