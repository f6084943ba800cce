/* plan.c - the planner's model: memory per rank by ZeRO stage, the traffic and time of each
 * algorithm (from the library's own cost model), step time with and without overlap, Amdahl's law. */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <tally/optim.h>

#include "../coll/algo.h"
#include "../coll/hier.h"
#include "../core/sig.h"
#include "../dp/sync.h"
#include "memory.h"

void tally__plan_cfg_default(tally__plan_cfg *c) {
    memset(c, 0, sizeof *c);
    c->nlayers = 0;
    c->optimizer = TALLY_OPTIM_ADAMW;
    c->precision = TALLY__PLAN_FP32;
    c->workers = 1;
    c->batch = TALLY__PLAN_BATCH_DEFAULT;
    c->accum = 1;
    c->gflops = 100;
    c->bucket_bytes = TALLY__SYNC_BUCKET_MB_DEFAULT * 1048576.0; /* tally train's, as PyTorch DDP's */
    c->cost = (tally__cost){.alpha = 5e-6, .beta = 8.0 / 25e9, .gamma = 1.0 / 10e9};
    c->net = (tally__cost){.alpha = 20e-6, .beta = 8.0 / 10e9, .gamma = 1.0 / 10e9};
    c->algo = TALLY__ALGO_AUTO;
    tally__sim_cluster_default(&c->sim);
}

/* ---- memory ---- */

unsigned long long tally__plan_shard(unsigned long long a, int n) {
    return n <= 1 ? a : (a + (unsigned long long)n - 1) / (unsigned long long)n;
}

double tally__plan_optim_bytes(int optimizer, int precision) {
    int adam = optimizer == TALLY_OPTIM_ADAMW;
    if (precision == TALLY__PLAN_MIXED) return adam ? 12 : 8; /* + the fp32 master copy */
    return adam ? 8 : 4;
}

/* fp32 is what the trainer runs: memory.h's formulas, the ones it checks --max-mem against. */
static tally__plan_mem memory_fp32(const tally__plan_cfg *c, int stage, int n) {
    tally__model_desc d = {.nparams = (size_t)c->params,
                           .nlayers = c->nlayers,
                           .largest_layer = (size_t)c->largest,
                           .tied_floats = (size_t)c->tied,
                           .activation_bytes = (size_t)c->activation_bytes};
    tally_optim_cfg o;
    tally_optim_cfg_default(&o, c->optimizer == TALLY_OPTIM_ADAMW ? TALLY_OPTIM_ADAMW : TALLY_OPTIM_SGD);
    tally__mem_need m = tally__mem_predict(&d, stage, n, &o, 1); /* the trainer overlaps by default */
    return (tally__plan_mem){
        .params = (double)m.params, .grads = (double)m.grads, .optim = (double)m.optim, .buffers = (double)m.buffers};
}

/* The ZeRO paper's mixed precision: fp16 parameters and gradients, K bytes of fp32 state. */
static tally__plan_mem memory_mixed(const tally__plan_cfg *c, int stage, int n) {
    double P = (double)c->params, sh = (double)tally__plan_shard(c->params, n);
    double K = tally__plan_optim_bytes(c->optimizer, TALLY__PLAN_MIXED);
    return (tally__plan_mem){
        .params = 2 * (stage == 3 ? sh : P), .grads = 2 * (stage >= 2 ? sh : P), .optim = K * (stage >= 1 ? sh : P)};
}

tally__plan_mem tally__plan_memory(const tally__plan_cfg *c, int stage, int n) {
    tally__plan_mem m = c->precision == TALLY__PLAN_MIXED ? memory_mixed(c, stage, n) : memory_fp32(c, stage, n);
    m.state = m.params + m.grads + m.optim + m.buffers;
    m.activations = c->activation_bytes;
    m.total = m.state + m.activations;
    return m;
}

double tally__plan_grad_bytes(const tally__plan_cfg *c) {
    return (c->precision == TALLY__PLAN_MIXED ? 2.0 : 4.0) * (double)c->params;
}

/* ---- communication ---- */

/* The library's model with chosen coefficients: (1,0,0) counts rounds, (0,1,0) bytes in sequence. */
static double model_at(int algo, int coll, int n, double bytes, double a, double b, double g) {
    tally__cost m = {.alpha = a, .beta = b, .gamma = g};
    return tally__algo_cost(&m, algo, coll, n, (size_t)bytes);
}

/* Adds `times` collectives of `bytes` on one link class to acc, AUTO resolved as the library does. */
static void comm_add(tally__plan_comm *acc, const tally__cost *m, int algo, int coll, int n, double bytes,
                     double times) {
    if (times <= 0 || n <= 1) return;
    const tally__algo_desc *d = tally__algo_get(algo); /* a flat one that has the collective, or the model's */
    int a = d && tally__algo_has(d, coll) ? algo : tally__algo_choose(m, coll, n, (size_t)bytes);
    acc->rounds += times * model_at(a, coll, n, bytes, 1, 0, 0);
    acc->bytes += times * model_at(a, coll, n, bytes, 0, 1, 0);
    acc->seconds += times * tally__algo_cost(m, a, coll, n, (size_t)bytes);
    double sent = coll == TALLY__ALLREDUCE ? tally__plan_sent(a, n, bytes) : -1;
    if (acc->sent >= 0) acc->sent = sent >= 0 ? acc->sent + times * sent : -1;
}

int tally__plan_has_levels(const tally__plan_cfg *c, int n) {
    return c->hosts > 1 && c->per_host >= 2 && n > c->per_host && n % c->per_host == 0;
}

/* The flat algorithms' link on n ranks of c's layout: inside a host, or across the slower of both. */
static tally__cost flat_link(const tally__plan_cfg *c, int n) {
    tally__cost m = c->cost;
    if (c->hosts > 1 && n > (c->per_host > 0 ? c->per_host : 1)) {
        m.alpha = fmax(m.alpha, c->net.alpha);
        m.beta = fmax(m.beta, c->net.beta);
        m.share = c->per_host;
    }
    return m;
}

static tally__hier levels_of(const tally__plan_cfg *c, int n) {
    tally__hier h = {.hosts = n / c->per_host, .per_host = c->per_host, .host_cost = c->cost, .cross_cost = c->net};
    h.cross_cost.gamma = c->cost.gamma;
    tally__hier_share_link(&h);
    return h;
}

/* Adds `times` collectives of `bytes` on c's layout of n ranks: flat, or by level (each step with its
 * level's rounds and bytes; sent not computed), AUTO taking the cheaper. */
static void layout_add(tally__plan_comm *acc, const tally__plan_cfg *c, int algo, int coll, int n, double bytes,
                       double times) {
    tally__cost flat = flat_link(c, n);
    tally__hier h = tally__plan_has_levels(c, n) ? levels_of(c, n) : (tally__hier){0};
    double by_level = h.hosts ? tally__hier_cost(&h, coll, (size_t)bytes) : HUGE_VAL;
    int hier = by_level < HUGE_VAL &&
               (algo == TALLY__ALGO_HIER ||
                (algo == TALLY__ALGO_AUTO &&
                 tally__algo_choose_levels(&flat, by_level, coll, n, (size_t)bytes) == TALLY__ALGO_HIER));
    if (!hier) {
        comm_add(acc, &flat, algo, coll, n, bytes, times);
        return;
    }
    tally__hier_step st[3];
    tally__hier_steps(&h, coll, (size_t)bytes, st);
    for (int k = 0; k < 3; k++)
        if (st[k].cost && times > 0) {
            acc->rounds += times * model_at(st[k].algo, st[k].coll, st[k].n, (double)st[k].bytes, 1, 0, 0);
            acc->bytes += times * model_at(st[k].algo, st[k].coll, st[k].n, (double)st[k].bytes, 0, 1, 0);
        }
    if (times > 0) acc->seconds += times * by_level; /* a pipelined allreduce's levels overlap */
    acc->sent = -1;
}

double tally__plan_sent(int algo, int n, double S) {
    const tally__algo_desc *d = tally__algo_get(algo);
    if (n <= 1) return 0;
    return d && d->sent ? d->sent(n, S) : -1;
}

tally__plan_comm tally__plan_allreduce(const tally__cost *m, int algo, int n, double S) {
    tally__plan_comm r = {.algo = algo};
    comm_add(&r, m, algo, TALLY__ALLREDUCE, n, S, 1);
    return r;
}

tally__plan_comm tally__plan_allreduce_on(const tally__plan_cfg *c, int algo, int n, double S) {
    tally__plan_comm r = {.algo = algo};
    layout_add(&r, c, algo, TALLY__ALLREDUCE, n, S, 1);
    return r;
}

/* Stage 0: the DDP engine allreduces buckets of bucket_bytes (the last one shorter). */
static double bucket_count(const tally__plan_cfg *c, double S) {
    double b = c->bucket_bytes > 0 ? c->bucket_bytes : S;
    return S > 0 && b > 0 ? ceil(S / b) : 1;
}

static double last_bucket(const tally__plan_cfg *c, double S) {
    double nb = bucket_count(c, S);
    return S - (nb - 1) * (c->bucket_bytes > 0 ? c->bucket_bytes : S);
}

/* Stages 1-3 as zero.c runs them: layer by layer when the layers are known (all alike here), else as
 * one vector. Stage 3 gathers each layer for forward and again for backward, except where the layer
 * is still in place (the last layer's forward serves its backward, the first layer's backward the
 * next micro-batch's forward). */
static void zero_comm(tally__plan_comm *r, const tally__plan_cfg *c, int stage, int algo, int n, double S) {
    double K = c->accum, nl = c->nlayers > 0 ? c->nlayers : 1, per = S / nl;
    double rs = stage == 1 ? nl : K * nl, ag = stage == 3 ? K * (2 * nl) : nl;
    if (stage == 3 && c->nlayers > 0) ag = K * (2 * nl - 1) - (K - 1);
    layout_add(r, c, algo, TALLY__REDUCE_SCATTER, n, per, rs);
    layout_add(r, c, algo, TALLY__ALLGATHER, n, per, ag);
}

tally__plan_comm tally__plan_step_comm(const tally__plan_cfg *c, int stage, int algo, int n) {
    tally__plan_comm r = {.algo = algo};
    double S = tally__plan_grad_bytes(c);
    if (stage == 0) {
        double nb = bucket_count(c, S), last = last_bucket(c, S);
        layout_add(&r, c, algo, TALLY__ALLREDUCE, n, nb > 1 ? c->bucket_bytes : last, nb - 1);
        layout_add(&r, c, algo, TALLY__ALLREDUCE, n, last, 1);
    } else {
        r.sent = -1;
        zero_comm(&r, c, stage, algo, n, S);
    }
    return r;
}

int tally__plan_weighs(int algo) {
    const tally__algo_desc *d = tally__algo_get(algo);
    return algo == TALLY__ALGO_HIER || (d && d->allreduce);
}

int tally__plan_pick_algo(const tally__plan_cfg *c, int stage, int n) {
    if (c->algo != TALLY__ALGO_AUTO) return c->algo;
    int best = tally__algo_next(TALLY__ALGO_AUTO);
    double best_s = HUGE_VAL;
    for (int a = best; a >= 0; a = tally__algo_next(a)) {
        if (a == TALLY__ALGO_HIER && !tally__plan_has_levels(c, n)) continue;
        if (!tally__plan_weighs(a)) continue;
        double s = tally__plan_step_comm(c, stage, a, n).seconds;
        if (s < best_s) best = a, best_s = s;
    }
    return best;
}

/* ---- step time ---- */

/* Seconds of the optimizer update per parameter: measured, or the traffic it streams ((12 + 2k) bytes
 * in fp32: read the gradient, read and write parameter and state) at the reduction kernel's rate
 * (1/gamma is bytes reduced per second, each of which streams three: two reads, one write). */
static double update_s_per_param(const tally__plan_cfg *c) {
    if (c->update_s_per_param > 0) return c->update_s_per_param;
    double k = tally__plan_optim_bytes(c->optimizer, c->precision);
    double traffic = c->precision == TALLY__PLAN_MIXED ? 4 + 2 * k : 12 + 2 * k;
    return traffic * c->cost.gamma / 3;
}

tally__plan_step tally__plan_step_time(const tally__plan_cfg *c, int n) {
    tally__plan_step s = {.n = n};
    double K = c->accum > 0 ? c->accum : 1;
    s.compute = c->gflops > 0 ? c->flops_per_sample * c->batch * K / (c->gflops * 1e9) : 0;
    s.forward = s.compute / 3; /* backward computes two products per forward one */
    s.backward = s.compute - s.forward;
    double updated = (double)(c->zero >= 1 ? tally__plan_shard(c->params, n) : c->params);
    s.update = updated * update_s_per_param(c);
    s.algo = tally__plan_pick_algo(c, c->zero, n);
    tally__plan_comm cm = tally__plan_step_comm(c, c->zero, c->algo, n);
    s.comm = cm.seconds;
    double S = tally__plan_grad_bytes(c);
    s.buckets = c->zero == 0 ? (int)bucket_count(c, S) : 0;
    s.comm_last = c->zero == 0 ? tally__plan_allreduce_on(c, c->algo, n, last_bucket(c, S)).seconds : s.comm;
    double bwd_last = s.backward / K; /* the engine reduces during the last micro-batch only */
    s.t_sum = s.compute + s.comm + s.update;
    s.t_max = s.compute - bwd_last + fmax(bwd_last, s.comm) + s.update;
    s.t_pred = s.compute - bwd_last + fmax(bwd_last, s.comm - s.comm_last) + s.comm_last + s.update;
    s.parallel = s.compute + (c->zero >= 1 ? s.update : 0);
    s.serial = s.t_pred - s.parallel;
    s.samples_per_s = s.t_pred > 0 ? n * (double)c->batch * K / s.t_pred : 0;
    return s;
}

/* ---- Amdahl ---- */

double tally__plan_parallel_fraction(const tally__plan_step *s) {
    double par = s->n * s->parallel, all = par + s->serial;
    return all > 0 ? par / all : 1;
}

double tally__plan_amdahl(double p, int n) { return 1.0 / ((1 - p) + p / n); }

double tally__plan_ceiling(double p) { return p < 1 ? 1.0 / (1 - p) : HUGE_VAL; }

double tally__plan_fit_beta(const tally__cost *m, int n, double S, double seconds) {
    tally__cost lo = *m, hi = *m;
    lo.beta = 0;
    hi.beta = 1e-9;
    int a = tally__algo_choose(m, TALLY__ALLREDUCE, n, (size_t)S);
    double c0 = tally__algo_cost(&lo, a, TALLY__ALLREDUCE, n, (size_t)S);
    double slope = (tally__algo_cost(&hi, a, TALLY__ALLREDUCE, n, (size_t)S) - c0) / 1e-9; /* linear in beta */
    if (!(seconds > c0) || !(slope > 0)) return m->beta;
    return (seconds - c0) / slope;
}
