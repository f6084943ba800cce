/* rhd.c - recursive halving-doubling (Rabenseifner): allreduce as reduce-scatter by recursive halving
 * plus all-gather by recursive doubling, in log2 rounds; binomial broadcast and dissemination barrier. */
#include <stdlib.h>
#include <string.h>

#include "../blocks.h"
#include "../algo.h"

/* Non-powers of two: with p the largest power of two <= n and e = n - p extra ranks, the first 2e ranks
 * pair up (2i, 2i+1); the odd one hands its data to the even one and sits out until it gets the
 * result back. The p remaining ranks get new ranks 0..p-1 (nr) and run the power-of-two algorithm.
 * New rank g stands for the real ranks from real_of(g) up to real_of(g+1)-1: one or two consecutive
 * ranks, so the blocks it is responsible for in reduce-scatter and all-gather are contiguous. */
typedef struct rhd_fold {
    int n, p, extra;
    int nr;      /* new rank, -1 for a rank that sits out */
    int partner; /* the other rank of a pair, -1 when unpaired */
} rhd_fold;

static void fold_init(rhd_fold *f, int n, int rank) {
    f->n = n;
    f->p = tally__pow2_floor(n);
    f->extra = n - f->p;
    if (rank < 2 * f->extra) {
        f->partner = rank ^ 1;
        f->nr = (rank & 1) ? -1 : rank / 2;
    } else {
        f->partner = -1;
        f->nr = rank - f->extra;
    }
}

static int real_of(const rhd_fold *f, int nr) { return nr < f->extra ? 2 * nr : nr + f->extra; }

/* One round with a partner: send slen bytes at sbuf; receive rlen bytes into dst, reduced with src
 * when src != NULL. */
static int swap(const tally__ctx *c, int peer, const void *sbuf, size_t slen, void *dst, const void *src, size_t rlen,
                tally_dtype t, tally_op op) {
    tally__send s = {.peer = peer, .buf = sbuf, .len = slen};
    tally__recv r = {.peer = peer, .dst = dst, .src = src, .len = rlen, .dtype = t, .op = op};
    return tally__xchg(c, &s, 1, &r, 1);
}

/* Where reducing step k of `steps` writes so that the last step writes recv (the steps alternate). */
static void *step_dst(int steps, int k, void *recv, void *tmp) { return (steps - 1 - k) % 2 == 0 ? recv : tmp; }

/* Small vectors: log2 p rounds, each swapping the whole vector with the partner nr ^ d and reducing.
 * Both partners compute a op b and b op a, equal bit for bit because every op is commutative, so all
 * ranks stay identical. A round must not send the buffer it receives into, so the running result
 * alternates between recv and a scratch vector. */
static int rhd_allreduce_small(const tally__ctx *c, const rhd_fold *f, const void *send, void *recv, size_t count,
                               tally_dtype t, tally_op op) {
    size_t bytes = count * tally_dtype_size(t);
    char *tmp = tally__scratch_take(c->scratch, bytes);
    if (!tmp) return tally__seterr(TALLY_E_NOMEM, "rank %d: rhd allreduce: no memory for %zu bytes", c->rank, bytes);
    int rounds = tally__log2_ceil(f->p) + (f->partner >= 0), rc = 0, k = 0;
    const void *cur = send;
    if (f->partner >= 0) { /* the fold sends nothing, so it may write the buffer it reads */
        void *dst = step_dst(rounds, k, recv, tmp);
        rc = tally__recv_one(c, f->partner, dst, send, bytes, t, op);
        cur = dst;
        k++;
    }
    for (int d = 1; d < f->p && !rc; d *= 2, k++) {
        void *dst = cur == recv ? (void *)tmp : cur == tmp ? recv : step_dst(rounds, k, recv, tmp);
        rc = swap(c, real_of(f, f->nr ^ d), cur, bytes, dst, cur, bytes, t, op);
        cur = dst;
    }
    if (!rc && cur != recv) memcpy(recv, cur, bytes);
    tally__scratch_give(c->scratch, tmp);
    return rc;
}

/* Large vectors: cut into p blocks; recursive halving leaves new rank nr with block nr reduced (each
 * block computed once, by its owner), recursive doubling copies the blocks everywhere. */
static int rhd_allreduce_large(const tally__ctx *c, const rhd_fold *f, const void *send, void *recv, size_t count,
                               tally_dtype t, tally_op op) {
    int p = f->p, nr = f->nr, rc;
    size_t es = tally_dtype_size(t);
    const void *cur = send;
    if (f->partner >= 0) {
        if ((rc = tally__recv_one(c, f->partner, recv, send, count * tally_dtype_size(t), t, op))) return rc;
        cur = recv;
    }
    int lo = 0, hi = p; /* the blocks we are still responsible for */
    for (int d = p / 2; d >= 1; d /= 2) {
        int mid = lo + d, klo = (nr & d) ? mid : lo, khi = (nr & d) ? hi : mid;
        int glo = (nr & d) ? lo : mid, ghi = (nr & d) ? mid : hi;
        size_t ks = tally__blk_start(count, p, klo), ke = tally__blk_start(count, p, khi);
        size_t gs = tally__blk_start(count, p, glo), ge = tally__blk_start(count, p, ghi);
        rc = swap(c, real_of(f, nr ^ d), tally__at(cur, gs, es), (ge - gs) * es, tally__at(recv, ks, es),
                  tally__at(cur, ks, es), (ke - ks) * es, t, op);
        if (rc) return rc;
        cur = recv;
        lo = klo;
        hi = khi;
    }
    for (int d = 1; d < p; d *= 2) {
        int mine = nr & ~(d - 1), theirs = (nr ^ d) & ~(d - 1);
        size_t ms = tally__blk_start(count, p, mine), me = tally__blk_start(count, p, mine + d);
        size_t ts = tally__blk_start(count, p, theirs), te = tally__blk_start(count, p, theirs + d);
        rc = swap(c, real_of(f, nr ^ d), tally__at(recv, ms, es), (me - ms) * es, tally__at(recv, ts, es), NULL,
                  (te - ts) * es, t, op);
        if (rc) return rc;
    }
    return 0;
}

static int rhd_allreduce(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op) {
    rhd_fold f;
    fold_init(&f, c->size, c->rank);
    size_t bytes = count * tally_dtype_size(t);
    int rc;
    if (f.nr < 0) { /* sits out: hand over the vector, wait for the result */
        if ((rc = tally__send_one(c, f.partner, send, bytes))) return rc;
        return tally__recv_one(c, f.partner, recv, NULL, bytes, t, op);
    }
    if (bytes <= TALLY__RHD_SMALL_BYTES || count < (size_t)f.p)
        rc = rhd_allreduce_small(c, &f, send, recv, count, t, op);
    else
        rc = rhd_allreduce_large(c, &f, send, recv, count, t, op);
    if (!rc && f.partner >= 0) rc = tally__send_one(c, f.partner, recv, bytes);
    return rc;
}

/* Reduce-scatter by recursive halving over the p new ranks; new rank g ends with the blocks of the real
 * ranks it stands for, and an even paired rank passes its partner's block on. Partial results live in
 * a scratch vector; the last round reduces a lone rank's block straight into recv. */
static int rhd_reduce_scatter(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t,
                              tally_op op) {
    rhd_fold f;
    fold_init(&f, c->size, c->rank);
    size_t es = tally_dtype_size(t), total = (size_t)c->size * count;
    int rc;
    if (f.nr < 0) {
        if ((rc = tally__send_one(c, f.partner, send, total * es))) return rc;
        return tally__recv_one(c, f.partner, recv, NULL, count * es, t, op);
    }
    char *work = tally__scratch_take(c->scratch, total * es);
    if (!work) return tally__seterr(TALLY_E_NOMEM, "rank %d: rhd reduce_scatter: no memory", c->rank);
    const void *cur = send;
    rc = 0;
    if (f.partner >= 0) {
        rc = tally__recv_one(c, f.partner, work, send, total * es, t, op);
        cur = work;
    }
    int lo = 0, hi = f.p, nr = f.nr;
    for (int d = f.p / 2; d >= 1 && !rc; d /= 2) {
        int mid = lo + d, klo = (nr & d) ? mid : lo, khi = (nr & d) ? hi : mid;
        int glo = (nr & d) ? lo : mid, ghi = (nr & d) ? mid : hi;
        size_t ks = (size_t)real_of(&f, klo) * count, ke = (size_t)real_of(&f, khi) * count;
        size_t gs = (size_t)real_of(&f, glo) * count, ge = (size_t)real_of(&f, ghi) * count;
        /* The last round of a lone rank reduces its one block straight into recv. */
        char *dst = d == 1 && f.partner < 0 ? (char *)recv : tally__at(work, ks, es);
        rc = swap(c, real_of(&f, nr ^ d), tally__at(cur, gs, es), (ge - gs) * es, dst, tally__at(cur, ks, es),
                  (ke - ks) * es, t, op);
        cur = work;
        lo = klo;
        hi = khi;
    }
    if (!rc && f.partner >= 0) {
        memcpy(recv, work + (size_t)c->rank * count * es, count * es);
        rc = tally__send_one(c, f.partner, work + (size_t)f.partner * count * es, count * es);
    }
    tally__scratch_give(c->scratch, work);
    return rc;
}

/* All-gather by recursive doubling over the p new ranks: at distance d a rank holds the blocks of its
 * aligned group of d new ranks and swaps them for the partner group's. A rank that sits out first
 * hands its block to its partner and gets the whole vector back at the end. */
static int rhd_allgather(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t) {
    rhd_fold f;
    fold_init(&f, c->size, c->rank);
    size_t es = tally_dtype_size(t), bytes = count * es, total = (size_t)c->size * bytes;
    int rc;
    if (f.nr < 0) {
        if ((rc = tally__send_one(c, f.partner, send, bytes))) return rc;
        return tally__recv_one(c, f.partner, recv, NULL, total, t, TALLY_SUM);
    }
    char *mine = (char *)recv + (size_t)c->rank * bytes;
    if (mine != send) memcpy(mine, send, bytes);
    if (f.partner >= 0 &&
        (rc = tally__recv_one(c, f.partner, (char *)recv + (size_t)f.partner * bytes, NULL, bytes, t, TALLY_SUM)))
        return rc;
    for (int d = 1; d < f.p; d *= 2) {
        int g = f.nr & ~(d - 1), h = (f.nr ^ d) & ~(d - 1);
        size_t ms = (size_t)real_of(&f, g) * bytes, me = (size_t)real_of(&f, g + d) * bytes;
        size_t ts = (size_t)real_of(&f, h) * bytes, te = (size_t)real_of(&f, h + d) * bytes;
        rc = swap(c, real_of(&f, f.nr ^ d), (char *)recv + ms, me - ms, (char *)recv + ts, NULL, te - ts, t, TALLY_SUM);
        if (rc) return rc;
    }
    return f.partner >= 0 ? tally__send_one(c, f.partner, recv, total) : 0;
}

/* Binomial tree from the root over virtual ranks v = rank - root: in the round of distance m, the ranks
 * v < m that have the data send it to v + m; ceil(log2 n) rounds. They run as the dissemination rounds of
 * tally__agree, whose other edges carry empty fingerprints: the root and every receiver hear from all
 * ranks before returning, for the latency of a barrier and no extra round. */
static int rhd_broadcast(const tally__ctx *c, void *buf, size_t count, tally_dtype t, int root) {
    return tally__agree(c, buf, count * tally_dtype_size(t), t, root);
}

/* Dissemination: in round k every rank signals rank + 2^k and waits for rank - 2^k; after
 * ceil(log2 n) rounds each rank has heard, directly or not, from all others. */
static int rhd_barrier(const tally__ctx *c) { return tally__agree(c, NULL, 0, TALLY_U8, 0); }

/* The model: log2 p rounds, halving then doubling (a small vector: whole in every round), each on a link
 * its host's ranks may share (bs); a fold adds an exchange of the vector each way; the broadcast's data
 * rides in the lg fingerprint rounds. */
static double rhd_cost(const tally__algo_shape *x, int coll) {
    double n = x->n, S = x->S, pf = (x->p - 1) / x->p;
    switch (coll) {
    case TALLY__REDUCE_SCATTER:
        return x->lp * x->a + S * pf * (x->bs + x->g) + x->fold * (2 * x->a + S * (x->bs + x->g) + S / n * x->bs);
    case TALLY__ALLGATHER: return x->lp * x->a + S * pf * x->bs + x->fold * (2 * x->a + S / n * x->bs + S * x->bs);
    case TALLY__BROADCAST: return x->lg * (x->a + S * x->b);
    case TALLY__BARRIER: return x->lg * x->a;
    default: {
        double fold = x->fold * (2 * x->a + 2 * S * x->bs + S * x->g);
        if (x->S <= (double)TALLY__RHD_SMALL_BYTES) return x->lp * (x->a + S * x->bs + S * x->g) + fold;
        return 2 * x->lp * x->a + 2 * S * pf * x->bs + S * pf * x->g + fold;
    }
    }
}

/* A paired rank also returns the result to the rank that sat out. */
static double rhd_sent(int n, double S) {
    int p = tally__pow2_floor(n), fold = p != n;
    if (S <= (double)TALLY__RHD_SMALL_BYTES) return tally__log2_ceil(p) * S + fold * S;
    return 2 * S * (p - 1) / p + fold * S;
}

const tally__algo_desc tally__rhd_algo = {.name = "rhd",
                                          .allreduce = rhd_allreduce,
                                          .reduce_scatter = rhd_reduce_scatter,
                                          .allgather = rhd_allgather,
                                          .broadcast = rhd_broadcast,
                                          .barrier = rhd_barrier,
                                          .cost = rhd_cost,
                                          .sent = rhd_sent};
