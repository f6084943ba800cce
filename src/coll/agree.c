/* agree.c - the rounds that make every rank hear from every other before its collective returns, so a
 * call whose data flows one way (broadcast, scatter) still fails on every rank when any rank called
 * something else; the data of a binomial broadcast or scatter may ride in them. */
#include "blocks.h"
#include "coll.h"

/* Dissemination: in the round of distance m every rank sends to rank + m and receives from rank - m,
 * for m = the largest power of two below n, then half of it, ... down to 1. Each rank hears from
 * rank - d for every sum d of distinct distances taken in round order, which covers every d < n in any
 * order of the rounds: after the last one each rank has heard, directly or through ranks that had, from
 * all n - 1 others. Every message carries the sender's fingerprint, so a rank gets through the rounds
 * only if all ranks called what it called; anything else is a mismatch some rank sees, and the fault
 * reaches every rank waiting here. Largest distance first because then the edges v -> v + m (virtual
 * rank v = rank - root, a multiple of 2m, v + m < n) are the binomial tree whose subtrees [w, w + m) are
 * contiguous: a scatter's blocks for a subtree travel as one message, no packing. */
int tally__agree_ride(const tally__ctx *c, tally__ride_fn ride, void *arg, tally_dtype t, int root) {
    static const char none;
    char sink;
    int n = c->size, v = (c->rank - root + n) % n;
    for (int m = n > 1 ? tally__pow2_floor(n - 1) : 0; m >= 1; m /= 2) {
        tally__send s = {.peer = (c->rank + m) % n, .buf = &none};
        tally__recv r = {.peer = (c->rank - m + n) % n, .dst = &sink, .dtype = t};
        if (ride) ride(arg, m, v % (2 * m) == 0 && v + m < n, v % (2 * m) == m, &s, &r);
        int rc = tally__xchg(c, &s, 1, &r, 1);
        if (rc) return rc;
    }
    return 0;
}

typedef struct {
    void *buf;
    size_t bytes;
} bcast_ride;

static void bcast_step(void *arg, int m, int give, int take, tally__send *s, tally__recv *r) {
    const bcast_ride *b = arg;
    (void)m;
    if (give) *s = (tally__send){.peer = s->peer, .buf = b->buf, .len = b->bytes};
    if (take) *r = (tally__recv){.peer = r->peer, .dst = b->buf, .len = b->bytes, .dtype = r->dtype};
}

int tally__agree(const tally__ctx *c, void *buf, size_t bytes, tally_dtype t, int root) {
    bcast_ride b = {buf, bytes};
    return tally__agree_ride(c, bytes ? bcast_step : NULL, &b, t, root);
}
