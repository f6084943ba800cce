/* gather.c - gather to rank 0 in one exchange, the first half of the allgathers that go through a
 * root (direct, tree). Plain receives into disjoint blocks may share one exchange. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

int tally__gather_to_root(const tally__ctx *c, const void *send, void *recv, size_t bytes) {
    int n = c->size;
    if (c->rank != 0) return tally__send_one(c, 0, send, bytes);
    tally__recv *rv = malloc((size_t)(n - 1) * sizeof *rv);
    if (!rv) return tally__seterr(TALLY_E_NOMEM, "rank 0: gather of %d blocks: no memory", n);
    if (recv != send) memcpy(recv, send, bytes);
    for (int k = 1; k < n; k++)
        rv[k - 1] = (tally__recv){.peer = k, .dst = (char *)recv + (size_t)k * bytes, .len = bytes};
    int rc = tally__xchg(c, NULL, 0, rv, n - 1);
    free(rv);
    return rc;
}
