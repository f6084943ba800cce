/* layers_act.c - the activations, forward and backward: ReLU (backward reads the forward output, so
 * the input need not be kept) and GELU in its tanh form (backward reads the input). */
#include <math.h>
#include <string.h>
#include <tally/layers.h>

#include "simd.h"

/* Explicit 4-lane vectors (simd.h): at the build's -O2 gcc neither vectorizes these loops nor
 * if-converts the scalar compare, and a branch on the sign of random activations mispredicts half
 * the time. A compare-and-mask has no branch at all. */

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

/* tanh of four lanes. On x86-64, glibc's libmvec (its SSE entry, which picks the best kernel for the CPU
 * at load time): libm's scalar tanhf was a third of a GPT step. Elsewhere the scalar call per lane. */
#if defined(__x86_64__) && defined(__SSE2__)
#include <xmmintrin.h>
__m128 _ZGVbN4v_tanhf(__m128 x);
static inline v4f tanh4(v4f u) { return (v4f)_ZGVbN4v_tanhf((__m128)u); }
#else
static inline v4f tanh4(v4f u) {
    for (int k = 0; k < 4; k++) u[k] = tanhf(u[k]);
    return u;
}
#endif

/* The formula once, for vectors of any width: the argument of tanh, then the value and the gradient
 * from t = tanh(that). */
#define GELU_ARG(v)    (GELU_K * ((v) + GELU_A * (v) * (v) * (v)))
#define GELU_VAL(v, t) (0.5f * (v) * (1.0f + (t)))
#define GELU_GRAD(v, t, g)                                                                                             \
    ((g) * (0.5f * (1.0f + (t)) + 0.5f * (v) * (1.0f - (t) * (t)) * GELU_K * (1.0f + 3.0f * GELU_A * (v) * (v))))

/* Four lanes at a time, the tail padded into one more vector so every element takes the same path. */
static inline v4f gelu4(v4f v) { return GELU_VAL(v, tanh4(GELU_ARG(v))); }
static inline v4f gelu_grad4(v4f v, v4f g) { return GELU_GRAD(v, tanh4(GELU_ARG(v)), g); }

/* W lanes at a time through libmvec's W-lane tanhf (VT the vector, MT its intrinsic type, TARGET what
 * the CPU must have): what a multiple of W covers. */
#define GELU_KERNELS(W, VT, MT, TANH, TARGET)                                                                          \
    __attribute__((target(TARGET))) static size_t gelu_forward##W(float *y, const float *x, size_t n) {                \
        size_t i = 0;                                                                                                  \
        for (; i + W <= n; i += W) {                                                                                   \
            VT v;                                                                                                      \
            memcpy(&v, x + i, sizeof v);                                                                               \
            VT t = (VT)TANH((MT)GELU_ARG(v)), r = GELU_VAL(v, t);                                                      \
            memcpy(y + i, &r, sizeof r);                                                                               \
        }                                                                                                              \
        return i;                                                                                                      \
    }                                                                                                                  \
    __attribute__((target(TARGET))) static size_t gelu_backward##W(float *dx, const float *dy, const float *x,         \
                                                                   size_t n) {                                         \
        size_t i = 0;                                                                                                  \
        for (; i + W <= n; i += W) {                                                                                   \
            VT v, g;                                                                                                   \
            memcpy(&v, x + i, sizeof v);                                                                               \
            memcpy(&g, dy + i, sizeof g);                                                                              \
            VT t = (VT)TANH((MT)GELU_ARG(v)), r = GELU_GRAD(v, t, g);                                                  \
            memcpy(dx + i, &r, sizeof r);                                                                              \
        }                                                                                                              \
        return i;                                                                                                      \
    }

/* Sixteen lanes where the CPU has AVX-512, eight where it has AVX2; none elsewhere. */
#if defined(__x86_64__) && defined(__SSE2__)
#include <immintrin.h>
typedef float v8f __attribute__((vector_size(32)));
__m256 _ZGVdN8v_tanhf(__m256 x);
__m512 _ZGVeN16v_tanhf(__m512 x);
GELU_KERNELS(8, v8f, __m256, _ZGVdN8v_tanhf, "avx2,fma")
GELU_KERNELS(16, v16f, __m512, _ZGVeN16v_tanhf, "avx512f,avx512dq")
#else
static size_t gelu_forward8(float *y, const float *x, size_t n) { return 0; }
static size_t gelu_backward8(float *dx, const float *dy, const float *x, size_t n) { return 0; }
static size_t gelu_forward16(float *y, const float *x, size_t n) { return 0; }
static size_t gelu_backward16(float *dx, const float *dy, const float *x, size_t n) { return 0; }
#endif

/* The widest lanes the CPU has, then four at a time for what is left. */
void tally_gelu_forward(float *y, const float *x, size_t n) {
    size_t i = tally__cpu_avx512() ? gelu_forward16(y, x, n) : 0;
    if (tally__cpu_avx2()) i += gelu_forward8(y + i, x + i, n - i);
    for (; i + 4 <= n; i += 4) store4(y + i, gelu4(load4(x + i)));
    if (i < n) {
        float t[4] = {0};
        memcpy(t, x + i, (n - i) * sizeof *t);
        v4f r = gelu4(load4(t));
        memcpy(y + i, &r, (n - i) * sizeof *y);
    }
}

void tally_gelu_backward(float *dx, const float *dy, const float *x, size_t n) {
    size_t i = tally__cpu_avx512() ? gelu_backward16(dx, dy, x, n) : 0;
    if (tally__cpu_avx2()) i += gelu_backward8(dx + i, dy + i, x + i, n - i);
    for (; i + 4 <= n; i += 4) store4(dx + i, gelu_grad4(load4(x + i), load4(dy + i)));
    if (i < n) {
        float tx[4] = {0}, tg[4] = {0};
        memcpy(tx, x + i, (n - i) * sizeof *tx);
        memcpy(tg, dy + i, (n - i) * sizeof *tg);
        v4f r = gelu_grad4(load4(tx), load4(tg));
        memcpy(dx + i, &r, (n - i) * sizeof *dx);
    }
}
