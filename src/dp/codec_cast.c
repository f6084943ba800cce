/* codec_cast.c - bulk f32 <-> fp16 / bf16 conversions for the 16-bit codecs, round to nearest even
 * (NaN stays NaN, past the range gives Inf): F16C where the CPU has it, else dtype.c's scalar code. */
#include <string.h>

#include "../core/numeric/dtype.h"
#include "codec.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define F16C __attribute__((target("avx,f16c")))

static int has_f16c(void) {
    static int known = -1; /* a benign race: every thread computes the same answer */
    if (known < 0) {
        unsigned eax, ebx, ecx = 0, edx;
        known = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) && (ecx & (1u << 28));
    }
    return known;
}

/* vcvtps2ph / vcvtph2ps treat NaN, Inf, subnormals and overflow as dtype.c does (its conversions are
 * written to match them), so the two paths give the same bits; the scalar code takes the tails. */
static F16C size_t f16c_to_half(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}

static F16C size_t f16c_from_half(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    return i;
}
#else
static int has_f16c(void) { return 0; }
static size_t f16c_to_half(const float *src, uint16_t *dst, size_t n) { return (void)src, (void)dst, (void)n, 0; }
static size_t f16c_from_half(const uint16_t *src, float *dst, size_t n) { return (void)src, (void)dst, (void)n, 0; }
#endif

/* bf16 is the top half of an f32: dtype.c's rounding, inline so the loop vectorises. */
static inline uint16_t bf16_of(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

void tally__codec_to_half(const float *src, uint16_t *dst, size_t n, tally_dtype dt) {
    if (dt == TALLY_BF16) {
        for (size_t i = 0; i < n; i++) dst[i] = bf16_of(src[i]);
        return;
    }
    size_t i = has_f16c() ? f16c_to_half(src, dst, n) : 0;
    for (; i < n; i++) dst[i] = tally__f32_to_f16(src[i]);
}

void tally__codec_from_half(const uint16_t *src, float *dst, size_t n, tally_dtype dt) {
    if (dt == TALLY_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint32_t x = (uint32_t)src[i] << 16;
            memcpy(dst + i, &x, 4);
        }
        return;
    }
    size_t i = has_f16c() ? f16c_from_half(src, dst, n) : 0;
    for (; i < n; i++) dst[i] = tally__f16_to_f32(src[i]);
}
