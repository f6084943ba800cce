/* blas_core.c - which OpenBLAS kernels this process runs, and a better set where OpenBLAS's detection
 * falls back to SSE kernels on a CPU newer than its release (0.3.21 on Emerald Rapids picks Prescott). */
#include "blas_core.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "simd.h"

/* OpenBLAS's x86-64 targets without AVX: its fallbacks when a CPU's family or model is unknown to it. */
static const char *const sse_only_cores[] = {
    "prescott", "katmai", "coppermine", "northwood",     "banias",    "core2",  "penryn", "dunnington", "nehalem",
    "atom",     "athlon", "opteron",    "opteron(sse3)", "barcelona", "bobcat", "nano",   "unknown",
};

const char *tally__blas_core_name(void) {
    const char *name = openblas_get_corename();
    return name ? name : "unknown";
}

static int sse_only(const char *core) {
    for (size_t i = 0; i < sizeof sse_only_cores / sizeof sse_only_cores[0]; i++)
        if (strcasecmp(core, sse_only_cores[i]) == 0) return 1;
    return 0;
}

/* The best of OpenBLAS's x86-64 kernel sets this CPU (and its OS, which must save the wider registers)
 * can run, as simd.h asks it (AVX-512 with DQ is Skylake-X's set and later; Cooperlake adds BF16). */
static const char *cpu_best_core(void) {
    if (tally__cpu_avx512() && tally__cpu_avx512_bf16()) return "Cooperlake";
    if (tally__cpu_avx512()) return "SkylakeX";
    if (tally__cpu_avx2()) return "Haswell";
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx")) return "Sandybridge";
#endif
    return NULL;
}

const char *tally__blas_core_better(void) {
    if (getenv("OPENBLAS_CORETYPE")) return NULL;
    const char *config = openblas_get_config();
    if (!config || !strstr(config, "DYNAMIC_ARCH")) return NULL;
    if (!sse_only(tally__blas_core_name())) return NULL;
    return cpu_best_core();
}
