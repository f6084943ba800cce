/* opqueue.c - the communication thread behind both sync engines: operations run one at a time in the
 * order posted (every rank posts the same sequence, so collectives match), tickets say what is done. */
#include "opqueue.h"

#include <stdio.h>
#include <string.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "../core/trace.h"

/* Called with mu held. Keeps the first error and its message for whoever waits. */
static void opq_record(tally__opq *q, int rc) {
    if (!rc || q->err || q->stop) return;
    q->err = rc;
    snprintf(q->errmsg, sizeof q->errmsg, "%s", tally_last_error());
}

/* With mu held, op[head] queued and nobody running it: runs it with mu released, whichever thread
 * calls. After an error, or once the owner is tearing down, the rest are skipped, not run. */
static void opq_run_head(tally__opq *q) {
    int i = (int)(q->head % TALLY__OPQ_CAP), prior = q->err ? q->err : q->stop ? TALLY_E_ABORTED : 0;
    tally__op_fn fn = q->op[i].fn;
    int a = q->op[i].a, b = q->op[i].b;
    q->busy = 1;
    pthread_mutex_unlock(&q->mu);
    int rc = prior ? prior : fn(q->ctx, a, b);
    pthread_mutex_lock(&q->mu);
    opq_record(q, rc);
    q->busy = 0;
    q->head++;
    pthread_cond_broadcast(&q->finished);
    if (q->head < q->tail) pthread_cond_signal(&q->posted); /* the thread may wait for busy to clear */
}

static void *opq_thread(void *arg) {
    tally__opq *q = arg;
    tally__trace_thread("comm (gradient sync)");
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && (q->head == q->tail || q->busy)) pthread_cond_wait(&q->posted, &q->mu);
        if (q->busy) { /* stopping while a waiter runs one: let it finish */
            pthread_cond_wait(&q->finished, &q->mu);
            continue;
        }
        if (q->head == q->tail) break; /* stopping, and nothing left to run */
        opq_run_head(q);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int tally__opq_init(tally__opq *q, void *ctx, int threaded) {
    memset(q, 0, sizeof *q);
    q->ctx = ctx;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->posted, NULL);
    pthread_cond_init(&q->finished, NULL);
    if (!threaded) return 0;
    int rc = pthread_create(&q->thread, NULL, opq_thread, q);
    if (rc) return tally__seterr(TALLY_E_SYSTEM, "cannot start the communication thread: %s", strerror(rc));
    q->started = 1;
    return 0;
}

void tally__opq_free(tally__opq *q) {
    if (q->started) {
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_broadcast(&q->posted);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
        q->started = 0;
    }
    pthread_cond_destroy(&q->finished);
    pthread_cond_destroy(&q->posted);
    pthread_mutex_destroy(&q->mu);
}

static int opq_error(tally__opq *q) { return tally__seterr(q->err, "%s", q->errmsg); }

long tally__opq_post(tally__opq *q, tally__op_fn fn, int a, int b) {
    if (!q->started) { /* inline: the same order, no thread */
        if (q->err) return opq_error(q);
        int rc = fn(q->ctx, a, b);
        opq_record(q, rc);
        return rc ? rc : q->tail++;
    }
    pthread_mutex_lock(&q->mu);
    while (q->tail - q->head >= TALLY__OPQ_CAP && !q->err) pthread_cond_wait(&q->finished, &q->mu);
    long t = q->err ? -1 : q->tail;
    if (t >= 0) {
        int i = (int)(t % TALLY__OPQ_CAP);
        q->op[i].fn = fn;
        q->op[i].a = a;
        q->op[i].b = b;
        q->tail++;
        pthread_cond_signal(&q->posted);
    }
    pthread_mutex_unlock(&q->mu);
    return t >= 0 ? t : opq_error(q);
}

int tally__opq_wait(tally__opq *q, long ticket) {
    if (!q->started) return q->err ? opq_error(q) : 0;
    if (ticket < 0) return 0;
    uint64_t t0 = tally__now_ns();
    pthread_mutex_lock(&q->mu);
    while (q->head <= ticket) {
        if (!q->busy)
            opq_run_head(q);
        else
            pthread_cond_wait(&q->finished, &q->mu);
    }
    int rc = q->err;
    pthread_mutex_unlock(&q->mu);
    q->wait_s += (double)(tally__now_ns() - t0) * 1e-9;
    return rc ? opq_error(q) : 0;
}

int tally__opq_drain(tally__opq *q) {
    if (!q->started) return q->err ? opq_error(q) : 0;
    pthread_mutex_lock(&q->mu);
    long last = q->tail - 1;
    pthread_mutex_unlock(&q->mu);
    return last < 0 ? (q->err ? opq_error(q) : 0) : tally__opq_wait(q, last);
}

int tally__opq_failed(tally__opq *q) {
    pthread_mutex_lock(&q->mu);
    int rc = q->err;
    pthread_mutex_unlock(&q->mu);
    return rc ? opq_error(q) : 0;
}
