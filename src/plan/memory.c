/* memory.c - the per-rank memory formulas of data parallelism and ZeRO (Rajbhandari et al., 2020),
 * in fp32: stage 0 16P with Adam, stage 1 8P + 8P/N, stage 2 4P + 12P/N, stage 3 16P/N, + buffers. */
#include "memory.h"

size_t tally__mem_optim_per_param(const tally_optim_cfg *o) {
    if (o->kind == TALLY_OPTIM_ADAMW) return 8;
    return o->momentum != 0.0f ? 4 : 0;
}

tally__mem_need tally__mem_predict(const tally__model_desc *d, int stage, int n, const tally_optim_cfg *o,
                                   int overlap) {
    const size_t f = sizeof(float), P = d->nparams, k = tally__mem_optim_per_param(o);
    size_t shard = n > 0 ? (P + (size_t)n - 1) / (size_t)n : P;
    tally__mem_need m = {0};
    m.params = (stage == 3 ? shard : P) * f;
    m.grads = (stage >= 2 ? shard : P) * f;
    m.optim = (stage >= 1 ? shard : P) * k;
    size_t copies = overlap && n > 1 ? 2 : 1; /* with overlap: one in use, one being filled or drained */
    m.buffers = copies * (stage >= 2 ? d->largest_layer * f : 0); /* stage 3 makes gradients in its gathered one */
    if (stage == 3) m.buffers += d->tied_floats * f;              /* the tied op's copy of the shared weight */
    m.activations = d->activation_bytes;
    m.total = m.params + m.grads + m.optim + m.buffers + m.activations;
    return m;
}
