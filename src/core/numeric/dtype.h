/* dtype.h - element sizes and the f16/bf16 <-> f32 conversions (round to nearest even). */
#ifndef TALLY_CORE_DTYPE_H
#define TALLY_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>

static inline int tally__dtype_valid(int t) { return t >= 0 && t < TALLY_DTYPE_COUNT; }
static inline int tally__op_valid(int op) { return op >= 0 && op < TALLY_OP_COUNT; }

float tally__f16_to_f32(uint16_t h);
uint16_t tally__f32_to_f16(float f); /* round to nearest even; overflow to inf; NaN stays NaN */
float tally__bf16_to_f32(uint16_t h);
uint16_t tally__f32_to_bf16(float f); /* round to nearest even; NaN stays NaN (quiet) */

/* Element i of a buffer of dtype t, as a double, and back (rounded to the dtype; integers truncate).
 * For references and checks (tests, the benchmark's -c), not for hot paths. */
double tally__dtype_load(const void *buf, size_t i, tally_dtype t);
void tally__dtype_store(void *buf, size_t i, tally_dtype t, double v);

#endif
