/* direct.c - the central baseline ("headquarters"): every rank sends to rank 0, which combines and sends
 * the result back. Simple and latency-bound; the yardstick the other algorithms are measured against. */
#include <stdlib.h>
#include <string.h>

#include "../../core/numeric/copy.h"
#include "../algo.h"

/* Rank 0 reduces the peers' vectors into dst one at a time, in rank order: one exchange each, since
 * two reducing receives into the same bytes may not share an exchange, and a fixed order makes the
 * result reproducible. */
static int root_reduce(const tally__ctx *c, const void *mine, void *dst, size_t bytes, tally_dtype t, tally_op op) {
    for (int k = 1; k < c->size; k++) {
        int rc = tally__recv_one(c, k, dst, k == 1 ? mine : dst, bytes, t, op);
        if (rc) return rc;
    }
    return 0;
}

/* The root sends rank k the `len` bytes at base + k*stride, to all ranks in one exchange. */
static int root_scatter_from(const tally__ctx *c, const void *base, size_t stride, size_t len, int root) {
    tally__send *s = malloc((size_t)(c->size - 1) * sizeof *s);
    if (!s) return tally__seterr(TALLY_E_NOMEM, "rank %d: direct: no memory", c->rank);
    for (int k = 0, i = 0; k < c->size; k++)
        if (k != root) s[i++] = (tally__send){.peer = k, .buf = (const char *)base + (size_t)k * stride, .len = len};
    int rc = tally__xchg(c, s, c->size - 1, NULL, 0);
    free(s);
    return rc;
}

static int root_scatter(const tally__ctx *c, const void *base, size_t stride, size_t len) {
    return root_scatter_from(c, base, stride, len, 0);
}

/* The result is computed once, at rank 0, and copied to everyone. A peer sends and receives in two
 * exchanges so that in place its send never overlaps its receive. */
static int direct_allreduce(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t,
                            tally_op op) {
    size_t bytes = count * tally_dtype_size(t);
    int rc;
    if (c->rank == 0) {
        if ((rc = root_reduce(c, send, recv, bytes, t, op))) return rc;
        return root_scatter(c, recv, 0, bytes);
    }
    if ((rc = tally__send_one(c, 0, send, bytes))) return rc;
    return tally__recv_one(c, 0, recv, NULL, bytes, t, op);
}

/* Rank 0 reduces the whole vector into scratch and sends each rank its block. */
static int direct_reduce_scatter(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t,
                                 tally_op op) {
    size_t bytes = count * tally_dtype_size(t), total = (size_t)c->size * bytes;
    int rc;
    if (c->rank != 0) {
        if ((rc = tally__send_one(c, 0, send, total))) return rc;
        return tally__recv_one(c, 0, recv, NULL, bytes, t, op);
    }
    char *work = tally__scratch_take(c->scratch, total);
    if (!work) return tally__seterr(TALLY_E_NOMEM, "rank 0: direct reduce_scatter: no memory for %zu bytes", total);
    rc = root_reduce(c, send, work, total, t, op);
    if (!rc) rc = root_scatter(c, work, bytes, bytes);
    if (!rc) memcpy(recv, work, bytes);
    tally__scratch_give(c->scratch, work);
    return rc;
}

/* Rank 0 gathers every block in one exchange (plain receives may share one) and sends the whole back. */
static int direct_allgather(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t) {
    size_t bytes = count * tally_dtype_size(t), total = (size_t)c->size * bytes;
    int rc = tally__gather_to_root(c, send, recv, bytes);
    if (rc) return rc;
    if (c->rank != 0) return tally__recv_one(c, 0, recv, NULL, total, t, TALLY_SUM);
    return root_scatter(c, recv, 0, total);
}

/* The root sends to everyone at once (routing through rank 0 would only add a hop), after the fingerprint
 * rounds of tally__agree: without them the root, which needs nothing from its peers, would return before
 * a rank that called something else is noticed. */
static int direct_broadcast(const tally__ctx *c, void *buf, size_t count, tally_dtype t, int root) {
    size_t bytes = count * tally_dtype_size(t);
    int rc;
    if (c->rank != root) {
        rc = tally__agree(c, NULL, 0, t, root);
        return rc ? rc : tally__recv_one(c, root, buf, NULL, bytes, t, TALLY_SUM);
    }
    tally__send *s = malloc((size_t)(c->size - 1) * sizeof *s);
    if (!s) return tally__seterr(TALLY_E_NOMEM, "rank %d: direct broadcast: no memory", c->rank);
    for (int k = 0, i = 0; k < c->size; k++)
        if (k != root) s[i++] = (tally__send){.peer = k, .buf = buf, .len = bytes};
    rc = tally__agree(c, NULL, 0, t, root);
    if (!rc) rc = tally__xchg(c, s, c->size - 1, NULL, 0);
    free(s);
    return rc;
}

/* ---- rooted: the root exchanges with each rank ----
 * The data flows one way, which would let a leaf (gather, reduce) or the root (scatter) return before
 * hearing from every rank: the fingerprint rounds of tally__agree come first, as for the broadcast. They
 * also make a rank that called something else (another root, say) send before it waits, so the
 * disagreement is seen rather than two roots waiting on each other. */

/* The root reduces the others' vectors into recv one at a time, in rank order (two reducing receives into
 * the same bytes may not share an exchange, and a fixed order makes the result reproducible). */
static int direct_reduce(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op,
                         int root) {
    size_t bytes = count * tally_dtype_size(t);
    int rc = tally__agree(c, NULL, 0, t, root);
    if (rc || c->rank != root) return rc ? rc : tally__send_one(c, root, send, bytes);
    const void *src = send;
    for (int k = 0; k < c->size && !rc; k++) {
        if (k == root) continue;
        rc = tally__recv_one(c, k, recv, src, bytes, t, op);
        src = recv;
    }
    return rc;
}

/* The root takes every block in one exchange (plain receives into disjoint blocks may share one). */
static int direct_gather(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, int root) {
    size_t es = tally_dtype_size(t), bytes = count * es;
    int rc = tally__agree(c, NULL, 0, t, root);
    if (rc || c->rank != root) return rc ? rc : tally__send_one(c, root, send, bytes);
    tally__recv *r = malloc((size_t)(c->size - 1) * sizeof *r);
    if (!r) return tally__seterr(TALLY_E_NOMEM, "rank %d: direct gather: no memory", c->rank);
    for (int k = 0, i = 0; k < c->size; k++)
        if (k != root) r[i++] = (tally__recv){.peer = k, .dst = tally__at(recv, (size_t)k * count, es), .len = bytes};
    tally__copy_out(tally__at(recv, (size_t)root * count, es), send, bytes);
    rc = tally__xchg(c, NULL, 0, r, c->size - 1);
    free(r);
    return rc;
}

/* The root sends every rank its block in one exchange. */
static int direct_scatter(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, int root) {
    size_t es = tally_dtype_size(t), bytes = count * es;
    int rc = tally__agree(c, NULL, 0, t, root);
    if (rc || c->rank != root) return rc ? rc : tally__recv_one(c, root, recv, NULL, bytes, t, TALLY_SUM);
    rc = root_scatter_from(c, send, bytes, bytes, root);
    if (!rc) tally__copy_out(recv, tally__at(send, (size_t)root * count, es), bytes);
    return rc;
}

/* Everyone checks in with rank 0 (empty messages), which releases everyone once all have. */
static int direct_barrier(const tally__ctx *c) {
    static const char none;
    char sink;
    if (c->rank != 0) {
        int rc = tally__send_one(c, 0, &none, 0);
        return rc ? rc : tally__recv_one(c, 0, &sink, NULL, 0, TALLY_U8, TALLY_SUM);
    }
    tally__recv *r = malloc((size_t)(c->size - 1) * sizeof *r);
    if (!r) return tally__seterr(TALLY_E_NOMEM, "rank 0: direct barrier: no memory");
    for (int k = 1; k < c->size; k++) r[k - 1] = (tally__recv){.peer = k, .dst = &sink, .dtype = TALLY_U8};
    int rc = tally__xchg(c, NULL, 0, r, c->size - 1);
    free(r);
    return rc ? rc : root_scatter(c, &none, 0, 0);
}

/* The model: n-1 messages of the whole vector through rank 0 each way, reduced there one at a time;
 * the broadcast and the rooted ones after the lg fingerprint rounds of tally__agree, then n-1 messages
 * through the root. */
static double direct_cost(const tally__algo_shape *x, int coll) {
    double n = x->n, S = x->S, f = (n - 1) / n;
    switch (coll) {
    case TALLY__REDUCE_SCATTER: {
        double scatter = (n - 1) * x->a + S * f * x->b; /* rank 0 hands out the blocks */
        return (n - 1) * (x->a + S * (x->b + x->g)) + scatter;
    }
    case TALLY__ALLGATHER: {
        double gather = (n - 1) * x->a + S * f * x->b; /* everyone to rank 0 */
        return gather + (n - 1) * (x->a + S * x->b);
    }
    case TALLY__BROADCAST: return x->lg * x->a + (n - 1) * (x->a + S * x->b);
    case TALLY__BARRIER: return 2 * (n - 1) * x->a;
    case TALLY__REDUCE: return x->lg * x->a + (n - 1) * (x->a + S * (x->b + x->g));
    case TALLY__GATHER: return x->lg * x->a + (n - 1) * x->a + S * f * x->b;
    /* Each rank takes its block itself where the transport lets receivers read in place: pull of them
     * copy at once, where the tree's rounds follow each other. */
    case TALLY__SCATTER: return tally__algo_crowded(x, x->lg * x->a + (n - 1) * x->a + S * f * x->b / x->pull, S * f);
    default: return 2 * (n - 1) * x->a + 2 * (n - 1) * S * x->b + (n - 1) * S * x->g;
    }
}

/* The root sends everyone the result. */
static double direct_sent(int n, double S) { return (n - 1) * S; }

const tally__algo_desc tally__direct_algo = {.name = "direct",
                                             .allreduce = direct_allreduce,
                                             .reduce_scatter = direct_reduce_scatter,
                                             .allgather = direct_allgather,
                                             .broadcast = direct_broadcast,
                                             .barrier = direct_barrier,
                                             .reduce = direct_reduce,
                                             .gather = direct_gather,
                                             .scatter = direct_scatter,
                                             .cost = direct_cost,
                                             .sent = direct_sent};
