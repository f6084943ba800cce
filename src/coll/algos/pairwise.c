/* pairwise.c - all-to-all by pairwise exchange: n-1 rounds, in round k each rank sends its block for rank
 * + k and receives rank - k's. Every message goes straight to its owner once: best for large blocks. */
#include <stdlib.h>
#include <string.h>

#include "../../core/numeric/copy.h"
#include "../algo.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* Round k's two messages (to me + k, from me - k), from what the collective knows: its buffers and
 * counts. A length of 0 with skip_empty leaves that message out. */
typedef struct pair_plan {
    const char *src;
    char *dst;
    size_t bytes;                                              /* alltoall: every block's length */
    const size_t *sendcounts, *sdispls, *recvcounts, *rdispls; /* alltoallv (sendcounts non-NULL), */
    size_t es;                                                 /* in elements of this size */
} pair_plan;

static void pair_messages(const pair_plan *p, int to, int from, tally__send *s, tally__recv *r) {
    size_t slen = p->sendcounts ? p->sendcounts[to] * p->es : p->bytes;
    size_t rlen = p->sendcounts ? p->recvcounts[from] * p->es : p->bytes;
    size_t soff = p->sendcounts ? p->sdispls[to] * p->es : (size_t)to * p->bytes;
    size_t roff = p->sendcounts ? p->rdispls[from] * p->es : (size_t)from * p->bytes;
    /* a buffer may be NULL where its counts are all 0 */
    *s = (tally__send){.peer = to, .buf = slen ? p->src + soff : NULL, .len = slen};
    *r = (tally__recv){.peer = from, .dst = rlen ? p->dst + roff : NULL, .len = rlen, .dtype = TALLY_U8};
}

/* On a crowded host whose transport moves messages to several peers side by side (shm), the rounds go
 * as one exchange: with more ranks than CPUs a round's partners are seldom running at once, and a rank
 * waiting on one round's partner could be copying for another's. 4 ranks on 2 CPUs, 64 MiB: as fast or
 * faster in three sets of starts, never slower in the worst start (benchmarks-history.md). Over tcp one
 * round at a time stays faster (59 against 67 ms). */
static int pairwise_at_once(const tally__ctx *c) { return c->tp->fan_out && c->tp->ctx.crowded; }

static int pairwise_together(const tally__ctx *c, const pair_plan *p, int skip_empty) {
    int n = c->size, me = c->rank, ns = 0, nr = 0;
    tally__send *s = malloc((size_t)n * sizeof *s);
    tally__recv *r = malloc((size_t)n * sizeof *r);
    int rc = s && r ? 0 : tally__seterr(TALLY_E_NOMEM, "rank %d: pairwise alltoall: no memory for %d ranks", me, n);
    for (int k = 1; k < n && !rc; k++) {
        pair_messages(p, mod(me + k, n), mod(me - k, n), &s[ns], &r[nr]);
        ns += !skip_empty || s[ns].len;
        nr += !skip_empty || r[nr].len;
    }
    if (!rc && ns + nr) rc = tally__xchg(c, s, ns, r, nr);
    free(s);
    free(r);
    return rc;
}

/* The n-1 rounds, one exchange each or all in one (alltoallv's counts were agreed beforehand, so with
 * skip_empty both sides leave out the same empty messages). */
static int pairwise_rounds(const tally__ctx *c, const pair_plan *p, int skip_empty) {
    if (pairwise_at_once(c)) return pairwise_together(c, p, skip_empty);
    int n = c->size, me = c->rank, rc = 0;
    for (int k = 1; k < n && !rc; k++) {
        tally__send s;
        tally__recv r;
        pair_messages(p, mod(me + k, n), mod(me - k, n), &s, &r);
        int ns = !skip_empty || s.len, nr = !skip_empty || r.len;
        if (ns + nr) rc = tally__xchg(c, &s, ns, &r, nr);
    }
    return rc;
}

/* In place, a block received in round k would overwrite the one sent in round n-k: the sends then read
 * a copy of the send buffer. */
static int pairwise_alltoall(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t) {
    int n = c->size, me = c->rank;
    size_t bytes = count * tally_dtype_size(t);
    char *copy = send == recv ? tally__scratch_take(c->scratch, (size_t)n * bytes) : NULL;
    if (send == recv && !copy)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: pairwise alltoall: no memory for %zu bytes", me,
                             (size_t)n * bytes);
    const char *src = copy ? memcpy(copy, send, (size_t)n * bytes) : send;
    if (!copy) tally__copy_out((char *)recv + (size_t)me * bytes, src + (size_t)me * bytes, bytes);
    pair_plan p = {.src = src, .dst = recv, .bytes = bytes};
    int rc = pairwise_rounds(c, &p, 0);
    tally__scratch_give(c->scratch, copy);
    return rc;
}

static int pairwise_alltoallv(const tally__ctx *c, const void *send, const size_t *sendcounts, const size_t *sdispls,
                              void *recv, const size_t *recvcounts, const size_t *rdispls, tally_dtype t) {
    int me = c->rank;
    size_t es = tally_dtype_size(t);
    if (sendcounts[me])
        tally__copy_out(tally__at(recv, rdispls[me], es), tally__at(send, sdispls[me], es), sendcounts[me] * es);
    pair_plan p = {.src = send,
                   .dst = recv,
                   .sendcounts = sendcounts,
                   .sdispls = sdispls,
                   .recvcounts = recvcounts,
                   .rdispls = rdispls,
                   .es = es};
    return pairwise_rounds(c, &p, 1);
}

/* The rounds with empty messages, one at a time: each rank hears from every other directly. */
static int pairwise_barrier(const tally__ctx *c) {
    static const char none;
    char sink;
    int rc = 0;
    for (int k = 1; k < c->size && !rc; k++) {
        tally__send s = {.peer = mod(c->rank + k, c->size), .buf = &none};
        tally__recv r = {.peer = mod(c->rank - k, c->size), .dst = &sink, .dtype = TALLY_U8};
        rc = tally__xchg(c, &s, 1, &r, 1);
    }
    return rc;
}

/* The model: n-1 rounds, a block of S/n each way per round. */
static double pairwise_cost(const tally__algo_shape *x, int coll) {
    double n = x->n;
    if (coll == TALLY__BARRIER) return (n - 1) * x->a;
    return (n - 1) * x->a + x->S * (n - 1) / n * x->b; /* alltoall, alltoallv */
}

const tally__algo_desc tally__pairwise_algo = {.name = "pairwise",
                                               .barrier = pairwise_barrier,
                                               .alltoall = pairwise_alltoall,
                                               .alltoallv = pairwise_alltoallv,
                                               .cost = pairwise_cost};
