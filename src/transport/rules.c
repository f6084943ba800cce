/* rules.c - the callers' rules of an exchange (transport.h), checked alike by every backend that checks
 * them: a violation is a bug in an algorithm, not a peer's fault, and is refused before anything moves. */
#include "transport.h"

int tally__tp_check_rules(const tally__tp_ctx *ctx, const char *name, const tally__send *s, int ns,
                          const tally__recv *r, int nr) {
    int size = ctx->size, me = ctx->rank;
    if (ns < 0 || nr < 0 || ns > size || nr > size)
        return tally__seterr(TALLY_E_INVALID, "rank %d: %s exchange: %d sends, %d receives", me, name, ns, nr);
    for (int i = 0; i < ns; i++)
        if (s[i].peer < 0 || s[i].peer >= size || s[i].peer == me || (s[i].len && !s[i].buf))
            return tally__seterr(TALLY_E_INVALID, "rank %d: %s exchange: bad send to peer %d", me, name, s[i].peer);
    for (int i = 0; i < nr; i++) {
        size_t es = r[i].src ? tally_dtype_size(r[i].dtype) : 1;
        if (r[i].peer < 0 || r[i].peer >= size || r[i].peer == me || (r[i].len && !r[i].dst) || es == 0 ||
            r[i].len % es)
            return tally__seterr(TALLY_E_INVALID, "rank %d: %s exchange: bad receive from peer %d", me, name,
                                 r[i].peer);
    }
    return 0;
}
