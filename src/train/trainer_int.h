/* trainer_int.h - one rank's training run as the trainer's own files share it (the loop in trainer.c,
 * its checkpoints in ckpt_train.c); not part of any public interface. */
#ifndef TALLY_TRAIN_TRAINER_INT_H
#define TALLY_TRAIN_TRAINER_INT_H

#include <tally/data.h>
#include <tally/ddp.h>
#include <tally/optim.h>

#include "../dp/codec.h"
#include "../dp/guard.h"
#include "../nn/model.h"
#include "trainer.h"
#include "../dp/sync.h"

/* Everything a run holds, so the loop, the evaluation and the checkpoints take one argument. */
typedef struct train_run {
    const tally__train_cfg *cfg;
    tally_comm *comm;
    int rank, size;
    tally_dataset train, test;
    tally_sampler sampler;
    int tokens;           /* the model reads token windows of text (train_text.c), not samples of train/test */
    tally_text text;      /* then: the corpus, its training and validation parts */
    char text_path[4096]; /* the default corpus's cache file (text keeps a pointer to it) */
    tally__model model;
    /* Keeps the replicas in step, whatever the ZeRO stage (synchronous runs); under --local-steps this
     * rank's own engine, on `solo`. */
    tally__sync sync;
    tally_comm *solo;       /* --local-steps: a communicator of this rank alone; NULL otherwise */
    tally__local_sgd local; /* --local-steps: the outer state (its cfg.steps 0 otherwise) */
    int ckpt_pending;       /* --local-steps: a checkpoint fell due in a round; written at its end */
    tally__model_hooks hooks;
    tally__guard guard; /* non-finite gradients; wraps hooks */
    tally_lr_schedule sched;
    float *xb, *tb; /* one gathered micro-batch */
    int32_t *yb;
    size_t *idx; /* the data set indices of its samples */
    long steps_per_epoch;
    int epochs; /* cfg's, or on text as many passes as --steps asks for (windows are drawn, not dealt) */
    /* Where training starts: 0, or where a resumed checkpoint left off. */
    long start_step; /* optimizer steps already taken */
    int start_epoch;
    long start_in_epoch; /* steps of start_epoch already taken */
    long start_skipped;  /* steps skipped for a NaN or Inf before the checkpoint */
    long saved_step;     /* the step of the last checkpoint written or loaded (-1: none) */
    long saves;          /* checkpoints written */
    long saving_step;    /* the step the checkpoint being written is of */
    int epoch;           /* the loop's position: the epoch in progress, */
    long in_epoch;       /* and the steps of it taken */
} train_run;

/* After the step's reductions (drained): an overflowed 16-bit sum counts as a non-finite gradient of
 * this rank for the guard (train_codec.c). */
void tally__train_codec_check_overflow(train_run *r, long step);

/* What the synchronous run (trainer.c) and the asynchronous one (trainer_async.c) share (run_common.c). */
void tally__train_model_cfg(const train_run *r, tally__model_cfg *mc);
/* The run's training and test sets (and the linear model's true weights) into r and res; refuses the
 * cnn without image data. */
int tally__train_load_data(train_run *r, tally__train_result *res);
/* Optimizer steps the run takes in all, once steps_per_epoch is known (--steps, or the epochs; on text
 * the passes --steps needs, into *epochs when not NULL). */
long tally__train_total_steps(const train_run *r, int *epochs);
/* Once the sampler and the model exist: the learning-rate schedule (--scale-lr over `workers`, the
 * ranks that compute gradients), the micro-batch buffers, and the model's figures in res. */
int tally__train_prepare_steps(train_run *r, tally__train_result *res, int workers);
void tally__train_gather(train_run *r, const tally_dataset *d, const size_t *idx, int B);
/* Once the model is laid out: refuses one that reads token indices, which the data sets here (feature
 * vectors and images) do not hold. */
int tally__train_check_input(const train_run *r);
/* Test loss and score over the test set, each rank taking every size-th sample (collective). */
int tally__train_evaluate(train_run *r, tally__train_result *res);
/* Puts held-out items items[0..n) into the micro-batch buffers (xb, yb, tb). */
typedef void (*tally__train_eval_fill)(train_run *r, const size_t *items, int n);
/* Scores `count` held-out items through fill: rank r takes items r, r + size, ...; every rank runs as
 * many batches as the one with the most (stage 3 gathers parameters in each, and collectives need
 * every rank), a rank out of items running item 0 as a stand-in it does not count. sums gets the
 * score, loss x items and items, summed over the ranks (collective). */
int tally__train_eval_items(train_run *r, size_t count, tally__train_eval_fill fill, double sums[3]);
/* SHA-256 of the parameters, and whether every rank holds the same (collective). */
int tally__train_fingerprint(train_run *r, tally__train_result *res);
/* Every rank's times into res->rank_times (collective); trains: this rank computed gradients. */
int tally__train_gather_times(train_run *r, tally__train_result *res, int trains);
void tally__train_teardown(train_run *r);
/* Sets the BLAS threads of --threads, once the set-up has allocated all it needs; TALLY_E_NOMEM when
 * the address space their buffers need cannot be had. */
int tally__train_blas_threads(const tally__train_cfg *cfg, int rank);
/* --precision bf16 on the rank's model (checked and allocated; the message names the rank); 0 for fp32. */
int tally__train_precision(const tally__train_cfg *cfg, tally__model *m, int rank);

/* Text for a model that reads tokens (train_text.c): opens --data text:FILE, or the default corpus (the
 * King James Bible of Debian's bible-kjv, extracted once into a cache file), into r->text. */
int tally__train_text_open(train_run *r, tally__train_result *res);
/* Micro-batch k of step `step` for the worker `worker` of `workers`: windows (k * workers + worker) * B
 * .. + B - 1 of the step's global batch, tokens into xb (as int32) and targets into yb. */
void tally__train_text_batch(train_run *r, long step, int k, int worker, int workers);
/* Validation loss and next-byte accuracy over the fixed validation windows, shared out by rank
 * (collective), into res->test_loss and res->test_acc. */
int tally__train_text_evaluate(train_run *r, tally__train_result *res);
/* Optimizer steps per pass over the training part: its bytes over the tokens one step consumes. */
long tally__train_text_steps_per_epoch(const train_run *r, int T, int workers);

/* --mode async (trainer_async.c): workers and a parameter server instead of allreduce. */
int tally__train_async(tally_comm *comm, const tally__train_cfg *cfg, tally__train_result *res);
/* --straggler's and --jitter's sleeps for this rank's step (a worker's clock under --mode async). */
void tally__train_straggle(const tally__train_cfg *cfg, int rank, long step);
/* --jitter's delay for (rank, step), in ms: exponential with mean cfg->jitter_ms, the same for a seed on every
 * machine and start; 0 without --jitter. */
double tally__train_jitter_ms(const tally__train_cfg *cfg, int rank, long step);
/* Hands ev to the run's observer, on rank 0 when there is one and the run is not quiet. */
void tally__train_tell(const train_run *r, const tally__train_event *ev);

#endif
