/* gemm_bf16.h - matrix products on bfloat16 inputs with f32 accumulation and output (oneDNN's matmul:
 * AMX or AVX512_BF16), and the f32 -> bf16 casts that feed them; for --precision bf16. */
#ifndef TALLY_NN_GEMM_BF16_H
#define TALLY_NN_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>

/* 0 when this build and this CPU run bf16 products; else TALLY_E_UNSUPPORTED with the reason set (no oneDNN in
 * the build, or a CPU without AVX512_BF16) and what to do. */
int tally__bf16_check(void);
/* 1 where this CPU shows AMX's bf16 tiles and the kernel keeps their state (XCR0), so oneDNN runs the products
 * on them; 0 where it lacks them or a hypervisor hides them, and the products run on AVX512_BF16 alone. */
int tally__bf16_on_amx(void);
/* The oneDNN implementation the products run ("brg:avx512_core_amx_bf16"), or "" before the first. */
const char *tally__bf16_impl(void);
/* The threads oneDNN's products may use (its OpenMP runtime's), as BLAS's: one per rank by default. */
void tally__bf16_threads(int threads);
/* dst[i] = src[i] rounded to bf16 (nearest even). */
void tally__bf16_cast(uint16_t *dst, const float *src, size_t n);
/* C = op(A) op(B) + beta C, row-major as cblas_sgemm: op(A) is M x K (A is K x M when trans_a), op(B) is
 * K x N (B is N x K when trans_b); beta is 0 or 1. Returns 0, or an error code with the message set. */
int tally__gemm_bf16(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B,
                     int ldb, float beta, float *C, int ldc);

#endif
