/* layers_act.c - the activations, forward and backward: ReLU (backward reads the forward output, so
 * the input need not be kept) and GELU in its tanh form (backward reads the input). */
#include <math.h>
#include <string.h>
#include <tally/layers.h>

/* Explicit 4-lane vectors: at the build's -O2 gcc neither vectorizes these loops nor if-converts
 * the scalar compare, and a branch on the sign of random activations mispredicts half the time.
 * A compare-and-mask has no branch at all. */
typedef float v4f __attribute__((vector_size(16)));
typedef int v4i __attribute__((vector_size(16)));

static inline v4f load4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v); /* activations need only float alignment */
    return v;
}

static inline void store4(float *p, v4f v) { memcpy(p, &v, sizeof v); }

/* v where mask is all ones, +0 where it is zero. */
static inline v4f keep(v4f v, v4i mask) { return (v4f)((v4i)v & mask); }

/* "Not <= 0" rather than "> 0": a NaN passes through, as in PyTorch, so a diverging run shows. */
void tally_relu_forward(float *y, const float *x, size_t n) {
    const v4f zero = {0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f v = load4(x + i);
        store4(y + i, keep(v, ~(v <= zero)));
    }
    for (; i < n; i++) y[i] = x[i] <= 0.0f ? 0.0f : x[i];
}

void tally_relu_backward(float *dx, const float *dy, const float *y, size_t n) {
    const v4f zero = {0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) store4(dx + i, keep(load4(dy + i), load4(y + i) > zero));
    for (; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

void tally_gelu_forward(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v)));
    }
}

void tally_gelu_backward(float *dx, const float *dy, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i], t = tanhf(GELU_K * (v + GELU_A * v * v * v));
        float du = GELU_K * (1.0f + 3.0f * GELU_A * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
}
