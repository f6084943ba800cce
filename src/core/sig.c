/* sig.c - names and text of collective fingerprints, for mismatch and timeout messages. */
#include "sig.h"

#include <stdio.h>
#include <tally.h>

const char *tally__coll_name(int coll) {
    static const char *names[TALLY__COLL_COUNT] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                                   "barrier",   "setup",          "reduce",    "gather",
                                                   "scatter",   "alltoall",       "alltoallv"};
    return (coll >= 0 && coll < TALLY__COLL_COUNT) ? names[coll] : "unknown-collective";
}

/* The algorithms are coll's, above core: their names come from its table once a communicator exists. */
static const char *(*_Atomic algo_namer)(int algo);

void tally__sig_name_algos(const char *(*name)(int algo)) { algo_namer = name; }

void tally__sig_format(const tally__sig *s, char *out, size_t n) {
    const char *(*name)(int) = algo_namer;
    const char *algo = name ? name(s->algo) : "?", *coll = tally__coll_name(s->coll);
    const char *dtype = tally_dtype_name((tally_dtype)s->dtype);
    unsigned long long seq = (unsigned long long)s->seq, count = (unsigned long long)s->count;
    switch (s->coll) {
    case TALLY__BARRIER: snprintf(out, n, "barrier #%llu", seq); break;
    case TALLY__BROADCAST:
    case TALLY__GATHER:
    case TALLY__SCATTER:
        snprintf(out, n, "%s #%llu (count %llu, %s, root %d, algo %s)", coll, seq, count, dtype, (int)s->root, algo);
        break;
    case TALLY__REDUCE:
        snprintf(out, n, "reduce #%llu (count %llu, %s, %s, root %d, algo %s)", seq, count, dtype,
                 tally_op_name((tally_op)s->op), (int)s->root, algo);
        break;
    case TALLY__ALLGATHER:
    case TALLY__ALLTOALL: snprintf(out, n, "%s #%llu (count %llu, %s, algo %s)", coll, seq, count, dtype, algo); break;
    case TALLY__ALLTOALLV: snprintf(out, n, "alltoallv #%llu (%s, algo %s)", seq, dtype, algo); break;
    default:
        snprintf(out, n, "%s #%llu (count %llu, %s, %s, algo %s)", coll, seq, count, dtype,
                 tally_op_name((tally_op)s->op), algo);
    }
}
