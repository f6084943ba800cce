/* tally/layers.h - neural-network layers as forward/backward pairs on raw float arrays with explicit
 * sizes (row-major, batch first), for models built on flat parameter and gradient buffers. */
#ifndef TALLY_LAYERS_H
#define TALLY_LAYERS_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Backward passes ADD into parameter gradients (dw, db), so micro-batches accumulate; the caller
 * zeroes them when a step begins. Input gradients (dx) are overwritten. A NULL dx skips its work
 * (the first layer of a model needs none). For the layers with weights (linear, conv, layernorm) a NULL
 * dw skips the parameter gradients (db too), and with a NULL dx the weights are not read: a caller may
 * take dx first, then reuse the weights' memory for their gradients (ZeRO-3 does). Every layer uses one BLAS thread per call as configured by
 * the caller (openblas_set_num_threads). */

/* Linear: y[B,out] = x[B,in] . w[out,in]^T + b[out]   (w in PyTorch's [out,in] layout; b NULL: none). */
TALLY_API void tally_linear_forward(float *y, const float *x, const float *w, const float *b, int B, int in, int out);
/* dx[B,in] = dy . w;  dw[out,in] += dy^T . x;  db[out] += column sums of dy (db NULL: no bias). */
TALLY_API void tally_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                                     int B, int in, int out);

/* ReLU on n elements; y may equal x. Backward uses the forward output: dx = dy where y > 0, else 0;
 * dx may equal dy. */
TALLY_API void tally_relu_forward(float *y, const float *x, size_t n);
TALLY_API void tally_relu_backward(float *dx, const float *dy, const float *y, size_t n);

/* Softmax over C classes and cross-entropy against labels[B] (0 <= label < C), averaged over the batch.
 * Writes the probabilities to probs[B,C] and returns the mean loss. */
TALLY_API float tally_softmax_xent_forward(float *probs, const float *logits, const int32_t *labels, int B, int C);
/* dlogits[B,C] = (probs - onehot(labels)) / B: the gradient of the mean loss. */
TALLY_API void tally_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels, int B, int C);

/* Mean squared error for regression: returns 0.5 * sum((pred - target)^2) / B over pred[B,D];
 * backward: dpred = (pred - target) / B. */
TALLY_API float tally_mse_forward(const float *pred, const float *target, int B, int D);
TALLY_API void tally_mse_backward(float *dpred, const float *pred, const float *target, int B, int D);

/* 2-D convolution, NCHW, square kernel, by im2col + sgemm.
 * x[B,C,H,W], w[K,C,R,R], b[K] -> y[B,K,OH,OW], OH = (H + 2*pad - R)/stride + 1 (likewise OW). */
typedef struct tally_conv2d_shape {
    int C, H, W;     /* input channels, height, width */
    int K, R;        /* output channels, kernel size (R x R) */
    int stride, pad; /* stride >= 1, zero padding >= 0 */
} tally_conv2d_shape;
TALLY_API int tally_conv2d_out_h(const tally_conv2d_shape *s);
TALLY_API int tally_conv2d_out_w(const tally_conv2d_shape *s);
/* Floats of scratch the forward and backward passes need for a batch of B (the im2col buffer). */
TALLY_API size_t tally_conv2d_scratch_floats(const tally_conv2d_shape *s, int B);
TALLY_API void tally_conv2d_forward(float *y, const float *x, const float *w, const float *b,
                                    const tally_conv2d_shape *s, int B, float *scratch);
/* dx[B,C,H,W] (NULL allowed), dw[K,C,R,R] +=, db[K] +=, from dy[B,K,OH,OW]. */
TALLY_API void tally_conv2d_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                                     const tally_conv2d_shape *s, int B, float *scratch);

/* Max pooling, NCHW, k x k windows with stride k (H and W need not divide by k: the partial edge
 * windows are dropped, as PyTorch's floor mode). x[B,C,H,W] -> y[B,C,H/k,W/k]; argmax[B,C,H/k,W/k]
 * records which input element won (its offset within the image plane), for backward. */
TALLY_API void tally_maxpool_forward(float *y, int32_t *argmax, const float *x, int B, int C, int H, int W, int k);
/* dx[B,C,H,W] is overwritten: zero except at the winners, which get dy. */
TALLY_API void tally_maxpool_backward(float *dx, const float *dy, const int32_t *argmax, int B, int C, int H, int W,
                                      int k);

/* Embedding lookup: y[n,D] = w[tokens[i]] for each of n tokens (0 <= token < V, w[V,D] as PyTorch's
 * nn.Embedding). Returns the index of the first token outside 0..V-1, writing nothing for it and what
 * follows, or -1 when every token is in range. Backward scatter-adds: dw[tokens[i]] += dy[i], so a
 * token seen twice gets both rows. */
TALLY_API long tally_embedding_forward(float *y, const int32_t *tokens, const float *w, size_t n, int V, int D);
TALLY_API void tally_embedding_backward(float *dw, const float *dy, const int32_t *tokens, size_t n, int D);

/* LayerNorm over the last dimension (PyTorch's nn.LayerNorm(C), eps 1e-5): for each of n rows of C,
 * y = (x - mean) * rstd * w + b with rstd = 1 / sqrt(var + eps), var the biased variance. Keeps each
 * row's mean[n] and rstd[n] for backward. */
#define TALLY_LAYERNORM_EPS 1e-5f
TALLY_API void tally_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                                       const float *b, size_t n, int C);
/* dx[n,C] = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) with dxhat = dy * w;
 * dw[C] += sum over rows of dy * xhat; db[C] += sum of dy. */
TALLY_API void tally_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                                        const float *w, const float *mean, const float *rstd, size_t n, int C);

/* GELU in its tanh form (PyTorch's approximate='tanh', GPT-2's): y = x/2 (1 + tanh(sqrt(2/pi) (x +
 * 0.044715 x^3))). Backward reads the forward input; dx may equal dy. */
TALLY_API void tally_gelu_forward(float *y, const float *x, size_t n);
TALLY_API void tally_gelu_backward(float *dx, const float *dy, const float *x, size_t n);

/* Causal multi-head self-attention. qkv[B,T,3C] holds each position's query, key and value side by
 * side (head h's q at h*C/H, its k at C + h*C/H, its v at 2C + h*C/H: one linear layer's output, as
 * GPT-2's c_attn); y[B,T,C] gets the heads' outputs side by side. Position t attends to 0..t:
 * att = softmax(q k^T / sqrt(C/H)) with the future masked, y = att v. Keeps att[B,H,T,T] (the future
 * entries 0) for backward: 4 B H T^2 bytes. C must be a multiple of H. */
TALLY_API void tally_attention_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H);
/* dqkv[B,T,3C] (overwritten) from dy[B,T,C], the forward's qkv and att; scratch holds T*T floats. */
TALLY_API void tally_attention_backward(float *dqkv, float *scratch, const float *dy, const float *qkv,
                                        const float *att, int B, int T, int C, int H);

#ifdef __cplusplus
}
#endif
#endif
