/* cmd_bench.c - `tally bench`: times a collective over a range of sizes and prints the nccl-tests
 * table (time, algbw, busbw, #wrong for out-of-place and in-place) and the average bus bandwidth, for each
 * algorithm and transport asked for in turn; --svg charts busbw against size, one series for each. */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <time.h>
#include <unistd.h>

#include "../src/coll/coll.h"
#include "../src/core/numeric/dtype.h"
#include "../src/core/parse.h"
#include "cmd.h"
#include "flags.h"
#include "launch.h"
#include "place.h"
#include "charts/svg_chart.h"

#define BENCH_MAX_ROWS  1000
#define BENCH_MAX_BYTES (64ull << 30)
#define BENCH_MAX_LIST  5 /* names in --algo or --transport: each at most once */

typedef enum { B_ALLREDUCE, B_REDUCE_SCATTER, B_ALLGATHER, B_BROADCAST } bench_coll;
static const char *bench_coll_names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};

typedef struct {
    bench_coll coll;
    int n;
    size_t minb, maxb;
    double factor;
    tally_dtype dtype;
    tally_op op;
    int root, iters, warmup, check;
    int shared_mem; /* --shared-mem: buffers from tally_mem_alloc, which shm peers read in place */
    const char *bind, *svg, *trace;
    /* --algo and --transport: each combination is timed in turn, transports outer; none given: one pass
     * with what the environment says (NULL) */
    const char *algo[BENCH_MAX_LIST], *transport[BENCH_MAX_LIST];
    int nalgo, ntransport;
    char algo_buf[64], transport_buf[64]; /* the lists' words */
} bench_opts;

/* What rank 0 keeps of one combination for --svg: out-of-place busbw at each size. */
typedef struct bench_series {
    char name[48];
    int colour, dash; /* a colour per algorithm, a line style per transport */
    double bytes[BENCH_MAX_ROWS + 1], busbw[BENCH_MAX_ROWS + 1];
    size_t n;
} bench_series;

typedef struct {
    tally_comm *c;
    int rank, size;
    size_t esize;
    char *send, *recv; /* max-size buffers */
} bench_ctx;

static double bench_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void bench_usage(FILE *f) {
    char algos[256];
    tally__algo_names(algos, sizeof algos, TALLY__ALGO_WITH_AUTO, "|", "|");
    fprintf(f,
            "usage: tally bench allreduce|reduce_scatter|allgather|broadcast [-n N] [-b MIN] [-e MAX] [-f FACTOR]\n"
            "                   [-t f32|f64|f16|bf16|i32|i64|u8|i8|i16|bool] [-o sum|avg|prod|min|max|band|bor|bxor]\n"
            "                   [-r ROOT]\n"
            "                   [--algo %s[,...]] [--transport auto|shm|tcp[,...]]\n"
            "                   [--iters I] [--warmup W] [--shared-mem] [--bind core|none] [-c] [--svg FILE]\n"
            "                   [--trace FILE]\n"
            "Sizes (1 byte to 64G) accept K/M/G (powers of 1024); from MIN to MAX, times FACTOR (> 1) each row,\n"
            "at most %d rows. -c checks every result and counts wrong elements.\n"
            "With -n N (and no rank environment) it starts N local ranks of itself, rank r on its own CPU\n"
            "when they fit (--bind none, or TALLY_CPU_BIND=none, leaves their affinity as it is).\n"
            "--shared-mem takes the buffers from tally_mem_alloc (read in place by shm peers).\n"
            "--algo and --transport take comma-separated lists (--algo ring,rhd,tree): every combination is\n"
            "timed in turn, a fresh communicator each, one table after another.\n"
            "--svg FILE writes a chart of busbw (out-of-place) against size, one line per algorithm and\n"
            "transport. --trace FILE writes the timeline of every call on every rank (Chrome trace JSON).\n",
            algos, BENCH_MAX_ROWS);
}

static int bench_parse_coll(const char *s, bench_coll *out) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, bench_coll_names[i])) return *out = (bench_coll)i, 0;
    return -1;
}

/* auto and the flat algorithms, as --algo takes them (hier needs ranks on several hosts), NULL-ended. */
static void bench_algos(const char **w) {
    int k = 0;
    for (int a = TALLY__ALGO_AUTO; a >= 0 && a != TALLY__ALGO_HIER; a = tally__algo_next(a))
        w[k++] = tally__algo_name(a);
    w[k] = NULL;
}
static const char *const bench_transports[] = {"auto", "shm", "tcp", NULL};

/* A comma-separated list of distinct words, each one of `words`, into out[] (pointing into buf). */
static int bench_parse_list(const char *flag, const char *a, const char *const *words, const char *accepts, char *buf,
                            size_t cap, const char **out, int *n) {
    char why[96];
    if (!*a) return tally__parse_fail(flag, a, "", accepts);
    if (strlen(a) >= cap) return tally__parse_fail(flag, a, "is too long", accepts);
    memcpy(buf, a, strlen(a) + 1);
    *n = 0;
    for (char *tok = buf, *comma;; tok = comma + 1) {
        int k;
        if ((comma = strchr(tok, ','))) *comma = '\0';
        for (k = 0; words[k] && strcmp(words[k], tok); k++) {}
        for (int i = 0; words[k] && i < *n; i++)
            if (!strcmp(out[i], tok)) return tally__parse_fail(flag, a, "names one twice", accepts);
        if (!words[k] || *n == BENCH_MAX_LIST) {
            snprintf(why, sizeof why, "has '%.40s', which is not one", tok);
            return tally__parse_fail(flag, a, *tok ? why : "has an empty name", accepts);
        }
        out[(*n)++] = tok;
        if (!comma) return 0;
    }
}
static int bench_parse_one(int ch, const char *flag, const char *a, void *ctx) {
    bench_opts *o = ctx;
    long long v;
    uint64_t b;
    int k;
    switch (ch) {
    case 'n': return tally__parse_int(flag, a, 1, TALLY_LAUNCH_MAX_RANKS, &v) ? -1 : (o->n = (int)v, 0);
    case 'b': return tally__parse_bytes(flag, a, 1, BENCH_MAX_BYTES, &b) ? -1 : (o->minb = (size_t)b, 0);
    case 'e': return tally__parse_bytes(flag, a, 1, BENCH_MAX_BYTES, &b) ? -1 : (o->maxb = (size_t)b, 0);
    case 'f': return tally__parse_real(flag, a, 1, 1, 1 << 20, &o->factor);
    case 't':
        if ((k = tally_dtype_parse(a)) < 0)
            return tally__parse_fail(flag, a, "is not a type",
                                     "it takes f32, f64, f16, bf16, i32, i64, u8, i8, i16 or bool");
        return o->dtype = (tally_dtype)k, 0;
    case 'o':
        if ((k = tally_op_parse(a)) < 0)
            return tally__parse_fail(flag, a, "is not an operation",
                                     "it takes sum, avg, prod, min, max, band, bor or bxor");
        return o->op = (tally_op)k, 0;
    case 'r': return tally__parse_int(flag, a, 0, TALLY_LAUNCH_MAX_RANKS - 1, &v) ? -1 : (o->root = (int)v, 0);
    case 'c': return o->check = 1, 0;
    case 'A': {
        const char *words[TALLY__ALGO_HIER + 1]; /* ids run below hier's */
        char names[256], takes[320];
        bench_algos(words);
        tally__algo_names(names, sizeof names, TALLY__ALGO_WITH_AUTO, ", ", " or ");
        snprintf(takes, sizeof takes, "it takes %s, or several comma-separated (ring,rhd)", names);
        return bench_parse_list(flag, a, words, takes, o->algo_buf, sizeof o->algo_buf, o->algo, &o->nalgo);
    }
    case 'T':
        return bench_parse_list(flag, a, bench_transports,
                                "it takes auto, shm or tcp, or several comma-separated (shm,tcp)", o->transport_buf,
                                sizeof o->transport_buf, o->transport, &o->ntransport);
    case 'V': return *a ? (o->svg = a, 0) : tally__parse_fail(flag, a, "", "it takes a file to write");
    case 'R': return *a ? (o->trace = a, 0) : tally__parse_fail(flag, a, "", "it takes a file to write");
    case 'I': return tally__parse_int(flag, a, 1, 1000000000, &v) ? -1 : (o->iters = (int)v, 0);
    case 'W': return tally__parse_int(flag, a, 0, 1000000000, &v) ? -1 : (o->warmup = (int)v, 0);
    case 'S': return o->shared_mem = 1, 0;
    case 'B': return tally_place_parse(flag, a, &k) ? -1 : (o->bind = a, 0);
    default: return -1;
    }
}

/* Rows from MIN to MAX: a factor just above 1 would make millions of them. */
static int bench_rows(const bench_opts *o) {
    int rows = 0;
    for (double s = (double)o->minb; s <= (double)o->maxb * 1.0000001 && rows <= BENCH_MAX_ROWS; s *= o->factor) rows++;
    return rows;
}

/* 0 to run, 1 for --help (printed), 2 after a message about a bad flag. */
static int bench_parse(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.n = 0,
                      .minb = 8,
                      .maxb = 64u << 20,
                      .factor = 2,
                      .dtype = TALLY_F32,
                      .op = TALLY_SUM,
                      .iters = 20,
                      .warmup = 5};
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) return bench_usage(stdout), 1;
    if (argc < 2)
        return tally_flags_usage_error("bench", "which collective? allreduce, reduce_scatter, allgather or broadcast");
    if (bench_parse_coll(argv[1], &o->coll))
        return tally_flags_usage_error("bench",
                                       "'%s' is not a collective: it takes allreduce, reduce_scatter, allgather "
                                       "or broadcast, then the flags",
                                       argv[1]);
    static const struct option longs[] = {
        {"algo", required_argument, 0, 'A'},  {"transport", required_argument, 0, 'T'},
        {"iters", required_argument, 0, 'I'}, {"warmup", required_argument, 0, 'W'},
        {"shared-mem", no_argument, 0, 'S'},  {"bind", required_argument, 0, 'B'},
        {"svg", required_argument, 0, 'V'},   {"trace", required_argument, 0, 'R'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    const tally_flags f = {.cmd = "bench",
                           .shorts = "n:b:e:f:t:o:r:ch",
                           .longs = longs,
                           .first = 2,
                           .one = bench_parse_one,
                           .usage = bench_usage};
    int rc = tally_flags_parse(&f, argc, argv, o);
    if (rc) return rc;
    if (o->minb > o->maxb)
        return tally_flags_usage_error("bench", "-b %zu is above -e %zu: the smallest size comes first", o->minb,
                                       o->maxb);
    if (o->coll <= B_REDUCE_SCATTER && !tally__dtype_op_valid(o->dtype, o->op))
        return tally_flags_usage_error("bench", "-o %s does not take -t %s: %s takes %s", tally_op_name(o->op),
                                       tally_dtype_name(o->dtype), tally_op_name(o->op), tally__op_takes(o->op));
    if (o->trace && (o->nalgo > 1 || o->ntransport > 1))
        return tally_flags_usage_error("bench",
                                       "--trace %s times one algorithm and transport: give the lists to a run "
                                       "without it",
                                       o->trace);
    if (bench_rows(o) > BENCH_MAX_ROWS)
        return tally_flags_usage_error("bench", "-f %.10g from -b %zu to -e %zu makes more than %d rows: raise -f",
                                       o->factor, o->minb, o->maxb, BENCH_MAX_ROWS);
    return 0;
}

/* Elements each rank contributes and receives at a size, as nccl-tests counts them. */
static void bench_counts(const bench_opts *o, const bench_ctx *b, size_t bytes, size_t *count, size_t *per_rank) {
    size_t total = bytes / b->esize;
    if (o->coll == B_REDUCE_SCATTER || o->coll == B_ALLGATHER) {
        *per_rank = total / (size_t)b->size;
        *count = *per_rank * (size_t)b->size;
    } else {
        *per_rank = *count = total;
    }
}

static double bench_busbw_factor(bench_coll coll, int n) {
    if (coll == B_ALLREDUCE) return 2.0 * (n - 1) / n;
    if (coll == B_BROADCAST) return 1.0;
    return (double)(n - 1) / n;
}

/* Small integers (1 or 2 for prod) keep every reduction exact in every dtype, so -c can demand
 * equality. */
static double bench_input(int rank, size_t i, tally_op op) {
    return op == TALLY_PROD ? (double)(1 + ((rank + i) % 4 == 0)) : (double)((rank + i) % 3);
}

static int bench_is_float(tally_dtype t) {
    return t == TALLY_F32 || t == TALLY_F64 || t == TALLY_F16 || t == TALLY_BF16;
}

/* v as a buffer of dtype t holds it (bool: 0 or 1). */
static double bench_stored(tally_dtype t, double v) {
    char tmp[8];
    tally__dtype_store(tmp, 0, t, v);
    return tally__dtype_load(tmp, 0, t);
}

/* The inputs are small and non-negative, so a bool's or is their sum and its and their product or min. */
static double bench_combine(tally_op op, double acc, double v) {
    switch (op) {
    case TALLY_PROD: return acc * v;
    case TALLY_MIN: return v < acc ? v : acc;
    case TALLY_MAX: return v > acc ? v : acc;
    case TALLY_BAND: return (double)((int64_t)acc & (int64_t)v);
    case TALLY_BOR: return (double)((int64_t)acc | (int64_t)v);
    case TALLY_BXOR: return (double)((int64_t)acc ^ (int64_t)v);
    default: return acc + v;
    }
}

static double bench_expected_reduce(const bench_opts *o, int n, size_t i) {
    double acc = bench_stored(o->dtype, bench_input(0, i, o->op));
    for (int r = 1; r < n; r++) acc = bench_combine(o->op, acc, bench_stored(o->dtype, bench_input(r, i, o->op)));
    if (o->dtype == TALLY_U8) acc = (double)(uint8_t)(uint64_t)acc;
    char tmp[8];
    tally__dtype_store(tmp, 0, o->dtype, acc);
    acc = tally__dtype_load(tmp, 0, o->dtype);
    if (o->op == TALLY_AVG) {
        if (o->dtype == TALLY_F64)
            acc /= n;
        else if (bench_is_float(o->dtype))
            acc = (double)((float)acc / (float)n);
        else
            acc = (double)((int64_t)acc / n);
        tally__dtype_store(tmp, 0, o->dtype, acc);
        acc = tally__dtype_load(tmp, 0, o->dtype);
    }
    return acc;
}

/* Value expected at element i of the output on this rank. */
static double bench_expected(const bench_opts *o, const bench_ctx *b, size_t per_rank, size_t i) {
    switch (o->coll) {
    case B_ALLREDUCE: return bench_expected_reduce(o, b->size, i);
    case B_REDUCE_SCATTER: return bench_expected_reduce(o, b->size, (size_t)b->rank * per_rank + i);
    case B_ALLGATHER: return bench_stored(o->dtype, bench_input((int)(i / per_rank), i % per_rank, TALLY_SUM));
    default: return bench_stored(o->dtype, bench_input(o->root, i, TALLY_SUM));
    }
}

/* Where one call reads and writes, out of place or in place. */
static void bench_buffers(const bench_opts *o, const bench_ctx *b, int in_place, size_t per_rank, char **send,
                          char **recv) {
    size_t block = per_rank * b->esize * (size_t)b->rank;
    *send = b->send;
    *recv = in_place ? b->send : b->recv;
    if (in_place && o->coll == B_REDUCE_SCATTER) *recv = b->send + block;
    if (in_place && o->coll == B_ALLGATHER) *send = b->send + block, *recv = b->send;
    if (o->coll == B_BROADCAST) *send = *recv;
}

static void bench_fill(const bench_opts *o, const bench_ctx *b, char *send, size_t per_rank) {
    size_t n = o->coll == B_REDUCE_SCATTER ? per_rank * (size_t)b->size : per_rank;
    int who = o->coll == B_BROADCAST ? (b->rank == o->root ? o->root : -1) : b->rank;
    for (size_t i = 0; i < n; i++) tally__dtype_store(send, i, o->dtype, who < 0 ? 0 : bench_input(who, i, o->op));
}

static int bench_call(const bench_opts *o, const bench_ctx *b, char *send, char *recv, size_t per_rank) {
    switch (o->coll) {
    case B_ALLREDUCE: return tally_allreduce(b->c, send, recv, per_rank, o->dtype, o->op);
    case B_REDUCE_SCATTER: return tally_reduce_scatter(b->c, send, recv, per_rank, o->dtype, o->op);
    case B_ALLGATHER: return tally_allgather(b->c, send, recv, per_rank, o->dtype);
    default: return tally_broadcast(b->c, recv, per_rank, o->dtype, o->root);
    }
}

static int bench_report_error(const bench_ctx *b, const char *what, int rc) {
    fprintf(stderr, "tally bench: rank %d: %s failed: %s\n%s\n", b->rank, what, tally_strerror(rc), tally_last_error());
    return rc;
}

/* Runs the check once; returns the wrong elements summed over all ranks, or -1 on error. */
static long long bench_check(const bench_opts *o, const bench_ctx *b, int in_place, size_t per_rank) {
    char *send, *recv;
    bench_buffers(o, b, in_place, per_rank, &send, &recv);
    bench_fill(o, b, send, per_rank);
    if (bench_call(o, b, send, recv, per_rank)) return -1;
    size_t n = o->coll == B_ALLGATHER ? per_rank * (size_t)b->size : per_rank;
    long long wrong = 0;
    for (size_t i = 0; i < n; i++) {
        double got = tally__dtype_load(recv, i, o->dtype), want = bench_expected(o, b, per_rank, i);
        wrong += !(got == want || (isnan(got) && isnan(want)));
    }
    if (tally_allreduce(b->c, &wrong, &wrong, 1, TALLY_I64, TALLY_SUM)) return -1;
    return wrong;
}

/* Mean seconds per call, the slowest rank's. */
static int bench_time(const bench_opts *o, const bench_ctx *b, int in_place, size_t per_rank, double *sec) {
    char *send, *recv;
    bench_buffers(o, b, in_place, per_rank, &send, &recv);
    int rc;
    for (int i = 0; i < o->warmup; i++)
        if ((rc = bench_call(o, b, send, recv, per_rank))) return bench_report_error(b, "warm-up", rc);
    if ((rc = tally_barrier(b->c))) return bench_report_error(b, "barrier", rc);
    double t0 = bench_now();
    for (int i = 0; i < o->iters; i++)
        if ((rc = bench_call(o, b, send, recv, per_rank))) return bench_report_error(b, bench_coll_names[o->coll], rc);
    *sec = (bench_now() - t0) / o->iters;
    if ((rc = tally_allreduce(b->c, sec, sec, 1, TALLY_F64, TALLY_MAX))) return bench_report_error(b, "timing", rc);
    return 0;
}

static void bench_header(const bench_opts *o, const bench_ctx *b, const char *algo) {
    printf("# tally bench %s: %d ranks, transport %s, algo %s, %s %s, iters %d, warmup %d, check %s\n",
           bench_coll_names[o->coll], b->size, tally_comm_transport(b->c), algo ? algo : "auto",
           tally_dtype_name(o->dtype), o->coll <= B_REDUCE_SCATTER ? tally_op_name(o->op) : "-", o->iters, o->warmup,
           o->check ? "on" : "off");
    const char *large = tally_comm_large_path(b->c);
    if (large[0])
        printf("# large messages: %s; this run's buffers: %s\n", large,
               o->shared_mem ? "tally_mem_alloc (--shared-mem)" : "malloc");
    printf("#\n");
    printf("# %76s %30s\n", "out-of-place", "in-place");
    printf("# %10s %12s %6s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s  %s\n", "size", "count", "type", "redop", "root",
           "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "algo");
    printf("# %10s %12s %6s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static void bench_cell(double sec, size_t bytes, double factor, long long wrong, int check) {
    double algbw = sec > 0 ? bytes / sec / 1e9 : 0;
    char w[24];
    if (check)
        snprintf(w, sizeof w, "%lld", wrong);
    else
        snprintf(w, sizeof w, "N/A");
    printf(" %9.2f %7.2f %7.2f %6s", sec * 1e6, algbw, algbw * factor, w);
}

/* The table for one algorithm (NULL: as the environment says); rank 0 keeps its rows in `keep` (or NULL). */
static int bench_run(const bench_opts *o, bench_ctx *b, const char *algo, bench_series *keep) {
    double factor = bench_busbw_factor(o->coll, b->size), sum_busbw = 0;
    long long total_wrong = 0;
    int rows = 0;
    if (b->rank == 0) bench_header(o, b, algo);
    for (double s = (double)o->minb; s <= (double)o->maxb * 1.0000001; s *= o->factor) {
        size_t bytes = (size_t)s, count, per_rank;
        bench_counts(o, b, bytes, &count, &per_rank);
        bytes = count * b->esize;
        double sec[2];
        long long wrong[2] = {0, 0};
        for (int ip = 0; ip < 2; ip++) {
            if (bench_time(o, b, ip, per_rank, &sec[ip])) return 1;
            if (o->check && (wrong[ip] = bench_check(o, b, ip, per_rank)) < 0)
                return bench_report_error(b, "check", -1), 1;
            total_wrong += wrong[ip];
            sum_busbw += sec[ip] > 0 ? bytes / sec[ip] / 1e9 * factor : 0;
        }
        rows += 2;
        if (b->rank == 0) {
            printf("  %10zu %12zu %6s %6s %6d", bytes, count, tally_dtype_name(o->dtype),
                   o->coll <= B_REDUCE_SCATTER ? tally_op_name(o->op) : "none", o->coll == B_BROADCAST ? o->root : -1);
            bench_cell(sec[0], bytes, factor, wrong[0], o->check);
            bench_cell(sec[1], bytes, factor, wrong[1], o->check);
            printf("  %s\n", tally_comm_algo_for(b->c, bytes));
            fflush(stdout);
            if (keep && keep->n <= BENCH_MAX_ROWS) {
                keep->bytes[keep->n] = (double)bytes;
                keep->busbw[keep->n++] = sec[0] > 0 ? bytes / sec[0] / 1e9 * factor : NAN;
            }
        }
    }
    if (b->rank == 0) {
        printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n", rows ? sum_busbw / rows : 0.0);
        printf("#\n");
    }
    return total_wrong ? 1 : 0;
}

static void bench_release(const bench_opts *o, bench_ctx *b) {
    if (o->shared_mem) {
        tally_mem_free(b->c, b->send);
        tally_mem_free(b->c, b->recv);
        return;
    }
    free(b->send);
    free(b->recv);
}

/* One combination on a communicator of its own; *size: the world's. */
static int bench_as_rank(const bench_opts *o, const char *algo, bench_series *keep, int *rank, int *size) {
    bench_ctx b = {0};
    int rc = tally_comm_init(&b.c);
    if (rc) {
        fprintf(stderr, "tally bench: tally_comm_init failed: %s\n%s\n", tally_strerror(rc), tally_last_error());
        return 1;
    }
    *rank = b.rank = tally_comm_rank(b.c);
    *size = b.size = tally_comm_size(b.c);
    if (keep) { /* "ring / shm", or "ring / shm (auto)" when auto chose it */
        const char *asked = getenv("TALLY_TRANSPORT"), *used = tally_comm_transport(b.c);
        int chosen = o->ntransport && asked && strcmp(asked, used);
        snprintf(keep->name, sizeof keep->name, "%s / %s%s%s%s", algo ? algo : "auto", used, chosen ? " (" : "",
                 chosen ? asked : "", chosen ? ")" : "");
    }
    b.esize = tally_dtype_size(o->dtype);
    int bad = 0;
    if (o->root < 0 || o->root >= b.size) {
        if (b.rank == 0) fprintf(stderr, "tally bench: root %d is out of range for %d ranks\n", o->root, b.size);
        bad = 1;
    }
    size_t span = o->maxb + (size_t)b.size * b.esize + 64; /* reduce_scatter/allgather use whole blocks */
    if (!bad) {
        b.send = o->shared_mem ? tally_mem_alloc(b.c, span) : malloc(span);
        b.recv = o->shared_mem ? tally_mem_alloc(b.c, span) : malloc(span);
        if (!b.send || !b.recv) {
            fprintf(stderr, "tally bench: rank %d: cannot allocate 2 x %zu bytes\n", b.rank, span);
            bad = 1;
        } else {
            memset(b.send, 0, span);
            memset(b.recv, 0, span);
        }
    }
    if (!bad) bad = bench_run(o, &b, algo, b.rank == 0 ? keep : NULL);
    bench_release(o, &b);
    if (tally_comm_free(b.c) && o->trace) {
        fprintf(stderr, "tally bench: --trace %s: %s\n", o->trace, tally_last_error());
        bad = 1;
    } else if (o->trace && b.rank == 0) {
        fprintf(stderr, "tally bench: timeline of %d ranks in %s (ui.perfetto.dev or chrome://tracing opens it)\n",
                b.size, o->trace);
    }
    return bad;
}

/* Rank 0's chart of every combination's busbw against size. */
static int bench_chart(const bench_opts *o, const bench_series *s, int n, int size) {
    char title[128];
    snprintf(title, sizeof title, "tally bench %s: %d ranks, %s %s", bench_coll_names[o->coll], size,
             tally_dtype_name(o->dtype), o->coll <= B_REDUCE_SCATTER ? tally_op_name(o->op) : "");
    tally_svg_chart c = {.title = title, .npanels = 1};
    tally_svg_panel *p = &c.panel[0];
    p->title = "bus bandwidth against message size (out-of-place)";
    p->x = (tally_svg_axis){.title = "message size (bytes)", .scale = TALLY_SVG_LOG2, .units = TALLY_SVG_BYTES};
    p->y = (tally_svg_axis){.title = "busbw (GB/s)", .from_zero = 1};
    for (int i = 0; i < n; i++) {
        tally_svg_series *line = tally_svg_add(p, s[i].name, s[i].bytes, s[i].busbw, s[i].n);
        if (!line) break; /* past the chart's series: 5 algorithms x 3 transports stay below it */
        line->colour = s[i].colour;
        line->dash = s[i].dash;
    }
    if (!tally_svg_write(o->svg, &c)) return 0;
    fprintf(stderr, "tally bench: --svg %s: %s\n", o->svg, tally_last_error());
    return 1;
}

/* This process is a rank: every combination in turn, transports outer, each on a fresh communicator (the
 * library reads TALLY_TRANSPORT and TALLY_ALGO at init); the first that fails ends the run on every rank. */
static int bench_ranks(const bench_opts *o) {
    int nt = o->ntransport ? o->ntransport : 1, na = o->nalgo ? o->nalgo : 1, bad = 0, rank = -1, size = 0;
    bench_series *keep = o->svg ? calloc((size_t)(nt * na), sizeof *keep) : NULL;
    if (o->svg && !keep) return fprintf(stderr, "tally bench: out of memory for --svg\n"), 1;
    for (int t = 0; t < nt && !bad; t++)
        for (int a = 0; a < na && !bad; a++) {
            if (o->ntransport) setenv("TALLY_TRANSPORT", o->transport[t], 1);
            if (o->nalgo) setenv("TALLY_ALGO", o->algo[a], 1);
            if (keep) keep[t * na + a].colour = a + 1, keep[t * na + a].dash = t;
            bad = bench_as_rank(o, o->nalgo ? o->algo[a] : NULL, keep ? &keep[t * na + a] : NULL, &rank, &size);
        }
    if (!bad && rank == 0 && keep) bad = bench_chart(o, keep, nt * na, size);
    free(keep);
    return bad;
}

int tally_cmd_bench(int argc, char **argv) {
    bench_opts o;
    int prc = bench_parse(argc, argv, &o);
    if (prc) return prc == 1 ? 0 : 2;
    if (o.nalgo == 1) setenv("TALLY_ALGO", o.algo[0], 1);
    if (o.ntransport == 1) setenv("TALLY_TRANSPORT", o.transport[0], 1);
    if (o.trace) setenv("TALLY_TRACE", o.trace, 1);
    if (!tally_launch_in_rank()) {
        tally_launch_opts lo = {.n = o.n ? o.n : 2,
                                .transport = o.ntransport == 1 ? o.transport[0] : NULL, /* a list: each rank sets it */
                                .prefix_output = 0,
                                .name = "tally bench",
                                .bind = o.bind};
        return tally_launch_self(&lo, argc, argv);
    }
    return bench_ranks(&o);
}
