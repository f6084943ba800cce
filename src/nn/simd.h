/* simd.h - what the layers' kernels share below BLAS: four- and sixteen-lane vectors (GCC's vector extension)
 * with their loads and stores that need only float alignment, the clones built per instruction set, and what
 * this CPU can run, asked once (libmvec's AVX2 and AVX-512 entries, bf16 casts run only where they exist). */
#ifndef TALLY_NN_SIMD_H
#define TALLY_NN_SIMD_H

#include <stdint.h>
#include <string.h>

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16))); /* a comparison's lanes: all ones or all zeros */

static inline v4f load4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v); /* activations need only float alignment */
    return v;
}

static inline void store4(float *p, v4f v) { memcpy(p, &v, sizeof v); }

/* Sixteen lanes: one AVX-512 register, two AVX2 or four SSE ones. A kernel written on them and marked
 * TALLY_SIMD_CLONES is built once per instruction set and the loader runs the CPU's best; every build
 * does the same arithmetic (no contraction into FMA: the build says -ffp-contract=off), so the result
 * does not depend on the CPU. */
typedef float v16f __attribute__((vector_size(64)));
/* What a cloned kernel calls must be built into each clone, or the AVX-512 build calls the SSE one; so
 * no call passes a v16f between builds with different vector ABIs, which GCC would warn about. */
#define TALLY_SIMD_INLINE static inline __attribute__((always_inline))
#pragma GCC diagnostic ignored "-Wpsabi"
typedef int32_t v16i __attribute__((vector_size(64)));

TALLY_SIMD_INLINE v16f load16(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

TALLY_SIMD_INLINE void store16(float *p, v16f v) { memcpy(p, &v, sizeof v); }

/* The lanes' sum, halves added pairwise in a fixed order. */
TALLY_SIMD_INLINE float sum16(v16f v) {
    float h[8];
    for (int k = 0; k < 8; k++) h[k] = v[k] + v[k + 8];
    return ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
}

TALLY_SIMD_INLINE v16f max16(v16f a, v16f b) {
    v16i a_wins = a > b;
    return (v16f)(((v16i)a & a_wins) | ((v16i)b & ~a_wins));
}

/* Not under ThreadSanitizer: the clones' resolver runs while the program is being loaded, before TSan's
 * runtime is up, and TSan's hooks in it crash there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TALLY_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TALLY_SIMD_CLONES
#endif

#if defined(__x86_64__)
static inline int tally__cpu_avx2(void) {
    static int has = -1;
    if (has < 0) has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return has;
}

static inline int tally__cpu_avx512(void) {
    static int has = -1;
    if (has < 0) has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    return has;
}

/* AVX512_BF16 (Cooper Lake, Sapphire Rapids and later) with the F, BW and VL its 512-bit forms need. */
static inline int tally__cpu_avx512_bf16(void) {
    static int has = -1;
    if (has < 0)
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
    return has;
}
#else
static inline int tally__cpu_avx2(void) { return 0; }
static inline int tally__cpu_avx512(void) { return 0; }
static inline int tally__cpu_avx512_bf16(void) { return 0; }
#endif

#endif
