/* memory.h - what a training run holds per rank, by ZeRO stage: the formulas the trainer checks
 * --max-mem against before allocating, and that tally plan prints (fp32 model state). */
#ifndef TALLY_PLAN_MEMORY_H
#define TALLY_PLAN_MEMORY_H

#include <stddef.h>
#include <tally/optim.h>

#include "../nn/model.h"

typedef struct tally__mem_need {
    size_t params, grads, optim; /* model state */
    size_t buffers; /* layer-sized: stage 2 gradient staging, stage 3 gathered layers (then their gradients)
                     * and its copy of a tied weight */
    size_t activations;
    size_t total;
} tally__mem_need;

/* Optimizer state bytes per parameter: 0 (SGD without momentum), 4 (momentum), 8 (AdamW). */
size_t tally__mem_optim_per_param(const tally_optim_cfg *o);
/* Per rank, for n ranks at ZeRO `stage`, as zero.c and model.c allocate (a shard counted as
 * ceil(P/n); the real one adds each layer's tail, fewer than n elements a layer). With overlap the
 * layer-sized buffers come in twos. */
tally__mem_need tally__mem_predict(const tally__model_desc *d, int stage, int n, const tally_optim_cfg *o, int overlap);

#endif
