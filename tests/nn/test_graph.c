/* test_graph.c - the model graph beyond a chain: a value read twice gets both gradients, a loss over
 * positions scores each row, token-index inputs through an embedding, each position's own linear map;
 * all against central finite differences of the float loss. Names too long for a tensor are refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "core/rng.h"
#include "nn/model.h"
#include "nn/model_build.h"

#define EPS 1e-2f
#define TOL 1e-3 /* |fd - analytic| <= TOL * max(1, |analytic|): see test_layers.c's TOL_FD32 */

enum { IN = 5, H = 6, B = 3 };
enum { T = 5, V = 7, D = 3 }; /* the token model: positions, vocabulary, width */

/* x -> fc1 -> v1 -> fc2 -> v2; v3 = v1 + v2 (v1 read twice); fc3 on v3 -> outputs. No ReLU: the loss is
 * smooth everywhere, so central differences are exact up to rounding. */
static int build_residual(tally__model *m, const tally__model_cfg *cfg) {
    tally__graph_linear(m, IN, H, 0, NULL);
    int v1 = tally__graph_last(m);
    tally__graph_linear(m, H, H, 0, NULL);
    int v2 = tally__graph_last(m);
    tally__graph_node(m, TALLY__OP_ADD, v1, v2, H);
    tally__graph_linear(m, H, cfg->outputs, 0, NULL);
    if (cfg->outputs == 2 * 3) m->positions = 2; /* two rows of three classes per sample */
    return 0;
}

/* tokens [T] -> wte [V, D] -> v1 [T, D]; fc1 on each position -> v2; v3 = v1 + v2; head on each position
 * -> logits [T, V]: a target per position (a language model's shape, without attention). */
static int build_tokens(tally__model *m, const tally__model_cfg *cfg) {
    m->token_input = 1;
    int rc = tally__graph_embedding(m, V, D, "wte");
    if (rc) return rc;
    int v1 = tally__graph_last(m);
    tally__graph_linear(m, D, D, 0, NULL);
    tally__graph_node(m, TALLY__OP_ADD, v1, tally__graph_last(m), (size_t)T * D);
    tally__graph_linear(m, D, V, 0, "head");
    m->positions = T;
    return 0;
}

/* More nodes than a model holds: refused at layout, the builder running on without harm. */
static int build_too_many(tally__model *m, const tally__model_cfg *cfg) {
    for (int i = 0; i < TALLY__MODEL_MAX_OPS + 10; i++) tally__graph_linear(m, cfg->in_dim, cfg->in_dim, 1, NULL);
    return 0;
}

static int build_long_name(tally__model *m, const tally__model_cfg *cfg) {
    tally__graph_linear(m, cfg->in_dim, cfg->outputs, 0,
                        "a_layer_whose_name_runs_past_what_a_tensor_name_can_hold_in_64_bytes");
    return 0;
}

static float loss_of(tally__model *m, const void *x, const int32_t *y) {
    float loss = 0;
    TH_CHECK(tally__model_forward(m, x, y, NULL, B, NULL, &loss) == 0, "forward: %s", tally_last_error());
    return loss;
}

/* Every parameter's analytic gradient against (L(p + eps) - L(p - eps)) / 2 eps; returns the mismatches. */
static int check_model(const char *what, const tally__model_cfg *cfg, const void *x, const int32_t *y) {
    tally__model m;
    if (tally__model_init(&m, cfg, B, 11, NULL, 0)) {
        TH_CHECK(0, "%s: init: %s", what, tally_last_error());
        return 1;
    }
    TH_CHECK(m.readers[1] == 2, "%s: v1 is read by %d nodes, expected 2", what, m.readers[1]);
    memset(m.grads, 0, m.nparams * sizeof(float));
    loss_of(&m, x, y);
    TH_CHECK(tally__model_backward(&m, y, NULL, B, NULL) == 0, "%s: backward", what);
    int bad = 0;
    for (size_t p = 0; p < m.nparams; p++) {
        float keep = m.params[p];
        m.params[p] = keep + EPS;
        double up = loss_of(&m, x, y);
        m.params[p] = keep - EPS;
        double down = loss_of(&m, x, y);
        m.params[p] = keep;
        double fd = (up - down) / (2.0 * EPS), g = m.grads[p];
        if (fabs(fd - g) > TOL * fmax(1.0, fabs(g)) && !bad++)
            fprintf(stderr, "%s: parameter %zu: finite differences %.6f, backward %.6f\n", what, p, fd, g);
    }
    TH_CHECK(bad == 0, "%s: %d of %zu gradients differ from finite differences", what, bad, m.nparams);
    printf("  %s: %zu parameters, %d nodes, %d values: %s\n", what, m.nparams, m.nops, m.nvalues, bad ? "FAIL" : "ok");
    tally__model_free(&m);
    return bad;
}

static int check_grads(const char *what, int outputs, const int32_t *y) {
    tally__model_cfg cfg = {.in_dim = IN, .outputs = outputs, .build = build_residual};
    float x[B * IN];
    tally__rng r;
    tally__rng_seed(&r, 5, 0);
    for (int i = 0; i < B * IN; i++) x[i] = 2.0f * tally__rng_uniform(&r) - 1.0f;
    return check_model(what, &cfg, x, y);
}

/* Tokens repeat within a sample and across samples (their rows' gradients add), and token 6 never
 * comes (its row's gradient stays 0); each position has its own target. */
static void check_tokens(void) {
    int32_t tok[B * T] = {0, 3, 3, 1, 5, 2, 2, 0, 4, 3, 5, 1, 1, 1, 0};
    int32_t y[B * T] = {3, 3, 1, 5, 2, 2, 0, 4, 3, 6, 1, 1, 1, 0, 6};
    tally__model_cfg cfg = {.in_dim = T, .outputs = V, .build = build_tokens};
    check_model("token input, embedding, a linear map per position", &cfg, tok, y);

    tally__model m;
    TH_CHECK(tally__model_init(&m, &cfg, B, 11, NULL, 0) == 0, "token model: init: %s", tally_last_error());
    TH_CHECK(m.token_input && m.op[0].kind == TALLY__OP_EMBED && m.op[1].rows == T, "token model: layout");
    TH_CHECK(m.ntensors == 5 && !strcmp(m.tensor[0].name, "wte.weight") && m.tensor[0].shape[0] == V,
             "token model: wte.weight [V, D] and no bias (%d tensors, the first %s)", m.ntensors, m.tensor[0].name);
    float loss;
    tok[7] = V; /* sample 1, position 2 */
    int rc = tally__model_forward(&m, tok, y, NULL, B, NULL, &loss);
    TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), "token 7 (sample 1, position 2)"),
             "a token outside the vocabulary: rc %d, '%s'", rc, tally_last_error());
    tally__model_free(&m);
    printf("  token outside the vocabulary: refused by name\n");
}

static void check_long_name(void) {
    tally__model m;
    tally__model_cfg cfg = {.in_dim = IN, .outputs = 3, .build = build_long_name};
    int rc = tally__model_init(&m, &cfg, B, 11, NULL, 0);
    TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), "more than 63"),
             "a tensor name of 75 characters: rc %d, '%s'", rc, tally_last_error());
    printf("  a tensor name longer than 63 characters: refused (%s)\n", tally_last_error());
    cfg.build = build_too_many;
    rc = tally__model_init(&m, &cfg, B, 11, NULL, 0);
    TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), "more than 1024 nodes"),
             "a graph of more than %d nodes: rc %d, '%s'", TALLY__MODEL_MAX_OPS, rc, tally_last_error());
}

int main(void) {
    int32_t y1[B] = {2, 0, 1}, y2[2 * B] = {1, 2, 0, 0, 2, 1};
    check_grads("residual add, one row per sample", 3, y1);
    check_grads("residual add, two positions per sample", 6, y2);
    check_tokens();
    check_long_name();
    return th_verdict("test_graph");
}
