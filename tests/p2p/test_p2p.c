/* test_p2p.c - point-to-point messages (tally_send, _recv, _isend, _irecv) in real processes over shm and
 * tcp worlds: every size class against a reference, tags out of order, any-source with the sender named,
 * order per (source, tag), many in flight, a receiver that asks late, a send to self, beside blocking and
 * non-blocking collectives (and on another thread), count and dtype mismatches, bad arguments, a split. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <unistd.h>

#include "harness.h"

typedef struct result {
    int fails;
    char first[700];
} result;

static result *R; /* [TH_MAX_RANKS], shared */

static void bad(int rank, const char *fmt, const char *what, int rc) {
    if (R[rank].fails++ == 0)
        snprintf(R[rank].first, sizeof R[rank].first, "%s: %s (%s) %s", fmt, what, tally_strerror(rc),
                 tally_last_error());
}
#define OK(rank, call)                                                                                                 \
    do {                                                                                                               \
        int rc_ = (call);                                                                                              \
        if (rc_) bad(rank, #call, "failed", rc_);                                                                      \
    } while (0)
#define EXPECT(rank, cond, what)                                                                                       \
    do {                                                                                                               \
        if (!(cond)) bad(rank, #cond, what, 0);                                                                        \
    } while (0)

static void reset(void) { memset(R, 0, sizeof *R * TH_MAX_RANKS); }

static void verdict(int n, int bad_exit, const char *what) {
    TH_CHECK(bad_exit == 0, "%s: ranks did not exit cleanly", what);
    for (int r = 0; r < n; r++)
        TH_CHECK(R[r].fails == 0, "%s: rank %d: %d failures, first: %s", what, r, R[r].fails, R[r].first);
}

/* The payload of a message: a function of its sender, tag and index, so each byte says where it came from. */
static uint32_t word(int src, int tag, size_t i) { return (uint32_t)(src * 7919 + tag * 104729) ^ (uint32_t)i; }

static void fill(uint32_t *v, size_t n, int src, int tag) {
    for (size_t i = 0; i < n; i++) v[i] = word(src, tag, i);
}

static int holds(const uint32_t *v, size_t n, int src, int tag) {
    for (size_t i = 0; i < n; i++)
        if (v[i] != word(src, tag, i)) return 0;
    return 1;
}

/* ---- the size classes, around a ring: each rank sends to the next and receives from the previous ---- */

/* 1048579 i32 are past 4 MiB: on one host they are read in place (process_vm_readv). */
static const size_t quick_sizes[] = {0, 1, 7, 1001, 1048579};
static const size_t long_sizes[] = {0, 1, 7, 1001, 65537, (3u << 20) + 5};

typedef struct sizes_arg {
    const size_t *sizes;
    int n;
} sizes_arg;

static void ring_sizes(tally_comm *c, int rank, int n, const sizes_arg *a) {
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (int k = 0; k < a->n; k++) {
        size_t m = a->sizes[k];
        uint32_t *out = malloc(m * 4 + 4), *in = malloc(m * 4 + 4);
        fill(out, m, rank, k);
        memset(in, 0xee, m * 4);
        tally_request *s = NULL, *r = NULL;
        int from = -2;
        OK(rank, tally_irecv(c, in, m, TALLY_I32, prev, k, &r));
        OK(rank, tally_isend(c, out, m, TALLY_I32, next, k, &s));
        OK(rank, tally_wait(s));
        OK(rank, tally_wait(r));
        from = tally_request_source(r);
        EXPECT(rank, from == prev, "the receive names its sender");
        EXPECT(rank, holds(in, m, prev, k), "ring payload");
        tally_request_free(s);
        tally_request_free(r);
        /* and back, blocking: a send is handed off whether or not its receive is posted yet */
        memset(in, 0xee, m * 4);
        OK(rank, tally_send(c, out, m, TALLY_I32, prev, 100 + k));
        OK(rank, tally_recv(c, in, m, TALLY_I32, next, 100 + k, &from));
        EXPECT(rank, holds(in, m, next, k), "payload back");
        free(out);
        free(in);
    }
}

/* ---- the matching rules ---- */

/* Rank 0 sends tags 3 then 5; rank 1 asks for 5 first. */
static void tags_out_of_order(tally_comm *c, int rank) {
    uint32_t a[4], b[4];
    if (rank == 0) {
        fill(a, 4, 0, 3);
        fill(b, 4, 0, 5);
        OK(rank, tally_send(c, a, 4, TALLY_I32, 1, 3));
        OK(rank, tally_send(c, b, 4, TALLY_I32, 1, 5));
    } else if (rank == 1) {
        OK(rank, tally_recv(c, b, 4, TALLY_I32, 0, 5, NULL));
        OK(rank, tally_recv(c, a, 4, TALLY_I32, 0, 3, NULL));
        EXPECT(rank, holds(a, 4, 0, 3) && holds(b, 4, 0, 5), "each tag its own message");
    }
}

/* Every other rank sends to rank 0, which takes them from any source and is told who sent each. */
static void any_source(tally_comm *c, int rank, int n) {
    uint32_t v[16];
    if (rank != 0) {
        fill(v, 16, rank, 9);
        OK(rank, tally_send(c, v, 16, TALLY_I32, 0, 9));
        return;
    }
    int seen = 0;
    for (int k = 1; k < n; k++) {
        int from = -1;
        OK(rank, tally_recv(c, v, 16, TALLY_I32, TALLY_ANY_SOURCE, 9, &from));
        EXPECT(rank, from > 0 && from < n && !(seen & (1 << from)), "a new sender named");
        if (from > 0 && from < n) {
            seen |= 1 << from;
            EXPECT(rank, holds(v, 16, from, 9), "the payload is the named sender's");
        }
    }
}

/* Rank 1 sends 40 messages to rank 0 alternating tags 1 and 2, numbered per tag; rank 0 takes every tag 2
 * one first, then the tag 1 ones (posted all at once): each tag's in the order sent. */
static void order_per_tag(tally_comm *c, int rank) {
    enum { N = 40 };
    int32_t out[N], in[N];
    tally_request *req[N];
    if (rank == 1) {
        for (int i = 0; i < N; i++) {
            out[i] = i / 2;
            OK(rank, tally_isend(c, &out[i], 1, TALLY_I32, 0, 1 + i % 2, &req[i]));
        }
        for (int i = 0; i < N; i++) {
            OK(rank, tally_wait(req[i]));
            tally_request_free(req[i]);
        }
    } else if (rank == 0) {
        for (int i = 0; i < N / 2; i++) OK(rank, tally_recv(c, &in[i], 1, TALLY_I32, 1, 2, NULL));
        for (int i = 0; i < N / 2; i++) OK(rank, tally_irecv(c, &in[N / 2 + i], 1, TALLY_I32, 1, 1, &req[i]));
        for (int i = N / 2 - 1; i >= 0; i--) {
            OK(rank, tally_wait(req[i]));
            tally_request_free(req[i]);
        }
        for (int i = 0; i < N; i++) EXPECT(rank, in[i] == i % (N / 2), "messages of one tag in the order sent");
    }
}

/* Each rank has 32 sends and 32 receives in flight with each neighbour, waited for out of order. */
static void many_in_flight(tally_comm *c, int rank, int n) {
    enum { K = 32, M = 257 };
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    uint32_t *out = malloc(K * M * 4), *in = malloc(K * M * 4);
    tally_request *s[K], *r[K];
    for (int k = 0; k < K; k++) OK(rank, tally_irecv(c, in + k * M, M, TALLY_I32, prev, 1000 + k, &r[k]));
    for (int k = K - 1; k >= 0; k--) {
        fill(out + k * M, M, rank, 1000 + k);
        OK(rank, tally_isend(c, out + k * M, M, TALLY_I32, next, 1000 + k, &s[k]));
    }
    for (int k = 0; k < K; k++) {
        int j = (k * 7) % K;
        OK(rank, tally_wait(r[j]));
        EXPECT(rank, holds(in + j * M, M, prev, 1000 + j), "one of many");
    }
    for (int k = 0; k < K; k++) {
        OK(rank, tally_wait(s[k]));
        tally_request_free(s[k]);
        tally_request_free(r[k]);
    }
    free(out);
    free(in);
}

/* To itself: the send returns before the receive is posted. */
static void to_self(tally_comm *c, int rank) {
    uint32_t out[9], in[9];
    fill(out, 9, rank, 77);
    OK(rank, tally_send(c, out, 9, TALLY_I32, rank, 77));
    int from = -1;
    OK(rank, tally_recv(c, in, 9, TALLY_I32, TALLY_ANY_SOURCE, 77, &from));
    EXPECT(rank, from == rank && holds(in, 9, rank, 77), "a message to itself");
}

/* Rank 0 sends 10 f32 with tag 4 and 3 i32 with tag 6; rank 1 asks for 12 f32 and 3 f32: each its own
 * TALLY_E_MISMATCH naming both ranks, the tag, the counts and dtypes; the next message still comes. */
static void mismatch(tally_comm *c, int rank) {
    float f[12] = {0};
    uint32_t v[3];
    if (rank == 0) {
        OK(rank, tally_send(c, f, 10, TALLY_F32, 1, 4));
        OK(rank, tally_send(c, v, 3, TALLY_I32, 1, 6));
        fill(v, 3, 0, 8);
        OK(rank, tally_send(c, v, 3, TALLY_I32, 1, 8));
    } else if (rank == 1) {
        int rc = tally_recv(c, f, 12, TALLY_F32, 0, 4, NULL);
        const char *m = tally_last_error();
        EXPECT(rank, rc == TALLY_E_MISMATCH, "a count mismatch");
        EXPECT(rank,
               strstr(m, "rank 1") && strstr(m, "rank 0") && strstr(m, "tag 4") && strstr(m, "12 x f32") &&
                   strstr(m, "10 x f32"),
               "its message names both ranks, the tag, both counts");
        rc = tally_recv(c, f, 3, TALLY_F32, TALLY_ANY_SOURCE, 6, NULL);
        m = tally_last_error();
        EXPECT(rank, rc == TALLY_E_MISMATCH && strstr(m, "3 x i32") && strstr(m, "3 x f32"), "a dtype mismatch");
        OK(rank, tally_recv(c, v, 3, TALLY_I32, 0, 8, NULL));
        EXPECT(rank, holds(v, 3, 0, 8), "the next message after a mismatch");
    }
}

/* The requests' calls: a callback, a request freed while pending (its callback still runs), tally_test. */
typedef struct calls {
    _Atomic int n, rc; /* written on the post office's thread */
} calls;

static void counted(void *arg, int rc, const char *msg) {
    calls *k = arg;
    k->n++;
    k->rc = rc;
}

static void request_calls(tally_comm *c, int rank) {
    uint32_t a[3], b[3];
    if (rank == 1) {
        fill(a, 3, 1, 40);
        fill(b, 3, 1, 41);
        OK(rank, tally_recv(c, NULL, 0, TALLY_I32, 0, 39, NULL)); /* rank 0 has posted both */
        OK(rank, tally_send(c, a, 3, TALLY_I32, 0, 40));
        OK(rank, tally_send(c, b, 3, TALLY_I32, 0, 41));
        return;
    }
    if (rank != 0) return;
    calls k1, k2;
    atomic_init(&k1.n, 0), atomic_init(&k1.rc, -1), atomic_init(&k2.n, 0), atomic_init(&k2.rc, -1);
    tally_request *r1, *r2;
    OK(rank, tally_irecv(c, a, 3, TALLY_I32, 1, 40, &r1));
    OK(rank, tally_irecv(c, b, 3, TALLY_I32, TALLY_ANY_SOURCE, 41, &r2));
    OK(rank, tally_request_on_done(r1, counted, &k1));
    OK(rank, tally_request_on_done(r2, counted, &k2));
    int done = 1;
    OK(rank, tally_test(r2, &done));
    EXPECT(rank, done == 0 && tally_request_source(r2) == -1, "pending: not done, no source yet");
    OK(rank, tally_request_free(r1)); /* freed pending: it completes, calls back, and goes */
    OK(rank, tally_send(c, NULL, 0, TALLY_I32, 1, 39));
    for (int i = 0; i < 10000 && !done; i++) {
        OK(rank, tally_test(r2, &done));
        if (!done) usleep(500);
    }
    EXPECT(rank, done && tally_request_source(r2) == 1 && holds(b, 3, 1, 41), "tally_test sees it done");
    OK(rank, tally_wait(r2));
    EXPECT(rank, k2.n == 1 && k2.rc == 0, "its callback ran once");
    for (int i = 0; i < 10000 && !k1.n; i++) usleep(500);
    EXPECT(rank, k1.n == 1 && k1.rc == 0 && holds(a, 3, 1, 40), "the freed request still completed");
    tally_request_free(r2);
}

static void bad_arguments(tally_comm *c, int rank, int n) {
    uint32_t v[1];
    tally_request *req = (tally_request *)&req;
    EXPECT(rank, tally_send(c, v, 1, TALLY_I32, n, 0) == TALLY_E_INVALID && strstr(tally_last_error(), "dst"),
           "dst out of range");
    EXPECT(rank, tally_send(c, v, 1, TALLY_I32, TALLY_ANY_SOURCE, 0) == TALLY_E_INVALID, "send to any source");
    EXPECT(rank, tally_recv(c, v, 1, TALLY_I32, -2, 0, NULL) == TALLY_E_INVALID, "src out of range");
    EXPECT(rank, tally_isend(c, v, 1, TALLY_I32, 0, -1, &req) == TALLY_E_INVALID && !req, "a negative tag");
    EXPECT(rank,
           tally_irecv(c, NULL, 3, TALLY_I32, 0, 0, &req) == TALLY_E_INVALID && strstr(tally_last_error(), "NULL"),
           "NULL buffer with count 3");
    EXPECT(rank, tally_isend(c, v, 1, (tally_dtype)99, 0, 0, &req) == TALLY_E_INVALID, "bad dtype");
    EXPECT(rank, tally_isend(NULL, v, 1, TALLY_I32, 0, 0, &req) == TALLY_E_INVALID, "NULL communicator");
    EXPECT(rank, tally_isend(c, v, 1, TALLY_I32, 0, 0, NULL) == TALLY_E_INVALID, "NULL req");
    EXPECT(rank, tally_request_source(NULL) == -1, "no source of no request");
}

typedef struct suite_arg {
    sizes_arg sizes;
    int rules;  /* the matching rules too (their ranks 0 and 1 at least) */
    int no_cma; /* TALLY_SHM_CMA=0: large payloads through the socket too */
} suite_arg;

static void no_cma_env(int rank, void *arg) {
    if (((const suite_arg *)arg)->no_cma) setenv("TALLY_SHM_CMA", "0", 1);
}

static int fn_suite(int rank, int n, void *arg) {
    const suite_arg *a = arg;
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return bad(rank, "init", "failed", rc), 0;
    ring_sizes(c, rank, n, &a->sizes);
    if (a->rules) {
        tags_out_of_order(c, rank);
        any_source(c, rank, n);
        order_per_tag(c, rank);
        many_in_flight(c, rank, n);
        to_self(c, rank);
        request_calls(c, rank);
        mismatch(c, rank);
        bad_arguments(c, rank, n);
    }
    OK(rank, tally_barrier(c)); /* collectives still line up after all that */
    OK(rank, tally_comm_free(c));
    return 0;
}

static void test_suite(const char *transport, int n, const size_t *sizes, int ns, int rules, int no_cma) {
    reset();
    suite_arg a = {{sizes, ns}, rules, no_cma};
    th_opts o = {.transport = transport, .timeout_s = 30, .child_env = no_cma_env};
    char what[96];
    snprintf(what, sizeof what, "point-to-point over %s on %d ranks%s", transport, n, no_cma ? ", no CMA" : "");
    verdict(n, th_run(n, &o, fn_suite, &a), what);
}

/* ---- a receiver that asks late: the send is handed off once its post office runs ---- */

static int fn_late(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return bad(rank, "init", "failed", rc), 0;
    size_t m = (1u << 20) + 3;
    uint32_t *v = malloc(m * 4);
    if (rank == 0) {
        fill(v, m, 0, 2);
        OK(rank, tally_send(c, v, 3, TALLY_I32, 1, 1));
        OK(rank, tally_send(c, v, m, TALLY_I32, 1, 2)); /* more than the sockets hold */
    } else {
        usleep(300 * 1000);
        OK(rank, tally_recv(c, v, m, TALLY_I32, 0, 2, NULL));
        EXPECT(rank, holds(v, m, 0, 2), "the late receive's payload");
        OK(rank, tally_recv(c, v, 3, TALLY_I32, 0, 1, NULL));
    }
    free(v);
    OK(rank, tally_comm_free(c));
    return 0;
}

/* ---- beside collectives: blocking, non-blocking in flight, and on another thread ---- */

typedef struct side {
    tally_comm *c;
    int rank, peer, rounds, base; /* tags base.. */
} side;

static void *pingpong_thread(void *arg) {
    side *s = arg;
    uint32_t v[33];
    for (int i = 0; i < s->rounds; i++) {
        if (s->rank % 2 == 0) {
            fill(v, 33, s->rank, i);
            OK(s->rank, tally_send(s->c, v, 33, TALLY_I32, s->peer, s->base + i));
            OK(s->rank, tally_recv(s->c, v, 33, TALLY_I32, s->peer, s->base + i, NULL));
            EXPECT(s->rank, holds(v, 33, s->peer, i), "pingpong on a thread");
        } else {
            OK(s->rank, tally_recv(s->c, v, 33, TALLY_I32, s->peer, s->base + i, NULL));
            fill(v, 33, s->rank, i);
            OK(s->rank, tally_send(s->c, v, 33, TALLY_I32, s->peer, s->base + i));
        }
    }
    return NULL;
}

static int fn_beside(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return bad(rank, "init", "failed", rc), 0;
    int peer = rank ^ 1;
    float x[1000], y[1000];
    uint32_t v[64];
    for (int i = 0; i < 1000; i++) x[i] = (float)(rank + i);
    /* a send posted, a collective, the receive, another collective */
    tally_request *s, *r, *coll;
    fill(v, 64, rank, 1);
    OK(rank, tally_isend(c, v, 64, TALLY_I32, peer, 1, &s));
    OK(rank, tally_allreduce(c, x, y, 1000, TALLY_F32, TALLY_SUM));
    EXPECT(rank, y[10] == (float)(n * 10 + n * (n - 1) / 2), "allreduce beside point-to-point");
    uint32_t w[64];
    OK(rank, tally_irecv(c, w, 64, TALLY_I32, peer, 1, &r));
    OK(rank, tally_barrier(c));
    OK(rank, tally_wait(r));
    OK(rank, tally_wait(s));
    EXPECT(rank, holds(w, 64, peer, 1), "the message across collectives");
    tally_request_free(s);
    tally_request_free(r);
    /* a non-blocking collective in flight while messages go both ways */
    OK(rank, tally_iallreduce(c, x, y, 1000, TALLY_F32, TALLY_MAX, &coll));
    if (rank % 2 == 0) {
        OK(rank, tally_send(c, v, 64, TALLY_I32, peer, 2));
        OK(rank, tally_recv(c, w, 64, TALLY_I32, peer, 2, NULL));
    } else {
        OK(rank, tally_recv(c, w, 64, TALLY_I32, peer, 2, NULL));
        OK(rank, tally_send(c, v, 64, TALLY_I32, peer, 2));
    }
    EXPECT(rank, holds(w, 64, peer, 1), "the message beside a non-blocking collective");
    OK(rank, tally_wait(coll));
    tally_request_free(coll);
    /* a thread ping-pongs while this one runs collectives */
    side sd = {c, rank, peer, 50, 500};
    pthread_t th;
    pthread_create(&th, NULL, pingpong_thread, &sd);
    for (int i = 0; i < 20; i++) OK(rank, tally_allreduce(c, x, y, 1000, TALLY_F32, TALLY_SUM));
    pthread_join(th, NULL);
    OK(rank, tally_comm_free(c));
    return 0;
}

/* ---- waiters on several threads: one reads its messages itself, the others are woken ---- */

static int fn_waiters(int rank, int n, void *arg) {
    enum { THREADS = 4 };
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return bad(rank, "init", "failed", rc), 0;
    side sd[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        sd[t] = (side){c, rank, rank ^ 1, 200, 1000 * (t + 1)};
        pthread_create(&th[t], NULL, pingpong_thread, &sd[t]);
    }
    /* and a receive no thread's message matches until the pingpongs are over */
    uint32_t v[9], u[9];
    tally_request *late;
    OK(rank, tally_irecv(c, v, 9, TALLY_I32, TALLY_ANY_SOURCE, 7, &late));
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    fill(u, 9, rank, 7);
    OK(rank, tally_send(c, u, 9, TALLY_I32, rank ^ 1, 7));
    OK(rank, tally_wait(late));
    EXPECT(rank, holds(v, 9, rank ^ 1, 7) && tally_request_source(late) == (rank ^ 1), "the late receive");
    tally_request_free(late);
    OK(rank, tally_comm_free(c));
    return 0;
}

/* ---- free: a pending receive fails, a pending send is completed first ---- */

static int fn_free(int rank, int n, void *arg) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) return bad(rank, "init", "failed", rc), 0;
    uint32_t v[8], big_n = 1u << 20, *big = malloc(big_n * 4);
    tally_request *r = NULL, *s = NULL;
    fill(big, big_n, rank, 3);
    OK(rank, tally_irecv(c, v, 8, TALLY_I32, 1 - rank, 99, &r)); /* nobody sends tag 99 */
    if (rank == 0) OK(rank, tally_isend(c, big, big_n, TALLY_I32, 1, 3, &s));
    OK(rank, tally_barrier(c));
    if (rank == 1) {
        OK(rank, tally_recv(c, big, big_n, TALLY_I32, 0, 3, NULL));
        EXPECT(rank, holds(big, big_n, 0, 3), "the send freed with its communicator arrived");
    }
    OK(rank, tally_comm_free(c));
    /* freed here, or the peer's communicator went first: either is said */
    rc = tally_wait(r);
    const char *m = tally_last_error();
    EXPECT(rank, (rc == TALLY_E_ABORTED && strstr(m, "freed")) || (rc == TALLY_E_PEER_LOST && strstr(m, "closed")),
           "a receive pending at free fails");
    if (s) OK(rank, tally_wait(s));
    tally_request_free(r);
    tally_request_free(s);
    free(big);
    return 0;
}

/* ---- a split: its own ranks, its own post office ---- */

static int fn_split(int rank, int n, void *arg) {
    tally_comm *w, *c = NULL;
    int rc = tally_comm_init(&w);
    if (rc) return bad(rank, "init", "failed", rc), 0;
    OK(rank, tally_comm_split(w, rank % 2, -rank, &c)); /* {2, 0} and {3, 1}: reversed */
    if (c) {
        int me = tally_comm_rank(c), other = 1 - me, from = -1;
        uint32_t v[5];
        fill(v, 5, rank, me);
        if (me == 0) OK(rank, tally_send(c, v, 5, TALLY_I32, other, 0));
        OK(rank, tally_recv(c, v, 5, TALLY_I32, TALLY_ANY_SOURCE, other, me == 1 ? &from : NULL));
        if (me == 1) EXPECT(rank, from == 0 && holds(v, 5, rank + 2, 0), "the split's rank 0 sent it");
        if (me == 1) OK(rank, tally_send(c, v, 5, TALLY_I32, other, 1));
        /* the parent's messages are apart from the split's */
        uint32_t u[2] = {(uint32_t)rank, 0};
        OK(rank, tally_send(w, u, 1, TALLY_I32, (rank + 1) % n, 0));
        OK(rank, tally_recv(w, u + 1, 1, TALLY_I32, (rank + n - 1) % n, 0, NULL));
        EXPECT(rank, u[1] == (uint32_t)((rank + n - 1) % n), "the world's message");
        EXPECT(rank, tally_send(c, v, 5, TALLY_I32, 2, 0) == TALLY_E_INVALID, "a rank outside the split");
        /* its messages name world ranks too */
        if (me == 0) OK(rank, tally_send(c, v, 2, TALLY_I32, other, 5));
        if (me == 1) {
            int rc = tally_recv(c, v, 3, TALLY_I32, other, 5, NULL);
            EXPECT(rank, rc == TALLY_E_MISMATCH && strstr(tally_last_error(), "(world rank"),
                   "a split's mismatch names world ranks");
        }
    }
    OK(rank, tally_comm_free(c));
    OK(rank, tally_comm_free(w));
    return 0;
}

static void test_one(const char *what, int n, const char *transport, th_rank_fn fn) {
    reset();
    th_opts o = {.transport = transport, .timeout_s = 30};
    char w[128];
    snprintf(w, sizeof w, "%s (%s, %d ranks)", what, transport, n);
    verdict(n, th_run(n, &o, fn, NULL), w);
}

int main(void) {
    R = th_shared_alloc(sizeof *R * TH_MAX_RANKS);
    int nq = sizeof quick_sizes / sizeof quick_sizes[0], nl = sizeof long_sizes / sizeof long_sizes[0];
    if (th_quick()) {
        test_suite("tcp", 2, quick_sizes, nq, 1, 0);
        test_suite("shm", 3, quick_sizes, nq, 1, 0);
        test_one("a receiver that asks late", 2, "tcp", fn_late);
        test_one("beside collectives", 2, "shm", fn_beside);
        test_one("free with requests pending", 2, "tcp", fn_free);
        test_one("a split", 4, "shm", fn_split);
        test_one("waiters on four threads", 2, "shm", fn_waiters);
    }
    if (th_long()) {
        static const char *tps[] = {"tcp", "shm"};
        for (int t = 0; t < 2; t++)
            for (int n = 2; n <= 4; n++) test_suite(tps[t], n, long_sizes, th_light() ? nl - 1 : nl, 1, 0);
        test_suite("tcp", 2, long_sizes, nl, 0, 1);
        test_one("a receiver that asks late", 2, "shm", fn_late);
        test_one("beside collectives", 2, "tcp", fn_beside);
        test_one("beside collectives", 4, "tcp", fn_beside);
        test_one("free with requests pending", 2, "shm", fn_free);
        test_one("a split", 4, "tcp", fn_split);
        test_one("waiters on four threads", 4, "tcp", fn_waiters);
    }
    th_shared_free(R, sizeof *R * TH_MAX_RANKS);
    return th_verdict("test_p2p");
}
