/* plan.h - the planner behind `tally plan`: per-rank memory for each ZeRO stage, communication per
 * algorithm, step time with and without overlap, Amdahl's law; pure functions, no I/O. */
#ifndef TALLY_PLAN_PLAN_H
#define TALLY_PLAN_PLAN_H

#include <stddef.h>

#include "../coll/coll.h"
#include "../sim/sim.h"

typedef enum { TALLY__PLAN_FP32, TALLY__PLAN_MIXED } tally__plan_precision;

/* What to predict. Sizes are counts of parameters; rates and times are SI (bytes/s, seconds). */
typedef struct tally__plan_cfg {
    unsigned long long params;  /* P */
    unsigned long long largest; /* L: parameters of the largest layer (0: unknown, left out) */
    unsigned long long tied;    /* a weight two ops share, which ZeRO-3 keeps a copy of (0: none) */
    int nlayers;                /* layers with parameters: ZeRO 2-3 run their collectives per layer */
    int optimizer;              /* TALLY_OPTIM_SGD (with momentum) or TALLY_OPTIM_ADAMW */
    int precision;              /* tally__plan_precision */
    int zero;                   /* the stage the step time is predicted for (0..3) */
    int workers;                /* N */
    int batch, accum;           /* per rank per micro-batch; micro-batches per step */
    double flops_per_sample;    /* forward + backward */
    double activation_bytes;    /* per rank at `batch` (0: no model given) */
    double gflops;              /* compute rate of one rank */
    double update_s_per_param;  /* measured optimizer update; 0: estimate from memory traffic */
    double bucket_bytes;        /* the DDP engine's bucket (tally train's: TALLY__SYNC_BUCKET_MB_DEFAULT MiB) */
    tally__cost cost;           /* alpha, beta, gamma of the links (inside a host, when hosts are given) */
    int hosts, per_host;        /* > 1 hosts of per_host ranks each: a job of n ranks fills hosts in turn */
    tally__cost net;            /* with hosts: the link between hosts (its gamma unused: reduced on the ranks) */
    int algo;                   /* TALLY__ALGO_AUTO: the cheapest, per collective, as the library picks */
    int local_steps;            /* > 0: --local-steps H, a row of its own among the modes */
    double outer_ratio;         /* its --outer-compress: bytes over f32's (0: 1) */
    /* What only the simulator answers: its fabric (fat tree, oversubscription) and stragglers (slow
     * ranks, drawn compute); the planner fills in the rest of the cluster from the fields above. */
    tally__sim_cluster sim;
} tally__plan_cfg;

/* Defaults of `tally plan`, written in plan.c once (its --help prints them from there): adam, fp32, tally
 * train's batch and bucket, accum 1, the rate of one rank, and the links inside and between hosts. The
 * batch is TALLY__TRAIN_BATCH_DEFAULT too, a layer above: trainer.c holds the two equal. */
#define TALLY__PLAN_BATCH_DEFAULT 64
void tally__plan_cfg_default(tally__plan_cfg *c);

/* Bytes one rank holds. */
typedef struct tally__plan_mem {
    double params, grads, optim; /* shards where the stage shards them */
    double buffers; /* layer-sized: stage 2 gradient staging, stage 3 gathered layers (then their gradients) */
    double state;   /* params + grads + optim + buffers */
    double activations, total; /* total = state + activations */
} tally__plan_mem;

/* ceil(a / n): the largest shard when a elements are cut among n ranks. */
unsigned long long tally__plan_shard(unsigned long long a, int n);
/* Optimizer state bytes per parameter: fp32 4 (SGD momentum) or 8 (Adam m, v); mixed 8 or 12 (the
 * fp32 master copy too, as in the ZeRO paper). */
double tally__plan_optim_bytes(int optimizer, int precision);
/* fp32: what the trainer allocates (memory.h's formulas, which it checks --max-mem against); mixed:
 * the ZeRO paper's 2 + 2 + K bytes per parameter, sharded by stage. */
tally__plan_mem tally__plan_memory(const tally__plan_cfg *c, int stage, int n);
/* S: gradient bytes of one step (4P fp32, 2P mixed). */
double tally__plan_grad_bytes(const tally__plan_cfg *c);

/* One collective pattern's cost: rounds and bytes are the alpha and beta coefficients of the
 * library's cost model (messages and bytes in sequence on the busiest rank), so that
 * seconds = rounds*alpha + bytes*beta + reduced*gamma. sent: what the busiest rank sends as the code
 * does (what tally_comm_bytes_sent counts), -1 where not computed. */
typedef struct tally__plan_comm {
    int algo;
    double rounds, bytes, sent, seconds;
} tally__plan_comm;

/* 1 for an algorithm the plan weighs: hier, or a flat one with an allreduce (not all-to-all's pairwise and
 * bruck, which would stand for the model's choice). */
int tally__plan_weighs(int algo);
/* An allreduce of S bytes over n ranks with one algorithm (not AUTO). */
tally__plan_comm tally__plan_allreduce(const tally__cost *m, int algo, int n, double S);
/* The same on c's layout of n ranks: on one host, c->cost; across hosts, the flat algorithms cross
 * the slower link (both links' larger alpha and beta) and TALLY__ALGO_HIER runs by level (the library's
 * hier.c steps, each level's cheapest algorithm), when n fills whole hosts of two or more; AUTO picks as
 * the library does. */
tally__plan_comm tally__plan_allreduce_on(const tally__plan_cfg *c, int algo, int n, double S);
/* Whether c's layout of n ranks has levels (TALLY__ALGO_HIER applies). */
int tally__plan_has_levels(const tally__plan_cfg *c, int n);
/* Bytes the busiest rank sends in an allreduce of S bytes, as the algorithm's code does (its
 * descriptor's formula); -1 where it has none. */
double tally__plan_sent(int algo, int n, double S);
/* The gradient (and, stages 1-3, parameter) traffic of one step of ZeRO stage `stage`:
 * 0 allreduce in buckets; 1 reduce-scatter + all-gather once a step; 2 reduce-scatter per layer each
 * micro-batch + all-gather once; 3 two all-gathers and a reduce-scatter per layer each micro-batch. */
tally__plan_comm tally__plan_step_comm(const tally__plan_cfg *c, int stage, int algo, int n);
/* c->algo, or the concrete algorithm with the cheapest step_comm. */
int tally__plan_pick_algo(const tally__plan_cfg *c, int stage, int n);

/* One step of c->batch x c->accum samples per rank on n ranks, at stage c->zero. */
typedef struct tally__plan_step {
    int n, algo;
    double forward, backward, compute; /* compute = forward + backward, all micro-batches */
    double update;                     /* optimizer over this rank's (shard of the) parameters */
    double comm;                       /* all of the step's collectives */
    double comm_last;                  /* what cannot overlap: the last bucket (stage 0), all (1-3) */
    int buckets;
    double t_sum;         /* compute + comm + update: no overlap */
    double t_max;         /* compute - last backward + max(last backward, comm) + update */
    double t_pred;        /* as the engine overlaps: only buckets before the last hide */
    double parallel;      /* what splits across ranks: compute (+ the update ZeRO shards) */
    double serial;        /* the rest of t_pred: exposed comm, a replicated update */
    double samples_per_s; /* n x batch x accum / t_pred */
} tally__plan_step;
tally__plan_step tally__plan_step_time(const tally__plan_cfg *c, int n);

/* Amdahl: the parallel fraction of step s on its n ranks. The work of one step of the global batch
 * done by one worker is n x parallel + serial, of which n x parallel splits across ranks:
 * P = n c / (n c + s), c = s->parallel, s = s->serial. */
/* Calibration: the beta (seconds per byte) that makes the model's cheapest allreduce of S bytes on n
 * ranks take `seconds`, alpha and gamma kept; the model's own beta when that would need less than 0.
 * Links measured by a ping-pong of small messages miss what a real allreduce of the gradient costs
 * (the copies and reductions in memory); this fits beta to one. */
double tally__plan_fit_beta(const tally__cost *m, int n, double S, double seconds);

double tally__plan_parallel_fraction(const tally__plan_step *s);

/* ---- what the closed forms cannot answer (plan_sim.c) ---- */

/* Why c's layout of n ranks needs the simulator, in words ("hierarchical layout, stragglers"), or ""
 * when the closed forms answer it: levels (hosts of 2 or more ranks), an oversubscribed fat tree, slow
 * ranks or drawn compute. Returns 1 when it does. */
int tally__plan_needs_sim(const tally__plan_cfg *c, int n, char *why, size_t len);
typedef struct tally__plan_simulated {
    double step_s, comm_s, exposed_s, samples_per_s;
    int method;    /* TALLY__SIM_EVENT or _FAST: how its largest collective was played */
    int algo;      /* of its largest collective */
    int pace_rank; /* the rank that set the pace most often, -1 none */
    double pace_share;
} tally__plan_simulated;
/* One step of c on n ranks played by the simulator (tally__sim_train_step) with the closed form's own
 * compute and update (s); 0, or an error with a message. */
int tally__plan_simulate(const tally__plan_cfg *c, int n, const tally__plan_step *s, tally__plan_simulated *out);
/* ---- local SGD (local.c) ---- */

/* One step of local SGD (tally train --local-steps H): compute and update alone, and every H steps one
 * allreduce of the parameters in f32 x ratio (fp16 0.5, int8 0.25) that nothing hides, amortized. */
typedef struct tally__plan_local {
    int H;                 /* 0: synchronous training (the pick's answer when it keeps sync) */
    double ratio;          /* the averaged change's bytes over f32's */
    double comm;           /* the averaging's seconds per step */
    double bytes_per_step; /* what a rank sends per step */
    double t_step, comm_share, samples_per_s;
} tally__plan_local;
tally__plan_local tally__plan_local_step(const tally__plan_cfg *c, int n, int H, double ratio);
/* The share of sync's predicted step that is communication left exposed. */
double tally__plan_sync_comm_share(const tally__plan_step *s);
/* The mode the planner would train in: sync while its exposed communication is at most
 * TALLY__PLAN_COMM_SHARE_OK of its step; else local SGD at the smallest H (2, 4, ... up to
 * TALLY__PLAN_LOCAL_MAX_H, f32 first, then int8) whose averaging is at most that share; else the largest
 * H in int8. Speed only: fewer averagings cost quality per step, which BENCHMARKS.md measures. */
#define TALLY__PLAN_COMM_SHARE_OK 0.10
#define TALLY__PLAN_LOCAL_MAX_H   512
tally__plan_local tally__plan_pick_mode(const tally__plan_cfg *c, int n);

double tally__plan_amdahl(double p, int n); /* 1 / ((1-p) + p/n) */
double tally__plan_ceiling(double p);       /* 1 / (1-p); HUGE_VAL when p == 1 */

#endif
