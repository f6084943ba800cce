/* cpu.h - what this CPU can run, asked once: the layers' wide kernels (libmvec's AVX2 and AVX-512
 * entries) are taken only where the instructions exist. */
#ifndef TALLY_NN_CPU_H
#define TALLY_NN_CPU_H

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
#else
static inline int tally__cpu_avx2(void) { return 0; }
static inline int tally__cpu_avx512(void) { return 0; }
#endif

#endif
