/* cmd_train.c - `tally train`: parses the flags into a training configuration, starts N local ranks of
 * itself (or joins the job a launcher made), runs the trainer and has rank 0 print the summary. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>

#include "../src/core/cpus.h"
#include "../src/core/env.h"
#include "../src/core/err.h"
#include "../src/core/parse.h"
#include "../src/dp/guard.h"
#include "../src/ps/ps.h"
#include "../src/train/train_seam.h"
#include "../src/train/trainer.h"
#include "cmd.h"
#include "flags.h"
#include "launch.h"
#include "place.h"
#include "charts/train_plot.h"
#include "train_report.h"

typedef struct train_opts {
    tally__train_cfg cfg;
    int n; /* -n: ranks to start (0: join the job, or 1) */
    int max_restarts;
    const char *transport, *bind;
    const char *plot;  /* --plot FILE: rank 0 charts the run there (train_plot.c) */
    const char *trace; /* --trace FILE: the timeline (TALLY_TRACE for every rank) */
    char arch[128];
    char cache[4096];           /* cfg.data.cache_dir: $XDG_CACHE_HOME, else ~/.cache */
    tally__train_faults faults; /* --inject-*: armed in the trainer's test seam (test builds only) */
} train_opts;

/* The defaults the help names, from where they are written (trainer.h, the models' table, ckpt.h, sync.h). */
static void train_usage(FILE *out) {
    tally__model_cfg gpt = {.kind = TALLY__MODEL_GPT};
    tally__model_info_of(TALLY__MODEL_GPT)->defaults(&gpt);
    tally_optim_cfg adamw;
    tally_optim_cfg_default(&adamw, TALLY_OPTIM_ADAMW);
    fprintf(
        out,
        "usage: tally train [-n N] [--model linear|mlp|cnn|gpt] [--hidden W1,W2,...]\n"
        "                   [--layers L] [--width C] [--heads H] [--context T] [--val-frac X]\n"
        "                   [--data fashion-mnist|synthetic[:N]|DIR|text:FILE] [--normalize none|mean-std]\n"
        "                   [--epochs E] [--steps S] [--batch B]\n"
        "                   [--lr X] [--scale-lr] [--optimizer sgd|adamw] [--momentum M] [--weight-decay WD]\n"
        "                   [--warmup STEPS] [--decay none|cosine|step] [--min-lr X] [--step-every K]\n"
        "                   [--step-gamma G] [--clip NORM] [--weight-decay-on all|matrices]\n"
        "                   [--accum K] [--bucket-mb M] [--no-overlap] [--seed S]\n"
        "                   [--threads T] [--precision fp32|bf16] [--transport auto|shm|tcp] [--bind core|none]\n"
        "                   [--no-eval] [--quiet]\n"
        "                   [--json FILE] [--plot FILE] [--trace FILE]\n"
        "                   [--zero 0|1|2|3] [--max-mem BYTES] [--nan skip|error|ignore]\n"
        "                   [--check-replicas K] [--ckpt DIR [--ckpt-every N] [--ckpt-keep K] [--resume]]\n"
        "                   [--max-restarts R] [--compress none|fp16|bf16|int8|topk:R|dgc:R|powersgd:r]\n"
        "                   [--no-error-feedback] [--mode sync|async [--staleness S]\n"
        "                   [--stale-lr auto|none|inverse] [--ps] [--quota per-worker|shared]]\n"
        "                   [--straggler RANK:MS] [--jitter MS]\n"
        "                   [--local-steps H [--outer-lr X] [--outer-momentum M] [--outer-compress none|fp16|int8]]\n"
        "Trains with N data-parallel ranks: each takes its own shard of every epoch, gradients are\n"
        "averaged in buckets while backward runs, every replica takes the same step.\n"
        "  --batch is per rank and per micro-batch (default %d); a step is batch x accum x N samples.\n"
        "  --bucket-mb: the gradient buckets' size in MiB (default %g); --no-overlap reduces them after\n"
        "  backward instead of while it runs.\n"
        "  --plot FILE writes an SVG chart of the run: loss against steps (and the test or validation loss\n"
        "  after each epoch), and samples/s (tokens/s for gpt) against steps.\n"
        "  --trace FILE writes the run's timeline (Chrome trace JSON; ui.perfetto.dev opens it): a track per\n"
        "  rank and per communication thread, with data, each layer's forward and backward, each bucket's\n"
        "  collective, the waits, the optimizer and checkpoints, the ranks' clocks aligned (TALLY_TRACE).\n"
        "  --lr is the rate for one rank (default sgd %g, adamw %g; cnn %g, linear model %g);\n"
        "  --scale-lr multiplies it by N (linear scaling rule). --steps stops after S steps in all.\n"
        "  The linear model trains on generated least-squares data (%d features, y = x.w + b + noise).\n"
        "  --model gpt: GPT-2's architecture on byte tokens (--layers %d --width %d --heads %d --context %d\n"
        "  by default) of --data text:FILE, or of the King James Bible (Debian's bible-kjv) without --data;\n"
        "  the last --val-frac (%g) is held out and scored after each epoch (loss, bits per byte). Its\n"
        "  optimizer unless told otherwise: adamw, betas %g/%g, weight decay %g on matrices only,\n"
        "  --clip %g, warmup over the first %g%% of steps, then cosine decay to --min-lr %g (with --mode\n"
        "  async the parameter server decays every parameter and does not clip).\n"
        "  --model cnn: LeNet-5, unless told otherwise with --normalize mean-std, --batch %d,\n"
        "  --weight-decay %g (sgd) and --decay cosine over the run.\n"
        "  --normalize mean-std: image pixels to mean 0 and sd 1 per channel by the training set's own\n"
        "  statistics, the test set by the same (the other models: none, pixels in [0, 1]).\n"
        "  --clip NORM scales the averaged gradient to at most that global L2 norm (every --zero stage).\n"
        "  --zero shards optimizer state (1), and gradients (2), and parameters (3) over the ranks;\n"
        "  --max-mem (K/M/G) refuses up front a run that would need more per rank.\n"
        "  --nan: a NaN or Inf gradient on any rank skips the step on every rank (skip, the default),\n"
        "  stops the run (error), or is not looked for (ignore).\n"
        "  --check-replicas K: every K steps the ranks compare hashes of their parameters and stop,\n"
        "  naming the rank and the tensor, if a replica diverged.\n"
        "  --ckpt DIR saves the whole training state there every N steps (--ckpt-every) and at the end,\n"
        "  keeping the newest K (default %d); --resume starts from the newest one when there is one.\n"
        "  A checkpoint loads at any world size and ZeRO stage; it is exact at the same world size.\n"
        "  --max-restarts R (with -n and --ckpt): when a rank dies, stop the others, start all ranks\n"
        "  again and resume from the last checkpoint, up to R times.\n"
        "  --compress sends each gradient bucket compressed: fp16 or bf16 (16 bits on the wire, summed\n"
        "  in f32; fp16 scaled by a power of two the ranks agree on, so small gradients keep their bits;\n"
        "  an fp16 sum past 65504 counts as an Inf gradient for --nan), topk:R (each rank sends\n"
        "  the fraction R of largest magnitudes as index-value pairs), powersgd:r (rank-r factors of each\n"
        "  weight matrix), int8 (a scale per 256 values: a quarter of the bytes), dgc:R (top-k with Deep\n"
        "  Gradient Compression's momentum correction: SGD's momentum applied before selecting, --clip on\n"
        "  each rank's own gradient, the density falling from 25%% to R over the first 10%% of steps).\n"
        "  topk, powersgd and int8 keep what they did not send in a residual added to the next step\n"
        "  (error feedback; --no-error-feedback turns it off); they and dgc work with --zero 0 only;\n"
        "  fp16 and bf16 with every --zero stage. The summary gives the bytes sent and the ratio to f32.\n"
        "  A checkpoint keeps the residuals and factors; resuming with another codec is refused.\n"
        "  --mode async: rank 0 runs a parameter server (master parameters and optimizer state); the\n"
        "  workers pull parameters and push gradients without waiting for each other, except that none\n"
        "  may be more than S steps ahead of the slowest (--staleness, default 0: the same steps as\n"
        "  sync). At S >= 1 every push is applied on arrival as gradient/N at lr damped by --stale-lr\n"
        "  (inverse: lr / (1 + staleness); none: lr; auto, the default: none where --decay lowers the\n"
        "  rate, inverse at a constant rate). --ps: rank 0 only serves and ranks 1..N-1 train.\n"
        "  Not with --zero, --accum > 1, --ckpt, --check-replicas; a NaN loss stops it.\n"
        "  --quota shared: the run's steps x workers gradients go to whichever worker is ready (a fast\n"
        "  one computes more of them); per-worker (the default): every worker computes the steps.\n"
        "  --straggler RANK:MS: that rank sleeps MS ms in every step (to see what a slow rank costs).\n"
        "  --jitter MS: every rank sleeps a random delay in every step, exponential with mean MS ms, drawn\n"
        "  from (seed, rank, step): slow steps that move from rank to rank, as on a shared cluster.\n"
        "  --local-steps H: local SGD as DiLoCo runs it: each rank takes H steps of its own (the optimizer\n"
        "  as configured, its state the rank's own), then the ranks average the change of the parameters\n"
        "  since the last averaging and take an outer step on it, SGD with Nesterov momentum (--outer-lr,\n"
        "  default %g; --outer-momentum, default %g; 1 and 0 are plain averaging); a round also ends at\n"
        "  each epoch's end and the last step. H times fewer bytes than sync, and --outer-compress fp16 or\n"
        "  int8 (a scale per %d values) cuts them 2x or 4x more. --lr is not scaled by N (--scale-lr\n"
        "  counts one rank). Checkpoints are taken at a round's end and keep every rank's optimizer\n"
        "  state. Not with --zero, --compress, --mode async or --check-replicas.\n"
        "  --precision bf16: the linear layers' products in bfloat16 with f32 sums (AMX or AVX512_BF16,\n"
        "  through oneDNN); parameters, gradients, optimizer and the other ops stay f32. fp32: all f32.\n"
        "With -n N (and no rank environment) it starts N local ranks of itself, rank r on its own CPU when\n"
        "they fit (--bind none, or TALLY_CPU_BIND=none, leaves their affinity as it is); under tally run,\n"
        "mpirun, srun or torchrun it joins that job.\n",
        TALLY__TRAIN_BATCH_DEFAULT, TALLY__SYNC_BUCKET_MB_DEFAULT, tally__model_info_of(TALLY__MODEL_MLP)->sgd_lr,
        TALLY__TRAIN_ADAMW_LR_DEFAULT, tally__model_info_of(TALLY__MODEL_CNN)->sgd_lr,
        tally__model_info_of(TALLY__MODEL_LINEAR)->sgd_lr, TALLY__TRAIN_LINEAR_FEATURES, gpt.layers, gpt.embd,
        gpt.heads, gpt.in_dim, TALLY__TRAIN_VAL_FRAC_DEFAULT, adamw.beta1, TALLY__GPT_BETA2_DEFAULT,
        TALLY__GPT_WEIGHT_DECAY_DEFAULT, TALLY__GPT_CLIP_DEFAULT, 100 * TALLY__GPT_WARMUP_FRAC_DEFAULT,
        TALLY__GPT_MIN_LR_DEFAULT, TALLY__CNN_BATCH_DEFAULT, TALLY__CNN_WEIGHT_DECAY_DEFAULT, TALLY__CKPT_KEEP_DEFAULT,
        TALLY__LOCAL_OUTER_LR_DEFAULT, TALLY__LOCAL_OUTER_MOMENTUM_DEFAULT, TALLY__INT8_BLOCK);
    if (TALLY__TRAIN_SEAMS)
        fprintf(out, "Testing aids (a build with the tests only): --inject-nan RANK:STEP feeds a NaN into that\n"
                     "rank's data at that step; --inject-flip RANK:STEP flips a bit of that rank's parameters after\n"
                     "that step; --inject-kill RANK:STEP kills that rank after that step (on the first start only).\n");
}

#define TRAIN_MAX_STEPS 1000000000000LL /* 1e12 */

static int parse_hidden(const char *flag, const char *s, int *hidden, int *n) {
    if (!tally__model_parse_hidden(s, hidden, n)) return 0;
    return tally__parse_fail(flag, s, "is not a list of widths",
                             "it takes up to 16 comma-separated widths, each a whole number in 1..1048576 (512,256)");
}

static int parse_word(const char *flag, const char *s, int (*parse)(const char *), const char *accepts, int *out) {
    int k = parse(s);
    if (k < 0) return tally__parse_fail(flag, s, "is not one of these", accepts);
    *out = k;
    return 0;
}

/* --data: fashion-mnist, synthetic, synthetic:N (a smaller generated set: quick runs and tests) or DIR. */
static int parse_data(const char *flag, const char *a, tally__train_cfg *c) {
    long long v;
    if (!*a) return tally__parse_fail(flag, a, "", "it takes fashion-mnist, synthetic, synthetic:N or a directory");
    c->data.source = a;
    if (strncmp(a, "synthetic:", 10)) return 0;
    if (tally__parse_int(flag, a + 10, 64, 10000000, &v))
        return tally__parse_fail(flag, a, "has no sample count after 'synthetic:'",
                                 "it takes synthetic:N, N a whole number in 64..10000000");
    c->data.source = "synthetic";
    c->data.synthetic_train = (size_t)v;
    c->data.synthetic_test = (size_t)v / 6 > 64 ? (size_t)v / 6 : 64;
    return 0;
}

static int parse_path(const char *flag, const char *a, const char **out) {
    if (!*a) return tally__parse_fail(flag, a, "", "it takes a path");
    *out = a;
    return 0;
}

enum {
    O_MODEL = 256,
    O_HIDDEN,
    O_DATA,
    O_EPOCHS,
    O_STEPS,
    O_BATCH,
    O_LR,
    O_SCALE_LR,
    O_OPT,
    O_MOMENTUM,
    O_WD,
    O_WARMUP,
    O_DECAY,
    O_MIN_LR,
    O_STEP_EVERY,
    O_STEP_GAMMA,
    O_ACCUM,
    O_BUCKET,
    O_NO_OVERLAP,
    O_SEED,
    O_THREADS,
    O_TRANSPORT,
    O_NO_EVAL,
    O_QUIET,
    O_JSON,
    O_ZERO,
    O_MAX_MEM,
    O_NAN,
    O_CHECK_REPLICAS,
    O_INJECT_NAN,
    O_INJECT_FLIP,
    O_CKPT,
    O_CKPT_EVERY,
    O_CKPT_KEEP,
    O_RESUME,
    O_MAX_RESTARTS,
    O_INJECT_KILL,
    O_COMPRESS,
    O_NO_EF,
    O_MODE,
    O_STALENESS,
    O_STALE_LR,
    O_PS,
    O_STRAGGLER,
    O_QUOTA,
    O_BIND,
    O_LAYERS,
    O_WIDTH,
    O_HEADS,
    O_CONTEXT,
    O_VAL_FRAC,
    O_CLIP,
    O_WD_ON,
    O_PLOT,
    O_TRACE,
    O_PRECISION,
    O_JITTER,
    O_LOCAL_STEPS,
    O_OUTER_LR,
    O_OUTER_MOMENTUM,
    O_OUTER_COMPRESS,
    O_NORMALIZE
};

static const struct option train_longs[] = {{"model", 1, 0, O_MODEL},
                                            {"hidden", 1, 0, O_HIDDEN},
                                            {"data", 1, 0, O_DATA},
                                            {"epochs", 1, 0, O_EPOCHS},
                                            {"steps", 1, 0, O_STEPS},
                                            {"batch", 1, 0, O_BATCH},
                                            {"lr", 1, 0, O_LR},
                                            {"scale-lr", 0, 0, O_SCALE_LR},
                                            {"optimizer", 1, 0, O_OPT},
                                            {"momentum", 1, 0, O_MOMENTUM},
                                            {"weight-decay", 1, 0, O_WD},
                                            {"warmup", 1, 0, O_WARMUP},
                                            {"decay", 1, 0, O_DECAY},
                                            {"min-lr", 1, 0, O_MIN_LR},
                                            {"step-every", 1, 0, O_STEP_EVERY},
                                            {"step-gamma", 1, 0, O_STEP_GAMMA},
                                            {"accum", 1, 0, O_ACCUM},
                                            {"bucket-mb", 1, 0, O_BUCKET},
                                            {"no-overlap", 0, 0, O_NO_OVERLAP},
                                            {"seed", 1, 0, O_SEED},
                                            {"threads", 1, 0, O_THREADS},
                                            {"transport", 1, 0, O_TRANSPORT},
                                            {"no-eval", 0, 0, O_NO_EVAL},
                                            {"quiet", 0, 0, O_QUIET},
                                            {"json", 1, 0, O_JSON},
                                            {"zero", 1, 0, O_ZERO},
                                            {"max-mem", 1, 0, O_MAX_MEM},
                                            {"nan", 1, 0, O_NAN},
                                            {"check-replicas", 1, 0, O_CHECK_REPLICAS},
                                            {"inject-nan", 1, 0, O_INJECT_NAN},
                                            {"inject-flip", 1, 0, O_INJECT_FLIP},
                                            {"ckpt", 1, 0, O_CKPT},
                                            {"ckpt-every", 1, 0, O_CKPT_EVERY},
                                            {"ckpt-keep", 1, 0, O_CKPT_KEEP},
                                            {"resume", 0, 0, O_RESUME},
                                            {"max-restarts", 1, 0, O_MAX_RESTARTS},
                                            {"inject-kill", 1, 0, O_INJECT_KILL},
                                            {"compress", 1, 0, O_COMPRESS},
                                            {"no-error-feedback", 0, 0, O_NO_EF},
                                            {"mode", 1, 0, O_MODE},
                                            {"staleness", 1, 0, O_STALENESS},
                                            {"stale-lr", 1, 0, O_STALE_LR},
                                            {"ps", 0, 0, O_PS},
                                            {"straggler", 1, 0, O_STRAGGLER},
                                            {"quota", 1, 0, O_QUOTA},
                                            {"bind", 1, 0, O_BIND},
                                            {"layers", 1, 0, O_LAYERS},
                                            {"width", 1, 0, O_WIDTH},
                                            {"heads", 1, 0, O_HEADS},
                                            {"context", 1, 0, O_CONTEXT},
                                            {"val-frac", 1, 0, O_VAL_FRAC},
                                            {"clip", 1, 0, O_CLIP},
                                            {"weight-decay-on", 1, 0, O_WD_ON},
                                            {"plot", 1, 0, O_PLOT},
                                            {"trace", 1, 0, O_TRACE},
                                            {"precision", 1, 0, O_PRECISION},
                                            {"jitter", 1, 0, O_JITTER},
                                            {"local-steps", 1, 0, O_LOCAL_STEPS},
                                            {"outer-lr", 1, 0, O_OUTER_LR},
                                            {"outer-momentum", 1, 0, O_OUTER_MOMENTUM},
                                            {"outer-compress", 1, 0, O_OUTER_COMPRESS},
                                            {"normalize", 1, 0, O_NORMALIZE},
                                            {"help", 0, 0, 'h'},
                                            {0, 0, 0, 0}};

/* Optimizer-specific flags are kept aside and applied once the optimizer is known. */
typedef struct pending {
    double momentum, wd;
    int has_momentum, has_wd;
    /* what models' defaults keep */
    int has_opt, has_clip, has_decay, has_min_lr, has_warmup, has_wd_on, has_batch, has_normalize;
    int has_async_only; /* --staleness, --stale-lr or --ps: meaningful only with --mode async */
    int has_outer;      /* --outer-*: meaningful only with --local-steps */
} pending;

/* "RANK:N": a rank and a count from 1 (a step, or milliseconds), each checked by the shared parser. */
static int parse_rank_step(const char *flag, const char *s, const char *what, long long max, int *rank, long *step) {
    char accepts[128];
    snprintf(accepts, sizeof accepts, "it takes RANK:%s, RANK in 0..%d and %s in 1..%lld", what,
             TALLY_LAUNCH_MAX_RANKS - 1, what, max);
    const char *colon = strchr(s, ':');
    char r[24];
    long long rv, kv;
    if (!colon || (size_t)(colon - s) >= sizeof r) return tally__parse_fail(flag, s, "is not RANK:", accepts);
    memcpy(r, s, (size_t)(colon - s));
    r[colon - s] = '\0';
    if (tally__parse_int(flag, r, 0, TALLY_LAUNCH_MAX_RANKS - 1, &rv) || tally__parse_int(flag, colon + 1, 1, max, &kv))
        return tally__parse_fail(flag, s, "is not RANK:N with both in range", accepts);
    *rank = (int)rv;
    *step = (long)kv;
    return 0;
}

/* --inject-*: a fault for the trainer's test seam (train_seam.h), which only a build with the tests has. */
static int parse_inject(int ch, const char *flag, const char *a, tally__train_faults *f) {
    if (!TALLY__TRAIN_SEAMS)
        return tally__seterr(TALLY_E_INVALID,
                             "%s injects a fault for the tests, and this build has no fault injection: build with "
                             "the tests (cmake -DTALLY_TESTS=ON, as ./test.sh does) to use it",
                             flag);
    int *rank = ch == O_INJECT_NAN ? &f->nan_rank : ch == O_INJECT_FLIP ? &f->flip_rank : &f->kill_rank;
    long *step = ch == O_INJECT_NAN ? &f->nan_step : ch == O_INJECT_FLIP ? &f->flip_step : &f->kill_step;
    return parse_rank_step(flag, a, "STEP", TRAIN_MAX_STEPS, rank, step);
}

static const char *const train_modes[] = {"sync", "async", NULL};
static const char *const train_quotas[] = {"per-worker", "shared", NULL};
static const char *const train_precisions[] = {"fp32", "bf16", NULL};
static const char *const train_transports[] = {"auto", "shm", "tcp", NULL};
static const char *const train_wd_on[] = {"all", "matrices", NULL};
static const char *const train_normalize[] = {"none", "mean-std", NULL};

/* The flags a model's training defaults (tally__train_gpt_defaults, _cnn_defaults) leave as they are. */
static unsigned train_given(const pending *p) {
    return (p->has_opt ? TALLY__GIVEN_OPTIM : 0) | (p->has_wd ? TALLY__GIVEN_WD : 0) |
           (p->has_wd_on ? TALLY__GIVEN_WD_ON : 0) | (p->has_clip ? TALLY__GIVEN_CLIP : 0) |
           (p->has_warmup ? TALLY__GIVEN_WARMUP : 0) | (p->has_decay ? TALLY__GIVEN_DECAY : 0) |
           (p->has_min_lr ? TALLY__GIVEN_MIN_LR : 0) | (p->has_batch ? TALLY__GIVEN_BATCH : 0) |
           (p->has_normalize ? TALLY__GIVEN_NORMALIZE : 0);
}

/* Flags that set a whole number: where it goes and its range. */
static int train_parse_int(int ch, const char *flag, const char *a, train_opts *o) {
    tally__train_cfg *c = &o->cfg;
    static const struct {
        int ch;
        long long lo, hi;
    } ranges[] = {{'n', 1, TALLY_LAUNCH_MAX_RANKS},
                  {O_EPOCHS, 1, 1000000},
                  {O_STEPS, 1, TRAIN_MAX_STEPS},
                  {O_BATCH, 1, 1 << 20},
                  {O_WARMUP, 0, TRAIN_MAX_STEPS},
                  {O_STEP_EVERY, 1, TRAIN_MAX_STEPS},
                  {O_ACCUM, 1, 1 << 20},
                  {O_THREADS, 1, 0 /* the CPUs allowed */},
                  {O_ZERO, 0, 3},
                  {O_CHECK_REPLICAS, 1, TRAIN_MAX_STEPS},
                  {O_CKPT_EVERY, 1, TRAIN_MAX_STEPS},
                  {O_CKPT_KEEP, 1, 1000000},
                  {O_MAX_RESTARTS, 0, 1000},
                  {O_STALENESS, 0, 1000000000},
                  {O_LOCAL_STEPS, 1, TRAIN_MAX_STEPS},
                  {O_LAYERS, 1, 1024},
                  {O_WIDTH, 1, 1 << 16},
                  {O_HEADS, 1, 1024},
                  {O_CONTEXT, 1, 1 << 16}};
    long long v;
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++) {
        if (ranges[i].ch != ch) continue;
        long long hi = ch == O_THREADS ? tally__cpus_allowed() : ranges[i].hi;
        if (tally__parse_int(flag, a, ranges[i].lo, hi, &v))
            return ch == O_THREADS ? tally__err_wrap(-1, "", " (the CPUs this process may use)") : -1;
        switch (ch) {
        case 'n': o->n = (int)v; break;
        case O_EPOCHS: c->epochs = (int)v; break;
        case O_STEPS: c->max_steps = (long)v; break;
        case O_BATCH: c->batch = (int)v; break;
        case O_WARMUP: c->opt.warmup_steps = (long)v; break;
        case O_STEP_EVERY: c->opt.step_every = (long)v; break;
        case O_ACCUM: c->sync.accum = (int)v; break;
        case O_THREADS: c->threads = (int)v; break;
        case O_ZERO: c->sync.zero = (int)v; break;
        case O_CHECK_REPLICAS: c->check_replicas = (long)v; break;
        case O_CKPT_EVERY: c->ckpt.every = (long)v; break;
        case O_CKPT_KEEP: c->ckpt.keep = (int)v; break;
        case O_MAX_RESTARTS: o->max_restarts = (int)v; break;
        case O_LAYERS: c->model.layers = (int)v; break;
        case O_WIDTH: c->model.embd = (int)v; break;
        case O_HEADS: c->model.heads = (int)v; break;
        case O_CONTEXT: c->model.in_dim = (int)v; break;
        case O_LOCAL_STEPS: c->local.steps = (long)v; break;
        default: c->async.staleness = (long)v; break;
        }
        return 0;
    }
    return 1; /* not one of these */
}

static int train_parse_one(int ch, const char *flag, const char *a, train_opts *o, pending *p) {
    tally__train_cfg *c = &o->cfg;
    double v;
    int k, rc;
    uint64_t bytes;
    if ((rc = train_parse_int(ch, flag, a, o)) <= 0) {
        if (ch == O_STALENESS) p->has_async_only = 1;
        if (ch == O_WARMUP) p->has_warmup = 1;
        if (ch == O_BATCH) p->has_batch = 1;
        return rc;
    }
    switch (ch) {
    case O_MODEL:
        return parse_word(flag, a, tally__model_parse, "it takes the model linear, mlp, cnn or gpt", &k)
                   ? -1
                   : (c->model.kind = (tally__model_kind)k, 0);
    case O_HIDDEN: return parse_hidden(flag, a, c->model.hidden, &c->model.nhidden);
    case O_DATA: return parse_data(flag, a, c);
    case O_LR: return tally__parse_real(flag, a, 0, 1, 1e6, &v) ? -1 : (c->opt.lr = (float)v, 0);
    case O_SCALE_LR: c->opt.scale_lr = 1; return 0;
    case O_OPT:
        p->has_opt = 1;
        if (parse_word(flag, a, tally_optim_parse, "it takes sgd or adamw", &k)) return -1;
        tally_optim_cfg_default(&c->opt.optim, (tally_optim_kind)k);
        return 0;
    case O_MOMENTUM: p->has_momentum = 1; return tally__parse_real(flag, a, 0, 0, 0.999999, &p->momentum);
    case O_WD: p->has_wd = 1; return tally__parse_real(flag, a, 0, 0, 10, &p->wd);
    case O_DECAY:
        p->has_decay = 1;
        return parse_word(flag, a, tally_decay_parse, "it takes none, cosine or step", &k)
                   ? -1
                   : (c->opt.decay = (tally_decay)k, 0);
    case O_MIN_LR:
        p->has_min_lr = 1;
        return tally__parse_real(flag, a, 0, 0, 1e6, &v) ? -1 : (c->opt.min_lr = (float)v, 0);
    case O_STEP_GAMMA: return tally__parse_real(flag, a, 0, 0, 1, &v) ? -1 : (c->opt.step_gamma = (float)v, 0);
    case O_BUCKET: return tally__parse_real(flag, a, 0, 1, 1 << 20, &c->sync.bucket_mb);
    case O_NO_OVERLAP: c->sync.no_overlap = 1; return 0;
    case O_SEED: return tally__parse_u64(flag, a, &c->seed);
    case O_TRANSPORT: return tally__parse_word(flag, a, train_transports, &k) ? -1 : (o->transport = a, 0);
    case O_BIND: return tally_place_parse(flag, a, &k) ? -1 : (o->bind = a, 0);
    case O_NO_EVAL: c->eval = 0; return 0;
    case O_QUIET: c->report.quiet = 1; return 0;
    case O_JSON: return parse_path(flag, a, &c->report.json);
    case O_PLOT: return parse_path(flag, a, &o->plot);
    case O_TRACE: return parse_path(flag, a, &o->trace);
    case O_NAN:
        return parse_word(flag, a, tally__nan_policy_parse, "it takes skip, error or ignore", &k)
                   ? -1
                   : (c->sync.nan_policy = k, 0);
    case O_INJECT_NAN:
    case O_INJECT_FLIP:
    case O_INJECT_KILL: return parse_inject(ch, flag, a, &o->faults);
    case O_CKPT: return parse_path(flag, a, &c->ckpt.dir);
    case O_RESUME: c->ckpt.resume = 1; return 0;
    case O_COMPRESS: return tally__codec_parse(a, &c->sync.codec);
    case O_NO_EF: c->sync.codec.error_feedback = 0; return 0;
    case O_MODE: return tally__parse_word(flag, a, train_modes, &k) ? -1 : (c->async.enabled = k == 1, 0);
    case O_PRECISION: return tally__parse_word(flag, a, train_precisions, &k) ? -1 : (c->bf16 = k == 1, 0);
    case O_STALE_LR:
        p->has_async_only = 1;
        return parse_word(flag, a, tally__stale_lr_parse, "it takes auto, none or inverse", &k)
                   ? -1
                   : (c->async.stale_lr = k, 0);
    case O_PS:
        p->has_async_only = 1;
        c->async.ps_dedicated = 1;
        return 0;
    case O_QUOTA:
        p->has_async_only = 1;
        return tally__parse_word(flag, a, train_quotas, &k) ? -1 : (c->async.shared_quota = k == 1, 0);
    case O_STRAGGLER: {
        long ms;
        if (parse_rank_step(flag, a, "MS", 3600000, &c->straggler_rank, &ms)) return -1;
        c->straggler_ms = (int)ms;
        return 0;
    }
    case O_VAL_FRAC: return tally__parse_real(flag, a, 0, 0, 0.9, &c->data.val_frac);
    case O_JITTER: return tally__parse_real(flag, a, 0, 1, 3600000, &c->jitter_ms);
    case O_OUTER_LR: p->has_outer = 1; return tally__parse_real(flag, a, 0, 1, 10, &c->local.outer_lr);
    case O_OUTER_MOMENTUM:
        p->has_outer = 1;
        return tally__parse_real(flag, a, 0, 0, 0.999999, &c->local.outer_momentum);
    case O_OUTER_COMPRESS:
        p->has_outer = 1;
        return tally__parse_word(flag, a, tally__outer_compress_words, &k) ? -1 : (c->local.compress = k, 0);
    case O_CLIP: p->has_clip = 1; return tally__parse_real(flag, a, 0, 0, 1e6, &v) ? -1 : (c->opt.clip = (float)v, 0);
    case O_WD_ON:
        p->has_wd_on = 1;
        return tally__parse_word(flag, a, train_wd_on, &k) ? -1 : (c->sync.decay_matrices = k == 1, 0);
    case O_NORMALIZE:
        p->has_normalize = 1;
        return tally__parse_word(flag, a, train_normalize, &k) ? -1 : (c->data.standardize = k == 1, 0);
    case O_MAX_MEM: return tally__parse_bytes(flag, a, 1, 1ull << 50, &bytes) ? -1 : (c->max_mem = (size_t)bytes, 0);
    default: return -1;
    }
}

typedef struct train_parse_ctx {
    train_opts *o;
    pending *p;
} train_parse_ctx;

static int train_flag(int ch, const char *flag, const char *a, void *ctx) {
    train_parse_ctx *t = ctx;
    return train_parse_one(ch, flag, a, t->o, t->p);
}

/* Where the default corpus is kept, as the XDG base directories say (the library reads no environment). */
static void train_cache_dir(train_opts *o) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(o->cache, sizeof o->cache, "%s", xdg);
    else if (home && *home)
        snprintf(o->cache, sizeof o->cache, "%s/.cache", home);
    o->cfg.data.cache_dir = o->cache[0] ? o->cache : NULL;
}

/* 0 to run, 1 for --help (printed), 2 after a message about a bad flag. */
static int train_parse(int argc, char **argv, train_opts *o) {
    memset(o, 0, sizeof *o);
    tally__train_cfg_default(&o->cfg);
    train_cache_dir(o);
    o->cfg.measure_peak = 1;
    pending p = {0};
    train_parse_ctx ctx = {o, &p};
    const tally_flags f = {
        .cmd = "train", .shorts = "n:h", .longs = train_longs, .first = 1, .one = train_flag, .usage = train_usage};
    int rc = tally_flags_parse(&f, argc, argv, &ctx);
    if (rc) return rc;
    if ((o->cfg.ckpt.resume || o->cfg.ckpt.every || o->max_restarts) && !o->cfg.ckpt.dir) {
        fprintf(stderr, "tally train: --resume, --ckpt-every and --max-restarts need --ckpt DIR\n");
        return 2;
    }
    if (p.has_async_only && !o->cfg.async.enabled) {
        fprintf(stderr, "tally train: --staleness, --stale-lr, --ps and --quota need --mode async\n");
        return 2;
    }
    if (p.has_outer && !o->cfg.local.steps) {
        fprintf(stderr, "tally train: --outer-lr, --outer-momentum and --outer-compress need --local-steps H\n");
        return 2;
    }
    if (o->cfg.model.kind == TALLY__MODEL_GPT) tally__train_gpt_defaults(&o->cfg, train_given(&p));
    if (o->cfg.model.kind == TALLY__MODEL_CNN) tally__train_cnn_defaults(&o->cfg, train_given(&p));
    if (p.has_momentum) o->cfg.opt.optim.momentum = (float)p.momentum;
    if (p.has_wd) o->cfg.opt.optim.weight_decay = (float)p.wd;
    if (tally__codec_check(&o->cfg.sync.codec, o->cfg.sync.zero, 0) || tally__local_check(&o->cfg, 0) ||
        tally__train_dgc_check(&o->cfg, 0)) {
        const char *msg = tally_last_error(), *after_rank = strstr(msg, ": "); /* no rank yet */
        fprintf(stderr, "tally train: %s\n", after_rank ? after_rank + 2 : msg);
        return 2;
    }
    return 0;
}

/* --plot: rank 0's observer keeps the history (and draws the progress line unless --quiet, which the
 * trainer would otherwise take to mean that nobody listens). */
static int train_plot_begin(train_opts *o, tally__progress *progress, tally_train_plot **out) {
    tally_train_plot *p = malloc(sizeof *p);
    if (!p) return fprintf(stderr, "tally train: --plot: out of memory\n"), -1;
    tally_train_plot_init(p, o->cfg.report.quiet ? NULL : progress);
    o->cfg.report.quiet = 0;
    o->cfg.report.observer = tally_train_plot_observe;
    o->cfg.report.observer_arg = p;
    *out = p;
    return 0;
}

static int train_plot_end(const train_opts *o, const tally_train_plot *p, const tally__run_info *info) {
    char title[256];
    snprintf(title, sizeof title, "tally train: %s %s on %s, %d rank%s", info->model, info->arch,
             info->data ? info->data : "its data", info->world, info->world == 1 ? "" : "s");
    if (!tally_train_plot_write(p, o->plot, title)) return 0;
    fprintf(stderr, "tally train: --plot %s: %s\n", o->plot, tally_last_error());
    return -1;
}

static int train_as_rank(train_opts *o) {
    tally__train_faults_arm(&o->faults);
    tally_comm *comm = NULL;
    int rc = tally_comm_init(&comm);
    if (rc) {
        fprintf(stderr, "tally train: %s\n", tally_last_error());
        return 1;
    }
    int rank = tally_comm_rank(comm), size = tally_comm_size(comm);
    if (o->n && o->n != size) {
        if (rank == 0) fprintf(stderr, "tally train: -n %d but the job has %d ranks\n", o->n, size);
        tally_comm_free(comm);
        return 2;
    }
    tally__train_result res;
    tally__progress progress;
    tally_train_plot *plot = NULL;
    int quiet = o->cfg.report.quiet;
    o->cfg.report.observer = tally__progress_observe;
    o->cfg.report.observer_arg = &progress;
    if (o->plot && rank == 0 && train_plot_begin(o, &progress, &plot)) {
        tally_comm_free(comm);
        return 1;
    }
    rc = tally__train(comm, &o->cfg, &res);
    if (rc) {
        fprintf(stderr, "tally train: %s\n", tally_last_error()); /* messages name their rank */
        tally__train_result_free(&res);
        tally_comm_free(comm);
        free(plot);
        return 1;
    }
    if (rank == 0) {
        tally__run_info info = {.model = tally__model_name(o->cfg.model.kind),
                                .data = res.data_name,
                                .transport = tally_comm_transport(comm),
                                .large_path = tally_comm_large_path(comm),
                                .optimizer = tally_optim_name(o->cfg.opt.optim.kind),
                                .decay = tally_decay_name(o->cfg.opt.decay),
                                .weight_decay = o->cfg.opt.optim.weight_decay,
                                .world = size,
                                .batch = o->cfg.batch,
                                .accum = o->cfg.sync.accum,
                                .epochs = o->cfg.epochs,
                                .overlap = !o->cfg.sync.no_overlap && size > 1 && !o->cfg.sync.zero,
                                .zero = o->cfg.sync.zero,
                                .bf16 = o->cfg.bf16,
                                .lr = res.lr,
                                .bucket_mb = o->cfg.sync.bucket_mb,
                                .outer_lr = o->cfg.local.outer_lr,
                                .outer_momentum = o->cfg.local.outer_momentum,
                                .outer_compress = tally__outer_compress_name(o->cfg.local.compress)};
        snprintf(info.arch, sizeof info.arch, "%s", res.arch);
        if (!quiet) tally__summary_print(stdout, &info, &res);
        if (o->cfg.report.json && tally__summary_json(o->cfg.report.json, &info, &res)) {
            fprintf(stderr, "tally train: %s\n", tally_last_error());
            rc = 1;
        }
        if (plot && train_plot_end(o, plot, &info)) rc = 1;
    }
    free(plot);
    tally__train_result_free(&res);
    if (tally_comm_free(comm) && o->trace) {
        fprintf(stderr, "tally train: --trace %s: %s\n", o->trace, tally_last_error());
        rc = 1;
    } else if (o->trace && rank == 0) {
        fprintf(stderr, "tally train: timeline of %d rank%s in %s (ui.perfetto.dev or chrome://tracing opens it)\n",
                size, size == 1 ? "" : "s", o->trace);
    }
    return rc ? 1 : 0;
}

int tally_cmd_train(int argc, char **argv) {
    train_opts o;
    int prc = train_parse(argc, argv, &o);
    if (prc) return prc == 1 ? 0 : 2;
    if (o.transport) setenv("TALLY_TRANSPORT", o.transport, 1);
    if (o.trace) setenv("TALLY_TRACE", o.trace, 1);
    if (!tally_launch_in_rank()) {
        tally_launch_opts lo = {.n = o.n ? o.n : 1,
                                .transport = o.transport,
                                .name = "tally train",
                                .max_restarts = o.max_restarts,
                                .bind = o.bind,
                                .cpus_per_rank = o.cfg.threads};
        return tally_launch_self(&lo, argc, argv);
    }
    /* A restarted rank (tally run or train --max-restarts) picks up where the last checkpoint left off. */
    long long restart = 0;
    if (tally__env_int("TALLY_RESTART", 0, 1000000, 0, &restart)) {
        fprintf(stderr, "tally train: %s (it is set by tally run and --max-restarts)\n", tally_last_error());
        return 2;
    }
    if (restart > 0) {
        if (o.cfg.ckpt.dir) o.cfg.ckpt.resume = 1;
        o.faults.kill_step = 0; /* the injected death happens once */
    }
    return train_as_rank(&o);
}
