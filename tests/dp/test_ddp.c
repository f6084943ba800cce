/* test_ddp.c - the data-parallel engine through its public API in real processes: bucket layout,
 * averaging over ranks and micro-batches, overlap on and off, layers marked out of order, misuse. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <tally/ddp.h>

#include "harness.h"

/* Seven layers of uneven sizes (one empty): buckets of 64 floats are layers 6+5, 4, and 3..0. */
#define NLAYERS 7
static const size_t layer_size[NLAYERS] = {33, 1, 40, 0, 64, 17, 50};
#define BUCKET_BYTES (64 * sizeof(float))
#define MAX_ACCUM    3

typedef struct {
    int accum, no_overlap, shuffle, use_mem;
    size_t bucket_bytes;
} case_cfg;

typedef struct {
    float grad[8][256]; /* per rank: the reduced gradient */
    unsigned long long bytes[8];
    int buckets[8];
} shared_out;

static shared_out *g_out;
static case_cfg g_case;

static size_t offsets_of(size_t *off) {
    off[0] = 0;
    for (int l = 0; l < NLAYERS; l++) off[l + 1] = off[l] + layer_size[l];
    return off[NLAYERS];
}

/* What rank r adds to element i in micro-batch k: small integers, so every sum is exact. */
static float contribution(int r, int k, size_t i) { return (float)((int)((r * 5 + k * 3 + i * 7) % 13) - 6); }

static int rank_fn(int rank, int size, void *arg) {
    int fails = 0;
    tally_comm *c;
    if (tally_comm_init(&c)) {
        fprintf(stderr, "rank %d: init: %s\n", rank, tally_last_error());
        return 1;
    }
    size_t off[NLAYERS + 1], n = offsets_of(off);
    float *g = g_case.use_mem ? tally_mem_alloc(c, n * sizeof(float)) : calloc(n, sizeof(float));
    memset(g, 0, n * sizeof(float));
    tally_ddp_opts o = {.bucket_bytes = g_case.bucket_bytes, .no_overlap = g_case.no_overlap, .accum = g_case.accum};
    tally_ddp *d;
    int rc = tally_ddp_create(c, g, n, off, NLAYERS, &o, &d);
    TH_RANK_CHECK(fails, rank, rc == 0, "create: %s", tally_last_error());
    for (int step = 0; step < 2 && !rc; step++) {
        memset(g, 0, n * sizeof(float));
        for (int k = 0; k < g_case.accum && !rc; k++) {
            int sync = tally_ddp_begin(d);
            TH_RANK_CHECK(fails, rank, sync == (k == g_case.accum - 1), "begin returned %d at micro-batch %d", sync, k);
            for (int l = NLAYERS - 1; l >= 0; l--) {
                /* shuffle: rank-dependent order; the engine must still reduce buckets in one order */
                int layer = g_case.shuffle ? (l + rank * 3) % NLAYERS : l;
                for (size_t i = off[layer]; i < off[layer + 1]; i++) g[i] += contribution(rank, k, i);
                if (!(g_case.shuffle && layer == 2)) tally_ddp_layer_ready(d, layer); /* layer 2 left to wait */
            }
            rc = tally_ddp_wait(d);
            TH_RANK_CHECK(fails, rank, rc == 0, "wait: %s", tally_last_error());
        }
    }
    if (!rc) {
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < size; r++)
                for (int k = 0; k < g_case.accum; k++) want += contribution(r, k, i);
            want /= (double)size * g_case.accum;
            if (fabs(g[i] - want) > 1e-6 * (1 + fabs(want))) {
                TH_RANK_CHECK(fails, rank, 0, "element %zu is %g, expected %g", i, g[i], want);
                break;
            }
        }
        memcpy(g_out->grad[rank], g, n * sizeof(float));
        tally_ddp_stats st;
        tally_ddp_get_stats(d, &st);
        g_out->bytes[rank] = st.bytes_sent;
        g_out->buckets[rank] = st.buckets;
        TH_RANK_CHECK(fails, rank, st.reductions == 2, "%llu reductions, expected 2", st.reductions);
        TH_RANK_CHECK(fails, rank, size == 1 || st.bytes_sent > 0, "no bytes counted");
    }
    tally_ddp_free(d);
    if (g_case.use_mem)
        tally_mem_free(c, g);
    else
        free(g);
    tally_comm_free(c);
    return fails != 0;
}

static void run_case(const char *transport, int n, case_cfg cc, float (*keep)[256]) {
    g_case = cc;
    memset(g_out, 0, sizeof *g_out);
    th_opts o = {.transport = transport, .timeout_s = 20};
    int rc = th_run(n, &o, rank_fn, NULL);
    TH_CHECK(rc == 0, "%s n=%d accum=%d overlap=%d shuffle=%d mem=%d: a rank failed", transport, n, cc.accum,
             !cc.no_overlap, cc.shuffle, cc.use_mem);
    for (int r = 1; r < n; r++)
        TH_CHECK(!memcmp(g_out->grad[0], g_out->grad[r], sizeof g_out->grad[0]),
                 "%s n=%d: rank %d's averaged gradient differs from rank 0's", transport, n, r);
    if (keep) memcpy(keep, g_out->grad[0], sizeof *keep);
}

/* The layout rule: from the last layer back, a bucket closes once it holds bucket_bytes or more. */
static void check_layout(void) {
    setenv("TALLY_RANK", "0", 1);
    setenv("TALLY_WORLD_SIZE", "1", 1);
    tally_comm *c;
    if (tally_comm_init(&c)) {
        TH_CHECK(0, "init world of 1: %s", tally_last_error());
        return;
    }
    size_t off[NLAYERS + 1], n = offsets_of(off), b, e;
    float *g = calloc(n, sizeof(float));
    tally_ddp *d;
    tally_ddp_opts o = {.bucket_bytes = BUCKET_BYTES};
    TH_CHECK(tally_ddp_create(c, g, n, off, NLAYERS, &o, &d) == 0, "create: %s", tally_last_error());
    const size_t want[][2] = {{off[5], off[7]}, {off[4], off[5]}, {off[0], off[4]}};
    for (int i = 0; i < 3; i++) {
        TH_CHECK(tally_ddp_bucket(d, i, &b, &e) == 0 && b == want[i][0] && e == want[i][1],
                 "bucket %d is [%zu,%zu), expected [%zu,%zu)", i, b, e, want[i][0], want[i][1]);
    }
    TH_CHECK(tally_ddp_bucket(d, 3, &b, &e) == TALLY_E_INVALID, "a fourth bucket exists");
    /* misuse is refused with a message, and leaves the engine usable */
    TH_CHECK(tally_ddp_layer_ready(d, 0) == TALLY_E_INVALID, "layer_ready before begin accepted");
    TH_CHECK(tally_ddp_wait(d) == TALLY_E_INVALID, "wait before begin accepted");
    TH_CHECK(tally_ddp_begin(d) == 1, "begin: %s", tally_last_error());
    TH_CHECK(tally_ddp_begin(d) == TALLY_E_INVALID && strstr(tally_last_error(), "tally_ddp_wait"),
             "begin twice accepted or unexplained: %s", tally_last_error());
    TH_CHECK(tally_ddp_layer_ready(d, NLAYERS) == TALLY_E_INVALID, "layer %d accepted", NLAYERS);
    TH_CHECK(tally_ddp_wait(d) == 0, "wait: %s", tally_last_error());
    tally_ddp_free(d);
    /* one bucket for everything by default (25 MiB) */
    TH_CHECK(tally_ddp_create(c, g, n, off, NLAYERS, NULL, &d) == 0 && tally_ddp_bucket(d, 0, &b, &e) == 0 && b == 0 &&
                 e == n && tally_ddp_bucket(d, 1, NULL, NULL) == TALLY_E_INVALID,
             "default options do not give one bucket");
    tally_ddp_free(d);
    size_t bad[NLAYERS + 1];
    memcpy(bad, off, sizeof bad);
    bad[3] = bad[2] - 1;
    TH_CHECK(tally_ddp_create(c, g, n, bad, NLAYERS, NULL, &d) == TALLY_E_INVALID &&
                 strstr(tally_last_error(), "decrease"),
             "decreasing offsets accepted: %s", tally_last_error());
    TH_CHECK(tally_ddp_create(c, g, n + 1, off, NLAYERS, NULL, &d) == TALLY_E_INVALID, "count mismatch accepted");
    free(g);
    tally_comm_free(c);
    unsetenv("TALLY_RANK");
    unsetenv("TALLY_WORLD_SIZE");
}

int main(void) {
    g_out = th_shared_alloc(sizeof *g_out);
    check_layout();
    static float ref[256], other[256];
    const char *transports[] = {"shm", "tcp"};
    for (int t = 0; t < 2; t++) {
        for (int n = 1; n <= 4; n++) {
            if (t == 1 && n == 1) continue;
            case_cfg base = {.accum = 1, .bucket_bytes = BUCKET_BYTES};
            run_case(transports[t], n, base, &ref);
            case_cfg off = base;
            off.no_overlap = 1;
            run_case(transports[t], n, off, &other);
            TH_CHECK(!memcmp(ref, other, sizeof ref), "%s n=%d: overlap on and off differ", transports[t], n);
            case_cfg acc = base;
            acc.accum = MAX_ACCUM;
            run_case(transports[t], n, acc, NULL);
            case_cfg shuf = base;
            shuf.shuffle = 1;
            shuf.use_mem = 1;
            run_case(transports[t], n, shuf, &other);
            TH_CHECK(!memcmp(ref, other, sizeof ref), "%s n=%d: layers out of order change the result", transports[t],
                     n);
        }
    }
    /* At n = 2 every algorithm sends at least the whole gradient once per reduction. */
    case_cfg one = {.accum = 1, .bucket_bytes = 1 << 20};
    run_case("shm", 2, one, NULL);
    TH_CHECK(g_out->buckets[0] == 1, "%d buckets at 1 MiB, expected 1", g_out->buckets[0]);
    TH_CHECK(g_out->bytes[0] >= 2 * 205 * sizeof(float), "bytes sent %llu too few", g_out->bytes[0]);
    th_shared_free(g_out, sizeof *g_out);
    return th_verdict("test_ddp");
}
