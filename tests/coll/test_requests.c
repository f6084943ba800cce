/* test_requests.c - non-blocking collectives (tally_iallreduce ... tally_wait): results against a reference
 * at every size class, order kept with blocking calls between, callbacks, errors through the request,
 * free completing pending requests, abort failing them, a dead peer named; the library's own operations
 * (tally__async_post_fn) under the same rules. Over shm and tcp. */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <unistd.h>

#include "coll/async.h"
#include "core/err.h"
#include "harness.h"

typedef struct result {
    int bad, rc, cb_calls, cb_rc;
    char msg[600];
} result;

static result *R;

static float val(int rank, size_t i) { return (float)((rank + 1) * 3 + (int)(i % 11)); }

static void fill(float *v, size_t n, int rank) {
    for (size_t i = 0; i < n; i++) v[i] = val(rank, i);
}

static float sum_of(int n, size_t i) {
    float s = 0;
    for (int r = 0; r < n; r++) s += val(r, i);
    return s;
}

static void on_done(void *arg, int rc, const char *msg) {
    result *r = arg;
    r->cb_calls++;
    r->cb_rc = rc;
}

static void note(result *res, int rc, const char *what) {
    if (!rc) return;
    if (!res->rc) {
        res->rc = rc;
        snprintf(res->msg, sizeof res->msg, "%s: %s", what, tally_last_error());
    }
    res->bad++;
}

/* Several requests in flight at once, waited for out of order, with a blocking call queued behind them. */
static int fn_ops(int rank, int n, void *arg) {
    result *res = &R[rank];
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return note(res, rc, "init"), 0;
    static const size_t sizes[] = {0, 1, 7, 1001, 1 << 18};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    float *in[NS], *out[NS];
    tally_request *req[NS];
    for (int k = 0; k < NS; k++) {
        size_t m = sizes[k] ? sizes[k] : 1;
        in[k] = malloc(m * sizeof(float));
        out[k] = malloc(m * sizeof(float));
        fill(in[k], sizes[k], rank);
        note(res, tally_iallreduce(c, in[k], out[k], sizes[k], TALLY_F32, TALLY_SUM, &req[k]), "iallreduce");
    }
    note(res, tally_request_on_done(req[NS - 1], on_done, res), "on_done");
    /* A blocking call now runs after the five: the same sequence on every rank. */
    float one = (float)rank;
    note(res, tally_allreduce(c, &one, &one, 1, TALLY_F32, TALLY_MAX), "blocking allreduce behind requests");
    if (one != (float)(n - 1)) res->bad++;
    for (int k = NS - 1; k >= 0; k--) {
        note(res, tally_wait(req[k]), "wait");
        for (size_t i = 0; i < sizes[k]; i++)
            if (out[k][i] != sum_of(n, i)) {
                res->bad++;
                break;
            }
        tally_request_free(req[k]);
    }
    if (res->cb_calls != 1 || res->cb_rc != 0) res->bad++;
    /* The other collectives, posted together. */
    size_t m = 1003;
    float *rs_in = malloc(m * n * sizeof(float)), rs_out[1003], *ag = malloc(m * n * sizeof(float)), bc[1003];
    fill(rs_in, m * n, rank);
    for (size_t i = 0; i < m; i++) bc[i] = rank == n - 1 ? (float)i : -1.0f;
    tally_request *rq[4];
    note(res, tally_ireduce_scatter(c, rs_in, rs_out, m, TALLY_F32, TALLY_SUM, &rq[0]), "ireduce_scatter");
    note(res, tally_iallgather(c, rs_in, ag, m, TALLY_F32, &rq[1]), "iallgather");
    note(res, tally_ibroadcast(c, bc, m, TALLY_F32, n - 1, &rq[2]), "ibroadcast");
    note(res, tally_ibarrier(c, &rq[3]), "ibarrier");
    for (int k = 0; k < 4; k++) {
        int done = 0;
        while (!done) note(res, tally_test(rq[k], &done), "test");
        tally_request_free(rq[k]);
    }
    for (size_t i = 0; i < m; i++) {
        if (rs_out[i] != sum_of(n, (size_t)rank * m + i)) res->bad++;
        if (bc[i] != (float)i) res->bad++;
    }
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < m; i++)
            if (ag[(size_t)r * m + i] != val(r, i)) res->bad++;
    /* A request freed while pending still runs, and calls its callback (checked once the comm is freed). */
    tally_request *gone;
    float dv[3] = {1, 2, 3};
    note(res, tally_iallreduce(c, dv, dv, 3, TALLY_F32, TALLY_SUM, &gone), "iallreduce");
    note(res, tally_request_on_done(gone, on_done, res), "on_done");
    tally_request_free(gone);
    note(res, tally_barrier(c), "barrier behind a freed request");
    if (dv[2] != 3.0f * (float)n) res->bad++;
    /* An error is the request's: an invalid dtype, on every rank alike. */
    tally_request *bad;
    note(res, tally_iallreduce(c, in[1], out[1], 1, (tally_dtype)99, TALLY_SUM, &bad), "post");
    int brc = tally_wait(bad);
    if (brc != TALLY_E_INVALID || !strstr(tally_last_error(), "dtype")) res->bad++;
    tally_request_free(bad);
    /* Free completes what is still pending; the request outlives the communicator. */
    tally_request *last;
    note(res, tally_iallreduce(c, in[4], out[4], sizes[4], TALLY_F32, TALLY_MAX, &last), "iallreduce");
    tally_comm_free(c);
    if (res->cb_calls != 2) res->bad++;
    int done = 0;
    if (tally_test(last, &done) || !done || out[4][5] != val(n - 1, 5)) res->bad++;
    tally_request_free(last);
    for (int k = 0; k < NS; k++) free(in[k]), free(out[k]);
    free(rs_in);
    free(ag);
    return 0;
}

/* The last rank dies while requests are pending on the others: each fails, naming it, within seconds. */
static int fn_death(int rank, int n, void *arg) {
    result *res = &R[rank];
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return note(res, rc, "init"), 0;
    size_t m = 1 << 16;
    float *v = calloc(m, sizeof *v);
    note(res, tally_allreduce(c, v, v, m, TALLY_F32, TALLY_SUM), "first");
    if (rank == n - 1) _exit(0);
    tally_request *req[3];
    for (int k = 0; k < 3; k++) tally_iallreduce(c, v, v, m, TALLY_F32, TALLY_SUM, &req[k]);
    note(res, tally_request_on_done(req[2], on_done, res), "on_done");
    int first = 0;
    for (int k = 0; k < 3; k++) {
        int rk = tally_wait(req[k]);
        if (rk && !first) {
            first = rk;
            snprintf(res->msg, sizeof res->msg, "%s", tally_last_error());
        }
        tally_request_free(req[k]);
    }
    res->rc = first;
    tally_comm_abort(c);
    free(v);
    return 0;
}

/* Abort with requests queued: every one ends with an error, none hangs. */
static int fn_abort(int rank, int n, void *arg) {
    result *res = &R[rank];
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return note(res, rc, "init"), 0;
    size_t m = 1 << 16;
    float *v = calloc(m, sizeof *v);
    tally_request *req[8];
    int posted = 0;
    if (rank == 0) {
        for (; posted < 8; posted++) tally_iallreduce(c, v, v, m, TALLY_F32, TALLY_SUM, &req[posted]);
        tally_comm_abort(c); /* at once: the first may be running, the rest are queued */
        for (int k = 0; k < posted; k++) {
            int done = 0;
            tally_test(req[k], &done);
            if (!done) res->bad++;
            res->cb_calls += tally_wait(req[k]) != 0;
            tally_request_free(req[k]);
        }
    } else {
        int rk = 0;
        for (int k = 0; k < 50 && !rk; k++) rk = tally_allreduce(c, v, v, m, TALLY_F32, TALLY_SUM);
        res->rc = rk;
        if (rk) snprintf(res->msg, sizeof res->msg, "%s", tally_last_error());
        tally_comm_abort(c);
    }
    free(v);
    return 0;
}

/* Abort from another thread while this one waits on a request: the wait ends with an error, no hang. */
typedef struct waiter {
    tally_request *req;
    int rc;
} waiter;

static void *wait_thread(void *arg) {
    waiter *w = arg;
    w->rc = tally_wait(w->req);
    return NULL;
}

static int fn_abort_waiting(int rank, int n, void *arg) {
    result *res = &R[rank];
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return note(res, rc, "init"), 0;
    float v[64] = {0};
    if (rank == 1) { /* late: rank 0's request waits for it */
        usleep(1500000);
        res->rc = tally_allreduce(c, v, v, 64, TALLY_F32, TALLY_SUM);
        tally_comm_abort(c);
        return 0;
    }
    waiter w = {NULL, 0};
    note(res, tally_iallreduce(c, v, v, 64, TALLY_F32, TALLY_SUM, &w.req), "iallreduce");
    pthread_t th;
    pthread_create(&th, NULL, wait_thread, &w);
    usleep(200000);
    double t0 = th_now();
    tally_comm_abort(c);
    pthread_join(th, NULL);
    res->cb_rc = w.rc;
    if (w.rc != TALLY_E_ABORTED || th_now() - t0 > 2) res->bad++;
    tally_request_free(w.req);
    return 0;
}

/* ---- the library's own operations, in order with the collectives ---- */

typedef struct own_op {
    tally_comm *c;
    float *v;
    int ran, fail, hold; /* hold: spin until released (the next ones stay queued meanwhile) */
    _Atomic int started, release;
} own_op;

/* Doubles v[0..3) between the collectives around it, then adds it over the ranks with a blocking call
 * (which runs inside this operation, not behind it). */
static int own_double(void *arg) {
    own_op *o = arg;
    atomic_store(&o->started, 1);
    while (o->hold && !atomic_load(&o->release)) usleep(1000);
    o->ran++;
    if (o->fail) return tally__seterr(TALLY_E_INVALID, "own operation failed on purpose");
    for (int i = 0; i < 3; i++) o->v[i] *= 2;
    return o->c ? tally_allreduce(o->c, o->v, o->v, 3, TALLY_F32, TALLY_SUM) : 0;
}

static int fn_own(int rank, int n, void *arg) {
    result *res = &R[rank];
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return note(res, rc, "init"), 0;
    float v[3] = {1, 2, 3};
    tally_request *req[4];
    own_op dbl = {.c = c, .v = v}, bad = {.fail = 1};
    note(res, tally_iallreduce(c, v, v, 3, TALLY_F32, TALLY_SUM, &req[0]), "iallreduce");
    note(res, tally__async_post_fn(c, own_double, &dbl, &req[1]), "post_fn");
    note(res, tally__async_post_fn(c, own_double, &bad, &req[2]), "post_fn failing");
    note(res, tally_iallreduce(c, v, v, 3, TALLY_F32, TALLY_SUM, &req[3]), "iallreduce");
    /* The last one waited for first: this waiter runs what the thread has not started, in order. */
    note(res, tally_wait(req[3]), "wait last");
    float want = (float)n * (float)n * 2 * (float)n; /* v[0] = 1: summed, doubled, summed, summed */
    if (v[0] != want || dbl.ran != 1) res->bad++;
    if (tally_wait(req[2]) != TALLY_E_INVALID || !strstr(tally_last_error(), "on purpose")) res->bad++;
    if (tally_wait(req[1]) || tally_wait(req[0])) res->bad++; /* the error stayed its request's */
    double secs;
    unsigned long long bytes;
    tally__request_cost(req[1], &secs, &bytes);
    if (secs < 0 || (n > 1 && bytes == 0)) res->bad++;
    for (int k = 0; k < 4; k++) tally_request_free(req[k]);
    /* Free completes a pending one. */
    own_op last = {.c = c, .v = v};
    tally_request *r;
    note(res, tally__async_post_fn(c, own_double, &last, &r), "post_fn before free");
    tally_comm_free(c);
    int done = 0;
    if (tally_test(r, &done) || !done || last.ran != 1) res->bad++;
    tally_request_free(r);
    return 0;
}

static void *abort_thread(void *c) {
    tally_comm_abort(c);
    return NULL;
}

/* Abort while one operation runs: the one queued behind it fails unrun. */
static int fn_own_abort(int rank, int n, void *arg) {
    result *res = &R[rank];
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return note(res, rc, "init"), 0;
    float v[3] = {1, 2, 3};
    own_op first = {.v = v, .hold = 1}, second = {.v = v};
    tally_request *a, *b;
    note(res, tally__async_post_fn(c, own_double, &first, &a), "post_fn");
    note(res, tally__async_post_fn(c, own_double, &second, &b), "post_fn");
    while (!atomic_load(&first.started)) usleep(1000);
    pthread_t th;
    pthread_create(&th, NULL, abort_thread, c);
    usleep(100000);
    atomic_store(&first.release, 1);
    pthread_join(th, NULL);
    if (tally_wait(a) || first.ran != 1) res->bad++;
    if (tally_wait(b) != TALLY_E_ABORTED || second.ran) res->bad++;
    tally_request_free(a);
    tally_request_free(b);
    return 0;
}

/* The communicator freed while another thread waits on its last request: the engine goes as the wait
 * begins (a wait that saw the request pending once locked the freed engine). Many rounds, to land in the
 * gap; the sanitizer builds see a use after free there. */
typedef struct racer {
    tally_request *req;
    int rc, how;
} racer;

static void *race_wait(void *arg) {
    racer *w = arg;
    int done = 0;
    if (w->how == 0) w->rc = tally_wait(w->req);
    if (w->how == 1)
        while (!done && !w->rc) w->rc = tally_wait_for(w->req, 0.001, &done);
    if (w->how == 2) w->rc = tally_request_on_done(w->req, on_done, &R[0]);
    return NULL;
}

static int fn_free_racing_waiters(int rank, int n, void *arg) {
    (void)n, (void)arg;
    result *res = &R[rank];
    for (int round = 0; round < 400; round++) {
        tally_comm *c;
        int rc = tally_comm_init(&c);
        if (rc) return note(res, rc, "init"), 0;
        float v[3] = {1, 2, 3};
        own_op op = {.v = v};
        tally_request *req;
        note(res, tally__async_post_fn(c, own_double, &op, &req), "post_fn");
        racer w[3];
        pthread_t th[3];
        for (int k = 0; k < 3; k++) {
            w[k] = (racer){.req = req, .how = k};
            pthread_create(&th[k], NULL, race_wait, &w[k]);
        }
        tally_comm_free(c);
        for (int k = 0; k < 3; k++) {
            pthread_join(th[k], NULL);
            if (w[k].rc) res->bad++;
        }
        if (op.ran != 1 || tally_request_free(req)) res->bad++;
    }
    return 0;
}

/* Each case takes well under a second; a case still running after CASE_WALL_S is a hang, which the
 * harness then reports (the rank, killed) while ctest's 15 s for the whole test have not run out. */
#define CASE_WALL_S 10

/* Says which case starts, unbuffered: a test killed from outside still shows where it was. */
static void phase(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void phase(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("  ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void run_ops(const char *transport, int n) {
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    phase("collectives over %s, n=%d", transport, n);
    th_opts o = {.transport = transport, .wall_s = CASE_WALL_S};
    TH_CHECK(th_run(n, &o, fn_ops, NULL) == 0, "%s n=%d: a rank failed", transport, n);
    for (int r = 0; r < n; r++)
        TH_CHECK(R[r].bad == 0, "%s n=%d rank %d: %d wrong (%d '%s')", transport, n, r, R[r].bad, R[r].rc, R[r].msg);
}

int main(void) {
    R = th_shared_alloc(sizeof *R * TH_MAX_RANKS);
    run_ops("shm", 1);
    run_ops("shm", 2);
    run_ops("shm", 3);
    run_ops("tcp", 3);
    for (int n = 1; n <= 3; n++) {
        memset(R, 0, sizeof *R * TH_MAX_RANKS);
        phase("the library's own operations in order, n=%d", n);
        th_opts own = {.transport = "shm", .wall_s = CASE_WALL_S};
        TH_CHECK(th_run(n, &own, fn_own, NULL) == 0, "own operations n=%d: a rank failed", n);
        for (int r = 0; r < n; r++)
            TH_CHECK(R[r].bad == 0, "own operations n=%d rank %d: %d wrong (%d '%s')", n, r, R[r].bad, R[r].rc,
                     R[r].msg);
    }
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    phase("the communicator freed under waiting threads");
    th_opts racing = {.transport = "shm", .wall_s = CASE_WALL_S};
    TH_CHECK(th_run(1, &racing, fn_free_racing_waiters, NULL) == 0 && R[0].bad == 0,
             "communicator freed under waiting threads: %d wrong (%d '%s')", R[0].bad, R[0].rc, R[0].msg);

    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    phase("abort with an own operation running");
    th_opts one = {.transport = "shm", .wall_s = CASE_WALL_S};
    TH_CHECK(th_run(1, &one, fn_own_abort, NULL) == 0 && R[0].bad == 0,
             "abort with an own operation running and one queued: %d wrong", R[0].bad);

    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    phase("a rank dies with requests pending");
    th_opts o = {.transport = "shm", .wall_s = CASE_WALL_S, .timeout_s = 30};
    th_run(3, &o, fn_death, NULL);
    for (int r = 0; r < 2; r++)
        TH_CHECK(R[r].rc == TALLY_E_PEER_LOST && strstr(R[r].msg, "rank 2") && R[r].cb_calls == 1 && R[r].cb_rc != 0,
                 "rank 2 died: rank %d got %d '%s' (callbacks %d, rc %d)", r, R[r].rc, R[r].msg, R[r].cb_calls,
                 R[r].cb_rc);
    phase("rank 2 died: rank 0 got '%s'", R[0].msg);

    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    phase("abort with requests queued, tcp");
    th_opts ot = {.transport = "tcp", .wall_s = CASE_WALL_S, .timeout_s = 30};
    th_run(2, &ot, fn_abort, NULL);
    TH_CHECK(R[0].bad == 0 && R[0].cb_calls >= 1, "abort with 8 requests queued: %d not done, %d failed", R[0].bad,
             R[0].cb_calls);
    TH_CHECK(R[1].rc == TALLY_E_ABORTED || R[1].rc == TALLY_E_PEER_LOST, "rank 0 aborted: rank 1 got %d '%s'", R[1].rc,
             R[1].msg);

    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    phase("abort while another thread waits");
    th_run(2, &o, fn_abort_waiting, NULL);
    TH_CHECK(R[0].bad == 0, "abort while another thread waits: the wait returned %d", R[0].cb_rc);
    return th_verdict("test_requests");
}
