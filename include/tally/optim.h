/* tally/optim.h - optimizers (SGD with momentum, AdamW) over a flat run of parameters, and the
 * learning-rate schedule (linear scaling rule, warmup, cosine or step decay). */
#ifndef TALLY_OPTIM_H
#define TALLY_OPTIM_H

#include <stddef.h>
#include <tally.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TALLY_OPTIM_SGD, TALLY_OPTIM_ADAMW } tally_optim_kind;

typedef struct tally_optim_cfg {
    tally_optim_kind kind;
    float momentum;     /* SGD: 0 for plain SGD (no state allocated); PyTorch's convention */
    int nesterov;       /* SGD: Nesterov momentum */
    float beta1, beta2; /* AdamW, e.g. 0.9 and 0.999 */
    float eps;          /* AdamW, e.g. 1e-8 */
    float weight_decay; /* SGD: L2 added to the gradient; AdamW: decoupled, p -= lr*wd*p */
} tally_optim_cfg;

/* Fills the defaults: SGD momentum 0.9, AdamW betas 0.9/0.999, eps 1e-8, weight decay 0 (SGD) or
 * 0.01 (AdamW). */
TALLY_API void tally_optim_cfg_default(tally_optim_cfg *cfg, tally_optim_kind kind);

/* Optimizer state for n parameters (a whole model, or one rank's shard of it). */
typedef struct tally_optim {
    tally_optim_cfg cfg;
    size_t n;
    long step; /* updates applied so far */
    float *m;  /* SGD momentum buffer or Adam first moment; NULL when unused */
    float *v;  /* Adam second moment; NULL for SGD */
} tally_optim;

TALLY_API int tally_optim_init(tally_optim *o, const tally_optim_cfg *cfg, size_t n);
/* One update of params[n] from grads[n] at learning rate lr (identical on every rank given identical
 * inputs: no randomness, fixed order). params, grads and the state must not overlap. */
TALLY_API void tally_optim_step(tally_optim *o, float *params, const float *grads, float lr);
/* Bytes of optimizer state held (momentum / moments). */
TALLY_API size_t tally_optim_state_bytes(const tally_optim *o);
TALLY_API void tally_optim_free(tally_optim *o);
/* "sgd" / "adamw", and the reverse (-1 when unknown). */
TALLY_API const char *tally_optim_name(tally_optim_kind k);
TALLY_API int tally_optim_parse(const char *name);

typedef enum { TALLY_DECAY_NONE, TALLY_DECAY_COSINE, TALLY_DECAY_STEP } tally_decay;

typedef struct tally_lr_schedule {
    float lr;          /* peak learning rate (after any linear scaling) */
    long warmup_steps; /* linear ramp from lr/warmup_steps up to lr over these steps */
    tally_decay decay;
    long total_steps; /* cosine: decays from lr to min_lr between warmup_steps and total_steps */
    float min_lr;
    long step_every; /* step decay: multiply by step_gamma every step_every steps after warmup */
    float step_gamma;
} tally_lr_schedule;

/* The learning rate of update number `step` (0-based). */
TALLY_API float tally_lr_at(const tally_lr_schedule *s, long step);
/* The linear scaling rule: the per-rank base lr times the world size. */
static inline float tally_lr_scaled(float lr_per_rank, int world_size) { return lr_per_rank * (float)world_size; }
/* "none" / "cosine" / "step", and the reverse (-1 when unknown). */
TALLY_API const char *tally_decay_name(tally_decay d);
TALLY_API int tally_decay_parse(const char *name);

#ifdef __cplusplus
}
#endif
#endif
