/* test_reduce.c - checks the reduction kernels at every SIMD level the CPU has, and the dtype helpers,
 * against references written here (own f16/bf16 rounding via frexp/rint); bitwise, NaN matches any NaN. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/numeric/copy.h"
#include "core/numeric/dtype.h"
#include "core/numeric/reduce.h"
#include "harness.h"

static long checks;

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        fprintf(stderr, "test_reduce: FAIL at %s:%d: ", __FILE__, __LINE__);                                           \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fprintf(stderr, "\n");                                                                                         \
        exit(1);                                                                                                       \
    } while (0)
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        checks++;                                                                                                      \
        if (!(cond)) FAIL(__VA_ARGS__);                                                                                \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t dbits(double f) {
    uint64_t u;
    memcpy(&u, &f, 8);
    return u;
}
static double bitsd(uint64_t u) {
    double f;
    memcpy(&f, &u, 8);
    return f;
}

/* ---- reference conversions, by value (ldexp/frexp/rint) rather than by bit surgery ---- */

static float ref_h2f(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)(h & 0x8000 ? -v : v);
}
static float ref_b2f(uint16_t h) {
    int e = (h >> 7) & 255, m = h & 127;
    double v = e == 255 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
    return (float)(h & 0x8000 ? -v : v);
}
/* Rounds |f| to `mbits` significand bits (rint: nearest, ties to even), exponent bias `bias`,
 * `ebits` exponent bits; returns the magnitude bits. */
static uint16_t ref_round(float f, int mbits, int ebits, int bias) {
    double a = fabs((double)f);
    int emax = (1 << ebits) - 1;
    double maxv = ldexp(2.0 - ldexp(1.0, -mbits), emax - 1 - bias);
    double tie = maxv + ldexp(1.0, emax - 1 - bias - mbits - 1);
    if (a >= tie) return (uint16_t)(emax << mbits); /* inf (the tie goes to the even one, inf) */
    if (a < ldexp(1.0, 1 - bias)) return (uint16_t)rint(ldexp(a, bias - 1 + mbits)); /* subnormal */
    int e;
    double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    double q = rint(ldexp(m, mbits + 1));
    if (q == ldexp(1.0, mbits + 1)) q /= 2, e++;
    return (uint16_t)(((e - 1 + bias) << mbits) | ((uint32_t)q - (1u << mbits)));
}
static uint16_t ref_f2h(float f) {
    if (isnan(f)) return 0x7e00;
    return (uint16_t)((signbit(f) ? 0x8000 : 0) | ref_round(f, 10, 5, 15));
}
static uint16_t ref_f2b(float f) {
    if (isnan(f)) return 0x7fc0;
    return (uint16_t)((signbit(f) ? 0x8000 : 0) | ref_round(f, 7, 8, 127));
}
static int h_nan(uint16_t h) { return (h & 0x7fff) > 0x7c00; }
static int b_nan(uint16_t h) { return (h & 0x7fff) > 0x7f80; }

/* ---- reference ops ---- */

__extension__ typedef unsigned __int128 u128; /* i64 products, wide then cut */

static float ref_minf(float p, float q) {
    if (isnan(p) || isnan(q)) return NAN;
    if (p == 0 && q == 0) return signbit(p) ? p : q;
    return p < q ? p : q;
}
static float ref_maxf(float p, float q) {
    if (isnan(p) || isnan(q)) return NAN;
    if (p == 0 && q == 0) return signbit(p) ? q : p;
    return p > q ? p : q;
}
static double ref_mind(double p, double q) {
    if (isnan(p) || isnan(q)) return NAN;
    if (p == 0 && q == 0) return signbit(p) ? p : q;
    return p < q ? p : q;
}
static double ref_maxd(double p, double q) {
    if (isnan(p) || isnan(q)) return NAN;
    if (p == 0 && q == 0) return signbit(p) ? q : p;
    return p > q ? p : q;
}
static float ref_opf(float p, float q, int op) {
    switch (op) {
    case TALLY_PROD: return p * q;
    case TALLY_MIN: return ref_minf(p, q);
    case TALLY_MAX: return ref_maxf(p, q);
    default: return p + q;
    }
}
static double ref_opd(double p, double q, int op) {
    switch (op) {
    case TALLY_PROD: return p * q;
    case TALLY_MIN: return ref_mind(p, q);
    case TALLY_MAX: return ref_maxd(p, q);
    default: return p + q;
    }
}

/* Element i of an integer buffer, sign-extended (u8 zero-extended), and its width in bits. */
static int64_t int_at(int t, const void *p, size_t i, int *bits) {
    switch (t) {
    case TALLY_U8: return *bits = 8, ((const uint8_t *)p)[i];
    case TALLY_I8: return *bits = 8, ((const int8_t *)p)[i];
    case TALLY_I16: return *bits = 16, ((const int16_t *)p)[i];
    case TALLY_I32: return *bits = 32, ((const int32_t *)p)[i];
    default: return *bits = 64, ((const int64_t *)p)[i];
    }
}

/* v cut to the low `bits` bits and read back as dtype t (signed types sign-extend). */
static int64_t int_wrap(int t, uint64_t v, int bits) {
    if (bits == 64) return (int64_t)v;
    uint64_t m = (1ull << bits) - 1, low = v & m;
    if (t == TALLY_U8 || !(low >> (bits - 1))) return (int64_t)low;
    return (int64_t)(low | ~m);
}

/* Integers: computed in 64 bits (u128 for the i64 product), then wrapped to the width; AVG (div > 1)
 * divides the wrapped sum, truncating. */
static uint64_t ref_int(int t, int op, const void *a, const void *b, size_t i, int div) {
    int bits;
    int64_t p = int_at(t, a, i, &bits), q = int_at(t, b, i, &bits);
    uint64_t r;
    switch (op) {
    case TALLY_PROD: r = (uint64_t)((u128)(uint64_t)p * (uint64_t)q); break;
    case TALLY_MIN: r = (uint64_t)(p < q ? p : q); break;
    case TALLY_MAX: r = (uint64_t)(p > q ? p : q); break;
    case TALLY_BAND: r = (uint64_t)p & (uint64_t)q; break;
    case TALLY_BOR: r = (uint64_t)p | (uint64_t)q; break;
    case TALLY_BXOR: r = (uint64_t)p ^ (uint64_t)q; break;
    default: r = (uint64_t)p + (uint64_t)q; break;
    }
    int64_t w = int_wrap(t, r, bits);
    if (div > 1) w /= div;
    return bits == 64 ? (uint64_t)w : (uint64_t)w & ((1ull << bits) - 1);
}

/* Reference for element i: raw bits in, raw bits out (as uint64), with AVG divided by nranks. */
static uint64_t ref_elem(int t, int op, const void *a, const void *b, size_t i, int nranks) {
    int avg = op == TALLY_AVG && nranks > 1;
    switch (t) {
    case TALLY_F32: {
        float r = ref_opf(((const float *)a)[i], ((const float *)b)[i], op);
        return fbits(avg ? r / (float)nranks : r);
    }
    case TALLY_F64: {
        double r = ref_opd(((const double *)a)[i], ((const double *)b)[i], op);
        return dbits(avg ? r / (double)nranks : r);
    }
    case TALLY_F16: {
        uint16_t r = ref_f2h(ref_opf(ref_h2f(((const uint16_t *)a)[i]), ref_h2f(((const uint16_t *)b)[i]), op));
        return avg ? ref_f2h(ref_h2f(r) / (float)nranks) : r;
    }
    case TALLY_BF16: {
        uint16_t r = ref_f2b(ref_opf(ref_b2f(((const uint16_t *)a)[i]), ref_b2f(((const uint16_t *)b)[i]), op));
        return avg ? ref_f2b(ref_b2f(r) / (float)nranks) : r;
    }
    case TALLY_BOOL: {
        unsigned p = ((const uint8_t *)a)[i] != 0, q = ((const uint8_t *)b)[i] != 0;
        switch (op) {
        case TALLY_PROD:
        case TALLY_MIN:
        case TALLY_BAND: return p & q;
        case TALLY_BXOR: return p ^ q;
        default: return p | q; /* SUM, MAX, BOR */
        }
    }
    default: return ref_int(t, op, a, b, i, avg ? nranks : 1);
    }
}

static uint64_t load_elem(int t, const void *p, size_t i) {
    switch (tally_dtype_size(t)) {
    case 1: return ((const uint8_t *)p)[i];
    case 2: return ((const uint16_t *)p)[i];
    case 4: return ((const uint32_t *)p)[i];
    default: return ((const uint64_t *)p)[i];
    }
}

static int same(int t, uint64_t got, uint64_t want) {
    if (got == want) return 1;
    switch (t) {
    case TALLY_F32: return isnan(bitsf((uint32_t)got)) && isnan(bitsf((uint32_t)want));
    case TALLY_F64: return isnan(bitsd(got)) && isnan(bitsd(want));
    case TALLY_F16: return h_nan((uint16_t)got) && h_nan((uint16_t)want);
    case TALLY_BF16: return b_nan((uint16_t)got) && b_nan((uint16_t)want);
    default: return 0;
    }
}

/* ---- inputs: ordinary values, ties for min/max, the special values, and raw bit patterns ---- */

static const uint32_t f32_special[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001 /* sNaN */,
    0x00000001, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000};
static const uint64_t f64_special[] = {0,
                                       0x8000000000000000ull,
                                       0x7ff0000000000000ull,
                                       0xfff0000000000000ull,
                                       0x7ff8000000000000ull,
                                       0x7ff0000000000001ull,
                                       1,
                                       0x800fffffffffffffull,
                                       0x0010000000000000ull,
                                       0x7fefffffffffffffull,
                                       0x3ff0000000000000ull};
static const uint16_t f16_special[] = {
    0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01,          0x7d00 /* sNaN */, 0x0001, 0x8001, 0x03ff,
    0x0400, 0x7bff, 0xfbff, 0x7bfe, 0x7800, 0x4c00 /* 16 */, 0x4800 /* 8 */,    0x3c00, 0x3c01, 0x1400 /* 2^-10 */};
static const uint16_t bf16_special[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81 /* sNaN */,
                                        0x0001, 0x8001, 0x007f, 0x0080, 0x7f7f, 0xff7f, 0x7f7e,
                                        0x3f80, 0x3f81, 0x3b80, 0x4380};
static const int64_t int_special[] = {INT64_MIN, INT64_MAX, INT32_MIN, INT32_MAX, INT16_MIN, INT16_MAX, INT8_MIN,
                                      INT8_MAX,  -1,        0,         1,         2,         255,       128};

#define PICK(arr) arr[rnd() % (sizeof arr / sizeof arr[0])]

static void gen(int t, void *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd(), kind = r % 16, bits = rnd();
        double v = ldexp((double)(int64_t)(bits >> 11) / 9007199254740992.0 - 0.25, (int)((r >> 8) % 24) - 12);
        switch (t) {
        case TALLY_F32:
            ((uint32_t *)dst)[i] = kind == 0 ? PICK(f32_special) : kind == 1 ? (uint32_t)bits : fbits((float)v);
            break;
        case TALLY_F64: ((uint64_t *)dst)[i] = kind == 0 ? PICK(f64_special) : kind == 1 ? bits : dbits(v); break;
        case TALLY_F16:
            ((uint16_t *)dst)[i] = kind < 2 ? PICK(f16_special) : kind < 4 ? (uint16_t)bits : ref_f2h((float)v);
            break;
        case TALLY_BF16:
            ((uint16_t *)dst)[i] = kind < 2 ? PICK(bf16_special) : kind < 4 ? (uint16_t)bits : ref_f2b((float)v);
            break;
        case TALLY_I32:
            ((int32_t *)dst)[i] = kind < 2   ? (int32_t)PICK(int_special)
                                  : kind < 8 ? (int32_t)bits
                                             : (int32_t)(bits % 2001) - 1000;
            break;
        case TALLY_I64:
            ((int64_t *)dst)[i] = kind < 2   ? PICK(int_special)
                                  : kind < 8 ? (int64_t)bits
                                             : (int64_t)(bits % 2001) - 1000;
            break;
        case TALLY_I16:
            ((int16_t *)dst)[i] = (int16_t)(kind < 2   ? PICK(int_special)
                                            : kind < 8 ? (int64_t)bits
                                                       : (int64_t)(bits % 2001) - 1000);
            break;
        case TALLY_I8:
            ((int8_t *)dst)[i] = (int8_t)(kind < 2   ? PICK(int_special)
                                          : kind < 8 ? (int64_t)bits
                                                     : (int64_t)(bits % 21) - 10);
            break;
        case TALLY_BOOL: /* mostly 0 and 1, and other bytes, which count as true */
            ((uint8_t *)dst)[i] = kind < 6 ? 0 : kind < 12 ? 1 : (uint8_t)bits;
            break;
        default: ((uint8_t *)dst)[i] = (uint8_t)bits; break;
        }
    }
}

/* ---- the sweep ---- */

static const size_t counts[] = {0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 1000003};
#define NCOUNTS (sizeof counts / sizeof counts[0])
#define MAXN    1000003
#define GUARD   64 /* elements of canary on each side of every buffer */
enum { ALIAS_NONE, ALIAS_A, ALIAS_B };
static const char *const alias_names[] = {"dst separate", "dst==a", "dst==b"};
/* Element offsets of dst, a, b from a 64-byte boundary. */
static const int offsets[][3] = {{0, 0, 0}, {1, 1, 1}, {1, 0, 3}, {0, 1, 1}};
#define NOFFSETS (sizeof offsets / sizeof offsets[0])

static void sweep_dtype(int t, const char *isa) {
    /* The largest count swept: smaller in the sanitizer pass (TALLY_TEST_LIGHT) and the quick tier. */
    size_t top = th_light() || !th_long() ? 100000 : MAXN;
    size_t es = tally_dtype_size(t), span = (MAXN + 2 * GUARD + 8) * es;
    unsigned char *a0 = malloc(MAXN * es), *b0 = malloc(MAXN * es);
    unsigned char *ref = malloc(MAXN * 8);
    unsigned char *bufs[3];
    for (int k = 0; k < 3; k++) bufs[k] = aligned_alloc(64, (span + 63) / 64 * 64);
    if (!a0 || !b0 || !ref || !bufs[0] || !bufs[1] || !bufs[2]) FAIL("out of memory");
    rng_state = 1234 + (uint64_t)t; /* same inputs at every ISA level */
    gen(t, a0, MAXN);
    gen(t, b0, MAXN);
    for (int op = 0; op < TALLY_OP_COUNT; op++) {
        if (!tally__dtype_op_valid(t, op)) continue; /* refused pairs: directed() checks they change nothing */
        for (size_t ci = 0; ci < NCOUNTS; ci++) {
            size_t n = counts[ci];
            if (n > top) continue;                                    /* a light sweep keeps every smaller count */
            int nranks = op == TALLY_AVG ? (int)(ci % 4) * 2 + 1 : 1; /* 1, 3, 5, 7 */
            if (ci == 0 || op == TALLY_AVG) /* elementwise: one reference serves every count */
                for (size_t i = 0, m = op == TALLY_AVG ? n : top; i < m; i++)
                    ((uint64_t *)ref)[i] = ref_elem(t, op, a0, b0, i, nranks);
            for (size_t oi = 0; oi < NOFFSETS * 2; oi++) {
                int streamed = oi >= NOFFSETS; /* every case again through tally__reduce_stream */
                for (int alias = ALIAS_NONE; alias <= ALIAS_B; alias++) {
                    const int *off = offsets[oi % NOFFSETS];
                    int od = off[0], oa = off[1], ob = off[2];
                    if (alias == ALIAS_A) od = oa;
                    if (alias == ALIAS_B) od = ob;
                    size_t used = (n + 2 * GUARD + 8) * es;
                    for (int k = 0; k < 3; k++) memset(bufs[k], 0xa5, used);
                    unsigned char *pa = bufs[0] + (GUARD + oa) * es, *pb = bufs[1] + (GUARD + ob) * es;
                    unsigned char *pd = alias == ALIAS_A ? pa : alias == ALIAS_B ? pb : bufs[2] + (GUARD + od) * es;
                    memcpy(pa, a0, n * es);
                    memcpy(pb, b0, n * es);
                    (streamed ? tally__reduce_stream : tally__reduce)(pd, pa, pb, n, (tally_dtype)t, (tally_op)op);
                    if (op == TALLY_AVG) tally__avg_finish(pd, n, (tally_dtype)t, nranks);
                    for (size_t i = 0; i < n; i++) {
                        uint64_t got = load_elem(t, pd, i), want = ((uint64_t *)ref)[i];
                        if (!same(t, got, want))
                            FAIL("%s %s isa=%s%s count=%zu offsets d/a/b=%d/%d/%d %s nranks=%d: element %zu: "
                                 "a=0x%llx b=0x%llx got 0x%llx want 0x%llx",
                                 tally_dtype_name(t), tally_op_name(op), isa, streamed ? " streamed" : "", n, od, oa,
                                 ob, alias_names[alias], nranks, i, (unsigned long long)load_elem(t, a0, i),
                                 (unsigned long long)load_elem(t, b0, i), (unsigned long long)got,
                                 (unsigned long long)want);
                    }
                    /* Nothing outside [pd, pd + n) may change; the inputs must not change unless they are dst. */
                    unsigned char *dbase = alias == ALIAS_A ? bufs[0] : alias == ALIAS_B ? bufs[1] : bufs[2];
                    for (unsigned char *p = dbase; p < dbase + used; p++)
                        if ((p < pd || p >= pd + n * es) && *p != 0xa5)
                            FAIL("%s %s isa=%s%s count=%zu %s: byte %td outside dst was written", tally_dtype_name(t),
                                 tally_op_name(op), isa, streamed ? " streamed" : "", n, alias_names[alias], p - pd);
                    if (alias != ALIAS_A && memcmp(pa, a0, n * es))
                        FAIL("%s %s isa=%s: input a changed", tally_dtype_name(t), tally_op_name(op), isa);
                    if (alias != ALIAS_B && memcmp(pb, b0, n * es))
                        FAIL("%s %s isa=%s: input b changed", tally_dtype_name(t), tally_op_name(op), isa);
                    checks++;
                }
            }
        }
    }
    for (int k = 0; k < 3; k++) free(bufs[k]);
    free(a0), free(b0), free(ref);
}

/* Spot checks written out by hand, so a mistake shared by the kernels and the reference shows; N is long
 * enough for the SIMD loops, with a tail. */
enum { N = 100 };
#define FILL2(x, y, va, vb)                                                                                            \
    for (int i = 0; i < N; i++) x[i] = (va), y[i] = (vb)
#define ALL(d, cond, ...)                                                                                              \
    for (int i = 0; i < N; i++) CHECK(cond, "isa=%s element %d: " __VA_ARGS__)

/* i8 and i16 wrap, and compare signed (an unsigned min would answer 1 for min(-1, 1)). */
static void directed_small_ints(const char *isa) {
    int8_t ca[N], cb[N], cd[N];
    int16_t sa[N], sb[N], sd[N];
    FILL2(ca, cb, 127, 1);
    tally__reduce(cd, ca, cb, N, TALLY_I8, TALLY_SUM);
    ALL(cd, cd[i] == -128, "i8 127+1 = %d", isa, i, cd[i]);
    FILL2(ca, cb, -1, 1);
    tally__reduce(cd, ca, cb, N, TALLY_I8, TALLY_MIN);
    ALL(cd, cd[i] == -1, "i8 min(-1,1) = %d", isa, i, cd[i]);
    tally__reduce(cd, ca, cb, N, TALLY_I8, TALLY_MAX);
    ALL(cd, cd[i] == 1, "i8 max(-1,1) = %d", isa, i, cd[i]);
    FILL2(ca, cb, -128, -1);
    tally__reduce(cd, ca, cb, N, TALLY_I8, TALLY_PROD);
    ALL(cd, cd[i] == -128, "i8 -128*-1 = %d", isa, i, cd[i]);
    FILL2(ca, cb, 12, -11);
    tally__reduce(cd, ca, cb, N, TALLY_I8, TALLY_PROD);
    ALL(cd, cd[i] == 124, "i8 12*-11 (-132 wrapped) = %d", isa, i, cd[i]);
    FILL2(ca, cb, -7, 0);
    tally__reduce(cd, ca, cb, N, TALLY_I8, TALLY_AVG);
    tally__avg_finish(cd, N, TALLY_I8, 2);
    ALL(cd, cd[i] == -3, "i8 avg(-7,0) over 2 = %d", isa, i, cd[i]);
    FILL2(sa, sb, 32767, 1);
    tally__reduce(sd, sa, sb, N, TALLY_I16, TALLY_SUM);
    ALL(sd, sd[i] == -32768, "i16 32767+1 = %d", isa, i, sd[i]);
    FILL2(sa, sb, -1, 1);
    tally__reduce(sd, sa, sb, N, TALLY_I16, TALLY_MIN);
    ALL(sd, sd[i] == -1, "i16 min(-1,1) = %d", isa, i, sd[i]);
    FILL2(sa, sb, 300, 300);
    tally__reduce(sd, sa, sb, N, TALLY_I16, TALLY_PROD);
    ALL(sd, sd[i] == 24464, "i16 300*300 (90000 wrapped) = %d", isa, i, sd[i]);
    FILL2(sa, sb, 1001, 0);
    tally__reduce(sd, sa, sb, N, TALLY_I16, TALLY_AVG);
    tally__avg_finish(sd, N, TALLY_I16, 4);
    ALL(sd, sd[i] == 250, "i16 avg(1001,0) over 4 = %d", isa, i, sd[i]);
}

/* Bitwise ops on the two's-complement bits of every integer width. */
static void directed_bitwise(const char *isa) {
    int32_t ia[N], ib[N], id[N];
    FILL2(ia, ib, 0x0f0f0f0f, 0x00ff00ff);
    tally__reduce(id, ia, ib, N, TALLY_I32, TALLY_BAND);
    ALL(id, id[i] == 0x000f000f, "i32 band = 0x%x", isa, i, (unsigned)id[i]);
    tally__reduce(id, ia, ib, N, TALLY_I32, TALLY_BOR);
    ALL(id, id[i] == 0x0fff0fff, "i32 bor = 0x%x", isa, i, (unsigned)id[i]);
    tally__reduce(id, ia, ib, N, TALLY_I32, TALLY_BXOR);
    ALL(id, id[i] == 0x0ff00ff0, "i32 bxor = 0x%x", isa, i, (unsigned)id[i]);
    int64_t la[N], lb[N], ld[N];
    FILL2(la, lb, -1, 0x123456789abcll);
    tally__reduce(ld, la, lb, N, TALLY_I64, TALLY_BXOR);
    ALL(ld, ld[i] == ~0x123456789abcll, "i64 -1 bxor x = %lld", isa, i, (long long)ld[i]);
    tally__reduce(ld, la, lb, N, TALLY_I64, TALLY_BAND);
    ALL(ld, ld[i] == 0x123456789abcll, "i64 -1 band x = %lld", isa, i, (long long)ld[i]);
    int16_t sa[N], sb[N], sd[N];
    FILL2(sa, sb, INT16_MIN, 1);
    tally__reduce(sd, sa, sb, N, TALLY_I16, TALLY_BOR);
    ALL(sd, sd[i] == -32767, "i16 0x8000 bor 1 = %d", isa, i, sd[i]);
    int8_t ca[N], cb[N], cd[N];
    FILL2(ca, cb, -1, 0x0f);
    tally__reduce(cd, ca, cb, N, TALLY_I8, TALLY_BAND);
    ALL(cd, cd[i] == 15, "i8 -1 band 15 = %d", isa, i, cd[i]);
    uint8_t ua[N], ub[N], ud[N];
    FILL2(ua, ub, 0xf0, 0xff);
    tally__reduce(ud, ua, ub, N, TALLY_U8, TALLY_BXOR);
    ALL(ud, ud[i] == 0x0f, "u8 0xf0 bxor 0xff = 0x%x", isa, i, ud[i]);
}

/* bool: any non-zero byte is true, and what comes out is 0 or 1 whatever came in. */
static void directed_bool(const char *isa) {
    static const struct {
        uint8_t a, b;
        uint8_t want[TALLY_OP_COUNT]; /* by op; AVG unused */
    } cases[] = {
        /*              sum avg prod min max band bor bxor */
        {2, 4, {1, 0, 1, 1, 1, 1, 1, 0}}, {0, 255, {1, 0, 0, 0, 1, 0, 1, 1}}, {0, 0, {0, 0, 0, 0, 0, 0, 0, 0}},
        {1, 1, {1, 0, 1, 1, 1, 1, 1, 0}}, {128, 0, {1, 0, 0, 0, 1, 0, 1, 1}},
    };
    uint8_t ba[N], bb[N], bd[N];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int op = 0; op < TALLY_OP_COUNT; op++) {
            if (op == TALLY_AVG) continue;
            FILL2(ba, bb, cases[c].a, cases[c].b);
            tally__reduce(bd, ba, bb, N, TALLY_BOOL, (tally_op)op);
            ALL(bd, bd[i] == cases[c].want[op], "bool %d %s %d = %d, want %d", isa, i, cases[c].a, tally_op_name(op),
                cases[c].b, bd[i], cases[c].want[op]);
        }
    }
}

/* A pair the entry points refuse leaves dst alone here too: no kernel invents a meaning for it. */
static void directed_refused(const char *isa) {
    float fa[N], fb[N], fd[N];
    uint8_t ba[N], bb[N], bd[N];
    FILL2(fa, fb, 1.0f, 2.0f);
    for (int op = TALLY_BAND; op <= TALLY_BXOR; op++) {
        for (int i = 0; i < N; i++) fd[i] = 7.0f;
        tally__reduce(fd, fa, fb, N, TALLY_F32, (tally_op)op);
        ALL(fd, fd[i] == 7.0f, "f32 %s changed dst to %g", isa, i, tally_op_name(op), fd[i]);
        tally__reduce_stream(fd, fa, fb, N, TALLY_F32, (tally_op)op);
        ALL(fd, fd[i] == 7.0f, "f32 %s streamed changed dst to %g", isa, i, tally_op_name(op), fd[i]);
    }
    FILL2(ba, bb, 1, 1);
    memset(bd, 9, sizeof bd);
    tally__reduce(bd, ba, bb, N, TALLY_BOOL, TALLY_AVG);
    tally__avg_finish(bd, N, TALLY_BOOL, 2);
    ALL(bd, bd[i] == 9, "bool avg changed dst to %d", isa, i, bd[i]);
    tally__reduce_stream(bd, ba, bb, N, TALLY_BOOL, TALLY_AVG);
    ALL(bd, bd[i] == 9, "bool avg streamed changed dst to %d", isa, i, bd[i]);
}

static void directed(const char *isa) {
    float fa[N], fb[N], fd[N];
    uint16_t ha[N], hb[N], hd[N];
    int32_t ia[N], ib[N], id[N];
    FILL2(fa, fb, -0.0f, 0.0f);
    tally__reduce(fd, fa, fb, N, TALLY_F32, TALLY_MIN);
    ALL(fd, fbits(fd[i]) == 0x80000000, "min(-0,+0) = 0x%x", isa, i, fbits(fd[i]));
    tally__reduce(fd, fb, fa, N, TALLY_F32, TALLY_MIN);
    ALL(fd, fbits(fd[i]) == 0x80000000, "min(+0,-0) = 0x%x", isa, i, fbits(fd[i]));
    tally__reduce(fd, fa, fb, N, TALLY_F32, TALLY_MAX);
    ALL(fd, fbits(fd[i]) == 0, "max(-0,+0) = 0x%x", isa, i, fbits(fd[i]));
    FILL2(fa, fb, NAN, 1.0f);
    for (int op = TALLY_MIN; op <= TALLY_MAX; op++) {
        tally__reduce(fd, fa, fb, N, TALLY_F32, (tally_op)op);
        ALL(fd, isnan(fd[i]), "%s(NaN,1) = %g", isa, i, tally_op_name(op), fd[i]);
        tally__reduce(fd, fb, fa, N, TALLY_F32, (tally_op)op);
        ALL(fd, isnan(fd[i]), "%s(1,NaN) = %g", isa, i, tally_op_name(op), fd[i]);
    }
    FILL2(ha, hb, 0x7bff, 0x4c00); /* 65504 + 16 = 65520, the tie, goes to inf */
    tally__reduce(hd, ha, hb, N, TALLY_F16, TALLY_SUM);
    ALL(hd, hd[i] == 0x7c00, "f16 65504+16 = 0x%x", isa, i, hd[i]);
    FILL2(ha, hb, 0x7bff, 0x4800); /* 65504 + 8 rounds back down */
    tally__reduce(hd, ha, hb, N, TALLY_F16, TALLY_SUM);
    ALL(hd, hd[i] == 0x7bff, "f16 65504+8 = 0x%x", isa, i, hd[i]);
    FILL2(ha, hb, 0x0001, 0x0001); /* 2^-24 + 2^-24 stays subnormal */
    tally__reduce(hd, ha, hb, N, TALLY_F16, TALLY_SUM);
    ALL(hd, hd[i] == 0x0002, "f16 2^-24+2^-24 = 0x%x", isa, i, hd[i]);
    FILL2(ha, hb, 0x7e00, 0x3c00);
    tally__reduce(hd, ha, hb, N, TALLY_F16, TALLY_MAX);
    ALL(hd, h_nan(hd[i]), "f16 max(NaN,1) = 0x%x", isa, i, hd[i]);
    FILL2(ha, hb, 0x3f80, 0x3b80); /* bf16 1 + 2^-8: the tie rounds to even, 1 */
    tally__reduce(hd, ha, hb, N, TALLY_BF16, TALLY_SUM);
    ALL(hd, hd[i] == 0x3f80, "bf16 1+2^-8 = 0x%x", isa, i, hd[i]);
    FILL2(ha, hb, 0x3f81, 0x3b80); /* (1 + 2^-7) + 2^-8: the tie rounds up to even */
    tally__reduce(hd, ha, hb, N, TALLY_BF16, TALLY_SUM);
    ALL(hd, hd[i] == 0x3f82, "bf16 1+2^-7+2^-8 = 0x%x", isa, i, hd[i]);
    FILL2(ha, hb, 0x7f7f, 0x7f7f);
    tally__reduce(hd, ha, hb, N, TALLY_BF16, TALLY_SUM);
    ALL(hd, hd[i] == 0x7f80, "bf16 max+max = 0x%x", isa, i, hd[i]);
    FILL2(ia, ib, INT32_MAX, 1);
    tally__reduce(id, ia, ib, N, TALLY_I32, TALLY_SUM);
    ALL(id, id[i] == INT32_MIN, "INT_MAX+1 = %d", isa, i, id[i]);
    FILL2(ia, ib, INT32_MIN, -1);
    tally__reduce(id, ia, ib, N, TALLY_I32, TALLY_PROD);
    ALL(id, id[i] == INT32_MIN, "INT_MIN*-1 = %d", isa, i, id[i]);
    FILL2(ia, ib, 7, 0);
    tally__reduce(id, ia, ib, N, TALLY_I32, TALLY_AVG);
    tally__avg_finish(id, N, TALLY_I32, 2);
    ALL(id, id[i] == 3, "avg(7,0) over 2 = %d", isa, i, id[i]);
    FILL2(ia, ib, -7, 0);
    tally__reduce(id, ia, ib, N, TALLY_I32, TALLY_AVG);
    tally__avg_finish(id, N, TALLY_I32, 2);
    ALL(id, id[i] == -3, "avg(-7,0) over 2 = %d (truncates toward 0)", isa, i, id[i]);
    uint8_t ua[N], ub[N], ud[N];
    FILL2(ua, ub, 200, 100);
    tally__reduce(ud, ua, ub, N, TALLY_U8, TALLY_SUM);
    ALL(ud, ud[i] == 44, "u8 200+100 = %d", isa, i, ud[i]);
    tally__reduce(ud, ua, ub, N, TALLY_U8, TALLY_PROD);
    ALL(ud, ud[i] == (200 * 100) % 256, "u8 200*100 = %d", isa, i, ud[i]);
    int64_t la[N], lb[N], ld[N];
    FILL2(la, lb, INT64_MIN, -1);
    tally__reduce(ld, la, lb, N, TALLY_I64, TALLY_PROD);
    ALL(ld, ld[i] == INT64_MIN, "INT64_MIN*-1 = %lld", isa, i, (long long)ld[i]);
    FILL2(la, lb, 0x100000001ll, 0x100000001ll);
    tally__reduce(ld, la, lb, N, TALLY_I64, TALLY_PROD);
    ALL(ld, ld[i] == 0x200000001ll, "(2^32+1)^2 mod 2^64 = %lld", isa, i, (long long)ld[i]);
    directed_small_ints(isa);
    directed_bitwise(isa);
    directed_bool(isa);
    directed_refused(isa);
#undef FILL2
#undef ALL
}

static void test_conversions(void) {
    static const struct {
        uint16_t h;
        float f;
    } f16_pairs[] = {{0x3c00, 1.0f},
                     {0xbc00, -1.0f},
                     {0x7bff, 65504.0f},
                     {0x0001, 0x1p-24f},
                     {0x03ff, 0x3ffp-24f},
                     {0x0400, 0x1p-14f},
                     {0x7c00, INFINITY},
                     {0xfc00, -INFINITY},
                     {0x8000, -0.0f},
                     {0x0000, 0.0f},
                     {0x3555, 0x155p-12f + 0x1p-2f}};
    for (size_t i = 0; i < sizeof f16_pairs / sizeof f16_pairs[0]; i++) {
        float f = tally__f16_to_f32(f16_pairs[i].h);
        CHECK(fbits(f) == fbits(f16_pairs[i].f), "f16 0x%04x -> %a, want %a", f16_pairs[i].h, f, f16_pairs[i].f);
        uint16_t h = tally__f32_to_f16(f16_pairs[i].f);
        CHECK(h == f16_pairs[i].h, "f32 %a -> f16 0x%04x, want 0x%04x", f16_pairs[i].f, h, f16_pairs[i].h);
    }
    static const struct {
        float f;
        uint16_t h;
    } f2h[] = {{65520.0f, 0x7c00},        {65519.99f, 0x7bff},
               {-65520.0f, 0xfc00},       {1e10f, 0x7c00},
               {0x1p-25f, 0x0000},        {0x1.8p-25f, 0x0001},
               {0x3p-25f, 0x0002},        {0x1p-26f, 0x0000},
               {-0x1p-25f, 0x8000},       {1.0f + 0x1p-11f, 0x3c00},
               {1.0f + 0x3p-11f, 0x3c02}, {1.0f + 0x1.002p-11f, 0x3c01},
               {0x1.ffcp-15f, 0x0400},    {1e-30f, 0}};
    for (size_t i = 0; i < sizeof f2h / sizeof f2h[0]; i++) {
        uint16_t h = tally__f32_to_f16(f2h[i].f);
        CHECK(h == f2h[i].h, "f32 %a -> f16 0x%04x, want 0x%04x", f2h[i].f, h, f2h[i].h);
    }
    CHECK(isnan(tally__f16_to_f32(0x7e00)), "f16 0x7e00 is not NaN");
    CHECK(h_nan(tally__f32_to_f16(NAN)) && h_nan(tally__f32_to_f16(bitsf(0x7f800001))), "f32 NaN -> f16 not NaN");
    CHECK(tally__f32_to_f16(bitsf(0x7f800001)) & 0x200, "f32 sNaN -> f16 not quiet");
    static const struct {
        uint32_t f;
        uint16_t b;
    } f2b[] = {{0x3f808000, 0x3f80}, {0x3f818000, 0x3f82}, {0x3f808001, 0x3f81}, {0x3f80ffff, 0x3f81},
               {0x7f7fffff, 0x7f80}, {0xff7fffff, 0xff80}, {0x7f7f7fff, 0x7f7f}, {0x00008000, 0x0000},
               {0x00018000, 0x0002}, {0x00010001, 0x0001}, {0x80000000, 0x8000}, {0x7f800000, 0x7f80},
               {0x7f800001, 0x7fc0}, {0xff800001, 0xffc0}, {0x7fc00000, 0x7fc0}};
    for (size_t i = 0; i < sizeof f2b / sizeof f2b[0]; i++) {
        uint16_t b = tally__f32_to_bf16(bitsf(f2b[i].f));
        CHECK(b == f2b[i].b, "f32 0x%08x -> bf16 0x%04x, want 0x%04x", f2b[i].f, b, f2b[i].b);
    }
    /* Every f16 and bf16 value: widening matches the reference, and narrowing gives it back. */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tally__f16_to_f32((uint16_t)h), r = ref_h2f((uint16_t)h);
        CHECK(h_nan((uint16_t)h) ? isnan(f) : fbits(f) == fbits(r), "f16 0x%04x -> %a, want %a", h, f, r);
        uint16_t back = tally__f32_to_f16(f);
        CHECK(h_nan((uint16_t)h) ? h_nan(back) : back == h, "f16 0x%04x round trip gave 0x%04x", h, back);
        f = tally__bf16_to_f32((uint16_t)h), r = ref_b2f((uint16_t)h);
        CHECK(b_nan((uint16_t)h) ? isnan(f) : fbits(f) == fbits(r), "bf16 0x%04x -> %a, want %a", h, f, r);
        back = tally__f32_to_bf16(f);
        CHECK(b_nan((uint16_t)h) ? b_nan(back) : back == h, "bf16 0x%04x round trip gave 0x%04x", h, back);
    }
    /* Narrowing near every rounding boundary (each halfway point, and one f32 ulp either side), and at
     * random: against the reference. */
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t h = 0; h < 65536; h++) {
            uint32_t base = pass == 0 ? fbits(ref_h2f((uint16_t)h)) : h << 16;
            if (isnan(bitsf(base)) || isinf(bitsf(base))) continue;
            float mid = pass == 0 ? (ref_h2f((uint16_t)h) + ref_h2f((uint16_t)(h + 1))) / 2 : bitsf(base + 0x8000);
            float cand[] = {mid, nextafterf(mid, INFINITY), nextafterf(mid, -INFINITY), bitsf(base)};
            for (int c = 0; c < 4; c++) {
                if (isnan(cand[c])) continue;
                uint16_t got = pass == 0 ? tally__f32_to_f16(cand[c]) : tally__f32_to_bf16(cand[c]);
                uint16_t want = pass == 0 ? ref_f2h(cand[c]) : ref_f2b(cand[c]);
                CHECK(got == want, "%s(%a) = 0x%04x, want 0x%04x", pass == 0 ? "f32_to_f16" : "f32_to_bf16", cand[c],
                      got, want);
            }
        }
    }
    for (int i = 0; i < 2000000; i++) {
        float f = bitsf((uint32_t)rnd());
        uint16_t h = tally__f32_to_f16(f), b = tally__f32_to_bf16(f);
        CHECK(isnan(f) ? h_nan(h) : h == ref_f2h(f), "f32_to_f16(%a) = 0x%04x, want 0x%04x", f, h, ref_f2h(f));
        CHECK(isnan(f) ? b_nan(b) : b == ref_f2b(f), "f32_to_bf16(%a) = 0x%04x, want 0x%04x", f, b, ref_f2b(f));
    }
}

/* Which pairs a reduction takes, written out: the bitwise ops only the integers and bool, AVG all but bool. */
static void test_valid_pairs(void) {
    static const char valid[TALLY_DTYPE_COUNT][TALLY_OP_COUNT + 1] = {
        /* sum avg prod min max band bor bxor */
        [TALLY_F32] = "11111000", [TALLY_F64] = "11111000",  [TALLY_F16] = "11111000", [TALLY_BF16] = "11111000",
        [TALLY_I32] = "11111111", [TALLY_I64] = "11111111",  [TALLY_U8] = "11111111",  [TALLY_I8] = "11111111",
        [TALLY_I16] = "11111111", [TALLY_BOOL] = "10111111",
    };
    for (int t = 0; t < TALLY_DTYPE_COUNT; t++)
        for (int op = 0; op < TALLY_OP_COUNT; op++)
            CHECK(tally__dtype_op_valid(t, op) == (valid[t][op] == '1'), "%s with %s: valid %d, want %c",
                  tally_dtype_name(t), tally_op_name(op), tally__dtype_op_valid(t, op), valid[t][op]);
    CHECK(!tally__dtype_op_valid(-1, TALLY_SUM) && !tally__dtype_op_valid(TALLY_DTYPE_COUNT, TALLY_SUM) &&
              !tally__dtype_op_valid(TALLY_I32, -1) && !tally__dtype_op_valid(TALLY_I32, TALLY_OP_COUNT),
          "a code out of range makes a valid pair");
    CHECK(strstr(tally__op_takes(TALLY_BAND), "bool") && strstr(tally__op_takes(TALLY_BAND), "i16") &&
              strstr(tally__op_takes(TALLY_AVG), "but bool"),
          "what the ops take: band '%s', avg '%s'", tally__op_takes(TALLY_BAND), tally__op_takes(TALLY_AVG));
    /* load and store: bool reads any non-zero byte as 1 and writes 0 or 1; the small integers wrap. */
    unsigned char buf[8] = {0, 2, 255, 1};
    CHECK(tally__dtype_load(buf, 0, TALLY_BOOL) == 0 && tally__dtype_load(buf, 1, TALLY_BOOL) == 1 &&
              tally__dtype_load(buf, 2, TALLY_BOOL) == 1,
          "bool loads");
    tally__dtype_store(buf, 0, TALLY_BOOL, -3.0);
    tally__dtype_store(buf, 1, TALLY_BOOL, 0.0);
    CHECK(buf[0] == 1 && buf[1] == 0, "bool stores -3 as %d and 0 as %d", buf[0], buf[1]);
    tally__dtype_store(buf, 0, TALLY_I8, -3.0);
    tally__dtype_store(buf, 1, TALLY_I8, 200.0);
    CHECK(tally__dtype_load(buf, 0, TALLY_I8) == -3 && tally__dtype_load(buf, 1, TALLY_I8) == -56, "i8 stores");
    tally__dtype_store(buf, 1, TALLY_I16, -30000.0);
    CHECK(tally__dtype_load(buf, 1, TALLY_I16) == -30000, "i16 stores");
}

static void test_names(void) {
    static const char *const dnames[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "i8", "i16", "bool"};
    static const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1, 1, 2, 1};
    static const char *const onames[] = {"sum", "avg", "prod", "min", "max", "band", "bor", "bxor"};
    _Static_assert(sizeof dnames / sizeof *dnames == TALLY_DTYPE_COUNT, "a dtype without its name here");
    _Static_assert(sizeof onames / sizeof *onames == TALLY_OP_COUNT, "an op without its name here");
    for (int t = 0; t < TALLY_DTYPE_COUNT; t++) {
        CHECK(!strcmp(tally_dtype_name((tally_dtype)t), dnames[t]), "dtype %d named %s", t, tally_dtype_name(t));
        CHECK(tally_dtype_size((tally_dtype)t) == sizes[t], "dtype %s size %zu", dnames[t], tally_dtype_size(t));
        CHECK(tally_dtype_parse(dnames[t]) == t, "parse %s", dnames[t]);
    }
    for (int op = 0; op < TALLY_OP_COUNT; op++) {
        CHECK(!strcmp(tally_op_name((tally_op)op), onames[op]), "op %d named %s", op, tally_op_name(op));
        CHECK(tally_op_parse(onames[op]) == op, "parse %s", onames[op]);
    }
    CHECK(tally_dtype_size((tally_dtype)TALLY_DTYPE_COUNT) == 0 && tally_dtype_size((tally_dtype)-1) == 0,
          "bad dtype has a size");
    CHECK(tally_dtype_name((tally_dtype)99) && tally_op_name((tally_op)99), "bad names give NULL");
    CHECK(tally_dtype_parse("BF16") == TALLY_BF16 && tally_dtype_parse("Float") == TALLY_F32, "case-insensitive");
    CHECK(tally_dtype_parse("double") == TALLY_F64 && tally_dtype_parse("half") == TALLY_F16 &&
              tally_dtype_parse("int") == TALLY_I32,
          "aliases");
    CHECK(tally_dtype_parse("int8") == TALLY_I8 && tally_dtype_parse("int16") == TALLY_I16 &&
              tally_dtype_parse("BOOL") == TALLY_BOOL,
          "aliases of the small integers and bool");
    CHECK(tally_op_parse("MAX") == TALLY_MAX && tally_op_parse("BXOR") == TALLY_BXOR, "op case-insensitive");
    CHECK(tally_dtype_parse(NULL) == -1 && tally_op_parse(NULL) == -1, "NULL parses");
    CHECK(tally_dtype_parse("f33") == -1 && tally_dtype_parse("") == -1 && tally_op_parse("sums") == -1,
          "unknown parses");
}

/* tally__copy_out against memmove: every size class either side of the streaming floor, each alignment
 * of source and destination, bytes around the copy left alone, and overlapping ranges. */
static void test_copy_out(void) {
    const size_t floor = TALLY__COPY_STREAM_MIN;
    const size_t sizes[] = {0, 1, 63, 64, 1000, floor - 1, floor, floor + 1, floor + 4096 + 17};
    size_t cap = floor + 8192;
    unsigned char *src = malloc(cap), *dst = malloc(cap + 64), *want = malloc(cap + 64);
    if (!src || !dst || !want) FAIL("no memory for the copy test");
    for (size_t i = 0; i < cap; i++) src[i] = (unsigned char)rnd();
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        for (size_t so = 0; so < 3; so++)
            for (size_t d_off = 0; d_off < 17; d_off += 8) {
                size_t n = sizes[k], doff = d_off + 1; /* 1, 9, 17: never 16-byte aligned as given */
                if (n + so > cap) continue;
                memset(dst, 0xA5, cap + 64);
                memcpy(want, dst, cap + 64);
                memcpy(want + doff, src + so, n);
                tally__copy_out(dst + doff, src + so, n);
                CHECK(!memcmp(dst, want, cap + 64), "copy_out of %zu bytes (source +%zu, destination +%zu)", n, so,
                      doff);
            }
    /* overlapping: as memmove, both ways */
    for (size_t shift = 1; shift <= 4096; shift *= 64) {
        size_t n = floor;
        memcpy(dst, src, n + shift);
        memcpy(want, src, n + shift);
        memmove(want + shift, want, n);
        tally__copy_out(dst + shift, dst, n);
        CHECK(!memcmp(dst, want, n + shift), "overlapping copy_out forward by %zu", shift);
        memcpy(dst, src, n + shift);
        memcpy(want, src, n + shift);
        memmove(want, want + shift, n);
        tally__copy_out(dst, dst + shift, n);
        CHECK(!memcmp(dst, want, n + shift), "overlapping copy_out back by %zu", shift);
    }
    free(src);
    free(dst);
    free(want);
}

int main(void) {
    test_names();
    test_copy_out();
    test_valid_pairs();
    test_conversions();
    static const char *const levels[] = {"scalar", "avx2", "avx512"};
    char ran[64] = "";
    for (int l = 0; l < 3; l++) {
        tally__reduce_set_isa(levels[l]);
        if (strcmp(tally__reduce_isa(), levels[l])) {
            printf("test_reduce: skipping %s: this CPU tops out at %s\n", levels[l], tally__reduce_isa());
            continue;
        }
        directed(levels[l]);
        for (int t = 0; t < TALLY_DTYPE_COUNT; t++) sweep_dtype(t, levels[l]);
        strcat(ran, " "), strcat(ran, levels[l]);
    }
    /* TALLY_ISA reaches the kernels through the config of the process's first communicator, and never
     * raises the level. */
    setenv("TALLY_ISA", "scalar", 1);
    tally_config cfg = TALLY_CONFIG_INIT;
    CHECK(!tally_config_from_env(&cfg) && cfg.isa == TALLY_ISA_SCALAR, "TALLY_ISA=scalar read as %d: %s", cfg.isa,
          tally_last_error());
    cfg.rank = 0;
    cfg.size = 1;
    tally_comm *one = NULL;
    CHECK(!tally_comm_init_config(&one, &cfg), "a world of one: %s", tally_last_error());
    CHECK(!strcmp(tally__reduce_isa(), "scalar"), "TALLY_ISA=scalar gave %s", tally__reduce_isa());
    tally_comm_free(one);
    unsetenv("TALLY_ISA");
    tally__reduce_set_isa(NULL);
    const char *best = tally__reduce_isa();
    tally__reduce_set_isa("avx512");
    CHECK(!strcmp(tally__reduce_isa(), best), "asking for avx512 gave %s on a %s CPU", tally__reduce_isa(), best);
    printf("test_reduce: %ld checks passed (ISA levels:%s)\n", checks, ran);
    return 0;
}
