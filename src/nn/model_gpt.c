/* model_gpt.c - GPT-2's architecture on token inputs: token and position embeddings, pre-LayerNorm
 * blocks of causal self-attention and a GELU MLP with residual adds, a final LayerNorm, the head tied
 * to the token embedding; GPT-2's initialisation, the names of the PyTorch model it is checked against. */
#include <math.h>
#include <stdio.h>

#include "../core/err.h"
#include "model_build.h"

#define GPT_STD 0.02f

/* A linear layer on the latest value with GPT-2's initialisation at deviation std. */
static void gpt_linear(tally__model *m, int in, int out, const char *name, float std) {
    tally__graph_linear(m, in, out, 0, name);
    m->op[m->nops - 1].init_std = std;
}

/* x + attn(ln_1(x)), then + mlp(ln_2(.)): the residual stream is read by the LayerNorm and the add. */
static int gpt_block(tally__model *m, const tally__model_cfg *cfg, int l) {
    int T = cfg->in_dim, C = cfg->embd;
    float proj_std = GPT_STD / sqrtf(2.0f * (float)cfg->layers);
    char name[48];
    int x = tally__graph_last(m);
    snprintf(name, sizeof name, "h.%d.ln_1", l);
    tally__graph_layernorm(m, C, name);
    snprintf(name, sizeof name, "h.%d.c_attn", l);
    gpt_linear(m, C, 3 * C, name, GPT_STD);
    int rc = tally__graph_attention(m, T, C, cfg->heads);
    if (rc) return rc;
    snprintf(name, sizeof name, "h.%d.c_proj", l);
    gpt_linear(m, C, C, name, proj_std);
    tally__graph_node(m, TALLY__OP_ADD, x, tally__graph_last(m), (size_t)T * C);
    x = tally__graph_last(m);
    snprintf(name, sizeof name, "h.%d.ln_2", l);
    tally__graph_layernorm(m, C, name);
    snprintf(name, sizeof name, "h.%d.c_fc", l);
    gpt_linear(m, C, 4 * C, name, GPT_STD);
    tally__graph_gelu(m);
    snprintf(name, sizeof name, "h.%d.mlp_proj", l);
    gpt_linear(m, 4 * C, C, name, proj_std);
    tally__graph_node(m, TALLY__OP_ADD, x, tally__graph_last(m), (size_t)T * C);
    return 0;
}

int tally__build_gpt(tally__model *m, const tally__model_cfg *cfg) {
    int T = cfg->in_dim, C = cfg->embd, V = cfg->outputs;
    if (cfg->layers < 1 || C < 1 || cfg->heads < 1 || C % cfg->heads)
        return tally__seterr(TALLY_E_INVALID,
                             "model: gpt needs --layers >= 1 and a --width that is a multiple of "
                             "--heads (got %d layers, width %d, %d heads)",
                             cfg->layers, C, cfg->heads);
    m->token_input = 1;
    m->positions = T;
    int rc = tally__graph_embedding(m, V, C, "wte");
    if (rc) return rc;
    m->op[0].init_std = GPT_STD;
    if ((rc = tally__graph_position(m, T, C, "wpe"))) return rc;
    m->op[1].init_std = GPT_STD;
    for (int l = 0; l < cfg->layers && !rc; l++) rc = gpt_block(m, cfg, l);
    if (rc) return rc;
    tally__graph_layernorm(m, C, "ln_f");
    tally__graph_tied_linear(m, 0, C, V); /* logits = ln_f(x) wte^T */
    return 0;
}

/* GPT's defaults: 4 blocks of width 256 with 4 heads, context 128 (3.26 M parameters). */
void tally__gpt_defaults(tally__model_cfg *mc) {
    if (!mc->layers) mc->layers = 4;
    if (!mc->embd) mc->embd = 256;
    if (!mc->heads) mc->heads = 4;
    if (!mc->in_dim) mc->in_dim = 128; /* the context */
}

/* "GPT L4 C256 H4 T128 V256". */
void tally__gpt_arch(const tally__model_cfg *mc, char *buf, size_t n) {
    snprintf(buf, n, "GPT L%d C%d H%d T%d V%d", mc->layers, mc->embd, mc->heads, mc->in_dim, mc->outputs);
}
