/* standardize.c - images to zero mean and unit variance per channel, by the training set's own
 * statistics (what torchvision's Normalize does with a data set's mean and std). */
#include <tally/data.h>

#include <math.h>
#include <stdlib.h>

#include "../core/err.h"

/* Mean and standard deviation of channel c over every sample of d: two passes summed in double, so that
 * tens of millions of pixels, or values far from zero, lose nothing to rounding or cancellation. */
static void channel_stats(const tally_dataset *d, int c, double *mean, double *sd) {
    size_t plane = (size_t)d->height * d->width;
    double s = 0, ss = 0;
    for (size_t i = 0; i < d->n; i++) {
        const float *p = d->x + i * (size_t)d->dim + (size_t)c * plane;
        for (size_t j = 0; j < plane; j++) s += p[j];
    }
    double cnt = (double)d->n * (double)plane;
    *mean = s / cnt;
    for (size_t i = 0; i < d->n; i++) {
        const float *p = d->x + i * (size_t)d->dim + (size_t)c * plane;
        for (size_t j = 0; j < plane; j++) ss += (p[j] - *mean) * (p[j] - *mean);
    }
    *sd = sqrt(ss / cnt);
}

static void channel_apply(tally_dataset *d, int c, float mean, float inv_sd) {
    size_t plane = (size_t)d->height * d->width;
    for (size_t i = 0; i < d->n; i++) {
        float *p = d->x + i * (size_t)d->dim + (size_t)c * plane;
        for (size_t j = 0; j < plane; j++) p[j] = (p[j] - mean) * inv_sd;
    }
}

static int is_image_set(const tally_dataset *d) {
    return d->channels > 0 && d->height > 0 && d->width > 0 &&
           (size_t)d->channels * d->height * d->width == (size_t)d->dim && d->x;
}

static int check_sets(const tally_dataset *train, const tally_dataset *test) {
    if (!train) return tally__seterr(TALLY_E_INVALID, "tally_dataset_standardize: train is NULL");
    if (!is_image_set(train) || train->n == 0)
        return tally__seterr(TALLY_E_INVALID,
                             "tally_dataset_standardize: the training set holds no images (%zu samples, %d channels "
                             "of %dx%d); only image sets are standardized",
                             train->n, train->channels, train->height, train->width);
    if (test && test->n &&
        (!is_image_set(test) || test->channels != train->channels || test->height != train->height ||
         test->width != train->width))
        return tally__seterr(TALLY_E_INVALID,
                             "tally_dataset_standardize: the test set's images (%dx%dx%d) differ from the training "
                             "set's (%dx%dx%d)",
                             test->channels, test->height, test->width, train->channels, train->height, train->width);
    return 0;
}

TALLY_API int tally_dataset_standardize(tally_dataset *train, tally_dataset *test, float *mean, float *sd) {
    tally__clearerr();
    int rc = check_sets(train, test);
    if (rc) return rc;
    double *m = malloc(2 * (size_t)train->channels * sizeof *m);
    if (!m) return tally__seterr(TALLY_E_NOMEM, "tally_dataset_standardize: out of memory");
    double *s = m + train->channels;
    for (int c = 0; c < train->channels; c++) {
        channel_stats(train, c, &m[c], &s[c]);
        if (!(s[c] > 0) || !isfinite(s[c])) {
            rc = tally__seterr(TALLY_E_INVALID,
                               "tally_dataset_standardize: channel %d of the training set has no spread (every "
                               "pixel %g) or a value that is not finite; nothing was changed",
                               c, m[c]);
            break;
        }
    }
    /* every channel checked before any is changed: a refusal leaves both sets as they were */
    for (int c = 0; !rc && c < train->channels; c++) {
        float inv = (float)(1.0 / s[c]);
        channel_apply(train, c, (float)m[c], inv);
        if (test && test->n) channel_apply(test, c, (float)m[c], inv);
        if (mean) mean[c] = (float)m[c];
        if (sd) sd[c] = (float)s[c];
    }
    free(m);
    return rc;
}
