/* async.c - the one engine for ordered non-blocking operations: a queue per communicator of collectives and
 * of the library's own operations, run in the order posted on its communication thread or a waiter. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "../core/sig.h"
#include "../core/trace.h"
#include "async.h"
#include "coll.h"

enum { REQ_QUEUED, REQ_RUNNING, REQ_FINISHING, REQ_DONE };

struct tally_request {
    tally__async *eng; /* read only while not done: a done request outlives its communicator */
    tally__call call;
    tally__async_fn op; /* an operation of the library's own instead of the call (tally__async_post_fn) */
    void *op_ctx;
    tally_request *next;
    int state;    /* under eng->mu until done */
    int detached; /* freed while pending: whoever completes it frees it */
    _Atomic int done;
    int rc;
    char msg[1024];
    double secs;              /* the operation's own run, whichever thread ran it */
    unsigned long long bytes; /* what the communicator sent meanwhile */
    void (*fn)(void *arg, int rc, const char *msg);
    void *arg;
    int ext;    /* completed from outside the queue (point-to-point): its state is under ext_mu */
    int source; /* a receive's sender once done, else -1 */
    int (*progress)(void *arg, _Atomic int *done); /* external: what a waiter runs before it sleeps */
    void *progress_arg;
    tally__proc proc; /* the process that made it: a forked child may not wait on it */
};

struct tally__async {
    tally_comm *comm;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t posted, finished;
    tally_request *head, *tail; /* queued in order; the head may be running */
    int running, stop;
    int aborted;            /* the communicator was aborted: operations of the library's own fail unrun */
    int users;              /* callers inside tally_wait, _on_done or _free: stop waits for them to leave */
    _Atomic unsigned posts; /* requests posted so far: what the thread watches before it sleeps */
};

static pthread_mutex_t async_create_mu = PTHREAD_MUTEX_INITIALIZER;

/* The engine whose head this thread is running: a blocking call made inside that operation is part of
 * it and runs at once, not behind it. */
static _Thread_local tally__async *async_running;

/* With mu released: the head's call or operation, timed and counted. */
static int async_exec(tally__async *e, tally_request *r, int aborted) {
    uint64_t t0 = tally__now_ns();
    unsigned long long sent0 = tally_comm_bytes_sent(e->comm);
    int rc;
    if (!r->op) {
        rc = tally__comm_run(e->comm, &r->call);
    } else if (aborted) {
        rc = tally__seterr(TALLY_E_ABORTED, "the communicator was aborted (tally_comm_abort) before this operation "
                                            "ran");
    } else {
        tally__async *outer = async_running;
        async_running = e;
        rc = r->op(r->op_ctx);
        async_running = outer;
    }
    r->bytes = tally_comm_bytes_sent(e->comm) - sent0;
    r->secs = (double)(tally__now_ns() - t0) * 1e-9;
    return rc;
}

/* With mu held and the head not running: runs it with mu released (on whichever thread calls), then its
 * callback, and only then marks it done, so a waiter that frees it never races the callback. */
static void async_run_head(tally__async *e) {
    tally_request *r = e->head;
    e->running = 1;
    r->state = REQ_RUNNING;
    int aborted = e->aborted;
    pthread_mutex_unlock(&e->mu);
    int rc = async_exec(e, r, aborted);
    r->rc = rc;
    if (rc) snprintf(r->msg, sizeof r->msg, "%s", tally_last_error());
    pthread_mutex_lock(&e->mu);
    e->head = r->next;
    if (!e->head) e->tail = NULL;
    e->running = 0;
    r->state = REQ_FINISHING;
    void (*fn)(void *, int, const char *) = r->fn;
    void *arg = r->arg;
    if (e->head) pthread_cond_signal(&e->posted); /* the thread may have waited for us to finish */
    pthread_mutex_unlock(&e->mu);
    if (fn) fn(arg, rc, r->msg);
    pthread_mutex_lock(&e->mu);
    r->state = REQ_DONE;
    if (r->detached) /* nobody holds it; once done is published, its owner may free it at any moment */
        free(r);
    else
        atomic_store_explicit(&r->done, 1, memory_order_release);
    pthread_cond_broadcast(&e->finished);
    pthread_cond_broadcast(&e->posted); /* a stopping thread waits for the last one */
}

/* How long the thread watches for the next request after running one (yielding the CPU) before it
 * sleeps: blocking calls that Python runs as requests (to wait in slices) come one after another, and
 * each would otherwise pay the thread's wake-up (an 8-byte allreduce: 13 us rather than 6 on 2 CPUs). */
#define ASYNC_LINGER_NS 50000

static void *async_thread(void *arg) {
    tally__async *e = arg;
    tally__trace_thread("comm thread");
    pthread_mutex_lock(&e->mu);
    int ran = 0;
    for (;;) {
        if (e->head && !e->running) {
            async_run_head(e);
            ran = 1;
            continue;
        }
        if (e->stop && !e->head) break;
        if (ran) {
            ran = 0;
            unsigned seen = atomic_load_explicit(&e->posts, memory_order_relaxed);
            pthread_mutex_unlock(&e->mu);
            for (uint64_t end = tally__now_ns() + ASYNC_LINGER_NS;
                 atomic_load_explicit(&e->posts, memory_order_relaxed) == seen && tally__now_ns() < end;)
                sched_yield();
            pthread_mutex_lock(&e->mu);
            continue;
        }
        pthread_cond_wait(&e->posted, &e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static int async_pending(tally__async *e) {
    if (async_running == e) return 0; /* called from inside the running operation */
    pthread_mutex_lock(&e->mu);
    int pending = e->head != NULL;
    pthread_mutex_unlock(&e->mu);
    return pending;
}

/* alltoallv's four arrays go after the request, in its one allocation: the caller may change its own once
 * the call returns, and they are freed with the request whichever way it goes. */
static size_t async_arrays_bytes(const tally__async *e, const tally__call *a) {
    return a && a->coll == TALLY__ALLTOALLV ? 4 * (size_t)tally_comm_size(e->comm) * sizeof(size_t) : 0;
}

static void async_copy_arrays(tally_request *r, int n) {
    size_t *at = (size_t *)(r + 1);
    const size_t **arrays[4] = {&r->call.sendcounts, &r->call.sdispls, &r->call.recvcounts, &r->call.rdispls};
    for (int k = 0; k < 4; k++, at += n)
        if (*arrays[k]) *arrays[k] = memcpy(at, *arrays[k], (size_t)n * sizeof *at); /* NULL: refused when run */
}

static int async_post(tally__async *e, const tally__call *a, tally__async_fn op, void *ctx, tally_request **req) {
    size_t arrays = async_arrays_bytes(e, a);
    tally_request *r = calloc(1, sizeof *r + arrays);
    if (!r) return tally__seterr(TALLY_E_NOMEM, "tally: no memory for a request");
    r->eng = e;
    r->source = -1;
    tally__proc_stamp(&r->proc);
    if (a) r->call = *a;
    if (arrays) async_copy_arrays(r, tally_comm_size(e->comm));
    r->op = op;
    r->op_ctx = ctx;
    pthread_mutex_lock(&e->mu);
    if (e->tail)
        e->tail->next = r;
    else
        e->head = r;
    e->tail = r;
    atomic_fetch_add_explicit(&e->posts, 1, memory_order_relaxed);
    pthread_cond_signal(&e->posted);
    pthread_mutex_unlock(&e->mu);
    *req = r;
    return 0;
}

static int async_through(tally__async *e, const tally__call *a) {
    tally_request *r = NULL;
    int rc = async_post(e, a, NULL, NULL, &r);
    if (rc) return rc;
    rc = tally_wait(r);
    free(r);
    return rc;
}

/* A caller of the request calls on another thread (abort may come from any) is let out before the
 * engine goes. */
static void async_enter(tally__async *e) {
    pthread_mutex_lock(&e->mu);
    e->users++;
}

/* Entering the engine of a request that is not done yet: a request's engine goes once its queue is run
 * (async_stop), which publishes every request done first, so a caller that saw "not done" might find the
 * engine freed by the time it locks it. The gate closes that gap: under it, "not done" means the engine
 * is still there, and async_stop passes the gate before it waits for the users to leave. Returns the
 * entered engine (mu held), or NULL when the request is done. */
static pthread_mutex_t async_gate = PTHREAD_MUTEX_INITIALIZER;

static tally__async *async_enter_pending(tally_request *r) {
    tally__async *e = NULL;
    pthread_mutex_lock(&async_gate);
    if (!atomic_load_explicit(&r->done, memory_order_acquire)) async_enter(e = r->eng);
    pthread_mutex_unlock(&async_gate);
    return e;
}

static void async_leave(tally__async *e) {
    if (--e->users == 0) pthread_cond_broadcast(&e->finished);
    pthread_mutex_unlock(&e->mu);
}

static void async_stop(tally__async *e, int abandon) {
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    e->aborted |= abandon;
    pthread_cond_broadcast(&e->posted);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    pthread_mutex_lock(&async_gate); /* whoever saw a request of ours not done has entered by now */
    pthread_mutex_unlock(&async_gate);
    pthread_mutex_lock(&e->mu);
    while (e->users) pthread_cond_wait(&e->finished, &e->mu);
    pthread_mutex_unlock(&e->mu);
    pthread_cond_destroy(&e->finished);
    pthread_cond_destroy(&e->posted);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static const tally__async_ops async_ops = {.pending = async_pending, .through = async_through, .stop = async_stop};

/* The communicator's engine, made (and its thread started) by the first non-blocking call. */
static int async_engine(tally_comm *c, tally__async **out) {
    tally__async_slot *slot = tally__comm_async(c);
    pthread_mutex_lock(&async_create_mu);
    tally__async *e = slot->e;
    int rc = 0;
    if (!e && !(e = calloc(1, sizeof *e))) rc = tally__seterr(TALLY_E_NOMEM, "tally: no memory for a request queue");
    if (!rc && !slot->e) {
        e->comm = c;
        pthread_mutex_init(&e->mu, NULL);
        pthread_cond_init(&e->posted, NULL);
        pthread_cond_init(&e->finished, NULL);
        int err = pthread_create(&e->th, NULL, async_thread, e);
        if (err) {
            pthread_cond_destroy(&e->finished);
            pthread_cond_destroy(&e->posted);
            pthread_mutex_destroy(&e->mu);
            free(e);
            rc = tally__seterr(TALLY_E_SYSTEM, "tally: cannot start the communication thread: %s", strerror(err));
        } else {
            slot->e = e;
            slot->ops = &async_ops;
        }
    }
    pthread_mutex_unlock(&async_create_mu);
    *out = rc ? NULL : e;
    return rc;
}

/* ---- the public calls ---- */

static int async_start(tally_comm *c, const tally__call *a, tally__async_fn op, void *ctx, tally_request **req,
                       const char *fn) {
    tally__clearerr();
    if (!req) return tally__seterr(TALLY_E_INVALID, "%s: req is NULL", fn);
    *req = NULL;
    if (!c) return tally__seterr(TALLY_E_INVALID, "%s: communicator is NULL", fn);
    int rc = tally__comm_foreign(c, fn); /* before the engine: a child would start a thread of its own */
    if (rc) return rc;
    tally__async *e;
    rc = async_engine(c, &e);
    return rc ? rc : async_post(e, a, op, ctx, req);
}

int tally__async_post_fn(tally_comm *c, tally__async_fn fn, void *ctx, tally_request **req) {
    if (!fn) return tally__seterr(TALLY_E_INVALID, "tally__async_post_fn: fn is NULL");
    return async_start(c, NULL, fn, ctx, req, "tally__async_post_fn");
}

int tally__async_post_call(tally_comm *c, const tally__call *a, tally_request **req) {
    return async_start(c, a, NULL, NULL, req, "tally__async_post_call");
}

void tally__request_cost(const tally_request *r, double *secs, unsigned long long *bytes) {
    int done = r && atomic_load_explicit(&r->done, memory_order_acquire);
    *secs = done ? r->secs : 0;
    *bytes = done ? r->bytes : 0;
}

TALLY_API int tally_iallreduce(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op,
                               tally_request **req) {
    tally__call a = {
        .coll = TALLY__ALLREDUCE, .send = send, .recv = recv, .count = count, .t = t, .op = op, .root = -1};
    return async_start(c, &a, NULL, NULL, req, "tally_iallreduce");
}

TALLY_API int tally_ireduce_scatter(tally_comm *c, const void *send, void *recv, size_t recvcount, tally_dtype t,
                                    tally_op op, tally_request **req) {
    tally__call a = {
        .coll = TALLY__REDUCE_SCATTER, .send = send, .recv = recv, .count = recvcount, .t = t, .op = op, .root = -1};
    return async_start(c, &a, NULL, NULL, req, "tally_ireduce_scatter");
}

TALLY_API int tally_iallgather(tally_comm *c, const void *send, void *recv, size_t sendcount, tally_dtype t,
                               tally_request **req) {
    tally__call a = {
        .coll = TALLY__ALLGATHER, .send = send, .recv = recv, .count = sendcount, .t = t, .op = TALLY_SUM, .root = -1};
    return async_start(c, &a, NULL, NULL, req, "tally_iallgather");
}

TALLY_API int tally_ibroadcast(tally_comm *c, void *buf, size_t count, tally_dtype t, int root, tally_request **req) {
    tally__call a = {
        .coll = TALLY__BROADCAST, .send = buf, .recv = buf, .count = count, .t = t, .op = TALLY_SUM, .root = root};
    return async_start(c, &a, NULL, NULL, req, "tally_ibroadcast");
}

TALLY_API int tally_ibarrier(tally_comm *c, tally_request **req) {
    tally__call a = {.coll = TALLY__BARRIER, .t = TALLY_U8, .op = TALLY_SUM, .root = -1};
    return async_start(c, &a, NULL, NULL, req, "tally_ibarrier");
}

static int async_result(const tally_request *r) {
    if (!r->rc) return 0;
    return tally__seterr(r->rc, "%s", r->msg);
}

/* ---- requests completed from outside the queue (point-to-point) ---- */

/* One lock and one condition for them all: they outlive every request, so the completer's last touch of
 * a request and a waiter's free of it cannot cross (a lock inside the request could be freed under its
 * own unlock). Waiters on point-to-point requests are few: one broadcast wakes them all. */
static pthread_mutex_t ext_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ext_cv = PTHREAD_COND_INITIALIZER;

int tally__request_external(tally_request **out) {
    tally_request *r = calloc(1, sizeof *r);
    if (!r) return tally__seterr(TALLY_E_NOMEM, "tally: no memory for a request");
    r->ext = 1;
    r->source = -1;
    r->state = REQ_RUNNING;
    tally__proc_stamp(&r->proc);
    *out = r;
    return 0;
}

void tally__request_complete(tally_request *r, int rc, const char *msg, int source) {
    pthread_mutex_lock(&ext_mu);
    r->rc = rc;
    snprintf(r->msg, sizeof r->msg, "%s", rc && msg ? msg : "");
    r->source = rc ? -1 : source;
    r->state = REQ_FINISHING;
    void (*fn)(void *, int, const char *) = r->fn;
    void *arg = r->arg;
    pthread_mutex_unlock(&ext_mu);
    if (fn) fn(arg, rc, r->msg); /* the request cannot go meanwhile: free only detaches it until done */
    pthread_mutex_lock(&ext_mu);
    r->state = REQ_DONE;
    if (r->detached)
        free(r);
    else
        atomic_store_explicit(&r->done, 1, memory_order_release);
    pthread_cond_broadcast(&ext_cv);
    pthread_mutex_unlock(&ext_mu);
}

void tally__request_progress(tally_request *r, int (*fn)(void *, _Atomic int *), void *arg) {
    r->progress = fn;
    r->progress_arg = arg;
}

static int ext_wait(tally_request *r) {
    if (r->progress && !atomic_load_explicit(&r->done, memory_order_acquire)) r->progress(r->progress_arg, &r->done);
    pthread_mutex_lock(&ext_mu);
    while (!atomic_load_explicit(&r->done, memory_order_acquire)) pthread_cond_wait(&ext_cv, &ext_mu);
    pthread_mutex_unlock(&ext_mu);
    return async_result(r);
}

/* 0 when fn was kept for the completer; 1 when the request is done (or finishing), so fn runs now. */
static int ext_on_done(tally_request *r, void (*fn)(void *, int, const char *), void *arg) {
    pthread_mutex_lock(&ext_mu);
    int later = r->state < REQ_FINISHING;
    if (later) {
        r->fn = fn;
        r->arg = arg;
    }
    pthread_mutex_unlock(&ext_mu);
    return !later;
}

/* 1 when the request is still pending: detached, its completer frees it. */
static int ext_detach(tally_request *r) {
    pthread_mutex_lock(&ext_mu);
    int pending = r->state != REQ_DONE;
    if (pending) r->detached = 1;
    pthread_mutex_unlock(&ext_mu);
    return pending;
}

TALLY_API int tally_request_source(const tally_request *r) {
    return r && atomic_load_explicit(&r->done, memory_order_acquire) ? r->source : -1;
}

TALLY_API int tally_wait(tally_request *r) {
    tally__clearerr();
    if (!r) return tally__seterr(TALLY_E_INVALID, "tally_wait: req is NULL");
    int foreign = tally__proc_foreign(&r->proc, "tally_wait", "request");
    if (foreign) return foreign;
    if (atomic_load_explicit(&r->done, memory_order_acquire)) return async_result(r);
    if (r->ext) return ext_wait(r);
    tally__async *e = async_enter_pending(r);
    if (!e) return async_result(r);
    /* What the thread has not started, the waiter runs: handing it over would only add two thread
     * switches (on a busy core a scheduling delay each) to a wait that has nothing else to do. */
    while (!atomic_load_explicit(&r->done, memory_order_acquire)) {
        if (e->head && !e->running)
            async_run_head(e);
        else
            pthread_cond_wait(&e->finished, &e->mu);
    }
    async_leave(e);
    return async_result(r);
}

TALLY_API int tally_test(tally_request *r, int *done) {
    tally__clearerr();
    if (!r || !done) return tally__seterr(TALLY_E_INVALID, "tally_test: %s is NULL", r ? "done" : "req");
    *done = 0;
    int foreign = tally__proc_foreign(&r->proc, "tally_test", "request");
    if (foreign) return foreign;
    *done = atomic_load_explicit(&r->done, memory_order_acquire);
    return *done ? async_result(r) : 0;
}

/* The longest wait tally_wait_for takes at once (a day): far past it a timespec would overflow. */
#define WAIT_FOR_MAX_S 86400.0
/* How long it watches the request (yielding the CPU) before it sleeps: a short call is done by then, and
 * the waiter is spared a wake-up. */
#define WAIT_FOR_SPIN_NS 20000

static struct timespec wait_for_until(double timeout_s) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now); /* pthread_cond_clockwait's: a wall-clock step moves no wait */
    double whole = (double)(long long)timeout_s;
    long ns = now.tv_nsec + (long)((timeout_s - whole) * 1e9);
    now.tv_sec += (time_t)whole + ns / 1000000000L;
    now.tv_nsec = ns % 1000000000L;
    return now;
}

TALLY_API int tally_wait_for(tally_request *r, double timeout_s, int *done) {
    tally__clearerr();
    if (!r || !done) return tally__seterr(TALLY_E_INVALID, "tally_wait_for: %s is NULL", r ? "done" : "req");
    *done = 0;
    if (!(timeout_s >= 0)) /* NaN too */
        return tally__seterr(TALLY_E_INVALID, "tally_wait_for: timeout %g s: it takes seconds >= 0", timeout_s);
    int foreign = tally__proc_foreign(&r->proc, "tally_wait_for", "request");
    if (foreign) return foreign;
    if (timeout_s > 0) {
        uint64_t spin = timeout_s * 1e9 < WAIT_FOR_SPIN_NS ? (uint64_t)(timeout_s * 1e9) : WAIT_FOR_SPIN_NS;
        for (uint64_t end = tally__now_ns() + spin;
             !atomic_load_explicit(&r->done, memory_order_acquire) && tally__now_ns() < end;)
            sched_yield();
    }
    if (!atomic_load_explicit(&r->done, memory_order_acquire) && timeout_s > 0) {
        struct timespec until = wait_for_until(timeout_s < WAIT_FOR_MAX_S ? timeout_s : WAIT_FOR_MAX_S);
        /* Never the request's run on this thread, as tally_wait may do: that would last as long as the
         * peers make it. The communication thread (or the post office's) runs it; this one only sleeps. */
        tally__async *e = NULL;
        if (r->ext)
            pthread_mutex_lock(&ext_mu);
        else
            e = async_enter_pending(r);
        pthread_mutex_t *mu = e ? &e->mu : &ext_mu;
        pthread_cond_t *cv = e ? &e->finished : &ext_cv;
        if (r->ext || e)
            while (!atomic_load_explicit(&r->done, memory_order_acquire))
                if (pthread_cond_clockwait(cv, mu, CLOCK_MONOTONIC, &until) == ETIMEDOUT) break;
        if (e)
            async_leave(e);
        else if (r->ext)
            pthread_mutex_unlock(mu);
    }
    *done = atomic_load_explicit(&r->done, memory_order_acquire);
    return *done ? async_result(r) : 0;
}

TALLY_API int tally_request_on_done(tally_request *r, void (*fn)(void *arg, int rc, const char *msg), void *arg) {
    tally__clearerr();
    if (!r || !fn) return tally__seterr(TALLY_E_INVALID, "tally_request_on_done: %s is NULL", r ? "fn" : "req");
    int foreign = tally__proc_foreign(&r->proc, "tally_request_on_done", "request");
    if (foreign) return foreign;
    if (r->ext && !ext_on_done(r, fn, arg)) return 0;
    tally__async *e = r->ext ? NULL : async_enter_pending(r);
    if (e) {
        int later = r->state < REQ_FINISHING;
        if (later) {
            r->fn = fn;
            r->arg = arg;
        }
        async_leave(e);
        if (later) return 0;
    }
    fn(arg, r->rc, r->msg); /* already done (or finishing without a callback): now, on this thread */
    return 0;
}

TALLY_API int tally_request_free(tally_request *r) {
    if (!r) return 0;
    int foreign = tally__proc_foreign(&r->proc, "tally_request_free", "request");
    if (foreign) return foreign; /* the parent's engine may hold its lock forever here: left alone */
    if (r->ext && ext_detach(r)) return 0;
    tally__async *e = r->ext ? NULL : async_enter_pending(r);
    if (e) {
        int pending = r->state != REQ_DONE;
        if (pending) r->detached = 1; /* as MPI_Request_free: it completes, then goes */
        async_leave(e);
        if (pending) return 0;
    }
    free(r);
    return 0;
}
