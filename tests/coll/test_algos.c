/* test_algos.c - every algorithm of the table x collective x dtype x op x count x world size x in/out of
 * place on the threaded mock transport, checked bit for bit against a reference; plus barrier, the
 * descriptors and the cost model. A new algorithm is tested here by its line in the table alone. */
#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "coll/hier.h"
#include "core/numeric/dtype.h"
#include "core/numeric/reduce.h"
#include "harness.h"
#include "mock_tp.h"

/* Inputs are small integers (sums within +-32), powers of two with signs (products within 2^+-2) and
 * integers within +-30 (min, max), so every partial result is exact in every dtype, f16 and bf16
 * included, whatever order an algorithm combines in: the bound for floats is 0 and we demand
 * bitwise equality. Integers wrap identically in any order. */
enum { GUARD = 64, MAXN = 16 };
enum { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST, C_COUNT };
static const char *const coll_names[C_COUNT] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};

static const int coll_kinds[C_COUNT] = {TALLY__ALLREDUCE, TALLY__REDUCE_SCATTER, TALLY__ALLGATHER, TALLY__BROADCAST};
typedef tally__algo_desc algo;

/* bool goes the integers' way: its 0 and 1 combine as integers and come out as their truth. */
static int is_int(tally_dtype t) {
    return t == TALLY_I32 || t == TALLY_I64 || t == TALLY_U8 || t == TALLY_I8 || t == TALLY_I16 || t == TALLY_BOOL;
}

static double input(tally_op op, int rank, size_t i, tally_dtype t) {
    static const double int_prod[4] = {1, 2, -1, 3};
    switch (op) {
    case TALLY_AVG: /* a sum, divided after */
    case TALLY_SUM: return (double)((int)((i * 7 + (size_t)rank * 13) % 5) - 2);
    case TALLY_PROD: {
        if (is_int(t)) return int_prod[(i * 5 + (size_t)rank * 3) % 4];
        double v = (i + (size_t)rank) % 8 == 0 ? 2 : (i + 3 * (size_t)rank) % 8 == 4 ? 0.5 : 1;
        return (i * 3 + (size_t)rank) % 5 == 0 ? -v : v;
    }
    default: return (double)((int)((i * 31 + (size_t)rank * 17) % 61) - 30);
    }
}

/* Every input is periodic in i with period 2440 (lcm of 5, 8, 61), and so is every reference: the test
 * computes one period per rank and tiles it, so filling and checking cost no more than a copy. */
enum { PERIOD = 2440 };

/* Copies elements [start, start + len) of the periodic sequence whose first period is `pat`. */
static void tile(void *dst, const void *pat, size_t es, size_t start, size_t len) {
    char *d = dst;
    size_t k = start % PERIOD;
    while (len) {
        size_t run = PERIOD - k < len ? PERIOD - k : len;
        memcpy(d, (const char *)pat + k * es, run * es);
        d += run * es;
        len -= run;
        k = 0;
    }
}

/* Integers as the kernel sees them (u8 and bool unsigned), widened. */
static int64_t load_int(const void *buf, size_t i, tally_dtype t) {
    switch (t) {
    case TALLY_I32: return ((const int32_t *)buf)[i];
    case TALLY_I64: return ((const int64_t *)buf)[i];
    case TALLY_I16: return ((const int16_t *)buf)[i];
    case TALLY_I8: return ((const int8_t *)buf)[i];
    default: return ((const uint8_t *)buf)[i];
    }
}

static int64_t combine_int(tally_op op, int64_t acc, int64_t v) {
    switch (op) {
    case TALLY_SUM: return (int64_t)((uint64_t)acc + (uint64_t)v);
    case TALLY_PROD: return (int64_t)((uint64_t)acc * (uint64_t)v);
    case TALLY_MIN: return v < acc ? v : acc;
    case TALLY_BAND: return acc & v;
    case TALLY_BOR: return acc | v;
    case TALLY_BXOR: return acc ^ v;
    default: return v > acc ? v : acc;
    }
}

/* The reference of one element over ranks 0..n-1: exact in double for floats (see above), in
 * wrapping 64-bit arithmetic for integers (truncation commutes with + and *). */
static void reference(void *out, size_t oi, tally_op op, int n, size_t i, tally_dtype t) {
    if (op == TALLY_AVG) op = TALLY_SUM; /* make_patterns divides */
    if (is_int(t)) {
        unsigned char one[8];
        tally__dtype_store(one, 0, t, input(op, 0, i, t));
        int64_t acc = load_int(one, 0, t);
        for (int r = 1; r < n; r++) {
            tally__dtype_store(one, 0, t, input(op, r, i, t));
            acc = combine_int(op, acc, load_int(one, 0, t));
        }
        switch (t) {
        case TALLY_I32: ((int32_t *)out)[oi] = (int32_t)(uint32_t)(uint64_t)acc; break;
        case TALLY_I64: ((int64_t *)out)[oi] = acc; break;
        case TALLY_I16: ((int16_t *)out)[oi] = (int16_t)(uint16_t)(uint64_t)acc; break;
        case TALLY_I8: ((int8_t *)out)[oi] = (int8_t)(uint8_t)(uint64_t)acc; break;
        case TALLY_BOOL: ((uint8_t *)out)[oi] = acc != 0; break;
        default: ((uint8_t *)out)[oi] = (uint8_t)(uint64_t)acc; break;
        }
        return;
    }
    double acc = input(op, 0, i, t);
    for (int r = 1; r < n; r++) {
        double v = input(op, r, i, t);
        acc = op == TALLY_SUM    ? acc + v
              : op == TALLY_PROD ? acc * v
              : op == TALLY_MIN  ? (v < acc ? v : acc)
                                 : (v > acc ? v : acc);
    }
    tally__dtype_store(out, oi, t, acc);
}

/* One test case and its per-rank buffers. base[r] is the allocation (GUARD bytes each side). */
typedef struct job {
    const algo *a;
    int coll, n, root, inplace;
    tally_dtype t;
    tally_op op;
    size_t count, es;
    size_t in_elems, out_elems; /* per rank */
    char *base[MAXN], *send[MAXN], *recv[MAXN];
    size_t alloc; /* bytes between the guards */
} job;

static int run_rank(const tally__ctx *c, void *arg) {
    job *j = arg;
    int r = c->rank;
    switch (j->coll) {
    case C_ALLREDUCE: return j->a->allreduce(c, j->send[r], j->recv[r], j->count, j->t, j->op);
    case C_REDUCE_SCATTER: return j->a->reduce_scatter(c, j->send[r], j->recv[r], j->count, j->t, j->op);
    case C_ALLGATHER: return j->a->allgather(c, j->send[r], j->recv[r], j->count, j->t);
    default: return j->a->broadcast(c, j->recv[r], j->count, j->t, j->root);
    }
}

/* One period of each rank's input and of the reduction, for the case being run. */
static unsigned char pat_in[MAXN][PERIOD * 8], pat_ref[PERIOD * 8];

static void make_patterns(const job *j) {
    for (int r = 0; r < j->n; r++)
        for (size_t i = 0; i < PERIOD; i++) tally__dtype_store(pat_in[r], i, j->t, input(j->op, r, i, j->t));
    for (size_t i = 0; i < PERIOD; i++) reference(pat_ref, i, j->op, j->n, i, j->t);
    if (j->op == TALLY_AVG) tally__avg_finish(pat_ref, PERIOD, j->t, j->n); /* the library's own division */
}

static void fill_input(const job *j, void *buf, int r) {
    size_t off = j->coll == C_ALLGATHER && j->inplace ? (size_t)r * j->count : 0;
    tile((char *)buf + off * j->es, pat_in[r], j->es, 0, j->in_elems);
}

/* Lays out send/recv for the collective; in place as coll.h defines it. */
static int setup(job *j) {
    size_t es = j->es, n = (size_t)j->n;
    j->in_elems = j->coll == C_REDUCE_SCATTER ? n * j->count : j->count;
    j->out_elems = j->coll == C_ALLGATHER ? n * j->count : j->count;
    int separate = !j->inplace && j->coll != C_BROADCAST;
    make_patterns(j);
    size_t big = j->in_elems > j->out_elems ? j->in_elems : j->out_elems;
    j->alloc = (separate ? j->in_elems + j->out_elems : big) * es;
    for (int r = 0; r < j->n; r++) {
        char *b = malloc(j->alloc + 2 * GUARD);
        if (!b) return -1;
        memset(b, 0xA5, j->alloc + 2 * GUARD);
        j->base[r] = b;
        char *p = b + GUARD;
        if (separate) {
            j->send[r] = p;
            j->recv[r] = p + j->in_elems * es;
            fill_input(j, j->send[r], r);
        } else if (j->coll == C_BROADCAST) {
            j->send[r] = j->recv[r] = p;
            if (r == j->root) fill_input(j, p, r);
        } else if (j->coll == C_ALLGATHER) {
            j->recv[r] = p;
            j->send[r] = p + (size_t)r * j->count * es;
            fill_input(j, p, r);
        } else { /* allreduce, reduce_scatter: the input is the buffer */
            j->send[r] = p;
            j->recv[r] = p + (j->coll == C_REDUCE_SCATTER ? (size_t)r * j->count * es : 0);
            fill_input(j, p, r);
        }
    }
    return 0;
}

static void teardown(job *j) {
    for (int r = 0; r < j->n; r++) free(j->base[r]);
}

/* The expected output of rank r (identical on every rank except for reduce_scatter). */
static void expect(const job *j, int r, void *out) {
    switch (j->coll) {
    case C_ALLREDUCE: tile(out, pat_ref, j->es, 0, j->count); break;
    case C_REDUCE_SCATTER: tile(out, pat_ref, j->es, (size_t)r * j->count, j->count); break;
    case C_ALLGATHER:
        for (int q = 0; q < j->n; q++) tile((char *)out + (size_t)q * j->count * j->es, pat_in[q], j->es, 0, j->count);
        break;
    default: tile(out, pat_in[j->root], j->es, 0, j->count); break;
    }
}

static int guards_intact(const job *j, int r) {
    const unsigned char *b = (const unsigned char *)j->base[r];
    for (size_t k = 0; k < GUARD; k++)
        if (b[k] != 0xA5 || b[GUARD + j->alloc + k] != 0xA5) return 0;
    return 1;
}

static void describe(const job *j, char *s, size_t len) {
    snprintf(s, len, "%s %s n=%d %s %s count=%zu %s root=%d", j->a->name, coll_names[j->coll], j->n,
             tally_dtype_name(j->t), tally_op_name(j->op), j->count, j->inplace ? "in-place" : "out-of-place", j->root);
}

/* Runs one case and checks: every rank returned 0, rank 0 matches the reference bitwise, every rank
 * matches rank 0 bitwise (reduce_scatter: its own reference), out-of-place inputs are untouched, and
 * nothing was written outside the buffers. */
static void check_case(mock_world *w, job *j, char *want, char *scratch) {
    char what[160];
    int rc[MAXN];
    describe(j, what, sizeof what);
    if (setup(j)) {
        TH_CHECK(0, "%s: test out of memory", what);
        teardown(j);
        return;
    }
    int bad = mock_run(w, run_rank, j, rc);
    TH_CHECK(!bad, "%s: %s", what, mock_failure(w));
    size_t out_bytes = j->out_elems * j->es;
    int ok = !bad;
    for (int r = 0; r < j->n && ok; r++) {
        ok = rc[r] == 0;
        TH_CHECK(ok, "%s: rank %d returned %d", what, r, rc[r]);
        if (!ok) break;
        if (r == 0 || j->coll == C_REDUCE_SCATTER) expect(j, r, want);
        ok = !memcmp(j->recv[r], want, out_bytes);
        if (!ok && r > 0 && j->coll != C_REDUCE_SCATTER && !memcmp(j->recv[0], want, out_bytes))
            TH_CHECK(0, "%s: rank %d differs from rank 0", what, r);
        else
            TH_CHECK(ok, "%s: rank %d differs from the reference", what, r);
        if (ok && !j->inplace && j->coll != C_BROADCAST) {
            fill_input(j, scratch, r);
            ok = !memcmp(j->send[r], scratch, j->in_elems * j->es);
            TH_CHECK(ok, "%s: rank %d's send buffer was modified", what, r);
        }
        if (ok) {
            ok = guards_intact(j, r);
            TH_CHECK(ok, "%s: rank %d wrote outside its buffers", what, r);
        }
    }
    teardown(j);
}

/* Counts per (dtype, collective, n): 1, 7, n-1, n+1 and a large one. f32 and i32 get ~1M elements in
 * all (reduce_scatter and allgather: per rank, so ~1M/n each); the rest ~20k, still past rhd's small
 * threshold, as every dtype in the sanitizer pass and the quick tier. Duplicates are dropped. */
static int counts_for(tally_dtype t, int coll, int n, size_t *out) {
    size_t big = (t == TALLY_F32 || t == TALLY_I32) && !th_light() && th_long() ? 1000003 : 20011;
    if (coll == C_REDUCE_SCATTER || coll == C_ALLGATHER) big = big / (size_t)n + 1;
    size_t cand[5] = {1, 7, (size_t)n - 1, (size_t)n + 1, big};
    int k = 0;
    for (int i = 0; i < 5; i++) {
        int dup = 0;
        for (int q = 0; q < k; q++) dup |= out[q] == cand[i];
        if (!dup) out[k++] = cand[i];
    }
    return k;
}

/* The dtypes added last (and BXOR) run at 3 ranks in the quick tier and at 2 to 5 in the long one, to keep
 * both short; an algorithm moves their bytes as it moves the others', and its shapes at more ranks are
 * taken by the first dtypes. */
static int added_dtype(int t) { return t == TALLY_I8 || t == TALLY_I16 || t == TALLY_BOOL; }
static int added_wanted(int n) { return th_long() ? n <= 5 : n == 3; }

static void test_collectives(void) {
    static const int sizes[] = {2, 3, 4, 5, 6, 7, 8, 16};
    static const tally_op ops[] = {TALLY_SUM, TALLY_PROD, TALLY_MIN, TALLY_MAX, TALLY_AVG, TALLY_BXOR};
    enum { NOPS = sizeof ops / sizeof *ops };
    size_t cap = 2000000 * 8;
    char *want = malloc(cap), *scratch = malloc(cap);
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int n = sizes[si];
        if (!th_long() && n > 4) continue; /* the quick tier: 2, 3 and 4 ranks, the large count smaller */
        mock_world *w = mock_world_new(n, 20.0);
        for (int a = 1; a <= tally__algo_count(); a++)
            for (int coll = 0; coll < C_COUNT; coll++)
                for (int t = 0; t < TALLY_DTYPE_COUNT; t++) {
                    const algo *d = tally__algo_get(a);
                    if (!tally__algo_has(d, coll_kinds[coll])) continue;
                    if (added_dtype(t) && !added_wanted(n)) continue;
                    size_t counts[5];
                    int nc = counts_for((tally_dtype)t, coll, n, counts);
                    for (int ci = 0; ci < nc; ci++) {
                        int big = counts[ci] > 10000;
                        if (coll == C_BROADCAST) {
                            /* Every root; only two for the large count to bound the time. */
                            for (int root = 0; root < n; root++) {
                                if (big && root != 0 && root != n - 1) continue;
                                job j = {.a = d,
                                         .coll = coll,
                                         .n = n,
                                         .root = root,
                                         .inplace = 1,
                                         .t = (tally_dtype)t,
                                         .op = TALLY_SUM,
                                         .count = counts[ci],
                                         .es = tally_dtype_size((tally_dtype)t)};
                                check_case(w, &j, want, scratch);
                            }
                            continue;
                        }
                        for (int oi = 0; oi < NOPS; oi++)
                            for (int inplace = 0; inplace < 2; inplace++) {
                                tally_op op = ops[oi];
                                /* allgather ignores the op: one is enough. AVG only where the algorithm
                                 * takes it (ring's allreduce); the others get SUM and the caller divides.
                                 * A pair the entry points refuse never reaches an algorithm. BXOR stands
                                 * for the bitwise ops: an algorithm hands every op to the kernels alike. */
                                if (coll == C_ALLGATHER && oi > 0) continue;
                                if (op == TALLY_AVG && !(d->takes_avg & (1u << coll_kinds[coll]))) continue;
                                if (!tally__dtype_op_valid(t, op)) continue;
                                if (op == TALLY_BXOR && !added_wanted(n)) continue;
                                /* The large count: sum (both placements) and max; the others take the same
                                 * paths through the algorithm as they do. */
                                if (big && (op != TALLY_SUM && op != TALLY_MAX && op != TALLY_AVG)) continue;
                                if (big && inplace && op != TALLY_SUM) continue;
                                job j = {.a = d,
                                         .coll = coll,
                                         .n = n,
                                         .root = -1,
                                         .inplace = inplace,
                                         .t = (tally_dtype)t,
                                         .op = op,
                                         .count = counts[ci],
                                         .es = tally_dtype_size((tally_dtype)t)};
                                check_case(w, &j, want, scratch);
                            }
                    }
                }
        mock_world_free(w);
    }
    free(want);
    free(scratch);
}

static int barrier_rank(const tally__ctx *c, void *arg) {
    const algo *a = arg;
    for (int i = 0; i < 3; i++) {
        int rc = a->barrier(c);
        if (rc) return rc;
    }
    return 0;
}

/* Barriers complete on every size, and take the number of rounds their pattern promises. */
static void test_barriers(void) {
    for (int n = 2; n <= MAXN; n++) {
        mock_world *w = mock_world_new(n, 5.0);
        for (int a = 1; a <= tally__algo_count(); a++) {
            int rc[MAXN];
            const algo *d = tally__algo_get(a);
            int bad = mock_run(w, barrier_rank, (void *)d, rc);
            TH_CHECK(!bad, "%s barrier n=%d: %s", d->name, n, mock_failure(w));
            for (int r = 0; r < n && !bad; r++)
                TH_CHECK(rc[r] == 0, "%s barrier n=%d rank %d: %d", d->name, n, r, rc[r]);
            unsigned long long x = mock_stats_of(w, n - 1).exchanges;
            if (a == TALLY__ALGO_RHD)
                TH_CHECK(x == 3ull * (unsigned)tally__log2_ceil(n), "rhd barrier n=%d: %llu exchanges", n, x);
            if (a == TALLY__ALGO_RING)
                TH_CHECK(x == 3ull * (unsigned)(n - 1), "ring barrier n=%d: %llu exchanges", n, x);
        }
        mock_world_free(w);
    }
}

/* The mock itself: a broken rule and a missing message are reported, not hung on. */
static int broken_rank(const tally__ctx *c, void *arg) {
    int v = 0, rc = 0;
    if (*(int *)arg == 0 && c->rank == 0) { /* two sends to one peer in one exchange */
        tally__send s[2] = {{1, &v, sizeof v}, {1, &v, sizeof v}};
        rc = tally__xchg(c, s, 2, NULL, 0);
    } else if (*(int *)arg == 1 && c->rank == 0) { /* waits for a message nobody sends */
        tally__recv r = {.peer = 1, .dst = &v, .len = sizeof v, .dtype = TALLY_I32};
        rc = tally__xchg(c, NULL, 0, &r, 1);
    }
    return rc;
}

static void test_mock(void) {
    mock_world *w = mock_world_new(2, 0.3);
    int rc[2], what = 0;
    TH_CHECK(mock_run(w, broken_rank, &what, rc) == -1 && strstr(mock_failure(w), "two sends to one peer"),
             "mock: a rule violation was not reported (%s)", mock_failure(w));
    what = 1;
    TH_CHECK(mock_run(w, broken_rank, &what, rc) == -1 && strstr(mock_failure(w), "from rank 1") &&
                 rc[0] == TALLY_E_TIMEOUT,
             "mock: a hang was not reported (%s)", mock_failure(w));
    mock_world_free(w);
}

static const int model_colls[] = {TALLY__ALLREDUCE, TALLY__REDUCE_SCATTER, TALLY__ALLGATHER, TALLY__BROADCAST};

/* The table: ids, names and the named constants agree; every descriptor is whole; the lists of names. */
static void test_table(void) {
    int count = tally__algo_count();
    TH_CHECK(count >= 4 && count < TALLY__ALGO_HIER && !tally__algos[count], "the table holds %d algorithms", count);
    for (int a = TALLY__ALGO_AUTO; a >= 0; a = tally__algo_next(a))
        TH_CHECK(tally__algo_parse(tally__algo_name(a)) == a, "algo %d does not round-trip its name", a);
    for (int a = 1; a <= count; a++) {
        const algo *d = tally__algo_get(a);
        TH_CHECK(d && d == tally__algos[a - 1] && d->name && d->barrier && d->cost, "algo %d: incomplete", a);
        for (int b = 1; b < a; b++) TH_CHECK(strcmp(d->name, tally__algo_name(b)), "two algorithms named %s", d->name);
        TH_CHECK(!(d->takes_avg & (1u << TALLY__ALLGATHER | 1u << TALLY__BROADCAST | 1u << TALLY__BARRIER)),
                 "%s takes AVG where nothing is reduced", d->name);
    }
    TH_CHECK(!tally__algo_get(TALLY__ALGO_AUTO) && !tally__algo_get(TALLY__ALGO_HIER) && !tally__algo_get(count + 1),
             "auto, hier and ids past the table have no descriptor");
    TH_CHECK(!strcmp(tally__algo_name(TALLY__ALGO_RING), "ring") &&
                 !strcmp(tally__algo_name(TALLY__ALGO_TREE), "tree") &&
                 !strcmp(tally__algo_name(TALLY__ALGO_RHD), "rhd") &&
                 !strcmp(tally__algo_name(TALLY__ALGO_DIRECT), "direct"),
             "ring, tree, rhd and direct must keep ids 1-4 (the table's first lines)");
    TH_CHECK(tally__algo_parse("RING") == TALLY__ALGO_RING && tally__algo_parse("Hier") == TALLY__ALGO_HIER &&
                 tally__algo_parse("bogus") == -1 && tally__algo_parse(NULL) == -1,
             "algo_parse");
    char buf[256];
    tally__algo_names(buf, sizeof buf, TALLY__ALGO_WITH_AUTO | TALLY__ALGO_WITH_HIER, ", ", " or ");
    TH_CHECK(!strncmp(buf, "auto, ring, tree, rhd, direct", 29) && strstr(buf, " or hier") &&
                 !strcmp(strstr(buf, " or hier"), " or hier"),
             "names in words: %s", buf);
    tally__algo_names(buf, sizeof buf, 0, "|", "|");
    TH_CHECK(!strncmp(buf, "ring|tree|rhd|direct", 20) && !strstr(buf, "auto") && !strstr(buf, "hier"),
             "names for usage: %s", buf);
    tally__algo_names(buf, 8, TALLY__ALGO_WITH_AUTO, ", ", " or ");
    TH_CHECK(strlen(buf) == 7, "names cut to the buffer: %s", buf);
}

static void test_cost_model(void) {
    /* A shared-memory-like machine: 1 us per message, 10 GB/s links, 20 GB/s reduction. */
    tally__cost m = {.alpha = 1e-6, .beta = 1e-10, .gamma = 5e-11};
    for (int n = 2; n <= 64; n++)
        for (size_t bytes = 1; bytes <= ((size_t)1 << 30); bytes *= 4)
            for (int coll = 0; coll <= TALLY__BARRIER; coll++) {
                int x = tally__algo_choose(&m, coll, n, bytes), y = tally__algo_choose(&m, coll, n, bytes);
                TH_CHECK(x == y && x > TALLY__ALGO_AUTO && x <= tally__algo_count(), "choose not deterministic");
                double cx = tally__algo_cost(&m, x, coll, n, bytes);
                for (int a = 1; a <= tally__algo_count(); a++)
                    if (tally__algo_cost(&m, a, coll, n, bytes) < cx)
                        TH_CHECK(0, "choose picked %s, %s is cheaper (coll %d, n %d, %zu bytes)", tally__algo_name(x),
                                 tally__algo_name(a), coll, n, bytes);
            }
    /* Direct never beats ring for many ranks and large vectors. */
    for (int n = 8; n <= 64; n *= 2)
        for (size_t bytes = (size_t)1 << 24; bytes <= ((size_t)1 << 30); bytes <<= 3)
            for (size_t k = 0; k < sizeof model_colls / sizeof *model_colls; k++) {
                int coll = model_colls[k];
                TH_CHECK(tally__algo_cost(&m, TALLY__ALGO_DIRECT, coll, n, bytes) >
                             tally__algo_cost(&m, TALLY__ALGO_RING, coll, n, bytes),
                         "direct beats ring: coll %d n %d bytes %zu", coll, n, bytes);
                TH_CHECK(tally__algo_choose(&m, coll, n, bytes) != TALLY__ALGO_DIRECT, "direct chosen for %zu bytes",
                         bytes);
            }
    /* Small messages go to a log-latency algorithm (tree or rhd), never ring or direct. */
    for (int n = 4; n <= 64; n++) {
        int x = tally__algo_choose(&m, TALLY__ALLREDUCE, n, 8);
        TH_CHECK(x == TALLY__ALGO_RHD || x == TALLY__ALGO_TREE, "allreduce of 8 bytes on %d ranks: %s", n,
                 tally__algo_name(x));
        x = tally__algo_choose(&m, TALLY__BARRIER, n, 0);
        TH_CHECK(x == TALLY__ALGO_RHD, "barrier on %d ranks: %s", n, tally__algo_name(x));
    }
    /* Large allreduce: a bandwidth-optimal algorithm. */
    for (int n = 2; n <= 64; n++) {
        int x = tally__algo_choose(&m, TALLY__ALLREDUCE, n, (size_t)1 << 28);
        TH_CHECK(x == TALLY__ALGO_RING || x == TALLY__ALGO_RHD, "allreduce of 256 MiB on %d ranks: %s", n,
                 tally__algo_name(x));
    }
    /* A host's 8 ranks sharing its one link (levels): rhd's rounds across hosts put 8 flows on it at once,
     * so its bytes there cost 8 times; the ring's cost is the same, and it is the one picked. */
    tally__cost shared = m;
    shared.share = 8;
    size_t big = (size_t)1 << 28;
    TH_CHECK(tally__algo_cost(&shared, TALLY__ALGO_RHD, TALLY__ALLREDUCE, 64, big) >
                     4 * tally__algo_cost(&m, TALLY__ALGO_RHD, TALLY__ALLREDUCE, 64, big) &&
                 tally__algo_cost(&shared, TALLY__ALGO_RING, TALLY__ALLREDUCE, 64, big) ==
                     tally__algo_cost(&m, TALLY__ALGO_RING, TALLY__ALLREDUCE, 64, big) &&
                 tally__algo_choose(&shared, TALLY__ALLREDUCE, 64, big) == TALLY__ALGO_RING,
             "a link shared by 8 ranks: rhd should cost more, the ring the same, and the ring be picked");
    /* With no information every cost is 0: the fixed order decides. */
    tally__cost zero = {0};
    TH_CHECK(tally__algo_choose(&zero, TALLY__ALLREDUCE, 8, 1 << 20) == TALLY__ALGO_RING, "tie not broken by order");
    TH_CHECK(tally__algo_cost(&m, TALLY__ALGO_RING, TALLY__ALLREDUCE, 1, 1 << 20) == 0, "one rank costs nothing");
}

/* ---- the rooted collectives and all-to-all ----
 * Each algorithm that has one, every root (three past 8 ranks), counts 1, 7, n+1 and a large one, every
 * dtype, reduce's ops: results bit for bit, buffers only root reads left NULL elsewhere, inputs untouched,
 * nothing written past a buffer. Block k of what rank r sends (alltoall's, scatter's) is its input
 * pattern from element k * count, so every block differs. */
enum { R_REDUCE, R_GATHER, R_SCATTER, R_ALLTOALL, R_ALLTOALLV, R_COUNT };
static const int r_kinds[R_COUNT] = {TALLY__REDUCE, TALLY__GATHER, TALLY__SCATTER, TALLY__ALLTOALL, TALLY__ALLTOALLV};

typedef struct rjob {
    job j; /* a, n, root, t, op, count, es */
    int coll, inplace;
    char *send[MAXN], *recv[MAXN];
    size_t slen[MAXN], rlen[MAXN];                                         /* bytes, guards outside */
    size_t sc[MAXN][MAXN], sd[MAXN][MAXN], rc[MAXN][MAXN], rd[MAXN][MAXN]; /* alltoallv, per rank */
} rjob;

static size_t r_vcount(int from, int to, size_t scale) { return (size_t)((from * 3 + to * 5 + 1) % 4) * scale; }

static char *r_alloc(size_t len) {
    char *b = malloc(len + 2 * GUARD);
    if (b) memset(b, 0xA5, len + 2 * GUARD);
    return b ? b + GUARD : NULL;
}

static int r_intact(const char *p, size_t len) {
    for (size_t k = 0; k < GUARD; k++)
        if ((unsigned char)p[-GUARD + (long)k] != 0xA5 || (unsigned char)p[len + k] != 0xA5) return 0;
    return 1;
}

/* rank r's buffers, with what it sends filled in. */
static void r_setup(rjob *x, int r) {
    size_t n = (size_t)x->j.n, c = x->j.count, es = x->j.es;
    int root = r == x->j.root;
    x->slen[r] = x->rlen[r] = 0;
    switch (x->coll) {
    case R_REDUCE: x->slen[r] = c * es, x->rlen[r] = root && !x->inplace ? c * es : 0; break;
    case R_GATHER: x->slen[r] = c * es, x->rlen[r] = root ? n * c * es : 0; break;
    case R_SCATTER: x->slen[r] = root ? n * c * es : 0, x->rlen[r] = c * es; break;
    case R_ALLTOALL: x->slen[r] = n * c * es, x->rlen[r] = x->inplace ? 0 : n * c * es; break;
    default: {
        size_t st = 0, rt = 0;
        for (int q = 0; q < (int)n; q++) { /* a gap of one element before each block; received in reverse */
            x->sc[r][q] = r_vcount(r, q, c), x->sd[r][q] = st + 1, st += x->sc[r][q] + 1;
            int i = (int)n - 1 - q;
            x->rc[r][i] = r_vcount(i, r, c), x->rd[r][i] = rt + 1, rt += x->rc[r][i] + 1;
        }
        x->slen[r] = st * es, x->rlen[r] = rt * es;
    }
    }
    x->send[r] = x->slen[r] ? r_alloc(x->slen[r]) : NULL;
    x->recv[r] = x->rlen[r] ? r_alloc(x->rlen[r]) : NULL;
    if (x->coll == R_REDUCE || x->coll == R_GATHER) tile(x->send[r], pat_in[r], es, 0, c);
    if (x->coll == R_SCATTER && root) tile(x->send[r], pat_in[r], es, 0, n * c);
    if (x->coll == R_ALLTOALL) tile(x->send[r], pat_in[r], es, 0, n * c);
    for (int q = 0; x->coll == R_ALLTOALLV && q < (int)n; q++)
        tile(x->send[r] + x->sd[r][q] * es, pat_in[r], es, (size_t)q * 7, x->sc[r][q]);
    if (x->inplace && ((root && x->coll == R_REDUCE) || x->coll == R_ALLTOALL)) {
        x->recv[r] = x->send[r];
        x->rlen[r] = x->slen[r];
    }
}

static int r_run_rank(const tally__ctx *c, void *arg) {
    rjob *x = arg;
    int r = c->rank;
    const algo *a = x->j.a;
    switch (x->coll) {
    case R_REDUCE: return a->reduce(c, x->send[r], x->recv[r], x->j.count, x->j.t, x->j.op, x->j.root);
    case R_GATHER: return a->gather(c, x->send[r], x->recv[r], x->j.count, x->j.t, x->j.root);
    case R_SCATTER: return a->scatter(c, x->send[r], x->recv[r], x->j.count, x->j.t, x->j.root);
    case R_ALLTOALL: return a->alltoall(c, x->send[r], x->recv[r], x->j.count, x->j.t);
    default: return a->alltoallv(c, x->send[r], x->sc[r], x->sd[r], x->recv[r], x->rc[r], x->rd[r], x->j.t);
    }
}

/* 1 when out (of rank r) holds what it should. */
static int r_expect(const rjob *x, int r, const char *out, char *want) {
    size_t n = (size_t)x->j.n, c = x->j.count, es = x->j.es;
    switch (x->coll) {
    case R_REDUCE:
        if (r != x->j.root) return 1;
        tile(want, pat_ref, es, 0, c);
        return !memcmp(out, want, c * es);
    case R_GATHER:
        if (r != x->j.root) return 1;
        for (size_t q = 0; q < n; q++) tile(want + q * c * es, pat_in[q], es, 0, c);
        return !memcmp(out, want, n * c * es);
    case R_SCATTER: tile(want, pat_in[x->j.root], es, (size_t)r * c, c); return !memcmp(out, want, c * es);
    case R_ALLTOALL:
        for (size_t q = 0; q < n; q++) tile(want + q * c * es, pat_in[q], es, (size_t)r * c, c);
        return !memcmp(out, want, n * c * es);
    default:
        memset(want, 0xA5, x->rlen[r]);
        for (int i = 0; i < (int)n; i++) tile(want + x->rd[r][i] * es, pat_in[i], es, (size_t)r * 7, x->rc[r][i]);
        return !memcmp(out, want, x->rlen[r]);
    }
}

static void r_check(mock_world *w, rjob *x, char *want, int fan) {
    static const char *const names[R_COUNT] = {"reduce", "gather", "scatter", "alltoall", "alltoallv"};
    char what[220];
    snprintf(what, sizeof what, "%s %s n=%d %s %s count=%zu root=%d%s%s", x->j.a->name, names[x->coll], x->j.n,
             tally_dtype_name(x->j.t), tally_op_name(x->j.op), x->j.count, x->j.root, x->inplace ? " in place" : "",
             fan ? " (crowded shm)" : "");
    mock_fan_out(w, fan);
    for (int r = 0; r < x->j.n; r++) r_setup(x, r);
    int rc[MAXN], bad = mock_run(w, r_run_rank, x, rc);
    TH_CHECK(!bad, "%s: %s", what, mock_failure(w));
    if (!bad && x->coll == R_ALLTOALL && !strcmp(x->j.a->name, "pairwise"))
        for (int r = 0; r < x->j.n; r++)
            TH_CHECK(mock_stats_of(w, r).exchanges == (fan ? 1u : (unsigned)x->j.n - 1), "%s: rank %d: %llu exchanges",
                     what, r, mock_stats_of(w, r).exchanges);
    for (int r = 0; r < x->j.n && !bad; r++) {
        TH_CHECK(rc[r] == 0, "%s: rank %d returned %d", what, r, rc[r]);
        const char *out = x->recv[r] ? x->recv[r] : x->send[r];
        TH_CHECK(!out || r_expect(x, r, out, want), "%s: rank %d differs from the reference", what, r);
        TH_CHECK((!x->send[r] || r_intact(x->send[r], x->slen[r])) && (!x->recv[r] || r_intact(x->recv[r], x->rlen[r])),
                 "%s: rank %d wrote outside its buffers", what, r);
        int kept = 1; /* out of place, what was sent is untouched */
        if (x->send[r] && x->send[r] != x->recv[r] && x->coll != R_ALLTOALLV) {
            size_t elems = x->slen[r] / x->j.es;
            tile(want, pat_in[r], x->j.es, 0, elems);
            kept = !memcmp(x->send[r], want, x->slen[r]);
        }
        TH_CHECK(kept, "%s: rank %d's send buffer was modified", what, r);
    }
    for (int r = 0; r < x->j.n; r++) {
        if (x->recv[r] && x->recv[r] != x->send[r]) free(x->recv[r] - GUARD);
        if (x->send[r]) free(x->send[r] - GUARD);
    }
}

static void test_rooted(void) {
    static const int sizes[] = {2, 3, 4, 5, 6, 7, 8, 16};
    static const tally_op rops[] = {TALLY_SUM, TALLY_PROD, TALLY_MIN, TALLY_MAX};
    char *want = malloc(16 * 20011 * 8 + 64 * 1024);
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int n = sizes[si];
        if (!th_long() && n > 5) continue; /* the quick tier: 2 to 5 ranks */
        mock_world *w = mock_world_new(n, 20.0);
        for (int a = 1; a <= tally__algo_count(); a++)
            for (int coll = 0; coll < R_COUNT; coll++)
                for (int t = 0; t <= TALLY_U8; t++) {
                    const algo *d = tally__algo_get(a);
                    if (!tally__algo_has(d, r_kinds[coll])) continue;
                    int big_t = t == TALLY_F32 || t == TALLY_I32;
                    size_t counts[] = {1, 7, (size_t)n + 1, coll == R_ALLTOALLV ? 3001 : 20011 / (size_t)n + 1};
                    for (int ci = 0; ci < 4; ci++)
                        for (int oi = 0; oi < 4; oi++)
                            for (int root = 0; root < n; root++) {
                                int big = ci == 3, reduce = coll == R_REDUCE;
                                if (big && !big_t) continue;
                                if (oi && (!reduce || (big && oi != 3))) continue; /* ops: reduce's */
                                if (root && coll >= R_ALLTOALL) continue;          /* no root */
                                if ((n > 8 || big) && root && root != n / 2 && root != n - 1) continue;
                                rjob *x = calloc(1, sizeof *x);
                                x->j = (job){.a = d,
                                             .n = n,
                                             .root = root,
                                             .t = (tally_dtype)t,
                                             .op = rops[oi],
                                             .count = counts[ci],
                                             .es = tally_dtype_size((tally_dtype)t)};
                                x->coll = coll;
                                x->inplace = (coll == R_REDUCE || coll == R_ALLTOALL) && (ci + root) % 2;
                                make_patterns(&x->j);
                                /* pairwise posts its rounds together on a crowded shm host: both ways */
                                int fans = coll >= R_ALLTOALL && a == tally__algo_parse("pairwise") ? 2 : 1;
                                for (int fan = 0; fan < fans; fan++) r_check(w, x, want, fan);
                                free(x);
                            }
                }
        mock_world_free(w);
    }
    free(want);
}

/* The model picks among the algorithms that have each collective; hier's levels have none of them. */
static void test_rooted_model(void) {
    tally__cost m = {.alpha = 1e-6, .beta = 1e-10, .gamma = 5e-11};
    for (int k = 0; k < R_COUNT; k++)
        for (int n = 2; n <= 64; n *= 2)
            for (size_t bytes = 1; bytes <= ((size_t)1 << 30); bytes *= 16) {
                int coll = r_kinds[k], x = tally__algo_choose(&m, coll, n, bytes);
                TH_CHECK(tally__algo_has(tally__algo_get(x), coll), "coll %d n %d: %s chosen, which has none", coll, n,
                         tally__algo_name(x));
                for (int a = 1; a <= tally__algo_count(); a++)
                    TH_CHECK(tally__algo_has(tally__algo_get(a), coll) ==
                                 (tally__algo_cost(&m, a, coll, n, bytes) < HUGE_VAL),
                             "%s: cost of coll %d finite exactly where it has it", tally__algo_name(a), coll);
            }
    int pairwise = tally__algo_parse("pairwise"), bruck = tally__algo_parse("bruck");
    TH_CHECK(pairwise > 0 && bruck > 0, "pairwise and bruck are in the table");
    for (int n = 8; n <= 64; n *= 2) {
        TH_CHECK(tally__algo_choose(&m, TALLY__ALLTOALL, n, (size_t)n * 8) == bruck, "small alltoall on %d: %s", n,
                 tally__algo_name(tally__algo_choose(&m, TALLY__ALLTOALL, n, (size_t)n * 8)));
        TH_CHECK(tally__algo_choose(&m, TALLY__ALLTOALL, n, (size_t)n << 20) == pairwise, "large alltoall on %d: %s", n,
                 tally__algo_name(tally__algo_choose(&m, TALLY__ALLTOALL, n, (size_t)n << 20)));
        TH_CHECK(tally__algo_choose(&m, TALLY__REDUCE, n, (size_t)1 << 28) == TALLY__ALGO_RING,
                 "reduce of 256 MiB on %d: %s", n, tally__algo_name(tally__algo_choose(&m, TALLY__REDUCE, n, 1 << 28)));
    }
    /* Receivers that copy a root's blocks side by side (shm in place) make direct the large scatter's:
     * only from the blocks the transport reads in place, and never where one copies at a time. */
    tally__cost pulled = m;
    pulled.pull = 2;
    pulled.pull_min = (size_t)4 << 20;
    for (int n = 3; n <= 16; n++) {
        size_t big = (size_t)n << 24, small = (size_t)n << 10, below = (size_t)n * ((size_t)4 << 20) - (size_t)n;
        TH_CHECK(tally__algo_choose(&pulled, TALLY__SCATTER, n, big) == TALLY__ALGO_DIRECT, "pulled scatter on %d: %s",
                 n, tally__algo_name(tally__algo_choose(&pulled, TALLY__SCATTER, n, big)));
        TH_CHECK(tally__algo_choose(&pulled, TALLY__SCATTER, n, small) == TALLY__ALGO_TREE,
                 "small pulled scatter on %d: %s", n,
                 tally__algo_name(tally__algo_choose(&pulled, TALLY__SCATTER, n, small)));
        TH_CHECK(tally__algo_cost(&pulled, TALLY__ALGO_DIRECT, TALLY__SCATTER, n, below) ==
                     tally__algo_cost(&m, TALLY__ALGO_DIRECT, TALLY__SCATTER, n, below),
                 "blocks below pull_min on %d are copied one after another", n);
        TH_CHECK(tally__algo_choose(&m, TALLY__SCATTER, n, big) == TALLY__ALGO_TREE,
                 "scatter on %d, one copy at a time: %s", n,
                 tally__algo_name(tally__algo_choose(&m, TALLY__SCATTER, n, big)));
    }
    /* On a crowded host (more ranks than CPUs) every rank's copies take turns on the CPUs: the tree's
     * scatter forwards half the vector a round (S lg/2 bytes in all), direct moves S(n-1)/n once, so
     * direct takes the large scatter there, and the tree keeps the small one and the uncrowded host. */
    tally__cost crowded = m;
    crowded.cpus = 2;
    for (int n = 4; n <= 16; n *= 2) {
        size_t big = (size_t)n << 24, small = (size_t)n << 8;
        TH_CHECK(tally__algo_choose(&crowded, TALLY__SCATTER, n, big) == TALLY__ALGO_DIRECT,
                 "crowded scatter on %d: %s", n,
                 tally__algo_name(tally__algo_choose(&crowded, TALLY__SCATTER, n, big)));
        TH_CHECK(tally__algo_choose(&crowded, TALLY__SCATTER, n, small) == TALLY__ALGO_TREE,
                 "small crowded scatter on %d: %s", n,
                 tally__algo_name(tally__algo_choose(&crowded, TALLY__SCATTER, n, small)));
        TH_CHECK(tally__algo_cost(&crowded, TALLY__ALGO_TREE, TALLY__SCATTER, n, big) >
                     tally__algo_cost(&m, TALLY__ALGO_TREE, TALLY__SCATTER, n, big),
                 "the crowded tree on %d costs more than the uncrowded one", n);
    }
    /* No algorithm without allreduce takes the set-up traffic, allreduce or barrier from the others. */
    for (int n = 2; n <= 64; n++)
        for (size_t bytes = 1; bytes <= ((size_t)1 << 30); bytes *= 8)
            for (int coll = 0; coll <= TALLY__BARRIER; coll++) {
                const algo *d = tally__algo_get(tally__algo_choose(&m, coll, n, bytes));
                TH_CHECK(d->allreduce, "coll %d n %d bytes %zu: %s chosen", coll, n, bytes, d->name);
            }
    /* hier's levels: none of them (comm.c then takes the flat model's choice, TALLY_ALGO=hier or not) */
    tally__hier h = {.hosts = 4, .per_host = 2, .host_cost = m, .cross_cost = m};
    tally__hier_share_link(&h);
    for (int k = 0; k < R_COUNT; k++)
        TH_CHECK(tally__hier_cost(&h, r_kinds[k], 1 << 20) == HUGE_VAL, "hier has coll %d", r_kinds[k]);
    TH_CHECK(tally__hier_cost(&h, TALLY__ALLREDUCE, 1 << 20) < HUGE_VAL, "hier has allreduce");
    /* A pipelined allreduce: each chunk's crossing near the target, and the levels overlapped, so the
     * prediction lies between the longer lane's whole time and the three steps' sum. */
    h.cross_cost.beta = 1e-9 / 0.125; /* 1 Gbit/s between hosts */
    tally__hier_share_link(&h);
    for (size_t bytes = (size_t)4 << 20; bytes <= ((size_t)256 << 20); bytes *= 4) {
        int chunks = tally__hier_chunks(&h, bytes);
        tally__hier_step s[3], c[3];
        tally__hier_steps(&h, TALLY__ALLREDUCE, bytes, s);
        tally__hier_steps(&h, TALLY__ALLREDUCE, bytes / (size_t)chunks, c);
        double whole = s[0].seconds + s[1].seconds + s[2].seconds, got = tally__hier_cost(&h, TALLY__ALLREDUCE, bytes);
        TH_CHECK(chunks >= TALLY__HIER_CHUNKS_MIN && chunks <= TALLY__HIER_CHUNKS_MAX &&
                     bytes / (size_t)chunks >= TALLY__HIER_CHUNK_MIN_BYTES,
                 "%zu bytes in %d chunks", bytes, chunks);
        TH_CHECK(chunks == TALLY__HIER_CHUNKS_MIN || chunks == TALLY__HIER_CHUNKS_MAX ||
                     chunks == (int)(bytes / TALLY__HIER_CHUNK_MIN_BYTES) ||
                     fabs(c[1].seconds - TALLY__HIER_CHUNK_SECONDS) < TALLY__HIER_CHUNK_SECONDS,
                 "%zu bytes: a chunk crosses in %.3f s", bytes, c[1].seconds);
        TH_CHECK(got < whole && got >= chunks * c[1].seconds && got >= s[1].seconds * 0.9,
                 "%zu bytes: pipelined %.4f s against the steps' sum %.4f s and the crossing %.4f s", bytes, got, whole,
                 s[1].seconds);
    }
    TH_CHECK(tally__hier_chunks(&h, ((size_t)4 << 20) - 1) == 0, "under 4 MiB: no pipeline");
}

int main(void) {
    /* Keep freed big buffers in the heap: the mock allocates a copy of every message, and fresh mmaps
     * would make page faults the main cost of the test. */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    test_mock();
    test_table();
    test_cost_model();
    test_barriers();
    test_collectives();
    test_rooted_model();
    test_rooted();
    return th_verdict("test_algos");
}
