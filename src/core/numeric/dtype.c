/* dtype.c - element sizes, dtype/op names as the CLI spells them, and the f16/bf16 <-> f32
 * conversions (round to nearest even, as F16C does, so scalar and SIMD kernels agree bit for bit). */
#include "dtype.h"

#include <string.h>
#include <strings.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float tally__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) /* inf, or NaN made quiet as vcvtph2ps does */
        return f32_from_bits(sign | 0x7f800000u | (mant ? 0x400000u | (mant << 13) : 0));
    if (exp == 0) {
        if (mant == 0) return f32_from_bits(sign);
        /* Subnormal: shift the leading 1 up to the implicit position; every f16 subnormal is an f32 normal. */
        exp = 113;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            exp--;
        }
        return f32_from_bits(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t tally__f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) /* NaN: quiet, top payload bits kept, as vcvtps2ph does */
        return sign | 0x7e00u | (uint16_t)((x >> 13) & 0x3ffu);
    if (x >= 0x477ff000u) /* 65520 is the tie above 65504 and rounds (to even) to inf */
        return sign | 0x7c00u;
    if (x < 0x38800000u) { /* below 2^-14: an f16 subnormal (or zero) in units of 2^-24 */
        uint32_t e = x >> 23;
        if (e < 102) return sign; /* under 2^-25: rounds to zero even at the tie */
        uint32_t m = (x & 0x7fffffu) | 0x800000u;
        uint32_t s = 126 - e; /* 14..24 */
        uint32_t q = m >> s, r = m & ((1u << s) - 1), half = 1u << (s - 1);
        if (r > half || (r == half && (q & 1))) q++; /* q may reach 0x400, the smallest normal: right */
        return sign | (uint16_t)q;
    }
    uint32_t h = ((x >> 13) - (112u << 10)); /* rebias the exponent, keep the top 10 mantissa bits */
    uint32_t r = x & 0x1fffu;
    if (r > 0x1000u || (r == 0x1000u && (h & 1))) h++; /* a carry into the exponent is correct rounding */
    return sign | (uint16_t)h;
}

float tally__bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t tally__f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncating could leave an inf; set the quiet bit */
        return (uint16_t)((x >> 16) | 0x40u);
    /* Adding 0x7fff (+1 when the kept lsb is odd) carries exactly when the dropped half rounds up;
     * the largest finite values carry into the exponent and become inf, which is the right answer. */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static const struct {
    const char *name;
    size_t size;
} dtypes[TALLY_DTYPE_COUNT] = {
    [TALLY_F32] = {"f32", 4}, [TALLY_F64] = {"f64", 8}, [TALLY_F16] = {"f16", 2}, [TALLY_BF16] = {"bf16", 2},
    [TALLY_I32] = {"i32", 4}, [TALLY_I64] = {"i64", 8}, [TALLY_U8] = {"u8", 1},
};

static const char *const ops[TALLY_OP_COUNT] = {
    [TALLY_SUM] = "sum", [TALLY_AVG] = "avg", [TALLY_PROD] = "prod", [TALLY_MIN] = "min", [TALLY_MAX] = "max",
};

/* Spellings users bring from numpy, PyTorch and MPI. */
static const struct {
    const char *name;
    int value;
} dtype_aliases[] =
    {
        {"float", TALLY_F32},   {"float32", TALLY_F32},   {"fp32", TALLY_F32}, {"double", TALLY_F64},
        {"float64", TALLY_F64}, {"fp64", TALLY_F64},      {"half", TALLY_F16}, {"float16", TALLY_F16},
        {"fp16", TALLY_F16},    {"bfloat16", TALLY_BF16}, {"int", TALLY_I32},  {"int32", TALLY_I32},
        {"int64", TALLY_I64},   {"long", TALLY_I64},      {"uint8", TALLY_U8}, {"byte", TALLY_U8},
},
  op_aliases[] = {
      {"mean", TALLY_AVG},
      {"average", TALLY_AVG},
      {"product", TALLY_PROD},
      {"mul", TALLY_PROD},
};

size_t tally_dtype_size(tally_dtype t) { return tally__dtype_valid((int)t) ? dtypes[t].size : 0; }

const char *tally_dtype_name(tally_dtype t) { return tally__dtype_valid((int)t) ? dtypes[t].name : "invalid"; }

const char *tally_op_name(tally_op op) { return tally__op_valid((int)op) ? ops[op] : "invalid"; }

int tally_dtype_parse(const char *name) {
    if (!name) return -1;
    for (int t = 0; t < TALLY_DTYPE_COUNT; t++)
        if (!strcasecmp(name, dtypes[t].name)) return t;
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++)
        if (!strcasecmp(name, dtype_aliases[i].name)) return dtype_aliases[i].value;
    return -1;
}

int tally_op_parse(const char *name) {
    if (!name) return -1;
    for (int op = 0; op < TALLY_OP_COUNT; op++)
        if (!strcasecmp(name, ops[op])) return op;
    for (size_t i = 0; i < sizeof op_aliases / sizeof op_aliases[0]; i++)
        if (!strcasecmp(name, op_aliases[i].name)) return op_aliases[i].value;
    return -1;
}

double tally__dtype_load(const void *buf, size_t i, tally_dtype t) {
    switch (t) {
    case TALLY_F32: return ((const float *)buf)[i];
    case TALLY_F64: return ((const double *)buf)[i];
    case TALLY_F16: return tally__f16_to_f32(((const uint16_t *)buf)[i]);
    case TALLY_BF16: return tally__bf16_to_f32(((const uint16_t *)buf)[i]);
    case TALLY_I32: return ((const int32_t *)buf)[i];
    case TALLY_I64: return (double)((const int64_t *)buf)[i];
    default: return ((const uint8_t *)buf)[i];
    }
}

void tally__dtype_store(void *buf, size_t i, tally_dtype t, double v) {
    switch (t) {
    case TALLY_F32: ((float *)buf)[i] = (float)v; break;
    case TALLY_F64: ((double *)buf)[i] = v; break;
    case TALLY_F16: ((uint16_t *)buf)[i] = tally__f32_to_f16((float)v); break;
    case TALLY_BF16: ((uint16_t *)buf)[i] = tally__f32_to_bf16((float)v); break;
    case TALLY_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case TALLY_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    }
}
