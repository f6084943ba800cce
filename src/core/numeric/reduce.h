/* reduce.h - elementwise reduction kernels for every dtype and op (SIMD when the CPU has it).
 * f16/bf16 are computed in f32 and rounded once; min/max propagate NaN. */
#ifndef TALLY_CORE_REDUCE_H
#define TALLY_CORE_REDUCE_H

#include <stddef.h>
#include <tally.h>

/* dst[i] = a[i] op b[i] for i < count. dst may alias a or b (exactly, not partially). AVG is reduced as
 * SUM and finished by tally__avg_finish. A pair tally__dtype_op_valid refuses leaves dst as it was. */
void tally__reduce(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op);
/* As tally__reduce, dst written with non-temporal stores (tile by tile through the cache-resident stack):
 * for an output not read back soon, whose lines then need not be read in before they are written. In
 * place (dst is a or b) it is tally__reduce: those lines are read in anyway. */
void tally__reduce_stream(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op);
/* buf[i] /= n, for the AVG op after a SUM (integers: truncating division; BOOL has no AVG: unchanged). */
void tally__avg_finish(void *buf, size_t count, tally_dtype t, int n);
/* The instruction set the kernels dispatch to: "avx512", "avx2" or "scalar". */
const char *tally__reduce_isa(void);
/* Chooses the kernels again: "scalar", "avx2" or "avx512" (lowered to what the CPU has), or NULL, "" or
 * "auto" for the best the CPU has (also the choice before any call). The communicator sets it from its
 * config's isa (TALLY_ISA); tests and benchmarks use it to run every level. */
void tally__reduce_set_isa(const char *isa);

/* The SIMD kernels, one file per instruction set, called by reduce.c only once the CPU is known to
 * have it. They do a leading part of the work and return how many elements they did; reduce.c does
 * the rest with its scalar loop. op is never AVG here, and (t, op) is a valid pair. */
size_t tally__reduce_avx2(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op);
size_t tally__reduce_avx512(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op);
size_t tally__avg_finish_avx2(void *buf, size_t count, tally_dtype t, int n);
size_t tally__avg_finish_avx512(void *buf, size_t count, tally_dtype t, int n);

#endif
