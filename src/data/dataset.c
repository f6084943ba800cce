/* dataset.c - the in-memory data sets: Fashion-MNIST from IDX files, the synthetic stand-in for it,
 * and the linear-regression example; all deterministic in their seed on every rank. */
#include <tally/data.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/err.h"
#include "../core/alloc.h"
#include "../core/rng.h"

#define IMG_SIDE      28
#define IMG_DIM       (IMG_SIDE * IMG_SIDE)
#define MNIST_CLASSES 10

/* Second seed words for each stream, far from the small epoch numbers the sampler uses. */
#define STREAM_PROTO 0x53594e50524f544full /* "SYNPROTO" */
#define STREAM_TRAIN 0x53594e545241494eull /* "SYNTRAIN" */
#define STREAM_TEST  0x53594e5445535400ull /* "SYNTEST" */
#define STREAM_LIN_W 0x4c494e5745494748ull /* "LINWEIGH" */
#define STREAM_LIN_X 0x4c494e44415441ull   /* "LINDATA" */

static const char MNIST_HINT[] =
    "Debian's dataset-fashion-mnist package provides it (apt install dataset-fashion-mnist puts it "
    "in " TALLY_FASHION_MNIST_DIR "), or train on generated data with --data synthetic";

TALLY_API void tally_dataset_free(tally_dataset *d) {
    if (!d) return;
    free(d->x);
    free(d->y);
    free(d->t);
    memset(d, 0, sizeof *d);
}

/* n elements of `size`, never NULL for n == 0 and never overflowing; large arrays on huge pages, as
 * batches are gathered from random rows. */
static void *alloc_n(size_t n, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) return NULL;
    return tally__alloc_big(bytes);
}

/* ---- Fashion-MNIST ---- */

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 || errno != ENOENT; /* unreadable still counts: let the reader say why */
}

/* Picks dir/name.gz, else dir/name, into path; TALLY_E_SYSTEM naming both when neither is there. */
static int mnist_path(const char *dir, const char *name, char *path, size_t cap) {
    int n = snprintf(path, cap, "%s/%s.gz", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return tally__seterr(TALLY_E_INVALID, "%s: directory name too long for %s", dir, name);
    if (exists(path)) return 0;
    path[n - 3] = '\0';
    if (exists(path)) return 0;
    return tally__seterr(TALLY_E_SYSTEM, "%s: file not found (nor %s.gz); %s", path, path, MNIST_HINT);
}

/* Adds to the reader's message where a good copy comes from. */
static int mnist_reason(int rc) {
    if (rc == 0 || rc == TALLY_E_NOMEM) return rc;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", tally_last_error());
    if (rc == TALLY_E_SYSTEM) return tally__seterr(rc, "%s; %s", msg, MNIST_HINT);
    return tally__seterr(rc, "%s (reinstall Debian's dataset-fashion-mnist, or use --data synthetic)", msg);
}

static int mnist_read(const char *path, tally_idx *idx) { return mnist_reason(tally_idx_read(path, idx)); }

static int check_images(const char *path, const tally_idx *im) {
    if (im->type != TALLY_IDX_U8 || im->ndim != 3)
        return tally__seterr(TALLY_E_INVALID,
                             "%s: expected u8 images [n, 28, 28] (type 0x08, 3 dimensions), found type 0x%02x "
                             "with %d dimensions; is this an images file?",
                             path, (unsigned)im->type, im->ndim);
    if (im->dims[1] != IMG_SIDE || im->dims[2] != IMG_SIDE)
        return tally__seterr(TALLY_E_INVALID, "%s: wrong image size %ux%u, Fashion-MNIST images are 28x28", path,
                             im->dims[1], im->dims[2]);
    return 0;
}

static int check_labels_header(const char *path, const tally_idx *lb, size_t n_images, const char *images) {
    if (lb->type != TALLY_IDX_U8 || lb->ndim != 1)
        return tally__seterr(TALLY_E_INVALID,
                             "%s: expected u8 labels [n] (type 0x08, 1 dimension), found type 0x%02x with %d "
                             "dimensions; is this a labels file?",
                             path, (unsigned)lb->type, lb->ndim);
    if (lb->count != n_images)
        return tally__seterr(TALLY_E_INVALID, "%s: count mismatch: %zu labels but %s holds %zu images", path, lb->count,
                             images, n_images);
    return 0;
}

static int check_labels(const char *path, const tally_idx *lb, size_t n_images, const char *images) {
    int rc = check_labels_header(path, lb, n_images, images);
    if (rc) return rc;
    const uint8_t *l = lb->data;
    for (size_t i = 0; i < lb->count; i++)
        if (l[i] >= MNIST_CLASSES)
            return tally__seterr(TALLY_E_INVALID, "%s: label %u of sample %zu is out of range (must be < %d)", path,
                                 l[i], i, MNIST_CLASSES);
    return 0;
}

static void set_image_geometry(tally_dataset *d, size_t n) {
    d->n = n;
    d->dim = IMG_DIM;
    d->channels = 1;
    d->height = d->width = IMG_SIDE;
    d->classes = MNIST_CLASSES;
}

/* Fills d from checked images and labels: pixels to [0, 1], labels to int32. */
static int mnist_fill(const tally_idx *im, const tally_idx *lb, tally_dataset *d) {
    size_t n = lb->count;
    d->x = alloc_n(im->count, sizeof *d->x);
    d->y = alloc_n(n, sizeof *d->y);
    if (!d->x || !d->y) return tally__seterr(TALLY_E_NOMEM, "out of memory for %zu Fashion-MNIST images", n);
    float lut[256]; /* one division per grey level instead of per pixel */
    for (int i = 0; i < 256; i++) lut[i] = (float)i / 255.0f;
    const uint8_t *px = im->data, *l = lb->data;
    for (size_t i = 0; i < im->count; i++) d->x[i] = lut[px[i]];
    for (size_t i = 0; i < n; i++) d->y[i] = l[i];
    set_image_geometry(d, n);
    return 0;
}

static int mnist_headers(const char *ipath, const char *lpath) {
    tally_idx im, lb;
    int rc = tally_idx_read_header(ipath, &im);
    if (rc) return mnist_reason(rc);
    if ((rc = check_images(ipath, &im))) return rc;
    if ((rc = tally_idx_read_header(lpath, &lb))) return mnist_reason(rc);
    return check_labels_header(lpath, &lb, im.dims[0], ipath);
}

/* Loads one split ("train" or "t10k") into d. */
static int mnist_split(const char *dir, const char *split, tally_dataset *d) {
    char name[64], ipath[4096], lpath[4096];
    tally_idx im = {0}, lb = {0};
    int rc;
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    if ((rc = mnist_path(dir, name, ipath, sizeof ipath))) return rc;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    if ((rc = mnist_path(dir, name, lpath, sizeof lpath))) return rc;
    /* Both headers first: what the files declare must agree before gigabytes are inflated for it. */
    if ((rc = mnist_headers(ipath, lpath))) return rc;
    if (!(rc = mnist_read(ipath, &im)) && !(rc = check_images(ipath, &im)) && !(rc = mnist_read(lpath, &lb)) &&
        !(rc = check_labels(lpath, &lb, im.dims[0], ipath)))
        rc = mnist_fill(&im, &lb, d);
    tally_idx_free(&im);
    tally_idx_free(&lb);
    return rc;
}

TALLY_API int tally_dataset_load_mnist(const char *dir, tally_dataset *train, tally_dataset *test) {
    tally__clearerr();
    if (!train || !test) return tally__seterr(TALLY_E_INVALID, "tally_dataset_load_mnist: train or test is NULL");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!dir) dir = TALLY_FASHION_MNIST_DIR; /* NULL: where Debian's package puts it */
    int rc = mnist_split(dir, "train", train);
    if (!rc) rc = mnist_split(dir, "t10k", test);
    if (rc) {
        tally_dataset_free(train);
        tally_dataset_free(test);
    }
    return rc;
}

/* ---- synthetic Fashion-MNIST stand-in ---- */

/* Coarse grid upsampled to 28x28: prototypes are smooth blobs rather than pixel noise, as images are. */
#define PROTO_GRID 7

/* Nuisances that keep the task from being trivial: the class's prototype is shifted, rescaled in
 * brightness, overlaid with another class's (mostly fainter) prototype, and noised, so a linear model
 * confuses some classes while an MLP does better; the few where the other prototype is the brighter
 * stay ambiguous, which caps accuracy near 90%. */
#define SYN_SHIFT   2 /* pixels, each way */
#define SYN_GAIN_LO 0.65f
#define SYN_GAIN_HI 1.15f
#define SYN_MIX_HI  0.9f  /* the other prototype's weight is uniform in [0, this) */
#define SYN_NOISE   0.20f /* per-pixel noise sigma */
#define SYN_SHARED  0.5f  /* part of each prototype's grid common to all classes */

static float smoothstep(float e0, float e1, float v) {
    float t = (v - e0) / (e1 - e0);
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    return t * t * (3 - 2 * t);
}

/* Every class shares part of its coarse grid, so classes look alike as Fashion-MNIST's do. */
static void make_grid(tally__rng *r, const float *shared, float *g) {
    for (int i = 0; i < PROTO_GRID * PROTO_GRID; i++)
        g[i] = SYN_SHARED * shared[i] + (1 - SYN_SHARED) * tally__rng_uniform(r);
}

static float bilinear(const float *g, float fy, float fx) {
    int iy = (int)fy, ix = (int)fx;
    float ty = fy - iy, tx = fx - ix;
    const float *a = g + iy * PROTO_GRID + ix, *b = a + PROTO_GRID;
    return (1 - ty) * ((1 - tx) * a[0] + tx * a[1]) + ty * ((1 - tx) * b[0] + tx * b[1]);
}

static void make_prototype(tally__rng *r, const float *shared, float *p) {
    float g[PROTO_GRID * PROTO_GRID];
    make_grid(r, shared, g);
    const float step = (float)(PROTO_GRID - 1) / IMG_SIDE;
    for (int y = 0; y < IMG_SIDE; y++)
        for (int x = 0; x < IMG_SIDE; x++) /* dark background, bright shapes */
            p[y * IMG_SIDE + x] = smoothstep(0.3f, 0.7f, bilinear(g, (y + 0.5f) * step, (x + 0.5f) * step));
}

static float shifted(const float *p, int y, int x) {
    return (y < 0 || y >= IMG_SIDE || x < 0 || x >= IMG_SIDE) ? 0.0f : p[y * IMG_SIDE + x];
}

static float uniform_in(tally__rng *r, float lo, float hi) { return lo + (hi - lo) * tally__rng_uniform(r); }

/* Zero mean, unit variance, bell-shaped: four 16-bit uniforms from one draw summed (Irwin-Hall), as a
 * Box-Muller normal per pixel would make generation several times slower. */
static float pixel_noise(tally__rng *r) {
    uint64_t b = tally__rng_next(r);
    float sum = (float)((b & 0xffff) + (b >> 16 & 0xffff) + (b >> 32 & 0xffff) + (b >> 48));
    return (sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

static void make_sample(tally__rng *r, const float *protos, float *x, int32_t *y) {
    int c = (int)tally__rng_below(r, MNIST_CLASSES);
    int other = (c + 1 + (int)tally__rng_below(r, MNIST_CLASSES - 1)) % MNIST_CLASSES;
    int dy = (int)tally__rng_below(r, 2 * SYN_SHIFT + 1) - SYN_SHIFT;
    int dx = (int)tally__rng_below(r, 2 * SYN_SHIFT + 1) - SYN_SHIFT;
    float gain = uniform_in(r, SYN_GAIN_LO, SYN_GAIN_HI), mix = uniform_in(r, 0, SYN_MIX_HI);
    const float *pc = protos + (size_t)c * IMG_DIM, *po = protos + (size_t)other * IMG_DIM;
    for (int i = 0; i < IMG_SIDE; i++)
        for (int j = 0; j < IMG_SIDE; j++) {
            float v =
                gain * shifted(pc, i - dy, j - dx) + mix * shifted(po, i - dy, j - dx) + SYN_NOISE * pixel_noise(r);
            x[i * IMG_SIDE + j] = v < 0 ? 0 : v > 1 ? 1 : v;
        }
    *y = c;
}

static int synthetic_split(uint64_t seed, uint64_t stream, const float *protos, size_t n, tally_dataset *d) {
    d->x = alloc_n(n, IMG_DIM * sizeof *d->x);
    d->y = alloc_n(n, sizeof *d->y);
    if (!d->x || !d->y) return tally__seterr(TALLY_E_NOMEM, "out of memory for %zu synthetic images", n);
    tally__rng r; /* one stream per split: a split's first k samples do not depend on its size */
    tally__rng_seed(&r, seed, stream);
    for (size_t i = 0; i < n; i++) make_sample(&r, protos, d->x + i * IMG_DIM, d->y + i);
    set_image_geometry(d, n);
    return 0;
}

TALLY_API int tally_dataset_synthetic(uint64_t seed, size_t n_train, size_t n_test, tally_dataset *train,
                                      tally_dataset *test) {
    tally__clearerr();
    if (!train || !test) return tally__seterr(TALLY_E_INVALID, "tally_dataset_synthetic: train or test is NULL");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    float *protos = alloc_n(MNIST_CLASSES, IMG_DIM * sizeof *protos);
    if (!protos) return tally__seterr(TALLY_E_NOMEM, "out of memory for the synthetic prototypes");
    tally__rng r;
    tally__rng_seed(&r, seed, STREAM_PROTO);
    float shared[PROTO_GRID * PROTO_GRID];
    for (int i = 0; i < PROTO_GRID * PROTO_GRID; i++) shared[i] = tally__rng_uniform(&r);
    for (int c = 0; c < MNIST_CLASSES; c++) make_prototype(&r, shared, protos + (size_t)c * IMG_DIM);
    int rc = synthetic_split(seed, STREAM_TRAIN, protos, n_train, train);
    if (!rc) rc = synthetic_split(seed, STREAM_TEST, protos, n_test, test);
    free(protos);
    if (rc) {
        tally_dataset_free(train);
        tally_dataset_free(test);
    }
    return rc;
}

/* ---- linear regression ---- */

static void linear_samples(tally__rng *r, const float *w, int features, float noise, tally_dataset *d) {
    for (size_t i = 0; i < d->n; i++) {
        float *x = d->x + i * (size_t)features;
        double acc = w[features]; /* the bias */
        for (int j = 0; j < features; j++) {
            x[j] = tally__rng_normal(r);
            acc += (double)x[j] * w[j];
        }
        d->t[i] = (float)(acc + noise * tally__rng_normal(r));
    }
}

TALLY_API int tally_dataset_linear(uint64_t seed, size_t n, int features, float noise, float *true_w,
                                   tally_dataset *out) {
    tally__clearerr();
    if (!out) return tally__seterr(TALLY_E_INVALID, "tally_dataset_linear: out is NULL");
    memset(out, 0, sizeof *out);
    if (features <= 0)
        return tally__seterr(TALLY_E_INVALID, "tally_dataset_linear: features must be positive (got %d)", features);
    if (!(noise >= 0 && isfinite(noise)))
        return tally__seterr(TALLY_E_INVALID, "tally_dataset_linear: noise must be finite and >= 0 (got %g)",
                             (double)noise);
    float *w = alloc_n((size_t)features + 1, sizeof *w);
    size_t cells;
    out->x = __builtin_mul_overflow(n, (size_t)features, &cells) ? NULL : alloc_n(cells, sizeof *out->x);
    out->t = alloc_n(n, sizeof *out->t);
    if (!w || !out->x || !out->t) {
        free(w);
        tally_dataset_free(out);
        return tally__seterr(TALLY_E_NOMEM, "out of memory for %zu samples of %d features", n, features);
    }
    tally__rng r;
    tally__rng_seed(&r, seed, STREAM_LIN_W);
    for (int j = 0; j <= features; j++) w[j] = tally__rng_normal(&r);
    out->n = n;
    out->dim = features;
    out->tdim = 1;
    tally__rng_seed(&r, seed, STREAM_LIN_X);
    linear_samples(&r, w, features, noise, out);
    if (true_w) memcpy(true_w, w, ((size_t)features + 1) * sizeof *w);
    free(w);
    return 0;
}
