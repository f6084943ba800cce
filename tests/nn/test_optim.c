/* test_optim.c - checks SGD and AdamW against double-precision references written here (torch.optim's
 * formulas), hand-computed one-element steps, determinism, config checks and the lr schedule. */
#include <tally/optim.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "optim/optim_int.h"

#define STEPS 6
#define RTOL  1e-5
#define ATOL  1e-6 /* parameters are O(1); this covers ones that pass near zero */

static uint64_t rng_state;
static void seed(uint64_t s) { rng_state = s; }
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 40) * 0x1p-24f; }
static void fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
}

static float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }
static double *dalloc(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

/* Count of elements outside tolerance; prints the first. */
static size_t mismatches(const char *what, size_t n, const float *got, const double *want) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= RTOL * fabs(want[i]) + ATOL)) {
            if (!bad) fprintf(stderr, "%s: n=%zu [%zu] got %.9g want %.9g\n", what, n, i, got[i], want[i]);
            bad++;
        }
    }
    return bad;
}

static float step_lr(float base, int s) { return base * (1.0f + 0.25f * (float)s); } /* varies per step */

/* ---- references, in double ---- */

static void ref_sgd(double *p, double *buf, const float *g, size_t n, double lr, const tally_optim_cfg *c, int first) {
    double mu = c->momentum, wd = c->weight_decay;
    for (size_t i = 0; i < n; i++) {
        double d = g[i] + wd * p[i];
        if (mu != 0) {
            buf[i] = first ? d : mu * buf[i] + d;
            d = c->nesterov ? d + mu * buf[i] : buf[i];
        }
        p[i] -= lr * d;
    }
}

static void ref_adamw(double *p, double *m, double *v, const float *g, size_t n, double lr, const tally_optim_cfg *c,
                      long t) {
    double b1 = c->beta1, b2 = c->beta2, bc1 = 1 - pow(b1, (double)t), bc2 = 1 - pow(b2, (double)t);
    for (size_t i = 0; i < n; i++) {
        p[i] *= 1 - lr * c->weight_decay;
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * (double)g[i] * g[i];
        p[i] -= lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + c->eps);
    }
}

/* ---- SGD and AdamW against the references ---- */

static void check_state(const tally_optim *o, const tally_optim_cfg *c, size_t n, const char *what) {
    size_t per = c->kind == TALLY_OPTIM_ADAMW ? 8 : c->momentum != 0 ? 4 : 0;
    TH_CHECK(tally_optim_state_bytes(o) == per * n, "%s n=%zu: state bytes %zu, want %zu", what, n,
             tally_optim_state_bytes(o), per * n);
    TH_CHECK(((uintptr_t)o->m % 64) == 0 && ((uintptr_t)o->v % 64) == 0, "%s: state not 64-byte aligned", what);
    TH_CHECK(c->kind == TALLY_OPTIM_ADAMW || o->v == NULL, "%s: SGD allocated a second moment", what);
    TH_CHECK(per != 0 || o->m == NULL, "%s: plain SGD allocated state", what);
}

static void run_vs_ref(const tally_optim_cfg *c, size_t n, float lr, const char *what) {
    float *p = falloc(n), *g = falloc(n);
    double *rp = dalloc(n), *rm = dalloc(n), *rv = dalloc(n);
    seed(0x5eed0000u + n);
    fill(p, n, -1, 1);
    for (size_t i = 0; i < n; i++) rp[i] = p[i];
    tally_optim o;
    int rc = tally_optim_init(&o, c, n);
    TH_CHECK(rc == 0, "%s n=%zu: init rc %d: %s", what, n, rc, tally_last_error());
    if (rc) goto out;
    check_state(&o, c, n, what);
    for (int s = 0; s < STEPS; s++) {
        fill(g, n, -1, 1);
        float l = step_lr(lr, s);
        tally_optim_step(&o, p, g, l);
        if (c->kind == TALLY_OPTIM_ADAMW)
            ref_adamw(rp, rm, rv, g, n, l, c, s + 1);
        else
            ref_sgd(rp, rm, g, n, l, c, s == 0);
    }
    TH_CHECK(o.step == STEPS, "%s: step count %ld, want %d", what, o.step, STEPS);
    TH_CHECK(mismatches(what, n, p, rp) == 0, "%s n=%zu: parameters differ from the reference", what, n);
    tally_optim_free(&o);
out:
    free(p), free(g), free(rp), free(rm), free(rv);
}

static tally_optim_cfg sgd_cfg(float mu, int nesterov, float wd) {
    tally_optim_cfg c;
    tally_optim_cfg_default(&c, TALLY_OPTIM_SGD);
    c.momentum = mu, c.nesterov = nesterov, c.weight_decay = wd;
    return c;
}

static tally_optim_cfg adamw_cfg(float wd) {
    tally_optim_cfg c;
    tally_optim_cfg_default(&c, TALLY_OPTIM_ADAMW);
    c.weight_decay = wd;
    return c;
}

static void test_against_reference(void) {
    size_t sizes[] = {0, 1, 7, 1000, 100003};
    int nsizes = th_light() ? 4 : 5;
    struct {
        tally_optim_cfg c;
        float lr;
        const char *what;
    } cases[] = {
        {sgd_cfg(0, 0, 0), 0.1f, "sgd plain"},
        {sgd_cfg(0.9f, 0, 0), 0.1f, "sgd momentum"},
        {sgd_cfg(0.9f, 1, 0), 0.1f, "sgd nesterov"},
        {sgd_cfg(0, 0, 0.05f), 0.1f, "sgd plain weight decay"},
        {sgd_cfg(0.9f, 0, 0.05f), 0.1f, "sgd momentum weight decay"},
        {sgd_cfg(0.9f, 1, 0.05f), 0.1f, "sgd nesterov weight decay"},
        {adamw_cfg(0), 0.01f, "adamw"},
        {adamw_cfg(0.1f), 0.01f, "adamw weight decay"},
    };
    cases[7].c.beta1 = 0.5f, cases[7].c.beta2 = 0.9f, cases[7].c.eps = 1e-6f;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int s = 0; s < nsizes; s++) run_vs_ref(&cases[k].c, sizes[s], cases[k].lr, cases[k].what);
}

/* ---- one element, by hand ---- */

static float one_run(tally_optim_cfg c, float p, const float *g, int steps, float lr) {
    tally_optim o;
    if (tally_optim_init(&o, &c, 1) != 0) return NAN;
    for (int s = 0; s < steps; s++) tally_optim_step(&o, &p, &g[s], lr);
    tally_optim_free(&o);
    return p;
}

#define NEAR(got, want, tol, ...) TH_CHECK(fabs((double)(got) - (want)) <= (tol), __VA_ARGS__)

static void test_by_hand(void) {
    const float ones[3] = {1, 1, 1}, halves[3] = {0.5f, 0.5f, 0.5f}, neg[3] = {-3, -3, -3};
    /* buf = 1 then 1.9: p = 1 - 0.1 - 0.19 */
    NEAR(one_run(sgd_cfg(0.9f, 0, 0), 1, ones, 2, 0.1f), 0.71, 1e-6, "sgd momentum by hand");
    /* d = 1 + 0.9*1 = 1.9, then 1 + 0.9*1.9 = 2.71 */
    NEAR(one_run(sgd_cfg(0.9f, 1, 0), 1, ones, 2, 0.1f), 1 - 0.19 - 0.271, 1e-6, "sgd nesterov by hand");
    /* d = g + wd*p = 1 + 0.5*2 */
    NEAR(one_run(sgd_cfg(0, 0, 0.5f), 2, ones, 1, 0.1f), 1.8, 1e-6, "sgd weight decay by hand");
    NEAR(one_run(sgd_cfg(0, 0, 0), 2, ones, 3, 0.25f), 1.25, 1e-6, "plain sgd by hand");
    /* Adam's bias-corrected step is lr*sign(g) while the gradient is constant, whatever its size */
    NEAR(one_run(adamw_cfg(0), 1, halves, 1, 0.1f), 0.9, 1e-6, "adamw first step by hand");
    NEAR(one_run(adamw_cfg(0), 1, neg, 1, 0.1f), 1.1, 1e-6, "adamw first step, negative gradient");
    NEAR(one_run(adamw_cfg(0), 1, halves, 3, 0.1f), 0.7, 1e-6, "adamw three constant steps");
    /* decoupled decay: p*(1 - lr*wd) = 0.999, then the lr-sized step */
    NEAR(one_run(adamw_cfg(0.01f), 1, halves, 1, 0.1f), 0.899, 1e-6, "adamw decay by hand");
    /* a zero gradient moves nothing but the decay: 0/(0 + eps) */
    const float zero[1] = {0};
    TH_CHECK(one_run(adamw_cfg(0), 1, zero, 1, 0.1f) == 1.0f, "adamw zero gradient moved p");
}

/* ---- determinism ---- */

static void run_fixed(const tally_optim_cfg *c, size_t n, float *p, float *state) {
    float *g = falloc(n);
    seed(42);
    fill(p, n, -1, 1);
    tally_optim o;
    if (tally_optim_init(&o, c, n) != 0) {
        free(g);
        return;
    }
    for (int s = 0; s < STEPS; s++) {
        seed(1000 + (uint64_t)s); /* per step, so a shorter run sees a prefix of the same data */
        fill(g, n, -1, 1);
        tally_optim_step(&o, p, g, 0.01f);
    }
    memcpy(state, o.m, n * sizeof(float));
    if (o.v) memcpy(state + n, o.v, n * sizeof(float));
    tally_optim_free(&o);
    free(g);
}

static void test_determinism(void) {
    const size_t n = 1003;
    tally_optim_cfg cs[2] = {adamw_cfg(0.01f), sgd_cfg(0.9f, 1, 0.01f)};
    for (int k = 0; k < 2; k++) {
        float *p1 = falloc(n), *p2 = falloc(n), *s1 = falloc(2 * n), *s2 = falloc(2 * n);
        run_fixed(&cs[k], n, p1, s1);
        run_fixed(&cs[k], n, p2, s2);
        TH_CHECK(memcmp(p1, p2, n * sizeof(float)) == 0 && memcmp(s1, s2, 2 * n * sizeof(float)) == 0,
                 "%s: two identical runs differ", tally_optim_name(cs[k].kind));
        free(p1), free(p2), free(s1), free(s2);
    }
    /* AdamW pads its tail through the vector code, so an element's result does not depend on n. */
    float *pa = falloc(n), *sa = falloc(2 * n), *pb = falloc(n), *sb = falloc(2 * n);
    run_fixed(&cs[0], n, pa, sa);
    run_fixed(&cs[0], n - 3, pb, sb);
    int same = 1;
    for (size_t i = 0; i < n - 3; i++) same &= memcmp(&pa[i], &pb[i], sizeof(float)) == 0;
    TH_CHECK(same, "adamw: an element's result depends on where the run ends");
    free(pa), free(sa), free(pb), free(sb);
}

/* ---- configuration ---- */

static void expect_invalid(tally_optim_cfg c, const char *field) {
    tally_optim o;
    memset(&o, 0xab, sizeof o);
    int rc = tally_optim_init(&o, &c, 10);
    const char *msg = tally_last_error();
    TH_CHECK(rc == TALLY_E_INVALID, "bad %s accepted (rc %d)", field, rc);
    TH_CHECK(msg && strstr(msg, field), "bad %s: message does not name it: \"%s\"", field, msg ? msg : "");
    TH_CHECK(o.m == NULL && o.v == NULL, "bad %s: failed init left state pointers", field);
    tally_optim_free(&o);
}

static void test_config(void) {
    tally_optim_cfg c;
    tally_optim_cfg_default(&c, TALLY_OPTIM_SGD);
    TH_CHECK(c.kind == TALLY_OPTIM_SGD && c.momentum == 0.9f && c.weight_decay == 0 && !c.nesterov, "sgd defaults");
    tally_optim_cfg_default(&c, TALLY_OPTIM_ADAMW);
    TH_CHECK(c.kind == TALLY_OPTIM_ADAMW && c.beta1 == 0.9f && c.beta2 == 0.999f && c.eps == 1e-8f &&
                 c.weight_decay == 0.01f,
             "adamw defaults");

    expect_invalid(sgd_cfg(-0.1f, 0, 0), "momentum");
    expect_invalid(sgd_cfg(1.0f, 0, 0), "momentum");
    expect_invalid(sgd_cfg(NAN, 0, 0), "momentum");
    expect_invalid(sgd_cfg(0, 1, 0), "Nesterov");
    expect_invalid(sgd_cfg(0.9f, 0, -1), "weight_decay");
    expect_invalid(adamw_cfg(NAN), "weight_decay");
    c = adamw_cfg(0), c.beta1 = 1.0f;
    expect_invalid(c, "beta1");
    c = adamw_cfg(0), c.beta2 = -0.1f;
    expect_invalid(c, "beta2");
    c = adamw_cfg(0), c.eps = 0;
    expect_invalid(c, "eps");
    c = adamw_cfg(0), c.eps = -1e-8f;
    expect_invalid(c, "eps");
    c = adamw_cfg(0), c.kind = (tally_optim_kind)7;
    expect_invalid(c, "kind");

    tally_optim o;
    TH_CHECK(tally_optim_init(&o, NULL, 1) == TALLY_E_INVALID, "NULL cfg accepted");
    c = adamw_cfg(0);
    int rc = tally_optim_init(&o, &c, SIZE_MAX / 4); /* n * 8 bytes overflows */
    TH_CHECK(rc == TALLY_E_NOMEM && strlen(tally_last_error()) > 0, "oversized state: rc %d", rc);
    tally_optim_free(&o);

    memset(&o, 0, sizeof o);
    tally_optim_free(&o); /* zeroed */
    c = adamw_cfg(0);
    TH_CHECK(tally_optim_init(&o, &c, 5) == 0, "init n=5");
    tally_optim_free(&o);
    tally_optim_free(&o); /* twice */
    TH_CHECK(o.m == NULL && o.v == NULL && tally_optim_state_bytes(&o) == 0, "freed state still counted");
}

static void test_names(void) {
    tally_optim_kind ks[] = {TALLY_OPTIM_SGD, TALLY_OPTIM_ADAMW};
    for (int i = 0; i < 2; i++)
        TH_CHECK(tally_optim_parse(tally_optim_name(ks[i])) == (int)ks[i], "optimizer name round trip %d", i);
    TH_CHECK(strcmp(tally_optim_name(TALLY_OPTIM_ADAMW), "adamw") == 0, "adamw name");
    TH_CHECK(tally_optim_parse("adam") == -1 && tally_optim_parse("SGD") == -1 && tally_optim_parse("") == -1 &&
                 tally_optim_parse(NULL) == -1,
             "unknown optimizer names parse");
    tally_decay ds[] = {TALLY_DECAY_NONE, TALLY_DECAY_COSINE, TALLY_DECAY_STEP};
    for (int i = 0; i < 3; i++)
        TH_CHECK(tally_decay_parse(tally_decay_name(ds[i])) == (int)ds[i], "decay name round trip %d", i);
    TH_CHECK(strcmp(tally_decay_name(TALLY_DECAY_COSINE), "cosine") == 0, "cosine name");
    TH_CHECK(tally_decay_parse("linear") == -1 && tally_decay_parse(NULL) == -1, "unknown decay names parse");
}

/* ---- learning-rate schedule ---- */

#define LR_NEAR(got, want, ...) NEAR(got, want, 1e-6 * fabs(want) + 1e-9, __VA_ARGS__)

static void test_schedule(void) {
    tally_lr_schedule s = {.lr = 0.1f, .warmup_steps = 4, .decay = TALLY_DECAY_NONE};
    for (long k = 0; k < 4; k++) LR_NEAR(tally_lr_at(&s, k), 0.1 * (k + 1) / 4, "warmup step %ld", k);
    LR_NEAR(tally_lr_at(&s, 4), 0.1, "after warmup, no decay");
    LR_NEAR(tally_lr_at(&s, 100000), 0.1, "long after warmup, no decay");

    s.decay = TALLY_DECAY_COSINE, s.total_steps = 104, s.min_lr = 0.001f;
    LR_NEAR(tally_lr_at(&s, 3), 0.1, "last warmup step reaches lr");
    LR_NEAR(tally_lr_at(&s, 4), 0.1, "cosine starts at lr");
    LR_NEAR(tally_lr_at(&s, 54), (0.1 + (double)0.001f) / 2, "cosine midpoint");
    LR_NEAR(tally_lr_at(&s, 29), 0.001f + 0.5 * (0.1 - 0.001f) * (1 + cos(M_PI * 0.25)), "cosine quarter");
    TH_CHECK(tally_lr_at(&s, 104) == 0.001f, "cosine ends at min_lr: %g", tally_lr_at(&s, 104));
    TH_CHECK(tally_lr_at(&s, 5000) == 0.001f, "cosine stays at min_lr: %g", tally_lr_at(&s, 5000));
    int falling = 1;
    for (long k = 5; k <= 104; k++) falling &= tally_lr_at(&s, k) <= tally_lr_at(&s, k - 1);
    TH_CHECK(falling, "cosine does not fall monotonically");

    s = (tally_lr_schedule){
        .lr = 1.0f, .warmup_steps = 0, .decay = TALLY_DECAY_STEP, .step_every = 10, .step_gamma = 0.5f};
    LR_NEAR(tally_lr_at(&s, 0), 1.0, "step decay at 0");
    LR_NEAR(tally_lr_at(&s, 9), 1.0, "step decay before the first boundary");
    LR_NEAR(tally_lr_at(&s, 10), 0.5, "step decay at the first boundary");
    LR_NEAR(tally_lr_at(&s, 19), 0.5, "step decay before the second boundary");
    LR_NEAR(tally_lr_at(&s, 20), 0.25, "step decay at the second boundary");
    s.warmup_steps = 5;
    LR_NEAR(tally_lr_at(&s, 14), 1.0, "step decay counts from the end of warmup");
    LR_NEAR(tally_lr_at(&s, 15), 0.5, "step decay boundary after warmup");
    s.step_every = 0;
    LR_NEAR(tally_lr_at(&s, 1000), 1.0, "step_every 0 never decays");

    TH_CHECK(tally_lr_scaled(0.1f, 8) == 0.1f * 8, "linear scaling rule");
}

/* ---- a quadratic, minimised ---- */

/* loss = sum a_i (p_i - t_i)^2 / 2; returns max |p - t| after `steps` updates */
static double minimise(const tally_optim_cfg *c, const tally_lr_schedule *s, int steps) {
    enum { N = 64 };
    float a[N], t[N], p[N] = {0}, g[N];
    seed(7);
    fill(a, N, 0.5f, 2.0f);
    fill(t, N, -1, 1);
    tally_optim o;
    if (tally_optim_init(&o, c, N) != 0) return INFINITY;
    for (int k = 0; k < steps; k++) {
        for (int i = 0; i < N; i++) g[i] = a[i] * (p[i] - t[i]);
        tally_optim_step(&o, p, g, tally_lr_at(s, k));
    }
    tally_optim_free(&o);
    double worst = 0;
    for (int i = 0; i < N; i++) worst = fmax(worst, fabs((double)p[i] - t[i]));
    return worst;
}

static void test_converges(void) {
    tally_optim_cfg sgd = sgd_cfg(0.9f, 0, 0), nag = sgd_cfg(0.9f, 1, 0), adam = adamw_cfg(0);
    tally_lr_schedule flat = {.lr = 0.1f, .decay = TALLY_DECAY_NONE};
    tally_lr_schedule cosine = {
        .lr = 0.05f, .warmup_steps = 10, .decay = TALLY_DECAY_COSINE, .total_steps = 600, .min_lr = 0};
    double e;
    TH_CHECK((e = minimise(&sgd, &flat, 400)) < 1e-4, "sgd momentum did not converge: %g", e);
    TH_CHECK((e = minimise(&nag, &flat, 400)) < 1e-4, "sgd nesterov did not converge: %g", e);
    TH_CHECK((e = minimise(&adam, &cosine, 600)) < 1e-3, "adamw did not converge: %g", e);
}

/* A step taken range by range, decay on some and off on others, is bit for bit the whole-array step of
 * an optimizer with that decay on those elements and one without it on the rest (each element's
 * update is its own). Cuts at 0, 1, odd and vector-width-crossing places; SGD-momentum and AdamW. */
static void test_ranges(void) {
    const size_t n = 37, cut[] = {0, 1, 6, 13, 14, 29, 37};
    const tally_optim_kind kinds[] = {TALLY_OPTIM_SGD, TALLY_OPTIM_ADAMW};
    for (int k = 0; k < 2; k++) {
        tally_optim_cfg on, off;
        tally_optim_cfg_default(&on, kinds[k]);
        on.weight_decay = 0.1f;
        off = on;
        off.weight_decay = 0.0f;
        tally_optim split, whole_on, whole_off;
        float *p = falloc(n), *g = falloc(n), *pon = falloc(n), *poff = falloc(n);
        seed(40 + (uint64_t)k);
        fill(p, n, -1, 1);
        memcpy(pon, p, n * sizeof *p);
        memcpy(poff, p, n * sizeof *p);
        TH_CHECK(!tally_optim_init(&split, &on, n) && !tally_optim_init(&whole_on, &on, n) &&
                     !tally_optim_init(&whole_off, &off, n),
                 "ranges: init");
        for (int s = 0; s < STEPS; s++) {
            fill(g, n, -1, 1);
            for (size_t c = 0; c + 1 < sizeof cut / sizeof *cut; c++)
                tally__optim_step_range(&split, p, g, cut[c], cut[c + 1], 0.01f, (int)(c % 2));
            tally__optim_count_step(&split);
            tally_optim_step(&whole_on, pon, g, 0.01f);
            tally_optim_step(&whole_off, poff, g, 0.01f);
        }
        int bad = 0;
        for (size_t c = 0; c + 1 < sizeof cut / sizeof *cut; c++)
            for (size_t i = cut[c]; i < cut[c + 1]; i++) bad += p[i] != (c % 2 ? pon[i] : poff[i]);
        TH_CHECK(!bad && split.step == STEPS, "%s by ranges: %d of %zu elements differ from the whole-array steps",
                 tally_optim_name(kinds[k]), bad, n);
        tally_optim_free(&split), tally_optim_free(&whole_on), tally_optim_free(&whole_off);
        free(p), free(g), free(pon), free(poff);
    }
}

int main(void) {
    test_ranges();
    test_against_reference();
    test_by_hand();
    test_determinism();
    test_config();
    test_names();
    test_schedule();
    test_converges();
    return th_verdict("test_optim");
}
