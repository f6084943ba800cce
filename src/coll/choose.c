/* choose.c - the alpha-beta-gamma cost model of DESIGN.md asked of each algorithm's descriptor (its own
 * formula, in its file) and the choice of the cheapest, with or without the world's levels. */
#include <math.h>

#include "algo.h"

double tally__algo_cost(const tally__cost *m, int algo, int coll, int n, size_t bytes) {
    if (!m || n < 1) return HUGE_VAL;
    if (algo == TALLY__ALGO_AUTO) algo = tally__algo_choose(m, coll, n, bytes);
    const tally__algo_desc *d = tally__algo_get(algo);
    if (!d || !tally__algo_has(d, coll)) return HUGE_VAL;
    if (n == 1) return 0;
    tally__algo_shape x = tally__algo_shape_of(m, n, bytes);
    return d->cost(&x, coll == TALLY__SETUP ? TALLY__ALLREDUCE : coll); /* setup traffic costs as allreduce */
}

/* The first strictly cheapest in the table's order (ring, tree, rhd, direct, ...), so ties always fall
 * the same way. */
int tally__algo_choose(const tally__cost *m, int coll, int n, size_t bytes) {
    int best = 1;
    double best_cost = tally__algo_cost(m, best, coll, n, bytes);
    for (int a = 2; a <= tally__algo_count(); a++) {
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
