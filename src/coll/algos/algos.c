/* algos.c - the table of flat algorithms, whose order gives their ids, and what is read from it: names
 * both ways, lists of names for messages and usage lines, which collectives a descriptor has. */
#include <stdio.h>
#include <strings.h>

#include "../algo.h"

/* One line per algorithm, defined as tally__<name>_algo in <name>.c; its id is its line, from 1. Append:
 * ring 1, tree 2, rhd 3 and direct 4 keep the ids coll.h names them by. */
#define TALLY__ALGO_TABLE(X)                                                                                           \
    X(ring)                                                                                                            \
    X(tree)                                                                                                            \
    X(rhd)                                                                                                             \
    X(direct)                                                                                                          \
    X(pairwise)                                                                                                        \
    X(bruck)

#define TALLY__ALGO_EXTERN(name) extern const tally__algo_desc tally__##name##_algo;
TALLY__ALGO_TABLE(TALLY__ALGO_EXTERN)
#define TALLY__ALGO_ENTRY(name) &tally__##name##_algo,
const tally__algo_desc *const tally__algos[] = {TALLY__ALGO_TABLE(TALLY__ALGO_ENTRY) NULL};

int tally__algo_count(void) { return (int)(sizeof tally__algos / sizeof *tally__algos) - 1; }

const tally__algo_desc *tally__algo_get(int algo) {
    return algo >= 1 && algo <= tally__algo_count() ? tally__algos[algo - 1] : NULL;
}

const char *tally__algo_name(int algo) {
    const tally__algo_desc *d = tally__algo_get(algo);
    if (d) return d->name;
    return algo == TALLY__ALGO_AUTO ? "auto" : algo == TALLY__ALGO_HIER ? "hier" : "unknown";
}

int tally__algo_parse(const char *name) {
    if (!name) return -1;
    if (!strcasecmp(name, "auto")) return TALLY__ALGO_AUTO;
    if (!strcasecmp(name, "hier")) return TALLY__ALGO_HIER;
    for (int a = 1; a <= tally__algo_count(); a++)
        if (!strcasecmp(name, tally__algos[a - 1]->name)) return a;
    return -1;
}

int tally__algo_next(int algo) {
    if (algo == TALLY__ALGO_HIER) return -1;
    return algo >= TALLY__ALGO_AUTO && algo < tally__algo_count() ? algo + 1 : TALLY__ALGO_HIER;
}

const char *tally__algo_names(char *buf, size_t cap, int with, const char *sep, const char *last) {
    int ids[TALLY__ALGO_HIER + 1], k = 0;
    for (int a = TALLY__ALGO_AUTO; a >= 0; a = tally__algo_next(a)) {
        const tally__algo_desc *d = tally__algo_get(a);
        if (a == TALLY__ALGO_AUTO   ? !(with & TALLY__ALGO_WITH_AUTO)
            : a == TALLY__ALGO_HIER ? !(with & TALLY__ALGO_WITH_HIER)
                                    : (with & TALLY__ALGO_ALLREDUCE_ONLY) && !d->allreduce)
            continue;
        ids[k++] = a;
    }
    size_t used = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < k && used < cap; i++) {
        const char *join = i == 0 ? "" : i == k - 1 ? last : sep;
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", join, tally__algo_name(ids[i]));
    }
    return buf;
}

int tally__algo_has(const tally__algo_desc *d, int coll) {
    switch (coll) {
    case TALLY__REDUCE_SCATTER: return d->reduce_scatter != NULL;
    case TALLY__ALLGATHER: return d->allgather != NULL;
    case TALLY__BROADCAST: return d->broadcast != NULL;
    case TALLY__BARRIER: return d->barrier != NULL;
    case TALLY__REDUCE: return d->reduce != NULL;
    case TALLY__GATHER: return d->gather != NULL;
    case TALLY__SCATTER: return d->scatter != NULL;
    case TALLY__ALLTOALL: return d->alltoall != NULL;
    case TALLY__ALLTOALLV: return d->alltoallv != NULL;
    default: return d->allreduce != NULL; /* allreduce, and the set-up traffic its cost stands for */
    }
}
