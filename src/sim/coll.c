/* coll.c - one collective on the simulated cluster: the algorithm picked as the library picks it, flat
 * (every rank's traced schedule, or the fast path) or by level as hier.c runs it (host reduce-scatter,
 * shards across hosts on a second lane, host all-gather, in hier.c's chunk order). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../coll/algo.h"
#include "../coll/hier.h"
#include "../core/err.h"
#include "sim_int.h"

static int has_levels(const tally__sim_cluster *c, int coll) {
    return c->hosts >= 2 && c->per_host >= 2 &&
           (coll == TALLY__ALLREDUCE || coll == TALLY__REDUCE_SCATTER || coll == TALLY__ALLGATHER);
}

/* shm as the library measures it at init: its ping-pong meets the wake-ups when the host is crowded. */
static tally__cost shm_cost(const tally__sim_cluster *c) {
    tally__cost m = c->shm;
    m.alpha = tally__sim_shm_alpha(c);
    return m;
}

/* The flat algorithms' model where ranks span hosts: the slower link's alpha and beta, as the world
 * takes them once it has levels (tally__comm_set_levels). */
static tally__cost flat_cost(const tally__sim_cluster *c) {
    tally__cost m = shm_cost(c), net = tally__sim_net_cost(c);
    if (c->hosts > 1) {
        m.alpha = fmax(m.alpha, net.alpha);
        m.beta = fmax(m.beta, net.beta);
        m.share = c->per_host;
    }
    return m;
}

static tally__hier levels_of(const tally__sim_cluster *c) {
    tally__hier h = {
        .hosts = c->hosts, .per_host = c->per_host, .host_cost = shm_cost(c), .cross_cost = tally__sim_net_cost(c)};
    tally__hier_share_link(&h);
    return h;
}

/* As comm.c picks: a flat algorithm named that has no such collective leaves it to the model. */
static int pick(const tally__sim_cluster *c, const tally__sim_coll *q) {
    int n = c->hosts * c->per_host;
    tally__cost flat = flat_cost(c);
    const tally__algo_desc *named = tally__algo_get(q->algo);
    if (q->algo != TALLY__ALGO_AUTO && (!named || tally__algo_has(named, q->coll))) return q->algo;
    if (!has_levels(c, q->coll)) return tally__algo_choose(&flat, q->coll, n, q->bytes);
    tally__hier h = levels_of(c);
    return tally__algo_choose_levels(&flat, tally__hier_cost(&h, q->coll, q->bytes), q->coll, n, q->bytes);
}

/* ---- the event level over a level's ranks (every copy) ---- */

typedef struct op {
    int coll, algo;
    size_t bytes;
} op;

/* Appends op on level lv to each world rank's lane, `lead` seconds of a call's overhead first (a
 * level's own call inside hier); returns the last step index (the same on every rank of the level),
 * -1 none, -2 failure. */
static long append_op(tally__sim_prog *p, const tally__sim_level *lv, const op *o, tally_dtype t, int root, int lane,
                      int dep_lane, long dep_step, double lead) {
    long last = -1;
    for (int k = 0; k < lv->n; k++) {
        tally__sim_sched s;
        if (tally__sim_trace(o->algo, o->coll, k, lv->n, o->bytes, t, root, &s)) return -2;
        for (int i = 0; i < lv->copies; i++) {
            int me = k * lv->stride_k + i * lv->stride_i;
            long at = tally__sim_prog_append(p, me, lane, &s, i * lv->stride_i, lv->stride_k, dep_lane, dep_step, lead);
            if (at == -2) {
                tally__sim_sched_free(&s);
                return -2;
            }
            if (at > last) last = at;
        }
        tally__sim_sched_free(&s);
    }
    return last;
}

static long estimate(const tally__sim_level *lv, const op *o, tally_dtype t) {
    tally__sim_sched s;
    if (tally__sim_trace(o->algo, o->coll, 0, lv->n, o->bytes, t, 0, &s)) return -1;
    long m = s.nmsg * (long)lv->n * lv->copies;
    tally__sim_sched_free(&s);
    return m;
}

static tally__sim_level flat_level(const tally__sim_cluster *c) {
    return (tally__sim_level){.n = c->hosts * c->per_host, .copies = 1, .stride_k = 1, .stride_i = 0};
}
static tally__sim_level host_level(const tally__sim_cluster *c) {
    return (tally__sim_level){.n = c->per_host, .copies = c->hosts, .stride_k = 1, .stride_i = c->per_host};
}
static tally__sim_level cross_level(const tally__sim_cluster *c) {
    return (tally__sim_level){.n = c->hosts, .copies = c->per_host, .stride_k = c->per_host, .stride_i = 1};
}

/* ---- a hierarchical collective's pieces, in the order hier.c runs them ---- */

typedef struct piece {
    op host, cross; /* host.coll < 0: none */
    int order;      /* 0: host then cross (reduce-scatter); 1: cross then host (all-gather); 2: host, cross, host */
} piece;

typedef struct hier_plan {
    int npipe; /* chunks run as a pipeline (0: none) */
    op rs[TALLY__HIER_CHUNKS_MAX], ar[TALLY__HIER_CHUNKS_MAX], ag[TALLY__HIER_CHUNKS_MAX];
    int nseq; /* then these, one after the other, on the caller's lane */
    op seq[6];
    int seq_cross[6]; /* 1: on the level between hosts */
} hier_plan;

static op op_on(const tally__cost *m, int coll, int n, size_t bytes) {
    return (op){.coll = coll, .algo = tally__algo_choose(m, coll, n, bytes), .bytes = bytes};
}

static void plan_hier(const tally__sim_cluster *c, const tally__sim_coll *q, hier_plan *hp) {
    memset(hp, 0, sizeof *hp);
    tally__cost net = tally__sim_net_cost(c), shm = shm_cost(c);
    size_t es = tally_dtype_size(q->dtype), M = (size_t)c->per_host, H = (size_t)c->hosts, count = q->bytes / es;
    if (q->coll == TALLY__ALLREDUCE) {
        size_t qq = count / M, tail = count - qq * M;
        tally__hier h = levels_of(c);
        int chunks = tally__hier_chunks(&h, qq * M * es);
        if (chunks) {
            size_t shard = (qq + (size_t)chunks - 1) / (size_t)chunks;
            hp->npipe = chunks;
            for (int j = 0; j < chunks; j++) {
                size_t len = tally__hier_chunk_len(qq, shard, j) * es;
                hp->rs[j] = op_on(&shm, TALLY__REDUCE_SCATTER, (int)M, len * M);
                hp->ar[j] = op_on(&net, TALLY__ALLREDUCE, (int)H, len);
                hp->ag[j] = op_on(&shm, TALLY__ALLGATHER, (int)M, len * M);
            }
        } else if (qq) {
            hp->seq[hp->nseq++] = op_on(&shm, TALLY__REDUCE_SCATTER, (int)M, qq * M * es);
            hp->seq_cross[hp->nseq] = 1;
            hp->seq[hp->nseq++] = op_on(&net, TALLY__ALLREDUCE, (int)H, qq * es);
            hp->seq[hp->nseq++] = op_on(&shm, TALLY__ALLGATHER, (int)M, qq * M * es);
        }
        if (tail) {
            hp->seq[hp->nseq++] = op_on(&shm, TALLY__ALLREDUCE, (int)M, tail * es);
            hp->seq_cross[hp->nseq] = 1;
            hp->seq[hp->nseq++] = op_on(&net, TALLY__ALLREDUCE, (int)H, tail * es);
        }
    } else if (q->coll == TALLY__REDUCE_SCATTER) { /* bytes: all N blocks; each host keeps H of them per rank */
        hp->seq[hp->nseq++] = op_on(&shm, TALLY__REDUCE_SCATTER, (int)M, q->bytes);
        hp->seq_cross[hp->nseq] = 1;
        hp->seq[hp->nseq++] = op_on(&net, TALLY__REDUCE_SCATTER, (int)H, q->bytes / M);
    } else {
        hp->seq_cross[hp->nseq] = 1;
        hp->seq[hp->nseq++] = op_on(&net, TALLY__ALLGATHER, (int)H, q->bytes / M);
        hp->seq[hp->nseq++] = op_on(&shm, TALLY__ALLGATHER, (int)M, q->bytes);
    }
}

static int hier_event(const tally__sim_cluster *c, const tally__sim_coll *q, const hier_plan *hp,
                      tally__sim_result *r) {
    tally__sim_level hl = host_level(c), xl = cross_level(c);
    tally__sim_prog p;
    int rc = tally__sim_prog_init(&p, c->hosts * c->per_host);
    long rs_end[TALLY__HIER_CHUNKS_MAX], ar_end[TALLY__HIER_CHUNKS_MAX], host_last = -1, cross_last = -1;
    for (int k = 0; !rc && k < 2 * hp->npipe; k++) {
        int gather, j;
        tally__hier_pipe_step(k, hp->npipe, &gather, &j);
        if (!gather) {
            if ((rs_end[j] = append_op(&p, &hl, &hp->rs[j], q->dtype, 0, 0, -1, 0, c->call_s)) == -2) rc = -1;
            host_last = rs_end[j] >= 0 ? rs_end[j] : host_last;
            /* the chunk's allreduce between hosts waits for its reduce-scatter */
            if (!rc && (ar_end[j] = append_op(&p, &xl, &hp->ar[j], q->dtype, 0, 1, 0, host_last, c->call_s)) == -2)
                rc = -1;
            cross_last = ar_end[j] >= 0 ? ar_end[j] : cross_last;
        } else {
            long at =
                append_op(&p, &hl, &hp->ag[j], q->dtype, 0, 0, 1, ar_end[j] >= 0 ? ar_end[j] : cross_last, c->call_s);
            if (at == -2) rc = -1;
            host_last = at >= 0 ? at : host_last;
        }
    }
    for (int k = 0; !rc && k < hp->nseq; k++) { /* one lane: the caller's thread runs these in turn */
        long at = append_op(&p, hp->seq_cross[k] ? &xl : &hl, &hp->seq[k], q->dtype, 0, 0, cross_last >= 0 ? 1 : -1,
                            cross_last, c->call_s);
        cross_last = -1; /* only the first waits for the pipeline's last chunk between hosts */
        if (at == -2) rc = -1;
    }
    if (!rc) rc = tally__sim_prog_seal(&p);
    if (!rc) rc = tally__sim_event_run(c, &p, r);
    tally__sim_prog_free(&p);
    return rc ? TALLY_E_INVALID : 0;
}

/* One op on a level, by the fast path; its seconds in *sec. r's critical link is the one a piece spent
 * longest on (*crit_s: those seconds), its utilisation and counts add up. */
static int level_fast(const tally__sim_cluster *c, const tally__sim_level *lv, const op *o, tally_dtype t, double *sec,
                      tally__sim_result *r, double *crit_s) {
    *sec = 0;
    if (lv->n < 2 || o->bytes == 0) return 0;
    tally__sim_result part = *r;
    int rc = tally__sim_fast(c, lv, o->algo, o->coll, o->bytes, t, sec, &part);
    if (!rc) {
        double on_link = part.crit_link_share * *sec;
        if (on_link > *crit_s) *crit_s = on_link, r->crit_kind = part.crit_kind, r->crit_at = part.crit_at;
        if (lv->n < c->hosts * c->per_host) *sec += c->call_s; /* a level's own call, inside hier */
        memcpy(r->util, part.util, sizeof r->util);
        memcpy(r->util_at, part.util_at, sizeof r->util_at);
        r->messages = part.messages;
        r->steps = part.steps;
    }
    return rc;
}

/* The pipeline by recurrence: the host lane runs hier.c's order, the lane between hosts each chunk once
 * the host has reduce-scattered it, an all-gather once its chunk has crossed. */
static int hier_fast(const tally__sim_cluster *c, const tally__sim_coll *q, const hier_plan *hp, tally__sim_result *r) {
    tally__sim_level hl = host_level(c), xl = cross_level(c);
    double host_free = 0, cross_free = 0, rs_done[TALLY__HIER_CHUNKS_MAX] = {0}, ar_done[TALLY__HIER_CHUNKS_MAX] = {0};
    double crit_s = 0;
    int rc = 0;
    for (int k = 0; !rc && k < 2 * hp->npipe; k++) {
        int gather, j;
        double t;
        tally__hier_pipe_step(k, hp->npipe, &gather, &j);
        if (!gather) {
            if ((rc = level_fast(c, &hl, &hp->rs[j], q->dtype, &t, r, &crit_s))) break;
            rs_done[j] = host_free += t;
            if ((rc = level_fast(c, &xl, &hp->ar[j], q->dtype, &t, r, &crit_s))) break;
            ar_done[j] = cross_free = fmax(cross_free, rs_done[j]) + t;
        } else {
            if ((rc = level_fast(c, &hl, &hp->ag[j], q->dtype, &t, r, &crit_s))) break;
            host_free = fmax(host_free, ar_done[j]) + t;
        }
    }
    double now = fmax(host_free, cross_free);
    for (int k = 0; !rc && k < hp->nseq; k++) { /* then the rest in turn, on the caller's thread */
        double t;
        rc = level_fast(c, hp->seq_cross[k] ? &xl : &hl, &hp->seq[k], q->dtype, &t, r, &crit_s);
        now += t;
    }
    r->seconds = now;
    r->crit_link_share = now > 0 ? crit_s / now : 0;
    return rc;
}

/* ---- the entry ---- */

static int flat_event(const tally__sim_cluster *c, const tally__sim_coll *q, int algo, tally__sim_result *r) {
    tally__sim_level lv = flat_level(c);
    op o = {.coll = q->coll, .algo = algo, .bytes = q->bytes};
    tally__sim_prog p;
    int rc = tally__sim_prog_init(&p, lv.n);
    if (!rc && append_op(&p, &lv, &o, q->dtype, q->root, 0, -1, 0, 0) == -2) rc = TALLY_E_NOMEM;
    if (!rc) rc = tally__sim_prog_seal(&p);
    if (!rc) rc = tally__sim_event_run(c, &p, r);
    tally__sim_prog_free(&p);
    return rc;
}

static long hier_estimate(const tally__sim_cluster *c, const hier_plan *hp, tally_dtype t) {
    tally__sim_level hl = host_level(c), xl = cross_level(c);
    long m = 0;
    for (int j = 0; j < hp->npipe; j++)
        m += estimate(&hl, &hp->rs[j], t) + estimate(&xl, &hp->ar[j], t) + estimate(&hl, &hp->ag[j], t);
    for (int k = 0; k < hp->nseq; k++) m += estimate(hp->seq_cross[k] ? &xl : &hl, &hp->seq[k], t);
    return m;
}

static double bus_factor(int coll, int n) {
    if (coll == TALLY__ALLREDUCE) return 2.0 * (n - 1) / n;
    if (coll == TALLY__REDUCE_SCATTER || coll == TALLY__ALLGATHER) return (double)(n - 1) / n;
    return coll == TALLY__BROADCAST ? 1 : 0;
}

/* --method event past what its memory can hold: refused, not a machine brought to its knees. */
static int too_many(long m) {
    if (m <= 25 * TALLY__SIM_EVENT_MAX) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "sim: the event level would play %ld messages, past %ld: take --method auto or fast", m,
                         25 * TALLY__SIM_EVENT_MAX);
}

static int run(const tally__sim_cluster *c, const tally__sim_coll *q, int algo, tally__sim_result *r) {
    int n = c->hosts * c->per_host;
    if (algo == TALLY__ALGO_HIER) {
        hier_plan hp;
        plan_hier(c, q, &hp);
        r->level_algo[0] = hp.npipe ? hp.rs[0].algo : hp.nseq ? hp.seq[0].algo : TALLY__ALGO_AUTO;
        r->level_algo[1] = hp.npipe ? hp.ar[0].algo : hp.nseq > 1 ? hp.seq[1].algo : TALLY__ALGO_AUTO;
        long m = hier_estimate(c, &hp, q->dtype);
        if (q->method == TALLY__SIM_EVENT && too_many(m)) return TALLY_E_INVALID;
        if (q->method == TALLY__SIM_EVENT || (q->method == TALLY__SIM_AUTO && m <= TALLY__SIM_EVENT_MAX)) {
            r->method = TALLY__SIM_EVENT;
            int rc = hier_event(c, q, &hp, r);
            return rc ? tally__err_wrap(rc, "sim: ", "") : 0; /* never formatted from its own buffer */
        }
        r->method = TALLY__SIM_FAST;
        return hier_fast(c, q, &hp, r);
    }
    tally__sim_level lv = flat_level(c);
    op o = {.coll = q->coll, .algo = algo, .bytes = q->bytes};
    long m = estimate(&lv, &o, q->dtype);
    if (m < 0) return tally__seterr(TALLY_E_NOMEM, "sim: cannot trace %s", tally__algo_name(algo));
    if (q->method == TALLY__SIM_EVENT && too_many(m)) return TALLY_E_INVALID;
    if (q->method == TALLY__SIM_EVENT || (q->method == TALLY__SIM_AUTO && m <= TALLY__SIM_EVENT_MAX)) {
        r->method = TALLY__SIM_EVENT;
        return flat_event(c, q, algo, r);
    }
    r->method = TALLY__SIM_FAST;
    double crit_s = 0;
    int rc = level_fast(c, &lv, &o, q->dtype, &r->seconds, r, &crit_s);
    r->crit_link_share = r->seconds > 0 ? crit_s / r->seconds : 0;
    if (rc && q->method == TALLY__SIM_AUTO)
        return tally__seterr(TALLY_E_INVALID,
                             "sim: %s on %d ranks is %ld messages, past the event level's %ld, and not symmetric "
                             "enough for the fast path: take ring, rhd on a power of two, or hier",
                             tally__algo_name(algo), n, m, TALLY__SIM_EVENT_MAX);
    return rc;
}

int tally__sim_collective(const tally__sim_cluster *cl, const tally__sim_coll *q, tally__sim_result *r) {
    tally__sim_cluster at_size = tally__sim_at_size(cl, (double)q->bytes);
    const tally__sim_cluster *c = &at_size;
    memset(r, 0, sizeof *r);
    r->crit_rank = r->crit_kind = r->crit_at = -1;
    for (int k = 0; k < TALLY__SIM_KINDS; k++) r->util_at[k] = -1;
    int rc = tally__sim_cluster_check(c), n = c->hosts * c->per_host;
    if (rc) return rc;
    if (q->algo == TALLY__ALGO_HIER && !has_levels(c, q->coll))
        return tally__seterr(TALLY_E_INVALID,
                             "sim: hier needs ranks on 2 or more hosts, 2 or more on each, and an allreduce, "
                             "reduce-scatter or all-gather (this is %d x %d)",
                             c->hosts, c->per_host);
    size_t es = tally_dtype_size(q->dtype);
    if (q->bytes % es)
        return tally__seterr(TALLY_E_INVALID, "sim: %zu bytes is not a whole number of %zu-byte elements", q->bytes,
                             es);
    r->algo = pick(c, q);
    if (n > 1 && (rc = run(c, q, r->algo, r))) return rc;
    if (n > 1) r->seconds += c->call_s;                 /* the call itself, on every rank at once */
    if (r->method == TALLY__SIM_FAST && r->seconds > 0) /* the fast path sums link use over its steps */
        for (int k = 0; k < TALLY__SIM_KINDS; k++) r->util[k] /= r->seconds;
    r->algbw = r->seconds > 0 ? (double)q->bytes / r->seconds : 0;
    r->busbw = r->algbw * bus_factor(q->coll, n);
    return 0;
}
