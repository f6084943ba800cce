/* test_gemm_bf16.c - --precision bf16's pieces: the f32 -> bf16 cast against dtype.c's scalar rounding, the
 * oneDNN products against a double-precision reference on the same bf16 inputs (every transpose, beta 0
 * and 1, sizes 0, 1, odd, large), and the model's bf16 linear layers against its f32 ones. Where the
 * build or the CPU has no bf16, the refusal's message is what is checked. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/numeric/dtype.h"
#include "harness.h"
#include "nn/gemm_bf16.h"
#include "nn/model.h"

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f);
}

static void t_cast(void) {
    enum { N = 1000 };
    static float src[N];
    static uint16_t got[N];
    unsigned seed = 1;
    for (int i = 0; i < N; i++) src[i] = frand(&seed) * powf(2.0f, (float)(i % 60 - 30));
    src[3] = INFINITY, src[4] = -INFINITY, src[5] = NAN, src[6] = 0.0f, src[7] = -0.0f, src[8] = 3.3895314e38f;
    for (size_t n = 0; n <= N; n += n < 40 ? 1 : 241) { /* every tail length past the 16-wide body */
        tally__bf16_cast(got, src, n);
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint16_t want = tally__f32_to_bf16(src[i]);
            if (isnan(src[i]) ? (got[i] & 0x7fff) <= 0x7f80 : got[i] != want) bad++;
        }
        TH_CHECK(!bad, "cast of %zu floats: %d differ from dtype.c's rounding", n, bad);
    }
}

static double bf(uint16_t h) { return (double)tally__bf16_to_f32(h); }

/* C = op(A) op(B) + beta C against doubles over the same bf16 inputs: each product of two bf16 values is
 * exact in f32, so only the order of the f32 sums differs (bound: K ulps of the sum of magnitudes). */
static void t_gemm_case(int ta, int tb, int M, int N, int K, float beta) {
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
    size_t na = (size_t)(ta ? K : M) * lda + 1, nb = (size_t)(tb ? N : K) * ldb + 1, nc = (size_t)M * ldc + 1;
    uint16_t *A = malloc(na * 2), *B = malloc(nb * 2);
    float *C = malloc(nc * 4), *C0 = malloc(nc * 4), *tmp = malloc((na > nb ? na : nb) * 4);
    unsigned seed = (unsigned)(M * 131 + N * 17 + K + ta * 7 + tb * 3);
    for (size_t i = 0; i < na; i++) tmp[i] = frand(&seed);
    tally__bf16_cast(A, tmp, na);
    for (size_t i = 0; i < nb; i++) tmp[i] = frand(&seed);
    tally__bf16_cast(B, tmp, nb);
    for (size_t i = 0; i < nc; i++) C[i] = C0[i] = frand(&seed);
    int rc = tally__gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    TH_CHECK(rc == 0, "gemm %c%c %dx%dx%d beta %g: %s", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, beta,
             tally_last_error());
    double worst = 0;
    int outside = 0;
    for (int i = 0; i < M && !rc; i++)
        for (int j = 0; j < N; j++) {
            double s = beta ? C0[(size_t)i * ldc + j] : 0, mag = fabs(s);
            for (int k = 0; k < K; k++) {
                double p = bf(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                           bf(tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                s += p;
                mag += fabs(p);
            }
            double err = fabs(C[(size_t)i * ldc + j] - s), bound = (K + 2) * 1.2e-7 * mag + 1e-30;
            if (err / bound > worst) worst = err / bound;
            outside += err > bound;
        }
    for (int i = 0; i < M && !rc; i++) /* the padding past N is the caller's, untouched */
        for (int j = N; j < ldc && (size_t)i * ldc + j < nc; j++)
            outside += C[(size_t)i * ldc + j] != C0[(size_t)i * ldc + j];
    TH_CHECK(!outside, "gemm %c%c %dx%dx%d beta %g: %d values off the reference (worst %.2f of the bound)",
             ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, beta, outside, worst);
    free(A), free(B), free(C), free(C0), free(tmp);
}

static void t_gemm(void) {
    static const int shapes[][3] = {{0, 5, 3},   {4, 0, 3},     {1, 1, 1},      {3, 5, 0},
                                    {17, 13, 7}, {33, 65, 129}, {300, 257, 129}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 8; t++)
            t_gemm_case(t & 1, (t >> 1) & 1, shapes[s][0], shapes[s][1], shapes[s][2], (t & 4) ? 1.0f : 0.0f);
}

/* An MLP's forward and backward in bf16 against the same model in f32: close, not equal. */
static void t_model(void) {
    tally__model_cfg cfg = {.kind = TALLY__MODEL_MLP, .in_dim = 37, .outputs = 5, .nhidden = 2, .hidden = {64, 33}};
    enum { B = 9 };
    static tally__model f, h;
    TH_CHECK(tally__model_init(&f, &cfg, B, 3, NULL, 0) == 0 && tally__model_init(&h, &cfg, B, 3, NULL, 0) == 0,
             "model init: %s", tally_last_error());
    TH_CHECK(tally__model_use_bf16(&h) == 0, "bf16 model: %s", tally_last_error());
    static float x[B * 37];
    int32_t y[B];
    unsigned seed = 5;
    for (int i = 0; i < B * 37; i++) x[i] = frand(&seed);
    for (int i = 0; i < B; i++) y[i] = i % 5;
    float lf = 0, lh = 0;
    TH_CHECK(tally__model_forward(&f, x, y, NULL, B, NULL, &lf) == 0 &&
                 tally__model_forward(&h, x, y, NULL, B, NULL, &lh) == 0,
             "forward: %s", tally_last_error());
    memset(f.grads, 0, f.nparams * 4), memset(h.grads, 0, h.nparams * 4);
    TH_CHECK(tally__model_backward(&f, y, NULL, B, NULL) == 0 && tally__model_backward(&h, y, NULL, B, NULL) == 0,
             "backward: %s", tally_last_error());
    double d = 0, n = 0;
    for (size_t i = 0; i < f.nparams; i++) d += pow(f.grads[i] - h.grads[i], 2), n += pow(f.grads[i], 2);
    printf("  mlp: loss f32 %.6f bf16 %.6f; gradients' relative L2 distance %.2e\n", lf, lh, sqrt(d / n));
    TH_CHECK(fabs(lf - lh) <= 1e-2 * fabs(lf), "loss f32 %g, bf16 %g", lf, lh);
    TH_CHECK(sqrt(d / n) < 2e-2 && d > 0, "gradients' relative L2 distance %g (bf16 should be near, not equal)",
             sqrt(d / n));
    tally__model_free(&f);
    tally__model_free(&h);
}

int main(void) {
    t_cast();
    if (tally__bf16_check()) {
        const char *why = tally_last_error();
        printf("  bf16 refused here: %s\n", why);
        TH_CHECK(strstr(why, "--precision bf16") && strstr(why, "--precision fp32"), "the refusal says what to do: %s",
                 why);
        return th_verdict("test_gemm_bf16");
    }
    t_gemm();
    t_model();
    printf("  oneDNN ran %s\n", tally__bf16_impl());
    return th_verdict("test_gemm_bf16");
}
