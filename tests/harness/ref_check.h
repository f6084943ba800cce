/* ref_check.h - what the layer tests share: seeded random arrays, float results judged against double
 * references, and central finite differences of a double loss. */
#ifndef TALLY_TEST_REF_CHECK_H
#define TALLY_TEST_REF_CHECK_H

#include <stddef.h>

#include "core/rng.h"

/* Tolerances, all as |got - want| <= tol * max(1, |want|):
 * - TOL_F: float fast path against a double reference (forward, analytic backward, and central
 *   differences taken in double on the double reference, which are exact up to ~1e-12 since every
 *   loss here is linear or smooth at the points probed). Float sums of up to ~50k terms of size ~1
 *   stay within ~1e-5 relative; 1e-4 leaves room without hiding an indexing error (those are O(1)).
 * - TOL_FD32: central differences of the float loss the layer returns, eps 1e-2 in float: rounding
 *   a loss of size L (at most ~10 here) costs ~L * 1e-7 / 2e-2 <= 5e-5, the eps^2 truncation less;
 *   1e-3 absolute is a few percent of gradients of size ~1/B (B <= 7 where this runs), enough to
 *   catch a missing 1/B, a wrong sign or a misplaced label. */
#define TOL_F    1e-4
#define TOL_FD32 1e-3
#define EPS_FD   1e-3 /* double central differences */
#define EPS_FD32 1e-2f

extern tally__rng rng; /* every random draw of a test, seeded by it */

float *falloc(size_t n);  /* aborts when out of memory */
double *dalloc(size_t n); /* zeroed */
float uni(float lo, float hi);
float *frand(size_t n, float lo, float hi);
float *ffill(size_t n, float v);
double *widen(const float *f, size_t n);
double *scaled(const double *a, size_t n, double s);
double dot(const double *a, const double *b, size_t n);

/* One check per array: the worst element against its bound (a NaN fails). */
void check_close(const char *what, const float *got, const double *want, size_t n, double tol);

typedef double (*loss_fn)(void *ctx);
/* grad[i] = (L(v + eps e_i) - L(v - eps e_i)) / 2 eps, perturbing v in place (restored). */
double *fd_grad(double *v, size_t n, loss_fn loss, void *ctx);
/* got against fd_grad's, within TOL_F. */
void fd_check(const char *what, const float *got, double *v, size_t n, loss_fn loss, void *ctx);

#endif
