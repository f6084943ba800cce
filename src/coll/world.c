/* world.c - tally_comm_init_config: the world communicator from its config (tally_comm_init: from the
 * environment's), then, when its ranks span hosts, its host communicator, the shm+tcp transport over it
 * and the levels (hier.c); above both comm.c and hier.c, so neither names the other. */
#include <stdio.h>
#include <stdlib.h>
#include <tally.h>

#include "../boot/boot.h"
#include "../core/err.h"
#include "coll.h"
#include "config.h"
#include "hier.h"

/* What the peer table says of the hosts: whether some host has two or more ranks (shm pays), and
 * whether every host has the same number, two or more, on two or more hosts (levels). */
typedef struct world_layout {
    int *host, *local;
    int shared, levels;
} world_layout;

static int layout_read(const tally__boot *boot, int size, world_layout *w) {
    w->host = malloc((size_t)size * sizeof *w->host);
    w->local = malloc((size_t)size * sizeof *w->local);
    int per = 0,
        hosts = w->host && w->local ? tally__hier_layout(tally__boot_peers(boot), size, w->host, w->local, &per) : -1;
    if (hosts < 0) return -1;
    for (int r = 0; r < size; r++) w->shared |= w->local[r] > 0;
    w->levels = hosts >= 2 && per >= 2;
    return 0;
}

/* TALLY_TRANSPORT=tcp keeps tcp between the ranks of a host too (as it asks); auto mixes. */
static int transport_auto(const tally_comm *c) { return tally__comm_config(c)->transport == TALLY_TRANSPORT_AUTO; }

static int world_levels(tally_comm *c, tally_comm *host) {
    tally__hier *h;
    int rc = tally__hier_init(c, tally__comm_boot(c), host, &h);
    if (rc || !h) return rc;
    tally__levels l = tally__hier_levels(h);
    /* The world's ping-pong ran between ranks 0 and 1, one host's: its flat algorithms also cross the
     * slowest link between hosts, which the cross communicators measured. */
    tally__comm_set_levels(c, &l, h->host, h->cross, h->cross_cost.alpha, h->cross_cost.beta, h->per_host);
    return 0;
}

static int world_parts(tally_comm *c, const world_layout *w) {
    int rank = tally_comm_rank(c), mix = w->shared && transport_auto(c), rc;
    if (!w->levels && tally__comm_forced_algo(c) == TALLY__ALGO_HIER)
        return tally__seterr(
            TALLY_E_INVALID,
            "rank %d: TALLY_ALGO=hier (tally_config.algo) needs ranks on two or more hosts with the same "
            "number (two or more) on each; this job's %d ranks are not so: unset TALLY_ALGO or pick ring, "
            "tree, rhd or direct",
            rank, tally_comm_size(c));
    if (!mix && !w->levels) return 0;
    tally_comm *host;
    if ((rc = tally_comm_split(c, w->host[rank], rank, &host))) return rc;
    tally__comm_keep_host(c, host);
    if (mix) {
        int size = tally_comm_size(c);
        int *local_of = malloc((size_t)size * sizeof *local_of);
        if (!local_of) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory for %d ranks", rank, size);
        for (int r = 0; r < size; r++) local_of[r] = w->host[r] == w->host[rank] ? w->local[r] : -1;
        rc = tally__comm_mix_transport(c, local_of);
        free(local_of);
        if (rc) return rc;
    }
    return w->levels ? world_levels(c, host) : 0;
}

static int world_finish(tally_comm *c) {
    const tally__boot *boot = tally__comm_boot(c);
    if (tally__boot_single_host(boot)) return world_parts(c, &(world_layout){0});
    world_layout w = {0};
    int rc = layout_read(boot, tally_comm_size(c), &w) ? tally__seterr(TALLY_E_NOMEM,
                                                                       "rank %d: out of memory for the hosts of %d "
                                                                       "ranks",
                                                                       tally_comm_rank(c), tally_comm_size(c))
                                                       : world_parts(c, &w);
    free(w.host);
    free(w.local);
    return rc;
}

TALLY_API int tally_comm_init_config(tally_comm **out, const tally_config *cfg) {
    tally__clearerr();
    if (!out) return tally__seterr(TALLY_E_INVALID, "tally_comm_init_config: comm pointer is NULL");
    *out = NULL;
    tally_config mine;
    int rc = tally__config_take(cfg, &mine);
    if (rc) return rc;
    tally_comm *c;
    if ((rc = tally__comm_make_world(&mine, &c))) return rc;
    if ((rc = world_finish(c))) tally_comm_free(c); /* teardown keeps the message */
    *out = rc ? NULL : c;
    return rc;
}

TALLY_API int tally_comm_init(tally_comm **out) {
    tally__clearerr();
    if (!out) return tally__seterr(TALLY_E_INVALID, "tally_comm_init: comm pointer is NULL");
    *out = NULL;
    tally_config cfg = TALLY_CONFIG_INIT;
    int rc = tally_config_from_env(&cfg);
    return rc ? rc : tally_comm_init_config(out, &cfg);
}
