/* test_faults.c - no hangs: a rank killed mid-allreduce, mismatched calls, a wrong token, a silent peer
 * and bad arguments each end every rank's call with the right error, within bounds, on both transports. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <unistd.h>

#include "harness.h"

typedef struct {
    int code[TH_MAX_RANKS];
    double when[TH_MAX_RANKS];
    char msg[TH_MAX_RANKS][400];
    double kill_time;
    int victim;
    int scenario;
} shared_t;

static shared_t *S;

static void record(int rank, int rc) {
    S->code[rank] = rc;
    S->when[rank] = th_now();
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", rc ? tally_last_error() : "");
}

/* ---- a rank killed in the middle of a 64 MiB allreduce ---- */

static void *killer(void *arg) {
    usleep(30000);
    S->kill_time = th_now();
    raise(SIGKILL);
    return arg;
}

static int kill_rank(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return record(rank, rc), 1;
    size_t count = (64u << 20) / 4;
    float *buf = calloc(count, sizeof *buf);
    if (rank == S->victim) {
        pthread_t t;
        pthread_create(&t, NULL, killer, NULL);
    }
    for (int i = 0; i < 200 && !rc; i++) rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
    record(rank, rc);
    tally_comm_free(c);
    free(buf);
    return 0;
}

static void test_kill(const char *transport) {
    int n = 4;
    memset(S, 0, sizeof *S);
    S->victim = 2;
    th_opts o = {.transport = transport, .timeout_s = 60, .wall_s = 60};
    th_job job;
    th_start(&job, n, &o, kill_rank, NULL);
    th_wait(&job, 60);
    for (int r = 0; r < n; r++) {
        if (r == S->victim) continue;
        TH_CHECK(!job.killed_by_harness[r], "%s kill: rank %d hung", transport, r);
        TH_CHECK(S->code[r] == TALLY_E_PEER_LOST, "%s kill: rank %d got %s (%s), want PEER_LOST", transport, r,
                 tally_strerror(S->code[r]), S->msg[r]);
        TH_CHECK(strstr(S->msg[r], "rank 2") != NULL, "%s kill: rank %d's message does not name rank 2: %s", transport,
                 r, S->msg[r]);
        double late = S->when[r] - S->kill_time;
        TH_CHECK(S->kill_time > 0 && late < 5.0, "%s kill: rank %d returned %.2f s after the kill", transport, r, late);
    }
}

/* ---- mismatched calls ---- */

enum { MIS_COUNT, MIS_DTYPE, MIS_OP, MIS_COLL, MIS_ROOT, MIS_KINDS };
static const char *mis_name[] = {"count", "dtype", "op", "collective", "root"};

static int mismatch_rank(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return record(rank, rc), 1;
    double buf[2000] = {0};
    int odd = rank == n - 1; /* the last rank disagrees */
    switch (S->scenario) {
    case MIS_COUNT: rc = tally_allreduce(c, buf, buf, odd ? 1001 : 1000, TALLY_F32, TALLY_SUM); break;
    case MIS_DTYPE: rc = tally_allreduce(c, buf, buf, 1000, odd ? TALLY_I32 : TALLY_F32, TALLY_SUM); break;
    case MIS_OP: rc = tally_allreduce(c, buf, buf, 1000, TALLY_F32, odd ? TALLY_MAX : TALLY_SUM); break;
    case MIS_COLL:
        rc = odd ? tally_broadcast(c, buf, 1000, TALLY_F32, 0)
                 : tally_allreduce(c, buf, buf, 1000, TALLY_F32, TALLY_SUM);
        break;
    default: /* the roots too fail in this very call, though they need nothing from their peers */
        rc = tally_broadcast(c, buf, 1000, TALLY_F32, odd ? 1 : 0);
        break;
    }
    record(rank, rc);
    tally_comm_free(c);
    return 0;
}

static void test_mismatch(const char *transport, const char *algo) {
    int n = 3;
    for (int k = 0; k < MIS_KINDS; k++) {
        memset(S, 0, sizeof *S);
        S->scenario = k;
        th_opts o = {.transport = transport, .algo = algo, .timeout_s = 30, .wall_s = 40};
        th_job job;
        th_start(&job, n, &o, mismatch_rank, NULL);
        th_wait(&job, 40);
        for (int r = 0; r < n; r++) {
            TH_CHECK(!job.killed_by_harness[r], "%s/%s %s mismatch: rank %d hung", transport, algo, mis_name[k], r);
            TH_CHECK(S->code[r] == TALLY_E_MISMATCH, "%s/%s %s mismatch: rank %d got %s (%s)", transport, algo,
                     mis_name[k], r, tally_strerror(S->code[r]), S->msg[r]);
        }
        if (k == MIS_COUNT)
            for (int r = 0; r < n; r++)
                TH_CHECK(strstr(S->msg[r], "count 1000") && strstr(S->msg[r], "count 1001"),
                         "%s/%s: rank %d's mismatch message lacks both signatures: %s", transport, algo, r, S->msg[r]);
    }
}

/* ---- a wrong token on one rank ---- */

static void wrong_token_env(int rank, void *arg) {
    if (rank == 2) setenv("TALLY_TOKEN", "not-the-token", 1);
}

static int init_only_rank(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    record(rank, rc);
    if (!rc) tally_comm_free(c);
    return 0;
}

static void test_wrong_token(void) {
    memset(S, 0, sizeof *S);
    th_opts o = {.timeout_s = 3, .wall_s = 30, .child_env = wrong_token_env};
    th_job job;
    th_start(&job, 3, &o, init_only_rank, NULL);
    th_wait(&job, 30);
    for (int r = 0; r < 3; r++) TH_CHECK(!job.killed_by_harness[r], "wrong token: rank %d hung", r);
    TH_CHECK(S->code[2] == TALLY_E_AUTH, "wrong token: rank 2 got %s (%s), want AUTH", tally_strerror(S->code[2]),
             S->msg[2]);
    TH_CHECK(S->code[0] == TALLY_E_TIMEOUT, "wrong token: rank 0 got %s (%s), want TIMEOUT naming rank 2",
             tally_strerror(S->code[0]), S->msg[0]);
    TH_CHECK(strstr(S->msg[0], "2") != NULL, "wrong token: rank 0's message does not name rank 2: %s", S->msg[0]);
}

/* ---- a peer that never calls: the timeout bounds the wait ---- */

static int silent_rank(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return record(rank, rc), 1;
    float x[4] = {0};
    if (rank == 1) { /* silent until rank 0 has timed out (TALLY_TIMEOUT=2), 10 s at most */
        th_wait_set(&S->when[0], 10);
    } else {
        rc = tally_allreduce(c, x, x, 4, TALLY_F32, TALLY_SUM);
        record(rank, rc);
    }
    tally_comm_free(c);
    return 0;
}

static void test_timeout(const char *transport) {
    memset(S, 0, sizeof *S);
    th_opts o = {.transport = transport, .timeout_s = 2, .wall_s = 30};
    th_job job;
    double t0 = th_now();
    th_start(&job, 2, &o, silent_rank, NULL);
    th_wait(&job, 30);
    TH_CHECK(S->code[0] == TALLY_E_TIMEOUT, "%s timeout: rank 0 got %s (%s)", transport, tally_strerror(S->code[0]),
             S->msg[0]);
    double took = S->when[0] - t0;
    TH_CHECK(took > 1.5 && took < 4.5, "%s timeout: rank 0 returned after %.2f s with TALLY_TIMEOUT=2", transport,
             took);
    TH_CHECK(strstr(S->msg[0], "allreduce") != NULL, "%s timeout: message does not name the collective: %s", transport,
             S->msg[0]);
}

/* ---- bad arguments are refused locally, and the communicator stays usable ---- */

static int bad_args_rank(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c), bad = 0;
    if (rc) return 1;
    float x[8] = {0};
    bad += tally_allreduce(c, NULL, x, 8, TALLY_F32, TALLY_SUM) != TALLY_E_INVALID;
    bad += tally_allreduce(c, x, NULL, 8, TALLY_F32, TALLY_SUM) != TALLY_E_INVALID;
    bad += tally_allreduce(c, x, x, 8, (tally_dtype)99, TALLY_SUM) != TALLY_E_INVALID;
    bad += tally_allreduce(c, x, x, 8, TALLY_F32, (tally_op)-1) != TALLY_E_INVALID;
    bad += tally_broadcast(c, x, 8, TALLY_F32, n) != TALLY_E_INVALID;
    bad += tally_broadcast(c, x, 8, TALLY_F32, -1) != TALLY_E_INVALID;
    bad += tally_reduce_scatter(c, NULL, x, 1, TALLY_F32, TALLY_SUM) != TALLY_E_INVALID;
    bad += tally_allgather(c, x, NULL, 1, TALLY_F32) != TALLY_E_INVALID;
    bad += tally_allreduce(NULL, x, x, 8, TALLY_F32, TALLY_SUM) != TALLY_E_INVALID;
    bad += strlen(tally_last_error()) == 0;
    bad += tally_allreduce(c, NULL, NULL, 0, TALLY_F32, TALLY_SUM) != 0; /* count 0 needs no buffers */
    for (int i = 0; i < 8; i++) x[i] = (float)rank;
    bad += tally_allreduce(c, x, x, 8, TALLY_F32, TALLY_SUM) != 0;
    bad += x[3] != (float)(n * (n - 1) / 2);
    tally_comm_free(c);
    return bad ? 1 : 0;
}

int main(void) {
    S = th_shared_alloc(sizeof *S);
    const char *transports[] = {"shm", "tcp"};
    for (int i = 0; i < 2 && th_quick(); i++) {
        test_kill(transports[i]);
        test_mismatch(transports[i], "ring");
        test_mismatch(transports[i], "rhd");
        if (i == 0) test_timeout(transports[i]);
        th_opts o = {.transport = transports[i], .wall_s = 30};
        TH_CHECK(th_run(2, &o, bad_args_rank, NULL) == 0, "%s: bad arguments were not all refused", transports[i]);
    }
    if (th_long()) { /* the waits: a timeout over tcp, a wrong token's peers waiting 3 s */
        test_timeout("tcp");
        test_wrong_token();
    }
    TH_CHECK(tally_allreduce(NULL, NULL, NULL, 0, TALLY_F32, TALLY_SUM) == TALLY_E_INVALID, "NULL comm accepted");
    TH_CHECK(strcmp(tally_strerror(TALLY_E_PEER_LOST), tally_strerror(TALLY_E_TIMEOUT)) != 0, "strerror table");
    return th_verdict("test_faults");
}
