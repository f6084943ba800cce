/* test_hang.c - a rank SIGSTOPped before a collective or anywhere in a loop (N = 4, shm, tcp): every other rank
 * returns TALLY_E_TIMEOUT naming it, the collective and its sequence number, within TALLY_TIMEOUT +-10%. */
#include <dirent.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <tally.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"
#include "harness.h"

#define N         4
#define TIMEOUT_S 2.0 /* TALLY_TIMEOUT: short, so the whole test stays short */
#define WARMUP    3   /* allreduces every rank completes before the victim stops: the next is #4 */

typedef struct {
    int victim, late; /* late: a rank that calls the collective LATE_S after the others, or -1 */
    int anywhere;     /* the parent stops the victim at a random moment of a loop of allreduces */
    _Atomic int ready;
    int code[N];
    double start[N], when[N]; /* CLOCK_MONOTONIC at the call and at its return */
    char msg[N][600];
    int fds_before[N], fds_after[N], thr_before[N], thr_after[N];
    int done[N];
    int victim_result_ok;
} shared_t;

#define LATE_S (TIMEOUT_S / 2)

static shared_t *S;
static size_t count;

static int hang_rank(int rank, int n, void *arg) {
    S->fds_before[rank] = th_count_fds();
    S->thr_before[rank] = th_count_threads();
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) {
        S->code[rank] = rc;
        snprintf(S->msg[rank], sizeof S->msg[rank], "init: %s", tally_last_error());
        return 1;
    }
    float *buf = malloc(count * sizeof *buf), want = (float)(n * (n + 1) / 2);
    for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1);
    for (int i = 0; i < WARMUP; i++) want *= (float)n; /* in place: each allreduce multiplies the sum by n */
    for (int i = 0; i < WARMUP && !rc; i++) rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
    if (S->anywhere) { /* every rank loops until the stop shows */
        atomic_fetch_add(&S->ready, 1);
        for (int i = 0; i < 10000000 && !rc; i++) {
            S->start[rank] = th_now();
            rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_MAX);
        }
        S->when[rank] = th_now();
        goto out;
    }
    if (!rc && rank == S->victim) raise(SIGSTOP); /* hung until the parent sends SIGCONT */
    if (!rc && rank == S->late) usleep((useconds_t)(LATE_S * 1e6));
    S->start[rank] = th_now();
    if (!rc) rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
    S->when[rank] = th_now();
    /* Resumed, the stopped rank may find every message it needs already there and complete its call: the
     * result is then right, and the next call reports the broken communicator. */
    if (!rc && rank == S->victim) {
        S->victim_result_ok = buf[0] == want && buf[count - 1] == want;
        rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
    }
out:
    S->code[rank] = rc;
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", rc ? tally_last_error() : "");
    tally_comm_free(c);
    free(buf);
    S->fds_after[rank] = th_count_fds();
    S->thr_after[rank] = th_count_threads_after(S->thr_before[rank]);
    S->done[rank] = 1;
    return 0;
}

/* Waits (bounded) until every rank but the victim got past tally_comm_free or exited. */
static void wait_survivors(const th_job *job, double bound_s) {
    double t0 = th_now();
    for (int r = 0; r < N; r++) {
        if (r == S->victim) continue;
        siginfo_t si = {0};
        while (!S->done[r] && th_now() - t0 < bound_s &&
               !(waitid(P_PID, (id_t)job->pid[r], &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid))
            usleep(2000);
    }
}

/* anywhere: the victim is stopped `stop_s` after every rank started looping (0: it stops itself before
 * allreduce #WARMUP+1). */
static void scenario(const char *transport, const char *algo, int victim, int late, double stop_s) {
    memset(S, 0, sizeof *S);
    S->victim = victim;
    S->late = late;
    S->anywhere = stop_s > 0;
    char what[128];
    if (S->anywhere)
        snprintf(what, sizeof what, "%s/%s hang (rank %d stopped %.3f s into a loop)", transport, algo, victim, stop_s);
    else
        snprintf(what, sizeof what, "%s/%s hang (rank %d stopped%s)", transport, algo, victim,
                 late >= 0 ? ", one rank late" : "");
    th_opts o = {.transport = transport, .algo = algo, .timeout_s = TIMEOUT_S, .wall_s = 60};
    th_job job;
    if (th_start(&job, N, &o, hang_rank, NULL)) {
        TH_CHECK(0, "%s: fork failed", what);
        return;
    }
    if (S->anywhere) {
        double t0 = th_now();
        while (atomic_load(&S->ready) < N && th_now() - t0 < 30) usleep(1000);
        usleep((useconds_t)(stop_s * 1e6));
        kill(job.pid[victim], SIGSTOP);
    }
    wait_survivors(&job, 40);
    kill(job.pid[victim], SIGCONT); /* it wakes into a broken communicator, fails its call and exits */
    th_wait(&job, 60);
    char want[64]; /* stopped anywhere, the ranks may be one collective apart: the number is the reporter's */
    snprintf(want, sizeof want, S->anywhere ? "allreduce #" : "allreduce #%d", WARMUP + 1);
    double first = 1e30;
    for (int r = 0; r < N; r++)
        if (r != victim && S->start[r] > 0 && S->start[r] < first) first = S->start[r];
    for (int r = 0; r < N; r++) {
        TH_CHECK(!job.killed_by_harness[r], "%s: rank %d hung", what, r);
        TH_CHECK(WIFEXITED(job.status[r]) && WEXITSTATUS(job.status[r]) == 0, "%s: rank %d ended with status 0x%x",
                 what, r, job.status[r]);
        if (r == victim) {
            TH_CHECK(S->code[r] != 0, "%s: the stopped rank's calls succeeded after SIGCONT", what);
            TH_CHECK(S->victim_result_ok || S->code[r] != 0, "%s: the stopped rank completed with a wrong result",
                     what);
            continue;
        }
        TH_CHECK(S->code[r] == TALLY_E_TIMEOUT, "%s: rank %d got %s (%s), want TIMEOUT", what, r,
                 tally_strerror(S->code[r]), S->msg[r]);
        TH_CHECK(th_first_rank_named(S->msg[r]) == victim, "%s: rank %d's message does not name rank %d first: %s",
                 what, r, victim, S->msg[r]);
        TH_CHECK(strstr(S->msg[r], want) != NULL, "%s: rank %d's message does not name %s: %s", what, r, want,
                 S->msg[r]);
        /* A collective fails everywhere once any rank has waited TALLY_TIMEOUT: a rank that joined late
         * learns of that fault before its own wait is over, so its bound runs from the first rank's start. */
        double took = S->when[r] - S->start[r], since_first = S->when[r] - first;
        if (r == late)
            TH_CHECK(since_first > 0.9 * TIMEOUT_S && took < 1.1 * TIMEOUT_S,
                     "%s: late rank %d returned %.2f s after the first rank's call and %.2f s after its own "
                     "(TALLY_TIMEOUT=%g)",
                     what, r, since_first, took, TIMEOUT_S);
        else
            TH_CHECK(took > 0.9 * TIMEOUT_S && took < 1.1 * TIMEOUT_S,
                     "%s: rank %d returned %.2f s after its call (TALLY_TIMEOUT=%g)", what, r, took, TIMEOUT_S);
        TH_CHECK(S->done[r] && S->fds_after[r] == S->fds_before[r] && S->thr_after[r] == S->thr_before[r],
                 "%s: rank %d left fds %d -> %d, threads %d -> %d", what, r, S->fds_before[r], S->fds_after[r],
                 S->thr_before[r], S->thr_after[r]);
        printf("  %s: rank %d returned after %.3f s: %s\n", what, r, took, S->msg[r]);
    }
    fflush(stdout);
}

int main(void) {
    S = th_shared_alloc(sizeof *S);
    count = 1000;
    const char *s = getenv("TALLY_HANG_SEED");
    unsigned seed = s ? (unsigned)strtoul(s, NULL, 0) : (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("test_hang: seed %u (TALLY_HANG_SEED replays it)\n", seed);
    const char *transports[] = {"shm", "tcp"};
    for (int i = 0; i < 2; i++) {
        /* ring: rank 3 waits for the stopped rank 2; rank 0 waits for 3, and rank 1 for 0 (the quick tier
         * over shm; every other case is the long tier's) */
        if (i == 0 ? th_quick() : th_long()) scenario(transports[i], "ring", 2, -1, 0);
        if (!th_long()) continue;
        /* direct: everyone waits for the stopped rank 0, which also relays faults between the others */
        scenario(transports[i], "direct", 0, -1, 0);
        /* direct: rank 0 waits for the stopped rank 2; ranks 1 and 3 wait for rank 0, rank 1 from later on */
        scenario(transports[i], "direct", 2, 1, 0);
        /* anywhere in a loop of small allreduces: mid-collective, or between two */
        scenario(transports[i], tally__algo_name(1 + (int)(rand_r(&seed) % (unsigned)tally__algo_count())),
                 (int)(rand_r(&seed) % N), -1, 0.001 + 0.05 * rand_r(&seed) / RAND_MAX);
    }
    return th_verdict("test_hang");
}
