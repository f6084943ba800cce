/* layers_embed.c - the embedding lookup (a row of the table per token) and its scatter-add backward,
 * the first layer of a model whose inputs are token indices. */
#include <string.h>
#include <tally/layers.h>

long tally_embedding_forward(float *y, const int32_t *tokens, const float *w, size_t n, int V, int D) {
    for (size_t i = 0; i < n; i++) {
        int32_t t = tokens[i];
        if (t < 0 || t >= V) return (long)i;
        memcpy(y + i * (size_t)D, w + (size_t)t * D, (size_t)D * sizeof *y);
    }
    return -1;
}

void tally_embedding_backward(float *dw, const float *dy, const int32_t *tokens, size_t n, int D) {
    for (size_t i = 0; i < n; i++) {
        float *row = dw + (size_t)tokens[i] * D;
        const float *g = dy + i * (size_t)D;
        for (int j = 0; j < D; j++) row[j] += g[j];
    }
}
