/* norm.c - the gradient's global L2 norm in double, and the scaling that clips it to a maximum, as
 * PyTorch's clip_grad_norm_ computes them (its 1e-6 included). */
#include "norm.h"

#include <math.h>

double tally__grad_sumsq(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

double tally__grad_clip_to(float *x, size_t n, double sumsq, float max_norm) {
    double norm = sqrt(sumsq), coef = max_norm / (norm + 1e-6);
    if (coef < 1.0)
        for (size_t i = 0; i < n; i++) x[i] = (float)(x[i] * coef);
    return norm;
}
