/* reduce.c - reduction entry points: picks the SIMD level once (CPU check, the config's isa) and holds the
 * scalar kernels, which are the fallback, the tails of the SIMD loops, and the definition they match. */
#include "reduce.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <strings.h>

#include "copy.h"
#include "dtype.h"
#include "../log.h"
#include "../parse.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

enum { ISA_SCALAR, ISA_AVX2, ISA_AVX512 };
static const char *const isa_names[] = {"scalar", "avx2", "avx512"};
static _Atomic int isa_chosen = -1;

static int isa_of_cpu(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init(); /* we may run before libgcc's own constructor */
    /* Older clang cannot name "f16c" in __builtin_cpu_supports, so ask CPUID (leaf 1, ECX bit 29). */
    unsigned eax, ebx, ecx = 0, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 29))) return ISA_SCALAR;
    if (!__builtin_cpu_supports("avx2")) return ISA_SCALAR;
    /* Every CPU with AVX512BW (Skylake-SP on) also has VL and DQ; the kernels use all four. */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return ISA_AVX512;
    return ISA_AVX2;
#else
    return ISA_SCALAR;
#endif
}

static int isa_choose(const char *want) {
    int cpu = isa_of_cpu();
    if (!want || !*want) return cpu;
    for (int l = ISA_SCALAR; l <= ISA_AVX512; l++)
        if (!strcasecmp(want, isa_names[l])) return l < cpu ? l : cpu;
    if (strcasecmp(want, "auto")) /* an unknown name must not cost speed, but must not pass unsaid */
        tally__log_warn("instruction set '%s' is not one of scalar, avx2, avx512, auto: using %s", want,
                        isa_names[cpu]);
    return cpu;
}

static int isa_level(void) {
    int l = atomic_load_explicit(&isa_chosen, memory_order_relaxed);
    if (l < 0) { /* racing first callers compute the same answer */
        l = isa_choose(NULL);
        atomic_store_explicit(&isa_chosen, l, memory_order_relaxed);
    }
    return l;
}

void tally__reduce_set_isa(const char *isa) { atomic_store(&isa_chosen, isa_choose(isa)); }

const char *tally__reduce_isa(void) { return isa_names[isa_level()]; }

/* IEEE 754-2019 minimum/maximum: NaN if either is NaN, and -0 < +0 so the answer does not depend on
 * the order the ranks' contributions arrive in. p + q turns a NaN quiet and keeps its payload. */
static inline float min_f32(float p, float q) {
    if (p != p || q != q) return p + q;
    if (p == q) return signbit(p) ? p : q;
    return p < q ? p : q;
}
static inline float max_f32(float p, float q) {
    if (p != p || q != q) return p + q;
    if (p == q) return signbit(p) ? q : p;
    return p > q ? p : q;
}
static inline double min_f64(double p, double q) {
    if (p != p || q != q) return p + q;
    if (p == q) return signbit(p) ? p : q;
    return p < q ? p : q;
}
static inline double max_f64(double p, double q) {
    if (p != p || q != q) return p + q;
    if (p == q) return signbit(p) ? q : p;
    return p > q ? p : q;
}

/* One loop per (dtype, op): T the element type, EXPR computes from p and q. */
#define LOOP(T, EXPR)                                                                                                  \
    do {                                                                                                               \
        T *d_ = dst;                                                                                                   \
        const T *x_ = a, *y_ = b;                                                                                      \
        for (size_t i_ = 0; i_ < n; i_++) {                                                                            \
            T p = x_[i_], q = y_[i_];                                                                                  \
            d_[i_] = (T)(EXPR);                                                                                        \
        }                                                                                                              \
    } while (0)

#define FLOAT_OPS(T, MINF, MAXF)                                                                                       \
    switch (op) {                                                                                                      \
    case TALLY_PROD: LOOP(T, p *q); break;                                                                             \
    case TALLY_MIN: LOOP(T, MINF(p, q)); break;                                                                        \
    case TALLY_MAX: LOOP(T, MAXF(p, q)); break;                                                                        \
    default: LOOP(T, p + q); break;                                                                                    \
    }

/* f16/bf16: widen both to f32, combine, round once. */
#define HALF_OPS(TO32, FROM32)                                                                                         \
    switch (op) {                                                                                                      \
    case TALLY_PROD: LOOP(uint16_t, FROM32(TO32(p) * TO32(q))); break;                                                 \
    case TALLY_MIN: LOOP(uint16_t, FROM32(min_f32(TO32(p), TO32(q)))); break;                                          \
    case TALLY_MAX: LOOP(uint16_t, FROM32(max_f32(TO32(p), TO32(q)))); break;                                          \
    default: LOOP(uint16_t, FROM32(TO32(p) + TO32(q))); break;                                                         \
    }

/* Integers wrap: U, an unsigned type at least as wide as unsigned int (narrower ones would promote to
 * int, whose overflow is undefined), makes overflow defined. Bitwise ops act on the two's-complement bits. */
#define INT_OPS(T, U)                                                                                                  \
    switch (op) {                                                                                                      \
    case TALLY_PROD: LOOP(T, (U)p *(U)q); break;                                                                       \
    case TALLY_MIN: LOOP(T, p < q ? p : q); break;                                                                     \
    case TALLY_MAX: LOOP(T, p > q ? p : q); break;                                                                     \
    case TALLY_BAND: LOOP(T, p &q); break;                                                                             \
    case TALLY_BOR: LOOP(T, p | q); break;                                                                             \
    case TALLY_BXOR: LOOP(T, p ^ q); break;                                                                            \
    default: LOOP(T, (U)p + (U)q); break;                                                                              \
    }

/* BOOL: any non-zero byte is true, and every result is 0 or 1, so a byte other than 1 from the caller
 * never spreads. SUM, MAX and BOR are or; PROD, MIN and BAND and; BXOR exclusive or. */
#define BOOL_OPS                                                                                                       \
    switch (op) {                                                                                                      \
    case TALLY_PROD:                                                                                                   \
    case TALLY_MIN:                                                                                                    \
    case TALLY_BAND: LOOP(uint8_t, p &&q); break;                                                                      \
    case TALLY_BXOR: LOOP(uint8_t, !p != !q); break;                                                                   \
    default: LOOP(uint8_t, p || q); break;                                                                             \
    }

static void reduce_scalar(void *dst, const void *a, const void *b, size_t n, tally_dtype t, tally_op op) {
    switch (t) {
    case TALLY_F32: FLOAT_OPS(float, min_f32, max_f32); break;
    case TALLY_F64: FLOAT_OPS(double, min_f64, max_f64); break;
    case TALLY_F16: HALF_OPS(tally__f16_to_f32, tally__f32_to_f16); break;
    case TALLY_BF16: HALF_OPS(tally__bf16_to_f32, tally__f32_to_bf16); break;
    case TALLY_I32: INT_OPS(int32_t, uint32_t); break;
    case TALLY_I64: INT_OPS(int64_t, uint64_t); break;
    case TALLY_U8: INT_OPS(uint8_t, unsigned); break;
    case TALLY_I8: INT_OPS(int8_t, unsigned); break;
    case TALLY_I16: INT_OPS(int16_t, unsigned); break;
    case TALLY_BOOL: BOOL_OPS; break;
    }
}

void tally__reduce(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op) {
    /* A pair the entry points refuse (a float with a bitwise op, BOOL with AVG) has no definition here. */
    if (count == 0 || !tally__dtype_op_valid((int)t, (int)op)) return;
    if (op == TALLY_AVG) op = TALLY_SUM;
    size_t done = 0;
    switch (isa_level()) {
    case ISA_AVX512: done = tally__reduce_avx512(dst, a, b, count, t, op); break;
    case ISA_AVX2: done = tally__reduce_avx2(dst, a, b, count, t, op); break;
    }
    if (done < count) {
        size_t off = done * tally_dtype_size(t);
        reduce_scalar((char *)dst + off, (const char *)a + off, (const char *)b + off, count - done, t, op);
    }
}

/* Bytes a tile of tally__reduce_stream holds: well inside L1 and L2, and each tile's fence (the streamed
 * lines out before the next tile) spread over enough lines to cost little. */
#define STREAM_TILE 32768

void tally__reduce_stream(void *dst, const void *a, const void *b, size_t count, tally_dtype t, tally_op op) {
    if (count == 0 || !tally__dtype_op_valid((int)t, (int)op)) return; /* dst stays as it was */
    size_t es = tally_dtype_size(t), lead = (64 - (uintptr_t)dst % 64) % 64;
    /* In place (dst is a source) its lines are read in anyway; and where no element starts on a line's
     * edge, no whole line can be streamed. */
    if (dst == a || dst == b || lead % es) {
        tally__reduce(dst, a, b, count, t, op);
        return;
    }
    char *d = dst;
    const char *x = a, *y = b;
    size_t head = lead / es < count ? lead / es : count, per = STREAM_TILE / es;
    tally__reduce(d, x, y, head, t, op);
    _Alignas(64) char tile[STREAM_TILE];
    for (size_t i = head; i < count; i += per) {
        size_t n = count - i < per ? count - i : per;
        tally__reduce(tile, x + i * es, y + i * es, n, t, op);
        tally__copy_stream(d + i * es, tile, n * es);
    }
}

#define AVG_LOOP(T, EXPR)                                                                                              \
    do {                                                                                                               \
        T *d_ = buf;                                                                                                   \
        for (size_t i_ = 0; i_ < n; i_++) {                                                                            \
            T p = d_[i_];                                                                                              \
            d_[i_] = (T)(EXPR);                                                                                        \
        }                                                                                                              \
    } while (0)

static void avg_scalar(void *buf, size_t n, tally_dtype t, int nranks) {
    switch (t) {
    case TALLY_F32: AVG_LOOP(float, p / (float)nranks); break;
    case TALLY_F64: AVG_LOOP(double, p / (double)nranks); break;
    case TALLY_F16: AVG_LOOP(uint16_t, tally__f32_to_f16(tally__f16_to_f32(p) / (float)nranks)); break;
    case TALLY_BF16: AVG_LOOP(uint16_t, tally__f32_to_bf16(tally__bf16_to_f32(p) / (float)nranks)); break;
    case TALLY_I32: AVG_LOOP(int32_t, p / nranks); break;
    case TALLY_I64: AVG_LOOP(int64_t, p / (int64_t)nranks); break;
    case TALLY_U8: AVG_LOOP(uint8_t, p / nranks); break;
    case TALLY_I8: AVG_LOOP(int8_t, p / nranks); break;
    case TALLY_I16: AVG_LOOP(int16_t, p / nranks); break;
    case TALLY_BOOL: break; /* AVG takes no BOOL */
    }
}

void tally__avg_finish(void *buf, size_t count, tally_dtype t, int n) {
    /* Dividing by 1 changes nothing; n < 1 is no world size, and INT_MIN / -1 would trap. */
    if (count == 0 || n <= 1 || !tally__dtype_valid((int)t)) return;
    size_t done = 0;
    switch (isa_level()) {
    case ISA_AVX512: done = tally__avg_finish_avx512(buf, count, t, n); break;
    case ISA_AVX2: done = tally__avg_finish_avx2(buf, count, t, n); break;
    }
    if (done < count) avg_scalar((char *)buf + done * tally_dtype_size(t), count - done, t, n);
}
