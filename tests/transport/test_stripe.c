/* test_stripe.c - TALLY_TCP_STREAMS: ranks on different hosts by name (TALLY_HOST) over 1..4 streams per
 * pair; every collective checked exactly, bad values refused, a death and a mismatch end every rank. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <unistd.h>

#include "core/numeric/dtype.h"
#include "harness.h"

/* The transport stripes messages of 256 KiB and more (stripe.c's STRIPE_MIN) in 64-byte units. */
#define STRIPE_MIN  (256u << 10)
#define STRIPE_UNIT 64u

typedef struct {
    int failures;
    char first[512];
    int code[TH_MAX_RANKS];
    double when[TH_MAX_RANKS];
    char msg[TH_MAX_RANKS][400];
    int fds_before[TH_MAX_RANKS], fds_init[TH_MAX_RANKS], fds_after[TH_MAX_RANKS];
    int thr_before[TH_MAX_RANKS], thr_after[TH_MAX_RANKS];
    char transport[TH_MAX_RANKS][16];
    double kill_time;
} shared_t;

static shared_t *S;

/* The environment of each case, read by the children. */
static const char *g_streams; /* TALLY_TCP_STREAMS, NULL: unset */
static int g_per_host;        /* ranks per host name */

static void env_hosts(int rank, void *arg) {
    char name[16];
    snprintf(name, sizeof name, "h%d", rank / g_per_host);
    setenv("TALLY_HOST", name, 1);
    if (g_streams) setenv("TALLY_TCP_STREAMS", g_streams, 1);
}

/* ---- values and the reference: small integers, exact in every dtype ---- */

static uint64_t mix(uint64_t x) { /* splitmix64: no period a misplaced stripe could line up with */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double contribution(int rank, size_t i, int t, int op) {
    uint64_t h = mix((uint64_t)i * 131 + (uint64_t)rank);
    double v = op == TALLY_PROD ? (double)(1 + (h % 3 == 0)) : (double)((int)(h % 11) - 3);
    if (t == TALLY_U8) v = (double)(uint8_t)(int)v;
    if (t == TALLY_BOOL) v = v != 0;
    return v;
}

static int is_float(int t) { return t == TALLY_F32 || t == TALLY_F64 || t == TALLY_F16 || t == TALLY_BF16; }

static double reference(int n, size_t i, int t, int op) {
    double acc = contribution(0, i, t, op);
    for (int r = 1; r < n; r++) {
        double v = contribution(r, i, t, op);
        switch (op) {
        case TALLY_PROD: acc *= v; break;
        case TALLY_MIN: acc = v < acc ? v : acc; break;
        case TALLY_MAX: acc = v > acc ? v : acc; break;
        case TALLY_BAND: acc = (double)((int64_t)acc & (int64_t)v); break;
        case TALLY_BOR: acc = (double)((int64_t)acc | (int64_t)v); break;
        case TALLY_BXOR: acc = (double)((int64_t)acc ^ (int64_t)v); break;
        default: acc += v; /* bool: non-zero exactly when one is true, its or */
        }
    }
    char tmp[8] = {0};
    if (t == TALLY_U8) acc = (double)(uint8_t)(uint64_t)(int64_t)acc;
    if (op == TALLY_AVG) {
        if (is_float(t)) { /* as the library: sum exactly, divide once (f16/bf16 in f32), round to the dtype */
            tally__dtype_store(tmp, 0, (tally_dtype)t, acc);
            double s = tally__dtype_load(tmp, 0, (tally_dtype)t);
            acc = t == TALLY_F64 ? s / n : (double)((float)s / (float)n);
        } else {
            acc = (double)((int64_t)acc / n);
        }
    }
    tally__dtype_store(tmp, 0, (tally_dtype)t, acc);
    return tally__dtype_load(tmp, 0, (tally_dtype)t);
}

static void fail(int rank, const char *what, int t, int op, size_t count, size_t i, double got, double want) {
    if (__sync_fetch_and_add(&S->failures, 1) == 0)
        snprintf(S->first, sizeof S->first, "rank %d: %s %s/%s count %zu: element %zu is %g, expected %g", rank, what,
                 tally_dtype_name((tally_dtype)t), tally_op_name((tally_op)op), count, i, got, want);
}

static int fail_rc(int rank, const char *what, int rc) {
    if (__sync_fetch_and_add(&S->failures, 1) == 0)
        snprintf(S->first, sizeof S->first, "rank %d: %s returned %s: %s", rank, what, tally_strerror(rc),
                 tally_last_error());
    return rc;
}

/* ---- the collectives ---- */

static void check_allreduce(tally_comm *c, int t, int op, size_t count) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size((tally_dtype)t);
    char *send = malloc(count * es + 1), *recv = malloc(count * es + 1);
    for (size_t i = 0; i < count; i++) tally__dtype_store(send, i, (tally_dtype)t, contribution(rank, i, t, op));
    int rc = tally_allreduce(c, send, recv, count, (tally_dtype)t, (tally_op)op);
    if (rc) fail_rc(rank, "allreduce", rc);
    for (size_t i = 0; i < count && !rc; i++) {
        double want = reference(n, i, t, op), got = tally__dtype_load(recv, i, (tally_dtype)t);
        if (got != want) {
            fail(rank, "allreduce", t, op, count, i, got, want);
            break;
        }
    }
    free(send);
    free(recv);
}

static void check_reduce_scatter(tally_comm *c, int t, int op, size_t count) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size((tally_dtype)t), total = count * (size_t)n;
    char *send = malloc(total * es + 1), *recv = malloc(count * es + 1);
    for (size_t i = 0; i < total; i++) tally__dtype_store(send, i, (tally_dtype)t, contribution(rank, i, t, op));
    int rc = tally_reduce_scatter(c, send, recv, count, (tally_dtype)t, (tally_op)op);
    if (rc) fail_rc(rank, "reduce_scatter", rc);
    for (size_t i = 0; i < count && !rc; i++) {
        double want = reference(n, (size_t)rank * count + i, t, op), got = tally__dtype_load(recv, i, (tally_dtype)t);
        if (got != want) {
            fail(rank, "reduce_scatter", t, op, count, i, got, want);
            break;
        }
    }
    free(send);
    free(recv);
}

static void check_allgather(tally_comm *c, int t, size_t count) {
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    size_t es = tally_dtype_size((tally_dtype)t), total = count * (size_t)n;
    char *send = malloc(count * es + 1), *recv = malloc(total * es + 1);
    memset(recv, 0xA5, total * es);
    for (size_t i = 0; i < count; i++) tally__dtype_store(send, i, (tally_dtype)t, contribution(rank, i, t, TALLY_SUM));
    int rc = tally_allgather(c, send, recv, count, (tally_dtype)t);
    if (rc) fail_rc(rank, "allgather", rc);
    for (size_t i = 0; i < total && !rc; i++) {
        double want = contribution((int)(i / count), i % count, t, TALLY_SUM),
               got = tally__dtype_load(recv, i, (tally_dtype)t);
        if (got != want) {
            fail(rank, "allgather", t, TALLY_SUM, count, i, got, want);
            break;
        }
    }
    free(send);
    free(recv);
}

static void check_broadcast(tally_comm *c, int t, size_t count, int root) {
    int rank = tally_comm_rank(c);
    size_t es = tally_dtype_size((tally_dtype)t);
    char *buf = malloc(count * es + 1);
    for (size_t i = 0; i < count; i++) tally__dtype_store(buf, i, (tally_dtype)t, contribution(rank, i, t, TALLY_SUM));
    int rc = tally_broadcast(c, buf, count, (tally_dtype)t, root);
    if (rc) fail_rc(rank, "broadcast", rc);
    for (size_t i = 0; i < count && !rc; i++) {
        double want = contribution(root, i, t, TALLY_SUM), got = tally__dtype_load(buf, i, (tally_dtype)t);
        if (got != want) {
            fail(rank, "broadcast", t, TALLY_SUM, count, i, got, want);
            break;
        }
    }
    free(buf);
}

/* Element counts for dtype size es on n ranks: empty, tiny and odd; a vector whose blocks (what the ring
 * and halving-doubling send) lie just under and just over the striping threshold, in bytes no multiple
 * of the stripe unit; and 4 MiB and more (every stripe of a 4-stream cut far from empty). */
static int counts_for(size_t es, int n, size_t *out) {
    size_t block = STRIPE_MIN / es; /* elements of one message at the threshold */
    int k = 0;
    out[k++] = 0;
    out[k++] = 1;
    out[k++] = 7;
    out[k++] = (size_t)n * (block - STRIPE_UNIT / es) + 1;
    out[k++] = (size_t)n * (block + 3) + 1;
    out[k++] = (4u << 20) / es + 13;
    return k;
}

/* The dtypes and ops added last (i8, i16, bool; band, bor, bxor) run in one case of the long tier
 * (g_added), and not at the largest count: stripes are cut in bytes, and the sizes of their elements (1
 * and 2) are u8's and f16's, which take every case and count. Set before the ranks fork. */
static int g_added;
static int added_dtype(int t) { return t == TALLY_I8 || t == TALLY_I16 || t == TALLY_BOOL; }
static int added_op(int op) { return op == TALLY_BAND || op == TALLY_BOR || op == TALLY_BXOR; }

static int rank_coll(int rank, int n, void *arg) {
    S->fds_before[rank] = th_count_fds();
    S->thr_before[rank] = th_count_threads();
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return fail_rc(rank, "tally_comm_init", rc), 1;
    S->fds_init[rank] = th_count_fds();
    snprintf(S->transport[rank], sizeof S->transport[rank], "%s", tally_comm_transport(c));
    for (int t = 0; t < TALLY_DTYPE_COUNT && !S->failures; t++) {
        if (!g_added && added_dtype(t)) continue;
        size_t counts[8], es = tally_dtype_size((tally_dtype)t);
        int nc = counts_for(es, n, counts);
        for (int ci = 0; ci < nc && !S->failures; ci++) {
            size_t count = counts[ci];
            int big = count * es >= (4u << 20);
            if (big && added_dtype(t)) continue;
            for (int op = 0; op < TALLY_OP_COUNT && !S->failures; op++) {
                if (!tally__dtype_op_valid(t, op)) continue; /* refused: test_coll checks that */
                if ((!g_added || big) && added_op(op)) continue;
                if (big && t != TALLY_F32 && t != TALLY_U8 && op != TALLY_SUM) continue; /* keeps CI short */
                check_allreduce(c, t, op, count);
            }
            /* reduce_scatter's blocks and allgather's pieces are count elements each */
            size_t each = count > 7 ? count / (size_t)n : count;
            check_reduce_scatter(c, t, big ? TALLY_SUM : TALLY_MAX, each);
            check_allgather(c, t, each);
            check_broadcast(c, t, count, (ci + t) % n);
        }
    }
    for (int k = 0; k < 200 && !S->failures; k++) check_allreduce(c, TALLY_I32, TALLY_SUM, 1 + k % 9);
    if (!S->failures && (rc = tally_barrier(c))) fail_rc(rank, "barrier", rc);
    tally_comm_free(c);
    S->fds_after[rank] = th_count_fds();
    S->thr_after[rank] = th_count_threads_after(S->thr_before[rank]);
    return S->failures ? 1 : 0;
}

static void run_coll(const char *streams, int n, int per_host, const char *algo) {
    memset(S, 0, sizeof *S);
    g_streams = streams;
    g_per_host = per_host;
    th_opts o = {.algo = algo, .timeout_s = 60, .wall_s = 400, .child_env = env_hosts, .measure = !algo};
    char what[96];
    snprintf(what, sizeof what, "streams %s, %d hosts x %d, %s", streams ? streams : "unset", n / per_host, per_host,
             algo ? algo : "auto");
    double t0 = th_now();
    int bad = th_run(n, &o, rank_coll, NULL);
    TH_CHECK(bad == 0 && S->failures == 0, "%s: %s", what, S->first[0] ? S->first : "a rank failed");
    for (int r = 0; r < n && !bad; r++) {
        const char *want = per_host > 1 ? "shm+tcp" : "tcp"; /* host-mates talk shm; the stripes are tcp's */
        TH_CHECK(!strcmp(S->transport[r], want), "%s: rank %d's transport is %s", what, r, S->transport[r]);
        TH_CHECK(S->fds_after[r] == S->fds_before[r], "%s: rank %d has %d fds open after tally_comm_free, %d before",
                 what, r, S->fds_after[r], S->fds_before[r]);
        TH_CHECK(S->thr_after[r] == S->thr_before[r], "%s: rank %d has %d threads after tally_comm_free, %d before",
                 what, r, S->thr_after[r], S->thr_before[r]);
    }
    printf("  %s: %s (%.1f s)\n", what, bad || S->failures ? "FAIL" : "ok", th_now() - t0);
    fflush(stdout);
}

/* ---- the connections: one mesh per stream ---- */

static int rank_coll_init_only(int rank, int n, void *arg) {
    S->fds_before[rank] = th_count_fds();
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return fail_rc(rank, "tally_comm_init", rc), 1;
    S->fds_init[rank] = th_count_fds();
    rc = tally_barrier(c);
    tally_comm_free(c);
    return rc ? fail_rc(rank, "barrier", rc), 1 : 0;
}

/* Descriptors a world of n ranks, one per host, holds on rank 0 with TALLY_TCP_STREAMS=streams. */
static int fds_held(const char *streams, int n) {
    memset(S, 0, sizeof *S);
    g_streams = streams;
    g_per_host = 1;
    th_opts o = {.timeout_s = 60, .wall_s = 120, .child_env = env_hosts};
    if (th_run(n, &o, rank_coll_init_only, NULL)) return -1;
    return S->fds_init[0] - S->fds_before[0];
}

static void test_meshes(void) {
    int n = 3, one = fds_held("1", n), three = fds_held("3", n);
    TH_CHECK(one > 0 && three - one == 2 * (n - 1),
             "TALLY_TCP_STREAMS=3 on 3 hosts: rank 0 holds %d descriptors more than with 1 stream, want %d",
             three - one, 2 * (n - 1));
    /* One host: the variable changes nothing, even over tcp. */
    g_per_host = n;
    memset(S, 0, sizeof *S);
    g_streams = "4";
    th_opts o = {.transport = "tcp", .timeout_s = 60, .wall_s = 120, .child_env = env_hosts};
    int bad = th_run(n, &o, rank_coll_init_only, NULL), four = S->fds_init[0] - S->fds_before[0];
    g_streams = "1";
    memset(S, 0, sizeof *S);
    bad += th_run(n, &o, rank_coll_init_only, NULL);
    TH_CHECK(!bad && four == S->fds_init[0] - S->fds_before[0],
             "TALLY_TCP_STREAMS=4 on one host over tcp: %d descriptors, %d with 1 stream", four,
             S->fds_init[0] - S->fds_before[0]);
    printf("  meshes: %d descriptors on rank 0 with 1 stream, %d with 3 (3 hosts)\n", one, three);
}

/* ---- bad values ---- */

static void record(int rank, int rc) {
    S->code[rank] = rc;
    S->when[rank] = th_now();
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", rc ? tally_last_error() : "");
}

static int rank_init(int rank, int n, void *arg) {
    tally_comm *c = NULL;
    int rc = tally_comm_init(&c);
    record(rank, rc);
    if (!rc) tally_comm_free(c);
    return 0;
}

static void test_bad_values(void) {
    static const char *const bad[] = {"0", "abc", "17", "-1", "2.5", "3 ", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(S, 0, sizeof *S);
        g_streams = bad[i];
        g_per_host = 1;
        th_opts o = {.timeout_s = 10, .wall_s = 30, .child_env = env_hosts};
        int fails = th_run(2, &o, rank_init, NULL);
        char want[64];
        snprintf(want, sizeof want, "TALLY_TCP_STREAMS='%s'", bad[i]);
        for (int r = 0; r < 2; r++)
            TH_CHECK(!fails && S->code[r] == TALLY_E_INVALID && strstr(S->msg[r], want), "%s: rank %d got %s: '%s'",
                     want, r, tally_strerror(S->code[r]), S->msg[r]);
    }
    printf("  bad values: refused\n");
}

/* ---- a rank killed in the middle of a striped 64 MiB allreduce ---- */

#define KILL_VICTIM 1

static void *killer(void *arg) {
    usleep(30000);
    S->kill_time = th_now();
    raise(SIGKILL);
    return arg;
}

static int rank_kill(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return record(rank, rc), 1;
    size_t count = (64u << 20) / 4;
    float *buf = calloc(count, sizeof *buf);
    if (rank == KILL_VICTIM) {
        pthread_t t;
        pthread_create(&t, NULL, killer, NULL);
    }
    for (int i = 0; i < 200 && !rc; i++) rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
    record(rank, rc);
    tally_comm_free(c);
    free(buf);
    return 0;
}

static void test_kill(void) {
    int n = 3;
    memset(S, 0, sizeof *S);
    g_streams = "3";
    g_per_host = 1;
    th_opts o = {.timeout_s = 60, .wall_s = 60, .child_env = env_hosts};
    th_job job;
    if (th_start(&job, n, &o, rank_kill, NULL)) {
        TH_CHECK(0, "kill: fork failed");
        return;
    }
    th_wait(&job, 60);
    double worst = 0;
    for (int r = 0; r < n; r++) {
        if (r == KILL_VICTIM) continue;
        double late = S->when[r] - S->kill_time;
        TH_CHECK(!job.killed_by_harness[r], "kill, 3 streams: rank %d hung", r);
        TH_CHECK(S->code[r] == TALLY_E_PEER_LOST, "kill, 3 streams: rank %d got %s (%s), want PEER_LOST", r,
                 tally_strerror(S->code[r]), S->msg[r]);
        TH_CHECK(th_first_rank_named(S->msg[r]) == KILL_VICTIM,
                 "kill, 3 streams: rank %d's message names not rank %d: %s", r, KILL_VICTIM, S->msg[r]);
        TH_CHECK(S->kill_time > 0 && late < 5.0, "kill, 3 streams: rank %d returned %.2f s after the kill", r, late);
        if (late > worst) worst = late;
    }
    printf("  kill, 3 streams: survivors returned within %.3f s\n", worst);
}

/* ---- one rank striped, the other not: a mismatch, not a hang ---- */

static int rank_mismatch(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return record(rank, rc), 1;
    size_t count = rank == 0 ? (4u << 20) / 4 : 1000; /* rank 0's messages are striped, rank 1's are not */
    float *buf = calloc((4u << 20) / 4, sizeof *buf);
    rc = tally_allreduce(c, buf, buf, count, TALLY_F32, TALLY_SUM);
    record(rank, rc);
    tally_comm_free(c);
    free(buf);
    return 0;
}

static void test_mismatch(void) {
    memset(S, 0, sizeof *S);
    g_streams = "4";
    g_per_host = 1;
    th_opts o = {.algo = "ring", .timeout_s = 30, .wall_s = 60, .child_env = env_hosts};
    th_job job;
    if (th_start(&job, 2, &o, rank_mismatch, NULL)) {
        TH_CHECK(0, "mismatch: fork failed");
        return;
    }
    th_wait(&job, 60);
    for (int r = 0; r < 2; r++) {
        TH_CHECK(!job.killed_by_harness[r], "mismatch, 4 streams: rank %d hung", r);
        TH_CHECK(S->code[r] == TALLY_E_MISMATCH, "mismatch, 4 streams: rank %d got %s (%s)", r,
                 tally_strerror(S->code[r]), S->msg[r]);
    }
    printf("  mismatch, 4 streams: every rank got TALLY_E_MISMATCH\n");
}

int main(void) {
    S = th_shared_alloc(sizeof *S);
    const char *streams[] = {"1", "2", "3", "4"};
    int light = th_light();     /* the sanitizer pass: 1 and 3 streams of the four */
    for (int i = 0; i < 4; i++) /* the quick tier: 3 streams (an odd cut of the stripes) */
        if ((i == 2 && th_quick()) || (i != 2 && th_long() && (!light || i == 0))) run_coll(streams[i], 2, 1, "ring");
    if (th_long()) {
        g_added = 1;
        run_coll("3", 3, 1, "rhd"); /* a fold of halving-doubling, and three peers each */
        g_added = 0;
        if (!light) run_coll("4", 3, 1, NULL); /* the cost model's own picks */
        run_coll("2", 4, 2, "ring");           /* pairs on one host (never striped) beside pairs across */
        run_coll(NULL, 4, 2, NULL);            /* the default, with the levels (hier) */
    }
    if (!th_quick()) return th_verdict("test_stripe");
    test_meshes();
    test_bad_values();
    test_mismatch();
    test_kill();
    return th_verdict("test_stripe");
}
