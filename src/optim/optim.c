/* optim.c - SGD (momentum, Nesterov, L2 weight decay) and AdamW over a flat run of floats, computed as
 * torch.optim computes them so runs can be checked against PyTorch; config defaults and names. */
#include <tally/optim.h>

#include "optim_int.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include "../core/err.h"
#include "../core/alloc.h"

#define STATE_ALIGN 64
#define BLOCK       16

/* ---- configuration ---- */

TALLY_API void tally_optim_cfg_default(tally_optim_cfg *cfg, tally_optim_kind kind) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = kind;
    cfg->momentum = kind == TALLY_OPTIM_SGD ? 0.9f : 0.0f;
    /* Filled for either kind so a cfg whose kind is switched later still has sane Adam fields. */
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = kind == TALLY_OPTIM_ADAMW ? 0.01f : 0.0f;
}

/* NaN compares false, so it is rejected too. */
static int unit_ok(float x) { return x >= 0.0f && x < 1.0f; }

static int bad_unit(const char *field, float x, const char *example) {
    return tally__seterr(TALLY_E_INVALID, "tally_optim_init: %s = %g is outside [0, 1); use e.g. %s", field, (double)x,
                         example);
}

static int check_sgd(const tally_optim_cfg *c) {
    if (!unit_ok(c->momentum)) return bad_unit("momentum", c->momentum, "0.9, or 0 for plain SGD");
    if (c->nesterov && c->momentum == 0.0f)
        return tally__seterr(TALLY_E_INVALID, "tally_optim_init: Nesterov SGD needs momentum > 0 (as torch.optim.SGD); "
                                              "set momentum, e.g. 0.9, or turn nesterov off");
    return 0;
}

static int check_adamw(const tally_optim_cfg *c) {
    if (!unit_ok(c->beta1)) return bad_unit("beta1", c->beta1, "0.9");
    if (!unit_ok(c->beta2)) return bad_unit("beta2", c->beta2, "0.999");
    if (!(c->eps > 0.0f) || isinf(c->eps))
        return tally__seterr(TALLY_E_INVALID, "tally_optim_init: eps = %g must be positive and finite; use e.g. 1e-8",
                             (double)c->eps);
    return 0;
}

static int check_cfg(const tally_optim_cfg *c) {
    if (c->kind != TALLY_OPTIM_SGD && c->kind != TALLY_OPTIM_ADAMW)
        return tally__seterr(TALLY_E_INVALID,
                             "tally_optim_init: unknown optimizer kind %d; use TALLY_OPTIM_SGD or "
                             "TALLY_OPTIM_ADAMW",
                             (int)c->kind);
    if (!(c->weight_decay >= 0.0f) || isinf(c->weight_decay))
        return tally__seterr(TALLY_E_INVALID, "tally_optim_init: weight_decay = %g must be >= 0 and finite",
                             (double)c->weight_decay);
    return c->kind == TALLY_OPTIM_SGD ? check_sgd(c) : check_adamw(c);
}

/* ---- state ---- */

/* n == 0 leaves *out NULL: aligned_alloc(align, 0) may or may not return a pointer. */
static int state_alloc(float **out, size_t n) {
    *out = NULL;
    if (n == 0) return 0;
    if (n > (SIZE_MAX - (STATE_ALIGN - 1)) / sizeof(float))
        return tally__seterr(TALLY_E_NOMEM,
                             "tally_optim_init: %zu parameters is more optimizer state than memory "
                             "can address",
                             n);
    size_t bytes = n * sizeof(float);
    /* zeroed: a zero momentum buffer makes the first step buf = g, as torch's clone */
    float *p = tally__alloc_zeroed(bytes);
    if (!p)
        return tally__seterr(TALLY_E_NOMEM,
                             "tally_optim_init: cannot allocate %zu bytes of optimizer state for %zu "
                             "parameters",
                             bytes, n);
    *out = p;
    return 0;
}

TALLY_API int tally_optim_init(tally_optim *o, const tally_optim_cfg *cfg, size_t n) {
    tally__clearerr();
    if (!o || !cfg) return tally__seterr(TALLY_E_INVALID, "tally_optim_init: NULL optimizer or cfg");
    memset(o, 0, sizeof *o); /* a failed init leaves a struct that tally_optim_free accepts */
    int rc = check_cfg(cfg);
    if (rc) return rc;
    int moments = cfg->kind == TALLY_OPTIM_ADAMW ? 2 : cfg->momentum != 0.0f ? 1 : 0;
    if (moments >= 1 && (rc = state_alloc(&o->m, n)) != 0) return rc;
    if (moments == 2 && (rc = state_alloc(&o->v, n)) != 0) {
        tally_optim_free(o);
        return rc;
    }
    o->cfg = *cfg;
    o->n = n;
    return 0;
}

TALLY_API size_t tally_optim_state_bytes(const tally_optim *o) {
    if (!o) return 0;
    return ((o->m ? o->n : 0) + (o->v ? o->n : 0)) * sizeof(float);
}

TALLY_API void tally_optim_free(tally_optim *o) {
    if (!o) return;
    free(o->m);
    free(o->v);
    o->m = o->v = NULL;
}

/* ---- SGD ---- */

enum { SGD_PLAIN, SGD_HEAVY_BALL, SGD_NESTEROV };

typedef struct sgd_coef {
    float lr, mu, wd;
} sgd_coef;

/* `decayed` and `mode` are constants at every call site, so each inlined copy is a straight loop.
 * torch skips the decay term when weight_decay is 0 (0 * inf would otherwise poison the gradient). */
static inline __attribute__((always_inline)) void sgd_elem(float *restrict p, const float *restrict g,
                                                           float *restrict buf, size_t i, sgd_coef c, int decayed,
                                                           int mode) {
    float d = g[i];
    if (decayed) d += c.wd * p[i];
    if (mode != SGD_PLAIN) {
        float b = c.mu * buf[i] + d;
        buf[i] = b;
        d = mode == SGD_NESTEROV ? d + c.mu * b : b;
    }
    p[i] -= c.lr * d;
}

/* gcc's -O2 cost model vectorizes only loops whose trip count is a known multiple of the vector
 * width, hence the fixed-size inner loop (a multiple of the widest, AVX-512) and a scalar tail. */
static inline __attribute__((always_inline)) void sgd_all(float *restrict p, const float *restrict g,
                                                          float *restrict buf, size_t n, sgd_coef c, int decayed,
                                                          int mode) {
    size_t i = 0;
    for (; n - i >= BLOCK; i += BLOCK)
        for (size_t j = 0; j < BLOCK; j++) sgd_elem(p, g, buf, i + j, c, decayed, mode);
    for (; i < n; i++) sgd_elem(p, g, buf, i, c, decayed, mode);
}

/* noinline keeps the restrict on these pointers: gcc drops it from functions it inlines, and its -O2
 * cost model will not add a runtime overlap check in its place, so the loops would stay scalar. */
static __attribute__((noinline)) void sgd_run(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                                              sgd_coef c, int decayed, int mode) {
    switch (mode * 2 + decayed) {
    case SGD_PLAIN * 2: sgd_all(p, g, NULL, n, c, 0, SGD_PLAIN); break;
    case SGD_PLAIN * 2 + 1: sgd_all(p, g, NULL, n, c, 1, SGD_PLAIN); break;
    case SGD_HEAVY_BALL * 2: sgd_all(p, g, buf, n, c, 0, SGD_HEAVY_BALL); break;
    case SGD_HEAVY_BALL * 2 + 1: sgd_all(p, g, buf, n, c, 1, SGD_HEAVY_BALL); break;
    case SGD_NESTEROV * 2: sgd_all(p, g, buf, n, c, 0, SGD_NESTEROV); break;
    default: sgd_all(p, g, buf, n, c, 1, SGD_NESTEROV); break;
    }
}

/* Elements [begin, end), decayed or not. */
static void sgd_step(tally_optim *o, float *p, const float *g, size_t begin, size_t end, float lr, int decay) {
    sgd_coef c = {lr, o->cfg.momentum, o->cfg.weight_decay};
    int mode = !o->m ? SGD_PLAIN : o->cfg.nesterov ? SGD_NESTEROV : SGD_HEAVY_BALL;
    sgd_run(p + begin, g + begin, o->m ? o->m + begin : NULL, end - begin, c, decay && c.wd != 0.0f, mode);
}

/* ---- AdamW ----
 * Written with explicit 4-lane vectors rather than left to the auto-vectorizer: under the default
 * -fmath-errno gcc guards every sqrtf with a branch to the libm call (for errno), which stops it
 * vectorizing the loop. The tail is padded into one more vector so every element runs the same code
 * and rounds the same way wherever it falls. */

typedef float v4f __attribute__((vector_size(16)));

static inline v4f v4_load(const float *p) {
    v4f x;
    memcpy(&x, p, sizeof x); /* parameters and gradients need only float alignment */
    return x;
}

static inline void v4_store(float *p, v4f x) { memcpy(p, &x, sizeof x); }

static inline v4f v4_sqrt(v4f x) {
#if defined(__SSE__)
    return (v4f)_mm_sqrt_ps((__m128)x);
#elif defined(__aarch64__) && defined(__ARM_NEON)
    return (v4f)vsqrtq_f32((float32x4_t)x);
#else
    for (int k = 0; k < 4; k++) x[k] = sqrtf(x[k]);
    return x;
#endif
}

typedef struct adamw_coef {
    float decay;          /* 1 - lr*wd */
    float b1, c1, b2, c2; /* beta and 1 - beta */
    float step_size;      /* lr / (1 - beta1^t) */
    float bc2_sqrt;       /* sqrt(1 - beta2^t) */
    float eps;
} adamw_coef;

/* torch's order: sqrt(v) / sqrt(bc2) + eps, then p - (step_size * m) / denom. */
static inline void adamw_v4(float *p, const float *g, float *m, float *v, const adamw_coef *c) {
    v4f gi = v4_load(g);
    v4f mi = c->b1 * v4_load(m) + c->c1 * gi;
    v4f vi = c->b2 * v4_load(v) + c->c2 * gi * gi;
    v4f denom = v4_sqrt(vi) / c->bc2_sqrt + c->eps;
    v4_store(p, v4_load(p) * c->decay - c->step_size * mi / denom);
    v4_store(m, mi);
    v4_store(v, vi);
}

static void adamw_tail(float *p, const float *g, float *m, float *v, size_t r, const adamw_coef *c) {
    /* zero padding keeps the spare lanes finite: their denominator is eps */
    float tp[4] = {0}, tg[4] = {0}, tm[4] = {0}, tv[4] = {0};
    memcpy(tp, p, r * sizeof(float));
    memcpy(tg, g, r * sizeof(float));
    memcpy(tm, m, r * sizeof(float));
    memcpy(tv, v, r * sizeof(float));
    adamw_v4(tp, tg, tm, tv, c);
    memcpy(p, tp, r * sizeof(float));
    memcpy(m, tm, r * sizeof(float));
    memcpy(v, tv, r * sizeof(float));
}

/* Bias corrections in double once per step, as torch does in Python floats. */
static adamw_coef adamw_coefs(const tally_optim_cfg *cfg, long t, float lr) {
    double b1 = cfg->beta1, b2 = cfg->beta2;
    double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    adamw_coef c = {
        .decay = (float)(1.0 - (double)lr * cfg->weight_decay),
        .b1 = cfg->beta1,
        .c1 = (float)(1.0 - b1),
        .b2 = cfg->beta2,
        .c2 = (float)(1.0 - b2),
        .step_size = (float)(lr / bc1),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = cfg->eps,
    };
    return c;
}

/* Elements [begin, end), decayed or not. */
static void adamw_step(tally_optim *o, float *p, const float *g, size_t begin, size_t end, float lr, int decay) {
    if (!o->m || !o->v) return;
    adamw_coef c = adamw_coefs(&o->cfg, o->step + 1, lr);
    if (!decay) c.decay = 1.0f;
    float *m = o->m + begin, *v = o->v + begin;
    p += begin, g += begin;
    size_t n = end - begin, i = 0;
    for (; i + 4 <= n; i += 4) adamw_v4(p + i, g + i, m + i, v + i, &c);
    if (i < n) adamw_tail(p + i, g + i, m + i, v + i, n - i, &c);
}

/* ---- step and names ---- */

void tally__optim_step_range(tally_optim *o, float *params, const float *grads, size_t begin, size_t end, float lr,
                             int decay) {
    if (!o || end <= begin) return;
    if (o->cfg.kind == TALLY_OPTIM_ADAMW)
        adamw_step(o, params, grads, begin, end, lr, decay);
    else
        sgd_step(o, params, grads, begin, end, lr, decay);
}

void tally__optim_count_step(tally_optim *o) {
    if (o) o->step++;
}

TALLY_API void tally_optim_step(tally_optim *o, float *params, const float *grads, float lr) {
    if (!o) return;
    tally__optim_step_range(o, params, grads, 0, o->n, lr, 1);
    o->step++;
}

TALLY_API const char *tally_optim_name(tally_optim_kind k) {
    switch (k) {
    case TALLY_OPTIM_SGD: return "sgd";
    case TALLY_OPTIM_ADAMW: return "adamw";
    }
    return "unknown";
}

TALLY_API int tally_optim_parse(const char *name) {
    if (!name) return -1;
    if (strcmp(name, "sgd") == 0) return TALLY_OPTIM_SGD;
    if (strcmp(name, "adamw") == 0) return TALLY_OPTIM_ADAMW;
    return -1;
}
