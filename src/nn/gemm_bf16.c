/* gemm_bf16.c - bf16 matrix products through oneDNN's matmul, one primitive per shape kept for the run
 * (creating one costs milliseconds, running one on GPT's shapes a few), and the casts that feed them.
 * oneDNN is opened (dlopen) by the first bf16 run, not linked: its 40 MB of code and OpenMP are mapped only
 * into processes that use them, so an f32 run's address space (ulimit -v) is what it was. */
#include "gemm_bf16.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../core/err.h"
#include "../core/numeric/dtype.h"
#include "simd.h"

#if defined(TALLY_HAVE_DNNL) && defined(__x86_64__) && defined(__GNUC__)
#include <dlfcn.h>
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>

#define DNNL_LIBRARY_NAME "libdnnl.so.2"
/* The oneDNN calls used, resolved from the library at first use. */
#define DNNL_CALLS(X)                                                                                                  \
    X(dnnl_engine_create)                                                                                              \
    X(dnnl_stream_create)                                                                                              \
    X(dnnl_stream_wait)                                                                                                \
    X(dnnl_memory_desc_init_by_strides)                                                                                \
    X(dnnl_matmul_desc_init)                                                                                           \
    X(dnnl_primitive_attr_create)                                                                                      \
    X(dnnl_primitive_attr_destroy)                                                                                     \
    X(dnnl_primitive_attr_set_post_ops)                                                                                \
    X(dnnl_post_ops_create)                                                                                            \
    X(dnnl_post_ops_append_sum)                                                                                        \
    X(dnnl_post_ops_destroy)                                                                                           \
    X(dnnl_primitive_desc_create)                                                                                      \
    X(dnnl_primitive_desc_query)                                                                                       \
    X(dnnl_primitive_desc_destroy)                                                                                     \
    X(dnnl_primitive_create)                                                                                           \
    X(dnnl_primitive_execute)                                                                                          \
    X(dnnl_memory_create)                                                                                              \
    X(dnnl_memory_set_data_handle)

static struct {
#define DNNL_FIELD(name) __typeof__(&name) name;
    DNNL_CALLS(DNNL_FIELD)
#undef DNNL_FIELD
    void (*omp_set_num_threads)(int);
    int opened; /* 1 opened, -1 failed (the message kept in why) */
    char why[256];
} dn;
static int bf16_threads = 1;

/* Opens oneDNN once (under bf16_lock or before any product); 0, or -1 with dn.why set. */
static int dnnl_open(void) {
    if (dn.opened) return dn.opened > 0 ? 0 : -1;
    dn.opened = -1;
    void *h = dlopen(DNNL_LIBRARY_NAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(dn.why, sizeof dn.why, "%s", dlerror());
        return -1;
    }
#define DNNL_RESOLVE(name)                                                                                             \
    if (!(*(void **)&dn.name = dlsym(h, #name))) {                                                                     \
        snprintf(dn.why, sizeof dn.why, "%s has no %s", DNNL_LIBRARY_NAME, #name);                                     \
        return -1;                                                                                                     \
    }
    DNNL_CALLS(DNNL_RESOLVE)
#undef DNNL_RESOLVE
    *(void **)&dn.omp_set_num_threads = dlsym(h, "omp_set_num_threads"); /* oneDNN's OpenMP, through its deps */
    dn.opened = 1;
    return 0;
}

#define BF16_SHAPES 64 /* a GPT has 5 linear shapes, each in 3 products; room for any model's */

typedef struct bf16_shape {
    int key[10];
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} bf16_shape;

static dnnl_engine_t bf16_engine;
static dnnl_stream_t bf16_stream;
static bf16_shape bf16_shapes[BF16_SHAPES];
static int bf16_nshapes;
static char bf16_impl_name[96];

static pthread_mutex_t bf16_lock = PTHREAD_MUTEX_INITIALIZER;

int tally__bf16_check(void) {
    if (!tally__cpu_avx512_bf16())
        return tally__seterr(TALLY_E_UNSUPPORTED,
                             "--precision bf16 needs a CPU with AVX512_BF16 (or AMX), and this one has neither: "
                             "train with --precision fp32");
    pthread_mutex_lock(&bf16_lock);
    int rc = dnnl_open();
    pthread_mutex_unlock(&bf16_lock);
    if (rc)
        return tally__seterr(TALLY_E_UNSUPPORTED,
                             "--precision bf16 needs oneDNN (%s), which could not be opened: %s; install Debian's "
                             "libdnnl2 (scripts/deps.sh installs libdnnl-dev), or train with --precision fp32",
                             DNNL_LIBRARY_NAME, dn.why);
    return 0;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static size_t cast16(uint16_t *dst, const float *src,
                                                                                     size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)h);
    }
    return i;
}
#define BF16_FAST_CAST(dst, src, n) (tally__cpu_avx512_bf16() ? cast16(dst, src, n) : 0)
#else
#define BF16_FAST_CAST(dst, src, n) ((void)(dst), (void)(src), (void)(n), (size_t)0)

int tally__bf16_check(void) {
    return tally__seterr(TALLY_E_UNSUPPORTED,
                         "--precision bf16 needs oneDNN, and this tally was built without it: install Debian's "
                         "libdnnl-dev (scripts/deps.sh does) and build again, or train with --precision fp32");
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
/* CPUID 7.0 EDX: AMX-BF16 (bit 22) and AMX-TILE (bit 24); XCR0 bits 17-18: the kernel saves the tiles'
 * configuration and data, without which no process may use them. */
int tally__bf16_on_amx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 22 & 1) || !(d >> 24 & 1)) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return 0; /* no OSXSAVE: no xgetbv */
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo >> 17 & 3) == 3;
}
#else
int tally__bf16_on_amx(void) { return 0; }
#endif

void tally__bf16_cast(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = BF16_FAST_CAST(dst, src, n); i < n; i++) dst[i] = tally__f32_to_bf16(src[i]);
}

#if defined(TALLY_HAVE_DNNL) && defined(__x86_64__) && defined(__GNUC__)
void tally__bf16_threads(int threads) { bf16_threads = threads > 0 ? threads : 1; }

const char *tally__bf16_impl(void) { return bf16_impl_name; }

#define DNNL_TRY(call, what)                                                                                           \
    do {                                                                                                               \
        dnnl_status_t st_ = (call);                                                                                    \
        if (st_ != dnnl_success) return tally__seterr(TALLY_E_SYSTEM, "oneDNN: %s failed (status %d)", what, st_);     \
    } while (0)

/* A row-major view of rows x cols with leading dimension ld, read transposed when trans. */
static int view(dnnl_memory_desc_t *md, int rows, int cols, int ld, int trans, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols}, strides = {trans ? 1 : ld, trans ? ld : 1};
    DNNL_TRY(dn.dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides), "a memory descriptor");
    return 0;
}

static int shape_make(bf16_shape *s) {
    const int *k = s->key;
    if (!bf16_engine) {
        DNNL_TRY(dn.dnnl_engine_create(&bf16_engine, dnnl_cpu, 0), "the CPU engine");
        DNNL_TRY(dn.dnnl_stream_create(&bf16_stream, bf16_engine, dnnl_stream_default_flags), "a stream");
    }
    dnnl_memory_desc_t a, b, c;
    int rc = view(&a, k[2], k[4], k[5], k[0], dnnl_bf16);
    if (!rc) rc = view(&b, k[4], k[3], k[6], k[1], dnnl_bf16);
    if (!rc) rc = view(&c, k[2], k[3], k[7], 0, dnnl_f32);
    if (rc) return rc;
    dnnl_matmul_desc_t desc;
    DNNL_TRY(dn.dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c), "a matmul descriptor");
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t ops = NULL;
    DNNL_TRY(dn.dnnl_primitive_attr_create(&attr), "an attribute");
    if (k[8]) { /* beta = 1: C += A B through the sum post-op */
        if (dn.dnnl_post_ops_create(&ops) != dnnl_success || dn.dnnl_post_ops_append_sum(ops, 1.0f) != dnnl_success ||
            dn.dnnl_primitive_attr_set_post_ops(attr, ops) != dnnl_success)
            rc = tally__seterr(TALLY_E_SYSTEM, "oneDNN: the accumulating matmul could not be described");
    }
    dnnl_primitive_desc_t pd = NULL;
    if (!rc && dn.dnnl_primitive_desc_create(&pd, &desc, attr, bf16_engine, NULL) != dnnl_success)
        rc = tally__seterr(TALLY_E_SYSTEM, "oneDNN has no bf16 matmul for %d x %d x %d", k[2], k[3], k[4]);
    if (ops) dn.dnnl_post_ops_destroy(ops);
    dn.dnnl_primitive_attr_destroy(attr);
    if (rc) return rc;
    const char *impl = NULL;
    if (dn.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        snprintf(bf16_impl_name, sizeof bf16_impl_name, "%s", impl);
    dnnl_status_t st = dn.dnnl_primitive_create(&s->prim, pd);
    dn.dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) return tally__seterr(TALLY_E_SYSTEM, "oneDNN: a matmul primitive failed (%d)", st);
    DNNL_TRY(dn.dnnl_memory_create(&s->a, &a, bf16_engine, DNNL_MEMORY_NONE), "a memory object");
    DNNL_TRY(dn.dnnl_memory_create(&s->b, &b, bf16_engine, DNNL_MEMORY_NONE), "a memory object");
    DNNL_TRY(dn.dnnl_memory_create(&s->c, &c, bf16_engine, DNNL_MEMORY_NONE), "a memory object");
    return 0;
}

static bf16_shape *shape_find(const int *key, int *rc) {
    for (int i = 0; i < bf16_nshapes; i++)
        if (!memcmp(bf16_shapes[i].key, key, sizeof bf16_shapes[i].key)) return &bf16_shapes[i];
    if (bf16_nshapes == BF16_SHAPES) {
        *rc = tally__seterr(TALLY_E_SYSTEM, "bf16: more than %d matmul shapes in one process", BF16_SHAPES);
        return NULL;
    }
    bf16_shape *s = &bf16_shapes[bf16_nshapes];
    memset(s, 0, sizeof *s);
    memcpy(s->key, key, sizeof s->key);
    if ((*rc = shape_make(s))) return NULL;
    bf16_nshapes++;
    return s;
}

static int run_shape(bf16_shape *s, const uint16_t *A, const uint16_t *B, float *C) {
    DNNL_TRY(dn.dnnl_memory_set_data_handle(s->a, (void *)A), "pointing at A");
    DNNL_TRY(dn.dnnl_memory_set_data_handle(s->b, (void *)B), "pointing at B");
    DNNL_TRY(dn.dnnl_memory_set_data_handle(s->c, C), "pointing at C");
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, s->a}, {DNNL_ARG_WEIGHTS, s->b}, {DNNL_ARG_DST, s->c}};
    DNNL_TRY(dn.dnnl_primitive_execute(s->prim, bf16_stream, 3, args), "a matmul");
    DNNL_TRY(dn.dnnl_stream_wait(bf16_stream), "waiting for a matmul");
    return 0;
}

int tally__gemm_bf16(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B,
                     int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) { /* an empty sum: C = beta C */
        for (int i = 0; i < M && beta == 0.0f; i++) memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof *C);
        return 0;
    }
    int key[10] = {trans_a != 0, trans_b != 0, M, N, K, lda, ldb, ldc, beta != 0.0f, 0}, rc = 0;
    pthread_mutex_lock(&bf16_lock);
    int opened = dnnl_open() == 0;
    if (opened && dn.omp_set_num_threads) dn.omp_set_num_threads(bf16_threads); /* the calling thread's setting */
    bf16_shape *s = opened ? shape_find(key, &rc) : NULL;
    if (s) rc = run_shape(s, A, B, C);
    pthread_mutex_unlock(&bf16_lock);
    return opened ? rc : tally__bf16_check(); /* never opened: the check says why */
}
#else
void tally__bf16_threads(int threads) { (void)threads; }

const char *tally__bf16_impl(void) { return ""; }

int tally__gemm_bf16(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B,
                     int ldb, float beta, float *C, int ldc) {
    return tally__bf16_check();
}
#endif
