/* test_mixed.c - the shm+tcp transport of a world across hosts (TALLY_HOST a, a, b, b; the ring, so
 * every rank sends on one kind and receives on the other): its name, exact sums, and the guarantees of
 * either backend kept: a death, a stopped rank, a mismatched call and an abort are errors naming the
 * world's rank on every other rank, within seconds, whichever link saw it first. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <unistd.h>

#include "harness.h"

typedef struct result {
    int rc, done;
    char transport[16];
    double seconds, first;
    char msg[800];
} result;

static result *R; /* [TH_MAX_RANKS], shared */

static void env_hosts(int rank, void *arg) { setenv("TALLY_HOST", rank < 2 ? "a" : "b", 1); }

enum { CASE_SUM, CASE_DEATH, CASE_STOP, CASE_MISMATCH, CASE_ABORT };

/* Allreduces 1 Mi floats until one fails (or 20 s pass): a fault finds the others mid-collective. */
static int reduce_until_fault(tally_comm *w, float *v, size_t count) {
    double t0 = th_now();
    int rc = 0;
    for (int k = 0; k < 200 && th_now() - t0 < 20 && !rc; k++)
        rc = tally_allreduce(w, v, v, count, TALLY_F32, TALLY_SUM);
    return rc;
}

static int fn_case(int rank, int n, void *arg) {
    int which = *(const int *)arg, rc;
    tally_comm *w;
    if ((rc = tally_comm_init(&w))) {
        R[rank].rc = rc;
        snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_last_error());
        R[rank].done = 1;
        return 0;
    }
    snprintf(R[rank].transport, sizeof R[rank].transport, "%s", tally_comm_transport(w));
    size_t count = 1 << 20;
    float *v = malloc(count * sizeof *v);
    for (size_t i = 0; i < count; i++) v[i] = (float)(rank + 1) + (float)(i % 7);
    double t0 = th_now();
    if (which == CASE_SUM) {
        rc = tally_allreduce(w, v, v, count, TALLY_F32, TALLY_SUM);
        for (size_t i = 0; i < count && !rc; i++)
            if (v[i] != 10.0f + 4.0f * (float)(i % 7)) rc = -1000;
        if (!rc) rc = tally_allreduce(w, v, v, 7, TALLY_F32, TALLY_MAX);
        R[rank].first = v[0];
    } else if (which == CASE_DEATH && rank == 2) {
        _exit(0); /* no goodbye: rank 3 learns it over shm, ranks 0 and 1 over tcp */
    } else if (which == CASE_STOP && rank == 2) {
        raise(SIGSTOP);
    } else if (which == CASE_ABORT && rank == 0) {
        tally_comm_abort(w);
        w = NULL;
    } else if (which == CASE_MISMATCH) {
        rc = tally_allreduce(w, v, v, rank == 3 ? 8 : 7, TALLY_F32, TALLY_SUM);
    } else {
        rc = reduce_until_fault(w, v, count);
    }
    R[rank].seconds = th_now() - t0;
    R[rank].rc = rc;
    if (rc) snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_last_error());
    R[rank].done = 1;
    free(v);
    if (w) {
        if (rc)
            tally_comm_abort(w);
        else
            tally_comm_free(w);
    }
    return 0;
}

/* Runs one case on 4 ranks; a rank that stops is killed once the others have answered. */
static void run(int which, double timeout_s, int stopped) {
    th_opts o = {.child_env = env_hosts, .algo = "ring", .timeout_s = timeout_s, .wall_s = 60};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    th_job job;
    if (th_start(&job, 4, &o, fn_case, &which)) return;
    double t0 = th_now();
    while (th_now() - t0 < 30) {
        int done = 0;
        for (int r = 0; r < 4; r++) done += R[r].done || r == stopped;
        if (done == 4) break;
        usleep(10000);
    }
    if (stopped >= 0) kill(job.pid[stopped], SIGKILL);
    th_wait(&job, 10);
}

static int named(const char *msg, int rank) {
    char want[32];
    snprintf(want, sizeof want, "rank %d", rank);
    return strstr(msg, want) != NULL;
}

int main(void) {
    R = th_shared_alloc(sizeof *R * TH_MAX_RANKS);

    run(CASE_SUM, 20, -1);
    for (int r = 0; r < 4; r++)
        TH_CHECK(R[r].rc == 0 && !strcmp(R[r].transport, "shm+tcp") && R[r].first == 10.0f,
                 "hosts a a b b: rank %d: %d %s '%s' %g", r, R[r].rc, R[r].transport, R[r].msg, R[r].first);

    run(CASE_DEATH, 20, 2);
    for (int r = 0; r < 4; r++)
        if (r != 2)
            TH_CHECK((R[r].rc == TALLY_E_PEER_LOST || R[r].rc == TALLY_E_ABORTED) && named(R[r].msg, 2) &&
                         R[r].seconds < 10,
                     "rank 2 dead: rank %d got %d '%s' after %.1f s", r, R[r].rc, R[r].msg, R[r].seconds);
    printf("  rank 2 dead: rank 3 (its host) got '%s'\n  rank 0 (the other host) got '%s'\n", R[3].msg, R[0].msg);

    run(CASE_STOP, 2, 2);
    for (int r = 0; r < 4; r++)
        if (r != 2)
            TH_CHECK(R[r].rc == TALLY_E_TIMEOUT && named(R[r].msg, 2) && R[r].seconds < 10,
                     "rank 2 stopped: rank %d got %d '%s' after %.1f s", r, R[r].rc, R[r].msg, R[r].seconds);
    printf("  rank 2 stopped: rank 3 got '%s'\n", R[3].msg);

    run(CASE_MISMATCH, 20, -1);
    for (int r = 0; r < 4; r++)
        TH_CHECK(R[r].rc == TALLY_E_MISMATCH && R[r].seconds < 10, "rank 3's count 8 against 7: rank %d got %d '%s'", r,
                 R[r].rc, R[r].msg);
    printf("  rank 3's count 8 against 7: rank 2 (its host) got '%s'\n", R[2].msg);

    run(CASE_ABORT, 20, -1);
    for (int r = 1; r < 4; r++)
        TH_CHECK((R[r].rc == TALLY_E_ABORTED || R[r].rc == TALLY_E_PEER_LOST) && named(R[r].msg, 0) &&
                     R[r].seconds < 10,
                 "rank 0 aborted: rank %d got %d '%s' after %.1f s", r, R[r].rc, R[r].msg, R[r].seconds);
    printf("  rank 0 aborted: rank 1 (its host) got '%s'\n", R[1].msg);

    th_shared_free(R, sizeof *R * TH_MAX_RANKS);
    return th_verdict("test_mixed");
}
