/* post.c - the gradient-sync engine's operations posted to the communicator's ordered engine: tickets over
 * its requests, the first error kept (later operations of the engine's own skipped), time and bytes. */
#include "post.h"

#include <stdio.h>
#include <string.h>

#include "../core/clock.h"
#include "../core/err.h"

void tally__post_init(tally__post *p, tally_comm *comm, int overlap) {
    memset(p, 0, sizeof *p);
    p->comm = comm;
    p->overlap = overlap;
    pthread_mutex_init(&p->mu, NULL);
}

/* Keeps the first failure and its message (this thread's) for whoever waits. */
static void post_record(tally__post *p, int rc) {
    if (!rc) return;
    pthread_mutex_lock(&p->mu);
    if (!p->err) {
        p->err = rc;
        snprintf(p->errmsg, sizeof p->errmsg, "%s", tally_last_error());
    }
    pthread_mutex_unlock(&p->mu);
}

/* The first failure with its message set on this thread, or 0. */
static int post_error(tally__post *p) {
    pthread_mutex_lock(&p->mu);
    int rc = p->err ? tally__seterr(p->err, "%s", p->errmsg) : 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* An operation of the engine's own, on whichever thread runs it: skipped after a failure, or once the
 * engine is going. */
static int post_run(void *arg) {
    tally__post_op *o = arg;
    tally__post *p = o->p;
    pthread_mutex_lock(&p->mu);
    int prior = p->err ? tally__seterr(p->err, "%s", p->errmsg)
                : p->closing
                    ? tally__seterr(TALLY_E_ABORTED, "the gradient-sync engine closed before this operation ran")
                    : 0;
    pthread_mutex_unlock(&p->mu);
    if (prior) return prior;
    int rc = o->fn(o->ctx, o->a, o->b);
    post_record(p, rc);
    return rc;
}

static void post_count(tally__post *p, int kind, double secs, unsigned long long bytes) {
    p->comm_s += secs;
    p->bytes[kind] += bytes;
}

/* Operation t and those before it waited for, their requests freed, their time and bytes counted. */
static int post_reap(tally__post *p, long ticket) {
    for (; p->done <= ticket && p->done < p->tail; p->done++) {
        tally__post_op *o = &p->op[p->done % TALLY__POST_CAP];
        int rc = tally_wait(o->req);
        post_record(p, rc);
        double secs;
        unsigned long long bytes;
        tally__request_cost(o->req, &secs, &bytes);
        post_count(p, o->kind, secs, bytes);
        tally_request_free(o->req);
        o->req = NULL;
    }
    return post_error(p);
}

/* Without overlap: the operation now, on this thread. */
static long post_inline(tally__post *p, const tally__post_op *o, const tally__call *call) {
    uint64_t t0 = tally__now_ns();
    unsigned long long sent0 = tally_comm_bytes_sent(p->comm);
    int rc = o->fn ? o->fn(o->ctx, o->a, o->b) : tally__comm_call(p->comm, call);
    double secs = (double)(tally__now_ns() - t0) * 1e-9;
    post_count(p, o->kind, secs, tally_comm_bytes_sent(p->comm) - sent0);
    p->wait_s += secs;
    post_record(p, rc);
    if (rc) return rc;
    p->done = ++p->tail;
    return p->tail - 1;
}

/* Either fn(ctx, a, b) (an operation of the engine's own) or the plain collective call. */
static long post_one(tally__post *p, const tally__post_op *what, const tally__call *call) {
    int rc = post_error(p);
    if (rc) return rc;
    if (!p->overlap) return post_inline(p, what, call);
    if (p->tail - p->done >= TALLY__POST_CAP && (rc = post_reap(p, p->done))) return rc;
    tally__post_op *o = &p->op[p->tail % TALLY__POST_CAP];
    *o = *what;
    o->p = p;
    o->req = NULL;
    rc = o->fn ? tally__async_post_fn(p->comm, post_run, o, &o->req) : tally__async_post_call(p->comm, call, &o->req);
    post_record(p, rc);
    return rc ? rc : p->tail++;
}

long tally__post_fn(tally__post *p, tally__post_op_fn fn, void *ctx, int a, int b, int kind) {
    tally__post_op o = {.fn = fn, .ctx = ctx, .a = a, .b = b, .kind = kind};
    return post_one(p, &o, NULL);
}

long tally__post_call(tally__post *p, const tally__call *call, int kind) {
    tally__post_op o = {.kind = kind};
    return post_one(p, &o, call);
}

int tally__post_wait(tally__post *p, long ticket) {
    if (ticket < 0 || !p->overlap) return post_error(p);
    uint64_t t0 = tally__now_ns();
    int rc = post_reap(p, ticket);
    p->wait_s += (double)(tally__now_ns() - t0) * 1e-9;
    return rc;
}

int tally__post_drain(tally__post *p) { return tally__post_wait(p, p->tail - 1); }

int tally__post_failed(tally__post *p) {
    for (int done = 1; p->done < p->tail && done;) {
        tally_test(p->op[p->done % TALLY__POST_CAP].req, &done);
        if (done) post_reap(p, p->done);
    }
    return post_error(p);
}

void tally__post_free(tally__post *p) {
    if (!p->comm) return;
    pthread_mutex_lock(&p->mu);
    p->closing = 1;
    pthread_mutex_unlock(&p->mu);
    post_reap(p, p->tail - 1);
    pthread_mutex_destroy(&p->mu);
    memset(p, 0, sizeof *p);
}
