/* ref_check.c - the layer tests' shared helpers: random arrays from one seeded generator, worst-element
 * comparison against double references, and central finite differences. */
#include "ref_check.h"

#include <math.h>
#include <stdlib.h>

#include "harness.h"

tally__rng rng;

float *falloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) abort();
    return p;
}

double *dalloc(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
    if (!p) abort();
    return p;
}

float uni(float lo, float hi) { return lo + (hi - lo) * tally__rng_uniform(&rng); }

float *frand(size_t n, float lo, float hi) {
    float *p = falloc(n);
    for (size_t i = 0; i < n; i++) p[i] = uni(lo, hi);
    return p;
}

float *ffill(size_t n, float v) {
    float *p = falloc(n);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}

double *widen(const float *f, size_t n) {
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    return d;
}

double *scaled(const double *a, size_t n, double s) {
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = a[i] * s;
    return d;
}

double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void check_close(const char *what, const float *got, const double *want, size_t n, double tol) {
    size_t worst = 0;
    double worst_ratio = 0; /* error over its bound; tol 0 asks for equality */
    for (size_t i = 0; i < n; i++) {
        double err = fabs(got[i] - want[i]), bound = tol * fmax(1.0, fabs(want[i]));
        double ratio = err == 0 ? 0 : err <= bound ? err / bound : isnan(err) ? INFINITY : 1 + err;
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    TH_CHECK(worst_ratio <= 1.0, "%s: [%zu] got %.9g want %.9g (tol %g)", what, worst, n ? got[worst] : 0.0,
             n ? want[worst] : 0.0, tol);
}

double *fd_grad(double *v, size_t n, loss_fn loss, void *ctx) {
    double *grad = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        double save = v[i];
        v[i] = save + EPS_FD;
        double lp = loss(ctx);
        v[i] = save - EPS_FD;
        double lm = loss(ctx);
        v[i] = save;
        grad[i] = (lp - lm) / (2 * EPS_FD);
    }
    return grad;
}

void fd_check(const char *what, const float *got, double *v, size_t n, loss_fn loss, void *ctx) {
    double *g = fd_grad(v, n, loss, ctx);
    check_close(what, got, g, n, TOL_F);
    free(g);
}
