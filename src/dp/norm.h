/* norm.h - the gradient's global L2 norm and its clipping (PyTorch's clip_grad_norm_), in two halves so
 * a sharded engine can add up the ranks' partial sums between them. */
#ifndef TALLY_DP_NORM_H
#define TALLY_DP_NORM_H

#include <stddef.h>

/* The sum of squares of x[n], in double. */
double tally__grad_sumsq(const float *x, size_t n);
/* x scaled by max_norm / (sqrt(sumsq) + 1e-6) when that is below 1; returns sqrt(sumsq), the norm
 * before clipping. sumsq is the whole model's, x any part of it. */
double tally__grad_clip_to(float *x, size_t n, double sumsq, float max_norm);

#endif
