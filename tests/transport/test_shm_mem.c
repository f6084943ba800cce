/* test_shm_mem.c - tally_mem_alloc buffers with every collective on shm (read in place by the peers) and
 * on tcp (plain memory): exact results, offsets inside regions, mixed ranks, alloc/free churn, bad frees. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tally.h>
#include "harness.h"

/* How a rank gets its buffers. */
enum { BUF_SHARED, BUF_OFFSET, BUF_MIXED };

typedef struct cfg {
    int bufs;
    const char *transport;
} cfg;

typedef struct rank_ctx {
    tally_comm *c;
    int rank, size, fails, shared;
    size_t off;
} rank_ctx;

#define RCHECK(x, cond, ...) TH_RANK_CHECK((x)->fails, (x)->rank, cond, __VA_ARGS__)

/* ---- buffers ---------------------------------------------------------------------------------- */

static void *buf_get(rank_ctx *x, size_t bytes) {
    if (!x->shared) return malloc(bytes ? bytes : 1);
    unsigned char *p = tally_mem_alloc(x->c, bytes + x->off);
    RCHECK(x, p != NULL, "tally_mem_alloc(%zu): %s", bytes + x->off, tally_last_error());
    RCHECK(x, !p || (uintptr_t)p % 64 == 0, "tally_mem_alloc returned %p, not 64-byte aligned", (void *)p);
    return p ? p + x->off : NULL;
}

static void buf_put(rank_ctx *x, void *p) {
    if (!x->shared) {
        free(p);
        return;
    }
    if (!p) return;
    int rc = tally_mem_free(x->c, (unsigned char *)p - x->off);
    RCHECK(x, rc == 0, "tally_mem_free: %s", tally_strerror(rc));
}

/* Small integers keep float sums exact whatever the order of the reduction. */
static float val_f(int rank, size_t i, int salt) { return (float)((i * 7 + (size_t)rank * 3 + (size_t)salt) % 16); }
static int32_t val_i(int rank, size_t i) { return (int32_t)((i * 13 + (size_t)rank * 101) % 1000) - 500; }

static float sum_f(int size, size_t i, int salt) {
    float s = 0;
    for (int r = 0; r < size; r++) s += val_f(r, i, salt);
    return s;
}

static int32_t max_i(int size, size_t i) {
    int32_t m = val_i(0, i);
    for (int r = 1; r < size; r++) m = val_i(r, i) > m ? val_i(r, i) : m;
    return m;
}

/* ---- collectives ------------------------------------------------------------------------------ */

static void check_f(rank_ctx *x, const char *what, const float *got, size_t n, size_t base, int salt) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != sum_f(x->size, base + i, salt) && bad++ == 0) first = i;
    RCHECK(x, bad == 0, "%s of %zu f32: %zu wrong, first at %zu (%g, want %g)", what, n, bad, first,
           bad ? got[first] : 0.0, bad ? sum_f(x->size, base + first, salt) : 0.0);
}

static void t_allreduce(rank_ctx *x, size_t n, int salt) {
    float *s = buf_get(x, n * 4), *r = buf_get(x, n * 4);
    if (!s || !r) goto out;
    for (size_t i = 0; i < n; i++) s[i] = val_f(x->rank, i, salt);
    int rc = tally_allreduce(x->c, s, r, n, TALLY_F32, TALLY_SUM);
    RCHECK(x, rc == 0, "allreduce: %s", tally_last_error());
    check_f(x, "allreduce", r, n, 0, salt);
    rc = tally_allreduce(x->c, s, s, n, TALLY_F32, TALLY_SUM);
    RCHECK(x, rc == 0, "allreduce in place: %s", tally_last_error());
    check_f(x, "allreduce in place", s, n, 0, salt);
out:
    buf_put(x, s);
    buf_put(x, r);
}

static void t_allreduce_max(rank_ctx *x, size_t n) {
    int32_t *s = buf_get(x, n * 4), *r = buf_get(x, n * 4);
    if (!s || !r) goto out;
    for (size_t i = 0; i < n; i++) s[i] = val_i(x->rank, i);
    int rc = tally_allreduce(x->c, s, r, n, TALLY_I32, TALLY_MAX);
    RCHECK(x, rc == 0, "allreduce max: %s", tally_last_error());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += r[i] != max_i(x->size, i);
    RCHECK(x, bad == 0, "allreduce i32 max of %zu: %zu wrong", n, bad);
out:
    buf_put(x, s);
    buf_put(x, r);
}

static void t_reduce_scatter(rank_ctx *x, size_t n) {
    size_t all = n * (size_t)x->size;
    float *s = buf_get(x, all * 4), *r = buf_get(x, n * 4);
    if (!s || !r) goto out;
    for (size_t i = 0; i < all; i++) s[i] = val_f(x->rank, i, 5);
    int rc = tally_reduce_scatter(x->c, s, r, n, TALLY_F32, TALLY_SUM);
    RCHECK(x, rc == 0, "reduce_scatter: %s", tally_last_error());
    check_f(x, "reduce_scatter", r, n, n * (size_t)x->rank, 5);
out:
    buf_put(x, s);
    buf_put(x, r);
}

static void t_allgather(rank_ctx *x, size_t n) {
    size_t all = n * (size_t)x->size, bad = 0;
    int32_t *s = buf_get(x, n * 4), *r = buf_get(x, all * 4);
    if (!s || !r) goto out;
    for (size_t i = 0; i < n; i++) s[i] = val_i(x->rank, i);
    int rc = tally_allgather(x->c, s, r, n, TALLY_I32);
    RCHECK(x, rc == 0, "allgather: %s", tally_last_error());
    for (size_t i = 0; i < all; i++) bad += r[i] != val_i((int)(i / n), i % n);
    RCHECK(x, bad == 0, "allgather of %zu i32 per rank: %zu wrong", n, bad);
out:
    buf_put(x, s);
    buf_put(x, r);
}

static void t_broadcast(rank_ctx *x, size_t n) {
    int root = 1 % x->size;
    size_t bad = 0;
    int32_t *b = buf_get(x, n * 4);
    if (!b) return;
    for (size_t i = 0; i < n; i++) b[i] = x->rank == root ? val_i(root, i) : -1;
    int rc = tally_broadcast(x->c, b, n, TALLY_I32, root);
    RCHECK(x, rc == 0, "broadcast: %s", tally_last_error());
    for (size_t i = 0; i < n; i++) bad += b[i] != val_i(root, i);
    RCHECK(x, bad == 0, "broadcast of %zu i32 from %d: %zu wrong", n, root, bad);
    buf_put(x, b);
}

static int rank_open(rank_ctx *x, int rank, int size) {
    memset(x, 0, sizeof *x);
    x->rank = rank;
    x->size = size;
    int rc = tally_comm_init(&x->c);
    if (rc) fprintf(stderr, "rank %d: tally_comm_init: %s\n", rank, tally_last_error());
    return rc;
}

static int rank_colls(int rank, int size, void *arg) {
    const cfg *g = arg;
    rank_ctx x;
    if (rank_open(&x, rank, size)) return 1;
    RCHECK(&x, !strcmp(tally_comm_transport(x.c), g->transport), "transport %s, want %s", tally_comm_transport(x.c),
           g->transport);
    size_t mem_min = tally_comm_mem_min(x.c), want = !strcmp(g->transport, "shm") ? 256u << 10 : 0;
    RCHECK(&x, mem_min == want, "tally_comm_mem_min %zu over %s, want %zu", mem_min, g->transport, want);
    x.shared = g->bufs != BUF_MIXED || rank % 2 == 0;
    x.off = g->bufs == BUF_OFFSET ? 64 : 0;
    size_t sizes[] = {1024, 1u << 20, (16u << 20) + 4};
    int nsizes = th_light() || !th_long() ? 2 : 3; /* the sanitizer pass and the quick tier: up to 1 MiB */
    for (int k = 0; k < nsizes; k++) {
        size_t n = sizes[k] / 4;
        t_allreduce(&x, n, k);
        t_allreduce_max(&x, n);
        t_reduce_scatter(&x, n / (size_t)size + 1);
        t_allgather(&x, n / (size_t)size + 1);
        t_broadcast(&x, n);
    }
    tally_comm_free(x.c);
    return x.fails ? 1 : 0;
}

/* ---- allocation churn and misuse -------------------------------------------------------------- */

static void churn(rank_ctx *x, int rounds) {
    size_t n = (1u << 20) / 4; /* above the in-place minimum at 4 ranks: each round the peers map a new region */
    for (int k = 0; k < rounds; k++) {
        float *s = tally_mem_alloc(x->c, n * 4), *r = tally_mem_alloc(x->c, n * 4);
        RCHECK(x, s && r, "tally_mem_alloc in round %d: %s", k, tally_last_error());
        if (!s || !r) return;
        /* Fresh values each round: a peer that read a stale region (a reused id) would be caught. */
        for (size_t i = 0; i < n; i++) s[i] = val_f(x->rank, i, k);
        int rc = tally_allreduce(x->c, s, r, n, TALLY_F32, TALLY_SUM);
        RCHECK(x, rc == 0, "allreduce in round %d: %s", k, tally_last_error());
        check_f(x, "churn allreduce", r, n, 0, k);
        RCHECK(x, tally_mem_free(x->c, s) == 0 && tally_mem_free(x->c, r) == 0, "free in round %d", k);
    }
}

static void misuse(rank_ctx *x) {
    int local;
    char *heap = malloc(64), *p = tally_mem_alloc(x->c, 4096);
    RCHECK(x, tally_mem_free(x->c, NULL) == 0, "tally_mem_free(NULL) failed");
    RCHECK(x, tally_mem_free(x->c, heap) == TALLY_E_INVALID, "freeing a malloc'd pointer was accepted");
    RCHECK(x, tally_mem_free(x->c, &local) == TALLY_E_INVALID, "freeing a stack pointer was accepted");
    RCHECK(x, p && tally_mem_free(x->c, p + 64) == TALLY_E_INVALID, "freeing an inner pointer was accepted");
    RCHECK(x, tally_mem_free(x->c, p) == 0, "tally_mem_free: %s", tally_last_error());
    RCHECK(x, tally_mem_free(x->c, p) == TALLY_E_INVALID, "a double free was accepted");
    RCHECK(x, tally_mem_free(NULL, heap) == TALLY_E_INVALID, "a NULL communicator was accepted");
    RCHECK(x, tally_mem_alloc(NULL, 64) == NULL, "tally_mem_alloc with a NULL communicator succeeded");
    void *zero = tally_mem_alloc(x->c, 0);
    RCHECK(x, zero && tally_mem_free(x->c, zero) == 0, "a 0-byte allocation did not round-trip");
    /* Teardown after a failure keeps the failure's message, as free() keeps errno. */
    p = tally_mem_alloc(x->c, 64);
    RCHECK(x, tally_mem_free(x->c, heap) == TALLY_E_INVALID, "freeing a malloc'd pointer was accepted");
    (void)tally_mem_free(x->c, NULL);
    RCHECK(x, p && tally_mem_free(x->c, p) == 0 && strstr(tally_last_error(), "did not come from tally_mem_alloc"),
           "a successful tally_mem_free cleared the last error (now \"%s\")", tally_last_error());
    free(heap);
}

static int rank_churn(int rank, int size, void *arg) {
    rank_ctx x;
    if (rank_open(&x, rank, size)) return 1;
    churn(&x, 2); /* let setup's and the first mappings' descriptors settle before counting */
    int fds = th_count_fds();
    churn(&x, th_light() || !th_long() ? 20 : 100); /* the sanitizer pass and the quick tier: 20 */
    misuse(&x);
    int after = th_count_fds();
    RCHECK(&x, fds >= 0 && after == fds, "open descriptors went from %d to %d over alloc/free churn", fds, after);
    /* Left allocated on purpose: tally_comm_free releases it. */
    RCHECK(&x, tally_mem_alloc(x.c, 1u << 20) != NULL, "last allocation: %s", tally_last_error());
    tally_comm_free(x.c);
    return x.fails ? 1 : 0;
}

/* ---- driver ----------------------------------------------------------------------------------- */

static void run(int n, const char *transport, th_rank_fn fn, void *arg, const char *what) {
    th_opts o = {.transport = transport, .timeout_s = 60, .wall_s = 300};
    double t0 = th_now();
    int rc = th_run(n, &o, fn, arg);
    TH_CHECK(rc == 0, "%s on %d ranks over %s", what, n, transport);
    printf("  %s, %d ranks over %s: %s (%.1f s)\n", what, n, transport, rc ? "FAIL" : "ok", th_now() - t0);
    fflush(stdout);
}

int main(void) {
    static const char *names[] = {"shared buffers", "buffers at an offset in a region", "shared and malloc'd mixed"};
    /* The quick tier: 3 ranks over shm, 2 over tcp, up to 1 MiB; the long tier: 2-4 ranks, 16 MiB too. */
    for (int n = 2; n <= 4; n++)
        for (int b = BUF_SHARED; b <= BUF_MIXED; b++) {
            cfg g = {b, "shm"};
            if (th_long() || n == 3) run(n, "shm", rank_colls, &g, names[b]);
        }
    for (int n = 2; n <= 3; n++) {
        cfg g = {BUF_SHARED, "tcp"};
        if (!th_long() && n != 2) continue;
        run(n, "tcp", rank_colls, &g, names[BUF_SHARED]);
        run(n, "tcp", rank_churn, NULL, "alloc/free churn");
    }
    for (int n = 2; n <= 4; n++)
        if (th_long() || n == 3) run(n, "shm", rank_churn, NULL, "alloc/free churn");
    return th_verdict("test_shm_mem");
}
