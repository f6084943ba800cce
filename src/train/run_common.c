/* run_common.c - what the synchronous and the asynchronous runs share: the model's configuration, the
 * data and its steps, batches, evaluation, the parameters' fingerprint, BLAS threads, the straggler. */
#include <cblas.h>
#include <math.h>
#include <openssl/evp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../core/err.h"
#include "../core/log.h"
#include "../core/rng.h"
#include "../nn/gemm_bf16.h"
#include "trainer_int.h"

/* --lr, or the optimizer's default for this model. */
static float train_default_lr(const tally__train_cfg *cfg) {
    if (cfg->opt.lr > 0) return cfg->opt.lr;
    if (cfg->opt.optim.kind == TALLY_OPTIM_ADAMW) return TALLY__TRAIN_ADAMW_LR_DEFAULT;
    const tally__model_info *info = tally__model_info_of(cfg->model.kind);
    return info ? info->sgd_lr : TALLY__TRAIN_SGD_LR_DEFAULT;
}

void tally__train_model_cfg(const train_run *r, tally__model_cfg *mc) {
    const tally__train_cfg *cfg = r->cfg;
    *mc = cfg->model; /* the kind, the widths and any graph of the caller's own; the geometry is the data's */
    if (r->tokens) {
        mc->outputs = TALLY_TEXT_VOCAB; /* in_dim is the context, the caller's or the model's default */
    } else {
        mc->in_dim = r->train.dim;
        mc->channels = r->train.channels ? r->train.channels : 1;
        mc->height = r->train.height;
        mc->width = r->train.width;
        mc->outputs = r->train.classes ? r->train.classes : r->train.tdim;
    }
    const tally__model_info *info = tally__model_info_of(mc->kind);
    if (info && info->defaults) info->defaults(mc);
}

int tally__train_check_input(const train_run *r) {
    if (r->model.token_input == r->tokens) return r->tokens ? tally_text_check(&r->text, r->model.cfg.in_dim) : 0;
    if (r->tokens)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: --data %s is text, and this model reads feature vectors; "
                             "train a model that reads tokens (--model gpt) on it",
                             r->rank, r->cfg->data.source);
    return tally__seterr(TALLY_E_INVALID,
                         "rank %d: this model reads token indices and the data set %s holds "
                         "feature vectors; train it on token data, or give it a float input",
                         r->rank, r->cfg->data.source ? r->cfg->data.source : TALLY__TRAIN_DATA_DEFAULT);
}

/* --normalize mean-std asked of data that holds no images (text, least squares' features). */
static int refuse_normalize(const train_run *r, const char *data) {
    return tally__seterr(TALLY_E_INVALID,
                         "rank %d: --normalize mean-std standardizes images, and %s holds no images; drop "
                         "--normalize mean-std",
                         r->rank, data);
}

/* --normalize mean-std: every rank computes the same statistics from the whole training set it holds. */
static int train_standardize(train_run *r, tally__train_result *res) {
    if (!r->train.channels) return refuse_normalize(r, res->data_name ? res->data_name : "this data set");
    float *m = malloc(2 * (size_t)r->train.channels * sizeof *m);
    if (!m) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory standardizing the images", r->rank);
    int rc = tally_dataset_standardize(&r->train, &r->test, m, m + r->train.channels);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", tally_last_error());
        tally__seterr(rc, "rank %d: --normalize mean-std: %s", r->rank, why);
    } else {
        res->standardized = 1;
        res->input_mean = m[0];
        res->input_sd = m[r->train.channels];
    }
    free(m);
    return rc;
}

int tally__train_load_data(train_run *r, tally__train_result *res) {
    const tally__train_cfg *cfg = r->cfg;
    const char *data_name = NULL;
    const tally__model_info *need = tally__model_info_of(cfg->model.kind);
    int text = cfg->data.source && !strncmp(cfg->data.source, "text:", 5);
    if (text || (!cfg->model.build && need && need->data == TALLY__DATA_TOKENS)) {
        if (text && !cfg->model.build && need && need->data != TALLY__DATA_TOKENS)
            return tally__seterr(TALLY_E_INVALID,
                                 "rank %d: the %s model does not read text; --data text:FILE is for --model gpt, or "
                                 "give the %s model --data fashion-mnist|synthetic|DIR",
                                 r->rank, need->name, need->name);
        if (cfg->data.standardize) return refuse_normalize(r, "text");
        return tally__train_text_open(r, res);
    }
    int rc = tally__train_data(cfg, r->rank, &r->train, &r->test, res->true_w, &data_name);
    if (rc) return rc;
    res->data_name = data_name;
    const tally__model_info *info = tally__model_info_of(cfg->model.kind);
    if (info && info->data == TALLY__DATA_LEAST_SQUARES) res->true_w_len = r->train.dim + 1;
    if (info && info->data == TALLY__DATA_IMAGES && !r->train.height)
        return tally__seterr(TALLY_E_INVALID, "rank %d: the %s model needs image data", r->rank, info->name);
    return cfg->data.standardize ? train_standardize(r, res) : 0;
}

long tally__train_total_steps(const train_run *r, int *epochs) {
    const tally__train_cfg *cfg = r->cfg;
    int e = cfg->epochs;
    if (r->tokens && cfg->max_steps > r->steps_per_epoch * cfg->epochs)
        e = (int)((cfg->max_steps + r->steps_per_epoch - 1) / r->steps_per_epoch);
    long total = r->steps_per_epoch * e;
    if (cfg->max_steps > 0 && cfg->max_steps < total) total = cfg->max_steps;
    if (epochs) *epochs = e;
    return total;
}

int tally__train_prepare_steps(train_run *r, tally__train_result *res, int workers) {
    const tally__train_cfg *cfg = r->cfg;
    float lr = train_default_lr(cfg);
    long total = tally__train_total_steps(r, &r->epochs);
    r->sched = (tally_lr_schedule){.lr = cfg->opt.scale_lr ? tally_lr_scaled(lr, workers) : lr,
                                   .warmup_steps = cfg->opt.warmup_steps ? cfg->opt.warmup_steps
                                                                         : (long)(cfg->opt.warmup_frac * total),
                                   .decay = cfg->opt.decay,
                                   .total_steps = total,
                                   .min_lr = cfg->opt.min_lr,
                                   .step_every = cfg->opt.step_every,
                                   .step_gamma = cfg->opt.step_gamma};
    res->lr = r->sched.lr;
    size_t B = (size_t)cfg->batch, T = r->tokens ? (size_t)r->model.cfg.in_dim : 1;
    r->xb = malloc(B * (r->tokens ? T : (size_t)r->train.dim) * sizeof(float)); /* tokens are int32: as wide */
    r->yb = malloc(B * T * sizeof(int32_t));
    r->tb = malloc(B * (r->train.tdim ? r->train.tdim : 1) * sizeof(float));
    r->idx = malloc(B * sizeof(size_t));
    if (!r->xb || !r->yb || !r->tb || !r->idx) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    res->nparams = r->model.nparams;
    tally__model_arch(&r->model.cfg, res->arch, sizeof res->arch);
    res->flops_per_sample = r->model.flops_per_sample;
    res->tokens_per_sample = r->tokens ? r->model.cfg.in_dim : 0;
    return 0;
}

void tally__train_teardown(train_run *r) {
    tally__sync_close(&r->sync);
    tally__guard_free(&r->guard);
    tally__model_free(&r->model);
    tally_sampler_free(&r->sampler);
    tally_dataset_free(&r->train);
    tally_dataset_free(&r->test);
    tally_text_close(&r->text);
    free(r->xb);
    free(r->yb);
    free(r->tb);
    free(r->idx);
    tally__local_close(&r->local);
    tally_comm_free(r->solo); /* last: the engine's gradients lived in its memory */
    r->solo = NULL;
}

/* Copies the samples at data set indices idx[0..B) into the micro-batch buffers. */
void tally__train_gather(train_run *r, const tally_dataset *d, const size_t *idx, int B) {
    size_t dim = (size_t)d->dim;
    for (int s = 0; s < B; s++) {
        memcpy(r->xb + s * dim, d->x + idx[s] * dim, dim * sizeof(float));
        if (d->y) r->yb[s] = d->y[idx[s]];
        if (d->t) memcpy(r->tb + (size_t)s * d->tdim, d->t + idx[s] * d->tdim, (size_t)d->tdim * sizeof(float));
    }
}

static void fill_test_samples(train_run *r, const size_t *items, int n) { tally__train_gather(r, &r->test, items, n); }

/* Test loss and score over the whole test set. */
int tally__train_evaluate(train_run *r, tally__train_result *res) {
    if (r->tokens) return tally__train_text_evaluate(r, res);
    const tally_dataset *d = &r->test;
    double sums[3]; /* score, loss * samples, samples */
    int rc = tally__train_eval_items(r, d->n, fill_test_samples, sums);
    if (rc) return rc;
    double n = sums[2] > 0 ? sums[2] : 1;
    res->evaluated = 1;
    res->test_acc = r->model.regression ? -1 : sums[0] / n;
    res->test_loss = r->model.regression ? sums[0] / n / (d->tdim ? d->tdim : 1) : sums[1] / n;
    return 0;
}

/* Every layer's parameters in order: the flat buffer, or stage 3's gathers (collective). */
typedef struct fp_ctx {
    EVP_MD_CTX *md;
    float *copy;
    const tally__model *m;
} fp_ctx;

static void fp_layer(void *arg, int layer, const float *p, size_t n) {
    fp_ctx *c = arg;
    EVP_DigestUpdate(c->md, p, n * sizeof(float));
    if (c->copy) memcpy(c->copy + c->m->offsets[layer], p, n * sizeof(float));
}

static int train_visit_layers(train_run *r, fp_ctx *c) {
    if (tally__sync_is_open(&r->sync)) return tally__sync_each_layer(&r->sync, fp_layer, c);
    for (int l = 0; l < r->model.nlayers; l++)
        fp_layer(c, l, r->model.params + r->model.offsets[l], r->model.offsets[l + 1] - r->model.offsets[l]);
    return 0;
}

/* SHA-256 of the parameters, and whether every rank holds the same. */
int tally__train_fingerprint(train_run *r, tally__train_result *res) {
    fp_ctx c = {.md = EVP_MD_CTX_new(), .m = &r->model};
    if (r->cfg->keep_params && !(c.copy = res->params = malloc(r->model.nparams * sizeof(float) + 1)))
        return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    unsigned int len = 0;
    int rc = !c.md || !EVP_DigestInit_ex(c.md, EVP_sha256(), NULL)
                 ? tally__seterr(TALLY_E_SYSTEM, "rank %d: SHA-256 unavailable", r->rank)
                 : train_visit_layers(r, &c);
    if (!rc && !EVP_DigestFinal_ex(c.md, res->hash, &len))
        rc = tally__seterr(TALLY_E_SYSTEM, "rank %d: SHA-256 of the parameters failed", r->rank);
    EVP_MD_CTX_free(c.md);
    if (rc) return rc;
    unsigned char *all = malloc(32 * (size_t)r->size);
    if (!all) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    rc = tally_allgather(r->comm, res->hash, all, 32, TALLY_U8);
    res->replicas_identical = 1;
    for (int i = 1; i < r->size && !rc; i++) res->replicas_identical &= !memcmp(all, all + 32 * (size_t)i, 32);
    free(all);
    return rc;
}

/* OpenBLAS takes one buffer per thread at its first GEMM (128 MiB of address space on x86-64) and, when
 * malloc refuses one, retries for ever: under ulimit -v a run would spin instead of failing. */
#define TRAIN_BLAS_BUFFER_BYTES ((size_t)128 << 20)

/* After every allocation of the set-up, so BLAS starts its threads last; first the address space its
 * buffers will need is asked for once (and given back), so a limit is an error now rather than a hang.
 * threads is at most the CPUs allowed (tally__train checked), which an affinity mask bounds. */
int tally__train_blas_threads(const tally__train_cfg *cfg, int rank) {
    int threads = cfg->threads > 0 ? cfg->threads : TALLY__TRAIN_THREADS_DEFAULT, got = 0;
    size_t need = TRAIN_BLAS_BUFFER_BYTES * (size_t)threads; /* the calling thread is one of them */
    void *probe[CPU_SETSIZE];
    while (got < threads && got < CPU_SETSIZE && (probe[got] = malloc(TRAIN_BLAS_BUFFER_BYTES))) got++;
    for (int i = 0; i < got; i++) free(probe[i]);
    if (got < threads && got < CPU_SETSIZE) {
        struct rlimit lim;
        char limit[64] = "no limit";
        if (getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
            snprintf(limit, sizeof limit, "%llu KiB", (unsigned long long)lim.rlim_cur / 1024);
        return tally__seterr(TALLY_E_NOMEM,
                             "rank %d: OpenBLAS needs about %zu MiB more address space for %d "
                             "thread%s' buffers and this process cannot get it (ulimit -v: %s): raise the limit, "
                             "or give fewer --threads",
                             rank, need >> 20, threads, threads == 1 ? "" : "s", limit);
    }
    openblas_set_num_threads(threads);
    tally__bf16_threads(threads);
    return 0;
}

int tally__train_precision(const tally__train_cfg *cfg, tally__model *m, int rank) {
    if (!cfg->bf16) return 0;
    int rc = tally__model_use_bf16(m);
    if (!rc) {
        if (rank == 0 && !tally__bf16_on_amx())
            tally__log_notice("--precision bf16 without AMX (this CPU lacks it, or a hypervisor or the kernel hides "
                              "it): the bf16 products run on AVX512_BF16, which on many CPUs is slower than f32 "
                              "(an Emerald Rapids Xeon's bf16 dot products reach half the flops of its f32 FMAs); "
                              "compare with --precision fp32 before a long run");
        return 0;
    }
    char why[512];
    snprintf(why, sizeof why, "%s", tally_last_error());
    return tally__seterr(rc, "rank %d: %s", rank, why);
}

#define TRAIN_JITTER_STREAM 0x6a6974746572ull /* "jitter": its own stream, apart from the data's and the model's */

double tally__train_jitter_ms(const tally__train_cfg *cfg, int rank, long step) {
    if (!(cfg->jitter_ms > 0)) return 0;
    tally__rng g;
    tally__rng_seed(&g, cfg->seed ^ TRAIN_JITTER_STREAM, ((uint64_t)(uint32_t)rank << 40) ^ (uint64_t)step);
    double u = (double)(tally__rng_next(&g) >> 11) * 0x1p-53; /* [0, 1) */
    return -cfg->jitter_ms * log1p(-u);
}

static void sleep_ms(double ms) {
    if (!(ms > 0)) return;
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(fmod(ms, 1000.0) * 1e6)};
    while (nanosleep(&ts, &ts) != 0) {}
}

void tally__train_straggle(const tally__train_cfg *cfg, int rank, long step) {
    if (cfg->straggler_ms > 0 && rank == cfg->straggler_rank) sleep_ms(cfg->straggler_ms);
    sleep_ms(tally__train_jitter_ms(cfg, rank, step));
}

void tally__train_tell(const train_run *r, const tally__train_event *ev) {
    if (r->rank != 0 || r->cfg->report.quiet || !r->cfg->report.observer) return;
    tally__train_event e = *ev;
    e.tokens_per_sample = r->tokens ? r->model.cfg.in_dim : 0;
    r->cfg->report.observer(r->cfg->report.observer_arg, &e);
}
