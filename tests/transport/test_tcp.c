/* test_tcp.c - the TCP transport on real processes: ring, all-pairs and two-rank exchanges of many sizes,
 * plain and reducing, against references computed here; mismatch, death, timeout and fd-leak behaviour. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/boot.h"
#include "core/numeric/dtype.h"
#include "core/err.h"
#include "core/sig.h"
#include "boot_env.h"
#include "harness.h"
#include "transport/tcp_int.h"
#include "transport/transport.h"

/* ---- per-rank plumbing ---- */

static int tt_rank = -1, tt_fail; /* in a rank: its number and its failed checks */

#define RCHECK(cond, ...) TH_RANK_CHECK(tt_fail, tt_rank, cond, __VA_ARGS__)

typedef struct tt_world {
    int rank, size;
    tally__fault fault;
    tally__boot *boot;
    tally__sig sig;
    tally__tp *tp;
} tt_world;

static int tt_create(tt_world *w, double timeout_s) {
    tally__tp_ctx ctx = {
        .rank = w->rank, .size = w->size, .boot = w->boot, .fault = &w->fault, .timeout_s = timeout_s, .sig = &w->sig};
    int rc = tally__tcp_create(&ctx, &w->tp);
    if (rc) fprintf(stderr, "rank %d: tcp_create: %s\n", w->rank, tally_last_error());
    return rc;
}

/* Rendezvous, then the transport under test. */
static int tt_open(tt_world *w, int rank, int size, double timeout_s) {
    tally__boot_env env;
    tally_config cfg;
    memset(w, 0, sizeof *w);
    w->rank = tt_rank = rank;
    w->size = size;
    tally__fault_init(&w->fault);
    w->sig = (tally__sig){.seq = 1, .coll = TALLY__ALLREDUCE, .root = -1, .count = 1};
    int rc = th_boot_env(&cfg, &env);
    if (!rc) rc = tally__boot_init(&w->boot, &env, &w->fault, timeout_s);
    if (rc) {
        fprintf(stderr, "rank %d: boot: %s\n", rank, tally_last_error());
        return rc;
    }
    return tt_create(w, timeout_s);
}

static void tt_close(tt_world *w) {
    if (w->tp) w->tp->ops->destroy(w->tp);
    w->tp = NULL;
    if (w->boot) tally__boot_free(w->boot);
    w->boot = NULL;
}

static int tt_xchg(tt_world *w, const tally__send *s, int ns, const tally__recv *r, int nr) {
    w->sig.seq++;
    return w->tp->ops->exchange(w->tp, s, ns, r, nr);
}

/* ---- data and references ---- */

typedef enum { K_PLAIN, K_F32_SUM, K_I64_MIN, K_BF16_SUM, K_COUNT } tt_kind;
static const char *const tt_kind_name[K_COUNT] = {"plain", "f32 sum", "i64 min", "bf16 sum"};
static const size_t tt_esize[K_COUNT] = {1, 4, 8, 2};

static uint64_t tt_mix(uint64_t x) { /* splitmix64: reproducible pseudo-random values */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Small integers: every f32/bf16 sum of two of them is exact, so results compare bit for bit. */
static float tt_small(int r, size_t i) { return (float)((int)((r * 7 + i) % 13) - 6); }
static uint8_t tt_byte(int r, size_t i) { return (uint8_t)(r * 131 + i * 7 + (i >> 11)); }
static int64_t tt_i64(int r, size_t i) { return (int64_t)tt_mix((uint64_t)r << 40 ^ i); }

/* One loop per kind (not a switch per element): the 64 MiB cases fill and check 2^26 elements. */
static void tt_fill(void *buf, tt_kind k, int r, size_t count) {
    if (k == K_PLAIN)
        for (size_t i = 0; i < count; i++) ((uint8_t *)buf)[i] = tt_byte(r, i);
    else if (k == K_F32_SUM)
        for (size_t i = 0; i < count; i++) ((float *)buf)[i] = tt_small(r, i);
    else if (k == K_I64_MIN)
        for (size_t i = 0; i < count; i++) ((int64_t *)buf)[i] = tt_i64(r, i);
    else
        for (size_t i = 0; i < count; i++) ((uint16_t *)buf)[i] = tally__f32_to_bf16(tt_small(r, i));
}

/* Index of the first element of buf that differs from what a receive from `from` must leave (plain:
 * from's data; reducing: mine op from's), or count when all match. */
static size_t tt_verify(const void *buf, tt_kind k, int mine, int from, size_t count) {
    size_t i = 0;
    if (k == K_PLAIN)
        for (const uint8_t *p = buf; i < count && p[i] == tt_byte(from, i); i++) {}
    else if (k == K_F32_SUM)
        for (const float *p = buf; i < count && p[i] == tt_small(mine, i) + tt_small(from, i); i++) {}
    else if (k == K_I64_MIN)
        for (const int64_t *p = buf; i < count; i++) {
            int64_t x = tt_i64(mine, i), y = tt_i64(from, i);
            if (p[i] != (x < y ? x : y)) break;
        }
    else
        for (const uint16_t *p = buf; i < count && tally__bf16_to_f32(p[i]) == tt_small(mine, i) + tt_small(from, i);
             i++) {}
    return i;
}

static tally__recv tt_recv(tt_kind k, int peer, void *dst, const void *src, size_t bytes) {
    static const tally_dtype dt[K_COUNT] = {TALLY_U8, TALLY_F32, TALLY_I64, TALLY_BF16};
    static const tally_op op[K_COUNT] = {TALLY_SUM, TALLY_SUM, TALLY_MIN, TALLY_SUM};
    return (tally__recv){
        .peer = peer, .dst = dst, .src = k == K_PLAIN ? NULL : src, .len = bytes, .dtype = dt[k], .op = op[k]};
}

/* ---- exchanges of data ---- */

/* Send right, receive (and maybe reduce) from the left; in place when asked. */
static void tt_ring(tt_world *w, size_t len, tt_kind k, int inplace) {
    int right = (w->rank + 1) % w->size, left = (w->rank + w->size - 1) % w->size;
    size_t count = len / tt_esize[k], bytes = count * tt_esize[k];
    void *sbuf = malloc(bytes + 1), *dst = malloc(bytes + 1);
    tt_fill(sbuf, k, w->rank, count);
    if (inplace)
        tt_fill(dst, k, w->rank, count);
    else
        memset(dst, 0xA5, bytes);
    tally__send s = {.peer = right, .buf = sbuf, .len = bytes};
    tally__recv r = tt_recv(k, left, dst, inplace ? dst : sbuf, bytes);
    w->sig.count = bytes;
    int rc = tt_xchg(w, &s, 1, &r, 1);
    RCHECK(rc == 0, "ring %zu B %s%s: %s", bytes, tt_kind_name[k], inplace ? " in place" : "", tally_last_error());
    size_t bad = rc ? 0 : tt_verify(dst, k, w->rank, left, count);
    RCHECK(rc || bad == count, "ring %zu B %s%s: element %zu wrong", bytes, tt_kind_name[k], inplace ? " in place" : "",
           bad);
    free(sbuf);
    free(dst);
}

/* Everyone sends to everyone at once; receive p lands in block p. */
static void tt_allpairs(tt_world *w, size_t len, tt_kind k) {
    int n = w->size;
    size_t count = len / tt_esize[k], bytes = count * tt_esize[k];
    unsigned char *sbuf = malloc(bytes + 1), *dst = malloc((size_t)n * bytes + 1);
    tally__send *s = calloc((size_t)n, sizeof *s);
    tally__recv *r = calloc((size_t)n, sizeof *r);
    tt_fill(sbuf, k, w->rank, count);
    memset(dst, 0x5A, (size_t)n * bytes);
    int m = 0;
    for (int d = 1; d < n; d++, m++) {
        int to = (w->rank + d) % n, from = (w->rank + n - d) % n; /* staggered, as an algorithm would */
        s[m] = (tally__send){.peer = to, .buf = sbuf, .len = bytes};
        r[m] = tt_recv(k, from, dst + (size_t)from * bytes, sbuf, bytes);
    }
    w->sig.count = bytes;
    int rc = tt_xchg(w, s, m, r, m);
    RCHECK(rc == 0, "all-pairs %zu B %s: %s", bytes, tt_kind_name[k], tally_last_error());
    for (int p = 0; p < n && !rc; p++) {
        if (p == w->rank) continue;
        size_t bad = tt_verify(dst + (size_t)p * bytes, k, w->rank, p, count);
        RCHECK(bad == count, "all-pairs %zu B %s: from rank %d element %zu wrong", bytes, tt_kind_name[k], p, bad);
    }
    free(sbuf);
    free(dst);
    free(s);
    free(r);
}

/* Ranks 0 and 1 (the others sit out): 0 sends to 1 (dir 1), 1 to 0 (dir 2), or both at once (3, a
 * swap, whose large payloads from rank 1 travel on the solo connection). */
static void tt_pair(tt_world *w, size_t len, tt_kind k, int dir) {
    int me = w->rank, peer = 1 - me;
    int sends = me < 2 && (dir & (me ? 2 : 1)), recvs = me < 2 && (dir & (me ? 1 : 2));
    size_t count = len / tt_esize[k], bytes = count * tt_esize[k];
    void *sbuf = malloc(bytes + 1), *dst = malloc(bytes + 1);
    tt_fill(sbuf, k, me, count);
    memset(dst, 0xC3, bytes);
    tally__send s = {.peer = peer, .buf = sbuf, .len = bytes};
    tally__recv r = tt_recv(k, peer, dst, sbuf, bytes);
    w->sig.count = bytes;
    int rc = tt_xchg(w, &s, sends, &r, recvs);
    RCHECK(rc == 0, "pair %zu B %s dir %d: %s", bytes, tt_kind_name[k], dir, tally_last_error());
    size_t bad = rc || !recvs ? count : tt_verify(dst, k, me, peer, count);
    RCHECK(bad == count, "pair %zu B %s dir %d: element %zu wrong", bytes, tt_kind_name[k], dir, bad);
    free(sbuf);
    free(dst);
}

/* Swaps and one-way messages between the same two ranks in turn, at sizes around the one from which a
 * swap's payload leaves its header's connection: both connections stay in step. */
static int tt_pairs_rank(int rank, int size, void *arg) {
    static const size_t lens[] = {TALLY__TCP_SOLO_MIN - 8, TALLY__TCP_SOLO_MIN, TALLY__TCP_SOLO_MIN + 8, 100003,
                                  (1u << 20) + 4};
    static const int dirs[] = {3, 2, 3, 1, 3, 3, 2, 2, 1, 3};
    tt_world w;
    if (tt_open(&w, rank, size, 60)) return 1;
    /* Under the runner's descriptor limit there is room for the second mesh: it must be there, or the
     * swaps below would not take it. */
    RCHECK(((tally__tcp_tp *)w.tp)->solo != NULL, "a world on one host has its solo connections");
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++)
            tt_pair(&w, lens[li], (tt_kind)((li + d) % K_COUNT), dirs[d]);
    tt_close(&w);
    return tt_fail;
}

/* Just past the size from which a message reaches its destination with non-temporal stores. */
#define TT_STREAM_LEN ((16u << 20) + 12)
static const size_t tt_lens[] = {0, 1, 7, 4096, 100003, 1 << 20, TT_STREAM_LEN, (64 << 20) + 4};
#define TT_NLENS (sizeof tt_lens / sizeof *tt_lens)

static int tt_data_rank(int rank, int size, void *arg) {
    tt_world w;
    if (tt_open(&w, rank, size, 60)) return 1;
    for (size_t li = 0; li < TT_NLENS; li++) {
        /* The sanitizer pass keeps every smaller size; the 64 MiB one runs at N = 2 and 3 only, where
         * ring and all-pairs already take every path a larger N would (it cost ~30 s of CI at N = 4, 5). */
        if ((th_light() || size > 3) && tt_lens[li] > (16u << 20)) continue;
        if (!th_long() && tt_lens[li] > (1u << 20) && tt_lens[li] != TT_STREAM_LEN) continue; /* quick tier */
        double t0 = th_now();
        int huge = tt_lens[li] > (16u << 20); /* the biggest size: every kind once, each pattern once */
        for (int k = 0; k < K_COUNT; k++) {
            tt_ring(&w, tt_lens[li], (tt_kind)k, 0);
            if (k != K_PLAIN && (!huge || k == K_F32_SUM)) tt_ring(&w, tt_lens[li], (tt_kind)k, 1);
            if (!huge || k == K_PLAIN || (k == K_F32_SUM && size <= 3)) tt_allpairs(&w, tt_lens[li], (tt_kind)k);
        }
        if (getenv("TT_VERBOSE") && rank == 0) fprintf(stderr, "   len %zu: %.2f s\n", tt_lens[li], th_now() - t0);
    }
    tt_close(&w);
    return tt_fail;
}

/* Many small exchanges in a row: latency paths, read-ahead across messages, sequence numbers. */
static int tt_many_rank(int rank, int size, void *arg) {
    tt_world w;
    if (tt_open(&w, rank, size, 60)) return 1;
    for (int it = 0; it < 2000 && !tt_fail; it++) {
        tt_kind k = (tt_kind)(it % K_COUNT);
        if (it % 3 == 2)
            tt_allpairs(&w, 8 + (size_t)(it % 5), k);
        else
            tt_ring(&w, 8 + (size_t)(it % 5), k, it % 2);
    }
    tt_close(&w);
    return tt_fail;
}

/* ---- faults ---- */

#define TT_MAXN 8
typedef struct tt_shared {
    size_t len[2]; /* tt_length_rank: what each of ranks 0 and 1 sends and expects */
    int rc[TT_MAXN];
    double t[TT_MAXN];
    char msg[TT_MAXN][512];
    volatile int started;
    volatile double kill_t;
} tt_shared;

static void tt_record(tt_shared *sh, int rank, int rc) {
    sh->rc[rank] = rc;
    sh->t[rank] = th_now();
    snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", rc ? tally_last_error() : "");
}

/* Rank 1 calls a collective with another count: the ranks that receive from it, and itself, fail. */
static int tt_mismatch_rank(int rank, int size, void *arg) {
    tt_shared *sh = arg;
    tt_world w;
    if (tt_open(&w, rank, size, 20)) return 1;
    unsigned char a[64] = {0}, b[64];
    tally__send s = {.peer = (rank + 1) % size, .buf = a, .len = sizeof a};
    tally__recv r = {.peer = (rank + size - 1) % size, .dst = b, .len = sizeof b};
    w.sig.count = rank == 1 ? 99 : 64;
    tt_record(sh, rank, tt_xchg(&w, &s, 1, &r, 1));
    tt_close(&w);
    return 0;
}

/* Rank 0 waits on rank 2, which stays silent; rank 1 sends rank 0 a message of another call of the
 * same collective. Rank 0 must report the mismatch, not wait for the timeout. */
static int tt_mismatch_idle_rank(int rank, int size, void *arg) {
    tt_shared *sh = arg;
    tt_world w;
    if (tt_open(&w, rank, size, 20)) return 1;
    unsigned char a[64] = {0}, b[64];
    double t0 = th_now();
    w.sig.count = 64;
    if (rank == 0) {
        tally__recv r = {.peer = 2, .dst = b, .len = sizeof b};
        tt_record(sh, rank, tt_xchg(&w, NULL, 0, &r, 1));
    } else if (rank == 1) {
        tally__send s = {.peer = 0, .buf = a, .len = sizeof a};
        w.sig.count = 65;
        tt_record(sh, rank, tt_xchg(&w, &s, 1, NULL, 0));
    } else {
        usleep(3000000);
    }
    sh->t[rank] -= t0;
    tt_close(&w);
    return 0;
}

/* Equal fingerprints but different lengths: a protocol error, not a mismatch, whichever connection the
 * payload would take. */
static int tt_length_rank(int rank, int size, void *arg) {
    tt_shared *sh = arg;
    tt_world w;
    if (tt_open(&w, rank, size, 20)) return 1;
    size_t n = sh->len[rank];
    unsigned char *a = calloc(1, n), *b = malloc(n);
    tally__send s = {.peer = 1 - rank, .buf = a, .len = n};
    tally__recv r = {.peer = 1 - rank, .dst = b, .len = n}; /* each expects its own length */
    tt_record(sh, rank, tt_xchg(&w, &s, 1, &r, 1));
    free(a);
    free(b);
    tt_close(&w);
    return 0;
}

/* Rank 0, the lower, sends rank 1 a header that says its payload follows on the solo connection, which
 * only the higher rank of a pair writes: a protocol error at rank 1, not a wait for bytes that never come. */
static int tt_forged_solo_rank(int rank, int size, void *arg) {
    tt_shared *sh = arg;
    tt_world w;
    if (tt_open(&w, rank, size, 20)) return 1;
    size_t n = 2 * TALLY__TCP_SOLO_MIN;
    unsigned char *b = malloc(n);
    w.sig.count = n;
    if (rank == 0) {
        w.sig.seq++;
        tally__tcp_hdr h = {.magic = TALLY__TCP_MAGIC_DATA, .aux = TALLY__TCP_AUX_SOLO, .sig = w.sig, .len = n};
        tally__tcp_tp *t = (tally__tcp_tp *)w.tp;
        tt_record(sh, rank, send(t->conns[1].fd, &h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h ? 0 : -1);
        t->conns[1].broken = 1; /* out of frame now: no goodbye */
        usleep(200000);         /* rank 1 reads the header before our close */
    } else {
        tally__recv r = {.peer = 0, .dst = b, .len = n};
        tt_record(sh, rank, tt_xchg(&w, NULL, 0, &r, 1));
    }
    free(b);
    tt_close(&w);
    return 0;
}

/* Rings of 64 MiB reductions until the parent SIGKILLs rank 1 in the middle of one. */
static int tt_death_rank(int rank, int size, void *arg) {
    tt_shared *sh = arg;
    tt_world w;
    if (tt_open(&w, rank, size, 60)) return 1;
    size_t count = 16u << 20;
    float *a = malloc(count * 4), *b = malloc(count * 4);
    tt_fill(a, K_F32_SUM, rank, count);
    tally__send s = {.peer = (rank + 1) % size, .buf = a, .len = count * 4};
    tally__recv r = tt_recv(K_F32_SUM, (rank + size - 1) % size, b, a, count * 4);
    int rc = 0;
    for (int it = 0; it < 500 && !rc; it++) {
        if (rank == 1 && it == 2) sh->started = 1;
        rc = tt_xchg(&w, &s, 1, &r, 1);
    }
    tt_record(sh, rank, rc);
    free(a);
    free(b);
    tt_close(&w);
    return 0;
}

/* Rank 1 never sends: the rank waiting on it times out after 2 s, naming it. */
static int tt_timeout_rank(int rank, int size, void *arg) {
    tt_shared *sh = arg;
    tt_world w;
    if (tt_open(&w, rank, size, 2)) return 1;
    unsigned char a[4096] = {0}, b[4096];
    double t0 = th_now();
    if (rank == 1) {
        usleep(3500000);
        tt_record(sh, rank, 0);
    } else {
        tally__send s = {.peer = (rank + 1) % size, .buf = a, .len = sizeof a};
        tally__recv r = {.peer = (rank + size - 1) % size, .dst = b, .len = sizeof b};
        tt_record(sh, rank, tt_xchg(&w, &s, 1, &r, 1));
    }
    sh->t[rank] -= t0;
    tt_close(&w);
    return 0;
}

/* Create and destroy the transport twice; every descriptor it opened must be closed again. */
static int tt_fds_rank(int rank, int size, void *arg) {
    tt_world w;
    if (tt_open(&w, rank, size, 20)) return 1;
    w.tp->ops->destroy(w.tp);
    w.tp = NULL;
    int before = th_count_fds();
    for (int i = 0; i < 2; i++) {
        if (tt_create(&w, 20)) return 1;
        tt_ring(&w, 4096, K_F32_SUM, 0);
        w.tp->ops->destroy(w.tp);
        w.tp = NULL;
        int after = th_count_fds();
        RCHECK(after == before, "fd count %d before create, %d after destroy (round %d)", before, after, i);
    }
    tt_close(&w);
    return tt_fail;
}

/* ---- the parent ---- */

static void tt_data_tests(void) {
    for (int n = 2; n <= (th_long() ? 5 : 3); n++) { /* the quick tier: 2 and 3 ranks */
        th_opts o = {.wall_s = 300};
        double t0 = th_now();
        TH_CHECK(th_run(n, &o, tt_data_rank, NULL) == 0, "ring/all-pairs data, N=%d", n);
        fprintf(stderr, "  data N=%d: %.1f s\n", n, th_now() - t0);
        t0 = th_now();
        TH_CHECK(th_run(n, &o, tt_many_rank, NULL) == 0, "2000 small exchanges, N=%d", n);
        fprintf(stderr, "  2000 small exchanges N=%d: %.1f s\n", n, th_now() - t0);
        t0 = th_now();
        TH_CHECK(th_run(n, &o, tt_pairs_rank, NULL) == 0, "swaps and one-way messages, N=%d", n);
        fprintf(stderr, "  swaps and one-way messages N=%d: %.1f s\n", n, th_now() - t0);
    }
}

static void tt_mismatch_tests(void) {
    for (int n = 2; n <= 4; n++) {
        tt_shared *sh = th_shared_alloc(sizeof *sh);
        TH_CHECK(th_run(n, NULL, tt_mismatch_rank, sh) == 0, "mismatch job N=%d", n);
        int must[2] = {1, 2 % n}; /* rank 1 itself, and the rank that receives from it */
        for (int i = 0; i < 2; i++) {
            int q = must[i];
            TH_CHECK(sh->rc[q] == TALLY_E_MISMATCH && strstr(sh->msg[q], "collective mismatch") &&
                         strstr(sh->msg[q], "count 99"),
                     "N=%d rank %d: rc %d '%s'", n, q, sh->rc[q], sh->msg[q]);
        }
        th_shared_free(sh, sizeof *sh);
    }
    tt_shared *sh = th_shared_alloc(sizeof *sh);
    if (th_long()) { /* its silent rank stays 3 s */
        TH_CHECK(th_run(3, NULL, tt_mismatch_idle_rank, sh) == 0, "idle mismatch job");
        TH_CHECK(sh->rc[0] == TALLY_E_MISMATCH && sh->t[0] < 1.5 && strstr(sh->msg[0], "rank 1 called"),
                 "a mismatch from a peer we do not wait on: rc %d after %.2f s '%s'", sh->rc[0], sh->t[0], sh->msg[0]);
        TH_CHECK(sh->rc[1] == 0, "the sender of the other call: rc %d", sh->rc[1]);
        memset(sh, 0, sizeof *sh);
    }
    /* Small both; large both (rank 1's on the solo connection); one of each. */
    static const size_t lens[][2] = {{100, 200}, {100000, 200000}, {1000, 100000}, {100000, 1000}};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        memset(sh, 0, sizeof *sh);
        memcpy(sh->len, lens[i], sizeof sh->len);
        TH_CHECK(th_run(2, NULL, tt_length_rank, sh) == 0, "length job %zu", i);
        for (int r = 0; r < 2; r++)
            TH_CHECK(sh->rc[r] == TALLY_E_PROTOCOL && strstr(sh->msg[r], "wrong length"),
                     "length %zu / %zu: rank %d rc %d '%s'", lens[i][0], lens[i][1], r, sh->rc[r], sh->msg[r]);
    }
    memset(sh, 0, sizeof *sh);
    TH_CHECK(th_run(2, NULL, tt_forged_solo_rank, sh) == 0, "forged solo job");
    TH_CHECK(sh->rc[0] == 0 && sh->rc[1] == TALLY_E_PROTOCOL && strstr(sh->msg[1], "rank 0's header") &&
                 strstr(sh->msg[1], "solo connection"),
             "forged solo flag: rank 0 rc %d, rank 1 rc %d '%s'", sh->rc[0], sh->rc[1], sh->msg[1]);
    th_shared_free(sh, sizeof *sh);
}

static void tt_death_test(int n) {
    tt_shared *sh = th_shared_alloc(sizeof *sh);
    th_job job;
    if (th_start(&job, n, NULL, tt_death_rank, sh)) {
        TH_CHECK(0, "fork");
        return;
    }
    double give_up = th_now() + 60;
    while (!sh->started && th_now() < give_up) usleep(1000);
    usleep(30000); /* well inside the third 64 MiB exchange */
    sh->kill_t = th_now();
    kill(job.pid[1], SIGKILL);
    th_wait(&job, 120);
    TH_CHECK(WIFSIGNALED(job.status[1]), "N=%d: the victim was killed", n);
    /* A rank that had already taken all it needed from the victim may first see a survivor that gave
     * up and left; that survivor's FAULT frame normally tells it who died, but the survivor may be gone
     * before it is read. The first rank to notice anything always names the victim; that every rank
     * names it is checked with the monitor in place (test_faults, test_kill). */
    int named = 0;
    for (int r = 0; r < n; r++) {
        if (r == 1) continue;
        double dt = sh->t[r] - sh->kill_t;
        TH_CHECK(WIFEXITED(job.status[r]) && WEXITSTATUS(job.status[r]) == 0, "N=%d rank %d exited cleanly", n, r);
        TH_CHECK(sh->rc[r] == TALLY_E_PEER_LOST && dt < 5, "N=%d rank %d: rc %d after %.3f s '%s'", n, r, sh->rc[r], dt,
                 sh->msg[r]);
        named += strstr(sh->msg[r], "rank 1 (pid") != NULL;
        fprintf(stderr, "  death N=%d: rank %d saw it after %.1f ms\n", n, r, dt * 1e3);
    }
    TH_CHECK(named > 0, "N=%d: some survivor names the victim (rank 1)", n);
    th_shared_free(sh, sizeof *sh);
}

static void tt_timeout_test(void) {
    tt_shared *sh = th_shared_alloc(sizeof *sh);
    TH_CHECK(th_run(3, NULL, tt_timeout_rank, sh) == 0, "timeout job");
    TH_CHECK(sh->rc[2] == TALLY_E_TIMEOUT && sh->t[2] > 1.8 && sh->t[2] < 3.5 && strstr(sh->msg[2], "rank 1 (pid") &&
                 strstr(sh->msg[2], "allreduce"),
             "rank 2: rc %d after %.2f s '%s'", sh->rc[2], sh->t[2], sh->msg[2]);
    TH_CHECK(sh->rc[0] == 0, "rank 0 (not waiting on the silent rank): rc %d '%s'", sh->rc[0], sh->msg[0]);
    th_shared_free(sh, sizeof *sh);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : "";
    if (!*only || !strcmp(only, "fds")) TH_CHECK(th_run(3, NULL, tt_fds_rank, NULL) == 0, "fd leak job");
    if (!*only || !strcmp(only, "mismatch")) tt_mismatch_tests();
    if ((!*only || !strcmp(only, "timeout")) && th_long()) tt_timeout_test(); /* waits out 2 s */
    if (!*only || !strcmp(only, "death")) {
        tt_death_test(2); /* the victim's payloads come on the solo connection */
        tt_death_test(3);
        if (th_long()) tt_death_test(4);
    }
    if (!*only || !strcmp(only, "data")) tt_data_tests();
    return th_verdict("test_tcp");
}
