/* layers_loss.c - the losses: softmax with cross-entropy for classification and mean squared error
 * for regression, each returning the batch-mean loss and its gradient. */
#include <math.h>
#include <tally/layers.h>

/* Writes the softmax of one row and returns -log(prob[label]). Shifting by the row max keeps expf
 * from overflowing; the loss comes from log-sum-exp rather than log(prob), so a probability that
 * underflows to 0 still gives a finite loss (no clamp needed, and no loss of accuracy near 0). */
static double softmax_row(float *p, const float *z, int label, int C) {
    float m = z[0];
    for (int j = 1; j < C; j++) m = z[j] > m ? z[j] : m;
    float sum = 0.0f;
    for (int j = 0; j < C; j++) {
        p[j] = expf(z[j] - m);
        sum += p[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < C; j++) p[j] *= inv;
    return log((double)sum) - ((double)z[label] - m);
}

float tally_softmax_xent_forward(float *probs, const float *logits, const int32_t *labels, int B, int C) {
    double loss = 0.0;
    for (int i = 0; i < B; i++) loss += softmax_row(probs + (size_t)i * C, logits + (size_t)i * C, labels[i], C);
    return (float)(loss / B);
}

void tally_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels, int B, int C) {
    float inv_b = 1.0f / (float)B;
    for (int i = 0; i < B; i++) {
        float *d = dlogits + (size_t)i * C;
        const float *p = probs + (size_t)i * C;
        for (int j = 0; j < C; j++) d[j] = p[j] * inv_b;
        d[labels[i]] -= inv_b;
    }
}

float tally_mse_forward(const float *pred, const float *target, int B, int D) {
    /* Double accumulation: a float sum over B*D squares loses digits at realistic sizes. */
    double sum = 0.0;
    size_t n = (size_t)B * D;
    for (size_t i = 0; i < n; i++) {
        double e = (double)pred[i] - target[i];
        sum += e * e;
    }
    return (float)(0.5 * sum / B);
}

void tally_mse_backward(float *dpred, const float *pred, const float *target, int B, int D) {
    float inv_b = 1.0f / (float)B;
    size_t n = (size_t)B * D;
    for (size_t i = 0; i < n; i++) dpred[i] = (pred[i] - target[i]) * inv_b;
}
