/* trace.c - a rank's schedule taken from the library's own algorithm code: the algorithm runs against a
 * transport that moves no data and records each exchange (peers, lengths, reductions) as one step. */
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "sim_int.h"

typedef struct recorder {
    tally__tp tp;
    tally__sim_sched *out;
} recorder;

static int record(tally__tp *tp, const tally__send *s, int ns, const tally__recv *r, int nr) {
    tally__sim_sched *o = ((recorder *)tp)->out;
    if (tally__sim_grow((void **)&o->msg, &o->cap_msg, o->nmsg + ns + nr, sizeof *o->msg) ||
        tally__sim_grow((void **)&o->first, &o->cap_step, o->nstep + 2, sizeof *o->first))
        return tally__seterr(TALLY_E_NOMEM, "sim: out of memory tracing a schedule of %ld steps", o->nstep);
    for (int i = 0; i < ns; i++) o->msg[o->nmsg++] = (tally__sim_msg){.peer = s[i].peer, .send = 1, .bytes = s[i].len};
    for (int i = 0; i < nr; i++)
        o->msg[o->nmsg++] = (tally__sim_msg){.peer = r[i].peer, .reduce = r[i].src != NULL, .bytes = r[i].len};
    o->first[++o->nstep] = (int)o->nmsg;
    return 0;
}

static void nothing(tally__tp *tp) { (void)tp; }

static const tally__tp_ops recorder_ops = {.name = "sim", .exchange = record, .destroy = nothing};

typedef int (*allreduce_fn)(const tally__ctx *, const void *, void *, size_t, tally_dtype, tally_op);
typedef int (*gather_fn)(const tally__ctx *, const void *, void *, size_t, tally_dtype);
typedef int (*bcast_fn)(const tally__ctx *, void *, size_t, tally_dtype, int);
typedef int (*barrier_fn)(const tally__ctx *);

static const struct {
    allreduce_fn allreduce, reduce_scatter;
    gather_fn allgather;
    bcast_fn broadcast;
    barrier_fn barrier;
} algos[TALLY__ALGO_COUNT] = {
    [TALLY__ALGO_RING] = {tally__ring_allreduce, tally__ring_reduce_scatter, tally__ring_allgather,
                          tally__ring_broadcast, tally__ring_barrier},
    [TALLY__ALGO_TREE] = {tally__tree_allreduce, tally__tree_reduce_scatter, tally__tree_allgather,
                          tally__tree_broadcast, tally__tree_barrier},
    [TALLY__ALGO_RHD] = {tally__rhd_allreduce, tally__rhd_reduce_scatter, tally__rhd_allgather, tally__rhd_broadcast,
                         tally__rhd_barrier},
    [TALLY__ALGO_DIRECT] = {tally__direct_allreduce, tally__direct_reduce_scatter, tally__direct_allgather,
                            tally__direct_broadcast, tally__direct_barrier},
};

void tally__sim_sched_free(tally__sim_sched *s) {
    free(s->msg);
    free(s->first);
    memset(s, 0, sizeof *s);
}

/* The buffers the algorithm addresses: calloc's pages stay untouched (and unbacked) except where the
 * code itself copies, since the recorder reads and writes nothing. */
int tally__sim_trace(int algo, int coll, int rank, int n, size_t bytes, tally_dtype t, int root,
                     tally__sim_sched *out) {
    memset(out, 0, sizeof *out);
    if (algo <= TALLY__ALGO_AUTO || algo >= TALLY__ALGO_COUNT)
        return tally__seterr(TALLY_E_INVALID, "sim: no flat algorithm %d to trace", algo);
    if (!(out->first = calloc(2, sizeof *out->first)))
        return tally__seterr(TALLY_E_NOMEM, "sim: out of memory tracing a schedule");
    out->cap_step = 2;
    size_t es = tally_dtype_size(t), count = bytes / es;
    if (n < 2 || (count == 0 && coll != TALLY__BARRIER)) return 0; /* the library returns before any exchange */
    size_t block = (coll == TALLY__REDUCE_SCATTER || coll == TALLY__ALLGATHER) ? count / (size_t)n : count;
    if (block == 0 && coll != TALLY__BARRIER) return 0;
    size_t whole = (coll == TALLY__REDUCE_SCATTER || coll == TALLY__ALLGATHER) ? block * (size_t)n : count;
    char *a = calloc(whole ? whole : 1, es), *b = calloc(whole ? whole : 1, es);
    int rc = 0;
    if (!a || !b) {
        rc = tally__seterr(TALLY_E_NOMEM, "sim: out of memory for a traced vector of %zu bytes", whole * es);
        goto out;
    }
    recorder rec = {.tp = {.ops = &recorder_ops, .ctx = {.rank = rank, .size = n}}, .out = out};
    tally__ctx ctx = {.rank = rank, .size = n, .tp = &rec.tp};
    switch (coll) {
    case TALLY__ALLREDUCE: rc = algos[algo].allreduce(&ctx, a, b, count, t, TALLY_SUM); break;
    case TALLY__REDUCE_SCATTER: rc = algos[algo].reduce_scatter(&ctx, a, b, block, t, TALLY_SUM); break;
    case TALLY__ALLGATHER: rc = algos[algo].allgather(&ctx, a, b, block, t); break;
    case TALLY__BROADCAST: rc = algos[algo].broadcast(&ctx, a, count, t, root); break;
    case TALLY__BARRIER: rc = algos[algo].barrier(&ctx); break;
    default: rc = tally__seterr(TALLY_E_INVALID, "sim: no collective %d", coll);
    }
out:
    free(a);
    free(b);
    if (rc) tally__sim_sched_free(out);
    return rc;
}
