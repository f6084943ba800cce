/* pairwise.c - all-to-all by pairwise exchange: n-1 rounds, in round k each rank sends its block for rank
 * + k and receives rank - k's. Every message goes straight to its owner once: best for large blocks. */
#include <stdlib.h>
#include <string.h>

#include "../../core/numeric/copy.h"
#include "../algo.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* One round: up to one send to `to` and one receive from `from` (nothing where a length is 0 and
 * `skip_empty`: alltoallv's counts were agreed beforehand, so both sides skip alike). */
static int pair_round(const tally__ctx *c, int to, const void *sbuf, size_t slen, int from, void *dst, size_t rlen,
                      int skip_empty) {
    tally__send s = {.peer = to, .buf = sbuf, .len = slen};
    tally__recv r = {.peer = from, .dst = dst, .len = rlen, .dtype = TALLY_U8};
    int ns = !skip_empty || slen, nr = !skip_empty || rlen;
    return ns + nr ? tally__xchg(c, &s, ns, &r, nr) : 0;
}

/* In place, a block received in round k would overwrite the one sent in round n-k: the sends then read
 * a copy of the send buffer. */
static int pairwise_alltoall(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t) {
    int n = c->size, me = c->rank, rc = 0;
    size_t bytes = count * tally_dtype_size(t);
    char *copy = send == recv ? tally__scratch_take(c->scratch, (size_t)n * bytes) : NULL;
    if (send == recv && !copy)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: pairwise alltoall: no memory for %zu bytes", me,
                             (size_t)n * bytes);
    const char *src = copy ? memcpy(copy, send, (size_t)n * bytes) : send;
    if (!copy) tally__copy_out((char *)recv + (size_t)me * bytes, src + (size_t)me * bytes, bytes);
    for (int k = 1; k < n && !rc; k++) {
        int to = mod(me + k, n), from = mod(me - k, n);
        rc = pair_round(c, to, src + (size_t)to * bytes, bytes, from, (char *)recv + (size_t)from * bytes, bytes, 0);
    }
    tally__scratch_give(c->scratch, copy);
    return rc;
}

static int pairwise_alltoallv(const tally__ctx *c, const void *send, const size_t *sendcounts, const size_t *sdispls,
                              void *recv, const size_t *recvcounts, const size_t *rdispls, tally_dtype t) {
    int n = c->size, me = c->rank, rc = 0;
    size_t es = tally_dtype_size(t);
    if (sendcounts[me])
        tally__copy_out(tally__at(recv, rdispls[me], es), tally__at(send, sdispls[me], es), sendcounts[me] * es);
    for (int k = 1; k < n && !rc; k++) { /* a buffer may be NULL where its counts are all 0 */
        int to = mod(me + k, n), from = mod(me - k, n);
        const void *sbuf = sendcounts[to] ? tally__at(send, sdispls[to], es) : NULL;
        void *dst = recvcounts[from] ? tally__at(recv, rdispls[from], es) : NULL;
        rc = pair_round(c, to, sbuf, sendcounts[to] * es, from, dst, recvcounts[from] * es, 1);
    }
    return rc;
}

/* The rounds with empty messages: each rank hears from every other directly. */
static int pairwise_barrier(const tally__ctx *c) {
    static const char none;
    char sink;
    int rc = 0;
    for (int k = 1; k < c->size && !rc; k++)
        rc = pair_round(c, mod(c->rank + k, c->size), &none, 0, mod(c->rank - k, c->size), &sink, 0, 0);
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
