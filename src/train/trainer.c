/* trainer.c - one rank's synchronous data-parallel training run: sampler, micro-batches, the engine's
 * averaged gradients, the optimizer step, evaluation each epoch, and the figures of the summary. */
#include "trainer.h"

#include <cblas.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/resource.h>
#include <tally/ddp.h>

#include "../core/clock.h"
#include "../core/cpus.h"
#include "../core/err.h"
#include "../core/trace.h"
#include "ckpt_train.h"
#include "../plan/calibrate.h"
#include "../plan/memory.h"
#include "../plan/plan.h"
#include "../ps/ps.h"
#include "train_seam.h"
#include "trainer_int.h"

_Static_assert(TALLY__TRAIN_BATCH_DEFAULT == TALLY__PLAN_BATCH_DEFAULT,
               "tally plan predicts tally train's default run");

void tally__train_cfg_default(tally__train_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->model.kind = TALLY__MODEL_MLP;
    cfg->data.source = TALLY__TRAIN_DATA_DEFAULT;
    cfg->data.val_frac = TALLY__TRAIN_VAL_FRAC_DEFAULT;
    cfg->data.val_windows = TALLY__TRAIN_VAL_WINDOWS_DEFAULT;
    cfg->data.linear_samples = TALLY__TRAIN_LINEAR_SAMPLES_DEFAULT;
    cfg->data.synthetic_train = TALLY__TRAIN_SYNTHETIC_TRAIN_DEFAULT;
    cfg->data.synthetic_test = TALLY__TRAIN_SYNTHETIC_TEST_DEFAULT;
    cfg->epochs = TALLY__TRAIN_EPOCHS_DEFAULT;
    cfg->batch = TALLY__TRAIN_BATCH_DEFAULT;
    cfg->sync.accum = 1;
    cfg->sync.bucket_mb = TALLY__SYNC_BUCKET_MB_DEFAULT;
    cfg->ckpt.keep = TALLY__CKPT_KEEP_DEFAULT;
    tally_optim_cfg_default(&cfg->opt.optim, TALLY_OPTIM_SGD);
    cfg->opt.decay = TALLY_DECAY_NONE;
    cfg->opt.step_gamma = 0.1f;
    cfg->eval = 1;
    cfg->threads = TALLY__TRAIN_THREADS_DEFAULT;
    cfg->async.stale_lr = TALLY__STALE_LR_AUTO;
    cfg->sync.codec.error_feedback = 1;
    cfg->local.outer_lr = TALLY__LOCAL_OUTER_LR_DEFAULT;
    cfg->local.outer_momentum = TALLY__LOCAL_OUTER_MOMENTUM_DEFAULT;
}

void tally__train_gpt_defaults(tally__train_cfg *c, unsigned given) {
    if (!(given & TALLY__GIVEN_OPTIM)) {
        tally_optim_cfg_default(&c->opt.optim, TALLY_OPTIM_ADAMW);
        c->opt.optim.beta2 = TALLY__GPT_BETA2_DEFAULT;
        if (!(given & TALLY__GIVEN_WD)) c->opt.optim.weight_decay = TALLY__GPT_WEIGHT_DECAY_DEFAULT;
    }
    if (!(given & TALLY__GIVEN_WD_ON) && !c->async.enabled) c->sync.decay_matrices = 1;
    if (!(given & TALLY__GIVEN_CLIP) && !c->async.enabled) c->opt.clip = TALLY__GPT_CLIP_DEFAULT;
    if (!(given & TALLY__GIVEN_WARMUP)) c->opt.warmup_frac = TALLY__GPT_WARMUP_FRAC_DEFAULT;
    if (!(given & TALLY__GIVEN_DECAY)) c->opt.decay = TALLY_DECAY_COSINE;
    if (!(given & TALLY__GIVEN_MIN_LR)) c->opt.min_lr = TALLY__GPT_MIN_LR_DEFAULT;
}

void tally__train_cnn_defaults(tally__train_cfg *c, unsigned given) {
    if (!(given & TALLY__GIVEN_BATCH)) c->batch = TALLY__CNN_BATCH_DEFAULT;
    if (!(given & TALLY__GIVEN_WD) && c->opt.optim.kind == TALLY_OPTIM_SGD)
        c->opt.optim.weight_decay = TALLY__CNN_WEIGHT_DECAY_DEFAULT;
    if (!(given & TALLY__GIVEN_DECAY)) c->opt.decay = TALLY_DECAY_COSINE;
    if (!(given & TALLY__GIVEN_NORMALIZE)) c->data.standardize = 1;
}

/* Refuses up front, with the figures, a run whose model state and activations exceed --max-mem. */
static int train_check_memory(train_run *r, const tally__model_cfg *mc) {
    const tally__train_cfg *cfg = r->cfg;
    if (!cfg->max_mem) return 0;
    tally__model_desc d;
    int rc = tally__model_describe(mc, cfg->batch, &d);
    if (rc) return rc;
    if (cfg->bf16) d.activation_bytes += d.bf16_bytes; /* the linear layers' bf16 copies */
    tally__mem_need need = tally__mem_predict(&d, cfg->sync.zero, r->size, &cfg->opt.optim, !cfg->sync.no_overlap);
    if (need.total <= cfg->max_mem) return 0;
    return tally__seterr(TALLY_E_NOMEM,
                         "rank %d: ZeRO stage %d needs %zu bytes per rank (parameters %zu, gradients %zu, optimizer "
                         "%zu, layer buffers %zu, activations %zu) and --max-mem allows %zu; use a higher --zero "
                         "stage, more ranks, or a smaller model or batch",
                         r->rank, cfg->sync.zero, need.total, need.params, need.grads, need.optim, need.buffers,
                         need.activations, cfg->max_mem);
}

int tally__train_dgc_check(const tally__train_cfg *cfg, int rank) {
    if (cfg->sync.codec.kind != TALLY__CODEC_DGC || cfg->opt.optim.kind == TALLY_OPTIM_SGD) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "rank %d: --compress dgc:R corrects SGD's momentum, and this run's optimizer is %s: use "
                         "--optimizer sgd, or --compress topk:R",
                         rank, tally_optim_name(cfg->opt.optim.kind));
}

/* --compress dgc:R: the codec applies SGD's momentum before it selects (momentum correction), so the
 * optimizer runs without; --clip becomes each rank's clipping of its own gradient; the density warms up
 * over the first TALLY__TRAIN_DGC_WARMUP_FRAC of the run's steps. */
#define TALLY__TRAIN_DGC_WARMUP_FRAC 0.1
static int train_dgc_cfg(const train_run *r, tally__sync_cfg *sc, tally_optim_cfg *oc) {
    const tally__train_cfg *cfg = r->cfg;
    if (sc->codec.kind != TALLY__CODEC_DGC) return 0;
    int rc = tally__train_dgc_check(cfg, r->rank);
    if (rc) return rc;
    long total = tally__train_total_steps(r, NULL);
    sc->codec.momentum = oc->momentum;
    sc->codec.clip = cfg->opt.clip;
    sc->codec.warmup_steps = (long)(TALLY__TRAIN_DGC_WARMUP_FRAC * (double)total);
    oc->momentum = 0;
    oc->nesterov = 0;
    return 0;
}

static int train_setup(train_run *r, tally__train_result *res) {
    const tally__train_cfg *cfg = r->cfg;
    int rc = tally__train_load_data(r, res);
    if (rc) return rc;
    tally__model_cfg mc;
    tally__train_model_cfg(r, &mc);
    if (r->tokens) {
        r->steps_per_epoch = tally__train_text_steps_per_epoch(r, mc.in_dim, r->size);
    } else {
        if ((rc = tally_sampler_init(&r->sampler, r->train.n, r->rank, r->size, cfg->seed, 1))) return rc;
        size_t per_step = (size_t)cfg->batch * cfg->sync.accum;
        r->steps_per_epoch = (long)(tally_sampler_len(&r->sampler) / per_step);
        if (r->steps_per_epoch < 1)
            return tally__seterr(TALLY_E_INVALID,
                                 "rank %d: %zu training samples per rank cannot fill one step of batch %d x accum %d;"
                                 " use a smaller --batch or --accum, or fewer ranks",
                                 r->rank, tally_sampler_len(&r->sampler), cfg->batch, cfg->sync.accum);
    }
    if ((rc = train_check_memory(r, &mc))) return rc;
    if (cfg->check_replicas > 0 && cfg->sync.zero == 3)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: --check-replicas compares whole replicas, and under --zero 3 each rank holds "
                             "only its shard of the parameters; use it with --zero 0, 1 or 2",
                             r->rank);
    if ((rc = tally__codec_check(&cfg->sync.codec, cfg->sync.zero, r->rank))) return rc;
    /* Local SGD: each rank's engine, NaN guard and learning rate are its own; the world averages. */
    int local = cfg->local.steps > 0;
    if (local && (rc = tally_comm_split(r->comm, r->rank, 0, &r->solo))) return rc;
    tally_comm *engine = local ? r->solo : r->comm;
    tally__sync_cfg sc = cfg->sync;
    tally_optim_cfg oc = cfg->opt.optim;
    if ((rc = train_dgc_cfg(r, &sc, &oc))) return rc;
    if ((rc = tally__sync_open(&r->sync, engine, &r->model, &mc, cfg->batch, &sc, &oc, cfg->seed))) return rc;
    if (local && ((rc = tally_ddp_sync_params(r->comm, r->model.params, r->model.nparams)) ||
                  (rc = tally__local_open(&r->local, &cfg->local, r->comm, &r->sync))))
        return rc;
    if ((rc = tally__train_precision(cfg, &r->model, r->rank))) return rc;
    if ((rc = tally__train_check_input(r))) return rc;
    r->hooks = tally__sync_hooks(&r->sync);
    tally__codec_spec(&cfg->sync.codec, res->codec, sizeof res->codec);
    res->grad_bytes_f32_step = r->sync.f32_bytes_step;
    res->local_steps = cfg->local.steps;
    res->f32_bytes_step = r->local.f32_bytes;
    if ((rc = tally__guard_init(&r->guard, engine, &r->model, (tally__nan_policy)cfg->sync.nan_policy, &r->hooks)))
        return rc;
    if ((rc = tally__train_prepare_steps(r, res, local ? 1 : r->size))) return rc;
    r->saved_step = -1;
    if (cfg->ckpt.dir && (rc = tally__train_ckpt_check_names(r))) return rc;
    if (cfg->ckpt.dir && (rc = cfg->ckpt.resume ? tally__train_ckpt_resume(r) : tally__train_ckpt_check_fresh(r)))
        return rc;
    res->resumed_from = r->saved_step;
    return 0;
}

typedef struct step_times {
    double data, compute, update;
    double compute_sq;        /* the sum of each step's compute squared: its spread from step to step */
    double wait;              /* blocked on the gradients' communication */
    double comm;              /* in the gradients' collectives (on whichever thread) */
    unsigned long long bytes; /* sent in the steps' collectives */
    double loss;
    long skipped; /* steps every rank skipped for a NaN or Inf gradient */
} step_times;

/* Ends the step without an update when some rank's gradient was NaN or Inf (one allreduce of a flag
 * per rank: every rank decides alike). *skip says whether it did. */
static int train_agree_finite(train_run *r, long step, int *skip) {
    *skip = 0;
    if (r->cfg->sync.nan_policy == TALLY__NAN_IGNORE) return 0;
    int rc = tally__sync_drain(&r->sync); /* the flag's allreduce needs the communicator idle */
    if (!rc) tally__train_codec_check_overflow(r, step);
    if (!rc) rc = tally__guard_agree(&r->guard, r->sync.comm, step, skip); /* local SGD: this rank's alone */
    if (rc || !*skip) return rc;
    return tally__sync_skip(&r->sync);
}

/* A span of the training loop on the timeline (step counted from 1, as the summary counts it). */
static void train_trace(const char *name, long step, uint64_t t0) {
    tally__trace_arg args[] = {{"step", NULL, step + 1}};
    tally__trace_span("train", name, t0, tally__trace_now(), args, 1);
}

static int train_step(train_run *r, long step, size_t pos, step_times *st) {
    uint64_t t_step = tally__trace_on ? tally__trace_now() : 0;
    const tally__train_cfg *cfg = r->cfg;
    int B = cfg->batch, rc;
    size_t *idx = r->idx;
    unsigned long long sent0 = tally_comm_bytes_sent(r->comm);
    double compute0 = st->compute;
    tally__sync_stats s0, s2;
    tally__sync_stats_get(&r->sync, &s0); /* between steps: nothing in flight */
    double blocked0 = tally__sync_blocked(&r->sync);
    double loss0 = st->loss;
    tally__guard_begin(&r->guard);
    tally__sync_step_begin(&r->sync);
    for (int k = 0; k < cfg->sync.accum; k++) {
        uint64_t t0 = tally__now_ns();
        if (r->tokens) {
            tally__train_text_batch(r, step, k, r->rank, r->size);
        } else {
            for (int s = 0; s < B; s++) idx[s] = tally_sampler_index(&r->sampler, pos + (size_t)k * B + s);
            tally__train_gather(r, &r->train, idx, B);
        }
        if (!r->tokens) tally__train_seam_batch(r->rank, step + 1, k, r->xb, (size_t)B * r->model.cfg.in_dim);
        uint64_t t1 = tally__now_ns();
        if (tally__trace_on) train_trace("data", step, t0);
        if ((rc = tally__sync_micro_begin(&r->sync, k))) return rc;
        if (k == 0) tally__train_straggle(cfg, r->rank, step);
        float loss;
        if ((rc = tally__model_forward(&r->model, r->xb, r->yb, r->tb, B, &r->hooks, &loss))) return rc;
        st->loss += loss / cfg->sync.accum;
        if (r->tokens) /* token indices cannot hold a NaN: the softmax's output can */
            tally__train_seam_batch(r->rank, step + 1, k, r->model.probs, (size_t)B * r->model.cfg.in_dim);
        if ((rc = tally__model_backward(&r->model, r->yb, r->tb, B, &r->hooks))) return rc;
        uint64_t t2 = tally__now_ns();
        if ((rc = tally__sync_micro_end(&r->sync))) return rc;
        if (tally__trace_on) train_trace("wait for gradients", step, t2);
        st->data += (double)(t1 - t0) * 1e-9;
        st->compute += (double)(t2 - t1) * 1e-9;
    }
    double blocked1 = tally__sync_blocked(&r->sync); /* reductions may still run: only our own counter */
    uint64_t t3 = tally__now_ns();
    float lr = tally_lr_at(&r->sched, step);
    int skip;
    if ((rc = train_agree_finite(r, step, &skip))) return rc;
    double norm = 0;
    int clip = cfg->opt.clip > 0 && cfg->sync.codec.kind != TALLY__CODEC_DGC; /* dgc clips on each rank */
    if (!skip && clip && (rc = tally__sync_clip(&r->sync, cfg->opt.clip, &norm))) return rc;
    tally__sync_step_end(&r->sync, !skip);
    if (skip) {
        st->loss = loss0; /* a NaN does not belong in the mean loss */
        st->skipped++;
    } else if ((rc = tally__sync_apply(&r->sync, lr))) {
        return rc;
    }
    tally__train_seam_updated(r->rank, step + 1, r->model.params, r->model.nparams);
    st->update += (double)(tally__now_ns() - t3) * 1e-9;
    if (tally__trace_on) {
        train_trace("optimizer", step, t3);
        train_trace("step", step, t_step);
    }
    /* ZeRO's waits for communication happen inside the passes and the update: count them as
     * waiting, not work. The counters are read once the step has drained every collective. */
    double blocked2 = tally__sync_blocked(&r->sync);
    tally__sync_stats_get(&r->sync, &s2);
    st->compute -= blocked1 - blocked0;
    st->compute_sq += (st->compute - compute0) * (st->compute - compute0);
    st->update -= blocked2 - blocked1;
    st->wait += s2.wait_s - s0.wait_s;
    st->comm += s2.comm_s - s0.comm_s;
    st->bytes += tally_comm_bytes_sent(r->comm) - sent0;
    return 0;
}

/* --local-steps: after a step, the round ends when it has had H steps, at an epoch's end (evaluation and
 * checkpoints see one model) and at the run's last step; its averaging counts as waiting for
 * communication. */
static int train_local_round(train_run *r, long step, int must, step_times *st) {
    if (++r->local.since < r->cfg->local.steps && !must) return 0;
    uint64_t t0 = tally__now_ns();
    double s0 = r->local.seconds;
    unsigned long long b0 = r->local.bytes;
    int rc = tally__local_average(&r->local);
    if (tally__trace_on) train_trace("average", step, t0);
    st->wait += r->local.seconds - s0;
    st->comm += r->local.seconds - s0;
    st->bytes += r->local.bytes - b0;
    return rc;
}

/* After step `done` (counted from 1): a checkpoint when one is due. */
static int train_maybe_save(train_run *r, long done, int last) {
    const tally__train_cfg *cfg = r->cfg;
    if (!cfg->ckpt.dir || r->saved_step == done) return 0;
    if (!last && !r->ckpt_pending && !(cfg->ckpt.every > 0 && done % cfg->ckpt.every == 0)) return 0;
    if (r->solo && r->local.since) { /* the replicas differ inside a round: a checkpoint holds its end */
        r->ckpt_pending = 1;
        return 0;
    }
    r->ckpt_pending = 0;
    uint64_t t0 = tally__trace_on ? tally__trace_now() : 0;
    int rc = tally__train_ckpt_save(r, done);
    if (tally__trace_on) train_trace("checkpoint", done - 1, t0);
    return rc;
}

static int train_epochs(train_run *r, tally__train_result *res) {
    const tally__train_cfg *cfg = r->cfg;
    long step = r->start_step, total = r->sched.total_steps;
    double samples_per_step = (double)cfg->batch * cfg->sync.accum * r->size;
    step_times st = {0};
    tally__sync_stats s0;
    tally__sync_stats_get(&r->sync, &s0);
    tally__train_tell(r, &(tally__train_event){.kind = TALLY__TRAIN_BEGIN, .step = step, .total_steps = total});
    for (int epoch = r->start_epoch; epoch < r->epochs && step < total; epoch++) {
        if (!r->tokens) tally_sampler_set_epoch(&r->sampler, epoch);
        r->epoch = epoch;
        double epoch_loss = 0;
        long epoch_steps = 0;
        uint64_t t0 = tally__now_ns();
        for (long s = epoch == r->start_epoch ? r->start_in_epoch : 0; s < r->steps_per_epoch && step < total;
             s++, step++) {
            double before = st.loss;
            long skipped = st.skipped;
            int rc = train_step(r, step, (size_t)s * cfg->batch * cfg->sync.accum, &st);
            if (!rc && r->solo) rc = train_local_round(r, step, s + 1 == r->steps_per_epoch || step + 1 == total, &st);
            if (rc) return rc;
            epoch_loss += st.loss - before;
            epoch_steps += st.skipped == skipped;
            r->in_epoch = s + 1;
            if ((rc = train_maybe_save(r, step + 1, 0))) return rc;
            if (tally__train_seam_halt(r->rank, step + 1)) {
                res->steps = step + 1 - r->start_step;
                return 0; /* as if killed here: nothing more is saved or evaluated */
            }
            if (cfg->check_replicas > 0 && (step + 1) % cfg->check_replicas == 0 &&
                (rc = tally__guard_check_replicas(r->comm, &r->model, step)))
                return rc;
            tally__train_tell(r, &(tally__train_event){.kind = TALLY__TRAIN_STEP,
                                                       .step = step + 1,
                                                       .total_steps = total,
                                                       .epoch = epoch,
                                                       .epochs = r->epochs,
                                                       .samples = (double)(step + 1) * samples_per_step,
                                                       .loss = st.loss - before});
        }
        res->train_s += (double)(tally__now_ns() - t0) * 1e-9;
        res->last_loss = epoch_loss / (epoch_steps ? epoch_steps : 1);
        if (cfg->eval) {
            int rc = tally__train_evaluate(r, res);
            if (rc) return rc;
            tally__train_tell(r,
                              &(tally__train_event){.kind = TALLY__TRAIN_EVALUATED,
                                                    .step = step,
                                                    .total_steps = total,
                                                    .epoch = epoch,
                                                    .epochs = r->epochs,
                                                    .loss = res->last_loss,
                                                    .regression = r->model.regression,
                                                    .test_metric = r->model.regression ? res->test_loss : res->test_acc,
                                                    .test_loss = res->test_loss});
        }
    }
    tally__train_tell(r, &(tally__train_event){.kind = TALLY__TRAIN_END, .step = step, .total_steps = total});
    int rc = train_maybe_save(r, step, 1);
    if (rc) return rc;
    tally__sync_stats s1;
    tally__sync_stats_get(&r->sync, &s1);
    res->steps = step - r->start_step;
    res->checkpoints = r->saves;
    res->samples = (double)res->steps * samples_per_step;
    res->samples_per_s = res->train_s > 0 ? res->samples / res->train_s : 0;
    res->data_s = st.data;
    res->compute_s = st.compute;
    if (res->steps > 1) {
        double mean = st.compute / res->steps;
        res->compute_sd_s = sqrt(fmax(0, (st.compute_sq - res->steps * mean * mean) / (res->steps - 1)));
    }
    res->update_s = st.update;
    res->wait_s = st.wait;
    res->comm_s = st.comm;
    res->bytes_sent = st.bytes;
    res->grad_bytes = s1.grad_bytes - s0.grad_bytes;
    res->buckets = s1.buckets;
    res->skipped_steps = r->start_skipped + st.skipped;
    res->outer_rounds = r->local.run_rounds;
    res->outer_s = r->local.seconds;
    res->outer_bytes = r->local.bytes;
    return 0;
}

/* What this rank holds, as allocated (not predicted), and the peak resident set. */
static void train_account(const train_run *r, tally__train_result *res) {
    tally__sync_mem b = tally__sync_memory(&r->sync);
    res->mem_params = b.params;
    res->mem_grads = b.grads;
    res->mem_optim = b.optim;
    res->mem_buffers = b.buffers;
    res->mem_activations = r->model.activation_bytes;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) res->peak_rss = (size_t)ru.ru_maxrss * 1024;
}

void tally__train_result_free(tally__train_result *res) {
    free(res->params);
    free(res->rank_times);
    res->params = NULL;
    res->rank_times = NULL;
}

int tally__train(tally_comm *comm, const tally__train_cfg *cfg, tally__train_result *res) {
    memset(res, 0, sizeof *res);
    res->test_acc = -1;
    res->resumed_from = -1;
    if (cfg->batch < 1 || cfg->sync.accum < 1 || cfg->epochs < 1)
        return tally__seterr(TALLY_E_INVALID, "train: batch (%d), accum (%d) and epochs (%d) must be >= 1", cfg->batch,
                             cfg->sync.accum, cfg->epochs);
    if (cfg->straggler_ms > 0 && (cfg->straggler_rank < 0 || cfg->straggler_rank >= tally_comm_size(comm)))
        return tally__seterr(TALLY_E_INVALID, "train: --straggler names rank %d, and the ranks are 0..%d",
                             cfg->straggler_rank, tally_comm_size(comm) - 1);
    int cpus = tally__cpus_allowed();
    if (cfg->threads > cpus)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: --threads %d is more BLAS threads than the %d CPU%s this "
                             "process may use: give at most %d",
                             tally_comm_rank(comm), cfg->threads, cpus, cpus == 1 ? "" : "s", cpus);
    int rc = tally__local_check(cfg, tally_comm_rank(comm));
    if (rc) return rc;
    if (cfg->async.enabled) return tally__train_async(comm, cfg, res);
    train_run r = {.cfg = cfg, .comm = comm, .rank = tally_comm_rank(comm), .size = tally_comm_size(comm)};
    rc = train_setup(&r, res);
    if (!rc) rc = tally__train_blas_threads(cfg, r.rank);
    if (!rc) rc = train_epochs(&r, res);
    if (!rc) rc = tally__train_fingerprint(&r, res);
    if (!rc) train_account(&r, res);
    if (!rc) rc = tally__train_gather_times(&r, res, 1);
    if (!rc && cfg->measure_peak && r.rank == 0) res->peak_gflops = tally__sgemm_peak_gflops();
    char why[1024]; /* a failure while tearing down must not replace the run's own message */
    snprintf(why, sizeof why, "%s", rc ? tally_last_error() : "");
    tally__train_teardown(&r);
    if (rc) tally__seterr(rc, "%s", why);
    return rc;
}
