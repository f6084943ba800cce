/* rooted.c - the rooted collectives (reduce, gather, scatter) and all-to-all (alltoall, alltoallv): their
 * public entry points and bodies, which validate, fingerprint and dispatch through the algorithm table. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/numeric/reduce.h"
#include "algo.h"
#include "async.h"
#include "coll.h"

static int root_check(const tally__ctx *x, const char *fn, int root) {
    if (root >= 0 && root < x->size) return 0;
    return tally__seterr(TALLY_E_INVALID, "%s on rank %d: root %d is out of range [0, %d)", fn, x->rank, root, x->size);
}

static void copy_if_apart(void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memmove(dst, src, bytes);
}

/* The chosen algorithm's descriptor when it runs coll, else NULL (the error is set). */
static const tally__algo_desc *algo_for(tally_comm *c, int algo, int coll) {
    const tally__algo_desc *d = tally__algo_get(algo);
    if (d && tally__algo_has(d, coll)) return d;
    tally__comm_no_algo(c, coll);
    return NULL;
}

/* Checks shared by the rooted calls: the common ones, root, the buffer every rank uses (`mine`) and, on
 * root only, the one only root touches (`roots`): NULL refused where count > 0. */
static int rooted_check(tally_comm *c, const char *fn, const tally__call *a, int op, const char *mine_name,
                        const void *mine, const char *roots_name, const void *roots) {
    int rc = tally__comm_check(c, fn, a->count, a->t, op);
    if (rc) return rc;
    const tally__ctx *x = tally__comm_ctx(c);
    if ((rc = root_check(x, fn, a->root))) return rc;
    if ((rc = tally__comm_need_buf(c, fn, mine_name, mine, a->count))) return rc;
    return x->rank == a->root ? tally__comm_need_buf(c, fn, roots_name, roots, a->count) : 0;
}

static int reduce_body(tally_comm *c, const tally__call *a) {
    int rc = rooted_check(c, "tally_reduce", a, a->op, "send", a->send, "recv", a->recv);
    if (rc) return rc;
    const tally__ctx *x = tally__comm_ctx(c);
    size_t bytes = a->count * tally_dtype_size(a->t);
    int algo = tally__comm_begin(c, TALLY__REDUCE, a->count, a->t, a->op, a->root, bytes);
    int root = x->rank == a->root;
    if (x->size == 1) {
        copy_if_apart(a->recv, a->send, bytes);
        return 0;
    }
    if (a->count == 0) return tally__comm_empty(c, algo);
    const tally__algo_desc *d = algo_for(c, algo, TALLY__REDUCE);
    if (!d) return TALLY_E_INVALID;
    /* AVG as SUM, divided once at the root: no algorithm takes it itself. */
    tally_op rop = a->op == TALLY_AVG ? TALLY_SUM : a->op;
    rc = d->reduce(x, a->send, root ? a->recv : NULL, a->count, a->t, rop, a->root);
    if (!rc && root && rop != a->op) tally__avg_finish(a->recv, a->count, a->t, x->size);
    return rc;
}

/* gather (to_root) or scatter: blocks of count elements, root's buffer holding size of them. */
static int rooted_move_body(tally_comm *c, const tally__call *a, int to_root) {
    const char *fn = to_root ? "tally_gather" : "tally_scatter";
    int rc = to_root ? rooted_check(c, fn, a, TALLY_SUM, "send", a->send, "recv", a->recv)
                     : rooted_check(c, fn, a, TALLY_SUM, "recv", a->recv, "send", a->send);
    if (rc) return rc;
    const tally__ctx *x = tally__comm_ctx(c);
    int coll = to_root ? TALLY__GATHER : TALLY__SCATTER, root = x->rank == a->root;
    size_t bytes = a->count * tally_dtype_size(a->t);
    int algo = tally__comm_begin(c, coll, a->count, a->t, TALLY_SUM, a->root, bytes * (size_t)x->size);
    if (x->size == 1) {
        copy_if_apart(a->recv, a->send, bytes);
        return 0;
    }
    if (a->count == 0) return tally__comm_empty(c, algo);
    const tally__algo_desc *d = algo_for(c, algo, coll);
    if (!d) return TALLY_E_INVALID;
    if (to_root) return d->gather(x, a->send, root ? a->recv : NULL, a->count, a->t, a->root);
    return d->scatter(x, root ? a->send : NULL, a->recv, a->count, a->t, a->root);
}

static int alltoall_body(tally_comm *c, const tally__call *a) {
    static const char fn[] = "tally_alltoall";
    int rc = tally__comm_check(c, fn, a->count, a->t, TALLY_SUM);
    if (!rc) rc = tally__comm_need_buf(c, fn, "send", a->send, a->count);
    if (!rc) rc = tally__comm_need_buf(c, fn, "recv", a->recv, a->count);
    if (rc) return rc;
    const tally__ctx *x = tally__comm_ctx(c);
    size_t bytes = a->count * tally_dtype_size(a->t);
    int algo = tally__comm_begin(c, TALLY__ALLTOALL, a->count, a->t, TALLY_SUM, -1, bytes * (size_t)x->size);
    if (x->size == 1) {
        copy_if_apart(a->recv, a->send, bytes);
        return 0;
    }
    if (a->count == 0) return tally__comm_empty(c, algo);
    const tally__algo_desc *d = algo_for(c, algo, TALLY__ALLTOALL);
    return d ? d->alltoall(x, a->send, a->recv, a->count, a->t) : TALLY_E_INVALID;
}

/* ---- alltoallv ---- */

/* One side's counts and displacements: each entry in range, the buffer there where a count needs it.
 * Sets *lo and *hi to the byte extent the counts cover (lo > hi: none). */
static int v_side(const tally__ctx *x, const char *what, const void *buf, const size_t *counts, const size_t *displs,
                  size_t esize, size_t *lo, size_t *hi) {
    static const char fn[] = "tally_alltoallv";
    const size_t limit = ((size_t)1 << 50) / esize;
    *lo = SIZE_MAX;
    *hi = 0;
    for (int j = 0; j < x->size; j++) {
        if (counts[j] > limit || displs[j] > limit - counts[j])
            return tally__seterr(TALLY_E_INVALID, "%s on rank %d: %scounts[%d] %zu at displacement %zu is too large",
                                 fn, x->rank, what, j, counts[j], displs[j]);
        if (!counts[j]) continue;
        if (!buf)
            return tally__seterr(TALLY_E_INVALID, "%s on rank %d: %s buffer is NULL with %scounts[%d] = %zu", fn,
                                 x->rank, what, what, j, counts[j]);
        if (displs[j] * esize < *lo) *lo = displs[j] * esize;
        if ((displs[j] + counts[j]) * esize > *hi) *hi = (displs[j] + counts[j]) * esize;
    }
    return 0;
}

static int v_check(tally_comm *c, const tally__call *a) {
    static const char fn[] = "tally_alltoallv";
    int rc = tally__comm_check(c, fn, 0, a->t, TALLY_SUM);
    if (rc) return rc;
    const tally__ctx *x = tally__comm_ctx(c);
    const char *names[4] = {"sendcounts", "sdispls", "recvcounts", "rdispls"};
    const size_t *arrays[4] = {a->sendcounts, a->sdispls, a->recvcounts, a->rdispls};
    for (int k = 0; k < 4; k++)
        if (!arrays[k]) return tally__seterr(TALLY_E_INVALID, "%s on rank %d: %s is NULL", fn, x->rank, names[k]);
    size_t es = tally_dtype_size(a->t), slo, shi, rlo, rhi;
    if ((rc = v_side(x, "send", a->send, a->sendcounts, a->sdispls, es, &slo, &shi))) return rc;
    if ((rc = v_side(x, "recv", a->recv, a->recvcounts, a->rdispls, es, &rlo, &rhi))) return rc;
    const char *s = (const char *)a->send, *r = (const char *)a->recv;
    if (slo < shi && rlo < rhi && s + slo < r + rhi && r + rlo < s + shi)
        return tally__seterr(TALLY_E_INVALID,
                             "%s on rank %d: send and recv overlap (the bytes the counts cover); alltoallv has no in "
                             "place form: give recv its own memory",
                             fn, x->rank);
    return 0;
}

/* Rank `from` sends `sends` elements to rank `to`, which expects `expects`: the same words whichever
 * of the two reports it, so every rank names the disagreement alike. */
static int v_mismatch(const tally__ctx *x, int from, int to, size_t sends, size_t expects) {
    char what[160];
    tally__sig_format(x->tp->ctx.sig, what, sizeof what);
    return tally__fault_raise(x->tp->ctx.fault, TALLY_E_MISMATCH, from == x->rank ? to : from,
                              "collective mismatch in %s: rank %d's sendcounts[%d] is %zu but rank %d's "
                              "recvcounts[%d] is %zu; every pair of ranks must agree on what one sends the other",
                              what, from, to, sends, to, from, expects);
}

/* Every pair compares its counts before any data moves, in one exchange with every peer (which also has
 * each rank hear from every other): a disagreement is a mismatch every rank is told of, not a message of
 * the wrong length. */
static int v_agree(const tally__ctx *x, const size_t *sendcounts, const size_t *recvcounts) {
    int n = x->size, me = x->rank, rc = 0;
    if (sendcounts[me] != recvcounts[me]) return v_mismatch(x, me, me, sendcounts[me], recvcounts[me]);
    if (n == 1) return 0;
    uint64_t *mine = malloc(4 * (size_t)n * sizeof *mine), *theirs = mine ? mine + 2 * n : NULL;
    tally__send *s = malloc((size_t)n * sizeof *s);
    tally__recv *r = malloc((size_t)n * sizeof *r);
    if (!mine || !s || !r)
        rc = tally__seterr(TALLY_E_NOMEM, "rank %d: alltoallv: no memory for %d ranks' counts", me, n);
    for (int j = 0, k = 0; !rc && j < n; j++) {
        if (j == me) continue;
        mine[2 * j] = sendcounts[j];
        mine[2 * j + 1] = recvcounts[j];
        s[k] = (tally__send){.peer = j, .buf = &mine[2 * j], .len = 2 * sizeof *mine};
        r[k++] = (tally__recv){.peer = j, .dst = &theirs[2 * j], .len = 2 * sizeof *mine, .dtype = TALLY_U8};
    }
    if (!rc) rc = tally__xchg(x, s, n - 1, r, n - 1);
    for (int j = 0; !rc && j < n; j++) {
        if (j == me) continue;
        if (theirs[2 * j] != recvcounts[j]) rc = v_mismatch(x, j, me, (size_t)theirs[2 * j], recvcounts[j]);
        if (!rc && theirs[2 * j + 1] != sendcounts[j])
            rc = v_mismatch(x, me, j, sendcounts[j], (size_t)theirs[2 * j + 1]);
    }
    free(mine);
    free(s);
    free(r);
    return rc;
}

static int alltoallv_body(tally_comm *c, const tally__call *a) {
    int rc = v_check(c, a);
    if (rc) return rc;
    const tally__ctx *x = tally__comm_ctx(c);
    int algo = tally__comm_begin(c, TALLY__ALLTOALLV, 0, a->t, TALLY_SUM, -1, 0);
    if ((rc = v_agree(x, a->sendcounts, a->recvcounts))) return rc;
    size_t es = tally_dtype_size(a->t), me = (size_t)x->rank;
    if (x->size == 1) {
        if (a->sendcounts[me]) /* else the buffers may be NULL */
            memcpy(tally__at(a->recv, a->rdispls[me], es), tally__at(a->send, a->sdispls[me], es),
                   a->sendcounts[me] * es);
        return 0;
    }
    const tally__algo_desc *d = algo_for(c, algo, TALLY__ALLTOALLV);
    return d ? d->alltoallv(x, a->send, a->sendcounts, a->sdispls, a->recv, a->recvcounts, a->rdispls, a->t)
             : TALLY_E_INVALID;
}

/* Every call here is validated, fingerprinted, its algorithm chosen and run as comm.c's own are. */
static int rooted_body(tally_comm *c, const tally__call *a) {
    switch (a->coll) {
    case TALLY__REDUCE: return reduce_body(c, a);
    case TALLY__GATHER: return rooted_move_body(c, a, 1);
    case TALLY__SCATTER: return rooted_move_body(c, a, 0);
    case TALLY__ALLTOALL: return alltoall_body(c, a);
    default: return alltoallv_body(c, a);
    }
}

/* ---- the public calls ---- */

static tally__call call_of(int coll, const void *send, void *recv, size_t count, tally_dtype t, tally_op op, int root) {
    return (tally__call){
        .coll = coll, .send = send, .recv = recv, .count = count, .t = t, .op = op, .root = root, .body = rooted_body};
}

static tally__call v_call_of(const void *send, const size_t *sendcounts, const size_t *sdispls, void *recv,
                             const size_t *recvcounts, const size_t *rdispls, tally_dtype t) {
    tally__call a = call_of(TALLY__ALLTOALLV, send, recv, 0, t, TALLY_SUM, -1);
    a.sendcounts = sendcounts;
    a.sdispls = sdispls;
    a.recvcounts = recvcounts;
    a.rdispls = rdispls;
    return a;
}

/* A non-blocking call posted on the communicator's queue (async.c), its own name in the errors of the post. */
static int post(tally_comm *c, const tally__call *a, tally_request **req, const char *fn) {
    tally__clearerr();
    if (!req) return tally__seterr(TALLY_E_INVALID, "%s: req is NULL", fn);
    *req = NULL;
    if (!c) return tally__seterr(TALLY_E_INVALID, "%s: communicator is NULL", fn);
    return tally__async_post_call(c, a, req);
}

TALLY_API int tally_reduce(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op,
                           int root) {
    tally__call a = call_of(TALLY__REDUCE, send, recv, count, t, op, root);
    return tally__comm_call(c, &a);
}

TALLY_API int tally_gather(tally_comm *c, const void *send, void *recv, size_t sendcount, tally_dtype t, int root) {
    tally__call a = call_of(TALLY__GATHER, send, recv, sendcount, t, TALLY_SUM, root);
    return tally__comm_call(c, &a);
}

TALLY_API int tally_scatter(tally_comm *c, const void *send, void *recv, size_t recvcount, tally_dtype t, int root) {
    tally__call a = call_of(TALLY__SCATTER, send, recv, recvcount, t, TALLY_SUM, root);
    return tally__comm_call(c, &a);
}

TALLY_API int tally_alltoall(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t) {
    tally__call a = call_of(TALLY__ALLTOALL, send, recv, count, t, TALLY_SUM, -1);
    return tally__comm_call(c, &a);
}

TALLY_API int tally_alltoallv(tally_comm *c, const void *send, const size_t *sendcounts, const size_t *sdispls,
                              void *recv, const size_t *recvcounts, const size_t *rdispls, tally_dtype t) {
    tally__call a = v_call_of(send, sendcounts, sdispls, recv, recvcounts, rdispls, t);
    return tally__comm_call(c, &a);
}

TALLY_API int tally_ireduce(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op,
                            int root, tally_request **req) {
    tally__call a = call_of(TALLY__REDUCE, send, recv, count, t, op, root);
    return post(c, &a, req, "tally_ireduce");
}

TALLY_API int tally_igather(tally_comm *c, const void *send, void *recv, size_t sendcount, tally_dtype t, int root,
                            tally_request **req) {
    tally__call a = call_of(TALLY__GATHER, send, recv, sendcount, t, TALLY_SUM, root);
    return post(c, &a, req, "tally_igather");
}

TALLY_API int tally_iscatter(tally_comm *c, const void *send, void *recv, size_t recvcount, tally_dtype t, int root,
                             tally_request **req) {
    tally__call a = call_of(TALLY__SCATTER, send, recv, recvcount, t, TALLY_SUM, root);
    return post(c, &a, req, "tally_iscatter");
}

TALLY_API int tally_ialltoall(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t,
                              tally_request **req) {
    tally__call a = call_of(TALLY__ALLTOALL, send, recv, count, t, TALLY_SUM, -1);
    return post(c, &a, req, "tally_ialltoall");
}

/* The request copies the four arrays (async.c): the caller may change them once this returns. */
TALLY_API int tally_ialltoallv(tally_comm *c, const void *send, const size_t *sendcounts, const size_t *sdispls,
                               void *recv, const size_t *recvcounts, const size_t *rdispls, tally_dtype t,
                               tally_request **req) {
    tally__call a = v_call_of(send, sendcounts, sdispls, recv, recvcounts, rdispls, t);
    return post(c, &a, req, "tally_ialltoallv");
}
