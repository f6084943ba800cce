/* trainer.h - the training run behind `tally train`: what to train and how (cfg), and what came of
 * it (result); also the pieces of a run that live in their own files (data choice, reporting). */
#ifndef TALLY_TRAIN_TRAINER_H
#define TALLY_TRAIN_TRAINER_H

#include <stdint.h>
#include <stdio.h>
#include <tally.h>
#include <tally/data.h>
#include <tally/optim.h>

#include "../ckpt/ckpt.h"
#include "../dp/codec.h"
#include "../dp/sync.h"
#include "../nn/model.h"
#include "../ps/ps.h"
#include "local_sgd.h"

/* What the training loop tells its observer, on rank 0 only and on the thread that trains: the CLI draws
 * the progress line and the epoch lines from these (tools/train_report.c); the library never prints. */
typedef enum {
    TALLY__TRAIN_BEGIN,     /* before the first step: total_steps */
    TALLY__TRAIN_STEP,      /* after each step: step, epoch, samples, loss (this step's) */
    TALLY__TRAIN_EVALUATED, /* after an epoch's test pass: epoch, loss (the epoch's mean), the test figures */
    TALLY__TRAIN_END,       /* after the last step */
} tally__train_event_kind;
typedef struct tally__train_event {
    tally__train_event_kind kind;
    long step, total_steps; /* steps done so far, and in all */
    int tokens_per_sample;  /* a model on text: its context (a sample is that many tokens); 0 otherwise */
    int epoch, epochs;      /* the epoch in progress (from 0), and how many */
    double samples;         /* samples trained so far, over all ranks */
    double loss;
    int regression; /* the test figure is a mean squared error, not an accuracy */
    double test_metric, test_loss;
} tally__train_event;
typedef void (*tally__train_observer)(void *arg, const tally__train_event *ev);

/* The data set of a run and its sizes. Each default is written here once: tally__train_cfg_default fills
 * it in, the library takes it for a field left 0 (NULL), and the CLI's --help prints it. */
#define TALLY__TRAIN_DATA_DEFAULT            "fashion-mnist"
#define TALLY__TRAIN_VAL_FRAC_DEFAULT        0.1
#define TALLY__TRAIN_VAL_WINDOWS_DEFAULT     64
#define TALLY__TRAIN_LINEAR_SAMPLES_DEFAULT  16384
#define TALLY__TRAIN_SYNTHETIC_TRAIN_DEFAULT 60000
#define TALLY__TRAIN_SYNTHETIC_TEST_DEFAULT  10000
#define TALLY__TRAIN_LINEAR_FEATURES         8 /* the least-squares set's (the planner's --model linear too) */
typedef struct tally__data_cfg {
    const char *source;    /* TALLY__TRAIN_DATA_DEFAULT, "synthetic", a directory of IDX files, or "text:FILE" for a
                         * model that reads tokens (whose default is the King James Bible) */
    double val_frac;       /* text: the last fraction held out for validation (0: none) */
    int val_windows;       /* text: validation windows of the context's length */
    size_t linear_samples; /* linear model: training set size */
    size_t synthetic_train, synthetic_test; /* synthetic set sizes */
    const char *cache_dir; /* text: the default corpus is extracted into its folder tally (the CLI gives
                            * $XDG_CACHE_HOME, else ~/.cache; the library reads no environment); NULL: none */
    int standardize;       /* images: to mean 0 and sd 1 per channel by the training set's statistics
                            * (tally_dataset_standardize); the cnn's default, the others' not */
} tally__data_cfg;

/* The optimizer and its learning rate: the rate, its scaling and its schedule over the run. SGD's default
 * rate is the model's (tally__model_info.sgd_lr), TALLY__TRAIN_SGD_LR_DEFAULT for a graph of one's own. */
#define TALLY__TRAIN_SGD_LR_DEFAULT   0.05f
#define TALLY__TRAIN_ADAMW_LR_DEFAULT 1e-3f
typedef struct tally__optim_run_cfg {
    tally_optim_cfg optim; /* kind and hyper-parameters (tally_optim_cfg_default fills them) */
    float lr;              /* per rank; 0 means the optimizer's default (above) */
    int scale_lr;          /* multiply lr by the world size (linear scaling rule) */
    long warmup_steps;
    tally_decay decay;
    float min_lr;
    long step_every; /* step decay */
    float step_gamma;
    float clip;        /* > 0: the averaged gradient's global L2 norm clipped to this (--clip) */
    float warmup_frac; /* > 0 and no warmup_steps: warm up over this fraction of the run's steps */
} tally__optim_run_cfg;

/* Who hears of the run: the observer of its progress, the summary's JSON file. */
typedef struct tally__report_cfg {
    int quiet;                      /* nobody is told of the progress (tests) */
    tally__train_observer observer; /* NULL: nobody is told of the progress */
    void *observer_arg;
    const char *json; /* write the summary there (rank 0) */
} tally__report_cfg;

/* A run: one struct per module it configures, then the loop's own settings (their defaults here). */
#define TALLY__TRAIN_EPOCHS_DEFAULT  1
#define TALLY__TRAIN_BATCH_DEFAULT   64
#define TALLY__TRAIN_THREADS_DEFAULT 1
typedef struct tally__train_cfg {
    tally__model_cfg model; /* kind and widths (nn); the geometry comes from the data set */
    tally__data_cfg data;
    tally__optim_run_cfg opt;
    tally__sync_cfg sync; /* ZeRO stage, accumulation, buckets, overlap, compression, NaN policy (dp) */
    tally__ckpt_cfg ckpt;
    tally__async_cfg async; /* --mode async (ps) */
    tally__local_cfg local; /* --local-steps: average every H steps (local_sgd.h) */
    tally__report_cfg report;
    int epochs;
    long max_steps; /* > 0: stop after this many optimizer steps in all */
    int batch;      /* per rank, per micro-batch */
    uint64_t seed;
    int eval;            /* evaluate on the test set after every epoch */
    int threads;         /* BLAS threads per rank; 0 means the default */
    int bf16;            /* --precision bf16: the linear layers' products in bf16 (tally__model_use_bf16) */
    int measure_peak;    /* time single-thread sgemm after training, for MFU */
    size_t max_mem;      /* > 0: refuse to start when a rank would need more bytes than this */
    int keep_params;     /* the final parameters into res->params (whole, gathered under ZeRO-3): a caller
                          * that uses the trained model without a checkpoint; off, it costs no copy */
    long check_replicas; /* > 0: compare the replicas' parameter hashes every this many steps */
    int straggler_rank;  /* --straggler: this rank sleeps straggler_ms in every step (sync and async) */
    int straggler_ms;    /* 0: no straggler */
    double jitter_ms;    /* --jitter: every rank sleeps an exponential delay of this mean in every step,
                          * drawn from (seed, rank, step); 0: none */
} tally__train_cfg;

/* Defaults for every field (mlp, the TALLY__TRAIN_*_DEFAULT above, sgd momentum 0.9, the sync engine's
 * and the checkpoints' defaults, ...). */
void tally__train_cfg_default(tally__train_cfg *cfg);
/* The flags a caller set itself, which a model's training defaults below leave as they are. */
enum {
    TALLY__GIVEN_OPTIM = 1, /* the optimizer (its betas then its own) */
    TALLY__GIVEN_WD = 2,
    TALLY__GIVEN_WD_ON = 4,
    TALLY__GIVEN_CLIP = 8,
    TALLY__GIVEN_WARMUP = 16,
    TALLY__GIVEN_DECAY = 32,
    TALLY__GIVEN_MIN_LR = 64,
    TALLY__GIVEN_BATCH = 128,
    TALLY__GIVEN_NORMALIZE = 256,
};
/* What GPT training takes unless told otherwise (nanoGPT's and the peer's): AdamW with beta2 below (beta1
 * AdamW's own) and the weight decay below on the matrices only, clipping at the norm below, warmup over
 * the fraction below of the run's steps, cosine decay to the rate below. An async run keeps neither
 * clipping nor matrices-only decay (the parameter server has neither). */
#define TALLY__GPT_BETA2_DEFAULT        0.95f
#define TALLY__GPT_WEIGHT_DECAY_DEFAULT 0.1f
#define TALLY__GPT_CLIP_DEFAULT         1.0f
#define TALLY__GPT_WARMUP_FRAC_DEFAULT  0.1f
#define TALLY__GPT_MIN_LR_DEFAULT       1e-4f
void tally__train_gpt_defaults(tally__train_cfg *cfg, unsigned given);
/* What LeNet-5 (the cnn model) takes unless told otherwise: images standardized by the training set's
 * mean and sd, the batch per rank below (at the model's SGD rate, 0.025), SGD's weight decay below on
 * every parameter, cosine decay of the rate to --min-lr over the run. With them `tally train -n 2 --model
 * cnn --epochs 5` passes 0.90 test accuracy on Fashion-MNIST (BENCHMARKS.md has the seeds), where the
 * MLP's defaults (batch 64, rate 0.05, constant, no decay, pixels in [0, 1]) stop near 0.89. */
#define TALLY__CNN_BATCH_DEFAULT        16
#define TALLY__CNN_WEIGHT_DECAY_DEFAULT 5e-4f
void tally__train_cnn_defaults(tally__train_cfg *cfg, unsigned given);
/* --compress dgc:R with an optimizer other than SGD (the gpt's default is AdamW): refused, naming both. */
int tally__train_dgc_check(const tally__train_cfg *cfg, int rank);

#define TALLY__TRAIN_STALE_BINS 64

/* A rank's figures in tally__train_result.rank_times: seconds over its steps, then those steps. */
enum { TALLY__TIME_DATA, TALLY__TIME_COMPUTE, TALLY__TIME_WAIT, TALLY__TIME_UPDATE, TALLY__TIME_STEPS, TALLY__TIMES };

typedef struct tally__train_result {
    size_t nparams;
    double lr;             /* peak learning rate used (after --scale-lr) */
    const char *data_name; /* what was trained on (static string, or cfg->data) */
    int standardized;      /* images standardized (cfg->data.standardize): channel 0's mean and sd before */
    float input_mean, input_sd;
    long steps;     /* optimizer steps taken */
    double samples; /* training samples over all ranks */
    double train_s; /* wall time in training steps (evaluation excluded) */
    double samples_per_s;
    double data_s, compute_s, update_s, wait_s, comm_s; /* per-rank totals over the steps */
    double compute_sd_s;                                /* a step's compute: its standard deviation */
    double *rank_times; /* every rank's data_s, compute_s, wait_s, update_s and steps (TALLY__TIME_*), rank r at
                         * [r * TALLY__TIMES], gathered at the end; a rank that trains nothing (--ps) has 0
                         * steps. malloc'd: tally__train_result_free */
    int world;          /* ranks in rank_times */
    unsigned long long bytes_sent; /* by this rank in the gradient allreduces */
    int buckets;                   /* gradient buckets per step */
    double last_loss;              /* mean training loss of the last epoch (this rank's shard) */
    int evaluated;                 /* test_acc / test_loss hold a result */
    double test_acc;               /* classification; -1 for regression */
    double test_loss;              /* mean test loss (mse for regression) */
    double flops_per_sample;
    int tokens_per_sample;  /* a model on text: the context; 0 otherwise */
    double peak_gflops;     /* single-thread sgemm, 0 when not measured */
    unsigned char hash[32]; /* SHA-256 of the final parameters */
    int replicas_identical; /* every rank's hash equal */
    long skipped_steps;     /* steps skipped because a gradient was NaN or Inf on some rank */
    long resumed_from;      /* the step of the checkpoint this run resumed from; -1 when it started fresh */
    long checkpoints;       /* checkpoints written */
    float *params;          /* the final parameters when cfg->keep_params, malloc'd (tally__train_result_free) */
    size_t mem_params, mem_grads, mem_optim, mem_buffers, mem_activations; /* bytes this rank holds */
    size_t peak_rss;                                                       /* bytes, from getrusage */
    float true_w[64]; /* linear model: the generating weights then bias */
    int true_w_len;
    /* compression */
    char codec[40];                         /* the codec's spec ("none", "fp16", "topk:0.01", ...) */
    char arch[96];                          /* the model's architecture in words ("784-512-512-10", "LeNet-5") */
    unsigned long long grad_bytes;          /* sent by this rank in the gradient reductions over the steps */
    unsigned long long grad_bytes_f32_step; /* what one step's gradient reductions send uncompressed in
                                              * f32 (measured once at setup by reducing every bucket, or
                                              * every ZeRO layer, in f32) */
    /* local SGD (cfg->local.steps > 0) */
    long local_steps;                  /* H; 0: synchronous */
    long outer_rounds;                 /* averagings in this run */
    double outer_s;                    /* seconds in them (averaging and the outer step) */
    unsigned long long outer_bytes;    /* sent by this rank in them */
    unsigned long long f32_bytes_step; /* what synchronous training's f32 allreduce sends a step (measured) */
    /* asynchronous training (cfg->async; rank 0 holds the server's figures) */
    int async;
    long staleness; /* the bound S */
    int stale_lr;   /* tally__stale_lr: NONE or INVERSE, as applied (AUTO resolved) */
    int ps_dedicated, workers;
    int shared_quota;                             /* steps x workers gradients shared out, not steps per worker */
    long staleness_hist[TALLY__TRAIN_STALE_BINS]; /* applied gradients by staleness; the last bin: that
                                                   * many or more */
    long max_staleness;
    long ps_pushes, ps_updates; /* gradients applied, optimizer steps taken by the server */
    long pulls, pulls_waited;   /* pulls, and those the bound held back */
    double pull_wait_s;         /* what the held-back pulls waited, summed over workers */
} tally__train_result;

/* Runs the training on this rank. Every rank calls it with the same cfg. Whatever it returns, the result
 * is freed with tally__train_result_free. */
int tally__train(tally_comm *comm, const tally__train_cfg *cfg, tally__train_result *res);
/* Frees what the result holds (params, rank_times) and clears those pointers. */
void tally__train_result_free(tally__train_result *res);

/* Which rank held the others up. DDP's allreduce makes every rank's step as long as the slowest's, so the
 * step time hides it; a rank's own work (data + compute + update, per step) does not. */
typedef struct tally__train_slowest {
    int rank;           /* the rank with the most work a step; -1 when fewer than 2 ranks trained */
    double work_s;      /* its work per step */
    double median_s;    /* the median of the other training ranks' work per step */
    double others_wait; /* what the other training ranks waited per step, on average */
} tally__train_slowest;
tally__train_slowest tally__train_find_slowest(const double *rank_times, int world);
/* One rank's work a step from its row of rank_times (data + compute + update over its steps), seconds;
 * 0 for a rank of no steps. */
double tally__train_work_per_step(const double *times);

/* The data sets of a run: Fashion-MNIST from cfg->data (a directory, or the Debian one), synthetic, or
 * the least-squares set of the linear model. Falls back to synthetic, saying so on rank 0, when the
 * default data set is absent. */
int tally__train_data(const tally__train_cfg *cfg, int rank, tally_dataset *train, tally_dataset *test, float *true_w,
                      const char **name);

#endif
