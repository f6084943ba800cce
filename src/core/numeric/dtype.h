/* dtype.h - element sizes, which (dtype, op) pairs a reduction takes, and the f16/bf16 <-> f32
 * conversions (round to nearest even). */
#ifndef TALLY_CORE_DTYPE_H
#define TALLY_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>

static inline int tally__dtype_valid(int t) { return t >= 0 && t < TALLY_DTYPE_COUNT; }
static inline int tally__op_valid(int op) { return op >= 0 && op < TALLY_OP_COUNT; }

/* Whether op may reduce elements of dtype t: the bitwise ops take the integer types and BOOL only, AVG
 * takes every type but BOOL. Both must be valid codes. */
int tally__dtype_op_valid(int t, int op);
/* The dtypes op takes, in words for a message ("every dtype", "every dtype but bool", ...). */
const char *tally__op_takes(int op);

float tally__f16_to_f32(uint16_t h);
uint16_t tally__f32_to_f16(float f); /* round to nearest even; overflow to inf; NaN stays NaN */
float tally__bf16_to_f32(uint16_t h);
uint16_t tally__f32_to_bf16(float f); /* round to nearest even; NaN stays NaN (quiet) */

/* Element i of a buffer of dtype t, as a double, and back (rounded to the dtype; integers truncate; BOOL
 * loads any non-zero byte as 1 and stores any non-zero value as 1). For references and checks (tests,
 * the benchmark's -c), not for hot paths. */
double tally__dtype_load(const void *buf, size_t i, tally_dtype t);
void tally__dtype_store(void *buf, size_t i, tally_dtype t, double v);

#endif
