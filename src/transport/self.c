/* self.c - the transport of a world of one rank: there is no one to exchange with, so the only valid
 * exchange is the empty one (algorithms return before calling it; this catches any that do not). */
#include <stdlib.h>

#include "transport.h"

static int tally__self_exchange(tally__tp *tp, const tally__send *s, int ns, const tally__recv *r, int nr) {
    (void)s;
    (void)r;
    if (ns == 0 && nr == 0) return 0;
    return tally__seterr(TALLY_E_INVALID, "rank %d: exchange with %d sends and %d receives in a world of one rank",
                         tp->ctx.rank, ns, nr);
}

static void tally__self_destroy(tally__tp *tp) { free(tp); }

static const tally__tp_ops tally__self_ops = {"self", tally__self_exchange, tally__self_destroy, NULL, NULL, NULL};

int tally__self_create(const tally__tp_ctx *ctx, tally__tp **out) {
    *out = NULL;
    if (ctx->size != 1)
        return tally__seterr(TALLY_E_INVALID, "rank %d: the self transport is for a world of one rank, not %d",
                             ctx->rank, ctx->size);
    tally__tp *tp = calloc(1, sizeof *tp);
    if (!tp) return tally__seterr(TALLY_E_NOMEM, "rank %d: no memory for the self transport", ctx->rank);
    tp->ops = &tally__self_ops;
    tp->ctx = *ctx;
    *out = tp;
    return 0;
}
