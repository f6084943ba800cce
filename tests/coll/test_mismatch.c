/* test_mismatch.c - ranks that disagree (collective, root, count, dtype, op, alltoallv's counts of a pair, a
 * skipped call) fail on every rank with TALLY_E_MISMATCH naming both calls, in that very call: 2-4 ranks, shm
 * and tcp, all sizes, every algorithm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <tally.h>

#include "coll/algo.h"
#include "harness.h"

enum { AR, RS, AG, BC, BAR, RED, GA, SC, A2A, A2AV };
static const char *const coll_names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier",
                                         "reduce",    "gather",         "scatter",   "alltoall",  "alltoallv"};

/* One rank's call: count is the size's base count plus dc; root ROOT_ODD is the disagreeing rank itself. */
#define ROOT_ODD (-1)
typedef struct call {
    int coll, dc;
    tally_dtype t;
    tally_op op;
    int root;
} call;

/* Who disagrees: the last rank, rank 0, rank 1 (on 2 ranks the last one), or the upper half of the ranks. */
enum { ODD_LAST, ODD_FIRST, ODD_SECOND, ODD_HALF };

typedef struct scen {
    const char *name;
    call a, b; /* a: the ranks that agree; b: the odd ones */
    int odd;
    int skip;   /* the others call a barrier first, which the odd rank skips (it calls b at once) */
    int follow; /* a barrier follows the mismatched call (else tally_comm_free does) */
} scen;

#define C(coll, dc, t, op, root)                                                                                       \
    { coll, dc, TALLY_##t, TALLY_##op, root }
#define BCAST(root) C(BC, 0, F32, SUM, root)
#define ARED        C(AR, 0, F32, SUM, 0)
static const scen scens[] = {
    {"broadcast vs allreduce", BCAST(0), ARED, ODD_LAST, 0, 0},
    {"broadcast vs allreduce, middle rank", BCAST(0), ARED, ODD_SECOND, 0, 0},
    {"allreduce vs broadcast by its root", ARED, BCAST(0), ODD_FIRST, 0, 0},
    {"broadcast vs reduce_scatter", BCAST(0), C(RS, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"broadcast vs allgather", BCAST(0), C(AG, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"broadcast vs barrier", BCAST(0), C(BAR, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"barrier vs broadcast by its root", C(BAR, 0, F32, SUM, 0), BCAST(0), ODD_FIRST, 0, 0},
    {"two roots", BCAST(0), BCAST(ROOT_ODD), ODD_LAST, 0, 0},
    {"two roots, then a barrier", BCAST(0), BCAST(ROOT_ODD), ODD_LAST, 0, 1},
    {"root 0 vs root 1", BCAST(0), BCAST(1), ODD_LAST, 0, 0},
    {"broadcast count", BCAST(0), C(BC, 1, F32, SUM, 0), ODD_LAST, 0, 0},
    {"broadcast count at the root", C(BC, 1, F32, SUM, 0), BCAST(0), ODD_FIRST, 0, 0},
    {"broadcast dtype", BCAST(0), C(BC, 0, I32, SUM, 0), ODD_LAST, 0, 0},
    {"broadcast dtype size", BCAST(0), C(BC, 0, F64, SUM, 0), ODD_SECOND, 0, 0},
    {"allreduce op", ARED, C(AR, 0, F32, MAX, 0), ODD_LAST, 0, 0},
    {"allreduce avg vs sum", ARED, C(AR, 0, F32, AVG, 0), ODD_FIRST, 0, 0},
    {"allreduce count", ARED, C(AR, 1, F32, SUM, 0), ODD_LAST, 0, 1},
    {"allreduce dtype", ARED, C(AR, 0, F64, SUM, 0), ODD_LAST, 0, 0},
    {"allreduce vs reduce_scatter", ARED, C(RS, 0, F32, SUM, 0), ODD_FIRST, 0, 0},
    {"allreduce vs allgather", ARED, C(AG, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"allreduce vs barrier", ARED, C(BAR, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"reduce_scatter op", C(RS, 0, I32, SUM, 0), C(RS, 0, I32, MIN, 0), ODD_LAST, 0, 0},
    {"reduce_scatter count", C(RS, 0, F32, SUM, 0), C(RS, 1, F32, SUM, 0), ODD_FIRST, 0, 0},
    {"allgather count", C(AG, 0, F32, SUM, 0), C(AG, 1, F32, SUM, 0), ODD_LAST, 0, 0},
    {"allgather dtype", C(AG, 0, F32, SUM, 0), C(AG, 0, F64, SUM, 0), ODD_FIRST, 0, 0},
    {"allgather vs reduce_scatter", C(AG, 0, F32, SUM, 0), C(RS, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"barrier vs allgather", C(BAR, 0, F32, SUM, 0), C(AG, 0, F32, SUM, 0), ODD_SECOND, 0, 0},
    {"a skipped barrier", C(AR, 0, F32, SUM, 0), C(AR, 0, F32, SUM, 0), ODD_LAST, 1, 0},
    {"a skipped barrier before a broadcast", BCAST(0), BCAST(0), ODD_FIRST, 1, 0},
    {"halves: broadcast vs allreduce", BCAST(0), ARED, ODD_HALF, 0, 0},
    {"halves: two roots", BCAST(0), BCAST(ROOT_ODD), ODD_HALF, 0, 0},
    {"halves: broadcast count", BCAST(0), C(BC, 1, F32, SUM, 0), ODD_HALF, 0, 0},
    {"halves: allreduce vs barrier", ARED, C(BAR, 0, F32, SUM, 0), ODD_HALF, 0, 0},
    {"halves: allreduce count", ARED, C(AR, 1, F32, SUM, 0), ODD_HALF, 0, 0},
    {"halves: allgather vs reduce_scatter", C(AG, 0, F32, SUM, 0), C(RS, 0, F32, SUM, 0), ODD_HALF, 0, 0},
    {"halves: a skipped barrier", ARED, ARED, ODD_HALF, 1, 0},
    /* the rooted collectives and all-to-all, against each other and the others */
    {"gather vs scatter", C(GA, 0, F32, SUM, 0), C(SC, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"scatter vs gather by its root", C(SC, 0, F32, SUM, 0), C(GA, 0, F32, SUM, 0), ODD_FIRST, 0, 0},
    {"reduce vs gather", C(RED, 0, F32, SUM, 0), C(GA, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"reduce vs allreduce", C(RED, 0, F32, SUM, 0), ARED, ODD_SECOND, 0, 0},
    {"allreduce vs reduce by its root", ARED, C(RED, 0, F32, SUM, 0), ODD_FIRST, 0, 0},
    {"reduce vs broadcast", C(RED, 0, F32, SUM, 0), BCAST(0), ODD_LAST, 0, 0},
    {"reduce two roots", C(RED, 0, F32, SUM, 0), C(RED, 0, F32, SUM, ROOT_ODD), ODD_LAST, 0, 1},
    {"reduce op", C(RED, 0, I32, SUM, 0), C(RED, 0, I32, MAX, 0), ODD_SECOND, 0, 0},
    {"reduce count", C(RED, 0, F32, SUM, 0), C(RED, 1, F32, SUM, 0), ODD_LAST, 0, 0},
    {"reduce dtype at the root", C(RED, 0, F32, SUM, 0), C(RED, 0, F64, SUM, 0), ODD_FIRST, 0, 0},
    {"gather two roots", C(GA, 0, F32, SUM, 0), C(GA, 0, F32, SUM, ROOT_ODD), ODD_LAST, 0, 0},
    {"gather count", C(GA, 0, F32, SUM, 0), C(GA, 1, F32, SUM, 0), ODD_LAST, 0, 0},
    {"gather vs allgather", C(GA, 0, F32, SUM, 0), C(AG, 0, F32, SUM, 0), ODD_SECOND, 0, 0},
    {"gather vs barrier", C(GA, 0, F32, SUM, 0), C(BAR, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"scatter two roots", C(SC, 0, F32, SUM, 0), C(SC, 0, F32, SUM, ROOT_ODD), ODD_LAST, 0, 1},
    {"scatter count at the root", C(SC, 1, F32, SUM, 0), C(SC, 0, F32, SUM, 0), ODD_FIRST, 0, 0},
    {"scatter vs broadcast", C(SC, 0, F32, SUM, 0), BCAST(0), ODD_LAST, 0, 0},
    {"scatter vs reduce_scatter", C(SC, 0, F32, SUM, 0), C(RS, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"alltoall vs alltoallv", C(A2A, 0, F32, SUM, 0), C(A2AV, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"alltoall count", C(A2A, 0, F32, SUM, 0), C(A2A, 1, F32, SUM, 0), ODD_SECOND, 0, 1},
    {"alltoall vs allreduce", C(A2A, 0, F32, SUM, 0), ARED, ODD_LAST, 0, 0},
    {"alltoall vs gather", C(A2A, 0, F32, SUM, 0), C(GA, 0, F32, SUM, 0), ODD_FIRST, 0, 0},
    {"alltoallv counts", C(A2AV, 0, F32, SUM, 0), C(A2AV, 1, F32, SUM, 0), ODD_LAST, 0, 1},
    {"alltoallv dtype", C(A2AV, 0, F32, SUM, 0), C(A2AV, 0, I32, SUM, 0), ODD_FIRST, 0, 0},
    {"alltoallv vs barrier", C(A2AV, 0, F32, SUM, 0), C(BAR, 0, F32, SUM, 0), ODD_LAST, 0, 0},
    {"a skipped barrier before a gather", C(GA, 0, F32, SUM, 0), C(GA, 0, F32, SUM, 0), ODD_LAST, 1, 0},
    {"a skipped barrier before a scatter", C(SC, 0, F32, SUM, 0), C(SC, 0, F32, SUM, 0), ODD_FIRST, 1, 0},
    {"a skipped barrier before an alltoall", C(A2A, 0, F32, SUM, 0), C(A2A, 0, F32, SUM, 0), ODD_SECOND, 1, 0},
    {"halves: gather vs scatter", C(GA, 0, F32, SUM, 0), C(SC, 0, F32, SUM, 0), ODD_HALF, 0, 0},
    {"halves: reduce two roots", C(RED, 0, F32, SUM, 0), C(RED, 0, F32, SUM, ROOT_ODD), ODD_HALF, 0, 0},
    {"halves: alltoallv counts", C(A2AV, 0, F32, SUM, 0), C(A2AV, 1, F32, SUM, 0), ODD_HALF, 0, 0},
    {"halves: alltoall vs allreduce", C(A2A, 0, F32, SUM, 0), ARED, ODD_HALF, 0, 0},
};
#define NSCENS (sizeof scens / sizeof *scens)

#define LARGE_COUNT 300000 /* 1.2 MB of f32: shm's single-copy path, tcp's large path, pipelined segments */
static const size_t base_counts[] = {0, 1, 100, LARGE_COUNT};

typedef struct shared_t {
    int rc[TH_MAX_RANKS], next_rc[TH_MAX_RANKS], wrong[TH_MAX_RANKS], free_rc[TH_MAX_RANKS];
    char msg[TH_MAX_RANKS][800];
} shared_t;

static shared_t *S;
static const scen *cur;
static size_t cur_base;

/* The first of the odd ranks (a root that is "the odd rank" is this one), and whether rank is one. */
static int odd_rank(const scen *s, int n) {
    return s->odd == ODD_FIRST ? 0 : s->odd == ODD_SECOND ? 1 : s->odd == ODD_HALF ? n / 2 : n - 1;
}
static int is_odd(const scen *s, int rank, int n) {
    return s->odd == ODD_HALF ? rank >= n / 2 : rank == odd_rank(s, n);
}
static call call_of(const scen *s, int rank, int n) {
    call c = is_odd(s, rank, n) ? s->b : s->a;
    if (c.root == ROOT_ODD) c.root = odd_rank(s, n);
    return c;
}
static size_t count_of(const call *c) { return cur_base + (size_t)c->dc; }

/* Inputs are small integers, exact in every dtype used, so expected results can be computed here. */
static double input(int rank, size_t i) { return (double)((rank + 1) * 3 + (int)(i % 5)); }
static void put(void *buf, tally_dtype t, size_t i, double v) {
    if (t == TALLY_F32)
        ((float *)buf)[i] = (float)v;
    else if (t == TALLY_F64)
        ((double *)buf)[i] = v;
    else
        ((int *)buf)[i] = (int)v;
}
static double get(const void *buf, tally_dtype t, size_t i) {
    return t == TALLY_F32 ? ((const float *)buf)[i] : t == TALLY_F64 ? ((const double *)buf)[i] : ((const int *)buf)[i];
}
static double reduce_all(tally_op op, int n, size_t i) {
    double acc = input(0, i);
    for (int r = 1; r < n; r++) {
        double v = input(r, i);
        acc = op == TALLY_MAX ? (v > acc ? v : acc) : op == TALLY_MIN ? (v < acc ? v : acc) : acc + v;
    }
    return op == TALLY_AVG ? acc / n : acc;
}

/* What this rank's call would have produced had every rank made the same one. */
static double expected(const call *c, int rank, int n, size_t i) {
    size_t count = count_of(c);
    switch (c->coll) {
    case AR:
    case RED: return reduce_all(c->op, n, i);
    case RS: return reduce_all(c->op, n, (size_t)rank * count + i);
    case AG:
    case GA: return input((int)(i / count), i % count);
    case SC: return input(c->root, (size_t)rank * count + i);
    case A2A:
    case A2AV: return input((int)(i / count), (size_t)rank * count + i % count);
    default: return input(c->root, i);
    }
}

/* The elements this rank's call writes (a rooted one's only at its root). */
static size_t out_elems(const call *c, int rank, int n) {
    size_t count = count_of(c);
    switch (c->coll) {
    case BAR: return 0;
    case AG:
    case A2A:
    case A2AV: return (size_t)n * count;
    case RED: return rank == c->root ? count : 0;
    case GA: return rank == c->root ? (size_t)n * count : 0;
    default: return count;
    }
}

static size_t in_elems(const call *c, int n) {
    size_t count = count_of(c);
    return c->coll == RS || c->coll == A2A || c->coll == A2AV || c->coll == SC ? (size_t)n * count : count;
}

/* alltoallv with every pair exchanging count elements, blocks back to back. */
static int uniform_alltoallv(tally_comm *comm, const void *send, void *recv, size_t count, tally_dtype t, int n) {
    size_t counts[TH_MAX_RANKS], displs[TH_MAX_RANKS];
    for (int j = 0; j < n; j++) counts[j] = count, displs[j] = (size_t)j * count;
    return tally_alltoallv(comm, send, counts, displs, recv, counts, displs, t);
}

/* Runs the call; returns its code, and sets *wrong when it returned 0 with a result it should not have. */
static int run_call(tally_comm *comm, const call *c, int rank, int n, void *send, void *recv, int *wrong) {
    size_t count = count_of(c), in = in_elems(c, n), out = out_elems(c, rank, n);
    for (size_t i = 0; i < in; i++) put(send, c->t, i, input(rank, i));
    for (size_t i = 0; i < out; i++) put(recv, c->t, i, -7);
    int rc;
    switch (c->coll) {
    case AR: rc = tally_allreduce(comm, send, recv, count, c->t, c->op); break;
    case RS: rc = tally_reduce_scatter(comm, send, recv, count, c->t, c->op); break;
    case AG: rc = tally_allgather(comm, send, recv, count, c->t); break;
    case BAR: rc = tally_barrier(comm); break;
    case RED: rc = tally_reduce(comm, send, recv, count, c->t, c->op, c->root); break;
    case GA: rc = tally_gather(comm, send, recv, count, c->t, c->root); break;
    case SC: rc = tally_scatter(comm, send, recv, count, c->t, c->root); break;
    case A2A: rc = tally_alltoall(comm, send, recv, count, c->t); break;
    case A2AV: rc = uniform_alltoallv(comm, send, recv, count, c->t, n); break;
    default:
        if (rank == c->root) memcpy(recv, send, count * tally_dtype_size(c->t));
        rc = tally_broadcast(comm, recv, count, c->t, c->root);
    }
    for (size_t i = 0; rc == 0 && i < out && !*wrong; i++) *wrong = get(recv, c->t, i) != expected(c, rank, n, i);
    return rc;
}

static int mismatch_rank(int rank, int n, void *arg) {
    (void)arg;
    tally_comm *comm;
    int rc = tally_comm_init(&comm);
    if (rc) {
        snprintf(S->msg[rank], sizeof S->msg[rank], "init: %s", tally_last_error());
        return 1;
    }
    size_t cap = ((size_t)n * (cur_base + 1) + 8) * sizeof(double);
    void *send = calloc(1, cap), *recv = calloc(1, cap);
    if (!send || !recv) {
        snprintf(S->msg[rank], sizeof S->msg[rank], "no memory for %zu bytes", cap);
        return 1;
    }
    float warm = 1;
    call c = call_of(cur, rank, n);
    int wrong = 0;
    rc = tally_allreduce(comm, &warm, &warm, 1, TALLY_F32, TALLY_SUM); /* #1 agrees everywhere */
    if (!rc && cur->skip && !is_odd(cur, rank, n)) rc = tally_barrier(comm);
    if (!rc) rc = run_call(comm, &c, rank, n, send, recv, &wrong);
    S->rc[rank] = rc;
    S->wrong[rank] = wrong;
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", rc ? tally_last_error() : "");
    if (cur->follow) S->next_rc[rank] = tally_barrier(comm);
    S->free_rc[rank] = tally_comm_free(comm);
    free(send);
    free(recv);
    return 0;
}

/* The text tally gives a call's fingerprint, up to the algorithm: "broadcast #2 (count 100, f32, root 0". */
static void sig_text(const call *c, int seq, char *buf, size_t len) {
    size_t count = count_of(c);
    const char *t = tally_dtype_name(c->t), *op = tally_op_name(c->op), *name = coll_names[c->coll];
    if (c->coll == BAR)
        snprintf(buf, len, "barrier #%d", seq);
    else if (c->coll == BC || c->coll == GA || c->coll == SC)
        snprintf(buf, len, "%s #%d (count %zu, %s, root %d", name, seq, count, t, c->root);
    else if (c->coll == RED)
        snprintf(buf, len, "reduce #%d (count %zu, %s, %s, root %d", seq, count, t, op, c->root);
    else if (c->coll == AG || c->coll == A2A)
        snprintf(buf, len, "%s #%d (count %zu, %s", name, seq, count, t);
    else if (c->coll == A2AV)
        snprintf(buf, len, "alltoallv #%d (%s", seq, t);
    else
        snprintf(buf, len, "%s #%d (count %zu, %s, %s", name, seq, count, t, op);
}

static void large_env(int rank, void *arg) {
    (void)rank;
    (void)arg;
    setenv("TALLY_SHM_LARGE", "64K", 1); /* single-copy whatever the calibration says */
}

static int jobs, failed_jobs;

/* Whether TALLY_ALGO=algo changes what either call of s runs (an algorithm without a collective leaves it
 * to the model). */
static int forces(int algo, const scen *s) {
    static const int kinds[] = {TALLY__ALLREDUCE, TALLY__REDUCE_SCATTER, TALLY__ALLGATHER, TALLY__BROADCAST,
                                TALLY__BARRIER,   TALLY__REDUCE,         TALLY__GATHER,    TALLY__SCATTER,
                                TALLY__ALLTOALL,  TALLY__ALLTOALLV};
    const tally__algo_desc *d = tally__algo_get(algo);
    int skip = s->skip && tally__algo_has(d, TALLY__BARRIER);
    return skip || tally__algo_has(d, kinds[s->a.coll]) || tally__algo_has(d, kinds[s->b.coll]);
}

static void run_one(int n, const char *tp, const char *algo, size_t base, const scen *s) {
    cur = s;
    cur_base = base;
    memset(S, 0, sizeof *S);
    th_opts o = {.transport = tp,
                 .algo = algo,
                 .timeout_s = 20,
                 .wall_s = 40,
                 .child_env = base >= LARGE_COUNT ? large_env : NULL};
    th_job job;
    int before = th_failed;
    jobs++;
    if (th_start(&job, n, &o, mismatch_rank, NULL)) {
        TH_CHECK(0, "fork failed");
        return;
    }
    th_wait(&job, o.wall_s);
    char what[200], sa[160], sb[160];
    snprintf(what, sizeof what, "%s n=%d %s count %zu, %s", tp, n, algo ? algo : "auto", base, s->name);
    int odd = odd_rank(s, n), seq = 2;
    call a = call_of(s, odd == 0 ? 1 : 0, n), b = call_of(s, odd, n);
    sig_text(s->skip ? &(call){BAR, 0, TALLY_F32, TALLY_SUM, 0} : &a, seq, sa, sizeof sa);
    sig_text(&b, seq, sb, sizeof sb);
    /* alltoallv's counts of a pair: both named, as "... is 100 but ... is 101" */
    int vcounts = a.coll == A2AV && b.coll == A2AV && a.dc != b.dc;
    char ca[48], cb[48];
    snprintf(ca, sizeof ca, "is %zu", count_of(&a));
    snprintf(cb, sizeof cb, "is %zu", count_of(&b));
    for (int r = 0; r < n; r++) {
        TH_CHECK(!job.killed_by_harness[r], "%s: rank %d hung", what, r);
        TH_CHECK(WIFEXITED(job.status[r]) && WEXITSTATUS(job.status[r]) == 0, "%s: rank %d did not exit 0 (%s)", what,
                 r, S->msg[r]);
        TH_CHECK(S->rc[r] == TALLY_E_MISMATCH, "%s: rank %d returned %d (%s), want TALLY_E_MISMATCH", what, r, S->rc[r],
                 S->rc[r] ? S->msg[r] : "success");
        TH_CHECK(!S->wrong[r], "%s: rank %d returned 0 with wrong data", what, r);
        TH_CHECK(!S->rc[r] || (strstr(S->msg[r], sa) && strstr(S->msg[r], sb)),
                 "%s: rank %d's message does not name both \"%s\" and \"%s\": %s", what, r, sa, sb, S->msg[r]);
        TH_CHECK(!S->rc[r] || !vcounts || (strstr(S->msg[r], ca) && strstr(S->msg[r], cb)),
                 "%s: rank %d's message does not name both counts (\"%s\", \"%s\"): %s", what, r, ca, cb, S->msg[r]);
        TH_CHECK(!s->follow || S->next_rc[r] == TALLY_E_MISMATCH, "%s: rank %d's next call returned %d", what, r,
                 S->next_rc[r]);
        TH_CHECK(S->free_rc[r] == 0, "%s: rank %d's tally_comm_free returned %d", what, r, S->free_rc[r]);
    }
    failed_jobs += th_failed != before;
}

/* ---- a rank that frees the communicator instead of making the call its peers make ---- */

static int linger_s;

static int left_rank(int rank, int n, void *arg) {
    (void)arg;
    tally_comm *comm;
    float warm = 1;
    int rc = tally_comm_init(&comm);
    if (!rc) rc = tally_allreduce(comm, &warm, &warm, 1, TALLY_F32, TALLY_SUM);
    if (!rc && rank != n - 1) rc = tally_barrier(comm);
    S->rc[rank] = rc;
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", rc ? tally_last_error() : "");
    S->free_rc[rank] = tally_comm_free(comm);
    if (rank == n - 1) sleep((unsigned)linger_s); /* alive but gone from the communicator */
    return 0;
}

/* Not a mismatch the library can see (free waits for nobody): the peers are told the rank left. */
static void test_left_early(int n, const char *tp, int linger) {
    linger_s = linger;
    memset(S, 0, sizeof *S);
    th_opts o = {.transport = tp, .timeout_s = 20, .wall_s = 40};
    th_job job;
    if (th_start(&job, n, &o, left_rank, NULL)) {
        TH_CHECK(0, "fork failed");
        return;
    }
    th_wait(&job, o.wall_s);
    char who[32];
    snprintf(who, sizeof who, "rank %d", n - 1);
    TH_CHECK(S->rc[n - 1] == 0 && S->free_rc[n - 1] == 0, "%s n=%d: the rank that left got %d, free %d", tp, n,
             S->rc[n - 1], S->free_rc[n - 1]);
    for (int r = 0; r < n - 1; r++) {
        TH_CHECK(!job.killed_by_harness[r], "%s n=%d left early: rank %d hung", tp, n, r);
        TH_CHECK(S->rc[r] == TALLY_E_PEER_LOST && strstr(S->msg[r], who),
                 "%s n=%d, rank %d left early (%d s): "
                 "rank %d got %d (%s), want TALLY_E_PEER_LOST naming it",
                 tp, n, n - 1, linger, r, S->rc[r], S->msg[r]);
    }
}

int main(int argc, char **argv) {
    S = th_shared_alloc(sizeof *S);
    const char *tps[] = {"shm", "tcp"};
    const char *only = argc > 1 ? argv[1] : NULL; /* a scenario name to run alone, for debugging */
    int light = th_light();
    for (int n = 2; n <= 4; n++)
        for (int k = 0; k < 2; k++)
            for (int a = TALLY__ALGO_AUTO; a <= tally__algo_count(); a++) /* the model's choice, then each */
                for (size_t z = 0; z < sizeof base_counts / sizeof *base_counts; z++) {
                    size_t base = base_counts[z];
                    const char *algo = a == TALLY__ALGO_AUTO ? NULL : tally__algo_name(a);
                    /* Every size under auto; every algorithm at a small size, and large on 3 ranks. */
                    if (algo && base != 100 && !(base == LARGE_COUNT && n == 3)) continue;
                    if (light && base == LARGE_COUNT && (n != 3 || algo)) continue;
                    /* The sanitizer pass: every algorithm on 3 ranks, auto on the others (the paths are alike). */
                    if (light && algo && n != 3) continue;
                    /* The quick tier: every kind of disagreement on 3 ranks, the algorithm chosen, 100 elements
                     * (those of the rooted collectives and all-to-all over shm; tcp's in the long tier). */
                    int quick_run = n == 3 && !algo && base == 100;
                    for (size_t i = 0; i < NSCENS; i++) {
                        const scen *s = &scens[i];
                        int old = s->a.coll < RED && s->b.coll < RED, quick = quick_run && (k == 0 || old);
                        if (!(quick ? th_quick() : th_long()) || (only && !strstr(s->name, only))) continue;
                        if (algo && !forces(a, s)) continue; /* both calls the model's: auto's case */
                        /* the rooted ones and all-to-all: each algorithm on 3 ranks at 100 elements */
                        if (algo && !old && (n != 3 || base != 100)) continue;
                        run_one(n, tps[k], algo, base, s);
                    }
                }
    for (int n = 2; n <= 4 && (!only || strstr("left early", only)); n++)
        for (int k = 0; k < 2; k++) {
            if (n == 3 ? th_quick() : th_long()) test_left_early(n, tps[k], 0);
            if (n == 3 && th_long()) test_left_early(n, tps[k], 2); /* waits 2 s */
        }
    printf("test_mismatch: %d jobs, %d with failures\n", jobs, failed_jobs);
    return th_verdict("test_mismatch");
}
