/* world.c - tally_comm_init: the world communicator from the environment, then its levels when its
 * ranks span hosts alike (hier.c); above both comm.c and hier.c, so neither names the other. */
#include <stdio.h>
#include <tally.h>

#include "../boot/boot.h"
#include "../core/err.h"
#include "coll.h"
#include "hier.h"

/* The host and cross communicators, when the ranks span hosts with as many on each (two or more);
 * TALLY_ALGO=hier needs them. */
static int world_levels(tally_comm *c) {
    const tally__boot *boot = tally__comm_boot(c);
    int size = tally_comm_size(c), rc;
    int possible = tally__boot_single_host(boot) ? 0 : tally__hier_possible(boot, size);
    if (possible < 0)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory for the hierarchy of %d ranks", tally_comm_rank(c),
                             size);
    if (!possible && tally__comm_forced_algo(c) == TALLY__ALGO_HIER)
        return tally__seterr(
            TALLY_E_INVALID,
            "rank %d: TALLY_ALGO=hier needs ranks on two or more hosts with the same number (two or "
            "more) on each; this job's %d ranks are not so: unset TALLY_ALGO or pick ring, tree, rhd or "
            "direct",
            tally_comm_rank(c), size);
    if (!possible) return 0;
    tally__hier *h;
    if ((rc = tally__hier_init(c, boot, &h)) || !h) return rc;
    tally__levels l = tally__hier_levels(h);
    /* The world's ping-pong ran between ranks 0 and 1, one host's: its flat algorithms also cross the
     * slowest link between hosts, which the cross communicators measured. */
    tally__comm_set_levels(c, &l, h->host, h->cross, h->cross_cost.alpha, h->cross_cost.beta);
    return 0;
}

TALLY_API int tally_comm_init(tally_comm **out) {
    tally__clearerr();
    if (!out) return tally__seterr(TALLY_E_INVALID, "tally_comm_init: comm pointer is NULL");
    tally_comm *c;
    int rc = tally__comm_make_world(&c);
    if (!rc && (rc = world_levels(c))) tally_comm_free(c); /* teardown keeps the message */
    *out = rc ? NULL : c;
    return rc;
}
