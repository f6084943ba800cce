/* model.h - the trainer's models as a graph of nodes (an op, its input values, its output value, its
 * parameters) over one flat parameter buffer and one flat gradient buffer: forward, backward, scoring. */
#ifndef TALLY_NN_MODEL_H
#define TALLY_NN_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>
#include <tally/layers.h>

#include "../core/alloc.h"

typedef enum { TALLY__MODEL_LINEAR, TALLY__MODEL_MLP, TALLY__MODEL_CNN, TALLY__MODEL_GPT } tally__model_kind;

/* The ops a model's nodes run. ADD takes two inputs of one size (a residual connection); EMBED looks up
 * a row of its table for each token of a token-index input (value 0 of a model with token_input);
 * POSITION adds a learned [positions, width] table to every sample (GPT's position embedding);
 * LAYERNORM normalises each row of fan_in; ATTENTION is causal self-attention over a qkv value. */
typedef enum {
    TALLY__OP_LINEAR,
    TALLY__OP_RELU,
    TALLY__OP_CONV,
    TALLY__OP_POOL,
    TALLY__OP_ADD,
    TALLY__OP_EMBED,
    TALLY__OP_POSITION,
    TALLY__OP_LAYERNORM,
    TALLY__OP_GELU,
    TALLY__OP_ATTENTION,
} tally__op_kind;

#define TALLY__MODEL_MAX_OPS    1024 /* GPT: 10 a block, so 102 blocks (LLaMA-65B has 80) */
#define TALLY__MODEL_MAX_VALUES (TALLY__MODEL_MAX_OPS + 1)
#define TALLY__MODEL_MAX_HIDDEN 16

/* The bounds of a model's description (tally__model_check; docs/cli.md, "Model bounds"), checked in 64-bit
 * before anything is laid out, cast or allocated, whether the description came from flags, a checkpoint's
 * model.config or a program. Each is far past any model a CPU trains and small enough that no size the
 * layout computes from them overflows. */
#define TALLY__MODEL_MAX_FEATURES   (1 << 24) /* in_dim of a model on feature vectors: floats per sample */
#define TALLY__MODEL_MAX_OUTPUTS    (1 << 20) /* classes, regression width or vocabulary */
#define TALLY__MODEL_MAX_WIDTH      (1 << 20) /* a hidden layer's width, GPT's width C */
#define TALLY__MODEL_MAX_HEADS      (1 << 16) /* GPT's heads (and at most its width, which they divide) */
#define TALLY__MODEL_MAX_CONTEXT    (1 << 20) /* GPT's context T */
#define TALLY__MODEL_MAX_CHANNELS   4096      /* a CNN's input channels; its height and width are 12..2^14 */
#define TALLY__MODEL_MAX_SIDE       (1 << 14)
#define TALLY__MODEL_MAX_GPT_LAYERS ((TALLY__MODEL_MAX_OPS - 4) / 10) /* 102: 10 nodes a block, 4 around them */
/* The largest of the bounds above: what any integer of a stored description may be before it is cast. */
#define TALLY__MODEL_MAX_FIELD (1 << 24)
/* What a model that is allocated (tally__model_init, not tally__model_describe, which costs models on
 * paper) may take: parameters (8 GiB of f32, as many of gradients, twice that of AdamW's state) and the
 * activations at its largest batch. */
#define TALLY__MODEL_MAX_PARAMS           (1ull << 31)
#define TALLY__MODEL_MAX_ACTIVATION_BYTES (1ull << 36) /* 64 GiB */

/* One node of the model's graph: an op reading one or two values and writing a new one. Value 0 is the
 * input batch; each node's output is a value of its own, so a value is written once per pass, and read
 * by any later nodes (a value read twice gets the sum of both gradients in backward). */
typedef struct tally__op {
    tally__op_kind kind;
    int src[2];              /* the values it reads; src[1] = -1 for one input */
    int dst;                 /* the value it writes */
    size_t in, out;          /* floats per sample of src[0] and dst */
    int layer;               /* index among the layers with parameters, -1 for none */
    size_t w_off, b_off;     /* into the flat buffers: w then b */
    float *w, *b, *dw, *db;  /* what forward and backward use: the flat buffers, or what ZeRO points them
                              * at (a gathered layer, a gradient staging buffer) */
    int fan_in, fan_out;     /* linear: in, out features; embed: vocabulary, width; layernorm: width */
    int rows;                /* linear, layernorm: rows per sample, each of fan_in (a sequence's positions) */
    int tied_to;             /* linear: -1, or the op whose weight it uses as its own, without a bias (GPT's
                              * head on the token embedding): through model->tied_w and tied_dw */
    int seq, heads;          /* attention: positions and heads; fan_in is the width C (qkv holds 3C) */
    float init_std;          /* > 0: weights normal(0, init_std), biases 0 (GPT-2's); 0: PyTorch's defaults
                              * (uniform +-1/sqrt(fan_in); embeddings normal(0, 1); LayerNorm 1 and 0) */
    tally_conv2d_shape conv; /* conv */
    int pool_c, pool_h, pool_w, pool_k; /* pool: input geometry and window */
} tally__op;

/* One named parameter tensor: a view into the flat buffers (PyTorch's names and layouts, so shapes
 * read as in a state_dict: "fc1.weight" [out, in], "conv1.weight" [K, C, R, R], "*.bias" [out]). */
#define TALLY__MODEL_MAX_TENSORS (2 * TALLY__MODEL_MAX_OPS)
typedef struct tally__tensor {
    char name[64];
    int ndim, shape[4];
    size_t offset, count; /* into params and grads */
    float *param, *grad;  /* params + offset, grads + offset */
} tally__tensor;

/* What to build. */
struct tally__model;
typedef struct tally__model_cfg {
    tally__model_kind kind;
    int in_dim;                  /* features per sample (784 for 28x28 images) */
    int channels, height, width; /* image geometry (cnn) */
    int outputs;                 /* classes, or the regression width */
    int nhidden;                 /* mlp */
    int hidden[TALLY__MODEL_MAX_HIDDEN];
    int layers, embd, heads; /* gpt: blocks, width C, heads H (in_dim is its context T, outputs its vocabulary) */
    /* A graph of one's own (tests, embedders), laid out with model_build.h after the input value,
     * instead of kind's entry in the table; NULL for the table's. */
    int (*build)(struct tally__model *m, const struct tally__model_cfg *cfg);
} tally__model_cfg;

typedef struct tally__model {
    tally__model_cfg cfg;
    int regression; /* mse loss instead of softmax cross-entropy */
    int nops, nlayers;
    tally__op op[TALLY__MODEL_MAX_OPS];      /* in forward order: a node reads only values made before it */
    int nvalues;                             /* value 0 is the input batch; the last value holds the outputs */
    int token_input;                         /* value 0 holds int32 token indices (value_n[0] per sample), not floats */
    int layout_rc;                           /* the first error the builder's calls met (a name too long), or 0 */
    size_t value_n[TALLY__MODEL_MAX_VALUES]; /* floats per sample of each value */
    int readers[TALLY__MODEL_MAX_VALUES];    /* how many node inputs read it */
    int positions; /* outputs per sample the loss scores: 1, or a sequence's length (each of the
                              * last value's positions is a row of outputs / positions classes) */
    size_t offsets[TALLY__MODEL_MAX_OPS + 1]; /* layer boundaries in the flat buffers, for the engine */
    size_t nparams;
    int ntensors;
    tally__tensor tensor[TALLY__MODEL_MAX_TENSORS]; /* every weight and bias, in buffer order */
    float *params;                                  /* [nparams]: every layer's w then b, layers in forward order */
    float *grads;                     /* [nparams], same layout; from tally_mem_alloc when a comm is given */
    tally__mem_source grads_src;      /* who allocated grads (alloc NULL: plain memory) */
    size_t params_bytes, grads_bytes; /* what the flat buffers hold (0 when not allocated) */
    int max_batch;
    float *act[TALLY__MODEL_MAX_VALUES];  /* each value at the batch; act[0] is the caller's input */
    float *dact[TALLY__MODEL_MAX_VALUES]; /* the loss's gradient with respect to each value */
    float *dtmp;                          /* one input's gradient, before it is added to a value read more than once */
    float *probs;                         /* softmax output */
    void *saved[TALLY__MODEL_MAX_OPS];    /* what an op keeps for its backward: pool winners (int32),
                                        * layernorm means and rstds, attention probabilities */
    float *scratch;                       /* im2col and attention's T x T, shared by the ops */
    int tied_owner;                       /* the op whose weight a tied op uses, -1 for none */
    float *tied_w;           /* that weight as the tied op reads it: the owner's own, or (when ZeRO-3 keeps parameters
                       * in shards and reuses a gathered layer's buffer) a copy taken at the owner's forward */
    float *tied_dw;          /* the tied op's gradient of it, added into the owner's at the owner's backward, so it
                       * lands wherever the engine points the owner's gradient then */
    float *tied_copy;        /* the copy tied_w points at, when one is kept */
    double flops_per_sample; /* forward + backward multiply-adds x 2 */
    size_t activation_bytes;
    int bf16;                               /* linear layers' products in bf16 (tally__model_use_bf16) */
    uint16_t *bf16_x[TALLY__MODEL_MAX_OPS]; /* each linear's input in bf16, from its forward for its backward */
    uint16_t *bf16_w[TALLY__MODEL_MAX_OPS]; /* its weight in bf16, cast at its forward */
    uint16_t *bf16_dy;                      /* an output gradient in bf16, shared by the linears */
    int bf16_rc;                            /* the first error of a bf16 product in backward, or 0 */
} tally__model;

/* --precision bf16 (model_bf16.c): checks the build and the CPU, allocates the bf16 copies at max_batch, and
 * from then on runs the linear layers' products in bf16. 0, or TALLY_E_UNSUPPORTED saying what is missing. */
int tally__model_use_bf16(tally__model *m);
/* The bytes tally__model_use_bf16 allocates for a laid-out model at batch B. */
size_t tally__model_bf16_bytes(const tally__model *m, int B);
void tally__model_bf16_free(tally__model *m);
int tally__model_bf16_linear_forward(tally__model *m, int i, int rows, const float *x, const float *w, const float *b,
                                     float *y);
int tally__model_bf16_linear_backward(tally__model *m, int i, int rows, const float *dy, float *dx, float *dw,
                                      float *db);

/* "W1,W2,..." (each 1..2^20, at most TALLY__MODEL_MAX_HIDDEN) into hidden[] and *n; -1 when malformed. */
int tally__model_parse_hidden(const char *s, int *hidden, int *n);

/* What the rest of tally knows of a model, from its line in models.c's table. */
typedef enum {
    TALLY__DATA_FEATURES,      /* any set of feature vectors with classes (IDX, synthetic) */
    TALLY__DATA_IMAGES,        /* an image set: channels, height, width */
    TALLY__DATA_LEAST_SQUARES, /* its own least-squares set (TALLY__TRAIN_LINEAR_FEATURES, 1 target) */
    TALLY__DATA_TOKENS,        /* text as byte tokens: windows of the context's length, a target at each position */
} tally__data_need;
typedef struct tally__model_info {
    const char *name;                       /* --model */
    tally__data_need data;                  /* what it trains on */
    float sgd_lr;                           /* the default learning rate with SGD (AdamW's: the trainer's default) */
    int takes_hidden;                       /* --hidden sets its widths */
    void (*defaults)(tally__model_cfg *mc); /* fills what the flags left unset; NULL: nothing */
    void (*arch)(const tally__model_cfg *mc, char *buf, size_t n); /* "784-512-512-10", "LeNet-5" */
} tally__model_info;
/* The table's line for k; NULL when k is not a model. */
const tally__model_info *tally__model_info_of(tally__model_kind k);
/* mc's architecture in words, as the summary prints it. */
void tally__model_arch(const tally__model_cfg *mc, char *buf, size_t n);

/* "linear", "mlp", "cnn" and the reverse (-1 when unknown). */
const char *tally__model_name(tally__model_kind k);
int tally__model_parse(const char *name);

/* Lays out the model, allocates its buffers for batches up to max_batch (grads from grads_src when
 * it is not NULL, e.g. the communicator's shared memory) and initialises the parameters from seed as PyTorch
 * does (uniform in +-1/sqrt(fan_in)). flags leave out the flat parameter or gradient buffer (ZeRO
 * keeps shards instead; it then points each layer's w/b/dw/db where it wants them). Returns 0 or a
 * TALLY_E_* code with a message. */
#define TALLY__MODEL_NO_PARAMS 1
#define TALLY__MODEL_NO_GRADS  2
int tally__model_init(tally__model *m, const tally__model_cfg *cfg, int max_batch, uint64_t seed,
                      const tally__mem_source *grads_src, int flags);
/* The initial parameters of layer `layer` (weights then bias, offsets[layer+1] - offsets[layer] floats)
 * as tally__model_init draws them: layer by layer from one stream, so a rank holding a shard can draw
 * the layers in order into a buffer of one layer and keep its part. Call for layers 0, 1, ... in turn
 * with the same rng, seeded by tally__model_init_rng. */
struct tally__rng;
void tally__model_init_rng(struct tally__rng *r, uint64_t seed);
void tally__model_init_layer(const tally__model *m, int layer, float *dst, struct tally__rng *r);

/* Called around each layer with parameters (layer index among them); any may be NULL. A non-zero
 * return stops the pass with that code. */
typedef struct tally__model_hooks {
    void *arg;
    int (*before_forward)(void *arg, int layer);
    int (*before_backward)(void *arg, int layer);
    int (*after_backward)(void *arg, int layer); /* its gradients for this micro-batch are complete */
} tally__model_hooks;
void tally__model_free(tally__model *m);

/* Every field of cfg that its kind reads against its bound above (and against each other: GPT's heads
 * dividing its width, a CNN's geometry its inputs), in 64-bit, before anything is built: 0, or
 * TALLY_E_INVALID naming the field, its value and its bound. tally__model_init and
 * tally__model_describe call it first; a graph of one's own (cfg->build) has its inputs and outputs
 * checked. */
int tally__model_check(const tally__model_cfg *cfg);

/* What a model of cfg costs, computed from its layout without allocating it (for tally plan): */
typedef struct tally__model_desc {
    size_t nparams;
    int nlayers;
    size_t largest_layer;    /* parameters of the largest layer (what ZeRO-3 gathers at once) */
    size_t tied_floats;      /* a weight two ops share (GPT's embedding and head), which ZeRO-3 copies */
    size_t activation_bytes; /* what tally__model_init allocates for activations at that batch */
    double flops_per_sample; /* forward + backward */
    size_t bf16_bytes;       /* what tally__model_use_bf16 would add at that batch (its activations) */
} tally__model_desc;
int tally__model_describe(const tally__model_cfg *cfg, int batch, tally__model_desc *out);

/* Forward of B samples x[B, in_dim] (floats; int32 token indices when m->token_input) with labels
 * (classification, one per position) or targets (regression); stores the mean loss in *loss. Keeps the
 * activations for backward. Returns 0, a hook's error, or TALLY_E_INVALID for a token outside an
 * embedding's vocabulary. */
int tally__model_forward(tally__model *m, const void *x, const int32_t *y, const float *t, int B,
                         const tally__model_hooks *h, float *loss);
/* Backward of the last forward: adds the gradients into each layer's dw/db, calling the hooks. */
int tally__model_backward(tally__model *m, const int32_t *y, const float *t, int B, const tally__model_hooks *h);
/* Floats of the weight a tied op shares with its owner (0: none is shared). */
size_t tally__model_tied_floats(const tally__model *m);
/* The index of the op that holds parameter layer `layer`. */
int tally__model_layer_op(const tally__model *m, int layer);
/* Correct predictions among the B samples of the last forward (classification), or its summed squared
 * error (regression). */
double tally__model_score(const tally__model *m, const int32_t *y, const float *t, int B);

#endif
