/* algo.h - what a flat algorithm is to the rest of the library: a descriptor (its name, the collectives it
 * runs, its cost under the model) that its own file defines and algos.c's table lists, in id order. */
#ifndef TALLY_COLL_ALGO_H
#define TALLY_COLL_ALGO_H

#include <math.h>

#include "blocks.h"
#include "coll.h"

/* The contract of every collective function below is the public call's, except: op is never AVG unless
 * the descriptor's takes_avg names that collective (the entry point reduces AVG as SUM and divides after;
 * ring's allreduce takes AVG and divides each block between its two phases, where it is in cache),
 * arguments are valid, size >= 2, count >= 1. In place when send == recv (for allgather: send == recv +
 * rank*count*esize; for reduce_scatter: recv == send + rank*count*esize). Results are identical on every
 * rank, and every rank returns only after hearing, directly or through others, from every other rank. */
typedef int (*tally__algo_reduce_fn)(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t,
                                     tally_op op);
typedef int (*tally__algo_gather_fn)(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t);
typedef int (*tally__algo_bcast_fn)(const tally__ctx *c, void *buf, size_t count, tally_dtype t, int root);
typedef int (*tally__algo_barrier_fn)(const tally__ctx *c);
/* Rooted: reduce's result, gather's blocks and scatter's source are root's only (recv, recv and send are
 * not read elsewhere: they may be NULL there). In place on root when send == recv (reduce). The same
 * promise holds: every rank hears from every other, though the data flows one way. */
typedef int (*tally__algo_root_reduce_fn)(const tally__ctx *c, const void *send, void *recv, size_t count,
                                          tally_dtype t, tally_op op, int root);
typedef int (*tally__algo_rooted_fn)(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t,
                                     int root);
/* alltoall: blocks of count elements, in place when send == recv. alltoallv: the entry point has checked
 * that every pair agrees on its counts (rooted.c), which also had every rank hear from every other; send
 * and recv do not overlap. */
typedef int (*tally__algo_alltoallv_fn)(const tally__ctx *c, const void *send, const size_t *sendcounts,
                                        const size_t *sdispls, void *recv, const size_t *recvcounts,
                                        const size_t *rdispls, tally_dtype t);

/* What the cost functions share, computed once from the measured model (tally__cost): n ranks, S bytes
 * (tally__algo_cost's convention), p the power of two rhd runs on, and whether rhd folds extra ranks in
 * (one more exchange of the vector each way). */
typedef struct tally__algo_shape {
    double n, S, a, b, g;
    double bs;     /* beta of rhd and the tree: the link shared by `share` ranks of a host */
    double lg;     /* ceil(log2 n): rounds of binomial and dissemination patterns */
    double depth;  /* floor(log2 n): height of the binary tree */
    double p, lp;  /* largest power of two <= n, and log2 p */
    double fold;   /* 1 when n is not a power of two */
    double m;      /* pipeline segments */
    double pull;   /* receivers that copy a root's blocks of S/n bytes at once (>= 1) */
    double cpus;   /* the CPUs a crowded host's ranks share (0: not crowded) */
    double copies; /* copies of each byte moved: 1 where the receiver reads blocks of S/n in place, else 2 */
} tally__algo_shape;

static inline tally__algo_shape tally__algo_shape_of(const tally__cost *c, int n, size_t bytes) {
    int p = tally__pow2_floor(n);
    tally__algo_shape s = {.n = n,
                           .S = (double)bytes,
                           .a = c->alpha,
                           .b = c->beta,
                           .g = c->gamma,
                           .bs = c->beta * (c->share > 1 ? c->share : 1),
                           .lg = tally__log2_ceil(n),
                           .p = p,
                           .fold = p != n};
    s.lp = tally__log2_ceil(p);
    s.depth = s.lp; /* a heap of n nodes is floor(log2 n) levels deep */
    s.m = bytes ? ceil(s.S / (double)TALLY__SEG_BYTES) : 1;
    int in_place = c->pull >= 1 && bytes / (size_t)n >= c->pull_min;
    s.pull = in_place && c->pull > 1 ? c->pull : 1;
    s.cpus = c->cpus;
    s.copies = in_place ? 1 : 2;
    return s;
}

/* t, or the time `moved` bytes in all take where a crowded host's CPUs copy every one of them (each
 * copied `copies` times, a copy of a byte costing b), if that is longer. */
static inline double tally__algo_crowded(const tally__algo_shape *x, double t, double moved) {
    double cpu = x->cpus > 0 ? moved * x->copies * x->b / x->cpus : 0;
    return cpu > t ? cpu : t;
}

typedef struct tally__algo_desc {
    const char *name; /* what TALLY_ALGO, --algo, the flight records and the messages call it */
    /* The collectives; NULL where the algorithm has none: the cost model passes it over, and TALLY_ALGO
     * naming it leaves that collective to the model, as TALLY_ALGO=hier does broadcast. */
    tally__algo_reduce_fn allreduce, reduce_scatter;
    tally__algo_gather_fn allgather;
    tally__algo_bcast_fn broadcast;
    tally__algo_barrier_fn barrier; /* never NULL: a call with nothing to move still meets through it */
    tally__algo_root_reduce_fn reduce;
    tally__algo_rooted_fn gather, scatter;
    tally__algo_gather_fn alltoall;
    tally__algo_alltoallv_fn alltoallv;
    unsigned takes_avg; /* 1u << coll: that collective is given AVG and divides itself */
    /* Predicted seconds of collective coll (one it has; tally__coll_kind) on x's ranks and bytes; the
     * allreduce's stands for the set-up traffic too. S is the whole vector for allreduce, broadcast and
     * reduce; a block times the ranks for reduce-scatter, all-gather, gather, scatter and all-to-all (a
     * rank's whole send buffer); 0 for alltoallv (its counts differ by rank; the choice must not). */
    double (*cost)(const tally__algo_shape *x, int coll);
    /* Bytes the busiest rank sends in an allreduce of S bytes on n >= 2 ranks, as the code sends them
     * (what tally_comm_bytes_sent counts; the planner's figure); NULL: not known. */
    double (*sent)(int n, double S);
} tally__algo_desc;

/* The table (algos.c): tally__algos[id - 1] for ids 1..tally__algo_count(), then NULL. */
extern const tally__algo_desc *const tally__algos[];
/* Algorithm `algo`'s descriptor; NULL for auto, hier and ids past the table. */
const tally__algo_desc *tally__algo_get(int algo);
/* Whether d runs collective coll (TALLY__SETUP counts as allreduce, whose cost it borrows). */
int tally__algo_has(const tally__algo_desc *d, int coll);

#endif
