/* model_build.h - what a model's file uses to lay out its graph: nodes over values, parameter tensors
 * with PyTorch's names, FLOP counts; and each model's builder, listed in models.c's table. */
#ifndef TALLY_NN_MODEL_BUILD_H
#define TALLY_NN_MODEL_BUILD_H

#include "model.h"

/* Appends a node running `kind` on value src0 (and src1; -1 for none) into a new value of `out` floats
 * per sample; returns it (its output is op->dst). */
tally__op *tally__graph_node(tally__model *m, tally__op_kind kind, int src0, int src1, size_t out);
/* The latest value: the input batch (0) before any node. */
int tally__graph_last(const tally__model *m);
/* Gives op a parameter layer: weight [wshape] then bias [wshape[0]], appended to the flat buffers as
 * the tensors "<name>.weight" and "<name>.bias". */
void tally__graph_params(tally__model *m, tally__op *op, const char *name, int wdim, const int *wshape);
/* "fc3", "conv2": the prefix and the number of earlier parameter layers of op's kind, plus one. */
void tally__graph_layer_name(const tally__model *m, const tally__op *op, const char *prefix, char *buf, size_t n);
/* Forward + backward FLOPs of a node doing `macs` multiply-adds per sample: 2 forward, 2 for the weight
 * gradient, 2 for the input gradient, which a node reading the input batch does not compute. */
double tally__graph_flops(const tally__op *op, double macs);

/* A linear layer (in -> out features) on the latest value, then a ReLU when relu; named fixed_name, or
 * "fc<k>" when that is NULL. A value of P x in floats per sample is P rows (a sequence's positions),
 * each mapped alike: P x out floats. */
void tally__graph_linear(tally__model *m, int in, int out, int relu, const char *fixed_name);
/* An embedding table [vocab, width] named "<name>.weight" over the token input (value 0: m->token_input
 * set, value_n[0] tokens per sample): value_n[0] x width floats per sample. 0 or TALLY_E_INVALID. */
int tally__graph_embedding(tally__model *m, int vocab, int width, const char *name);
/* A learned table "<name>.weight" [positions, width] added to each sample of the latest value (of
 * positions x width floats). 0 or TALLY_E_INVALID. */
int tally__graph_position(tally__model *m, int positions, int width, const char *name);
/* LayerNorm over each row of `width` of the latest value: "<name>.weight" and "<name>.bias" [width]. */
void tally__graph_layernorm(tally__model *m, int width, const char *name);
void tally__graph_gelu(tally__model *m);
/* Causal self-attention over the latest value, a qkv of seq x 3 width per sample: seq x width. 0 or
 * TALLY_E_INVALID (width not a multiple of heads, or the value's size). */
int tally__graph_attention(tally__model *m, int seq, int width, int heads);
/* A linear map without bias (in -> out on each row of the latest value) whose weight is op `owner`'s
 * [out, in] (GPT's head tied to the token embedding): no tensors of its own. */
void tally__graph_tied_linear(tally__model *m, int owner, int in, int out);

/* The builders (model_mlp.c, model_cnn.c): each lays out cfg's model after the input value. */
int tally__build_linear(tally__model *m, const tally__model_cfg *cfg);
int tally__build_mlp(tally__model *m, const tally__model_cfg *cfg);
int tally__build_cnn(tally__model *m, const tally__model_cfg *cfg);
int tally__build_gpt(tally__model *m, const tally__model_cfg *cfg);
/* Their lines' other entries (model_mlp.c, model_cnn.c). */
void tally__mlp_defaults(tally__model_cfg *mc);
void tally__mlp_arch(const tally__model_cfg *mc, char *buf, size_t n);
void tally__cnn_arch(const tally__model_cfg *mc, char *buf, size_t n);
void tally__gpt_defaults(tally__model_cfg *mc);
void tally__gpt_arch(const tally__model_cfg *mc, char *buf, size_t n);
/* Through the table (models.c): the input value, then cfg->kind's builder. */
int tally__model_layout(tally__model *m, const tally__model_cfg *cfg);

#endif
