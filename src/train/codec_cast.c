/* codec_cast.c - bulk f32 <-> fp16 / bf16 conversions for the 16-bit codecs, element by element with
 * the library's round-to-nearest-even scalar conversions (NaN stays NaN, past the range gives Inf). */
#include "../core/dtype.h"
#include "codec.h"

void tally__codec_to_half(const float *src, uint16_t *dst, size_t n, tally_dtype dt) {
    if (dt == TALLY_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = tally__f32_to_bf16(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = tally__f32_to_f16(src[i]);
}

void tally__codec_from_half(const uint16_t *src, float *dst, size_t n, tally_dtype dt) {
    if (dt == TALLY_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = tally__bf16_to_f32(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = tally__f16_to_f32(src[i]);
}
