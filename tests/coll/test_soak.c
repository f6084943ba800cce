/* test_soak.c - a soak of random collectives on N ranks (default 4), each result checked against a
 * reference every rank computes from the same seeded inputs; bench/soak.sh runs it at 10,000 calls. */

/* One seeded stream draws, identically on every rank, the collective, dtype, op, size, root, in place
 * or not, and the communicator: TALLY_ALGO and TALLY_TRANSPORT are read by tally_comm_init, so every
 * rank holds one communicator per (transport, algorithm) and each call draws which one it runs on.
 * Knobs: TALLY_SOAK_COUNT (collectives; default 400, 120 with TALLY_TEST_LIGHT=1), TALLY_SOAK_SEED
 * (default: from the clock, printed), TALLY_SOAK_RANKS (2..8, default 4), TALLY_SOAK_MAXBYTES (largest
 * payload of one call; default 4 MiB, 512 KiB light). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <time.h>
#include <unistd.h>

#include "core/numeric/dtype.h"
#include "harness.h"

#define SOAK_COLLS 5
#define SOAK_ALGOS 5
#define SOAK_TPS   2
#define SOAK_COMMS (SOAK_ALGOS * SOAK_TPS)

enum { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST, C_BARRIER };
static const char *const coll_names[SOAK_COLLS] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"};
static const char *const algo_names[SOAK_ALGOS] = {"ring", "tree", "rhd", "direct", "auto"};
static const char *const tp_names[SOAK_TPS] = {"shm", "tcp"};

/* Inputs: integer values sized so that every sum and product over the ranks is exact and cannot
 * overflow, or (float dtypes only, half the calls) fractions checked against a rounding bound. */
enum { V_INT, V_FRAC };

typedef struct call {
    uint64_t index;
    int coll, dtype, op, root, in_place, comm, vals;
    size_t count; /* per rank: allreduce/broadcast length, reduce_scatter recvcount, allgather sendcount */
} call;

typedef struct soak_out {
    uint64_t seed;
    long count;
    size_t maxbytes;
    int wrong, errors;
    long done[SOAK_COLLS], per_comm[SOAK_COMMS], per_dtype[TALLY_DTYPE_COUNT];
    double coll_s; /* rank 0: seconds inside collectives */
    double wall_s; /* rank 0: seconds from the first call to the last, checks included */
    double bytes;  /* rank 0: payload bytes of every call (per rank) */
    char first[600];
} soak_out;

static soak_out *O;

/* ---- seeded streams ---- */

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The stream every rank draws the calls from, identically. */
static uint64_t draw(uint64_t *s) { return mix(*s += 0x632be59bd9b4e019ull); }
static size_t draw_below(uint64_t *s, size_t n) { return n ? (size_t)(draw(s) % n) : 0; }

/* ---- inputs and the reference ---- */

static int is_float(int t) { return t == TALLY_F32 || t == TALLY_F64 || t == TALLY_F16 || t == TALLY_BF16; }

/* The value as the dtype stores it. */
static double rounded(int t, double v) {
    unsigned char tmp[8];
    tally__dtype_store(tmp, 0, (tally_dtype)t, v);
    return tally__dtype_load(tmp, 0, (tally_dtype)t);
}

/* Largest magnitude of an integer input for a sum of n of them to stay exact in the dtype. */
static double sum_limit(int t, int n) {
    switch (t) {
    case TALLY_F16: return floor(2048.0 / n); /* f16 holds integers exactly up to 2^11 */
    case TALLY_BF16: return floor(256.0 / n); /* bf16 up to 2^8 */
    case TALLY_F32: return floor(16777216.0 / n);
    case TALLY_U8: return floor(255.0 / n);
    case TALLY_I8: return floor(127.0 / n);
    case TALLY_I16: return floor(32767.0 / n);
    case TALLY_BOOL: return 1;
    case TALLY_I32: return 1e6;
    default: return 1e12; /* f64, i64: far inside 2^53 */
    }
}

/* Element j of rank r's input for call c, as stored. */
static double input(const soak_out *o, const call *c, int n, int r, size_t j) {
    uint64_t h = mix(o->seed ^ mix(c->index * 0x100000001b3ull + (uint64_t)r) ^ (j * 0xd6e8feb86659fd93ull));
    double u = (double)(h >> 11) * 0x1.0p-53; /* [0, 1) */
    int t = c->dtype, op = c->op;
    if (c->coll == C_ALLGATHER || c->coll == C_BROADCAST) op = TALLY_MIN; /* any value moves unchanged */
    if (t == TALLY_BOOL) return (double)(h % 4 != 0);
    if (c->vals == V_FRAC) {
        if (op == TALLY_PROD) return rounded(t, (h & 1 ? -1 : 1) * (0.5 + 1.5 * u));
        return rounded(t, op == TALLY_MIN || op == TALLY_MAX ? 1000 * (2 * u - 1) : 2 * u - 1);
    }
    if (op == TALLY_PROD) { /* |product| <= 2^n: exact in every dtype for n <= 7 */
        if (t == TALLY_U8) return 1 + (double)(h % 2);
        static const double pv[4] = {-2, -1, 1, 2};
        return pv[h % 4];
    }
    int whole = op == TALLY_MIN || op == TALLY_MAX || op == TALLY_BAND || op == TALLY_BOR || op == TALLY_BXOR;
    double lim = whole ? (t == TALLY_U8 ? 255 : sum_limit(t, 1)) : sum_limit(t, n);
    if (t == TALLY_U8) return (double)(h % ((uint64_t)lim + 1));
    return rounded(t, (double)(int64_t)(h % (2 * (uint64_t)lim + 1)) - lim);
}

static double combine(int op, double a, double b) {
    switch (op) {
    case TALLY_PROD: return a * b;
    case TALLY_MIN: return b < a ? b : a;
    case TALLY_MAX: return b > a ? b : a;
    case TALLY_BAND: return (double)((int64_t)a & (int64_t)b);
    case TALLY_BOR: return (double)((int64_t)a | (int64_t)b);
    case TALLY_BXOR: return (double)((int64_t)a ^ (int64_t)b);
    default: return a + b;
    }
}

/* Unit roundoff of a float dtype. */
static double unit(int t) {
    switch (t) {
    case TALLY_F16: return 0x1.0p-11;
    case TALLY_BF16: return 0x1.0p-8;
    case TALLY_F32: return 0x1.0p-24;
    default: return 0x1.0p-53;
    }
}

/* Checks one reduced element (index j of the full vector) against the reference. 1 if right. */
static int check_reduced(const soak_out *o, const call *c, int n, size_t j, double got) {
    double acc = input(o, c, n, 0, j), mag = fabs(acc);
    for (int r = 1; r < n; r++) {
        double v = input(o, c, n, r, j);
        acc = combine(c->op, acc, v);
        mag = c->op == TALLY_PROD ? mag * fabs(v) : mag + fabs(v);
    }
    int t = c->dtype;
    if (!is_float(t)) { /* exact: integer division truncates, as C does */
        if (c->op == TALLY_AVG) acc = t == TALLY_U8 ? floor(acc / n) : trunc(acc / n);
        return got == rounded(t, acc); /* a product may wrap (i8 at 2^7); a bool's sum is its or */
    }
    if (c->op == TALLY_MIN || c->op == TALLY_MAX) return got == acc;
    double want = c->op == TALLY_AVG ? acc / n : acc, scale = c->op == TALLY_AVG ? mag / n : mag;
    /* Partial results are rounded to the dtype at each of up to n hops (f16/bf16 accumulate in f32
     * inside a step, but travel as themselves), then once more at the end. */
    double tol = c->vals == V_INT && c->op != TALLY_AVG ? 0 : 2.0 * n * unit(t) * scale + unit(t) * fabs(want);
    if (t == TALLY_F16) tol += 0x1.0p-24 * n; /* subnormal spacing */
    return fabs(got - want) <= tol;
}

/* ---- drawing a call ---- */

static size_t draw_count(uint64_t *s, int n, size_t max_elems) {
    size_t k = draw_below(s, 100), c;
    if (k < 6)
        c = 0;
    else if (k < 12)
        c = 1;
    else if (k < 20)
        c = (size_t)n * (1 + draw_below(s, 8)) + 1 + draw_below(s, (size_t)n - 1); /* not divisible by n */
    else if (k < 60)
        c = 2 + draw_below(s, 999);
    else if (k < 93)
        c = 1000 + draw_below(s, 64 * 1024);
    else
        c = draw_below(s, max_elems + 1);
    if (c > max_elems) c = max_elems;
    return c;
}

static call draw_call(uint64_t *s, uint64_t index, int n, size_t maxbytes) {
    call c = {.index = index};
    c.coll = (int)draw_below(s, SOAK_COLLS);
    c.dtype = (int)draw_below(s, TALLY_DTYPE_COUNT);
    do /* a pair the entry points refuse is drawn again: check_refused in test_coll tests those */
        c.op = (int)draw_below(s, TALLY_OP_COUNT);
    while (!tally__dtype_op_valid(c.dtype, c.op));
    c.root = (int)draw_below(s, (size_t)n);
    c.in_place = (int)draw_below(s, 2);
    c.comm = (int)draw_below(s, SOAK_COMMS);
    c.vals = is_float(c.dtype) && draw_below(s, 2) ? V_FRAC : V_INT;
    size_t es = tally_dtype_size((tally_dtype)c.dtype), per = maxbytes / es;
    if (c.coll == C_REDUCE_SCATTER || c.coll == C_ALLGATHER) per /= (size_t)n; /* the whole vector stays in bounds */
    c.count = c.coll == C_BARRIER ? 0 : draw_count(s, n, per);
    return c;
}

/* ---- running and checking one call ---- */

static void note_wrong(const call *c, int rank, size_t j, double got, const char *what) {
    if (__sync_fetch_and_add(&O->wrong, 1) == 0)
        snprintf(O->first, sizeof O->first,
                 "rank %d, call %" PRIu64 " (seed %" PRIu64 "): %s %s %s/%s count %zu root %d %s on %s/%s: element "
                 "%zu is %.17g",
                 rank, c->index, O->seed, what, coll_names[c->coll], tally_dtype_name((tally_dtype)c->dtype),
                 tally_op_name((tally_op)c->op), c->count, c->root, c->in_place ? "in place" : "out of place",
                 tp_names[c->comm / SOAK_ALGOS], algo_names[c->comm % SOAK_ALGOS], j, got);
}

static void note_error(const call *c, int rank, int rc) {
    if (__sync_fetch_and_add(&O->errors, 1) == 0 && !O->first[0])
        snprintf(O->first, sizeof O->first, "rank %d, call %" PRIu64 " (seed %" PRIu64 "): %s on %s/%s returned %s: %s",
                 rank, c->index, O->seed, coll_names[c->coll], tp_names[c->comm / SOAK_ALGOS],
                 algo_names[c->comm % SOAK_ALGOS], tally_strerror(rc), tally_last_error());
}

static void fill(void *buf, const call *c, int n, int r, size_t from, size_t len) {
    for (size_t j = 0; j < len; j++) tally__dtype_store(buf, j, (tally_dtype)c->dtype, input(O, c, n, r, from + j));
}

/* Runs one call on comm; returns its error code, adds seconds spent inside the collective to *secs. */
static int run_call(tally_comm *comm, const call *c, int rank, int n, double *secs) {
    size_t es = tally_dtype_size((tally_dtype)c->dtype), cnt = c->count, total = cnt * (size_t)n;
    tally_dtype t = (tally_dtype)c->dtype;
    tally_op op = (tally_op)c->op;
    unsigned char *a = malloc(total * es + 8), *b = malloc(total * es + 8), *in, *out;
    int rc = 0, bad = 0;
    double t0 = 0;
    switch (c->coll) {
    case C_ALLREDUCE:
        fill(a, c, n, rank, 0, cnt);
        out = c->in_place ? a : b;
        t0 = th_now();
        rc = tally_allreduce(comm, a, out, cnt, t, op);
        *secs += th_now() - t0;
        for (size_t j = 0; !rc && j < cnt && !bad; j++)
            if (!check_reduced(O, c, n, j, tally__dtype_load(out, j, t)))
                note_wrong(c, rank, j, tally__dtype_load(out, j, t), "reduced"), bad = 1;
        break;
    case C_REDUCE_SCATTER:
        fill(a, c, n, rank, 0, total);
        out = c->in_place ? a + (size_t)rank * cnt * es : b;
        t0 = th_now();
        rc = tally_reduce_scatter(comm, a, out, cnt, t, op);
        *secs += th_now() - t0;
        for (size_t j = 0; !rc && j < cnt && !bad; j++)
            if (!check_reduced(O, c, n, (size_t)rank * cnt + j, tally__dtype_load(out, j, t)))
                note_wrong(c, rank, (size_t)rank * cnt + j, tally__dtype_load(out, j, t), "reduced"), bad = 1;
        break;
    case C_ALLGATHER:
        memset(b, 0xA5, total * es);
        in = c->in_place ? b + (size_t)rank * cnt * es : a;
        fill(in, c, n, rank, 0, cnt);
        t0 = th_now();
        rc = tally_allgather(comm, in, b, cnt, t);
        *secs += th_now() - t0;
        for (size_t j = 0; !rc && j < total && !bad; j++) {
            double got = tally__dtype_load(b, j, t);
            if (got != input(O, c, n, (int)(j / cnt), j % cnt)) note_wrong(c, rank, j, got, "gathered"), bad = 1;
        }
        break;
    case C_BROADCAST:
        if (rank == c->root)
            fill(a, c, n, rank, 0, cnt);
        else
            memset(a, 0xA5, cnt * es);
        t0 = th_now();
        rc = tally_broadcast(comm, a, cnt, t, c->root);
        *secs += th_now() - t0;
        for (size_t j = 0; !rc && j < cnt && !bad; j++) {
            double got = tally__dtype_load(a, j, t);
            if (got != input(O, c, n, c->root, j)) note_wrong(c, rank, j, got, "broadcast"), bad = 1;
        }
        break;
    default:
        t0 = th_now();
        rc = tally_barrier(comm);
        *secs += th_now() - t0;
    }
    free(a);
    free(b);
    if (rc) note_error(c, rank, rc);
    return rc;
}

/* ---- the ranks ---- */

static int open_comms(tally_comm **comms, int rank) {
    for (int k = 0; k < SOAK_COMMS; k++) {
        setenv("TALLY_TRANSPORT", tp_names[k / SOAK_ALGOS], 1);
        setenv("TALLY_ALGO", algo_names[k % SOAK_ALGOS], 1);
        int rc = tally_comm_init(&comms[k]);
        if (rc) {
            snprintf(O->first, sizeof O->first, "rank %d: tally_comm_init (%s, %s): %s", rank, tp_names[k / SOAK_ALGOS],
                     algo_names[k % SOAK_ALGOS], tally_last_error());
            O->errors++;
            while (k-- > 0) tally_comm_free(comms[k]);
            return rc;
        }
    }
    return 0;
}

static int fn_soak(int rank, int n, void *arg) {
    tally_comm *comms[SOAK_COMMS];
    setenv("TALLY_COST", "2,5,10", 1); /* the algorithm is forced (or drawn by this model): no measuring */
    if (open_comms(comms, rank)) return 1;
    uint64_t s = O->seed;
    double secs = 0, t0 = th_now(), bytes = 0;
    for (long i = 0; i < O->count && !O->errors; i++) {
        call c = draw_call(&s, (uint64_t)i, n, O->maxbytes);
        if (run_call(comms[c.comm], &c, rank, n, &secs)) break;
        if (rank == 0) {
            O->done[c.coll]++;
            O->per_comm[c.comm]++;
            O->per_dtype[c.dtype]++;
            bytes += (double)c.count * (double)tally_dtype_size((tally_dtype)c.dtype) *
                     (c.coll == C_REDUCE_SCATTER || c.coll == C_ALLGATHER ? n : 1);
        }
    }
    if (rank == 0) {
        O->coll_s = secs;
        O->wall_s = th_now() - t0;
        O->bytes = bytes;
    }
    for (int k = 0; k < SOAK_COMMS; k++) tally_comm_free(comms[k]);
    return O->errors || O->wrong ? 1 : 0;
}

static long env_long(const char *name, long def) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 0) : def;
}

int main(void) {
    O = th_shared_alloc(sizeof *O);
    int light = th_light(), n = (int)env_long("TALLY_SOAK_RANKS", 4);
    O->count = env_long("TALLY_SOAK_COUNT", light ? 120 : 400);
    O->maxbytes = (size_t)env_long("TALLY_SOAK_MAXBYTES", light ? 512 << 10 : 4 << 20);
    const char *sv = getenv("TALLY_SOAK_SEED");
    O->seed = sv && *sv ? strtoull(sv, NULL, 0) : mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
    if (n < 2 || n > 8 || O->count < 0 || O->maxbytes < 64) {
        fprintf(stderr, "test_soak: TALLY_SOAK_RANKS must be 2..8, TALLY_SOAK_COUNT >= 0, TALLY_SOAK_MAXBYTES >= 64\n");
        return 2;
    }
    printf("soak: seed %" PRIu64 " (TALLY_SOAK_SEED=%" PRIu64 " repeats this run), %d ranks, %ld collectives, "
           "payloads up to %zu bytes\n",
           O->seed, O->seed, n, O->count, O->maxbytes);
    fflush(stdout);
    /* The wall limit grows with the count: 10,000 calls with checks take minutes on a small machine. */
    th_opts o = {.timeout_s = 60, .wall_s = 120 + 0.2 * (double)O->count};
    double t0 = th_now();
    int bad = th_run(n, &o, fn_soak, NULL);
    double wall = th_now() - t0;
    long total = 0;
    for (int k = 0; k < SOAK_COLLS; k++) total += O->done[k];
    printf("soak: %ld collectives", total);
    for (int k = 0; k < SOAK_COLLS; k++) printf("%s%ld %s", k ? ", " : " (", O->done[k], coll_names[k]);
    printf(")\nsoak: per transport/algorithm:");
    for (int k = 0; k < SOAK_COMMS; k++)
        printf(" %s/%s %ld", tp_names[k / SOAK_ALGOS], algo_names[k % SOAK_ALGOS], O->per_comm[k]);
    printf("\nsoak: per dtype:");
    for (int t = 0; t < TALLY_DTYPE_COUNT; t++) printf(" %s %ld", tally_dtype_name((tally_dtype)t), O->per_dtype[t]);
    printf("\nsoak: %.1f s in collectives (%.0f collectives/s, %.2f GB of payload per rank), %.1f s with the "
           "checks (%.0f collectives/s), %.1f s in all with start-up\n",
           O->coll_s, O->coll_s > 0 ? total / O->coll_s : 0, O->bytes * 1e-9, O->wall_s,
           O->wall_s > 0 ? total / O->wall_s : 0, wall);
    printf("soak: #wrong %d, errors %d\n", O->wrong, O->errors);
    TH_CHECK(bad == 0 && O->wrong == 0 && O->errors == 0, "soak (seed %" PRIu64 "): %s", O->seed,
             O->first[0] ? O->first : "a rank failed");
    TH_CHECK(total == O->count, "soak: %ld of %ld collectives ran", total, O->count);
    th_shared_free(O, sizeof *O);
    return th_verdict("test_soak");
}
