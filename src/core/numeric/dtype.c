/* dtype.c - element sizes, dtype/op names as the CLI spells them, the (dtype, op) pairs a reduction takes,
 * and the f16/bf16 <-> f32 conversions (round to nearest even, as F16C does, so SIMD and scalar agree). */
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
    [TALLY_F32] = {"f32", 4}, [TALLY_F64] = {"f64", 8},   [TALLY_F16] = {"f16", 2}, [TALLY_BF16] = {"bf16", 2},
    [TALLY_I32] = {"i32", 4}, [TALLY_I64] = {"i64", 8},   [TALLY_U8] = {"u8", 1},   [TALLY_I8] = {"i8", 1},
    [TALLY_I16] = {"i16", 2}, [TALLY_BOOL] = {"bool", 1},
};

static const char *const ops[TALLY_OP_COUNT] = {
    [TALLY_SUM] = "sum", [TALLY_AVG] = "avg",   [TALLY_PROD] = "prod", [TALLY_MIN] = "min",
    [TALLY_MAX] = "max", [TALLY_BAND] = "band", [TALLY_BOR] = "bor",   [TALLY_BXOR] = "bxor",
};

/* Spellings users bring from numpy, PyTorch and MPI. */
static const struct {
    const char *name;
    int value;
} dtype_aliases[] =
    {
        {"float", TALLY_F32},   {"float32", TALLY_F32},   {"fp32", TALLY_F32},  {"double", TALLY_F64},
        {"float64", TALLY_F64}, {"fp64", TALLY_F64},      {"half", TALLY_F16},  {"float16", TALLY_F16},
        {"fp16", TALLY_F16},    {"bfloat16", TALLY_BF16}, {"int", TALLY_I32},   {"int32", TALLY_I32},
        {"int64", TALLY_I64},   {"long", TALLY_I64},      {"uint8", TALLY_U8},  {"byte", TALLY_U8},
        {"int8", TALLY_I8},     {"int16", TALLY_I16},     {"short", TALLY_I16},
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

static int dtype_is_integer(int t) {
    return t == TALLY_U8 || t == TALLY_I8 || t == TALLY_I16 || t == TALLY_I32 || t == TALLY_I64;
}

static int op_is_bitwise(int op) { return op == TALLY_BAND || op == TALLY_BOR || op == TALLY_BXOR; }

int tally__dtype_op_valid(int t, int op) {
    if (!tally__dtype_valid(t) || !tally__op_valid(op)) return 0;
    if (op_is_bitwise(op)) return dtype_is_integer(t) || t == TALLY_BOOL;
    return !(op == TALLY_AVG && t == TALLY_BOOL); /* a mean of truth values is no truth value */
}

const char *tally__op_takes(int op) {
    if (op_is_bitwise(op)) return "the integer dtypes (u8, i8, i16, i32, i64) and bool";
    if (op == TALLY_AVG) return "every dtype but bool";
    return tally__op_valid(op) ? "every dtype" : "no dtype";
}

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
    case TALLY_U8: return ((const uint8_t *)buf)[i];
    case TALLY_I8: return ((const int8_t *)buf)[i];
    case TALLY_I16: return ((const int16_t *)buf)[i];
    case TALLY_BOOL: return ((const uint8_t *)buf)[i] != 0;
    }
    return 0;
}

void tally__dtype_store(void *buf, size_t i, tally_dtype t, double v) {
    switch (t) {
    case TALLY_F32: ((float *)buf)[i] = (float)v; break;
    case TALLY_F64: ((double *)buf)[i] = v; break;
    case TALLY_F16: ((uint16_t *)buf)[i] = tally__f32_to_f16((float)v); break;
    case TALLY_BF16: ((uint16_t *)buf)[i] = tally__f32_to_bf16((float)v); break;
    case TALLY_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case TALLY_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case TALLY_U8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case TALLY_I8: ((int8_t *)buf)[i] = (int8_t)(int64_t)v; break; /* wraps, as the kernels do */
    case TALLY_I16: ((int16_t *)buf)[i] = (int16_t)(int64_t)v; break;
    case TALLY_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
    }
}
