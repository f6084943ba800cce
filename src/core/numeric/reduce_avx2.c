/* reduce_avx2.c - AVX2 + F16C reduction and average kernels, compiled for that target whatever the
 * build flags (reduce.c calls them only on CPUs that have it); whole vectors here, tails in reduce.c. */
#include "reduce.h"

#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,f16c")))
#define INL  static inline AVX2 __attribute__((always_inline))
#define RNE  (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* ---- element ops on one vector; the min/max tricks make them match reduce.c's scalar code ---- */

INL __m256 f32_add(__m256 x, __m256 y) { return _mm256_add_ps(x, y); }
INL __m256 f32_mul(__m256 x, __m256 y) { return _mm256_mul_ps(x, y); }
/* minps answers its second operand when either is NaN or both are equal: taking it both ways and
 * OR-ing the bits gives a NaN if either is one, and -0 for min(-0, +0) in either order. */
INL __m256 f32_min(__m256 x, __m256 y) { return _mm256_or_ps(_mm256_min_ps(x, y), _mm256_min_ps(y, x)); }
/* AND gives +0 for max(-0, +0) but can clear a NaN's bits, so unordered lanes take x + y instead. */
INL __m256 f32_max(__m256 x, __m256 y) {
    __m256 r = _mm256_and_ps(_mm256_max_ps(x, y), _mm256_max_ps(y, x));
    return _mm256_blendv_ps(r, _mm256_add_ps(x, y), _mm256_cmp_ps(x, y, _CMP_UNORD_Q));
}

INL __m256d f64_add(__m256d x, __m256d y) { return _mm256_add_pd(x, y); }
INL __m256d f64_mul(__m256d x, __m256d y) { return _mm256_mul_pd(x, y); }
INL __m256d f64_min(__m256d x, __m256d y) { return _mm256_or_pd(_mm256_min_pd(x, y), _mm256_min_pd(y, x)); }
INL __m256d f64_max(__m256d x, __m256d y) {
    __m256d r = _mm256_and_pd(_mm256_max_pd(x, y), _mm256_max_pd(y, x));
    return _mm256_blendv_pd(r, _mm256_add_pd(x, y), _mm256_cmp_pd(x, y, _CMP_UNORD_Q));
}

INL __m256i i32_add(__m256i x, __m256i y) { return _mm256_add_epi32(x, y); }
INL __m256i i32_mul(__m256i x, __m256i y) { return _mm256_mullo_epi32(x, y); }
INL __m256i i32_min(__m256i x, __m256i y) { return _mm256_min_epi32(x, y); }
INL __m256i i32_max(__m256i x, __m256i y) { return _mm256_max_epi32(x, y); }

INL __m256i i64_add(__m256i x, __m256i y) { return _mm256_add_epi64(x, y); }
/* No 64-bit multiply before AVX-512DQ: lo*lo + ((hi*lo + lo*hi) << 32) is the product mod 2^64. */
INL __m256i i64_mul(__m256i x, __m256i y) {
    __m256i cross =
        _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), y), _mm256_mul_epu32(x, _mm256_srli_epi64(y, 32)));
    return _mm256_add_epi64(_mm256_mul_epu32(x, y), _mm256_slli_epi64(cross, 32));
}
INL __m256i i64_min(__m256i x, __m256i y) { return _mm256_blendv_epi8(x, y, _mm256_cmpgt_epi64(x, y)); }
INL __m256i i64_max(__m256i x, __m256i y) { return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi64(x, y)); }

INL __m256i u8_add(__m256i x, __m256i y) { return _mm256_add_epi8(x, y); }
/* No byte multiply: the low byte of a 16-bit product is the byte product mod 256, so multiply the
 * even bytes in place and the odd ones shifted down, and merge. */
INL __m256i u8_mul(__m256i x, __m256i y) {
    __m256i even = _mm256_and_si256(_mm256_mullo_epi16(x, y), _mm256_set1_epi16(0x00ff));
    __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(x, 8), _mm256_srli_epi16(y, 8));
    return _mm256_or_si256(even, _mm256_slli_epi16(odd, 8));
}
INL __m256i u8_min(__m256i x, __m256i y) { return _mm256_min_epu8(x, y); }
INL __m256i u8_max(__m256i x, __m256i y) { return _mm256_max_epu8(x, y); }

/* i8: the low byte of a sum or product does not depend on the sign; only min and max do. */
#define i8_add u8_add
#define i8_mul u8_mul
INL __m256i i8_min(__m256i x, __m256i y) { return _mm256_min_epi8(x, y); }
INL __m256i i8_max(__m256i x, __m256i y) { return _mm256_max_epi8(x, y); }

INL __m256i i16_add(__m256i x, __m256i y) { return _mm256_add_epi16(x, y); }
INL __m256i i16_mul(__m256i x, __m256i y) { return _mm256_mullo_epi16(x, y); }
INL __m256i i16_min(__m256i x, __m256i y) { return _mm256_min_epi16(x, y); }
INL __m256i i16_max(__m256i x, __m256i y) { return _mm256_max_epi16(x, y); }

/* Bitwise ops see bits, not elements: one set serves every integer width. */
INL __m256i bits_and(__m256i x, __m256i y) { return _mm256_and_si256(x, y); }
INL __m256i bits_or(__m256i x, __m256i y) { return _mm256_or_si256(x, y); }
INL __m256i bits_xor(__m256i x, __m256i y) { return _mm256_xor_si256(x, y); }

/* bool: min(byte, 1) is its truth as 0 or 1; min(x, y) is non-zero exactly when both are. */
INL __m256i bool_or(__m256i x, __m256i y) { return _mm256_min_epu8(_mm256_or_si256(x, y), _mm256_set1_epi8(1)); }
INL __m256i bool_and(__m256i x, __m256i y) { return _mm256_min_epu8(_mm256_min_epu8(x, y), _mm256_set1_epi8(1)); }
INL __m256i bool_xor(__m256i x, __m256i y) {
    __m256i one = _mm256_set1_epi8(1);
    return _mm256_xor_si256(_mm256_min_epu8(x, one), _mm256_min_epu8(y, one));
}

/* f16: 8 halves widen exactly to 8 floats; one RNE rounding back, as the scalar code does. */
#define F16_OP(name, OP)                                                                                               \
    INL __m128i name(__m128i x, __m128i y) { return _mm256_cvtps_ph(OP(_mm256_cvtph_ps(x), _mm256_cvtph_ps(y)), RNE); }
F16_OP(f16_add, f32_add)
F16_OP(f16_mul, f32_mul)
F16_OP(f16_min, f32_min)
F16_OP(f16_max, f32_max)

/* f32 -> bf16 in the low half of each 32-bit lane, round to nearest even by integer adds (the
 * AVX512-BF16 instruction would flush subnormals); a NaN is made quiet since truncating could
 * otherwise leave inf. */
INL __m256i bf16_round(__m256 v) {
    __m256i x = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd), 16);
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
/* bf16: a zero interleaved below each element is its f32; packus undoes the interleave lane by lane,
 * so 16 elements go out in the order they came in. */
#define BF16_LO(x) _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), x))
#define BF16_HI(x) _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), x))
#define BF16_OP(name, OP)                                                                                              \
    INL __m256i name(__m256i x, __m256i y) {                                                                           \
        return _mm256_packus_epi32(bf16_round(OP(BF16_LO(x), BF16_LO(y))), bf16_round(OP(BF16_HI(x), BF16_HI(y))));    \
    }
BF16_OP(bf16_add, f32_add)
BF16_OP(bf16_mul, f32_mul)
BF16_OP(bf16_min, f32_min)
BF16_OP(bf16_max, f32_max)

/* ---- loops: loads and stores are unaligned-safe; two vectors a turn keep two loads in flight ---- */

#define LD_PS(p)    _mm256_loadu_ps(p)
#define ST_PS(p, v) _mm256_storeu_ps(p, v)
#define LD_PD(p)    _mm256_loadu_pd(p)
#define ST_PD(p, v) _mm256_storeu_pd(p, v)
#define LD_SI(p)    _mm256_loadu_si256((const __m256i *)(p))
#define ST_SI(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define LD_X(p)     _mm_loadu_si128((const __m128i *)(p))
#define ST_X(p, v)  _mm_storeu_si128((__m128i *)(p), v)

#define KERNEL(name, T, V, W, LD, ST, OP)                                                                              \
    static AVX2 size_t name(void *dst, const void *a, const void *b, size_t n) {                                       \
        T *d = dst;                                                                                                    \
        const T *x = a, *y = b;                                                                                        \
        size_t i = 0;                                                                                                  \
        for (; i + 2 * (W) <= n; i += 2 * (W)) {                                                                       \
            V r0 = OP(LD(x + i), LD(y + i));                                                                           \
            V r1 = OP(LD(x + i + (W)), LD(y + i + (W)));                                                               \
            ST(d + i, r0);                                                                                             \
            ST(d + i + (W), r1);                                                                                       \
        }                                                                                                              \
        for (; i + (W) <= n; i += (W)) ST(d + i, OP(LD(x + i), LD(y + i)));                                            \
        return i;                                                                                                      \
    }
#define KERNELS(P, T, V, W, LD, ST)                                                                                    \
    KERNEL(P##_sum, T, V, W, LD, ST, P##_add)                                                                          \
    KERNEL(P##_prod, T, V, W, LD, ST, P##_mul)                                                                         \
    KERNEL(P##_minimum, T, V, W, LD, ST, P##_min)                                                                      \
    KERNEL(P##_maximum, T, V, W, LD, ST, P##_max)
/* Bytes, whatever the dtype: the integers' bitwise ops run on them with the count in bytes. */
#define BYTE_KERNEL(name, OP) KERNEL(name, uint8_t, __m256i, 32, LD_SI, ST_SI, OP)

KERNELS(f32, float, __m256, 8, LD_PS, ST_PS)
KERNELS(f64, double, __m256d, 4, LD_PD, ST_PD)
KERNELS(i32, int32_t, __m256i, 8, LD_SI, ST_SI)
KERNELS(i64, int64_t, __m256i, 4, LD_SI, ST_SI)
KERNELS(u8, uint8_t, __m256i, 32, LD_SI, ST_SI)
KERNELS(i8, int8_t, __m256i, 32, LD_SI, ST_SI)
KERNELS(i16, int16_t, __m256i, 16, LD_SI, ST_SI)
KERNELS(f16, uint16_t, __m128i, 8, LD_X, ST_X)
KERNELS(bf16, uint16_t, __m256i, 16, LD_SI, ST_SI)
BYTE_KERNEL(bytes_and, bits_and)
BYTE_KERNEL(bytes_or, bits_or)
BYTE_KERNEL(bytes_xor, bits_xor)
BYTE_KERNEL(bool_any, bool_or)
BYTE_KERNEL(bool_all, bool_and)
BYTE_KERNEL(bool_one, bool_xor)

typedef size_t (*kernel_fn)(void *, const void *, const void *, size_t);
#define ROW(P)                                                                                                         \
    { [TALLY_SUM] = P##_sum, [TALLY_PROD] = P##_prod, [TALLY_MIN] = P##_minimum, [TALLY_MAX] = P##_maximum }
/* bool: or for SUM, MAX and BOR; and for PROD, MIN and BAND. */
#define BOOL_ROW                                                                                                       \
    {                                                                                                                  \
        [TALLY_SUM] = bool_any, [TALLY_MAX] = bool_any, [TALLY_BOR] = bool_any, [TALLY_PROD] = bool_all,               \
        [TALLY_MIN] = bool_all, [TALLY_BAND] = bool_all, [TALLY_BXOR] = bool_one                                       \
    }
static const kernel_fn kernels[TALLY_DTYPE_COUNT][TALLY_OP_COUNT] = {
    [TALLY_F32] = ROW(f32), [TALLY_F64] = ROW(f64),  [TALLY_F16] = ROW(f16), [TALLY_BF16] = ROW(bf16),
    [TALLY_I32] = ROW(i32), [TALLY_I64] = ROW(i64),  [TALLY_U8] = ROW(u8),   [TALLY_I8] = ROW(i8),
    [TALLY_I16] = ROW(i16), [TALLY_BOOL] = BOOL_ROW,
};
static const kernel_fn bitwise[TALLY_OP_COUNT] = {
    [TALLY_BAND] = bytes_and, [TALLY_BOR] = bytes_or, [TALLY_BXOR] = bytes_xor};

size_t tally__reduce_avx2(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op) {
    kernel_fn k = kernels[t][op];
    if (k) return k(dst, a, b, count);
    /* An integer's bitwise op, on its bytes; 32 bytes hold whole elements, so none is cut. */
    size_t es = tally_dtype_size(t);
    return bitwise[op] ? bitwise[op](dst, a, b, count * es) / es : 0;
}

/* ---- AVG: divide (not multiply by 1/n, which rounds differently); integers stay scalar ---- */

static AVX2 size_t avg_f32(float *d, size_t n, float div) {
    __m256 v = _mm256_set1_ps(div);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) ST_PS(d + i, _mm256_div_ps(LD_PS(d + i), v));
    return i;
}

static AVX2 size_t avg_f64(double *d, size_t n, double div) {
    __m256d v = _mm256_set1_pd(div);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) ST_PD(d + i, _mm256_div_pd(LD_PD(d + i), v));
    return i;
}

static AVX2 size_t avg_f16(uint16_t *d, size_t n, float div) {
    __m256 v = _mm256_set1_ps(div);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) ST_X(d + i, _mm256_cvtps_ph(_mm256_div_ps(_mm256_cvtph_ps(LD_X(d + i)), v), RNE));
    return i;
}

static AVX2 size_t avg_bf16(uint16_t *d, size_t n, float div) {
    __m256 v = _mm256_set1_ps(div);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i x = LD_SI(d + i);
        ST_SI(d + i,
              _mm256_packus_epi32(bf16_round(_mm256_div_ps(BF16_LO(x), v)), bf16_round(_mm256_div_ps(BF16_HI(x), v))));
    }
    return i;
}

size_t tally__avg_finish_avx2(void *buf, size_t count, tally_dtype t, int n) {
    switch (t) {
    case TALLY_F32: return avg_f32(buf, count, (float)n);
    case TALLY_F64: return avg_f64(buf, count, (double)n);
    case TALLY_F16: return avg_f16(buf, count, (float)n);
    case TALLY_BF16: return avg_bf16(buf, count, (float)n);
    default: return 0;
    }
}

#else /* not x86-64: reduce.c never picks this level; these keep the link whole */

size_t tally__reduce_avx2(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op) {
    (void)dst, (void)a, (void)b, (void)count, (void)t, (void)op;
    return 0;
}
size_t tally__avg_finish_avx2(void *buf, size_t count, tally_dtype t, int n) {
    (void)buf, (void)count, (void)t, (void)n;
    return 0;
}

#endif
