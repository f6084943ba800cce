/* agree.c - the rounds that make every rank hear from every other before its collective returns, so a
 * call whose data flows one way (broadcast) still fails on every rank when any rank called something else. */
#include "coll.h"

/* Dissemination: in the round of distance m = 1, 2, 4, ... < n every rank sends to rank + m and receives
 * from rank - m; after the last round each rank has heard, directly or through ranks that had, from all
 * n - 1 others. Every message carries the sender's fingerprint, so a rank gets through the rounds only if
 * all ranks called what it called; anything else is a mismatch some rank sees, and the fault reaches
 * every rank waiting here. With bytes > 0 the edges of the binomial tree from root (virtual rank v < m
 * to v + m) carry buf instead of an empty message: the data reaches every rank in these same rounds. */
int tally__agree(const tally__ctx *c, void *buf, size_t bytes, tally_dtype t, int root) {
    static const char none;
    char sink;
    int n = c->size, v = (c->rank - root + n) % n;
    for (int m = 1; m < n; m *= 2) {
        int give = bytes && v < m && v + m < n, take = bytes && v >= m && v < 2 * m;
        tally__send s = {.peer = (c->rank + m) % n, .buf = give ? buf : &none, .len = give ? bytes : 0};
        tally__recv r = {.peer = (c->rank - m + n) % n, .dst = take ? buf : &sink, .len = take ? bytes : 0, .dtype = t};
        int rc = tally__xchg(c, &s, 1, &r, 1);
        if (rc) return rc;
    }
    return 0;
}
