/* test_coll.c - every public collective x algorithm x transport x dtype x op x count x world size,
 * through the public API in real processes, checked exactly against a reference computed here. */
#include <malloc.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>

#include "coll/algo.h"
#include "core/numeric/dtype.h"
#include "harness.h"

/* Inputs are small integers, so every sum, product, min and max is exact in every dtype (f16 and bf16
 * included) and the reference can demand bitwise equality: the bound for floats is 0. One element of
 * the float inputs is NaN on one rank, to check that min and max propagate it. */
#define NAN_INDEX 5

static double input(int rank, size_t i, int op) {
    if (op == TALLY_PROD) return (double)(1 + ((rank + i) % 3 == 0)); /* 1 or 2: 2^8 at most */
    return (double)((int)((rank * 7 + i * 3) % 11) - 3);              /* -3..7 */
}

static int is_float(int t) { return t == TALLY_F32 || t == TALLY_F64 || t == TALLY_F16 || t == TALLY_BF16; }

/* The value rank `rank` contributes at element i, as stored in dtype t (u8 wraps negatives; bool is the
 * truth of the byte fill() writes, which is the input's low byte: 253 and 7 are both true). */
static double contribution(int rank, size_t i, int t, int op, int with_nan) {
    double v = input(rank, i, op);
    if (with_nan && is_float(t) && i == NAN_INDEX && rank == 1 && (op == TALLY_MIN || op == TALLY_MAX)) return NAN;
    if (t == TALLY_U8) v = (double)(uint8_t)(int)v;
    if (t == TALLY_BOOL) v = v != 0;
    return v;
}

/* Bitwise ops on the integers' two's-complement bits (wide here; storing cuts them to the dtype). */
static double bits_of(int op, double acc, double v) {
    int64_t p = (int64_t)acc, q = (int64_t)v;
    return (double)(op == TALLY_BAND ? p & q : op == TALLY_BOR ? p | q : p ^ q);
}

static double reference(int n, size_t i, int t, int op, int with_nan) {
    double acc = contribution(0, i, t, op, with_nan);
    for (int r = 1; r < n; r++) {
        double v = contribution(r, i, t, op, with_nan);
        switch (op) {
        case TALLY_PROD: acc *= v; break;
        case TALLY_MIN: acc = (isnan(acc) || isnan(v)) ? NAN : (v < acc ? v : acc); break;
        case TALLY_MAX: acc = (isnan(acc) || isnan(v)) ? NAN : (v > acc ? v : acc); break;
        case TALLY_BAND:
        case TALLY_BOR:
        case TALLY_BXOR: acc = bits_of(op, acc, v); break;
        default: acc += v; /* a bool's sum is non-zero exactly when one is true: its or */
        }
    }
    if (t == TALLY_U8) acc = (double)(uint8_t)(uint64_t)(int64_t)acc;
    if (op == TALLY_AVG) {
        if (is_float(t)) {
            /* as the library does it: sum exactly, divide once (f16/bf16 in f32), round to the dtype */
            char tmp[8] = {0};
            tally__dtype_store(tmp, 0, (tally_dtype)t, acc);
            double s = tally__dtype_load(tmp, 0, (tally_dtype)t);
            acc = t == TALLY_F64 ? s / n : (double)((float)s / (float)n);
        } else {
            acc = (double)((int64_t)acc / n); /* truncating division of the (wrapped) integer sum */
        }
    }
    char tmp[8] = {0};
    tally__dtype_store(tmp, 0, (tally_dtype)t, acc);
    return tally__dtype_load(tmp, 0, (tally_dtype)t);
}

/* input() repeats every 33 elements (its periods are 11 and 3), and so do the contributions and the
 * references but for element NAN_INDEX: a call's expected values are computed once per period, not once
 * per element (that was most of this test's time). */
#define PERIOD 33
typedef struct periodic {
    double v[PERIOD], at_nan;
} periodic;

static double periodic_at(const periodic *p, size_t i) { return i == NAN_INDEX ? p->at_nan : p->v[i % PERIOD]; }

static void contribution_table(periodic *p, int rank, int t, int op, int with_nan) {
    for (size_t i = 0; i < PERIOD; i++) p->v[i] = contribution(rank, i, t, op, 0);
    p->at_nan = contribution(rank, NAN_INDEX, t, op, with_nan);
}

static void reference_table(periodic *p, int n, int t, int op, int with_nan) {
    for (size_t i = 0; i < PERIOD; i++) p->v[i] = reference(n, i, t, op, 0);
    p->at_nan = reference(n, NAN_INDEX, t, op, with_nan);
}

/* The first count elements of rank's contribution, stored as dtype t; bool as the input's low byte, so
 * true comes as 1 and as other bytes, which every reduction must still read as true. */
static void fill(void *buf, int rank, size_t count, int t, int op, int with_nan) {
    if (t == TALLY_BOOL) {
        uint8_t b[PERIOD];
        for (size_t i = 0; i < PERIOD; i++) b[i] = (uint8_t)(int)input(rank, i, op);
        for (size_t i = 0; i < count; i++) ((uint8_t *)buf)[i] = b[i % PERIOD];
        return;
    }
    periodic p;
    contribution_table(&p, rank, t, op, with_nan);
    for (size_t i = 0; i < count; i++) tally__dtype_store(buf, i, (tally_dtype)t, periodic_at(&p, i));
}

/* A reduction's bool is 0 or 1, whatever bytes came in; one rank's copy is left as it was. */
static int bool_byte_ok(const tally_comm *c, int t, const void *buf, size_t i) {
    return t != TALLY_BOOL || tally_comm_size(c) == 1 || ((const uint8_t *)buf)[i] <= 1;
}

static int same(double got, double want) { return (isnan(got) && isnan(want)) || got == want; }

typedef struct {
    int failures; /* written by ranks: shared memory */
    char first[512];
} shared_result;

static shared_result *g_result;

static void fail(int rank, const char *what, int t, int op, size_t count, size_t i, double got, double want) {
    if (__sync_fetch_and_add(&g_result->failures, 1) == 0)
        snprintf(g_result->first, sizeof g_result->first, "rank %d: %s %s/%s count %zu: element %zu is %g, expected %g",
                 rank, what, tally_dtype_name((tally_dtype)t), tally_op_name((tally_op)op), count, i, got, want);
}

static void fail_rc(int rank, const char *what, int rc) {
    if (__sync_fetch_and_add(&g_result->failures, 1) == 0)
        snprintf(g_result->first, sizeof g_result->first, "rank %d: %s returned %s: %s", rank, what, tally_strerror(rc),
                 tally_last_error());
}

static int check_allreduce(tally_comm *c, int t, int op, size_t count, int in_place) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size((tally_dtype)t);
    char *send = malloc(count * es + 1), *recv = in_place ? send : malloc(count * es + 1);
    fill(send, rank, count, t, op, 1);
    int rc = tally_allreduce(c, send, recv, count, (tally_dtype)t, (tally_op)op);
    if (rc) fail_rc(rank, "allreduce", rc);
    periodic ref;
    reference_table(&ref, n, t, op, 1);
    for (size_t i = 0; i < count && !rc; i++) {
        double want = periodic_at(&ref, i), got = tally__dtype_load(recv, i, (tally_dtype)t);
        if (!same(got, want) || !bool_byte_ok(c, t, recv, i)) {
            fail(rank, in_place ? "allreduce in place" : "allreduce", t, op, count, i, got, want);
            break;
        }
    }
    if (!in_place) free(recv);
    free(send);
    return rc;
}

static int check_reduce_scatter(tally_comm *c, int t, int op, size_t count, int in_place) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size((tally_dtype)t), total = count * (size_t)n;
    char *send = malloc(total * es + 1), *own = malloc(count * es + 1);
    char *recv = in_place ? send + (size_t)rank * count * es : own;
    fill(send, rank, total, t, op, 1);
    int rc = tally_reduce_scatter(c, send, recv, count, (tally_dtype)t, (tally_op)op);
    if (rc) fail_rc(rank, "reduce_scatter", rc);
    periodic ref;
    reference_table(&ref, n, t, op, 1);
    for (size_t i = 0; i < count && !rc; i++) {
        double want = periodic_at(&ref, (size_t)rank * count + i), got = tally__dtype_load(recv, i, (tally_dtype)t);
        if (!same(got, want) || !bool_byte_ok(c, t, recv, i)) {
            fail(rank, in_place ? "reduce_scatter in place" : "reduce_scatter", t, op, count, i, got, want);
            break;
        }
    }
    free(send);
    free(own);
    return rc;
}

static int check_allgather(tally_comm *c, int t, size_t count, int in_place) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size((tally_dtype)t), total = count * (size_t)n;
    char *recv = malloc(total * es + 1), *own = malloc(count * es + 1);
    char *send = in_place ? recv + (size_t)rank * count * es : own;
    memset(recv, 0xA5, total * es);
    fill(send, rank, count, t, TALLY_SUM, 0);
    int rc = tally_allgather(c, send, recv, count, (tally_dtype)t);
    if (rc) fail_rc(rank, "allgather", rc);
    periodic of[TH_MAX_RANKS];
    for (int q = 0; q < n; q++) contribution_table(&of[q], q, t, TALLY_SUM, 0);
    for (size_t i = 0; i < total && !rc; i++) {
        double want = periodic_at(&of[i / count], i % count), got = tally__dtype_load(recv, i, (tally_dtype)t);
        if (!same(got, want)) {
            fail(rank, in_place ? "allgather in place" : "allgather", t, TALLY_SUM, count, i, got, want);
            break;
        }
    }
    free(recv);
    free(own);
    return rc;
}

static int check_broadcast(tally_comm *c, int t, size_t count, int root) {
    int rank = tally_comm_rank(c);
    size_t es = tally_dtype_size((tally_dtype)t);
    char *buf = malloc(count * es + 1);
    fill(buf, rank, count, t, TALLY_SUM, 0);
    int rc = tally_broadcast(c, buf, count, (tally_dtype)t, root);
    if (rc) fail_rc(rank, "broadcast", rc);
    periodic want_of;
    contribution_table(&want_of, root, t, TALLY_SUM, 0);
    for (size_t i = 0; i < count && !rc; i++) {
        double want = periodic_at(&want_of, i), got = tally__dtype_load(buf, i, (tally_dtype)t);
        if (!same(got, want)) {
            fail(rank, "broadcast", t, root, count, i, got, want);
            break;
        }
    }
    free(buf);
    return rc;
}

/* Pairs no reduction takes fail alike on every rank with TALLY_E_INVALID, naming the op, the dtype and
 * what the op takes, blocking or not, and leave the communicator working for the calls that follow. */
static void check_refused(tally_comm *c) {
    static const struct {
        int coll, t, op, nonblocking;
    } cases[] = {{TALLY__ALLREDUCE, TALLY_F32, TALLY_BAND, 0},
                 {TALLY__REDUCE_SCATTER, TALLY_F64, TALLY_BXOR, 0},
                 {TALLY__ALLREDUCE, TALLY_BOOL, TALLY_AVG, 0},
                 {TALLY__REDUCE_SCATTER, TALLY_BOOL, TALLY_AVG, 0},
                 {TALLY__ALLREDUCE, TALLY_BF16, TALLY_BOR, 1}};
    int rank = tally_comm_rank(c);
    double send[TH_MAX_RANKS] = {0}, recv[TH_MAX_RANKS] = {0};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0] && !g_result->failures; k++) {
        tally_dtype t = (tally_dtype)cases[k].t;
        tally_op op = (tally_op)cases[k].op;
        int rc;
        if (cases[k].nonblocking) { /* the request carries the refusal */
            tally_request *req = NULL;
            rc = tally_iallreduce(c, send, recv, 1, t, op, &req);
            if (!rc) rc = tally_wait(req);
            tally_request_free(req);
        } else if (cases[k].coll == TALLY__ALLREDUCE) {
            rc = tally_allreduce(c, send, recv, 1, t, op);
        } else {
            rc = tally_reduce_scatter(c, send, recv, 1, t, op);
        }
        const char *msg = tally_last_error(), *takes = op == TALLY_AVG ? "every dtype but bool" : "bool";
        char what[64];
        snprintf(what, sizeof what, "%s%s", cases[k].nonblocking ? "i" : "", tally__coll_name(cases[k].coll));
        if (rc != TALLY_E_INVALID || !strstr(msg, tally_op_name(op)) || !strstr(msg, tally_dtype_name(t)) ||
            !strstr(msg, takes)) {
            if (__sync_fetch_and_add(&g_result->failures, 1) == 0)
                snprintf(g_result->first, sizeof g_result->first,
                         "rank %d: %s of %s with %s returned %s, want %s naming both and what %s takes: %s", rank, what,
                         tally_dtype_name(t), tally_op_name(op), tally_strerror(rc), tally_strerror(TALLY_E_INVALID),
                         tally_op_name(op), msg);
        }
    }
}

/* Which (dtype, op) pairs rank_main runs: all of them, the first ones only, or the ones added with i8, i16,
 * bool and the bitwise ops only. The quick tier runs the added ones where their bytes take other paths
 * (the ring over shm and tcp at 2 and 3 ranks, hier, shm+tcp) and not again for every algorithm, which
 * moves the bytes of every dtype alike; neither tier runs them on one CPU. Set before the ranks fork. */
enum { PAIRS_ALL, PAIRS_FIRST, PAIRS_ADDED };
static int g_pairs = PAIRS_ALL;

static int dtype_added(int t) { return t == TALLY_I8 || t == TALLY_I16 || t == TALLY_BOOL; }

static int dtype_wanted(int t) { return g_pairs == PAIRS_ALL || (g_pairs == PAIRS_ADDED) == dtype_added(t); }

static int pair_wanted(int t, int op) {
    if (!tally__dtype_op_valid(t, op)) return 0; /* refused: check_refused() */
    int added = dtype_added(t) || op == TALLY_BAND || op == TALLY_BOR || op == TALLY_BXOR;
    return g_pairs == PAIRS_ALL || (g_pairs == PAIRS_ADDED) == added;
}

/* The big count runs for f32 and i32 (all ops) and once per other dtype (sum), to keep CI short. */
static int big_count_wanted(int t, int op) {
    if (th_light()) return t == TALLY_F32 && op == TALLY_SUM;
    return t == TALLY_F32 || t == TALLY_I32 || op == TALLY_SUM;
}

static int rank_main(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) {
        fail_rc(rank, "tally_comm_init", rc);
        return 1;
    }
    check_refused(c);
    /* The large count: past every transport's large-message threshold and several pipeline segments; 4 MB
     * of f32 where every case runs (by hand, the long tier), 1.2 MB in the quick tier. */
    size_t large = th_long() ? 1000003 : 300007;
    size_t counts[] = {0, 1, 7, (size_t)(n > 1 ? n - 1 : 0), (size_t)n + 1, large};
    int ncounts = sizeof counts / sizeof *counts;
    for (int ci = 0; ci < ncounts && !g_result->failures; ci++) {
        size_t count = counts[ci];
        int big = count > 100000;
        for (int t = 0; t < TALLY_DTYPE_COUNT && !g_result->failures; t++) {
            for (int op = 0; op < TALLY_OP_COUNT && !g_result->failures; op++) {
                if (!pair_wanted(t, op) || (big && !big_count_wanted(t, op))) continue;
                for (int ip = 0; ip < 2; ip++) {
                    if (big && ip && t != TALLY_F32) continue;
                    check_allreduce(c, t, op, count, ip);
                    check_reduce_scatter(c, t, op, big ? count / 8 : count, ip);
                }
            }
            if (!dtype_wanted(t)) continue;
            for (int ip = 0; ip < 2 && !g_result->failures; ip++) check_allgather(c, t, big ? count / 8 : count, ip);
            for (int root = 0; root < n && !g_result->failures; root++) {
                if (big && root != n - 1) continue;
                if (n > 4 && root != 0 && root != n / 2 && root != n - 1) continue; /* first, middle, last */
                check_broadcast(c, t, count, root);
            }
        }
    }
    /* Many small calls in a row, with varying sizes, stay correct. */
    int calls = n > 4 ? 300 : 1000; /* past 4 ranks on 2 cores each call is a round of context switches */
    for (int k = 0; k < calls && !g_result->failures; k++) check_allreduce(c, TALLY_I32, TALLY_SUM, 1 + k % 9, k & 1);
    for (int k = 0; k < 50 && !g_result->failures; k++)
        if ((rc = tally_barrier(c))) fail_rc(rank, "barrier", rc);
    tally_comm_free(c);
    return g_result->failures ? 1 : 0;
}

/* count elements in one call, out of place and in place, checked. */
static void large_allreduce(tally_comm *c, int rank, int n, size_t count) {
    int rc;
    float *send = malloc(count * sizeof *send), *recv = malloc(count * sizeof *recv);
    for (size_t i = 0; i < count; i++) send[i] = (float)((rank + i) % 5);
    for (int ip = 0; ip < 2 && !g_result->failures; ip++) {
        float *out = ip ? send : recv;
        if ((rc = tally_allreduce(c, send, out, count, TALLY_F32, TALLY_SUM))) {
            fail_rc(rank, "large allreduce", rc);
            break;
        }
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++) want += (float)((r + i) % 5);
            if (out[i] != want) {
                fail(rank, ip ? "large allreduce in place" : "large allreduce", TALLY_F32, TALLY_SUM, count, i, out[i],
                     want);
                break;
            }
        }
    }
    free(send);
    free(recv);
}

/* 256 MiB in one call (the large size class; arg: another byte count), out of place and in place. */
static int rank_large(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return fail_rc(rank, "tally_comm_init", rc), 1;
    large_allreduce(c, rank, n, (arg ? *(const size_t *)arg : 256u << 20) / sizeof(float) + 3);
    tally_comm_free(c);
    return g_result->failures ? 1 : 0;
}

/* hier's allreduce in chunks (the cross level's share runs on its communicator's thread while the host
 * level works): links of 50 MB/s by the model make the crossings long, so just over 6 MiB goes in 6 chunks
 * and just over 22 MiB in 22 (one per MiB), the last one shorter, each three times over: right each time,
 * and no thread made per call. */
static int rank_hier_chunks(int rank, int n, void *arg) {
    tally_comm *c;
    setenv("TALLY_COST", "2,0.05,10", 1); /* this rank's process only */
    int rc = tally_comm_init(&c);
    if (rc) return fail_rc(rank, "tally_comm_init", rc), 1;
    size_t counts[] = {(6u << 20) / sizeof(float) + 3, (22u << 20) / sizeof(float) + 5};
    large_allreduce(c, rank, n, counts[0]);
    int threads = th_count_threads();
    for (int k = 0; k < 5 && !g_result->failures; k++) large_allreduce(c, rank, n, counts[k < 2 ? 0 : 1]);
    int after = th_count_threads_after(threads);
    if (after != threads && __sync_fetch_and_add(&g_result->failures, 1) == 0)
        snprintf(g_result->first, sizeof g_result->first,
                 "rank %d: hier in chunks: %d threads after the first call, %d "
                 "after five more",
                 rank, threads, after);
    tally_comm_free(c);
    return g_result->failures ? 1 : 0;
}

/* Sixteen ranks on this small machine: more ranks than cores must still work, just slower. */
static int rank_many(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return fail_rc(rank, "tally_comm_init", rc), 1;
    size_t counts[] = {0, 1, 7, 15, 17, 1000, 100003};
    for (int ci = 0; ci < 7 && !g_result->failures; ci++)
        for (int ip = 0; ip < 2; ip++) {
            check_allreduce(c, TALLY_F32, TALLY_SUM, counts[ci], ip);
            check_allreduce(c, TALLY_I32, TALLY_MAX, counts[ci], ip);
            check_reduce_scatter(c, TALLY_BF16, TALLY_AVG, counts[ci] / 16, ip);
            check_allgather(c, TALLY_F64, counts[ci] / 16, ip);
        }
    check_broadcast(c, TALLY_U8, 1000, 11);
    tally_comm_free(c);
    return g_result->failures ? 1 : 0;
}

/* The collectives here are the ones with allreduce's algorithms: TALLY_ALGO naming an all-to-all one
 * (pairwise, bruck; test_rooted's) would leave them all to the model, auto's case. */
static int runs_these(int a) { return tally__algo_get(a)->allreduce != NULL; }

static void run_case(const char *what, int n, const th_opts *o, th_rank_fn fn) {
    memset(g_result, 0, sizeof *g_result);
    double t0 = th_now();
    int bad = th_run(n, o, fn, NULL);
    TH_CHECK(bad == 0 && g_result->failures == 0, "%s n=%d: %s", what, n,
             g_result->first[0] ? g_result->first : "a rank failed");
    printf("  %s n=%d: %s (%.1f s)\n", what, n, bad || g_result->failures ? "FAIL" : "ok", th_now() - t0);
    fflush(stdout);
}

/* More ranks than CPUs, whatever machine runs the test: the ranks inherit a set of one CPU, so every
 * wait of every algorithm must hand the CPU to the peer it waits for (a spinner would take it). The quick
 * tier: the ring on 3 ranks over shm; the long one: every algorithm on 8 ranks, both transports. */
static void run_oversubscribed(const char *only_transport, int light) {
    const char *transports[] = {"shm", "tcp"};
    cpu_set_t set, one;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &set)) cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    TH_CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "sched_setaffinity to CPU %d", cpu);
    g_pairs = PAIRS_FIRST; /* what is waited for here is the CPU, whatever the dtype */
    for (int ti = 0; ti < 2; ti++) {
        if (only_transport && strcmp(only_transport, transports[ti])) continue;
        th_opts o = {.transport = transports[ti], .algo = "ring", .timeout_s = 60, .wall_s = 300};
        char what[64];
        if (ti == 0 && th_quick()) {
            snprintf(what, sizeof what, "%s %-6s 1 CPU", transports[ti], o.algo);
            run_case(what, 3, &o, rank_main);
        }
        for (int a = 1; a <= (light ? 1 : tally__algo_count()) && th_long(); a++) { /* every algorithm */
            if (!runs_these(a)) continue;
            o.algo = tally__algo_name(a);
            snprintf(what, sizeof what, "%s %-6s 1 CPU", transports[ti], o.algo);
            run_case(what, 8, &o, rank_main);
        }
    }
    sched_setaffinity(0, sizeof set, &set);
    g_pairs = PAIRS_ALL;
}

/* Hosts by name, their ranks interleaved (h0 h1 h2 h0 h1 h2 for three): the hierarchical collectives'
 * reordering of blocks between world order and level order is then not the identity. */
static int g_interleaved_hosts;
static void env_interleaved_hosts(int rank, void *arg) {
    char name[16];
    snprintf(name, sizeof name, "h%d", rank % g_interleaved_hosts);
    setenv("TALLY_HOST", name, 1);
}

/* Hosts of consecutive ranks, as launchers place them; g_hosts_of[rank] names each rank's. */
static const char *g_hosts_of;
static void env_named_hosts(int rank, void *arg) {
    char name[8];
    snprintf(name, sizeof name, "h%c", g_hosts_of[rank]);
    setenv("TALLY_HOST", name, 1);
}

/* The flat algorithms over shm+tcp: shm between the ranks of a host, tcp across; ring steps that send
 * on one kind and receive on the other; a host with one rank alone (no shm there). The quick tier: the
 * ring on hosts 001. */
static void run_mixed(int light) {
    static const char *const layouts[] = {"0011", "001", "00011"};
    for (int li = 0; li < 3; li++)
        for (int a = 1; a <= tally__algo_count(); a++) { /* every algorithm of the table */
            if (!runs_these(a)) continue;
            if (!th_long() && !(li == 1 && a == TALLY__ALGO_RING)) continue;
            if (light && li > 0 && a != TALLY__ALGO_RING) continue;
            g_hosts_of = layouts[li];
            th_opts o = {.algo = tally__algo_name(a), .timeout_s = 60, .wall_s = 300, .child_env = env_named_hosts};
            char what[64];
            snprintf(what, sizeof what, "shm+tcp %-6s hosts %s", o.algo, layouts[li]);
            run_case(what, (int)strlen(layouts[li]), &o, rank_main);
        }
}

/* Quick: 2 hosts x 2 interleaved; long: 3 x 2, the algorithm forced and chosen by the measured model. */
static void run_hier(void) {
    th_opts o = {.algo = "hier", .timeout_s = 60, .wall_s = 300, .child_env = env_interleaved_hosts};
    if (th_quick()) {
        g_interleaved_hosts = 2;
        run_case("hier 2 hosts x 2 interleaved", 4, &o, rank_main);
        run_case("hier 2 hosts x 2 interleaved, 6 and 22 MiB in chunks", 4, &o, rank_hier_chunks);
    }
    if (th_long()) {
        g_interleaved_hosts = 3;
        run_case("hier 3 hosts x 2 interleaved", 6, &o, rank_main);
        o.algo = NULL;
        o.measure = 1;
        run_case("auto 3 hosts x 2 interleaved", 6, &o, rank_main);
    }
}

/* One rank of a job started elsewhere (scripts/hosts.sh's test hosts): every collective of rank_main,
 * then 16 MiB in one call; the first wrong element on stderr, the status 1. */
static int as_rank(void) {
    static shared_result mine;
    g_result = &mine;
    const char *r = getenv("TALLY_RANK"), *n = getenv("TALLY_WORLD_SIZE");
    if (!r || !n) {
        fprintf(stderr,
                "test_coll --as-rank: TALLY_RANK and TALLY_WORLD_SIZE must be set (scripts/hosts.sh sets them)\n");
        return 2;
    }
    int rank = atoi(r), size = atoi(n);
    size_t large = 16u << 20;
    if (rank_main(rank, size, NULL) == 0) rank_large(rank, size, &large);
    if (mine.failures) fprintf(stderr, "test_coll --as-rank: %s\n", mine.first);
    return mine.failures ? 1 : 0;
}

int main(int argc, char **argv) {
    /* Keep freed buffers in the heap: a fresh mmap per call made page faults a tenth of the time. */
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    if (argc > 1 && !strcmp(argv[1], "--as-rank")) return as_rank();
    const char *transports[] = {"shm", "tcp"};
    int sizes[] = {1, 2, 3, 4, 5, 8};
    const char *only_transport = argc > 1 ? argv[1] : NULL;
    int light = th_light();
    g_result = th_shared_alloc(sizeof *g_result);
    for (int ti = 0; ti < 2; ti++) {
        if (only_transport && strcmp(only_transport, transports[ti])) continue;
        for (int a = 1; a <= tally__algo_count(); a++) /* every algorithm of the table */
            for (int si = 0; si < 6 && runs_these(a); si++) {
                int n = sizes[si], tree_like = a == TALLY__ALGO_TREE || a == TALLY__ALGO_DIRECT;
                if (n == 1 && (ti || a != 1)) continue; /* one rank needs no transport or algorithm */
                /* The quick tier: one rank, and every algorithm on 3 ranks (not a power of two), with a
                 * smaller large count, the ring on 2 with the pairs added last; the long tier runs them all
                 * at full size. */
                int ring = a == TALLY__ALGO_RING;
                if (!th_long() && n != 1 && n != 3 && !(n == 2 && ring)) continue;
                g_pairs = th_long() || n == 1 || (n == 3 && ring) ? PAIRS_ALL : n == 2 ? PAIRS_ADDED : PAIRS_FIRST;
                if (light && n > 3 && n != 5) continue;
                /* Four and eight ranks for the ring and halving-doubling, whose steps depend on N's shape;
                 * tree and direct take the same paths at 3 and 5 (half a minute of CI saved). */
                if ((n == 4 || n == 8) && tree_like) continue;
                /* Over tcp, the transport's own paths: every N for the ring, the fold of rhd up to 5; the
                 * algorithms' shapes at larger N are the same as over shm. */
                if (ti == 1 && ((n == 5 && tree_like) || (n == 8 && a == TALLY__ALGO_RHD))) continue;
                th_opts o = {.transport = transports[ti], .algo = tally__algo_name(a), .timeout_s = 60, .wall_s = 300};
                char what[64];
                snprintf(what, sizeof what, "%s %-6s", transports[ti], o.algo);
                run_case(what, n, &o, rank_main);
                g_pairs = PAIRS_ALL;
            }
        if (!th_long()) continue;
        /* The algorithm chosen by the cost model measured at init, on 16 ranks; then 256 MiB. */
        th_opts auto_algo = {.transport = transports[ti], .timeout_s = 120, .wall_s = 400, .measure = 1};
        char what[64];
        snprintf(what, sizeof what, "%s auto  ", transports[ti]);
        run_case(what, 16, &auto_algo, rank_many);
        if (!light) {
            snprintf(what, sizeof what, "%s 256MiB", transports[ti]);
            run_case(what, 2, &auto_algo, rank_large);
        }
    }
    if (!only_transport || !strcmp(only_transport, "hier")) run_hier();
    if (!only_transport || !strcmp(only_transport, "mixed")) run_mixed(light);
    run_oversubscribed(only_transport, light);
    return th_verdict("test_coll");
}
