/* blas_core.h - which OpenBLAS kernels this process runs, and a better set for CPUs that OpenBLAS's own
 * detection does not know (it falls back to SSE kernels, 4-7x slower on an AVX-512 CPU newer than it). */
#ifndef TALLY_NN_BLAS_CORE_H
#define TALLY_NN_BLAS_CORE_H

/* The kernel set OpenBLAS chose at load ("Haswell", "SkylakeX", "Prescott", ...). */
const char *tally__blas_core_name(void);
/* The name to give OPENBLAS_CORETYPE for a faster kernel set, or NULL when there is none to give: it is
 * already set (the user's choice stands), OpenBLAS was built for one target only, or its pick is not an
 * SSE-only one (AVX2 and AVX-512 picks are kept: checkpoints written by them stay bit-identical). OpenBLAS
 * reads the variable when it loads, so the choice takes effect only in a process started after it is set. */
const char *tally__blas_core_better(void);

#endif
