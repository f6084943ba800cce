/* trace.c - a rank's schedule taken from the library's own algorithm code: the algorithm runs against a
 * transport that moves no data and records each exchange (peers, lengths, reductions) as one step. */
#include <stdlib.h>
#include <string.h>

#include "../coll/algo.h"
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
    const tally__algo_desc *d = tally__algo_get(algo);
    if (!d) return tally__seterr(TALLY_E_INVALID, "sim: no flat algorithm %d to trace", algo);
    if (coll < TALLY__ALLREDUCE || coll > TALLY__BARRIER)
        return tally__seterr(TALLY_E_INVALID, "sim: no collective %d", coll);
    if (!tally__algo_has(d, coll))
        return tally__seterr(TALLY_E_INVALID, "sim: %s has no %s to trace", d->name, tally__coll_name(coll));
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
    case TALLY__ALLREDUCE: rc = d->allreduce(&ctx, a, b, count, t, TALLY_SUM); break;
    case TALLY__REDUCE_SCATTER: rc = d->reduce_scatter(&ctx, a, b, block, t, TALLY_SUM); break;
    case TALLY__ALLGATHER: rc = d->allgather(&ctx, a, b, block, t); break;
    case TALLY__BROADCAST: rc = d->broadcast(&ctx, a, count, t, root); break;
    default: rc = d->barrier(&ctx); break;
    }
out:
    free(a);
    free(b);
    if (rc) tally__sim_sched_free(out);
    return rc;
}
