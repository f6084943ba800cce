/* test_standardize.c - tally_dataset_standardize against a reference in long double: per-channel
 * statistics of the training set applied to both sets, every geometry class, and each refusal. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <tally/data.h>

#include "harness.h"

/* An image set of n samples, c channels of h x w, pixels from a fixed pattern with a per-channel offset
 * and scale far from 0 and 1 (so a variance summed as E[x^2] - E[x]^2 in float would lose it). */
static tally_dataset image_set(size_t n, int c, int h, int w, unsigned seed) {
    tally_dataset d = {.n = n, .dim = c * h * w, .channels = c, .height = h, .width = w, .classes = 2};
    d.x = malloc((n ? n : 1) * (size_t)d.dim * sizeof *d.x);
    d.y = calloc(n ? n : 1, sizeof *d.y);
    unsigned s = seed;
    for (size_t i = 0; i < n * (size_t)d.dim; i++) {
        s = s * 1103515245u + 12345u;
        int ch = (int)(i % (size_t)d.dim) / (h * w);
        d.x[i] = 1000.0f * (float)(ch + 1) + (float)(ch + 1) * (float)((s >> 8) % 1000) / 1000.0f;
    }
    return d;
}

static void ref_stats(const tally_dataset *d, int c, double *mean, double *sd) {
    size_t plane = (size_t)d->height * d->width;
    long double s = 0, ss = 0;
    for (size_t i = 0; i < d->n; i++)
        for (size_t j = 0; j < plane; j++) s += d->x[i * (size_t)d->dim + (size_t)c * plane + j];
    long double m = s / ((long double)d->n * plane);
    for (size_t i = 0; i < d->n; i++)
        for (size_t j = 0; j < plane; j++) {
            long double v = d->x[i * (size_t)d->dim + (size_t)c * plane + j] - m;
            ss += v * v;
        }
    *mean = (double)m;
    *sd = (double)sqrtl(ss / ((long double)d->n * plane));
}

/* Standardizes a (train) and b (test) and holds every pixel against (x - mean) / sd from the reference. */
static void check_geometry(size_t ntrain, size_t ntest, int c, int h, int w) {
    tally_dataset a = image_set(ntrain, c, h, w, 1), b = image_set(ntest, c, h, w, 2);
    float *a0 = malloc((ntrain ? ntrain : 1) * (size_t)a.dim * sizeof *a0);
    float *b0 = malloc((ntest ? ntest : 1) * (size_t)b.dim * sizeof *b0);
    memcpy(a0, a.x, ntrain * (size_t)a.dim * sizeof *a0);
    memcpy(b0, b.x, ntest * (size_t)b.dim * sizeof *b0);
    double rm[8], rs[8];
    for (int k = 0; k < c; k++) ref_stats(&a, k, &rm[k], &rs[k]);
    float mean[8], sd[8];
    int rc = tally_dataset_standardize(&a, &b, mean, sd);
    TH_CHECK(rc == 0, "%zu+%zu samples of %dx%dx%d: rc %d: %s", ntrain, ntest, c, h, w, rc, tally_last_error());
    double worst = 0;
    for (int k = 0; rc == 0 && k < c; k++) {
        TH_CHECK(fabs(mean[k] - rm[k]) <= 1e-6 * fabs(rm[k]) && fabs(sd[k] - rs[k]) <= 1e-5 * rs[k],
                 "channel %d: mean %g sd %g, reference %g %g", k, mean[k], sd[k], rm[k], rs[k]);
        size_t plane = (size_t)h * w;
        for (int set = 0; set < 2; set++) {
            const tally_dataset *d = set ? &b : &a;
            const float *orig = set ? b0 : a0;
            for (size_t i = 0; i < d->n; i++)
                for (size_t j = 0; j < plane; j++) {
                    size_t at = i * (size_t)d->dim + (size_t)k * plane + j;
                    worst = fmax(worst, fabs(d->x[at] - (orig[at] - rm[k]) / rs[k]));
                }
        }
    }
    /* the pixels sit near 1000 x (c + 1), so float's own rounding of x - mean is a few 1e-4 of an sd */
    TH_CHECK(worst < 2e-3, "%zu+%zu samples of %dx%dx%d: a pixel %g away from the reference", ntrain, ntest, c, h, w,
             worst);
    free(a0);
    free(b0);
    tally_dataset_free(&a);
    tally_dataset_free(&b);
}

/* Each refusal leaves both sets as they were. */
static void check_refusals(void) {
    tally_dataset a = image_set(4, 2, 3, 3, 1), b = image_set(2, 2, 3, 3, 2);
    size_t bytes = 4 * (size_t)a.dim * sizeof(float);
    float *keep = malloc(bytes), *keep_b = malloc(bytes / 2);
    memcpy(keep_b, b.x, bytes / 2);
    TH_CHECK(tally_dataset_standardize(NULL, &b, NULL, NULL) == TALLY_E_INVALID, "NULL train accepted");
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < 9; i++) a.x[s * a.dim + 9 + i] = 7.0f; /* channel 1 constant */
    memcpy(keep, a.x, bytes);
    int rc = tally_dataset_standardize(&a, &b, NULL, NULL);
    TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), "channel 1") && !memcmp(keep, a.x, bytes) &&
                 !memcmp(keep_b, b.x, bytes / 2),
             "a constant channel: rc %d, %s, train changed: %d, test changed: %d", rc, tally_last_error(),
             memcmp(keep, a.x, bytes) != 0, memcmp(keep_b, b.x, bytes / 2) != 0);
    a.x[3] = NAN;
    memcpy(keep, a.x, bytes);
    rc = tally_dataset_standardize(&a, NULL, NULL, NULL);
    TH_CHECK(rc == TALLY_E_INVALID && !memcmp(keep, a.x, bytes), "a NaN pixel: rc %d, %s", rc, tally_last_error());
    tally_dataset_free(&a);
    a = image_set(4, 2, 3, 3, 1);
    tally_dataset wrong = image_set(2, 2, 3, 4, 2);
    memcpy(keep, a.x, bytes);
    rc = tally_dataset_standardize(&a, &wrong, NULL, NULL);
    TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), "differ") && !memcmp(keep, a.x, bytes),
             "a test set of other geometry: rc %d, %s", rc, tally_last_error());
    tally_dataset empty = image_set(0, 2, 3, 3, 1);
    TH_CHECK(tally_dataset_standardize(&empty, &b, NULL, NULL) == TALLY_E_INVALID, "an empty training set accepted");
    tally_dataset lin;
    TH_CHECK(tally_dataset_linear(3, 16, 4, 0.1f, NULL, &lin) == 0, "linear: %s", tally_last_error());
    rc = tally_dataset_standardize(&lin, NULL, NULL, NULL);
    TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), "no images"), "features without images: rc %d, %s", rc,
             tally_last_error());
    free(keep);
    free(keep_b);
    tally_dataset_free(&a);
    tally_dataset_free(&b);
    tally_dataset_free(&wrong);
    tally_dataset_free(&empty);
    tally_dataset_free(&lin);
}

/* The real set, when installed: Fashion-MNIST's training pixels have torchvision's mean 0.2860 and sd 0.3530. */
static void check_fashion_mnist(void) {
    tally_dataset tr, te;
    if (tally_dataset_load_mnist(NULL, &tr, &te) != 0) {
        printf("note: Fashion-MNIST absent, its statistics not checked\n");
        return;
    }
    float m, s;
    int rc = tally_dataset_standardize(&tr, &te, &m, &s);
    TH_CHECK(rc == 0 && fabsf(m - 0.2860f) < 1e-4f && fabsf(s - 0.3530f) < 1e-4f, "Fashion-MNIST: rc %d, mean %g sd %g",
             rc, m, s);
    tally_dataset_free(&tr);
    tally_dataset_free(&te);
}

int main(void) {
    double t0 = th_now();
    check_geometry(1, 1, 1, 1, 2);   /* one sample of two pixels */
    check_geometry(3, 0, 3, 5, 7);   /* odd sizes, three channels, no test set */
    check_geometry(7, 5, 1, 28, 28); /* Fashion-MNIST's geometry */
    check_geometry(2000, 500, 1, 28, 28);
    check_geometry(33, 9, 4, 3, 1); /* more channels than rows */
    check_refusals();
    tally_dataset one = image_set(1, 1, 1, 1, 1);
    TH_CHECK(tally_dataset_standardize(&one, NULL, NULL, NULL) == TALLY_E_INVALID, "one pixel (sd 0) accepted");
    tally_dataset_free(&one);
    check_fashion_mnist();
    printf("test_standardize: %.2f s\n", th_now() - t0);
    return th_verdict("test_standardize");
}
