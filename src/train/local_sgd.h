/* local_sgd.h - local SGD as DiLoCo runs it (--local-steps H): every rank steps its own replica H times,
 * then the ranks average the parameter change and take an outer Nesterov step on it. */
#ifndef TALLY_TRAIN_LOCAL_SGD_H
#define TALLY_TRAIN_LOCAL_SGD_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>

#include "../ckpt/state.h"
#include "../dp/sync.h"

/* DiLoCo's outer optimizer: SGD with Nesterov momentum at these (Douillard et al., 2023). Outer lr 1 and
 * momentum 0 is plain parameter averaging (local SGD, FedAvg). */
#define TALLY__LOCAL_OUTER_LR_DEFAULT       0.7
#define TALLY__LOCAL_OUTER_MOMENTUM_DEFAULT 0.9

/* How the averaged change travels: f32 (an allreduce), fp16 (tally__codec_half_reduce's, scaled so it
 * neither overflows nor loses small changes) or int8 with a scale per block (tally__codec_int8_mean). */
typedef enum { TALLY__OUTER_F32, TALLY__OUTER_FP16, TALLY__OUTER_INT8 } tally__outer_compress;

typedef struct tally__local_cfg {
    long steps;            /* H, the steps between averagings; 0: synchronous training (every step) */
    double outer_lr;       /* > 0 (tally__train_cfg_default: TALLY__LOCAL_OUTER_LR_DEFAULT) */
    double outer_momentum; /* in [0, 1) (tally__train_cfg_default: TALLY__LOCAL_OUTER_MOMENTUM_DEFAULT) */
    int compress;          /* tally__outer_compress */
} tally__local_cfg;

/* "none", "fp16", "int8" (--outer-compress), in tally__outer_compress's order, NULL-terminated; a word's
 * index, or -1; and the word of one. */
extern const char *const tally__outer_compress_words[];
int tally__outer_compress_parse(const char *s);
const char *tally__outer_compress_name(int c);
/* What the averaged change sends against f32 (1, 0.5, 0.25: tally plan's and tally sim's outer_ratio),
 * and the wire a ratio stands for ("f32", "fp16", "int8"), as they print it. */
double tally__outer_compress_ratio(int c);
const char *tally__outer_ratio_name(double ratio);
/* The combinations local SGD refuses, as TALLY_E_INVALID naming the rank and the flag: a ZeRO stage,
 * --compress (each rank's gradients stay its own), --mode async, --check-replicas (the replicas differ
 * between averagings), an outer lr or momentum out of range. */
struct tally__train_cfg;
int tally__local_check(const struct tally__train_cfg *cfg, int rank);

typedef struct tally__local_sgd {
    tally__local_cfg cfg;
    tally_comm *world;  /* the ranks that average */
    tally__sync *inner; /* this rank's own engine (its communicator holds this rank alone) */
    int rank, size;
    size_t n;
    float *anchor;                       /* the parameters every rank held after the last averaging */
    float *momentum;                     /* the outer optimizer's buffer */
    float *delta;                        /* this rank's change over the round, then the ranks' mean */
    uint16_t *half;                      /* fp16: the change on the wire */
    long since;                          /* steps since the last averaging */
    long rounds;                         /* averagings so far (a resumed run counts on from its checkpoint) */
    long run_rounds;                     /* averagings this run */
    double seconds;                      /* in averaging and the outer step, this run */
    unsigned long long bytes, f32_bytes; /* sent averaging, this run; what one f32 allreduce of the
                                          * parameters sends (what synchronous training sends a step) */
} tally__local_sgd;

/* Over the inner engine's model, whose parameters every rank holds alike now (they become the anchor);
 * measures f32_bytes with one allreduce. Collective over world. */
int tally__local_open(tally__local_sgd *l, const tally__local_cfg *cfg, tally_comm *world, tally__sync *inner);
/* The round's end: the change since the anchor averaged over the ranks, the outer step, and every
 * replica set to the new anchor. A non-finite mean is an error (some replica diverged). Collective. */
int tally__local_average(tally__local_sgd *l);
void tally__local_close(tally__local_sgd *l);
/* Its state dict: outer.rounds, outer.momentum, and every rank's inner optimizer state (outer.inner.<r>.
 * <kind>, outer.inner_step), which the engine's optim.* hold only one of. Loaded at the same world size
 * each rank takes its own back (exact); at another each takes their mean. A checkpoint without them (of a
 * synchronous run) starts the outer state afresh. The engine's state must load first (the anchor is the
 * loaded parameters). */
void tally__local_state(tally__local_sgd *l, tally__state *out);

#endif
