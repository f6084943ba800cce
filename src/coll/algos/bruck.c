/* bruck.c - all-to-all by Bruck's algorithm: ceil(log2 n) rounds, in the round of distance d each rank
 * sends rank + d, packed in one message, every block that still has to travel d further. Fewest messages:
 * best for small blocks, whose cost is the per-message latency. */
#include <stdlib.h>
#include <string.h>

#include "../algo.h"

/* Blocks by distance: after the rotation, block i of a rank is the one for rank + i. In the round of
 * distance d the blocks whose i has bit d set move d on (to rank + d, at the same index); after every
 * round block i has moved i, so at rank r it came from rank r - i, and the inverse rotation puts it in
 * place. The rounds reach ranks 1, 2, 4 ... away: each rank hears from every other, as in a dissemination
 * barrier. */
static int bruck_alltoall(const tally__ctx *c, const void *send, void *recv, size_t count, tally_dtype t) {
    int n = c->size, me = c->rank, rc = 0;
    size_t bytes = count * tally_dtype_size(t), half = (size_t)(n + 1) / 2 * bytes;
    char *work = tally__scratch_take(c->scratch, (size_t)n * bytes + 2 * half), *out = work + (size_t)n * bytes,
         *in = out + half;
    if (!work)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: bruck alltoall: no memory for %zu bytes", me,
                             (size_t)n * bytes + 2 * half);
    memcpy(work, tally__at(send, (size_t)me * count, tally_dtype_size(t)), (size_t)(n - me) * bytes);
    memcpy(work + (size_t)(n - me) * bytes, send, (size_t)me * bytes);
    for (int d = 1; d < n && !rc; d *= 2) {
        size_t k = 0;
        for (int i = d; i < n; i++)
            if (i & d) memcpy(out + k++ * bytes, work + (size_t)i * bytes, bytes);
        tally__send s = {.peer = (me + d) % n, .buf = out, .len = k * bytes};
        tally__recv r = {.peer = (me - d + n) % n, .dst = in, .len = k * bytes, .dtype = t};
        rc = tally__xchg(c, &s, 1, &r, 1);
        k = 0;
        for (int i = d; i < n && !rc; i++)
            if (i & d) memcpy(work + (size_t)i * bytes, in + k++ * bytes, bytes);
    }
    for (int i = 0; i < n && !rc; i++)
        memcpy((char *)recv + (size_t)((me - i + n) % n) * bytes, work + (size_t)i * bytes, bytes);
    tally__scratch_give(c->scratch, work);
    return rc;
}

/* The dissemination rounds with empty messages. */
static int bruck_barrier(const tally__ctx *c) { return tally__agree(c, NULL, 0, TALLY_U8, 0); }

/* The model: lg rounds, each about half of a rank's S bytes; the rotations and packing copy S about
 * twice and lg/2 times more, at about the speed of a reduction. */
static double bruck_cost(const tally__algo_shape *x, int coll) {
    if (coll == TALLY__BARRIER) return x->lg * x->a;
    return x->lg * (x->a + x->S / 2 * x->b) + (2 + x->lg / 2) * x->S * x->g;
}

const tally__algo_desc tally__bruck_algo = {
    .name = "bruck", .barrier = bruck_barrier, .alltoall = bruck_alltoall, .cost = bruck_cost};
