/* test_lifetime.c - what belongs to whom, and for how long: a communicator, a pending request and a buffer
 * used by a forked child (TALLY_E_INVALID at once, naming both processes, and the parent's communicator
 * untouched: both ranks' children try together, as two forked children on shm could otherwise meet);
 * buffers kept past their communicator (tally_mem_keep, tally_mem_release); a bounded wait
 * (tally_wait_for) that returns on time while a peer keeps the request waiting. Over shm and tcp. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <tally.h>
#include <unistd.h>

#include "harness.h"

typedef struct result {
    int bad, rc, child_status;
    char msg[600];
} result;

static result *R;

/* A check inside a rank (or its child): counted, the first failure's words kept. */
#define EXPECT(res, cond, ...)                                                                                         \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            if (!(res)->bad) snprintf((res)->msg, sizeof(res)->msg, __VA_ARGS__);                                      \
            (res)->bad++;                                                                                              \
        }                                                                                                              \
    } while (0)

/* The call failed as a forked child's must: TALLY_E_INVALID, naming the parent and this process. */
static int refused(int rc, int parent) {
    char want[64];
    snprintf(want, sizeof want, "made in process %d, used in process %d", parent, (int)getpid());
    return rc == TALLY_E_INVALID && strstr(tally_last_error(), want) && strstr(tally_last_error(), "forked child");
}

/* In the child: every call on the parent's communicator, request and buffer is refused at once. */
static int child_calls(tally_comm *c, tally_request *pending, void *buf, int parent) {
    result mine = {0}, *res = &mine;
    double t0 = th_now();
    float x = 1;
    EXPECT(res, refused(tally_allreduce(c, &x, &x, 1, TALLY_F32, TALLY_SUM), parent), "allreduce: '%s'",
           tally_last_error());
    EXPECT(res, refused(tally_barrier(c), parent), "barrier: '%s'", tally_last_error());
    EXPECT(res, refused(tally_reduce(c, &x, &x, 1, TALLY_F32, TALLY_SUM, 0), parent), "reduce: '%s'",
           tally_last_error());
    tally_request *r = (tally_request *)&r;
    EXPECT(res, refused(tally_iallreduce(c, &x, &x, 1, TALLY_F32, TALLY_SUM, &r), parent) && !r, "iallreduce: '%s'",
           tally_last_error());
    EXPECT(res, refused(tally_send(c, &x, 1, TALLY_F32, 0, 3), parent), "send: '%s'", tally_last_error());
    EXPECT(res, refused(tally_irecv(c, &x, 1, TALLY_F32, 0, 3, &r), parent), "irecv: '%s'", tally_last_error());
    int done = 7;
    EXPECT(res, refused(tally_wait(pending), parent), "wait: '%s'", tally_last_error());
    EXPECT(res, refused(tally_test(pending, &done), parent) && done == 0, "test: '%s'", tally_last_error());
    EXPECT(res, refused(tally_wait_for(pending, 1.0, &done), parent) && done == 0, "wait_for: '%s'",
           tally_last_error());
    EXPECT(res, refused(tally_request_free(pending), parent), "request_free: '%s'", tally_last_error());
    EXPECT(res, tally_mem_alloc(c, 64) == NULL && refused(TALLY_E_INVALID, parent), "mem_alloc: '%s'",
           tally_last_error());
    EXPECT(res, refused(tally_mem_free(c, buf), parent), "mem_free: '%s'", tally_last_error());
    tally_comm *sub = NULL;
    EXPECT(res, refused(tally_comm_split(c, 0, 0, &sub), parent) && !sub, "split: '%s'", tally_last_error());
    EXPECT(res, refused(tally_comm_abort(c), parent), "abort: '%s'", tally_last_error());
    EXPECT(res, refused(tally_comm_free(c), parent), "free: '%s'", tally_last_error());
    EXPECT(res, tally_comm_size(c) == 2, "size: %d", tally_comm_size(c));
    EXPECT(res, th_now() - t0 < 1.0, "the refusals took %.2f s", th_now() - t0);
    if (res->bad) fprintf(stderr, "child of pid %d: %d wrong, first: %s\n", parent, res->bad, res->msg);
    return res->bad ? 1 : 0;
}

/* The world communicator, or NULL with the failure noted in res. */
static tally_comm *init_comm(result *res) {
    tally_comm *c = NULL;
    int ok = tally_comm_init(&c) == 0;
    EXPECT(res, ok, "init: %s", tally_last_error());
    return ok ? c : NULL;
}

/* Each rank forks a child while a receive is pending; the children use what they inherited (and exit
 * through exit(), its handlers run); the parents then go on as if nothing happened. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static int fn_fork(int rank, int n, void *arg) {
    (void)arg;
    result *res = &R[rank];
    tally_comm *c = init_comm(res);
    if (!c) return 0;
    float v = (float)rank + 1, got = -1;
    EXPECT(res, !tally_allreduce(c, &v, &v, 1, TALLY_F32, TALLY_SUM) && v == 3.0f, "first allreduce");
    tally_request *pending = NULL;
    EXPECT(res, !tally_irecv(c, &got, 1, TALLY_F32, 1 - rank, 5, &pending), "irecv: %s", tally_last_error());
    float *buf = tally_mem_alloc(c, 1024 * sizeof(float));
    EXPECT(res, buf != NULL, "mem_alloc: %s", tally_last_error());
    EXPECT(res, !tally_barrier(c), "barrier before fork");
    fflush(NULL);
    pid_t kid = fork();
    if (kid == 0) {
        int code = child_calls(c, pending, buf, (int)getppid());
        /* Under the sanitizers the child skips exit()'s handlers: LeakSanitizer's exit-time check in a
         * forked child of a threaded process once hung there for good (CI, 1 run in 3), and under
         * ThreadSanitizer OpenSSL's cleanup at exit waited for the runtime's allocator lock, which another
         * thread held at the fork (1 run in 3 on the 2-core VM). */
        if (th_light() || SANITIZED) fflush(NULL), _exit(code);
        exit(code);
    }
    int st = 0;
    waitpid(kid, &st, 0);
    res->child_status = st;
    EXPECT(res, WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed (status %d)", st);
    /* The parent's communicator, its pending receive and its buffer are as they were. */
    float mine = 10.0f * (float)(rank + 1);
    EXPECT(res, !tally_send(c, &mine, 1, TALLY_F32, 1 - rank, 5), "send: %s", tally_last_error());
    EXPECT(res, !tally_wait(pending) && got == 10.0f * (float)(2 - rank), "the pending receive: %s got %g",
           tally_last_error(), got);
    tally_request_free(pending);
    for (int i = 0; buf && i < 1024; i++) buf[i] = (float)(i + rank);
    EXPECT(res, buf && !tally_allreduce(c, buf, buf, 1024, TALLY_F32, TALLY_SUM), "allreduce: %s", tally_last_error());
    for (int i = 0; buf && i < 1024; i++)
        if (buf[i] != (float)(2 * i + 1)) {
            EXPECT(res, 0, "buf[%d] = %g after the allreduce", i, buf[i]);
            break;
        }
    tally_request *r;
    v = 1;
    EXPECT(res, !tally_iallreduce(c, &v, &v, 1, TALLY_F32, TALLY_SUM, &r) && !tally_wait(r) && v == 2.0f,
           "iallreduce after the fork: %s", tally_last_error());
    tally_request_free(r);
    EXPECT(res, !tally_mem_free(c, buf), "mem_free");
    EXPECT(res, !tally_comm_free(c), "free: %s", tally_last_error());
    return 0;
}

/* tally_mem_keep: a kept buffer outlives its communicator (free, or abort) with its data, until
 * tally_mem_release; a buffer not kept goes with the communicator, and releasing it is refused. */
static int fn_keep(int rank, int n, void *arg) {
    int abort_it = *(int *)arg;
    result *res = &R[rank];
    tally_comm *c = init_comm(res);
    if (!c) return 0;
    size_t m = 1 << 16;
    float *kept = tally_mem_alloc(c, m * sizeof(float)), *gone = tally_mem_alloc(c, 64);
    EXPECT(res, kept && gone, "mem_alloc: %s", tally_last_error());
    if (!kept || !gone) return 0;
    int stack;
    EXPECT(res, tally_mem_keep(c, &stack) == TALLY_E_INVALID, "keep of a stack address");
    EXPECT(res, !tally_mem_keep(c, kept), "keep: %s", tally_last_error());
    for (size_t i = 0; i < m; i++) kept[i] = (float)(rank + 1);
    EXPECT(res, !tally_allreduce(c, kept, kept, m, TALLY_F32, TALLY_SUM), "allreduce of the kept buffer: %s",
           tally_last_error());
    EXPECT(res, tally_mem_release(kept) == TALLY_E_INVALID, "release while the communicator lives");
    EXPECT(res, !tally_barrier(c), "barrier");
    EXPECT(res, !(abort_it ? tally_comm_abort(c) : tally_comm_free(c)), "free or abort");
    float want = (float)(n * (n + 1) / 2);
    for (size_t i = 0; i < m; i++)
        if (kept[i] != want) {
            EXPECT(res, 0, "kept[%zu] = %g past the communicator, not %g", i, kept[i], want);
            break;
        }
    kept[m - 1] = -1; /* still writable */
    EXPECT(res, !tally_mem_release(kept), "release: %s", tally_last_error());
    EXPECT(res, tally_mem_release(kept) == TALLY_E_INVALID, "second release");
    EXPECT(res, tally_mem_release(gone) == TALLY_E_INVALID, "release of a buffer freed with its communicator");
    EXPECT(res, tally_mem_release(NULL) == 0, "release(NULL)");
    return 0;
}

/* The kept registry across fork(): a thread of the parent takes its lock over and over (releases of an
 * address never kept) while the parent forks; each child releases its copy of a kept buffer. A child
 * that inherited the lock held would wait for good: its alarm then fails it. */
static _Atomic int hammer_stop;

static void *hammer_registry(void *arg) {
    (void)arg;
    int nothing;
    while (!atomic_load(&hammer_stop)) tally_mem_release(&nothing);
    return NULL;
}

static int fn_keep_fork(int rank, int n, void *arg) {
    (void)n, (void)arg;
    result *res = &R[rank];
    tally_comm *c = init_comm(res);
    if (!c) return 0;
    float *kept = tally_mem_alloc(c, 4096);
    EXPECT(res, kept && !tally_mem_keep(c, kept), "mem_alloc and keep: %s", tally_last_error());
    EXPECT(res, !tally_comm_free(c), "free: %s", tally_last_error());
    if (!kept) return 0;
    atomic_store(&hammer_stop, 0);
    pthread_t th;
    pthread_create(&th, NULL, hammer_registry, NULL);
    for (int k = 0; k < 1000 && !res->bad; k++) {
        fflush(NULL);
        pid_t kid = fork();
        if (kid == 0) {
            alarm(5);
            _exit(tally_mem_release(kept) == 0 ? 0 : 3);
        }
        int st = 0;
        waitpid(kid, &st, 0);
        EXPECT(res, WIFEXITED(st) && WEXITSTATUS(st) == 0,
               "fork %d: the child's release of a kept buffer %s (status %d)", k,
               WIFSIGNALED(st) ? "hung on the registry's lock" : "failed", st);
    }
    atomic_store(&hammer_stop, 1);
    pthread_join(th, NULL);
    EXPECT(res, !tally_mem_release(kept), "the parent's release: %s", tally_last_error());
    return 0;
}

/* tally_mem_alloc and tally_mem_free on two threads while collectives on another read the same table of
 * buffers (shm looks a large send's buffer up there to hand it over in place): the table grows, shrinks
 * and is searched at once; TSan sees a race unless it is kept under a lock. */
typedef struct mem_churn {
    tally_comm *c;
    _Atomic int stop;
    int bad;
} mem_churn;

static void *churn_mem(void *arg) {
    mem_churn *m = arg;
    void *held[16] = {0};
    for (int k = 0; !atomic_load(&m->stop); k++) {
        int i = k % 16;
        if (held[i] && tally_mem_free(m->c, held[i])) m->bad++;
        held[i] = tally_mem_alloc(m->c, 4096 + (size_t)i * 64);
        if (!held[i]) m->bad++;
    }
    for (int i = 0; i < 16; i++)
        if (held[i]) tally_mem_free(m->c, held[i]);
    return NULL;
}

static int fn_mem_threads(int rank, int n, void *arg) {
    (void)arg;
    result *res = &R[rank];
    tally_comm *c = init_comm(res);
    if (!c) return 0;
    size_t count = 1 << 18; /* 1 MiB: past the size a send is handed over in place */
    float *buf = tally_mem_alloc(c, count * sizeof(float));
    EXPECT(res, buf != NULL, "mem_alloc: %s", tally_last_error());
    mem_churn m[2] = {{.c = c}, {.c = c}}; /* two threads: the table is also changed from two at once */
    pthread_t th[2];
    for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, churn_mem, &m[k]);
    for (int k = 0; buf && k < 40 && !res->bad; k++) {
        for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1);
        EXPECT(res, !tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM), "allreduce %d: %s", k,
               tally_last_error());
        EXPECT(res, buf[0] == (float)(n * (n + 1) / 2) && buf[count - 1] == buf[0], "allreduce %d: %g", k, buf[0]);
    }
    for (int k = 0; k < 2; k++) {
        atomic_store(&m[k].stop, 1);
        pthread_join(th[k], NULL);
        EXPECT(res, m[k].bad == 0, "%d allocations or frees failed beside the collectives", m[k].bad);
    }
    EXPECT(res, !tally_mem_free(c, buf), "mem_free");
    EXPECT(res, !tally_comm_free(c), "free: %s", tally_last_error());
    return 0;
}

/* tally_wait_for returns on time while the peer sleeps, then gives the result; bad timeouts refused. */
static int fn_wait_for(int rank, int n, void *arg) {
    (void)arg;
    result *res = &R[rank];
    tally_comm *c = init_comm(res);
    if (!c) return 0;
    if (rank == 1) usleep(400 * 1000); /* rank 0 waits for it */
    float v = (float)rank + 1;
    tally_request *r;
    EXPECT(res, !tally_iallreduce(c, &v, &v, 1, TALLY_F32, TALLY_SUM, &r), "iallreduce");
    int done = 0, slices = 0;
    if (rank == 0) {
        double t0 = th_now();
        EXPECT(res, tally_wait_for(r, 0.05, &done) == 0 && done == 0, "the first 50 ms: rc %s, done %d",
               tally_last_error(), done);
        double took = th_now() - t0;
        EXPECT(res, took >= 0.04 && took < 0.3, "a 50 ms wait took %.3f s", took);
        EXPECT(res, tally_wait_for(r, NAN, &done) == TALLY_E_INVALID, "NaN timeout");
        EXPECT(res, tally_wait_for(r, -1, &done) == TALLY_E_INVALID, "negative timeout");
        EXPECT(res, tally_wait_for(r, 0, &done) == 0 && done == 0, "timeout 0 (a test)");
    }
    while (!done && slices++ < 200)
        EXPECT(res, tally_wait_for(r, 0.05, &done) == 0, "wait_for: %s", tally_last_error());
    EXPECT(res, done == 1 && v == 3.0f, "done %d, v %g after %d slices", done, v, slices);
    EXPECT(res, tally_wait_for(r, 1e300, &done) == 0 && done == 1, "a done request, a huge timeout");
    tally_request_free(r);
    /* A point-to-point receive, whose message comes late, the same way. */
    float got = 0, x = 5;
    if (rank == 0) {
        EXPECT(res, !tally_irecv(c, &got, 1, TALLY_F32, 1, 9, &r), "irecv");
        double t0 = th_now();
        done = -1;
        EXPECT(res, tally_wait_for(r, 0.05, &done) == 0 && done == 0, "irecv's first 50 ms: done %d", done);
        EXPECT(res, th_now() - t0 < 0.3, "irecv's 50 ms wait took %.3f s", th_now() - t0);
        EXPECT(res, !tally_barrier(c), "barrier");
        for (slices = 0; !done && slices < 200; slices++) tally_wait_for(r, 0.05, &done);
        EXPECT(res, done == 1 && got == 5.0f, "irecv: done %d, got %g", done, got);
        tally_request_free(r);
    } else {
        EXPECT(res, !tally_barrier(c), "barrier");
        usleep(100 * 1000);
        EXPECT(res, !tally_send(c, &x, 1, TALLY_F32, 0, 9), "send");
    }
    EXPECT(res, !tally_comm_free(c), "free");
    return 0;
}

static void report(const char *what, const char *tp, int n) {
    for (int r = 0; r < n; r++)
        TH_CHECK(R[r].bad == 0, "%s over %s, rank %d: %d wrong, first: %s", what, tp, r, R[r].bad, R[r].msg);
}

int main(void) {
    R = th_shared_alloc(sizeof *R * TH_MAX_RANKS);
    static const char *tps[] = {"shm", "tcp"};
    for (int k = 0; k < 2; k++) {
        th_opts o = {.transport = tps[k], .wall_s = 60, .timeout_s = 20};
        memset(R, 0, sizeof *R * TH_MAX_RANKS);
        TH_CHECK(th_run(2, &o, fn_fork, NULL) == 0, "fork over %s: a rank failed", tps[k]);
        report("a forked child", tps[k], 2);
        for (int abort_it = 0; abort_it < 2; abort_it++) {
            memset(R, 0, sizeof *R * TH_MAX_RANKS);
            TH_CHECK(th_run(2, &o, fn_keep, &abort_it) == 0, "keep over %s: a rank failed", tps[k]);
            report(abort_it ? "a buffer kept past abort" : "a buffer kept past free", tps[k], 2);
        }
        memset(R, 0, sizeof *R * TH_MAX_RANKS);
        TH_CHECK(th_run(2, &o, fn_mem_threads, NULL) == 0, "mem threads over %s: a rank failed", tps[k]);
        report("tally_mem_alloc beside collectives", tps[k], 2);
        memset(R, 0, sizeof *R * TH_MAX_RANKS);
        TH_CHECK(th_run(2, &o, fn_wait_for, NULL) == 0, "wait_for over %s: a rank failed", tps[k]);
        report("tally_wait_for", tps[k], 2);
    }
    th_opts one = {.transport = "shm", .wall_s = 60};
    int zero = 0;
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(1, &one, fn_keep, &zero) == 0, "keep on one rank: failed");
    report("a buffer kept past free, one rank", "self", 1);
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(1, &one, fn_keep_fork, NULL) == 0, "keep across forks: failed");
    report("the kept registry across fork()", "self", 1);
    return th_verdict("test_lifetime");
}
