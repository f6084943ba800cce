/* layers_conv.c - 2-D convolution (NCHW) as im2col + sgemm over a chunk of whole images at a time,
 * and its backward pass: bias and weight gradients accumulate, the input gradient comes by col2im. */
#include <cblas.h>
#include <string.h>
#include <tally/layers.h>

#include "simd.h"

/* Scratch budget in floats (16 MiB): a whole LeNet batch of 64 takes about 1.6M floats and runs
 * as one sgemm; chunking showed no gain at that size, so the cap only bounds memory for big layers,
 * where a few images already make the sgemm wide. */
#define CONV_CHUNK_FLOATS ((size_t)1 << 22)

/* Scratch layout for a chunk of nb images, N = nb*OH*OW columns:
 *   col[C*R*R][N]       patch matrix, column j*OH*OW + p holding image j's patch for output pixel p;
 *   out[K][N]           the sgemm result (forward) or dy regrouped the same way (backward);
 *   pad[nb][C][Hp][Wp]  the images with their zero border (only when pad > 0).
 * Putting every image of the chunk side by side makes the sgemm one wide product instead of one
 * narrow product per image; the price is one block copy per (image, channel) to reach NCHW.
 * Padding the images once up front leaves im2col and col2im plain row copies with no bounds tests. */
typedef struct geom {
    int OH, OW, P, CRR, Hp, Wp;
} geom;

int tally_conv2d_out_h(const tally_conv2d_shape *s) { return (s->H + 2 * s->pad - s->R) / s->stride + 1; }
int tally_conv2d_out_w(const tally_conv2d_shape *s) { return (s->W + 2 * s->pad - s->R) / s->stride + 1; }

static geom geom_of(const tally_conv2d_shape *s) {
    geom g = {tally_conv2d_out_h(s), tally_conv2d_out_w(s), 0,
              s->C * s->R * s->R,    s->H + 2 * s->pad,     s->W + 2 * s->pad};
    g.P = g.OH * g.OW;
    return g;
}

static size_t floats_per_image(const tally_conv2d_shape *s, geom g) {
    size_t padded = s->pad > 0 ? (size_t)s->C * g.Hp * g.Wp : 0;
    return (size_t)(g.CRR + s->K) * g.P + padded;
}

/* Images per sgemm (at least one, however large). Never more for a smaller batch, so scratch sized
 * for B serves any batch <= B. */
static int chunk_images(const tally_conv2d_shape *s, int B) {
    size_t per_image = floats_per_image(s, geom_of(s));
    size_t cap = per_image ? CONV_CHUNK_FLOATS / per_image : (size_t)B;
    if (cap < 1) cap = 1;
    return (size_t)B < cap ? B : (int)cap;
}

size_t tally_conv2d_scratch_floats(const tally_conv2d_shape *s, int B) {
    return (size_t)chunk_images(s, B) * floats_per_image(s, geom_of(s));
}

/* Explicit 4-lane vectors: at the build's -O2 gcc leaves these short row loops scalar, or turns
 * them into a libc call per row, which costs more than the row itself. */
static inline void copy_row(float *d, const float *s, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) store4(d + i, load4(s + i));
    if (i < n && n >= 4)
        store4(d + n - 4, load4(s + n - 4)); /* overlapping last vector: rewrites equal values */
    else
        for (; i < n; i++) d[i] = s[i];
}

static inline void add_row(float *d, const float *s, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) store4(d + i, load4(d + i) + load4(s + i));
    for (; i < n; i++) d[i] += s[i];
}

/* x[nb][C][H][W] -> xp[nb][C][Hp][Wp] inside a zero border. */
static void pad_images(float *xp, const float *x, const tally_conv2d_shape *s, geom g, int nb) {
    memset(xp, 0, (size_t)nb * s->C * g.Hp * g.Wp * sizeof *xp);
    for (size_t pl = 0; pl < (size_t)nb * s->C; pl++)
        for (int h = 0; h < s->H; h++)
            copy_row(xp + (pl * g.Hp + h + s->pad) * g.Wp + s->pad, x + (pl * s->H + h) * s->W, s->W);
}

/* The inverse of pad_images: the inside of each padded plane, gradients on the border dropped. */
static void unpad_images(float *x, const float *xp, const tally_conv2d_shape *s, geom g, int nb) {
    for (size_t pl = 0; pl < (size_t)nb * s->C; pl++)
        for (int h = 0; h < s->H; h++)
            copy_row(x + (pl * s->H + h) * s->W, xp + (pl * g.Hp + h + s->pad) * g.Wp + s->pad, s->W);
}

/* One patch-matrix row (channel c, kernel offset kh, kw) for nb padded images. */
static void im2col_row(float *dst, const float *xp, const tally_conv2d_shape *s, geom g, int nb, int c, int kh,
                       int kw) {
    int st = s->stride;
    for (int j = 0; j < nb; j++) {
        const float *src = xp + ((size_t)j * s->C + c) * g.Hp * g.Wp + (size_t)kh * g.Wp + kw;
        for (int oh = 0; oh < g.OH; oh++, dst += g.OW, src += (size_t)st * g.Wp) {
            if (st == 1)
                copy_row(dst, src, g.OW);
            else
                for (int ow = 0; ow < g.OW; ow++) dst[ow] = src[ow * st];
        }
    }
}

static void im2col(float *col, const float *xp, const tally_conv2d_shape *s, geom g, int nb) {
    size_t N = (size_t)nb * g.P;
    for (int c = 0; c < s->C; c++)
        for (int kh = 0; kh < s->R; kh++)
            for (int kw = 0; kw < s->R; kw++)
                im2col_row(col + (((size_t)c * s->R + kh) * s->R + kw) * N, xp, s, g, nb, c, kh, kw);
}

/* The adjoint of im2col_row: adds one patch-matrix row back onto the padded images. */
static void col2im_row(float *dxp, const float *src, const tally_conv2d_shape *s, geom g, int nb, int c, int kh,
                       int kw) {
    int st = s->stride;
    for (int j = 0; j < nb; j++) {
        float *dst = dxp + ((size_t)j * s->C + c) * g.Hp * g.Wp + (size_t)kh * g.Wp + kw;
        for (int oh = 0; oh < g.OH; oh++, src += g.OW, dst += (size_t)st * g.Wp) {
            if (st == 1)
                add_row(dst, src, g.OW);
            else
                for (int ow = 0; ow < g.OW; ow++) dst[ow * st] += src[ow];
        }
    }
}

static void col2im(float *dxp, const float *col, const tally_conv2d_shape *s, geom g, int nb) {
    size_t N = (size_t)nb * g.P;
    memset(dxp, 0, (size_t)nb * s->C * g.Hp * g.Wp * sizeof *dxp);
    for (int c = 0; c < s->C; c++)
        for (int kh = 0; kh < s->R; kh++)
            for (int kw = 0; kw < s->R; kw++)
                col2im_row(dxp, col + (((size_t)c * s->R + kh) * s->R + kw) * N, s, g, nb, c, kh, kw);
}

/* out[K][nb*P] -> y[nb][K][P], adding the bias on the way. */
static void scatter_bias(float *y, const float *out, const float *b, int K, geom g, int nb) {
    size_t N = (size_t)nb * g.P;
    for (int j = 0; j < nb; j++)
        for (int k = 0; k < K; k++) {
            float *dst = y + ((size_t)j * K + k) * g.P;
            const float *src = out + k * N + (size_t)j * g.P;
            float bk = b[k];
            int p = 0;
            for (; p + 4 <= g.P; p += 4) store4(dst + p, load4(src + p) + bk);
            for (; p < g.P; p++) dst[p] = src[p] + bk;
        }
}

/* Sum of n floats in four interleaved partial sums. */
static float sum_row(const float *s, int n) {
    v4f acc = {0};
    int i = 0;
    for (; i + 4 <= n; i += 4) acc += load4(s + i);
    float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (; i < n; i++) sum += s[i];
    return sum;
}

/* dy[nb][K][P] -> out[K][nb*P], adding each channel's sum into db on the way (db NULL: not). */
static void gather_bias_grad(float *out, float *db, const float *dy, int K, geom g, int nb) {
    size_t N = (size_t)nb * g.P;
    for (int j = 0; j < nb; j++)
        for (int k = 0; k < K; k++) {
            const float *src = dy + ((size_t)j * K + k) * g.P;
            copy_row(out + k * N + (size_t)j * g.P, src, g.P);
            if (db) db[k] += sum_row(src, g.P);
        }
}

/* The chunk's images ready for im2col: padded into scratch, or as they are when pad is 0. */
static const float *padded_input(float *pad_buf, const float *x, const tally_conv2d_shape *s, geom g, int nb) {
    if (s->pad == 0) return x;
    pad_images(pad_buf, x, s, g, nb);
    return pad_buf;
}

/* How one chunk of nb images lays out scratch: patches, the gemm's output, the padded images; the
 * patches are filled from the chunk's input. */
typedef struct chunk_bufs {
    float *col, *out, *pad_buf;
    int N; /* columns: nb images x output pixels */
} chunk_bufs;

static chunk_bufs chunk_layout(float *scratch, const tally_conv2d_shape *s, geom g, int nb) {
    chunk_bufs c = {.N = nb * g.P};
    c.col = scratch;
    c.out = c.col + (size_t)g.CRR * c.N;
    c.pad_buf = c.out + (size_t)s->K * c.N;
    return c;
}

static chunk_bufs chunk_patches(float *scratch, const float *x, const tally_conv2d_shape *s, geom g, int nb) {
    chunk_bufs c = chunk_layout(scratch, s, g, nb);
    im2col(c.col, padded_input(c.pad_buf, x, s, g, nb), s, g, nb);
    return c;
}

void tally_conv2d_forward(float *y, const float *x, const float *w, const float *b, const tally_conv2d_shape *s, int B,
                          float *scratch) {
    geom g = geom_of(s);
    int chunk = chunk_images(s, B);
    size_t in_img = (size_t)s->C * s->H * s->W, out_img = (size_t)s->K * g.P;
    for (int b0 = 0; b0 < B; b0 += chunk) {
        int nb = B - b0 < chunk ? B - b0 : chunk;
        chunk_bufs c = chunk_patches(scratch, x + b0 * in_img, s, g, nb);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->K, c.N, g.CRR, 1.0f, w, g.CRR, c.col, c.N, 0.0f,
                    c.out, c.N);
        scatter_bias(y + b0 * out_img, c.out, b, s->K, g, nb);
    }
}

/* dx for one chunk from the patch gradients in col; with no padding col2im adds onto dx itself. */
static void input_grad(float *dx, float *col, float *pad_buf, const float *w, const float *out,
                       const tally_conv2d_shape *s, geom g, int nb) {
    int N = nb * g.P;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g.CRR, N, s->K, 1.0f, w, g.CRR, out, N, 0.0f, col, N);
    if (s->pad == 0) {
        col2im(dx, col, s, g, nb);
        return;
    }
    col2im(pad_buf, col, s, g, nb);
    unpad_images(dx, pad_buf, s, g, nb);
}

void tally_conv2d_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                           const tally_conv2d_shape *s, int B, float *scratch) {
    geom g = geom_of(s);
    int chunk = chunk_images(s, B);
    size_t in_img = (size_t)s->C * s->H * s->W, out_img = (size_t)s->K * g.P;
    for (int b0 = 0; b0 < B; b0 += chunk) {
        int nb = B - b0 < chunk ? B - b0 : chunk;
        /* Scratch may have served another layer since forward, so the patches are rebuilt (only dw
         * reads them). */
        chunk_bufs c = dw ? chunk_patches(scratch, x + b0 * in_img, s, g, nb) : chunk_layout(scratch, s, g, nb);
        gather_bias_grad(c.out, dw ? db : NULL, dy + b0 * out_img, s->K, g, nb);
        if (dw)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->K, g.CRR, c.N, 1.0f, c.out, c.N, c.col, c.N, 1.0f,
                        dw, g.CRR);
        /* The patches are spent once dw has them, so their buffer takes the patch gradients. */
        if (dx) input_grad(dx + b0 * in_img, c.col, c.pad_buf, w, c.out, s, g, nb);
    }
}
