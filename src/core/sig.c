/* sig.c - names and text of collective fingerprints, for mismatch and timeout messages. */
#include "sig.h"

#include <stdio.h>
#include <tally.h>

const char *tally__coll_name(int coll) {
    static const char *names[TALLY__COLL_COUNT] = {"allreduce", "reduce_scatter", "allgather",
                                                   "broadcast", "barrier",        "setup"};
    return (coll >= 0 && coll < TALLY__COLL_COUNT) ? names[coll] : "unknown-collective";
}

/* The algorithms are coll's, above core: their names come from its table once a communicator exists. */
static const char *(*_Atomic algo_namer)(int algo);

void tally__sig_name_algos(const char *(*name)(int algo)) { algo_namer = name; }

void tally__sig_format(const tally__sig *s, char *out, size_t n) {
    const char *(*name)(int) = algo_namer;
    const char *algo = name ? name(s->algo) : "?";
    switch (s->coll) {
    case TALLY__BARRIER: snprintf(out, n, "barrier #%llu", (unsigned long long)s->seq); break;
    case TALLY__BROADCAST:
        snprintf(out, n, "broadcast #%llu (count %llu, %s, root %d, algo %s)", (unsigned long long)s->seq,
                 (unsigned long long)s->count, tally_dtype_name((tally_dtype)s->dtype), (int)s->root, algo);
        break;
    case TALLY__ALLGATHER:
        snprintf(out, n, "allgather #%llu (count %llu, %s, algo %s)", (unsigned long long)s->seq,
                 (unsigned long long)s->count, tally_dtype_name((tally_dtype)s->dtype), algo);
        break;
    default:
        snprintf(out, n, "%s #%llu (count %llu, %s, %s, algo %s)", tally__coll_name(s->coll),
                 (unsigned long long)s->seq, (unsigned long long)s->count, tally_dtype_name((tally_dtype)s->dtype),
                 tally_op_name((tally_op)s->op), algo);
    }
}
