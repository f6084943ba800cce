/* test_codec.c - the gradient codecs against references written here: fp16/bf16 casts bit-exact against
 * the IEEE definitions, top-k selection against a sort, PowerSGD's orthonormalisation and its exact
 * recovery of a low-rank matrix, and error feedback conserving the gradient through the engine. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <tally/ddp.h>

#include "harness.h"
#include "dp/codec.h"

static uint32_t bits_of(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static float float_of(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- references from the definitions: value -> nearest representable (ties to even) -> encoding ---- */

/* A finite |v| rounded to a binary format with `mbits` stored mantissa bits and minimum normal exponent
 * emin (subnormals below), in double (every input float is exact there). */
static double round_to_format(double v, int mbits, int emin) {
    if (v == 0) return 0;
    int e;
    frexp(v, &e);
    e -= 1; /* v in [2^e, 2^(e+1)) */
    if (e < emin) e = emin;
    double q = ldexp(1.0, e - mbits); /* the spacing of representable values there */
    double m = v / q, r = floor(m);
    if (m - r > 0.5 || (m - r == 0.5 && fmod(r, 2.0) != 0)) r += 1;
    return r * q;
}

static uint16_t ref_f16(float f) {
    uint16_t sign = (bits_of(f) >> 16) & 0x8000u;
    if (isnan(f)) return 0xffff; /* a marker: only "is a NaN of this sign" is compared */
    double v = round_to_format(fabs((double)f), 10, -14);
    if (isinf(f) || v >= 65536.0) return sign | 0x7c00u;
    if (v < ldexp(1.0, -14)) return sign | (uint16_t)(v / ldexp(1.0, -24));
    int e;
    double m = frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
    return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024);
}

static uint16_t ref_bf16(float f) {
    uint16_t sign = (bits_of(f) >> 16) & 0x8000u;
    if (isnan(f)) return 0xffff;
    double v = round_to_format(fabs((double)f), 7, -126);
    if (isinf(f) || v >= ldexp(1.0, 128)) return sign | 0x7f80u;
    return sign | (uint16_t)(bits_of((float)v) >> 16); /* v has 8 significant bits: exact as a float */
}

static double ref_f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double s = h & 0x8000 ? -1 : 1;
    if (e == 31) return m ? NAN : s * INFINITY;
    return s * (e ? ldexp(1024 + m, e - 25) : ldexp(m, -24));
}

static int same_half(uint16_t got, uint16_t want, uint16_t exp_mask) {
    if (want == 0xffff) return (got & exp_mask) == exp_mask && (got & ~(exp_mask | 0x8000u)) != 0;
    return got == want;
}

/* Inputs: zeros, infinities, NaNs, max finite, past the range, subnormals of both formats, exact ties
 * between neighbours (odd and even), and random bits over the whole float range. */
static size_t cast_inputs(float *x, size_t cap) {
    size_t n = 0;
    const float fixed[] = {0.0f,     -0.0f,           INFINITY,      -INFINITY,     NAN,           -NAN,
                           65504.0f, -65504.0f,       65519.99f,     65520.0f,      65536.0f,      1e6f,
                           -1e30f,   3.4028235e38f,   6.1035156e-5f, 5.9604645e-8f, 2.9802322e-8f, 2.98023259e-8f,
                           1e-9f,    1.17549435e-38f, 1e-40f,        1.0f,          1.0009765625f};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) x[n++] = fixed[i];
    x[n++] = float_of(0x7f800001u);                             /* a signalling NaN's bits */
    for (uint32_t h = 0; h < 0x7c00u && n + 2 < cap; h += 97) { /* fp16 neighbours' midpoints */
        x[n++] = (float)((ref_f16_value((uint16_t)h) + ref_f16_value((uint16_t)(h + 1))) / 2);
        x[n++] = -(float)ref_f16_value((uint16_t)h);
    }
    for (uint32_t b = 0x3f800000u; b < 0x3f810000u && n < cap; b += 0x4000u)
        x[n++] = float_of(b | 0x8000u); /* bf16 ties */
    uint64_t s = 88172645463325252ull;
    while (n < cap) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[n++] = float_of((uint32_t)s);
    }
    return n;
}

static void test_casts(void) {
    enum { N = 20011 };
    static float x[N], back[N];
    static uint16_t h[N];
    size_t n = cast_inputs(x, N);
    const size_t sizes[] = {0, 1, 7, 8, 9, 1001, n};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t m = sizes[s], bad16 = 0, badbf = 0;
        tally__codec_to_half(x, h, m, TALLY_F16);
        for (size_t i = 0; i < m; i++) bad16 += !same_half(h[i], ref_f16(x[i]), 0x7c00u);
        tally__codec_to_half(x, h, m, TALLY_BF16);
        for (size_t i = 0; i < m; i++) badbf += !same_half(h[i], ref_bf16(x[i]), 0x7f80u);
        TH_CHECK(!bad16 && !badbf, "casts of %zu values: %zu fp16 and %zu bf16 differ from the reference", m, bad16,
                 badbf);
    }
    size_t bad = 0;
    static uint16_t all[65536];
    static float vals[65536];
    for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    tally__codec_from_half(all, vals, 65536, TALLY_F16);
    for (uint32_t i = 0; i < 65536; i++) {
        double want = ref_f16_value((uint16_t)i);
        bad += isnan(want) ? !isnan(vals[i]) : (double)vals[i] != want || !!signbit(vals[i]) != !!(i & 0x8000);
    }
    TH_CHECK(!bad, "fp16 -> f32 of all 65536 values: %zu differ", bad);
    tally__codec_from_half(all, vals, 65536, TALLY_BF16);
    bad = 0;
    for (uint32_t i = 0; i < 65536; i++) bad += bits_of(vals[i]) != i << 16 && !isnan(vals[i]);
    TH_CHECK(!bad, "bf16 -> f32 of all 65536 values: %zu differ", bad);
    tally__codec_to_half(x, h, n, TALLY_F16); /* and back: the values the wire carries */
    tally__codec_from_half(h, back, n, TALLY_F16);
    TH_CHECK(back[6] == 65504.0f && isinf(back[9]) && isnan(back[4]), "fp16: max finite %g, 65520 -> %g, NaN -> %g",
             back[6], back[9], back[4]);
}

/* ---- top-k selection ---- */

static const float *g_sel;
static int by_mag(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    float x = isnan(g_sel[i]) ? INFINITY : fabsf(g_sel[i]), y = isnan(g_sel[j]) ? INFINITY : fabsf(g_sel[j]);
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}
static int by_index(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    return i < j ? -1 : i > j;
}

static void test_topk_select(void) {
    enum { N = 30011 };
    static float x[N], key[N];
    static uint32_t want[N], got[N];
    const size_t sizes[] = {1, 2, 7, 1000, N};
    uint64_t s = 12345;
    for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
        size_t n = sizes[c];
        for (int flavour = 0; flavour < 3; flavour++) {
            for (size_t i = 0; i < n; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                int v = (int)(s >> 40) % 9 - 4; /* flavour 0: many ties (and zeros) */
                x[i] = flavour == 0 ? (float)v : flavour == 1 ? (float)(int64_t)(s >> 20) * 1e-9f : (float)(v % 2);
            }
            if (n > 3) x[n / 2] = NAN;
            g_sel = x;
            for (size_t i = 0; i < n; i++) want[i] = (uint32_t)i;
            qsort(want, n, 4, by_mag);
            const size_t ks[] = {1, n / 100 + 1, n / 3 + 1, n};
            for (int kc = 0; kc < 4; kc++) {
                size_t k = ks[kc] > n ? n : ks[kc];
                static uint32_t w[N];
                memcpy(w, want, k * 4);
                qsort(w, k, 4, by_index);
                tally__topk_select(x, n, k, got, key);
                TH_CHECK(!memcmp(w, got, k * 4), "top-%zu of %zu (flavour %d) differs from the sorted reference", k, n,
                         flavour);
            }
        }
    }
}

/* ---- PowerSGD ---- */

static void test_orthonormalize(void) {
    enum { ROWS = 57, R = 4 };
    static float p[ROWS * R];
    uint64_t s = 99;
    for (int i = 0; i < ROWS * R; i++) {
        s = s * 6364136223846793005ull + 1;
        p[i] = (float)((int64_t)(s >> 33) % 1000) / 500.0f;
    }
    for (int i = 0; i < ROWS; i++) p[i * R + 2] = 3 * p[i * R + 0] - p[i * R + 1]; /* dependent */
    tally__powersgd_orthonormalize(p, ROWS, R);
    double worst = 0;
    for (int a = 0; a < R; a++)
        for (int b = 0; b < R; b++) {
            double d = 0;
            for (int i = 0; i < ROWS; i++) d += (double)p[i * R + a] * p[i * R + b];
            double want = a == b && a != 2 ? 1 : 0;
            if (fabs(d - want) > worst) worst = fabs(d - want);
        }
    TH_CHECK(worst < 1e-5, "P^T P differs from I (the dependent column zero) by %g", worst);
}

/* ---- through the engine, on real ranks ---- */

/* Three layers: weight [6,13] + bias, [5,6] + bias, [3,5] + bias: 84 + 35 + 18 = 137 values. */
static tally__model g_model;
static size_t g_off[4];

static void make_model(void) {
    static const int shape[3][2] = {{6, 13}, {5, 6}, {3, 5}};
    size_t at = 0;
    memset(&g_model, 0, sizeof g_model);
    for (int l = 0; l < 3; l++) {
        g_off[l] = at;
        for (int b = 0; b < 2; b++) {
            tally__tensor *T = &g_model.tensor[g_model.ntensors++];
            snprintf(T->name, sizeof T->name, "fc%d.%s", l + 1, b ? "bias" : "weight");
            T->ndim = b ? 1 : 2;
            T->shape[0] = shape[l][0];
            T->shape[1] = b ? 0 : shape[l][1];
            T->offset = at;
            T->count = b ? (size_t)shape[l][0] : (size_t)shape[l][0] * shape[l][1];
            at += T->count;
        }
    }
    g_off[3] = g_model.nparams = at;
}

typedef struct ef_case {
    tally__codec_cfg codec;
    int accum, steps, no_overlap, lowrank; /* lowrank: every rank's gradient is a multiple of one rank-1 matrix */
    double err[TH_MAX_RANKS];              /* out: max |sum(sent) + residuals - sum(gradients)| / scale */
    double mean_err[TH_MAX_RANKS];         /* out (lowrank): max |output - mean gradient| of the first step */
} ef_case;

static float grad_of(int rank, int step, int k, size_t i, int lowrank) {
    if (lowrank) { /* (rank + 1) u v^T for each weight matrix, (rank + 1) for the biases */
        for (int t = 0; t < g_model.ntensors; t++) {
            const tally__tensor *T = &g_model.tensor[t];
            if (i < T->offset || i >= T->offset + T->count) continue;
            if (T->ndim < 2) return (float)(rank + 1);
            size_t a = (i - T->offset) / (size_t)T->shape[1], b = (i - T->offset) % (size_t)T->shape[1];
            return (float)(rank + 1) * ((float)(a % 3) - 0.5f) * ((float)(b % 4) - 1.5f);
        }
    }
    uint32_t h = (uint32_t)(rank * 7919 + step * 104729 + k * 1299709) ^ (uint32_t)(i * 2654435761u);
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    return ((float)(h % 20001) - 10000.0f) / 1000.0f;
}

static int ef_rank(int rank, int size, void *arg) {
    ef_case *ec = arg;
    int fails = 0;
    tally_comm *c;
    if (tally_comm_init(&c)) return fprintf(stderr, "rank %d: %s\n", rank, tally_last_error()), 1;
    size_t n = g_model.nparams;
    float *g = calloc(n, sizeof(float));
    double *fed = calloc(n, sizeof(double)), *sent = calloc(n, sizeof(double));
    tally__codec *cd;
    tally_ddp *d;
    int rc = tally__codec_create(&ec->codec, c, &g_model, 5, &cd);
    tally_ddp_opts o = {.bucket_bytes = 200,
                        .no_overlap = ec->no_overlap,
                        .accum = ec->accum,
                        .reduce = tally__codec_reduce,
                        .reduce_arg = cd};
    if (!rc) rc = tally_ddp_create(c, g, n, g_off, 3, &o, &d);
    tally_ddp_stats st;
    tally_ddp_get_stats(d, &st);
    size_t b0[8], b1[8];
    for (int i = 0; i < st.buckets && !rc; i++) tally_ddp_bucket(d, i, &b0[i], &b1[i]);
    if (!rc) rc = tally__codec_set_buckets(cd, st.buckets, b0, b1);
    float denom = (float)size * ec->accum;
    for (int s = 0; s < ec->steps && !rc; s++) {
        tally__codec_step_begin(cd);
        for (int k = 0; k < ec->accum && !rc; k++) {
            tally_ddp_begin(d);
            for (int l = 2; l >= 0; l--) {
                for (size_t i = g_off[l]; i < g_off[l + 1]; i++) g[i] += grad_of(rank, s, k, i, ec->lowrank);
                tally_ddp_layer_ready(d, l);
            }
            rc = tally_ddp_wait(d);
        }
        tally__codec_step_end(cd, 1);
        for (size_t i = 0; i < n; i++) {
            double mean = 0;
            for (int r = 0; r < size; r++)
                for (int k = 0; k < ec->accum; k++) mean += grad_of(r, s, k, i, ec->lowrank);
            mean /= denom;
            if (s == 0 && fabs(g[i] - mean) > ec->mean_err[rank]) ec->mean_err[rank] = fabs(g[i] - mean);
            for (int k = 0; k < ec->accum; k++) fed[i] += grad_of(rank, s, k, i, ec->lowrank);
            sent[i] += (double)g[i] * denom;
            g[i] = 0;
        }
    }
    TH_RANK_CHECK(fails, rank, rc == 0, "%s", tally_last_error());
    /* Over the ranks: what the outputs carried plus every residual left is every gradient fed. */
    const float *res = tally__codec_residual(cd);
    for (size_t i = 0; i < n; i++) fed[i] -= res ? res[i] : 0;
    if (!rc) rc = tally_allreduce(c, fed, fed, n, TALLY_F64, TALLY_SUM);
    for (size_t i = 0; i < n && !rc; i++) {
        double e = fabs(fed[i] - sent[i]) / (10.0 * ec->steps * ec->accum * size);
        if (e > ec->err[rank]) ec->err[rank] = e;
    }
    tally_ddp_free(d);
    tally__codec_free(cd);
    free(g);
    free(fed);
    free(sent);
    tally_comm_free(c);
    return fails || rc;
}

/* Gradients of magnitude <= 10 summed over 40 steps: the bound is on |difference| / (10 x the number of
 * gradients summed). Exact codecs leave float rounding (~1e-7); fp16 and bf16 keep no residual, so their
 * rounding (2^-11, 2^-8 of each value) stays in the difference; int8 keeps each rank's own quantization
 * error and leaves the mean's. */
static double ef_bound(const char *spec) {
    if (!strcmp(spec, "int8")) return 4e-3; /* the mean's own quantization (half a step of 10 / 127) is shared */
    return !strcmp(spec, "fp16") ? 1e-3 : !strcmp(spec, "bf16") ? 8e-3 : 1e-5;
}

static void run_ef(const char *tp, int n, const char *spec, int ef, int accum, int no_overlap) {
    ef_case *ec = th_shared_alloc(sizeof *ec);
    tally__codec_parse(spec, &ec->codec);
    ec->codec.error_feedback = ef;
    ec->accum = accum;
    ec->no_overlap = no_overlap;
    ec->steps = 40;
    th_opts o = {.transport = tp, .wall_s = 60};
    int rc = th_run(n, &o, ef_rank, ec);
    TH_CHECK(rc == 0, "%s n=%d %s: ranks failed", tp, n, spec);
    double worst = 0;
    for (int r = 0; r < n; r++) worst = ec->err[r] > worst ? ec->err[r] : worst;
    double bound = ef_bound(spec);
    TH_CHECK(worst <= bound,
             "%s n=%d %s accum %d: sent + residual differs from the gradients fed by %g of the "
             "scale",
             tp, n, spec, accum, worst);
    th_shared_free(ec, sizeof *ec);
}

/* A rank-1 gradient on every rank: PowerSGD rank 1 (and 2) sends it exactly, from the first step. */
static void run_lowrank(int n, const char *spec) {
    ef_case *ec = th_shared_alloc(sizeof *ec);
    tally__codec_parse(spec, &ec->codec);
    ec->codec.error_feedback = 1;
    ec->accum = 1;
    ec->steps = 2;
    ec->lowrank = 1;
    th_opts o = {.transport = "shm", .wall_s = 60};
    TH_CHECK(th_run(n, &o, ef_rank, ec) == 0, "lowrank %s n=%d: ranks failed", spec, n);
    for (int r = 0; r < n; r++)
        TH_CHECK(ec->mean_err[r] < 1e-4, "%s n=%d rank %d: a rank-1 mean gradient comes back with error %g", spec, n, r,
                 ec->mean_err[r]);
    th_shared_free(ec, sizeof *ec);
}

/* ---- DGC against a reference written here: momentum correction, masking, warm-up, local clipping ---- */

#define DGC_RANKS 2
#define DGC_STEPS 6
typedef struct dgc_case {
    double clip;
    long warmup;
    float out[DGC_RANKS][DGC_STEPS][160];
    int rc[DGC_RANKS];
} dgc_case;

static float dgc_grad(int rank, int step, size_t i) {
    return grad_of(rank, step, 0, i, 0) * (i % 17 == 3 ? 40.0f : 1.0f); /* a few large ones */
}

static int dgc_rank(int rank, int size, void *arg) {
    dgc_case *dc = arg;
    tally_comm *c;
    if (tally_comm_init(&c)) return fprintf(stderr, "rank %d: %s\n", rank, tally_last_error()), 1;
    tally__codec_cfg cfg = {.error_feedback = 1};
    tally__codec_parse("dgc:0.05", &cfg);
    cfg.momentum = 0.9;
    cfg.clip = dc->clip;
    cfg.warmup_steps = dc->warmup;
    tally__codec *cd;
    size_t n = g_model.nparams, b0 = 0;
    float g[160];
    int rc = tally__codec_create(&cfg, c, &g_model, 1, &cd);
    if (!rc) rc = tally__codec_set_buckets(cd, 1, &b0, &n);
    for (int s = 0; s < DGC_STEPS && !rc; s++) {
        tally__codec_step_begin(cd);
        for (size_t i = 0; i < n; i++) g[i] = dgc_grad(rank, s, i) * (float)size; /* a sum, divided by denom */
        rc = tally__codec_reduce(cd, c, 0, g, n, (float)size * size);
        tally__codec_step_end(cd, s != 3); /* step 3 skipped by every rank: no trace of it stays */
        memcpy(dc->out[rank][s], g, n * sizeof(float));
    }
    dc->rc[rank] = rc;
    tally__codec_free(cd);
    tally_comm_free(c);
    return rc != 0;
}

/* The reference: per rank u = 0.9 u + g (clipped to clip x sqrt(1 / N) over the whole bucket), v += u, the
 * k largest |v| (k = ceil(density x n), ties to the lower index) summed over the ranks and divided by N,
 * u and v zeroed where sent; a skipped step leaves u and v as they were. */
static void dgc_reference(const dgc_case *dc, int s_end, float want[DGC_STEPS][160]) {
    size_t n = g_model.nparams;
    static float u[DGC_RANKS][160], v[DGC_RANKS][160];
    memset(u, 0, sizeof u);
    memset(v, 0, sizeof v);
    long taken = 0;
    for (int s = 0; s < s_end; s++) {
        double d = dc->warmup > 0 && taken < dc->warmup
                       ? TALLY__DGC_WARMUP_DENSITY * pow(0.05 / TALLY__DGC_WARMUP_DENSITY, (double)taken / dc->warmup)
                       : 0.05;
        size_t k = (size_t)ceil(d * (double)n);
        float nu[DGC_RANKS][160], nv[DGC_RANKS][160];
        memset(want[s], 0, sizeof want[s]);
        for (int r = 0; r < DGC_RANKS; r++) {
            float scale = 1.0f;
            if (dc->clip > 0) {
                double sq = 0;
                for (size_t i = 0; i < n; i++) sq += (double)dgc_grad(r, s, i) * dgc_grad(r, s, i);
                double bound = dc->clip * sqrt(1.0 / DGC_RANKS);
                if (sqrt(sq) > bound) scale = (float)(bound / sqrt(sq));
            }
            for (size_t i = 0; i < n; i++) {
                nu[r][i] = 0.9f * u[r][i] + dgc_grad(r, s, i) * scale;
                nv[r][i] = v[r][i] + nu[r][i];
            }
            int taken_here[160] = {0};
            for (size_t j = 0; j < k; j++) { /* the j-th largest |v|, ties to the lower index */
                size_t best = n;
                for (size_t i = 0; i < n; i++)
                    if (!taken_here[i] && (best == n || fabsf(nv[r][i]) > fabsf(nv[r][best]))) best = i;
                taken_here[best] = 1;
                want[s][best] += nv[r][best];
            }
            for (size_t i = 0; i < n; i++)
                if (taken_here[i]) nv[r][i] = nu[r][i] = 0;
        }
        for (size_t i = 0; i < n; i++) want[s][i] /= DGC_RANKS;
        if (s == 3) continue; /* skipped */
        memcpy(u, nu, sizeof u);
        memcpy(v, nv, sizeof v);
        taken++;
    }
}

static void test_dgc(double clip, long warmup) {
    dgc_case *dc = th_shared_alloc(sizeof *dc);
    dc->clip = clip;
    dc->warmup = warmup;
    th_opts o = {.transport = "shm", .wall_s = 60};
    TH_CHECK(th_run(DGC_RANKS, &o, dgc_rank, dc) == 0, "dgc clip %g warmup %ld: ranks failed", clip, warmup);
    static float want[DGC_STEPS][160];
    dgc_reference(dc, DGC_STEPS, want);
    for (int r = 0; r < DGC_RANKS; r++)
        for (int s = 0; s < DGC_STEPS; s++) {
            double worst = 0;
            for (size_t i = 0; i < g_model.nparams; i++)
                worst = fmax(worst, fabs(dc->out[r][s][i] - want[s][i]) / (1 + fabs(want[s][i])));
            TH_CHECK(worst < 1e-5, "dgc clip %g warmup %ld rank %d step %d: %g from the reference", clip, warmup, r, s,
                     worst);
        }
    th_shared_free(dc, sizeof *dc);
}

static void test_parse(void) {
    tally__codec_cfg c = {.error_feedback = 1};
    const char *bad[] = {"topk:0", "topk:1.5", "topk:", "topk:x", "powersgd:0", "powersgd:-2", "zip", "", "fp32"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        TH_CHECK(tally__codec_parse(bad[i], &c) == TALLY_E_INVALID && strstr(tally_last_error(), "--compress"),
                 "'%s' accepted", bad[i]);
    char buf[40];
    TH_CHECK(!tally__codec_parse("topk:0.01", &c) && c.kind == TALLY__CODEC_TOPK && c.ratio == 0.01, "topk:0.01");
    tally__codec_spec(&c, buf, sizeof buf);
    TH_CHECK(!strcmp(buf, "topk:0.01"), "spec %s", buf);
    TH_CHECK(!tally__codec_parse("dgc:0.001", &c) && c.kind == TALLY__CODEC_DGC && c.ratio == 0.001, "dgc:0.001");
    tally__codec_spec(&c, buf, sizeof buf);
    TH_CHECK(!strcmp(buf, "dgc:0.001"), "spec %s", buf);
    TH_CHECK(tally__codec_parse("dgc:0", &c) == TALLY_E_INVALID, "dgc:0 accepted");
    TH_CHECK(!tally__codec_parse("powersgd:4", &c) && c.rank == 4, "powersgd:4");
    TH_CHECK(tally__codec_check(&c, 1, 0) == TALLY_E_INVALID && strstr(tally_last_error(), "--zero 0 only"),
             "powersgd with zero 1: %s", tally_last_error());
    tally__codec_parse("fp16", &c);
    TH_CHECK(!tally__codec_check(&c, 2, 0), "fp16 with zero 2 refused");
    c.error_feedback = 0;
    TH_CHECK(tally__codec_check(&c, 0, 0) == TALLY_E_INVALID, "--no-error-feedback with fp16 accepted");
}

/* fp16's scale: every rank gets the same power of two, from the largest magnitude of any rank, with
 * the sum of N ranks below 2^15; none for bf16 or an all-zero bucket; never below 1; 2^40 at most. */
typedef struct scale_case {
    float got[8][6];
    int rc[8];
} scale_case;

static int scale_rank(int rank, int size, void *arg) {
    scale_case *sc = arg;
    tally_comm *c;
    if (tally_comm_init(&c)) return fprintf(stderr, "rank %d: %s\n", rank, tally_last_error()), 1;
    /* Rank r holds a largest magnitude of m * (r + 1) (negative on odd ranks): the last rank's counts. */
    const float ms[6] = {1e-6f, 3.0f, 0.0f, 1e5f, 1e-38f, 1e-6f};
    for (int k = 0; k < 6 && !sc->rc[rank]; k++) {
        float x[3] = {0, ms[k] * (float)(rank + 1) * (rank & 1 ? -1.0f : 1.0f), ms[k] / 4};
        float before = x[1];
        sc->rc[rank] = tally__codec_half_scale(c, x, 3, k == 5 ? TALLY_BF16 : TALLY_F16, &sc->got[rank][k]);
        if (!sc->rc[rank] && x[1] != before * sc->got[rank][k]) sc->rc[rank] = -999; /* scaled in place */
    }
    tally_comm_free(c);
    return sc->rc[rank] != 0;
}

static void test_half_scale(int n) {
    scale_case *sc = th_shared_alloc(sizeof *sc);
    th_opts o = {.transport = "shm", .wall_s = 60};
    TH_CHECK(th_run(n, &o, scale_rank, sc) == 0, "half scale n=%d: ranks failed", n);
    for (int k = 0; k < 6; k++) {
        double m = (double)(float[]){1e-6f, 3.0f, 0.0f, 1e5f, 1e-38f, 1e-6f}[k] * n, want = 1;
        if (k != 5 && m > 0) {
            while (want * 2 * m * n <= 32768 && want < 0x1p40) want *= 2;
        }
        for (int r = 0; r < n; r++)
            TH_CHECK(sc->got[r][k] == (float)want, "half scale n=%d case %d rank %d: %g, want %g", n, k, r,
                     (double)sc->got[r][k], want);
    }
    th_shared_free(sc, sizeof *sc);
}

int main(void) {
    test_parse();
    test_casts();
    test_topk_select();
    test_orthonormalize();
    test_half_scale(2);
    test_half_scale(3);
    make_model();
    const char *specs[] = {"topk:0.1", "topk:0.01", "powersgd:1", "powersgd:2", "int8", "fp16", "bf16", "none"};
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        int ef = specs[s][0] == 't' || specs[s][0] == 'p' || specs[s][0] == 'i'; /* the others refuse no-ef */
        run_ef("shm", 2, specs[s], ef, 1, 0);
        run_ef("shm", 3, specs[s], ef, 2, 1);
        if (!th_light()) run_ef("tcp", 3, specs[s], ef, 1, 0);
    }
    run_ef("shm", 1, "topk:0.05", 1, 2, 0);
    test_dgc(0, 0);
    test_dgc(0, 4);
    test_dgc(5.0, 0);
    run_lowrank(2, "powersgd:1");
    run_lowrank(3, "powersgd:2");
    return th_verdict("test_codec");
}
