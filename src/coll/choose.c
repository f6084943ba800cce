/* choose.c - algorithm names and the alpha-beta-gamma cost model of DESIGN.md, per algorithm and
 * collective, as the code in ring.c, tree.c, rhd.c and direct.c actually moves data; picks the cheapest. */
#include <math.h>
#include <strings.h>

#include "blocks.h"
#include "coll.h"

static const char *const algo_names[TALLY__ALGO_HIER + 1] = {"auto", "ring", "tree", "rhd", "direct", "hier"};

const char *tally__algo_name(int algo) { return algo >= 0 && algo <= TALLY__ALGO_HIER ? algo_names[algo] : "unknown"; }

int tally__algo_parse(const char *name) {
    if (!name) return -1;
    for (int a = 0; a <= TALLY__ALGO_HIER; a++)
        if (!strcasecmp(name, algo_names[a])) return a;
    return -1;
}

/* What the formulas below share: n ranks, S bytes, p the power of two rhd runs on, and whether rhd
 * folds extra ranks in (one more exchange of the vector each way). */
typedef struct shape {
    double n, S, a, b, g;
    double bs;    /* beta of rhd and the tree: the link shared by `share` ranks of a host */
    double lg;    /* ceil(log2 n): rounds of binomial and dissemination patterns */
    double depth; /* floor(log2 n): height of the binary tree */
    double p, lp; /* largest power of two <= n, and log2 p */
    double fold;  /* 1 when n is not a power of two */
    double m;     /* pipeline segments */
} shape;

static shape shape_of(const tally__cost *c, int n, size_t bytes) {
    int p = tally__pow2_floor(n);
    shape s = {.n = n,
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
    return s;
}

/* Allreduce: DESIGN.md's table, plus rhd's small-vector variant (full-vector recursive doubling) and
 * its fold, and the tree's per-segment latency. */
static double cost_allreduce(const shape *x, int algo) {
    double n = x->n, S = x->S, f = (n - 1) / n, pf = (x->p - 1) / x->p;
    double fold = x->fold * (2 * x->a + 2 * S * x->bs + S * x->g);
    switch (algo) {
    case TALLY__ALGO_RING: return 2 * (n - 1) * x->a + 2 * S * f * x->b + S * f * x->g;
    case TALLY__ALGO_TREE: return (2 * x->depth + x->m - 1) * x->a + 2 * S * x->bs + S * x->g;
    case TALLY__ALGO_RHD:
        if (x->S <= (double)TALLY__RHD_SMALL_BYTES) return x->lp * (x->a + S * x->bs + S * x->g) + fold;
        return 2 * x->lp * x->a + 2 * S * pf * x->bs + S * pf * x->g + fold;
    case TALLY__ALGO_DIRECT: return 2 * (n - 1) * x->a + 2 * (n - 1) * S * x->b + (n - 1) * S * x->g;
    }
    return HUGE_VAL;
}

/* Reduce-scatter of S bytes in all (S/n per rank). */
static double cost_reduce_scatter(const shape *x, int algo) {
    double n = x->n, S = x->S, f = (n - 1) / n, pf = (x->p - 1) / x->p;
    double scatter = (n - 1) * x->a + S * f * x->b; /* rank 0 hands out the blocks */
    switch (algo) {
    case TALLY__ALGO_RING: return (n - 1) * x->a + S * f * (x->b + x->g);
    case TALLY__ALGO_TREE: return (x->depth + x->m - 1) * x->a + S * (x->bs + x->g) + scatter;
    case TALLY__ALGO_RHD:
        return x->lp * x->a + S * pf * (x->bs + x->g) + x->fold * (2 * x->a + S * (x->bs + x->g) + S / n * x->bs);
    case TALLY__ALGO_DIRECT: return (n - 1) * (x->a + S * (x->b + x->g)) + scatter;
    }
    return HUGE_VAL;
}

/* All-gather of S bytes in all. */
static double cost_allgather(const shape *x, int algo) {
    double n = x->n, S = x->S, f = (n - 1) / n, pf = (x->p - 1) / x->p;
    double gather = (n - 1) * x->a + S * f * x->b; /* everyone to rank 0 */
    switch (algo) {
    case TALLY__ALGO_RING: return (n - 1) * x->a + S * f * x->b;
    case TALLY__ALGO_TREE: return gather + (x->depth + x->m - 1) * x->a + S * x->bs;
    case TALLY__ALGO_RHD: return x->lp * x->a + S * pf * x->bs + x->fold * (2 * x->a + S / n * x->bs + S * x->bs);
    case TALLY__ALGO_DIRECT: return gather + (n - 1) * (x->a + S * x->b);
    }
    return HUGE_VAL;
}

/* Broadcast of S bytes: pipelined chain, pipelined tree (a rank feeds two children), binomial tree. The
 * chain, the tree and direct start with the lg rounds of fingerprints of tally__agree; the binomial
 * tree's data rides in those rounds. */
static double cost_broadcast(const shape *x, int algo) {
    double n = x->n, S = x->S, s = S / x->m, agree = x->lg * x->a;
    switch (algo) {
    case TALLY__ALGO_RING: return agree + (n + x->m - 2) * (x->a + s * x->b);
    case TALLY__ALGO_TREE: return agree + (x->depth + x->m - 1) * (x->a + 2 * s * x->b);
    case TALLY__ALGO_RHD: return x->lg * (x->a + S * x->b);
    case TALLY__ALGO_DIRECT: return agree + (n - 1) * (x->a + S * x->b);
    }
    return HUGE_VAL;
}

static double cost_barrier(const shape *x, int algo) {
    switch (algo) {
    case TALLY__ALGO_RING: return (x->n - 1) * x->a;
    case TALLY__ALGO_TREE: return 2 * x->depth * x->a;
    case TALLY__ALGO_RHD: return x->lg * x->a;
    case TALLY__ALGO_DIRECT: return 2 * (x->n - 1) * x->a;
    }
    return HUGE_VAL;
}

double tally__algo_cost(const tally__cost *m, int algo, int coll, int n, size_t bytes) {
    if (!m || n < 1) return HUGE_VAL;
    if (n == 1) return 0;
    if (algo == TALLY__ALGO_AUTO) algo = tally__algo_choose(m, coll, n, bytes);
    shape x = shape_of(m, n, bytes);
    switch (coll) {
    case TALLY__REDUCE_SCATTER: return cost_reduce_scatter(&x, algo);
    case TALLY__ALLGATHER: return cost_allgather(&x, algo);
    case TALLY__BROADCAST: return cost_broadcast(&x, algo);
    case TALLY__BARRIER: return cost_barrier(&x, algo);
    default: return cost_allreduce(&x, algo); /* allreduce, and setup traffic */
    }
}

/* The first strictly cheapest in enum order (ring, tree, rhd, direct), so ties always fall the same way. */
int tally__algo_choose(const tally__cost *m, int coll, int n, size_t bytes) {
    int best = TALLY__ALGO_RING;
    double best_cost = tally__algo_cost(m, best, coll, n, bytes);
    for (int a = TALLY__ALGO_RING + 1; a < TALLY__ALGO_COUNT; a++) {
        double c = tally__algo_cost(m, a, coll, n, bytes);
        if (c < best_cost) {
            best = a;
            best_cost = c;
        }
    }
    return best;
}

int tally__algo_choose_levels(const tally__cost *m, double by_level, int coll, int n, size_t bytes) {
    int a = tally__algo_choose(m, coll, n, bytes);
    return by_level < tally__algo_cost(m, a, coll, n, bytes) ? TALLY__ALGO_HIER : a;
}
