/* attn_int.h - causal attention's two ways: products through BLAS (any CPU, any head size) and the fused
 * AVX-512 kernels (attn_fused.c); tally_attention_forward/backward pick one, the tests compare them. */
#ifndef TALLY_NN_ATTN_INT_H
#define TALLY_NN_ATTN_INT_H

/* 1 where the fused kernels run these shapes: a CPU with AVX-512 and a head size C/H a multiple of 16. */
int tally__attn_fused_fits(int T, int hs);
/* tally_attention_forward/backward's contract; 0, or -1 (nothing written) where the kernels' scratch
 * (4 T C floats forward, 7 T C backward, and (C/H + 4) T) could not be had. */
int tally__attn_fused_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H);
int tally__attn_fused_backward(float *dqkv, float *scratch, const float *dy, const float *qkv, const float *att, int B,
                               int T, int C, int H);
/* The same through cblas_sgemm, in causal blocks of 32 rows. */
void tally__attn_blas_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H);
void tally__attn_blas_backward(float *dqkv, float *scratch, const float *dy, const float *qkv, const float *att, int B,
                               int T, int C, int H);

#endif
