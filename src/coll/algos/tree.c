/* tree.c - the pipelined binary tree: allreduce as a reduction up the tree and a broadcast down it, in
 * segments so every level works at once; reduce-scatter, all-gather, broadcast and barrier built on it;
 * and the binomial tree of the rooted collectives (reduce, gather, scatter). */
#include <stdlib.h>
#include <string.h>

#include "../../core/numeric/copy.h"
#include "../blocks.h"
#include "../algo.h"

/* The tree is a heap over virtual ranks v = rank - root (mod n): v's children are 2v+1 and 2v+2.
 *
 * Schedule (one exchange per step; every rank derives every peer's timing from n alone, so the steps
 * of a send and of its receive always agree):
 *   up:   v sends segment j to its parent at step j + E(v). Its first child sends one step before
 *         that, its second child two steps before, so a rank never reduces two messages into the same
 *         segment in one exchange (transport.h forbids it) and needs no scratch buffer.
 *         E(v) = M - off(v), off(root) = 0, off(child) = off(parent) + 1 (first) or + 2 (second).
 *   down: the root has segment j final after step j + M - 1 and sends it at step j + M; a rank at
 *         depth d receives it at step j + M + d - 1 and forwards it at step j + M + d.
 * Within one exchange a rank touches segments that are pairwise distinct (it reduces j+1 or j+2 while
 * it sends j up, and receives from its parent a segment it sent up earlier), so sends never read bytes
 * a receive of the same exchange writes. Every segment is reduced to its final value once, at the
 * root, and copied down: all ranks end bit-identical. */
typedef struct tree_plan {
    int n, v, root;
    int parent, kid[2], nkids; /* virtual ranks; kid[0] is 2v+1 */
    long e_up;                 /* E(v) */
    long e_kid[2];             /* E of each child */
    long top;                  /* M: the root's segment j is final after step j + M - 1 */
    int depth;
} tree_plan;

static int tree_depth(int v) {
    int d = 0;
    for (v = v + 1; v > 1; v >>= 1) d++;
    return d;
}

/* off(v): steps between v's upward send of a segment and the root's last receive of it. */
static long tree_off(int v) {
    long off = 0;
    for (; v > 0; v = (v - 1) / 2) off += (v % 2 == 1) ? 1 : 2;
    return off;
}

static void tree_plan_init(tree_plan *p, int n, int rank, int root) {
    p->n = n;
    p->root = root;
    p->v = (rank - root + n) % n;
    p->parent = p->v > 0 ? (p->v - 1) / 2 : -1;
    p->nkids = 0;
    for (int k = 0; k < 2; k++)
        if (2 * p->v + 1 + k < n) p->kid[p->nkids++] = 2 * p->v + 1 + k;
    p->top = 0;
    for (int u = 0; u < n; u++)
        if (tree_off(u) > p->top) p->top = tree_off(u);
    p->e_up = p->top - tree_off(p->v);
    for (int k = 0; k < p->nkids; k++) p->e_kid[k] = p->top - tree_off(p->kid[k]);
    p->depth = tree_depth(p->v);
}

static int tree_real(const tree_plan *p, int v) { return (v + p->root) % p->n; }

/* A segment of the vector: element offset and length. */
typedef struct seg {
    size_t off, len;
} seg;

static int seg_of(long j, long m, size_t count, size_t per, seg *s) {
    if (j < 0 || j >= m) return 0;
    s->off = (size_t)j * per;
    s->len = count - s->off < per ? count - s->off : per;
    return 1;
}

/* One pipelined pass. up: reduce `send` into `buf` towards the root (buf holds partial sums at inner
 * ranks and the result at the root); down: broadcast the root's buf to every buf. */
typedef struct tree_pass {
    const void *send;
    void *buf;
    size_t count, es;
    tally_dtype t;
    tally_op op;
    int up, down;
} tree_pass;

/* The up-phase part of step `step`: receive from children, send to the parent. */
static void tree_step_up(const tree_plan *p, const tree_pass *x, long step, long m, size_t per, tally__send *s, int *ns,
                         tally__recv *r, int *nr) {
    seg g;
    for (int k = 0; k < p->nkids; k++) {
        if (!seg_of(step - p->e_kid[k], m, x->count, per, &g)) continue;
        /* The second child's message arrives first, so it is the one that reads our own contribution. */
        int first = (k == p->nkids - 1);
        r[(*nr)++] = (tally__recv){.peer = tree_real(p, p->kid[k]),
                                   .dst = tally__at(x->buf, g.off, x->es),
                                   .src = tally__at(first ? x->send : x->buf, g.off, x->es),
                                   .len = g.len * x->es,
                                   .dtype = x->t,
                                   .op = x->op};
    }
    if (p->parent >= 0 && seg_of(step - p->e_up, m, x->count, per, &g)) {
        const void *from = p->nkids ? x->buf : x->send; /* a leaf sends its own data */
        s[(*ns)++] =
            (tally__send){.peer = tree_real(p, p->parent), .buf = tally__at(from, g.off, x->es), .len = g.len * x->es};
    }
}

/* The down-phase part of step `step`: receive from the parent, forward to the children. */
static void tree_step_down(const tree_plan *p, const tree_pass *x, long step, long m, size_t per, long top,
                           tally__send *s, int *ns, tally__recv *r, int *nr) {
    seg g;
    if (p->parent >= 0 && seg_of(step - top - p->depth + 1, m, x->count, per, &g))
        r[(*nr)++] = (tally__recv){.peer = tree_real(p, p->parent),
                                   .dst = tally__at(x->buf, g.off, x->es),
                                   .len = g.len * x->es,
                                   .dtype = x->t};
    if (seg_of(step - top - p->depth, m, x->count, per, &g))
        for (int k = 0; k < p->nkids; k++)
            s[(*ns)++] = (tally__send){
                .peer = tree_real(p, p->kid[k]), .buf = tally__at(x->buf, g.off, x->es), .len = g.len * x->es};
}

static int tree_run(const tally__ctx *c, int root, const tree_pass *x) {
    tree_plan p;
    tree_plan_init(&p, c->size, c->rank, root);
    size_t per = tally__seg_elems(x->es);
    long m = (long)tally__seg_count(x->count, x->es);
    long top = x->up ? p.top : 0; /* a broadcast starts at once */
    long last = m + top + 2 * (long)tree_depth(c->size - 1) + 1;
    for (long step = 0; step <= last; step++) {
        tally__send s[3];
        tally__recv r[3];
        int ns = 0, nr = 0;
        if (x->up) tree_step_up(&p, x, step, m, per, s, &ns, r, &nr);
        if (x->down) tree_step_down(&p, x, step, m, per, top, s, &ns, r, &nr);
        if (ns + nr == 0) continue;
        int rc = tally__xchg(c, s, ns, r, nr);
        if (rc) return rc;
    }
    return 0;
}

static int tree_allreduce(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op) {
    tree_pass x = {
        .send = send, .buf = recv, .count = count, .es = tally_dtype_size(t), .t = t, .op = op, .up = 1, .down = 1};
    return tree_run(c, 0, &x);
}

/* The pipelined broadcast down the tree from root: data only, for callers that already heard from every rank. */
static int tree_bcast_data(const tally__ctx *c, void *buf, size_t count, tally_dtype t, int root) {
    tree_pass x = {.send = buf, .buf = buf, .count = count, .es = tally_dtype_size(t), .t = t, .down = 1};
    return tree_run(c, root, &x);
}

/* Data flows down only, telling a rank nothing of the ranks beside or below it: the fingerprint rounds of
 * tally__agree come first, so a rank that called something else fails the call on every rank. */
static int tree_broadcast(const tally__ctx *c, void *buf, size_t count, tally_dtype t, int root) {
    int rc = tally__agree(c, NULL, 0, t, root);
    return rc ? rc : tree_bcast_data(c, buf, count, t, root);
}

/* Reduce-scatter: the whole vector is reduced up the tree to rank 0 (inner ranks accumulate in a
 * scratch vector), then rank 0 hands every rank its block in one exchange. Chosen over "broadcast
 * everything, keep your block" because it moves each block down once instead of the whole vector. */
static int tree_reduce_scatter(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t,
                               tally_op op) {
    int n = c->size, r = c->rank, rc;
    size_t es = tally_dtype_size(t), bytes = count * es, total = (size_t)n * count;
    int inner = 2 * r + 1 < n; /* rank 0 is the root: virtual ranks are real ranks */
    char *work = inner ? tally__scratch_take(c->scratch, total * es) : NULL;
    if (inner && !work)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: tree reduce_scatter: no memory for %zu bytes", r, total * es);
    tree_pass x = {.send = send, .buf = work, .count = total, .es = es, .t = t, .op = op, .up = 1};
    rc = tree_run(c, 0, &x);
    if (!rc && r == 0) {
        tally__send *s = malloc((size_t)(n - 1) * sizeof *s);
        if (!s) rc = tally__seterr(TALLY_E_NOMEM, "rank 0: tree reduce_scatter: no memory");
        for (int k = 1; s && k < n; k++)
            s[k - 1] = (tally__send){.peer = k, .buf = work + (size_t)k * bytes, .len = bytes};
        if (!rc) rc = tally__xchg(c, s, n - 1, NULL, 0);
        if (!rc) memcpy(recv, work, bytes);
        free(s);
    } else if (!rc) {
        tally__recv rv = {.peer = 0, .dst = recv, .len = bytes, .dtype = t};
        rc = tally__xchg(c, NULL, 0, &rv, 1);
    }
    tally__scratch_give(c->scratch, work);
    return rc;
}

/* All-gather: every rank sends its block to rank 0 in one exchange, then rank 0 broadcasts the whole
 * vector down the pipelined tree (rank 0 heard from everyone first: no fingerprint rounds needed). */
static int tree_allgather(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t) {
    int rc = tally__gather_to_root(c, send, recv, count * tally_dtype_size(t));
    if (rc) return rc;
    return tree_bcast_data(c, recv, (size_t)c->size * count, t, 0);
}

/* Empty messages up the tree (a rank reports once its children have), then down (the release). */
static int tree_barrier(const tally__ctx *c) {
    static const char none;
    char sink[3];
    tree_plan p;
    tree_plan_init(&p, c->size, c->rank, 0);
    tally__send s[2];
    tally__recv r[2];
    int rc;
    for (int k = 0; k < p.nkids; k++) r[k] = (tally__recv){.peer = p.kid[k], .dst = &sink[k], .dtype = TALLY_U8};
    if (p.nkids && (rc = tally__xchg(c, NULL, 0, r, p.nkids))) return rc;
    if (p.parent >= 0) {
        tally__send up = {.peer = p.parent, .buf = &none};
        tally__recv down = {.peer = p.parent, .dst = &sink[2], .dtype = TALLY_U8};
        if ((rc = tally__xchg(c, &up, 1, &down, 1))) return rc;
    }
    for (int k = 0; k < p.nkids; k++) s[k] = (tally__send){.peer = p.kid[k], .buf = &none};
    return p.nkids ? tally__xchg(c, s, p.nkids, NULL, 0) : 0;
}

/* ---- rooted: the binomial tree ----
 * Virtual rank v = rank - root (mod n). v's parent is v minus its lowest set bit; its children are v + m
 * for the powers of two m below that bit (below n for the root) with v + m < n, and its subtree is the
 * virtual ranks [v, v + sub(v)): contiguous, so a gather's or scatter's blocks travel as one message.
 * The data flows one way: the fingerprint rounds of tally__agree come first, as for the broadcast, so no
 * rank returns before hearing from all, and a rank that called something else (another root) sends
 * before it waits, so the disagreement is seen rather than two roots waiting on each other. */
static int bin_low(int v, int n) { return v ? v & -v : tally__pow2_floor(n) * 2; }
static int bin_sub(int v, int n) { return bin_low(v, n) < n - v ? bin_low(v, n) : n - v; }
static int bin_real(int v, int root, int n) { return (v + root) % n; }
static int bin_parent(int v, int root, int n) { return bin_real(v - bin_low(v, n), root, n); }

/* v's children's real ranks in kids, m = 1, 2, 4 ... in turn; returns how many. */
static int bin_kids(int v, int root, int n, int *kids) {
    int k = 0;
    for (int m = 1; m < bin_low(v, n) && v + m < n; m *= 2) kids[k++] = bin_real(v + m, root, n);
    return k;
}

/* Binomial reduce: each child's partial (one exchange each: they reduce into the same bytes) in the
 * order m = 1, 2, 4 ..., then the result to the parent. A leaf sends its own data; an inner rank
 * accumulates in scratch, the root in recv. */
static int tree_reduce(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op,
                       int root) {
    int n = c->size, v = (c->rank - root + n) % n, kids[32], nk = bin_kids(v, root, n, kids);
    size_t bytes = count * tally_dtype_size(t);
    int rc = tally__agree(c, NULL, 0, t, root), inner = v && nk;
    void *acc = inner ? tally__scratch_take(c->scratch, bytes) : recv;
    if (inner && !acc)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: tree reduce: no memory for %zu bytes", c->rank, bytes);
    const void *cur = send;
    for (int k = 0; !rc && k < nk; k++) {
        rc = tally__recv_one(c, kids[k], acc, cur, bytes, t, op);
        cur = acc;
    }
    if (!rc && v) rc = tally__send_one(c, bin_parent(v, root, n), cur, bytes);
    if (inner) tally__scratch_give(c->scratch, acc);
    return rc;
}

/* Binomial gather: the children's subtrees' blocks in one exchange (disjoint plain receives), then this
 * subtree's to the parent. Blocks go in virtual order: the root takes them in scratch and puts them in
 * rank order unless it is rank 0; a leaf sends its own block. */
static int tree_gather(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, int root) {
    int n = c->size, v = (c->rank - root + n) % n, sub = bin_sub(v, n), kids[32];
    int nk = bin_kids(v, root, n, kids), rc = tally__agree(c, NULL, 0, t, root);
    size_t es = tally_dtype_size(t), bytes = count * es;
    char *buf = v == 0 && root == 0 ? recv : sub > 1 ? tally__scratch_take(c->scratch, (size_t)sub * bytes) : NULL;
    if (sub > 1 && !buf)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: tree gather: no memory for %d blocks", c->rank, sub);
    if (v == 0 && root == 0)
        tally__copy_out(buf, send, bytes); /* the root's own block, in the output: not read again here */
    else if (buf)
        memmove(buf, send, bytes);
    tally__recv r[32];
    for (int k = 0, m = 1; k < nk; k++, m *= 2)
        r[k] = (tally__recv){
            .peer = kids[k], .dst = buf + (size_t)m * bytes, .len = (size_t)bin_sub(v + m, n) * bytes, .dtype = t};
    if (!rc && nk) rc = tally__xchg(c, NULL, 0, r, nk);
    if (!rc && v) rc = tally__send_one(c, bin_parent(v, root, n), buf ? buf : send, (size_t)sub * bytes);
    if (!rc && v == 0 && buf != recv) { /* virtual block k is rank (k + root) % n's */
        tally__copy_out(tally__at(recv, (size_t)root * count, es), buf, (size_t)(n - root) * bytes);
        tally__copy_out(recv, buf + (size_t)(n - root) * bytes, (size_t)root * bytes);
    }
    if (buf != recv) tally__scratch_give(c->scratch, buf);
    return rc;
}

/* Binomial scatter, in the fingerprint rounds themselves (tally__agree_ride): each rank takes its
 * subtree's blocks from its parent in the round of its lowest bit and hands each child its subtree's in
 * the later, shorter rounds. buf holds the blocks of virtual ranks [v, v + sub(v)): the root lays them out
 * in virtual order unless it is rank 0; a leaf receives straight into recv. lg rounds in all, where the
 * rounds and then the tree took twice as many. */
typedef struct {
    char *buf;
    size_t bytes;
    int v, n;
} scatter_ride;

static void scatter_step(void *arg, int m, int give, int take, tally__send *s, tally__recv *r) {
    const scatter_ride *x = arg;
    if (give) {
        s->buf = x->buf + (size_t)m * x->bytes;
        s->len = (size_t)bin_sub(x->v + m, x->n) * x->bytes;
    }
    if (take) {
        r->dst = x->buf;
        r->len = (size_t)bin_sub(x->v, x->n) * x->bytes;
    }
}

static int tree_scatter(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t, int root) {
    int n = c->size, v = (c->rank - root + n) % n, sub = bin_sub(v, n);
    size_t es = tally_dtype_size(t), bytes = count * es;
    char *buf = v == 0 && root == 0 ? (char *)send
                : sub > 1           ? tally__scratch_take(c->scratch, (size_t)sub * bytes)
                                    : recv;
    if (sub > 1 && !buf)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: tree scatter: no memory for %d blocks", c->rank, sub);
    if (v == 0 && root != 0) {
        memcpy(buf, tally__at(send, (size_t)root * count, es), (size_t)(n - root) * bytes);
        memcpy(buf + (size_t)(n - root) * bytes, send, (size_t)root * bytes);
    }
    scatter_ride x = {buf, bytes, v, n};
    int rc = tally__agree_ride(c, scatter_step, &x, t, root);
    if (!rc && buf != recv) tally__copy_out(recv, buf, bytes); /* this rank's block, into its output */
    if (buf != recv && buf != send) tally__scratch_give(c->scratch, buf);
    return rc;
}

/* The model: the tree's depth plus m-1 segment steps each way, each rank's bytes to two children on a
 * link its host's ranks may share (bs); reduce-scatter and all-gather add rank 0's scatter or gather,
 * the broadcast the lg fingerprint rounds of tally__agree. */
static double tree_cost(const tally__algo_shape *x, int coll) {
    double n = x->n, S = x->S, f = (n - 1) / n;
    switch (coll) {
    case TALLY__REDUCE_SCATTER: {
        double scatter = (n - 1) * x->a + S * f * x->b; /* rank 0 hands out the blocks */
        return (x->depth + x->m - 1) * x->a + S * (x->bs + x->g) + scatter;
    }
    case TALLY__ALLGATHER: {
        double gather = (n - 1) * x->a + S * f * x->b; /* everyone to rank 0 */
        return gather + (x->depth + x->m - 1) * x->a + S * x->bs;
    }
    case TALLY__BROADCAST: {
        double s = S / x->m, agree = x->lg * x->a;
        return agree + (x->depth + x->m - 1) * (x->a + 2 * s * x->b);
    }
    case TALLY__BARRIER: return 2 * x->depth * x->a;
    /* Binomial, after the lg fingerprint rounds: lg rounds of the vector, each rank reducing what its
     * children send; or lg rounds in which the root's link carries every block. */
    case TALLY__REDUCE: return x->lg * x->a + x->lg * (x->a + S * (x->bs + x->g));
    case TALLY__GATHER: return 2 * x->lg * x->a + S * f * x->bs;
    /* The blocks ride the fingerprint rounds; each round moves half the vector, so S lg/2 bytes in all. */
    case TALLY__SCATTER: return tally__algo_crowded(x, x->lg * x->a + S * f * x->bs, S * x->lg / 2);
    default: return (2 * x->depth + x->m - 1) * x->a + 2 * S * x->bs + S * x->g;
    }
}

/* Ranks a tree rank sends the whole vector to: its parent (up) and its children (down). */
static int tree_fanout(int v, int n) { return (v > 0) + (2 * v + 1 < n) + (2 * v + 2 < n); }

/* The busiest rank: up to its parent and down to two children. */
static double tree_sent(int n, double S) {
    int most = tree_fanout(0, n);
    if (n > 1 && tree_fanout(1, n) > most) most = tree_fanout(1, n);
    return most * S;
}

const tally__algo_desc tally__tree_algo = {.name = "tree",
                                           .allreduce = tree_allreduce,
                                           .reduce_scatter = tree_reduce_scatter,
                                           .allgather = tree_allgather,
                                           .broadcast = tree_broadcast,
                                           .barrier = tree_barrier,
                                           .reduce = tree_reduce,
                                           .gather = tree_gather,
                                           .scatter = tree_scatter,
                                           .cost = tree_cost,
                                           .sent = tree_sent};
