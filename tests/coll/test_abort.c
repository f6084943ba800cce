/* test_abort.c - tally_comm_abort while a collective blocks (shm, tcp): the call returns ABORTED, abort takes
 * under 1 s and frees everything, the peers fail naming the aborting rank, and a new communicator works. */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define N         3
#define TIMEOUT_S 20.0 /* far above every bound checked here: an error seen is never a timeout */

enum { SC_SILENT, SC_STREAM, SC_HUB, SC_IDLE, SC_COUNT };
static const char *sc_name[] = {"blocked on a silent peer", "during a large allreduce", "by rank 0, the relay",
                                "with no call in flight"};

typedef struct {
    int scenario, aborter, silent, port2;
    int code[N]; /* the failing call's result (the aborter's: its blocked call) */
    char msg[N][500];
    double abort_s; /* how long tally_comm_abort took */
    int abort_rc;
    double abort_at;     /* CLOCK_MONOTONIC when abort was called */
    _Atomic int entered; /* ranks that started the big allreduce (SC_STREAM) */
    double fail_at[N];   /* when each rank's failing call returned */
    int fds_before[N], fds_aborted, fds_after[N], thr_before[N], thr_aborted, thr_after[N];
    int reinit_rc[N], reinit_ok[N];
    char reinit_msg[N][300];
} shared_t;

static shared_t *S;
static size_t big_count;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

typedef struct {
    tally_comm *c;
    double delay;
} aborter_arg;

/* Waits until every rank is in the big allreduce (SC_STREAM) or `delay`, then aborts. A call must not
 * start once abort was called (it may find the communicator freed): the aborting rank makes one. */
static void *aborter(void *p) {
    aborter_arg *a = p;
    double t0 = th_now();
    if (S->scenario == SC_STREAM)
        while (atomic_load(&S->entered) < N && th_now() - t0 < 30) sleep_s(0.001);
    sleep_s(a->delay);
    S->abort_at = th_now();
    S->abort_rc = tally_comm_abort(a->c);
    S->abort_s = th_now() - S->abort_at;
    return NULL;
}

/* Returns once the aborter has called tally_comm_abort (10 s at most), and a moment more. */
static void after_abort(void) {
    th_wait_set(&S->abort_at, 10);
    sleep_s(0.05);
}

/* After the abort: a new communicator at a new address, and one allreduce checked against the sum. */
static void reinit(int rank, int n) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", S->port2);
    setenv("TALLY_ADDR", addr, 1);
    tally_comm *c = NULL;
    int rc = tally_comm_init(&c);
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)(rank + 1) * (float)i;
    if (!rc) rc = tally_allreduce(c, x, x, 1000, TALLY_F32, TALLY_SUM);
    int ok = !rc;
    for (int i = 0; i < 1000 && ok; i++) ok = x[i] == (float)(n * (n + 1) / 2) * (float)i;
    S->reinit_rc[rank] = rc;
    S->reinit_ok[rank] = ok;
    snprintf(S->reinit_msg[rank], sizeof S->reinit_msg[rank], "%s", rc ? tally_last_error() : "");
    if (c) tally_comm_free(c);
}

static int abort_rank(int rank, int n, void *arg) {
    S->fds_before[rank] = th_count_fds();
    S->thr_before[rank] = th_count_threads();
    tally_comm *c;
    if (tally_comm_init(&c)) {
        snprintf(S->msg[rank], sizeof S->msg[rank], "init: %s", tally_last_error());
        return 1;
    }
    int stream = S->scenario == SC_STREAM;
    size_t count = stream ? big_count : 1000;
    float *buf = malloc(count * sizeof *buf);
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    int rc = tally_allreduce(c, buf, buf, 1000, TALLY_F32, TALLY_SUM); /* everyone is up */
    if (rank == S->aborter) {
        pthread_t th;
        aborter_arg a = {c, stream ? 0.01 : 0.3};
        if (S->scenario == SC_IDLE) {
            aborter(&a); /* from this thread, between calls */
            rc = TALLY_E_ABORTED;
        } else {
            pthread_create(&th, NULL, aborter, &a);
            atomic_fetch_add(&S->entered, 1);
            rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
            pthread_join(th, NULL);
        }
        S->fail_at[rank] = th_now();
        snprintf(S->msg[rank], sizeof S->msg[rank], "%s", rc ? tally_last_error() : "");
        S->fds_aborted = th_count_fds();
        S->thr_aborted = th_count_threads();
    } else {
        if (rank == S->silent || S->scenario == SC_IDLE) after_abort(); /* called only after the abort */
        atomic_fetch_add(&S->entered, 1);
        rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
        if (!rc) rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM); /* the big one finished first */
        S->fail_at[rank] = th_now();
        snprintf(S->msg[rank], sizeof S->msg[rank], "%s", rc ? tally_last_error() : "");
        tally_comm_free(c);
    }
    S->code[rank] = rc;
    free(buf);
    reinit(rank, n);
    S->fds_after[rank] = th_count_fds();
    S->thr_after[rank] = th_count_threads_after(S->thr_before[rank]);
    return 0;
}

static void scenario(const char *transport, int sc) {
    memset(S, 0, sizeof *S);
    S->scenario = sc;
    S->aborter = sc == SC_HUB ? 0 : 1;
    S->silent = sc == SC_STREAM || sc == SC_IDLE ? -1 : 2;
    S->port2 = th_free_port();
    char what[128];
    snprintf(what, sizeof what, "%s abort %s", transport, sc_name[sc]);
    th_opts o = {.transport = transport, .timeout_s = TIMEOUT_S, .wall_s = 60};
    th_job job;
    double t0 = th_now();
    if (th_start(&job, N, &o, abort_rank, NULL)) {
        TH_CHECK(0, "%s: fork failed", what);
        return;
    }
    int bad = th_wait(&job, 60);
    TH_CHECK(bad == 0, "%s: %d rank(s) failed or hung", what, bad);
    int a = S->aborter;
    TH_CHECK(S->abort_rc == 0, "%s: tally_comm_abort returned %d", what, S->abort_rc);
    TH_CHECK(S->abort_s < 1.0, "%s: tally_comm_abort took %.3f s", what, S->abort_s);
    /* The big allreduce may (rarely) complete before the abort: it keeps its result. The blocked calls
     * of the other scenarios must return ABORTED. */
    int between = sc == SC_STREAM && S->code[a] == 0;
    if (between) printf("  %s: the allreduce completed before the abort\n", what);
    TH_CHECK(S->code[a] == TALLY_E_ABORTED || between, "%s: the aborting rank's call got %s (%s), want ABORTED", what,
             tally_strerror(S->code[a]), S->msg[a]);
    TH_CHECK(S->fds_aborted == S->fds_before[a] && S->thr_aborted == S->thr_before[a],
             "%s: after abort rank %d has %d fds and %d threads, %d and %d before init", what, a, S->fds_aborted,
             S->thr_aborted, S->fds_before[a], S->thr_before[a]);
    for (int r = 0; r < N; r++) {
        if (r != a) {
            /* The report of the abort normally arrives first; a peer that saw the connection drop
             * before it (rank 0 busy relaying) names the rank just the same. */
            TH_CHECK(S->code[r] == TALLY_E_ABORTED || S->code[r] == TALLY_E_PEER_LOST,
                     "%s: rank %d got %s (%s), want ABORTED", what, r, tally_strerror(S->code[r]), S->msg[r]);
            TH_CHECK(th_first_rank_named(S->msg[r]) == a, "%s: rank %d's message does not name rank %d first: %s", what,
                     r, a, S->msg[r]);
            double late = S->fail_at[r] - S->abort_at;
            TH_CHECK(S->abort_at > 0 && late < 3.0, "%s: rank %d failed %.2f s after the abort", what, r, late);
        }
        TH_CHECK(S->reinit_rc[r] == 0 && S->reinit_ok[r], "%s: rank %d's new communicator: %s (%s)%s", what, r,
                 tally_strerror(S->reinit_rc[r]), S->reinit_msg[r], S->reinit_ok[r] ? "" : ", wrong sum");
        TH_CHECK(S->fds_after[r] == S->fds_before[r] && S->thr_after[r] == S->thr_before[r],
                 "%s: rank %d ends with %d fds and %d threads, %d and %d at the start", what, r, S->fds_after[r],
                 S->thr_after[r], S->fds_before[r], S->thr_before[r]);
    }
    printf("  %s (%.1f s): abort took %.3f s; rank %d: %s\n", what, th_now() - t0, S->abort_s, (a + 1) % N,
           S->msg[(a + 1) % N]);
    fflush(stdout);
}

int main(void) {
    S = th_shared_alloc(sizeof *S);
    big_count = (th_light() ? 8u << 20 : 64u << 20) / sizeof(float);
    const char *transports[] = {"shm", "tcp"};
    for (int i = 0; i < 2; i++) /* the quick tier: every scenario over shm, the stream over tcp */
        for (int sc = 0; sc < SC_COUNT; sc++)
            if (i == 0 || sc == SC_STREAM ? th_quick() : th_long()) scenario(transports[i], sc);
    TH_CHECK(tally_comm_abort(NULL) == 0, "tally_comm_abort(NULL) is not a no-op");
    return th_verdict("test_abort");
}
