/* ring.c - the ring algorithms: allreduce as reduce-scatter then all-gather around the ring (bandwidth
 * optimal), ring reduce-scatter and all-gather, reduce as reduce-scatter then the blocks to the root, a
 * pipelined chain broadcast, and a ring barrier. */
#include <stdlib.h>
#include <string.h>

#include "../../core/numeric/reduce.h"
#include "../blocks.h"
#include "../algo.h"

/* Each rank sends to its right neighbour and receives from its left one, once per step. */
static int right_of(const tally__ctx *c) { return (c->rank + 1) % c->size; }
static int left_of(const tally__ctx *c) { return (c->rank + c->size - 1) % c->size; }
static int mod(int a, int n) { return ((a % n) + n) % n; }

/* One ring step: send `slen` bytes at `sbuf` right; receive `rlen` bytes from the left into dst,
 * reduced with src when src is not NULL. */
static int ring_step(const tally__ctx *c, const void *sbuf, size_t slen, void *dst, const void *src, size_t rlen,
                     tally_dtype t, tally_op op) {
    tally__send s = {.peer = right_of(c), .buf = sbuf, .len = slen};
    tally__recv r = {.peer = left_of(c), .dst = dst, .src = src, .len = rlen, .dtype = t, .op = op};
    return tally__xchg(c, &s, 1, &r, 1);
}

/* Allreduce, block b = the b-th of n near-equal blocks of the vector. Reduce-scatter: at step s rank r
 * sends block r-s and reduces block r-s-1 as it arrives; each block is reduced into exactly once per
 * rank, so the first (and only) reduction reads `send` and writes `recv`. After n-1 steps rank r owns
 * the finished block r+1, computed once; the all-gather then copies every finished block everywhere,
 * which is why all ranks end bit-identical. */
static int ring_allreduce(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op) {
    int n = c->size, r = c->rank, rc;
    size_t es = tally_dtype_size(t);
    tally_op rop = op == TALLY_AVG ? TALLY_SUM : op;
    for (int s = 0; s < n - 1; s++) {
        int sb = mod(r - s, n), rb = mod(r - s - 1, n);
        /* At step 0 our own contribution has not been reduced into recv yet: send it from send. */
        const void *sbuf = tally__at(s == 0 ? send : recv, tally__blk_start(count, n, sb), es);
        size_t roff = tally__blk_start(count, n, rb);
        rc = ring_step(c, sbuf, tally__blk_count(count, n, sb) * es, tally__at(recv, roff, es),
                       tally__at(send, roff, es), tally__blk_count(count, n, rb) * es, t, rop);
        if (rc) return rc;
    }
    if (op == TALLY_AVG) { /* our block is complete and still in cache: divide it before it travels */
        int own = mod(r + 1, n);
        tally__avg_finish(tally__at(recv, tally__blk_start(count, n, own), es), tally__blk_count(count, n, own), t, n);
    }
    for (int s = 0; s < n - 1; s++) {
        int sb = mod(r + 1 - s, n), rb = mod(r - s, n);
        rc = ring_step(c, tally__at(recv, tally__blk_start(count, n, sb), es), tally__blk_count(count, n, sb) * es,
                       tally__at(recv, tally__blk_start(count, n, rb), es), NULL, tally__blk_count(count, n, rb) * es,
                       t, rop);
        if (rc) return rc;
    }
    return 0;
}

/* Reduce-scatter of n blocks of `count` elements, shifted by one against allreduce's so that rank r
 * ends with block r: at step s it sends block r-s-1 and reduces block r-s-2. Partial blocks live in
 * two scratch buffers used in turn (a step sends one while the other receives); the last step reduces
 * straight into recv. */
static int ring_reduce_scatter(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t,
                               tally_op op) {
    int n = c->size, r = c->rank, rc = 0;
    size_t es = tally_dtype_size(t), bytes = count * es;
    char *tmp = n > 2 ? tally__scratch_take(c->scratch, 2 * bytes) : NULL;
    if (n > 2 && !tmp)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: ring reduce_scatter: no memory for %zu bytes", r, 2 * bytes);
    const void *sbuf = tally__at(send, (size_t)mod(r - 1, n) * count, es);
    for (int s = 0; s < n - 1 && !rc; s++) {
        int rb = mod(r - s - 2, n);
        char *dst = s == n - 2 ? recv : tmp + (size_t)(s % 2) * bytes;
        rc = ring_step(c, sbuf, bytes, dst, tally__at(send, (size_t)rb * count, es), bytes, t, op);
        sbuf = dst;
    }
    tally__scratch_give(c->scratch, tmp);
    return rc;
}

/* All-gather: rank r's block starts at its slot; at step s it forwards block r-s and receives r-s-1. */
static int ring_allgather(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t) {
    int n = c->size, r = c->rank, rc;
    size_t es = tally_dtype_size(t), bytes = count * es;
    char *mine = tally__at(recv, (size_t)r * count, es);
    if (mine != send) memcpy(mine, send, bytes);
    for (int s = 0; s < n - 1; s++) {
        int sb = mod(r - s, n), rb = mod(r - s - 1, n);
        rc = ring_step(c, tally__at(recv, (size_t)sb * count, es), bytes, tally__at(recv, (size_t)rb * count, es), NULL,
                       bytes, t, TALLY_SUM);
        if (rc) return rc;
    }
    return 0;
}

/* Broadcast down the chain root, root+1, ..., root-1, in segments so every link is busy at once:
 * the rank at chain position v sends segment j at step j+v and receives it at step j+v-1. The chain only
 * tells a rank about those before it, so the fingerprint rounds of tally__agree come first: a rank that
 * called something else fails the call on every rank, the root included, before any data moves. */
static int ring_broadcast(const tally__ctx *c, void *buf, size_t count, tally_dtype t, int root) {
    int n = c->size, v = mod(c->rank - root, n), rc = tally__agree(c, NULL, 0, t, root);
    if (rc) return rc;
    size_t es = tally_dtype_size(t), seg = tally__seg_elems(es);
    long m = (long)tally__seg_count(count, es);
    for (long step = 0; step < m + n - 2; step++) {
        tally__send s[1];
        tally__recv rv[1];
        int ns = 0, nr = 0;
        long sj = step - v, rj = step - v + 1;
        if (v < n - 1 && sj >= 0 && sj < m) {
            size_t off = (size_t)sj * seg, len = count - off < seg ? count - off : seg;
            s[ns++] = (tally__send){.peer = (c->rank + 1) % n, .buf = tally__at(buf, off, es), .len = len * es};
        }
        if (v > 0 && rj >= 0 && rj < m) {
            size_t off = (size_t)rj * seg, len = count - off < seg ? count - off : seg;
            rv[nr++] = (tally__recv){.peer = left_of(c), .dst = tally__at(buf, off, es), .len = len * es, .dtype = t};
        }
        if (ns + nr == 0) continue;
        if ((rc = tally__xchg(c, s, ns, rv, nr))) return rc;
    }
    return 0;
}

/* Reduce: the reduce-scatter half of the allreduce, partial blocks kept in two scratch blocks used in turn
 * (a step sends one while the other receives), then every rank sends the block it finished, r+1, to the
 * root, whose last step reduces its own straight into recv. The n-1 steps have every rank hear, through
 * its left neighbour, from every other: no release is needed. */
static int ring_reduce(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op,
                       int root) {
    int n = c->size, r = c->rank, rc = 0;
    size_t es = tally_dtype_size(t), most = tally__blk_count(count, n, 0) * es;
    char *tmp = tally__scratch_take(c->scratch, 2 * most);
    if (!tmp) return tally__seterr(TALLY_E_NOMEM, "rank %d: ring reduce: no memory for %zu bytes", r, 2 * most);
    const void *sbuf = tally__at(send, tally__blk_start(count, n, r), es);
    for (int s = 0; s < n - 1 && !rc; s++) {
        int sb = mod(r - s, n), rb = mod(r - s - 1, n);
        size_t roff = tally__blk_start(count, n, rb);
        char *dst = s == n - 2 && r == root ? tally__at(recv, roff, es) : tmp + (size_t)(s % 2) * most;
        rc = ring_step(c, sbuf, tally__blk_count(count, n, sb) * es, dst, tally__at(send, roff, es),
                       tally__blk_count(count, n, rb) * es, t, op);
        sbuf = dst;
    }
    if (!rc && r != root) rc = tally__send_one(c, root, sbuf, tally__blk_count(count, n, mod(r + 1, n)) * es);
    tally__recv *rv = !rc && r == root ? malloc((size_t)(n - 1) * sizeof *rv) : NULL;
    if (!rc && r == root && !rv) rc = tally__seterr(TALLY_E_NOMEM, "rank %d: ring reduce: no memory", r);
    for (int k = 0, i = 0; rv && k < n; k++) {
        int b = mod(k + 1, n); /* the block rank k finished */
        if (k != root)
            rv[i++] = (tally__recv){.peer = k,
                                    .dst = tally__at(recv, tally__blk_start(count, n, b), es),
                                    .len = tally__blk_count(count, n, b) * es,
                                    .dtype = t};
    }
    if (rv) rc = tally__xchg(c, NULL, 0, rv, n - 1);
    free(rv);
    tally__scratch_give(c->scratch, tmp);
    return rc;
}

/* n-1 steps of empty messages around the ring: after step s a rank has heard, through its left
 * neighbour, from the s+1 ranks before it, so after n-1 steps every rank has arrived. */
static int ring_barrier(const tally__ctx *c) {
    static const char none;
    for (int s = 0; s < c->size - 1; s++) {
        char sink;
        int rc = ring_step(c, &none, 0, &sink, NULL, 0, TALLY_U8, TALLY_SUM);
        if (rc) return rc;
    }
    return 0;
}

/* The model: n-1 steps of a block each way, every step on every link at once; the broadcast, a chain of
 * m segments, after the lg fingerprint rounds of tally__agree. */
static double ring_cost(const tally__algo_shape *x, int coll) {
    double n = x->n, S = x->S, f = (n - 1) / n;
    switch (coll) {
    case TALLY__REDUCE_SCATTER: return (n - 1) * x->a + S * f * (x->b + x->g);
    case TALLY__ALLGATHER: return (n - 1) * x->a + S * f * x->b;
    case TALLY__BROADCAST: {
        double s = S / x->m, agree = x->lg * x->a;
        return agree + (n + x->m - 2) * (x->a + s * x->b);
    }
    case TALLY__BARRIER: return (n - 1) * x->a;
    case TALLY__REDUCE: { /* the reduce-scatter, then the blocks to the root */
        double gather = (n - 1) * x->a + S * f * x->b;
        return (n - 1) * x->a + S * f * (x->b + x->g) + gather;
    }
    default: return 2 * (n - 1) * x->a + 2 * S * f * x->b + S * f * x->g;
    }
}

/* Every rank sends n-1 blocks in each phase. */
static double ring_sent(int n, double S) { return 2 * S * (n - 1) / n; }

const tally__algo_desc tally__ring_algo = {.name = "ring",
                                           .allreduce = ring_allreduce,
                                           .reduce_scatter = ring_reduce_scatter,
                                           .allgather = ring_allgather,
                                           .broadcast = ring_broadcast,
                                           .barrier = ring_barrier,
                                           .reduce = ring_reduce,
                                           .takes_avg = 1u << TALLY__ALLREDUCE,
                                           .cost = ring_cost,
                                           .sent = ring_sent};
