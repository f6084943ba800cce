/* test_split.c - tally_comm_split and tally_comm_split_host in real processes: MPI_Comm_split's ranks
 * and groups (key order, ties by rank, TALLY_COLOR_NONE), collectives on the new communicators exact and
 * confined to their group, a split of a split, one that outlives its parent, hosts by TALLY_HOST; and
 * the guarantees: a dead member and a mismatched call are errors naming the world's rank. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <unistd.h>

#include "harness.h"

typedef struct result {
    int rank, size, null, rc, done;
    char transport[16];
    double sum;
    char msg[800];
} result;

static result *R; /* [TH_MAX_RANKS], shared */

static void record(int world, tally_comm *c, int rc) {
    R[world].done = 1;
    R[world].rc = rc;
    R[world].null = c == NULL;
    if (c) {
        R[world].rank = tally_comm_rank(c);
        R[world].size = tally_comm_size(c);
        snprintf(R[world].transport, sizeof R[world].transport, "%s", tally_comm_transport(c));
    }
    if (rc) snprintf(R[world].msg, sizeof R[world].msg, "%s", tally_last_error());
}

/* The sum over the group of its members' world ranks, through the new communicator. */
static int group_sum(tally_comm *c, int world, double *sum) {
    double v = world;
    return tally_allreduce(c, &v, sum, 1, TALLY_F64, TALLY_SUM);
}

/* color rank % 3, key -rank: three groups, each in reverse order; rank 4 joins none. */
static int fn_colors(int rank, int n, void *arg) {
    tally_comm *w, *c = NULL;
    if (tally_comm_init(&w)) return 1;
    int color = rank == 4 ? TALLY_COLOR_NONE : rank % 3;
    int rc = tally_comm_split(w, color, -rank, &c);
    record(rank, c, rc);
    if (!rc && c) rc = group_sum(c, rank, &R[rank].sum);
    if (!rc) rc = tally_barrier(w); /* the parent still works beside its children */
    R[rank].rc = rc;
    tally_comm_free(c);
    tally_comm_free(w);
    return 0;
}

static void test_colors(void) {
    const int n = 7;
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(n, NULL, fn_colors, NULL) == 0, "split by color: ranks did not exit cleanly");
    for (int r = 0; r < n; r++) {
        if (r == 4) {
            TH_CHECK(R[r].rc == 0 && R[r].null, "TALLY_COLOR_NONE: rank 4 got rc %d, communicator %s", R[r].rc,
                     R[r].null ? "NULL" : "not NULL");
            continue;
        }
        int members = 0, before = 0; /* in reverse order of rank: those of my color above me come first */
        double sum = 0;
        for (int q = 0; q < n; q++)
            if (q != 4 && q % 3 == r % 3) members++, sum += q, before += q > r;
        TH_CHECK(R[r].rc == 0 && !R[r].null && R[r].rank == before && R[r].size == members && R[r].sum == sum &&
                     !strcmp(R[r].transport, members > 1 ? "shm" : "self"),
                 "rank %d, color %d: rc %d (%s), rank %d of %d (expected %d of %d), sum %g (expected %g), %s", r, r % 3,
                 R[r].rc, R[r].msg, R[r].rank, R[r].size, before, members, R[r].sum, sum, R[r].transport);
    }
}

/* A split of a split (halves, then the odd ones of each half), kept after both parents are freed. */
static int fn_nested(int rank, int n, void *arg) {
    tally_comm *w, *half = NULL, *odd = NULL;
    if (tally_comm_init(&w)) return 1;
    int rc = tally_comm_split(w, rank < n / 2, rank, &half);
    if (!rc) rc = tally_comm_split(half, tally_comm_rank(half) % 2 ? 0 : TALLY_COLOR_NONE, 0, &odd);
    tally_comm_free(half);
    tally_comm_free(w);
    record(rank, odd, rc);
    if (!rc && odd) R[rank].rc = group_sum(odd, rank, &R[rank].sum);
    tally_comm_free(odd);
    return 0;
}

static void test_nested(void) {
    const int n = 8; /* halves 4..7 (color 0) and 0..3 (color 1); their odd members: 5, 7 and 1, 3 */
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(n, NULL, fn_nested, NULL) == 0, "nested split: ranks did not exit cleanly");
    for (int r = 0; r < n; r++) {
        int odd = (r % (n / 2)) % 2;
        double want = r < n / 2 ? 1 + 3 : 5 + 7;
        TH_CHECK(R[r].rc == 0 && R[r].null == !odd && (!odd || (R[r].size == 2 && R[r].sum == want)),
                 "nested split, rank %d: rc %d (%s), %s, size %d, sum %g (expected %g)", r, R[r].rc, R[r].msg,
                 R[r].null ? "none" : "a communicator", R[r].size, R[r].sum, want);
    }
}

/* Hosts by TALLY_HOST: a, a, b, b, a. */
static void env_hosts(int rank, void *arg) { setenv("TALLY_HOST", rank == 2 || rank == 3 ? "b" : "a", 1); }

static int fn_hosts(int rank, int n, void *arg) {
    tally_comm *w, *h = NULL;
    if (tally_comm_init(&w)) return 1;
    int rc = tally_comm_split_host(w, &h);
    record(rank, h, rc);
    if (!rc) R[rank].rc = group_sum(h, rank, &R[rank].sum);
    tally_comm_free(h);
    tally_comm_free(w);
    return 0;
}

static void test_hosts(void) {
    th_opts o = {.child_env = env_hosts, .timeout_s = 60};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(5, &o, fn_hosts, NULL) == 0, "split by host: ranks did not exit cleanly");
    static const int rank_in_host[5] = {0, 1, 0, 1, 2};
    for (int r = 0; r < 5; r++) {
        int b = r == 2 || r == 3;
        TH_CHECK(R[r].rc == 0 && R[r].size == (b ? 2 : 3) && R[r].rank == rank_in_host[r] &&
                     R[r].sum == (b ? 5 : 0 + 1 + 4) && !strcmp(R[r].transport, "shm"),
                 "host split, rank %d on host %s: rc %d (%s), rank %d of %d, sum %g, %s", r, b ? "b" : "a", R[r].rc,
                 R[r].msg, R[r].rank, R[r].size, R[r].sum, R[r].transport);
    }
}

/* The guarantees of a split, named by world rank: world rank 3 (rank 1 of the odd group) dies after the
 * split; world rank 2 (rank 1 of the even group) calls a different count from rank 0. */
static int fn_faults(int rank, int n, void *arg) {
    tally_comm *w, *c = NULL;
    if (tally_comm_init(&w)) return 1;
    int rc = tally_comm_split(w, rank % 2, rank, &c);
    if (rc) {
        record(rank, c, rc);
        return 0;
    }
    if (rank == 3) _exit(0); /* without a goodbye: its peers must see a death */
    float v[8] = {0};
    rc = tally_allreduce(c, v, v, rank == 2 ? 8 : 7, TALLY_F32, TALLY_SUM);
    record(rank, c, rc);
    if (rank == 1)
        tally_comm_abort(c); /* a communicator that lost a rank is torn down without goodbyes */
    else
        tally_comm_free(c);
    tally_comm_abort(w);
    return 0;
}

static void test_faults(void) {
    th_opts o = {.timeout_s = 20, .wall_s = 60};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    double t0 = th_now();
    th_run(4, &o, fn_faults, NULL);
    TH_CHECK(R[1].rc == TALLY_E_PEER_LOST && strstr(R[1].msg, "rank 1 (world rank 3)"),
             "a dead member: world rank 1 got %d '%s'", R[1].rc, R[1].msg);
    for (int r = 0; r <= 2; r += 2)
        TH_CHECK(R[r].rc == TALLY_E_MISMATCH && strstr(R[r].msg, "world rank"),
                 "mismatched counts: world rank %d got %d '%s'", r, R[r].rc, R[r].msg);
    TH_CHECK(th_now() - t0 < 15, "the faults took %.1f s to be seen (TALLY_TIMEOUT 20)", th_now() - t0);
    printf("  a dead member, seen by world rank 1: %s\n  mismatched counts, seen by world rank 0: %s\n", R[1].msg,
           R[0].msg);
}

/* A stopped member (SIGSTOP: hung, as under a debugger) is TALLY_E_TIMEOUT after TALLY_TIMEOUT on the
 * others of its split, naming it by its world rank; the harness kills it at the end. */
static int fn_stopped(int rank, int n, void *arg) {
    tally_comm *w, *c = NULL;
    if (tally_comm_init(&w)) return 1;
    int rc = tally_comm_split(w, rank % 2, rank, &c);
    if (!rc && rank == 3) raise(SIGSTOP);
    float v[4] = {0};
    double t0 = th_now();
    if (!rc) rc = tally_allreduce(c, v, v, 4, TALLY_F32, TALLY_SUM);
    record(rank, c, rc);
    R[rank].sum = th_now() - t0;
    tally_comm_abort(c);
    tally_comm_abort(w);
    return 0;
}

static void test_stopped(void) {
    th_opts o = {.timeout_s = 2, .wall_s = 30};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    th_job job;
    if (th_start(&job, 4, &o, fn_stopped, NULL)) return;
    double t0 = th_now(); /* the stopped rank goes once the others have their answers */
    while (th_now() - t0 < 20 && !(R[0].done && R[1].done && R[2].done)) usleep(10000);
    kill(job.pid[3], SIGKILL);
    th_wait(&job, 10);
    TH_CHECK(R[1].rc == TALLY_E_TIMEOUT && strstr(R[1].msg, "rank 1 (world rank 3)") && R[1].sum < 8,
             "a stopped member: world rank 1 got %d '%s' after %.1f s", R[1].rc, R[1].msg, R[1].sum);
    TH_CHECK(R[0].rc == 0 && R[2].rc == 0, "the other group: %d, %d", R[0].rc, R[2].rc);
    printf("  a stopped member, seen by world rank 1: %s\n", R[1].msg);
}

/* The hierarchy's levels are splits the world makes itself: world rank 3 dies while the others are in a
 * hierarchical allreduce (hosts a, a, b, b); each of them gets an error naming it, not a hang. */
static int fn_hier_death(int rank, int n, void *arg) {
    tally_comm *w;
    int rc = tally_comm_init(&w);
    if (rc) {
        record(rank, NULL, rc);
        return 0;
    }
    if (rank == 3) _exit(0);
    size_t count = 1 << 20;
    float *v = calloc(count, sizeof *v);
    double t0 = th_now();
    rc = TALLY_E_INVALID;
    for (int k = 0; k < 100 && th_now() - t0 < 20; k++)
        if ((rc = tally_allreduce(w, v, v, count, TALLY_F32, TALLY_SUM))) break;
    record(rank, NULL, rc);
    R[rank].sum = th_now() - t0;
    free(v);
    tally_comm_abort(w);
    return 0;
}

static void test_hier_death(void) {
    th_opts o = {.child_env = env_hosts, .algo = "hier", .timeout_s = 30, .wall_s = 60};
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    th_run(4, &o, fn_hier_death, NULL);
    for (int r = 0; r < 3; r++)
        TH_CHECK((R[r].rc == TALLY_E_PEER_LOST || R[r].rc == TALLY_E_ABORTED) && strstr(R[r].msg, "3") && R[r].sum < 10,
                 "hier, world rank 3 dead: world rank %d got %d '%s' after %.1f s", r, R[r].rc, R[r].msg, R[r].sum);
    printf("  hier, world rank 3 dead: world rank 0 got '%s' after %.2f s\n", R[0].msg, R[0].sum);
}

static int fn_refusals(int rank, int n, void *arg) {
    tally_comm *w, *c;
    if (tally_comm_init(&w)) return 1;
    R[rank].rc = tally_comm_split(w, 0, 0, NULL);
    snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_last_error());
    int rc = tally_comm_split(NULL, 0, 0, &c);
    R[rank].null = rc == TALLY_E_INVALID && c == NULL;
    tally_comm_free(w);
    return 0;
}

static void test_refusals(void) {
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(2, NULL, fn_refusals, NULL) == 0, "refusals: ranks did not exit cleanly");
    TH_CHECK(R[0].rc == TALLY_E_INVALID && strstr(R[0].msg, "newcomm") && R[0].null,
             "NULL arguments: rc %d '%s', NULL comm refused %d", R[0].rc, R[0].msg, R[0].null);
}

int main(void) {
    R = th_shared_alloc(sizeof *R * TH_MAX_RANKS);
    if (th_quick()) {
        test_colors();
        test_nested();
        test_hosts();
        test_faults();
        test_hier_death();
        test_refusals();
    }
    if (th_long()) test_stopped(); /* waits out a 2 s TALLY_TIMEOUT */
    th_shared_free(R, sizeof *R * TH_MAX_RANKS);
    return th_verdict("test_split");
}
