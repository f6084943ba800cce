/* model_bf16.c - --precision bf16: every linear layer's products in bfloat16 with f32 accumulation (AMX or
 * AVX512_BF16 through oneDNN), the parameters, their gradients and every other op staying f32. */
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "gemm_bf16.h"
#include "model.h"

/* A linear op's bf16 copies at batch B, in elements: its input (*x), its weight (*w); returns its output
 * gradient's, which the linears share. 0 for every other op. */
static size_t linear_copies(const tally__op *op, int B, size_t *x, size_t *w) {
    *x = *w = 0;
    if (op->kind != TALLY__OP_LINEAR) return 0;
    size_t rows = (size_t)B * op->rows;
    *x = rows * op->fan_in;
    *w = (size_t)op->fan_out * op->fan_in;
    return rows * op->fan_out;
}

size_t tally__model_bf16_bytes(const tally__model *m, int B) {
    size_t dy = 0, elems = 0, x, w;
    for (int i = 0; i < m->nops; i++) {
        size_t d = linear_copies(&m->op[i], B, &x, &w);
        elems += x + w;
        if (d > dy) dy = d;
    }
    return (elems + dy) * sizeof(uint16_t);
}

int tally__model_use_bf16(tally__model *m) {
    int rc = tally__bf16_check();
    if (rc) return rc;
    size_t dy = 0, x, w;
    for (int i = 0; i < m->nops; i++) {
        size_t d = linear_copies(&m->op[i], m->max_batch, &x, &w);
        if (!x) continue;
        m->bf16_x[i] = malloc(x * sizeof(uint16_t));
        m->bf16_w[i] = malloc(w * sizeof(uint16_t));
        if (!m->bf16_x[i] || !m->bf16_w[i]) goto nomem;
        if (d > dy) dy = d;
    }
    if (dy && !(m->bf16_dy = malloc(dy * sizeof(uint16_t)))) goto nomem;
    m->bf16 = 1;
    m->activation_bytes += tally__model_bf16_bytes(m, m->max_batch);
    return 0;
nomem:
    tally__model_bf16_free(m);
    return tally__seterr(TALLY_E_NOMEM, "model: out of memory for the bf16 copies of the linear layers' inputs");
}

void tally__model_bf16_free(tally__model *m) {
    for (int i = 0; i < m->nops; i++) {
        free(m->bf16_x[i]);
        free(m->bf16_w[i]);
        m->bf16_x[i] = m->bf16_w[i] = NULL;
    }
    free(m->bf16_dy);
    m->bf16_dy = NULL;
    m->bf16 = 0;
}

/* y = x w^T + b: x and w cast to bf16 (kept for the backward), the bias seeded into y and summed by the
 * product, as the f32 layer does. */
int tally__model_bf16_linear_forward(tally__model *m, int i, int rows, const float *x, const float *w, const float *b,
                                     float *y) {
    const tally__op *op = &m->op[i];
    int in = op->fan_in, out = op->fan_out;
    tally__bf16_cast(m->bf16_x[i], x, (size_t)rows * in);
    tally__bf16_cast(m->bf16_w[i], w, (size_t)out * in);
    if (b)
        for (int r = 0; r < rows; r++) memcpy(y + (size_t)r * out, b, (size_t)out * sizeof *y);
    return tally__gemm_bf16(0, 1, rows, out, in, m->bf16_x[i], in, m->bf16_w[i], in, b ? 1.0f : 0.0f, y, out);
}

/* dw += dy^T x and dx = dy w on the bf16 copies; db from dy in f32. */
int tally__model_bf16_linear_backward(tally__model *m, int i, int rows, const float *dy, float *dx, float *dw,
                                      float *db) {
    const tally__op *op = &m->op[i];
    int in = op->fan_in, out = op->fan_out, rc = 0;
    tally__bf16_cast(m->bf16_dy, dy, (size_t)rows * out);
    if (dw) rc = tally__gemm_bf16(1, 0, out, in, rows, m->bf16_dy, out, m->bf16_x[i], in, 1.0f, dw, in);
    if (!rc && dw && db)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < out; j++) db[j] += dy[(size_t)r * out + j];
    if (!rc && dx) rc = tally__gemm_bf16(0, 0, rows, in, out, m->bf16_dy, out, m->bf16_w[i], in, 0.0f, dx, in);
    return rc;
}
