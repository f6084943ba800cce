/* sig.h - the fingerprint every collective carries (sequence number, collective, dtype, op, count,
 * root), compared by the receiver of every message so mismatched calls fail instead of hanging. */
#ifndef TALLY_CORE_SIG_H
#define TALLY_CORE_SIG_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    TALLY__ALLREDUCE,
    TALLY__REDUCE_SCATTER,
    TALLY__ALLGATHER,
    TALLY__BROADCAST,
    TALLY__BARRIER,
    TALLY__SETUP, /* messages exchanged at init (cost measurement) */
    /* After SETUP, so the values above keep their meaning for the code and tests that range over them. */
    TALLY__REDUCE,
    TALLY__GATHER,
    TALLY__SCATTER,
    TALLY__ALLTOALL,
    TALLY__ALLTOALLV,
    TALLY__COLL_COUNT
} tally__coll_kind;

typedef struct tally__sig {
    uint64_t seq;   /* collectives started on this communicator, from 1 */
    uint64_t count; /* elements (per rank block for reduce_scatter/allgather/gather/scatter/alltoall; 0 for
                     * alltoallv, whose counts differ by rank and are compared pair by pair instead) */
    int32_t root;   /* root of broadcast, reduce, gather and scatter, else -1 */
    uint8_t coll;   /* tally__coll_kind */
    uint8_t dtype;  /* tally_dtype */
    uint8_t op;     /* tally_op as the user passed it (AVG stays AVG) */
    uint8_t algo;   /* algorithm chosen; equal sigs imply equal algorithms */
} tally__sig;       /* 24 bytes, sent as is (all ranks of a job share one ABI) */

static inline int tally__sig_equal(const tally__sig *a, const tally__sig *b) {
    return a->seq == b->seq && a->count == b->count && a->root == b->root && a->coll == b->coll &&
           a->dtype == b->dtype && a->op == b->op && a->algo == b->algo;
}
const char *tally__coll_name(int coll);
/* "allreduce #12 (count 1000, f32, sum, algo ring)" */
void tally__sig_format(const tally__sig *s, char *out, size_t n);
/* Where the algorithms' names come from (coll's tally__algo_name, installed as a communicator is made or
 * records are read); until then an algorithm shows as "?". */
void tally__sig_name_algos(const char *(*name)(int algo));

#endif
