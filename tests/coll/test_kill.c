/* test_kill.c - a rank SIGKILLed at random points of 64 MiB allreduces (N = 4, shm and tcp): every survivor
 * returns TALLY_E_PEER_LOST naming it within TALLY_TIMEOUT + 1 s and leaves no fd, thread or segment behind. */
#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <tally.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"
#include "harness.h"

/* Knobs:
 *   TALLY_KILL_POINTS=K  kill points per transport (default 3, or 2 under TALLY_TEST_LIGHT; 100 on demand)
 *   TALLY_KILL_SEED=S    replays a run's choices: every victim, algorithm and kill point, in order */
#define N          4
#define TIMEOUT_S  10.0   /* TALLY_TIMEOUT for the jobs: "timeout + 1 s" is the bound on detection */
#define MAX_ITERS  100000 /* the victim dies long before; a bound, not a goal */
#define MAX_POINTS 1000

typedef struct {
    _Atomic int ready;    /* ranks past tally_comm_init */
    _Atomic int iters[N]; /* allreduces each rank completed */
    double ready_at;      /* CLOCK_MONOTONIC when the last rank got ready */
    double first_done[N]; /* when each rank completed its first allreduce */
    int code[N];
    double when[N]; /* when the failing call returned */
    char msg[N][400];
    int fds_before[N], fds_after[N], thr_before[N], thr_after[N];
    int wrong[N]; /* allreduces whose result was not the maximum */
    int done[N];  /* the rank got past tally_comm_free */
} shared_t;

static shared_t *S;
static size_t count; /* floats per allreduce */

/* splitmix64: the test's own generator, so the harness's rand() cannot shift the sequence */
static uint64_t rng_state;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1.0p-53; }

/* Names in /dev/shm that the shm transport of a job whose rank 0 had pid `pid0` would use. */
static int leftover_segments(int pid0, char *first, size_t cap) {
    char prefix[32];
    int n = 0, len = snprintf(prefix, sizeof prefix, "tally-%d-", pid0);
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, prefix, (size_t)len) && n++ == 0) snprintf(first, cap, "%s", e->d_name);
    closedir(d);
    return n;
}

static int kill_rank(int rank, int n, void *arg) {
    S->fds_before[rank] = th_count_fds();
    S->thr_before[rank] = th_count_threads();
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) {
        S->code[rank] = rc;
        snprintf(S->msg[rank], sizeof S->msg[rank], "init: %s", tally_last_error());
        return 1;
    }
    /* In place, and MAX so that the result stays put: one buffer, checked after every call. Written
     * now, so that no allreduce pays the first touch of its pages (slow on some VMs). */
    float *buf = malloc(count * sizeof *buf);
    for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1);
    if (atomic_fetch_add(&S->ready, 1) == n - 1) S->ready_at = th_now();
    for (int i = 0; i < MAX_ITERS && !rc; i++) {
        rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_MAX);
        if (rc) break;
        S->wrong[rank] += buf[0] != (float)n || buf[count / 2] != (float)n || buf[count - 1] != (float)n;
        if (i == 0) S->first_done[rank] = th_now();
        atomic_fetch_add(&S->iters[rank], 1);
    }
    S->when[rank] = th_now();
    S->code[rank] = rc;
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", rc ? tally_last_error() : "");
    tally_comm_free(c);
    free(buf);
    S->fds_after[rank] = th_count_fds();
    S->thr_after[rank] = th_count_threads_after(S->thr_before[rank]);
    S->done[rank] = 1;
    return 0;
}

static void check_resources(const char *what, int r) {
    TH_CHECK(S->done[r], "%s: rank %d did not get past tally_comm_free", what, r);
    TH_CHECK(S->fds_after[r] == S->fds_before[r], "%s: rank %d has %d fds open after tally_comm_free, %d before init",
             what, r, S->fds_after[r], S->fds_before[r]);
    TH_CHECK(S->thr_after[r] == S->thr_before[r], "%s: rank %d has %d threads after tally_comm_free, %d before init",
             what, r, S->thr_after[r], S->thr_before[r]);
    TH_CHECK(S->wrong[r] == 0, "%s: rank %d saw %d wrong results before the kill", what, r, S->wrong[r]);
}

static void check_segments(const char *what, const th_job *job) {
    char name[256] = "";
    int left = leftover_segments(job->pid[0], name, sizeof name);
    TH_CHECK(left == 0, "%s: %d shared-memory segment(s) of the job left in /dev/shm (%s)", what, left, name);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Waits (bounded) until every rank is past init, or one of them has exited. */
static int wait_ready(const th_job *job, double bound_s) {
    double t0 = th_now();
    while (atomic_load(&S->ready) < N && th_now() - t0 < bound_s) {
        for (int r = 0; r < N; r++) {
            siginfo_t si = {0};
            if (waitid(P_PID, (id_t)job->pid[r], &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid) return 0;
        }
        usleep(1000);
    }
    return atomic_load(&S->ready) == N;
}

/* Waits (bounded) until rank r has completed `iters` allreduces, or has exited. */
static void wait_iters(const th_job *job, int r, int iters, double bound_s) {
    double t0 = th_now();
    siginfo_t si = {0};
    while (atomic_load(&S->iters[r]) < iters && th_now() - t0 < bound_s) {
        if (waitid(P_PID, (id_t)job->pid[r], &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid) return;
        usleep(200);
    }
}

/* One kill point: the victim dies after `after` allreduces plus a random part of the next one, as long
 * as one took in the previous point (*iter_s, updated). Appends each survivor's detection time to det. */
static void kill_point(const char *transport, int point, double *iter_s, double *det, int *ndet) {
    memset(S, 0, sizeof *S);
    int victim = (int)(rng_next() % N), after = (int)(rng_next() % 3); /* 0: in the first allreduce */
    const char *algo = tally__algo_name(1 + (int)(rng_next() % (uint64_t)tally__algo_count())); /* any in the table */
    double delay = rng_unit() * *iter_s;
    char what[128];
    snprintf(what, sizeof what, "%s kill #%d (victim %d, %s, %d allreduces + %.3f s)", transport, point, victim, algo,
             after, delay);
    th_opts o = {.transport = transport, .algo = algo, .timeout_s = TIMEOUT_S, .wall_s = 90};
    th_job job;
    if (th_start(&job, N, &o, kill_rank, NULL)) {
        TH_CHECK(0, "%s: fork failed", what);
        return;
    }
    int ready = wait_ready(&job, 60);
    TH_CHECK(ready, "%s: the ranks did not all finish tally_comm_init", what);
    if (ready) {
        wait_iters(&job, victim, after, 60);
        struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
    }
    int at_iter = atomic_load(&S->iters[victim]);
    double kill_time = th_now();
    kill(job.pid[victim], SIGKILL);
    th_wait(&job, 90);
    TH_CHECK(WIFSIGNALED(job.status[victim]) && WTERMSIG(job.status[victim]) == SIGKILL,
             "%s: the victim did not die of the SIGKILL (status 0x%x)", what, job.status[victim]);
    double lo = 1e9, hi = 0;
    for (int r = 0; r < N && ready; r++) {
        if (r == victim) continue;
        TH_CHECK(!job.killed_by_harness[r], "%s: rank %d hung", what, r);
        TH_CHECK(S->code[r] == TALLY_E_PEER_LOST, "%s: rank %d got %s (%s), want PEER_LOST", what, r,
                 tally_strerror(S->code[r]), S->msg[r]);
        TH_CHECK(th_first_rank_named(S->msg[r]) == victim, "%s: rank %d's message does not name rank %d first: %s",
                 what, r, victim, S->msg[r]);
        double late = S->when[r] - kill_time;
        TH_CHECK(S->when[r] > 0 && late < TIMEOUT_S + 1.0, "%s: rank %d returned %.2f s after the kill (bound %.0f s)",
                 what, r, late, TIMEOUT_S + 1.0);
        check_resources(what, r);
        if (late < lo) lo = late;
        if (late > hi) hi = late;
        det[(*ndet)++] = late;
    }
    check_segments(what, &job);
    for (int r = 0; r < N; r++) /* the first allreduce of this job, as the next point's unit of time */
        if (r != victim && S->first_done[r] > S->ready_at && S->ready_at > 0) *iter_s = S->first_done[r] - S->ready_at;
    printf("  %s: died in allreduce %d; survivors returned %.3f-%.3f s later\n", what, at_iter + 1, lo, hi);
    fflush(stdout);
}

static void run_transport(const char *transport, int points) {
    double iter_s = 0.2, *det = calloc((size_t)points * N + 1, sizeof *det);
    int ndet = 0;
    for (int p = 0; p < points; p++) kill_point(transport, p, &iter_s, det, &ndet);
    if (ndet) {
        qsort(det, (size_t)ndet, sizeof *det, cmp_double);
        printf("%s: %d kill points, %d survivors: detection min %.3f s, median %.3f s, max %.3f s\n", transport, points,
               ndet, det[0], det[ndet / 2], det[ndet - 1]);
    }
    free(det);
}

int main(void) {
    S = th_shared_alloc(sizeof *S);
    /* The quick tier: one kill point per transport in 16 MiB allreduces; the long one: three in 64 MiB. */
    int quick = !th_long();
    count = (th_light() || quick ? 16u << 20 : 64u << 20) / sizeof(float);
    const char *ps = getenv("TALLY_KILL_POINTS"), *ss = getenv("TALLY_KILL_SEED");
    int points = ps ? atoi(ps) : quick ? 1 : th_light() ? 2 : 3;
    if (points < 0 || points > MAX_POINTS) points = 3;
    uint64_t seed = ss ? strtoull(ss, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    rng_state = seed;
    printf("test_kill: seed %llu (TALLY_KILL_SEED=%llu replays it), %d kill points per transport\n",
           (unsigned long long)seed, (unsigned long long)seed, points);
    fflush(stdout);
    run_transport("shm", points);
    run_transport("tcp", points);
    return th_verdict("test_kill");
}
