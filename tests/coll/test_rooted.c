/* test_rooted.c - reduce, gather, scatter, alltoall and alltoallv through the public API in real processes:
 * every algorithm that has each forced in turn and the model's choice, every root, counts 0, 1, odd, not
 * divisible by the ranks and large, f32/f64/i32/u8, sum/max/prod/min/avg, 2-4 ranks over shm and tcp, each
 * result checked exactly against a reference computed here; the non-blocking forms interleaved with
 * allreduce; one rank; bad arguments refused by name. */
#include <malloc.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <unistd.h>

#include "coll/algo.h"
#include "core/numeric/copy.h"
#include "core/numeric/dtype.h"
#include "harness.h"

typedef struct shared {
    int failures;
    char first[700];
} shared;

static shared *S;

static void failf(int rank, const char *fmt, ...) {
    if (__sync_fetch_and_add(&S->failures, 1) != 0) return;
    int k = snprintf(S->first, sizeof S->first, "rank %d: ", rank);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(S->first + k, sizeof S->first - (size_t)k, fmt, ap);
    va_end(ap);
}

static int check_rc(int rank, const char *what, int rc) {
    if (rc) failf(rank, "%s returned %s: %s", what, tally_strerror(rc), tally_last_error());
    return rc;
}

static const tally_dtype dtypes[] = {TALLY_F32, TALLY_F64, TALLY_I32, TALLY_U8};
static const tally_op ops[] = {TALLY_SUM, TALLY_MAX, TALLY_PROD, TALLY_MIN, TALLY_AVG};
#define NDTYPES (int)(sizeof dtypes / sizeof *dtypes)
#define NOPS    (int)(sizeof ops / sizeof *ops)

static int is_float(tally_dtype t) { return t == TALLY_F32 || t == TALLY_F64; }

/* A value as dtype t holds it (u8 wraps negatives). */
static double as_dtype(double v, tally_dtype t) {
    char tmp[8] = {0};
    if (t == TALLY_U8) v = (double)(uint8_t)(int64_t)v;
    tally__dtype_store(tmp, 0, t, v);
    return tally__dtype_load(tmp, 0, t);
}

/* ---- reduce: small integers, so every order of reduction gives the same exact result ---- */

#define PERIOD 33 /* input() repeats with this period (11 and 3) */

static double input(int rank, size_t i, tally_op op) {
    if (op == TALLY_PROD) return (double)(1 + ((rank + i) % 3 == 0)); /* 1 or 2: 2^4 at most */
    return (double)((int)((rank * 7 + i * 3) % 11) - 3);              /* -3..7 */
}

static double reduced(int n, size_t i, tally_dtype t, tally_op op) {
    double acc = as_dtype(input(0, i, op), t);
    for (int r = 1; r < n; r++) {
        double v = as_dtype(input(r, i, op), t);
        acc = op == TALLY_PROD  ? acc * v
              : op == TALLY_MIN ? (v < acc ? v : acc)
              : op == TALLY_MAX ? (v > acc ? v : acc)
                                : acc + v;
    }
    acc = as_dtype(acc, t);
    if (op == TALLY_AVG)
        acc = is_float(t) ? (t == TALLY_F64 ? acc / n : (double)((float)acc / (float)n)) : (double)((int64_t)acc / n);
    return as_dtype(acc, t);
}

static void fill_input(void *buf, int rank, size_t count, tally_dtype t, tally_op op) {
    double v[PERIOD];
    for (size_t i = 0; i < PERIOD; i++) v[i] = as_dtype(input(rank, i, op), t);
    for (size_t i = 0; i < count; i++) tally__dtype_store(buf, i, t, v[i % PERIOD]);
}

/* The root's result against the reference, the first wrong element reported. */
static void expect_reduced(int rank, int n, const void *got, size_t count, tally_dtype t, tally_op op,
                           const char *what) {
    double want[PERIOD];
    for (size_t i = 0; i < PERIOD; i++) want[i] = reduced(n, i, t, op);
    for (size_t i = 0; i < count; i++) {
        double g = tally__dtype_load(got, i, t);
        if (g != want[i % PERIOD]) {
            failf(rank, "%s %s/%s count %zu: element %zu is %g, expected %g", what, tally_dtype_name(t),
                  tally_op_name(op), count, i, g, want[i % PERIOD]);
            return;
        }
    }
}

static void check_reduce(tally_comm *c, tally_dtype t, tally_op op, size_t count, int root, int in_place) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c), me = rank == root;
    size_t es = tally_dtype_size(t);
    char *send = malloc(count * es + 1), *recv = me ? (in_place ? send : malloc(count * es + 1)) : NULL;
    fill_input(send, rank, count, t, op);
    /* recv NULL off the root: it must not be touched there */
    if (check_rc(rank, "reduce", tally_reduce(c, send, recv, count, t, op, root)) == 0 && me)
        expect_reduced(rank, n, recv, count, t, op, in_place ? "reduce in place" : "reduce");
    if (recv != send) free(recv);
    free(send);
}

/* ---- gather, scatter, alltoall: element k of the block rank `from` sends rank `to` ---- */

static double piece(int from, int to, size_t k) { return (double)((from * 5 + to * 3 + (int)(k % 89)) % 97); }

static void fill_block(void *buf, size_t at, int from, int to, size_t count, tally_dtype t) {
    for (size_t k = 0; k < count; k++) tally__dtype_store(buf, at + k, t, piece(from, to, k));
}

/* 1 when the count elements at element `at` of buf are the block from -> to; else reports. */
static int expect_block(int rank, const void *buf, size_t at, int from, int to, size_t count, tally_dtype t,
                        const char *what) {
    for (size_t k = 0; k < count; k++) {
        double g = tally__dtype_load(buf, at + k, t), w = piece(from, to, k);
        if (g != w) {
            failf(rank, "%s %s count %zu: element %zu of the block from rank %d to rank %d is %g, expected %g", what,
                  tally_dtype_name(t), count, k, from, to, g, w);
            return 0;
        }
    }
    return 1;
}

static void check_gather(tally_comm *c, tally_dtype t, size_t count, int root) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size(t), total = (size_t)n * count;
    char *send = malloc(count * es + 1), *recv = rank == root ? malloc(total * es + 1) : NULL;
    fill_block(send, 0, rank, root, count, t);
    if (recv) memset(recv, 0xA5, total * es);
    if (check_rc(rank, "gather", tally_gather(c, send, recv, count, t, root)) == 0 && recv)
        for (int q = 0; q < n && expect_block(rank, recv, (size_t)q * count, q, root, count, t, "gather"); q++) {}
    free(send);
    free(recv);
}

static void check_scatter(tally_comm *c, tally_dtype t, size_t count, int root) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size(t);
    char *send = rank == root ? malloc((size_t)n * count * es + 1) : NULL, *recv = malloc(count * es + 1);
    for (int q = 0; send && q < n; q++) fill_block(send, (size_t)q * count, root, q, count, t);
    memset(recv, 0xA5, count * es);
    if (check_rc(rank, "scatter", tally_scatter(c, send, recv, count, t, root)) == 0)
        expect_block(rank, recv, 0, root, rank, count, t, "scatter");
    free(send);
    free(recv);
}

static void check_alltoall(tally_comm *c, tally_dtype t, size_t count, int in_place) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size(t), total = (size_t)n * count;
    char *send = malloc(total * es + 1), *recv = in_place ? send : malloc(total * es + 1);
    for (int q = 0; q < n; q++) fill_block(send, (size_t)q * count, rank, q, count, t);
    if (!in_place) memset(recv, 0xA5, total * es);
    const char *what = in_place ? "alltoall in place" : "alltoall";
    if (check_rc(rank, what, tally_alltoall(c, send, recv, count, t)) == 0)
        for (int q = 0; q < n && expect_block(rank, recv, (size_t)q * count, q, rank, count, t, what); q++) {}
    if (recv != send) free(recv);
    free(send);
}

/* ---- alltoallv: uneven counts, some 0, blocks laid out with gaps (and received in reverse order) ---- */

static size_t vcount(int from, int to, size_t scale) { return (size_t)((from * 3 + to * 5 + 1) % 4) * scale; }

typedef struct vlayout {
    size_t sc[TH_MAX_RANKS], sd[TH_MAX_RANKS], rc[TH_MAX_RANKS], rd[TH_MAX_RANKS];
    size_t stotal, rtotal; /* elements, gaps included */
} vlayout;

static void vlayout_of(vlayout *v, int rank, int n, size_t scale) {
    v->stotal = v->rtotal = 0;
    for (int j = 0; j < n; j++) { /* a gap of one element before each block */
        v->sc[j] = vcount(rank, j, scale);
        v->sd[j] = v->stotal + 1;
        v->stotal += v->sc[j] + 1;
    }
    for (int i = n - 1; i >= 0; i--) {
        v->rc[i] = vcount(i, rank, scale);
        v->rd[i] = v->rtotal + 1;
        v->rtotal += v->rc[i] + 1;
    }
}

static int expect_gaps(int rank, const char *recv, const vlayout *v, size_t es) {
    for (int i = 0; i < TH_MAX_RANKS && v->rd[i]; i++)
        for (size_t b = 0; b < es; b++)
            if ((unsigned char)recv[(v->rd[i] - 1) * es + b] != 0xA5) {
                failf(rank, "alltoallv wrote the gap before rank %d's block", i);
                return 0;
            }
    return 1;
}

static void check_alltoallv(tally_comm *c, tally_dtype t, size_t scale) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size(t);
    vlayout v = {0};
    vlayout_of(&v, rank, n, scale);
    char *send = malloc(v.stotal * es + 1), *recv = malloc(v.rtotal * es + 1);
    for (int j = 0; j < n; j++) fill_block(send, v.sd[j], rank, j, v.sc[j], t);
    memset(recv, 0xA5, v.rtotal * es);
    if (check_rc(rank, "alltoallv", tally_alltoallv(c, send, v.sc, v.sd, recv, v.rc, v.rd, t)) == 0) {
        int ok = expect_gaps(rank, recv, &v, es);
        for (int i = 0; ok && i < n; i++) ok = expect_block(rank, recv, v.rd[i], i, rank, v.rc[i], t, "alltoallv");
    }
    free(send);
    free(recv);
}

/* ---- the sweeps ---- */

typedef struct sweep {
    int algo; /* forced (the collectives it has), or TALLY__ALGO_AUTO (all of them) */
} sweep;

static int runs(const sweep *w, int coll) {
    return w->algo == TALLY__ALGO_AUTO || tally__algo_has(tally__algo_get(w->algo), coll);
}

/* The large count (a few MiB of f32, a tenth in the quick tier) for f32 and i32 only, at one root. */
static void sweep_reduce(tally_comm *c, const size_t *counts, int nc) {
    int n = tally_comm_size(c);
    for (int ci = 0; ci < nc; ci++)
        for (int ti = 0; ti < NDTYPES; ti++)
            for (int oi = 0; oi < NOPS && !S->failures; oi++) {
                int big = ci == nc - 1;
                if (big && (ti > 0 || (oi != 0 && oi != 4)) && !(ti == 2 && oi == 1)) continue;
                for (int root = 0; root < n && !S->failures; root++) {
                    if (big && root != n - 1) continue;
                    check_reduce(c, dtypes[ti], ops[oi], counts[ci], root, (root + ci + oi) % 2);
                }
            }
}

static void sweep_rooted(tally_comm *c, const size_t *counts, int nc, int gather) {
    int n = tally_comm_size(c);
    for (int ci = 0; ci < nc; ci++)
        for (int ti = 0; ti < NDTYPES && !S->failures; ti++) {
            int big = ci == nc - 1;
            if (big && ti != 0 && ti != 2) continue;
            size_t count = big ? counts[ci] / (size_t)n : counts[ci];
            for (int root = 0; root < n && !S->failures; root++) {
                if (big && root != 0 && root != n - 1) continue;
                if (gather)
                    check_gather(c, dtypes[ti], count, root);
                else
                    check_scatter(c, dtypes[ti], count, root);
            }
        }
}

static void sweep_alltoall(tally_comm *c, const size_t *counts, int nc) {
    int n = tally_comm_size(c);
    for (int ci = 0; ci < nc; ci++)
        for (int ti = 0; ti < NDTYPES && !S->failures; ti++) {
            int big = ci == nc - 1;
            if (big && ti != 0 && ti != 2) continue;
            for (int ip = 0; ip < 2 && !S->failures; ip++)
                check_alltoall(c, dtypes[ti], big ? counts[ci] / (size_t)n : counts[ci], ip);
        }
}

static int rank_sweep(int rank, int n, void *arg) {
    const sweep *w = arg;
    tally_comm *c;
    if (check_rc(rank, "tally_comm_init", tally_comm_init(&c))) return 1;
    size_t large = th_long() ? 1000003 : 100003;
    if (th_light()) large = 30011;
    const size_t counts[] = {0, 1, 7, 2 * (size_t)n + 1, large};
    const int nc = sizeof counts / sizeof *counts;
    if (runs(w, TALLY__REDUCE)) sweep_reduce(c, counts, nc);
    if (runs(w, TALLY__GATHER)) sweep_rooted(c, counts, nc, 1);
    if (runs(w, TALLY__SCATTER)) sweep_rooted(c, counts, nc, 0);
    if (runs(w, TALLY__ALLTOALL)) sweep_alltoall(c, counts, nc);
    static const size_t scales[] = {0, 1, 3, 40000};
    for (int si = 0; si < 4 && runs(w, TALLY__ALLTOALLV); si++)
        for (int ti = 0; ti < NDTYPES && !S->failures; ti++)
            if (si < 3 || ti == 0) check_alltoallv(c, dtypes[ti], scales[si]);
    if (th_long() && !th_light() && n == 2) { /* own blocks past the streaming copy's floor, at odd offsets */
        size_t big = TALLY__COPY_STREAM_MIN / sizeof(float) + 3;
        if (runs(w, TALLY__GATHER)) check_gather(c, TALLY_F32, big, 1);
        if (runs(w, TALLY__SCATTER)) check_scatter(c, TALLY_F32, big, 0);
        if (runs(w, TALLY__ALLTOALL)) check_alltoall(c, TALLY_F32, big, 0);
    }
    check_rc(rank, "tally_comm_free", tally_comm_free(c));
    return S->failures ? 1 : 0;
}

/* ---- the non-blocking forms, interleaved with allreduce ---- */

enum { A_AR1, A_RED, A_AR2, A_GA, A_SC, A_A2A, A_A2AV, A_AR3, A_N };

static int rank_async(int rank, int n, void *arg) {
    tally_comm *c;
    if (check_rc(rank, "tally_comm_init", tally_comm_init(&c))) return 1;
    size_t m = 1001, es = sizeof(float);
    float *ar[3], *ar_out[3];
    for (int k = 0; k < 3; k++) {
        ar[k] = malloc(m * es);
        ar_out[k] = malloc(m * es);
        fill_input(ar[k], rank, m, TALLY_F32, TALLY_SUM);
    }
    float *red = malloc(m * es), *red_out = rank == n - 1 ? malloc(m * es) : NULL;
    fill_input(red, rank, m, TALLY_F32, TALLY_MAX);
    float *ga = malloc(m * es), *ga_out = rank == 0 ? malloc((size_t)n * m * es) : NULL;
    fill_block(ga, 0, rank, 0, m, TALLY_F32);
    int sroot = 1 % n;
    float *sc = rank == sroot ? malloc((size_t)n * m * es) : NULL, *sc_out = malloc(m * es);
    for (int q = 0; sc && q < n; q++) fill_block(sc, (size_t)q * m, sroot, q, m, TALLY_F32);
    float *a2a = malloc((size_t)n * m * es);
    for (int q = 0; q < n; q++) fill_block(a2a, (size_t)q * m, rank, q, m, TALLY_F32);
    vlayout v = {0}, scribble;
    vlayout_of(&v, rank, n, 7);
    float *vs = malloc(v.stotal * es + 1), *vr = malloc(v.rtotal * es + 1);
    for (int j = 0; j < n; j++) fill_block(vs, v.sd[j], rank, j, v.sc[j], TALLY_F32);
    memset(vr, 0xA5, v.rtotal * es);
    tally_request *q[A_N] = {0};
    int rc = 0;
    rc |= tally_iallreduce(c, ar[0], ar_out[0], m, TALLY_F32, TALLY_SUM, &q[A_AR1]);
    rc |= tally_ireduce(c, red, red_out, m, TALLY_F32, TALLY_MAX, n - 1, &q[A_RED]);
    rc |= tally_iallreduce(c, ar[1], ar_out[1], m, TALLY_F32, TALLY_SUM, &q[A_AR2]);
    rc |= tally_igather(c, ga, ga_out, m, TALLY_F32, 0, &q[A_GA]);
    rc |= tally_iscatter(c, sc, sc_out, m, TALLY_F32, sroot, &q[A_SC]);
    rc |= tally_ialltoall(c, a2a, a2a, m, TALLY_F32, &q[A_A2A]);
    scribble = v;
    rc |= tally_ialltoallv(c, vs, scribble.sc, scribble.sd, vr, scribble.rc, scribble.rd, TALLY_F32, &q[A_A2AV]);
    memset(&scribble, 0xFF, sizeof scribble); /* the request copied the arrays */
    /* a blocking allreduce between: it runs behind the pending requests, in the order every rank posted */
    if (!rc)
        rc = check_rc(rank, "allreduce behind requests", tally_allreduce(c, ar[2], ar_out[2], m, TALLY_F32, TALLY_SUM));
    check_rc(rank, "posting", rc);
    for (int k = A_N - 1; k >= 0 && !rc; k--)
        if (q[k]) check_rc(rank, "tally_wait", tally_wait(q[k]));
    if (!S->failures) {
        for (int k = 0; k < 3; k++) expect_reduced(rank, n, ar_out[k], m, TALLY_F32, TALLY_SUM, "iallreduce");
        if (red_out) expect_reduced(rank, n, red_out, m, TALLY_F32, TALLY_MAX, "ireduce");
        for (int p = 0; ga_out && p < n; p++) expect_block(rank, ga_out, (size_t)p * m, p, 0, m, TALLY_F32, "igather");
        expect_block(rank, sc_out, 0, sroot, rank, m, TALLY_F32, "iscatter");
        for (int p = 0; p < n; p++) expect_block(rank, a2a, (size_t)p * m, p, rank, m, TALLY_F32, "ialltoall");
        int ok = expect_gaps(rank, (const char *)vr, &v, es);
        for (int i = 0; ok && i < n; i++)
            ok = expect_block(rank, vr, v.rd[i], i, rank, v.rc[i], TALLY_F32, "ialltoallv");
    }
    for (int k = 0; k < A_N; k++) tally_request_free(q[k]);
    check_rc(rank, "tally_comm_free", tally_comm_free(c));
    for (int k = 0; k < 3; k++) free(ar[k]), free(ar_out[k]);
    free(red), free(red_out), free(ga), free(ga_out), free(sc), free(sc_out), free(a2a), free(vs), free(vr);
    return S->failures ? 1 : 0;
}

/* ---- arguments, and one rank ---- */

/* Every rank makes the same bad call: each is refused before any message, naming what is wrong, and the
 * communicator goes on working. */
static void expect_invalid(int rank, int rc, const char *what, const char *names) {
    if (rc != TALLY_E_INVALID || !strstr(tally_last_error(), names))
        failf(rank, "%s: got %d (%s), want TALLY_E_INVALID naming \"%s\"", what, rc, tally_last_error(), names);
}

static int rank_args(int rank, int n, void *arg) {
    tally_comm *c;
    if (check_rc(rank, "tally_comm_init", tally_comm_init(&c))) return 1;
    float buf[64] = {0}, out[64];
    size_t ones[TH_MAX_RANKS], zeros[TH_MAX_RANKS] = {0}, at[TH_MAX_RANKS];
    for (int j = 0; j < n; j++) ones[j] = 1, at[j] = (size_t)j;
    expect_invalid(rank, tally_reduce(c, buf, out, 4, TALLY_F32, TALLY_SUM, n), "reduce root n", "root");
    expect_invalid(rank, tally_gather(c, buf, out, 4, TALLY_F32, -1), "gather root -1", "root");
    expect_invalid(rank, tally_reduce(c, NULL, out, 4, TALLY_F32, TALLY_SUM, 0), "reduce send NULL", "send");
    expect_invalid(rank, tally_gather(c, buf, NULL, 4, TALLY_F32, rank), "gather recv NULL at root", "recv");
    expect_invalid(rank, tally_scatter(c, NULL, out, 4, TALLY_F32, rank), "scatter send NULL at root", "send");
    expect_invalid(rank, tally_alltoall(c, buf, NULL, 4, TALLY_F32), "alltoall recv NULL", "recv");
    expect_invalid(rank, tally_reduce(c, buf, out, 4, (tally_dtype)99, TALLY_SUM, 0), "reduce dtype", "dtype");
    expect_invalid(rank, tally_alltoallv(c, buf, NULL, at, out, ones, at, TALLY_F32), "sendcounts NULL", "sendcounts");
    expect_invalid(rank, tally_alltoallv(c, buf, ones, at, out, ones, NULL, TALLY_F32), "rdispls NULL", "rdispls");
    expect_invalid(rank, tally_alltoallv(c, NULL, ones, at, out, ones, at, TALLY_F32), "alltoallv send NULL", "send");
    expect_invalid(rank, tally_alltoallv(c, buf, ones, at, buf + 1, ones, at, TALLY_F32), "alltoallv overlap",
                   "overlap");
    /* NULL where nothing is read: off the root, and alltoallv with every count 0 */
    float one = (float)rank, got[TH_MAX_RANKS];
    check_rc(rank, "reduce recv NULL off the root",
             tally_reduce(c, &one, rank == 0 ? got : NULL, 1, TALLY_F32, TALLY_SUM, 0));
    check_rc(rank, "gather recv NULL off the root", tally_gather(c, &one, rank == 0 ? got : NULL, 1, TALLY_F32, 0));
    if (rank == 0 && got[n - 1] != (float)(n - 1)) failf(rank, "gather after refused calls: %g", got[n - 1]);
    check_rc(rank, "scatter send NULL off the root", tally_scatter(c, rank == 0 ? got : NULL, &one, 1, TALLY_F32, 0));
    check_rc(rank, "alltoallv of nothing", tally_alltoallv(c, NULL, zeros, zeros, NULL, zeros, zeros, TALLY_F32));
    check_rc(rank, "tally_comm_free", tally_comm_free(c));
    return S->failures ? 1 : 0;
}

/* ---- a rank that dies before the call: its peers fail with TALLY_E_PEER_LOST naming it ---- */

typedef struct deaths {
    int rc[TH_MAX_RANKS];
    char msg[TH_MAX_RANKS][600];
    int warm; /* ranks past the warm-up allreduce */
} deaths;

static deaths *D;

static int rank_dies(int rank, int n, void *arg) {
    int coll = *(const int *)arg, last = n - 1;
    tally_comm *c;
    if (check_rc(rank, "tally_comm_init", tally_comm_init(&c))) return 1;
    float warm = 1, buf[64] = {0}, out[64 * TH_MAX_RANKS];
    size_t ones[TH_MAX_RANKS], at[TH_MAX_RANKS];
    for (int j = 0; j < n; j++) ones[j] = 1, at[j] = (size_t)j;
    if (check_rc(rank, "allreduce", tally_allreduce(c, &warm, &warm, 1, TALLY_F32, TALLY_SUM))) return 1;
    __atomic_add_fetch(&D->warm, 1, __ATOMIC_SEQ_CST);
    if (rank == last) { /* gone without a goodbye, once the others are out of the warm-up (else it fails them) */
        for (double t0 = th_now(); __atomic_load_n(&D->warm, __ATOMIC_SEQ_CST) < n && th_now() - t0 < 10;) usleep(100);
        _exit(0);
    }
    int rc;
    switch (coll) {
    case TALLY__REDUCE: rc = tally_reduce(c, buf, out, 64, TALLY_F32, TALLY_SUM, 0); break;
    case TALLY__GATHER: rc = tally_gather(c, buf, out, 64, TALLY_F32, 0); break;
    case TALLY__SCATTER: rc = tally_scatter(c, out, buf, 64, TALLY_F32, last); break; /* from the dead root */
    case TALLY__ALLTOALL: rc = tally_alltoall(c, out, out, 64, TALLY_F32); break;
    default: rc = tally_alltoallv(c, buf, ones, at, out, ones, at, TALLY_F32);
    }
    D->rc[rank] = rc;
    snprintf(D->msg[rank], sizeof D->msg[rank], "%s", tally_last_error());
    tally_comm_free(c);
    return 0;
}

static void run_deaths(const char *tp) {
    static const int colls[] = {TALLY__REDUCE, TALLY__GATHER, TALLY__SCATTER, TALLY__ALLTOALL, TALLY__ALLTOALLV};
    const int n = 3;
    char who[32];
    snprintf(who, sizeof who, "rank %d", n - 1);
    for (int k = 0; k < 5; k++) {
        memset(S, 0, sizeof *S);
        memset(D, 0, sizeof *D);
        th_opts o = {.transport = tp, .timeout_s = 20, .wall_s = 60};
        int bad = th_run(n, &o, rank_dies, (void *)&colls[k]);
        TH_CHECK(!bad && !S->failures, "%s: a rank dies before %s: %s", tp, tally__coll_name(colls[k]), S->first);
        for (int r = 0; r < n - 1; r++)
            TH_CHECK(D->rc[r] == TALLY_E_PEER_LOST && strstr(D->msg[r], who),
                     "%s: rank %d died before %s: rank %d got %d (%s), want TALLY_E_PEER_LOST naming it", tp, n - 1,
                     tally__coll_name(colls[k]), r, D->rc[r], D->msg[r]);
    }
    printf("  %s a rank dies before each call n=%d: done\n", tp, n);
}

static void run_case(const char *what, int n, const th_opts *o, th_rank_fn fn, void *arg) {
    memset(S, 0, sizeof *S);
    double t0 = th_now();
    int bad = th_run(n, o, fn, arg);
    TH_CHECK(bad == 0 && S->failures == 0, "%s n=%d: %s", what, n, S->first[0] ? S->first : "a rank failed");
    printf("  %s n=%d: %s (%.1f s)\n", what, n, bad || S->failures ? "FAIL" : "ok", th_now() - t0);
    fflush(stdout);
}

/* Hosts of consecutive ranks by name (g_hosts_of[rank]): the world is shm+tcp, and "0011" has levels. */
static const char *g_hosts_of;
static void env_named_hosts(int rank, void *arg) {
    char name[8];
    snprintf(name, sizeof name, "h%c", g_hosts_of[rank]);
    setenv("TALLY_HOST", name, 1);
}

/* An algorithm with any of these collectives. */
static int has_any(int a) {
    static const int colls[] = {TALLY__REDUCE, TALLY__GATHER, TALLY__SCATTER, TALLY__ALLTOALL, TALLY__ALLTOALLV};
    for (int k = 0; k < 5; k++)
        if (tally__algo_has(tally__algo_get(a), colls[k])) return 1;
    return 0;
}

int main(int argc, char **argv) {
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    S = th_shared_alloc(sizeof *S);
    D = th_shared_alloc(sizeof *D);
    const char *tps[] = {"shm", "tcp"};
    const char *only = argc > 1 ? argv[1] : NULL; /* a transport alone, for debugging */
    int light = th_light();
    sweep w = {TALLY__ALGO_AUTO};
    char what[96];
    if (th_quick()) {
        th_opts one = {.timeout_s = 30, .wall_s = 60};
        run_case("one rank", 1, &one, rank_sweep, &w);
    }
    for (int ti = 0; ti < 2; ti++) {
        if (only && strcmp(only, tps[ti])) continue;
        for (int n = 2; n <= 8; n++)
            for (int a = TALLY__ALGO_AUTO; a <= tally__algo_count(); a++) { /* the model's choice, then each */
                if (a != TALLY__ALGO_AUTO && !has_any(a)) continue;
                /* The quick tier: 3 ranks, the model's choice on both transports, each algorithm over shm;
                 * the long one 2 to 4 ranks on both, 5 and 8 (the binomial trees' other shapes) over shm. */
                int quick = n == 3 && (a == TALLY__ALGO_AUTO || ti == 0);
                if (!(quick ? th_quick() : th_long()) || (n > 4 && (ti || (n != 5 && n != 8)))) continue;
                if (light && n != 3) continue;
                w.algo = a;
                th_opts o = {.transport = tps[ti],
                             .algo = a == TALLY__ALGO_AUTO ? NULL : tally__algo_name(a),
                             .timeout_s = 60,
                             .wall_s = 300};
                snprintf(what, sizeof what, "%s %-8s", tps[ti], a ? tally__algo_name(a) : "auto");
                run_case(what, n, &o, rank_sweep, &w);
            }
        for (int n = 2; n <= 4; n++) {
            if (!(n == 3 ? th_quick() : th_long())) continue;
            th_opts o = {.transport = tps[ti], .timeout_s = 60, .wall_s = 120};
            snprintf(what, sizeof what, "%s non-blocking", tps[ti]);
            run_case(what, n, &o, rank_async, NULL);
            snprintf(what, sizeof what, "%s arguments", tps[ti]);
            run_case(what, n, &o, rank_args, NULL);
        }
        if (th_long() && !light) run_deaths(tps[ti]);
    }
    /* shm+tcp (and levels, which these collectives leave to the flat algorithms): the long tier */
    static const char *const layouts[] = {"0011", "001"};
    for (int li = 0; li < 2 && th_long() && !light && !only; li++)
        for (int a = TALLY__ALGO_AUTO; a <= tally__algo_count(); a++) {
            if (a != TALLY__ALGO_AUTO && !has_any(a)) continue;
            g_hosts_of = layouts[li];
            w.algo = a;
            th_opts o = {.algo = a == TALLY__ALGO_AUTO ? NULL : tally__algo_name(a),
                         .timeout_s = 60,
                         .wall_s = 300,
                         .child_env = env_named_hosts};
            snprintf(what, sizeof what, "shm+tcp %-8s hosts %s", a ? tally__algo_name(a) : "auto", layouts[li]);
            run_case(what, (int)strlen(layouts[li]), &o, rank_sweep, &w);
        }
    return th_verdict("test_rooted");
}
