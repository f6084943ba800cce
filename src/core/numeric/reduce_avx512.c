/* reduce_avx512.c - AVX-512 (F, BW, VL, DQ) reduction and average kernels, compiled for that target
 * whatever the build flags; masked loads and stores do the head and the tail, so each does every element. */
#include "reduce.h"

#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define INL    static inline AVX512 __attribute__((always_inline))
#define RNE    (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* ---- element ops on one vector; the min/max tricks make them match reduce.c's scalar code ---- */

#define OR_PS(x, y)  _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_castps_si512(y)))
#define AND_PS(x, y) _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_castps_si512(y)))
#define OR_PD(x, y)  _mm512_castsi512_pd(_mm512_or_si512(_mm512_castpd_si512(x), _mm512_castpd_si512(y)))
#define AND_PD(x, y) _mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(x), _mm512_castpd_si512(y)))

INL __m512 f32_add(__m512 x, __m512 y) { return _mm512_add_ps(x, y); }
INL __m512 f32_mul(__m512 x, __m512 y) { return _mm512_mul_ps(x, y); }
/* vminps answers its second operand when either is NaN or both are equal: taking it both ways and
 * OR-ing the bits gives a NaN if either is one, and -0 for min(-0, +0) in either order. */
INL __m512 f32_min(__m512 x, __m512 y) { return OR_PS(_mm512_min_ps(x, y), _mm512_min_ps(y, x)); }
/* AND gives +0 for max(-0, +0) but can clear a NaN's bits, so unordered lanes take x + y instead. */
INL __m512 f32_max(__m512 x, __m512 y) {
    __m512 r = AND_PS(_mm512_max_ps(x, y), _mm512_max_ps(y, x));
    return _mm512_mask_add_ps(r, _mm512_cmp_ps_mask(x, y, _CMP_UNORD_Q), x, y);
}

INL __m512d f64_add(__m512d x, __m512d y) { return _mm512_add_pd(x, y); }
INL __m512d f64_mul(__m512d x, __m512d y) { return _mm512_mul_pd(x, y); }
INL __m512d f64_min(__m512d x, __m512d y) { return OR_PD(_mm512_min_pd(x, y), _mm512_min_pd(y, x)); }
INL __m512d f64_max(__m512d x, __m512d y) {
    __m512d r = AND_PD(_mm512_max_pd(x, y), _mm512_max_pd(y, x));
    return _mm512_mask_add_pd(r, _mm512_cmp_pd_mask(x, y, _CMP_UNORD_Q), x, y);
}

INL __m512i i32_add(__m512i x, __m512i y) { return _mm512_add_epi32(x, y); }
INL __m512i i32_mul(__m512i x, __m512i y) { return _mm512_mullo_epi32(x, y); }
INL __m512i i32_min(__m512i x, __m512i y) { return _mm512_min_epi32(x, y); }
INL __m512i i32_max(__m512i x, __m512i y) { return _mm512_max_epi32(x, y); }

INL __m512i i64_add(__m512i x, __m512i y) { return _mm512_add_epi64(x, y); }
INL __m512i i64_mul(__m512i x, __m512i y) { return _mm512_mullo_epi64(x, y); }
INL __m512i i64_min(__m512i x, __m512i y) { return _mm512_min_epi64(x, y); }
INL __m512i i64_max(__m512i x, __m512i y) { return _mm512_max_epi64(x, y); }

INL __m512i u8_add(__m512i x, __m512i y) { return _mm512_add_epi8(x, y); }
/* No byte multiply: the low byte of a 16-bit product is the byte product mod 256, so multiply the
 * even bytes in place and the odd ones shifted down, and merge. */
INL __m512i u8_mul(__m512i x, __m512i y) {
    __m512i even = _mm512_and_si512(_mm512_mullo_epi16(x, y), _mm512_set1_epi16(0x00ff));
    __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(x, 8), _mm512_srli_epi16(y, 8));
    return _mm512_or_si512(even, _mm512_slli_epi16(odd, 8));
}
INL __m512i u8_min(__m512i x, __m512i y) { return _mm512_min_epu8(x, y); }
INL __m512i u8_max(__m512i x, __m512i y) { return _mm512_max_epu8(x, y); }

/* i8: the low byte of a sum or product does not depend on the sign; only min and max do. */
#define i8_add u8_add
#define i8_mul u8_mul
INL __m512i i8_min(__m512i x, __m512i y) { return _mm512_min_epi8(x, y); }
INL __m512i i8_max(__m512i x, __m512i y) { return _mm512_max_epi8(x, y); }

INL __m512i i16_add(__m512i x, __m512i y) { return _mm512_add_epi16(x, y); }
INL __m512i i16_mul(__m512i x, __m512i y) { return _mm512_mullo_epi16(x, y); }
INL __m512i i16_min(__m512i x, __m512i y) { return _mm512_min_epi16(x, y); }
INL __m512i i16_max(__m512i x, __m512i y) { return _mm512_max_epi16(x, y); }

/* Bitwise ops see bits, not elements: one set serves every integer width. */
INL __m512i bits_and(__m512i x, __m512i y) { return _mm512_and_si512(x, y); }
INL __m512i bits_or(__m512i x, __m512i y) { return _mm512_or_si512(x, y); }
INL __m512i bits_xor(__m512i x, __m512i y) { return _mm512_xor_si512(x, y); }

/* bool: min(byte, 1) is its truth as 0 or 1; min(x, y) is non-zero exactly when both are. */
INL __m512i bool_or(__m512i x, __m512i y) { return _mm512_min_epu8(_mm512_or_si512(x, y), _mm512_set1_epi8(1)); }
INL __m512i bool_and(__m512i x, __m512i y) { return _mm512_min_epu8(_mm512_min_epu8(x, y), _mm512_set1_epi8(1)); }
INL __m512i bool_xor(__m512i x, __m512i y) {
    __m512i one = _mm512_set1_epi8(1);
    return _mm512_xor_si512(_mm512_min_epu8(x, one), _mm512_min_epu8(y, one));
}

/* f16: 16 halves widen exactly to 16 floats; one RNE rounding back, as the scalar code does. */
#define F16_OP(name, OP)                                                                                               \
    INL __m256i name(__m256i x, __m256i y) { return _mm512_cvtps_ph(OP(_mm512_cvtph_ps(x), _mm512_cvtph_ps(y)), RNE); }
F16_OP(f16_add, f32_add)
F16_OP(f16_mul, f32_mul)
F16_OP(f16_min, f32_min)
F16_OP(f16_max, f32_max)

/* f32 -> bf16 in the low half of each 32-bit lane, round to nearest even by integer adds (vcvtneps2bf16
 * would flush subnormals); a NaN is made quiet since truncating could otherwise leave inf. */
INL __m512i bf16_round(__m512 v) {
    __m512i x = _mm512_castps_si512(v);
    __m512i top = _mm512_srli_epi32(x, 16);
    __m512i odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), odd), 16);
    return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), top, _mm512_set1_epi32(0x40));
}
/* bf16: a zero interleaved below each element is its f32; packus undoes the interleave lane by lane,
 * so 32 elements go out in the order they came in. */
#define BF16_LO(x) _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), x))
#define BF16_HI(x) _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), x))
#define BF16_OP(name, OP)                                                                                              \
    INL __m512i name(__m512i x, __m512i y) {                                                                           \
        return _mm512_packus_epi32(bf16_round(OP(BF16_LO(x), BF16_LO(y))), bf16_round(OP(BF16_HI(x), BF16_HI(y))));    \
    }
BF16_OP(bf16_add, f32_add)
BF16_OP(bf16_mul, f32_mul)
BF16_OP(bf16_min, f32_min)
BF16_OP(bf16_max, f32_max)

/* ---- loads and stores, whole (LD/ST) and masked (MLD/MST); masked ones never touch lanes off ---- */

#define LD_PS(p)         _mm512_loadu_ps(p)
#define MLD_PS(k, p)     _mm512_maskz_loadu_ps(k, p)
#define ST_PS(p, v)      _mm512_storeu_ps(p, v)
#define MST_PS(p, k, v)  _mm512_mask_storeu_ps(p, k, v)
#define LD_PD(p)         _mm512_loadu_pd(p)
#define MLD_PD(k, p)     _mm512_maskz_loadu_pd(k, p)
#define ST_PD(p, v)      _mm512_storeu_pd(p, v)
#define MST_PD(p, k, v)  _mm512_mask_storeu_pd(p, k, v)
#define LD_SI(p)         _mm512_loadu_si512(p)
#define ST_SI(p, v)      _mm512_storeu_si512(p, v)
#define MLD_32(k, p)     _mm512_maskz_loadu_epi32(k, p)
#define MST_32(p, k, v)  _mm512_mask_storeu_epi32(p, k, v)
#define MLD_64(k, p)     _mm512_maskz_loadu_epi64(k, p)
#define MST_64(p, k, v)  _mm512_mask_storeu_epi64(p, k, v)
#define MLD_8(k, p)      _mm512_maskz_loadu_epi8(k, p)
#define MST_8(p, k, v)   _mm512_mask_storeu_epi8(p, k, v)
#define MLD_16(k, p)     _mm512_maskz_loadu_epi16(k, p)
#define MST_16(p, k, v)  _mm512_mask_storeu_epi16(p, k, v)
#define LD_Y(p)          _mm256_loadu_si256((const __m256i *)(p))
#define ST_Y(p, v)       _mm256_storeu_si256((__m256i *)(p), v)
#define MLD_Y16(k, p)    _mm256_maskz_loadu_epi16(k, p)
#define MST_Y16(p, k, v) _mm256_mask_storeu_epi16(p, k, v)

/* Elements to do (masked) first so that most of the three streams then run on vector boundaries: a
 * 64-byte access that straddles two cache lines costs about two. Sources that share an alignment win,
 * since there are two of them; else dst, the stream written. */
static inline size_t head_len(const void *d, const void *a, const void *b, size_t esize, size_t w, size_t n) {
    size_t vb = esize * w, md = (uintptr_t)d % vb, ma = (uintptr_t)a % vb, mb = (uintptr_t)b % vb;
    size_t m = ma == mb || ma == md ? ma : mb == md ? mb : md;
    if (!m || m % esize) return 0;
    size_t h = (vb - m) / esize;
    return h < n ? h : n;
}
#define LOW_MASK(M, r) ((M)((r) >= 64 ? ~0ull : (1ull << (r)) - 1))

#define KERNEL(name, T, M, W, LD, MLD, ST, MST, OP)                                                                    \
    static AVX512 size_t name(void *dst, const void *a, const void *b, size_t n) {                                     \
        T *d = dst;                                                                                                    \
        const T *x = a, *y = b;                                                                                        \
        size_t i = head_len(d, x, y, sizeof(T), W, n);                                                                 \
        if (i) {                                                                                                       \
            M k = LOW_MASK(M, i);                                                                                      \
            MST(d, k, OP(MLD(k, x), MLD(k, y)));                                                                       \
        }                                                                                                              \
        for (; i + (W) <= n; i += (W)) ST(d + i, OP(LD(x + i), LD(y + i)));                                            \
        if (i < n) {                                                                                                   \
            M k = LOW_MASK(M, n - i);                                                                                  \
            MST(d + i, k, OP(MLD(k, x + i), MLD(k, y + i)));                                                           \
        }                                                                                                              \
        return n;                                                                                                      \
    }
#define KERNELS(P, T, M, W, LD, MLD, ST, MST)                                                                          \
    KERNEL(P##_sum, T, M, W, LD, MLD, ST, MST, P##_add)                                                                \
    KERNEL(P##_prod, T, M, W, LD, MLD, ST, MST, P##_mul)                                                               \
    KERNEL(P##_minimum, T, M, W, LD, MLD, ST, MST, P##_min)                                                            \
    KERNEL(P##_maximum, T, M, W, LD, MLD, ST, MST, P##_max)
/* Bytes, whatever the dtype: the integers' bitwise ops run on them with the count in bytes. */
#define BYTE_KERNEL(name, OP) KERNEL(name, uint8_t, __mmask64, 64, LD_SI, MLD_8, ST_SI, MST_8, OP)

KERNELS(f32, float, __mmask16, 16, LD_PS, MLD_PS, ST_PS, MST_PS)
KERNELS(f64, double, __mmask8, 8, LD_PD, MLD_PD, ST_PD, MST_PD)
KERNELS(i32, int32_t, __mmask16, 16, LD_SI, MLD_32, ST_SI, MST_32)
KERNELS(i64, int64_t, __mmask8, 8, LD_SI, MLD_64, ST_SI, MST_64)
KERNELS(u8, uint8_t, __mmask64, 64, LD_SI, MLD_8, ST_SI, MST_8)
KERNELS(i8, int8_t, __mmask64, 64, LD_SI, MLD_8, ST_SI, MST_8)
KERNELS(i16, int16_t, __mmask32, 32, LD_SI, MLD_16, ST_SI, MST_16)
KERNELS(f16, uint16_t, __mmask16, 16, LD_Y, MLD_Y16, ST_Y, MST_Y16)
KERNELS(bf16, uint16_t, __mmask32, 32, LD_SI, MLD_16, ST_SI, MST_16)
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

size_t tally__reduce_avx512(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op) {
    kernel_fn k = kernels[t][op];
    if (k) return k(dst, a, b, count);
    /* An integer's bitwise op, on its bytes (all of them: the masked tail ends on the last). */
    size_t es = tally_dtype_size(t);
    return bitwise[op] ? bitwise[op](dst, a, b, count * es) / es : 0;
}

/* ---- AVG: divide (not multiply by 1/n, which rounds differently); integers stay scalar ---- */

#define AVG_KERNEL(name, T, M, W, LD, MLD, ST, MST, VT, SET, DIV)                                                      \
    static AVX512 size_t name(T *d, size_t n, int nranks) {                                                            \
        VT v = SET(nranks);                                                                                            \
        size_t i = 0;                                                                                                  \
        for (; i + (W) <= n; i += (W)) ST(d + i, DIV(LD(d + i)));                                                      \
        if (i < n) {                                                                                                   \
            M k = LOW_MASK(M, n - i);                                                                                  \
            MST(d + i, k, DIV(MLD(k, d + i)));                                                                         \
        }                                                                                                              \
        return n;                                                                                                      \
    }
#define SET_PS(n)   _mm512_set1_ps((float)(n))
#define SET_PD(n)   _mm512_set1_pd((double)(n))
#define DIV_PS(x)   _mm512_div_ps(x, v)
#define DIV_PD(x)   _mm512_div_pd(x, v)
#define DIV_F16(x)  _mm512_cvtps_ph(_mm512_div_ps(_mm512_cvtph_ps(x), v), RNE)
#define DIV_BF16(x) _mm512_packus_epi32(bf16_round(DIV_PS(BF16_LO(x))), bf16_round(DIV_PS(BF16_HI(x))))

AVG_KERNEL(avg_f32, float, __mmask16, 16, LD_PS, MLD_PS, ST_PS, MST_PS, __m512, SET_PS, DIV_PS)
AVG_KERNEL(avg_f64, double, __mmask8, 8, LD_PD, MLD_PD, ST_PD, MST_PD, __m512d, SET_PD, DIV_PD)
AVG_KERNEL(avg_f16, uint16_t, __mmask16, 16, LD_Y, MLD_Y16, ST_Y, MST_Y16, __m512, SET_PS, DIV_F16)
AVG_KERNEL(avg_bf16, uint16_t, __mmask32, 32, LD_SI, MLD_16, ST_SI, MST_16, __m512, SET_PS, DIV_BF16)

size_t tally__avg_finish_avx512(void *buf, size_t count, tally_dtype t, int n) {
    switch (t) {
    case TALLY_F32: return avg_f32(buf, count, n);
    case TALLY_F64: return avg_f64(buf, count, n);
    case TALLY_F16: return avg_f16(buf, count, n);
    case TALLY_BF16: return avg_bf16(buf, count, n);
    default: return 0;
    }
}

#else /* not x86-64: reduce.c never picks this level; these keep the link whole */

size_t tally__reduce_avx512(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op) {
    (void)dst, (void)a, (void)b, (void)count, (void)t, (void)op;
    return 0;
}
size_t tally__avg_finish_avx512(void *buf, size_t count, tally_dtype t, int n) {
    (void)buf, (void)count, (void)t, (void)n;
    return 0;
}

#endif
