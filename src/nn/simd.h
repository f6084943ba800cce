/* simd.h - what the layers' kernels share below BLAS: four-lane vectors (GCC's vector extension) with
 * their lane masks and loads and stores that need only float alignment, and what this CPU can run,
 * asked once, so the wide kernels (libmvec's AVX2 and AVX-512 entries, bf16 casts) run only where they exist. */
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
