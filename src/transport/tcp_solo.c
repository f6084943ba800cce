/* tcp_solo.c - the second mesh of a world on one host: one connection per pair that carries only the
 * higher rank's large payloads, so each connection's data flows one way (see tcp_int.h for why). */
#include <stdint.h>
#include <stdlib.h>

#include "../boot/boot.h"
#include "../boot/fdlimit.h"
#include "../core/log.h"
#include "tcp_int.h"

/* Worlds up to this size only: the mesh costs a connection per pair to set up (256 tcp ranks on one
 * host: 8.1 against 13.5 s, 128: 1.9 against 3.9), and it pays in swaps, which on one host mostly small
 * worlds run over tcp (one host's ranks take shm unless told otherwise). */
#define SOLO_MAX_RANKS 16

/* Every rank says whether it can hold the mesh (memory, and descriptors for a connection per peer and
 * a listener), so all build it or none does. 1 when all can. Descriptors only where the soft limit
 * already has them, with the boot's extras still spare: the boot budgeted one mesh (and raised the
 * limit for that alone, where it had to), and a rank does without the second. */
static int solo_all_ready(const tally__tp_ctx *ctx, int ready, int *rc) {
    int32_t mine = ready, *all = calloc((size_t)ctx->size, sizeof *all);
    *rc = all ? tally__boot_allgather(ctx->boot, &mine, all, sizeof mine) : TALLY_E_NOMEM;
    int every = !*rc, who = -1;
    for (int r = 0; every && r < ctx->size; r++)
        if (!all[r]) {
            every = 0;
            who = r;
        }
    free(all);
    if (who >= 0 && ctx->rank == 0)
        tally__log_debug(1, "tcp: rank %d has no room for a second connection per peer: payloads share one", who);
    return every;
}

int tally__tcp_solo_mesh(const tally__tp_ctx *ctx, tally__tcp_conn **solo) {
    *solo = NULL;
    if (ctx->size > SOLO_MAX_RANKS || !tally__boot_single_host(ctx->boot)) return 0;
    tally__tcp_conn *mine = tally__tcp_conns_new(ctx);
    int rc = 0, ready = mine && tally__fd_spare(ctx->size + TALLY__BOOT_FD_EXTRA);
    if (!solo_all_ready(ctx, ready, &rc) || (!rc && (rc = tally__tcp_mesh(ctx, mine)))) {
        tally__tcp_conns_free(mine, ctx->size);
        return rc;
    }
    *solo = mine;
    return 0;
}
