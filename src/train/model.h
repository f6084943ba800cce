/* model.h - the trainer's models (linear, mlp, cnn) as a sequence of layer ops over one flat parameter
 * buffer and one flat gradient buffer, with their forward, backward and evaluation. */
#ifndef TALLY_TRAIN_MODEL_H
#define TALLY_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>
#include <tally/ddp.h>
#include <tally/layers.h>

typedef enum { TALLY__MODEL_LINEAR, TALLY__MODEL_MLP, TALLY__MODEL_CNN } tally__model_kind;

typedef enum { TALLY__OP_LINEAR, TALLY__OP_RELU, TALLY__OP_CONV, TALLY__OP_POOL } tally__op_kind;

#define TALLY__MODEL_MAX_OPS 32
#define TALLY__MODEL_MAX_HIDDEN 16

typedef struct tally__op {
    tally__op_kind kind;
    size_t in, out;          /* floats per sample in and out */
    int layer;               /* index among the layers with parameters, -1 for none */
    size_t w_off, b_off;     /* into the flat buffers: w then b */
    int fan_in, fan_out;     /* linear: in, out features */
    tally_conv2d_shape conv; /* conv */
    int pool_c, pool_h, pool_w, pool_k; /* pool: input geometry and window */
} tally__op;

/* One named parameter tensor: a view into the flat buffers (PyTorch's names and layouts, so shapes
 * read as in a state_dict: "fc1.weight" [out, in], "conv1.weight" [K, C, R, R], "*.bias" [out]). */
#define TALLY__MODEL_MAX_TENSORS (2 * TALLY__MODEL_MAX_OPS)
typedef struct tally__tensor {
    char name[24];
    int ndim, shape[4];
    size_t offset, count;    /* into params and grads */
    float *param, *grad;     /* params + offset, grads + offset */
} tally__tensor;

/* What to build. */
typedef struct tally__model_cfg {
    tally__model_kind kind;
    int in_dim;              /* features per sample (784 for 28x28 images) */
    int channels, height, width; /* image geometry (cnn) */
    int outputs;             /* classes, or the regression width */
    int nhidden;             /* mlp */
    int hidden[TALLY__MODEL_MAX_HIDDEN];
} tally__model_cfg;

typedef struct tally__model {
    tally__model_cfg cfg;
    int regression;          /* mse loss instead of softmax cross-entropy */
    int nops, nlayers;
    tally__op op[TALLY__MODEL_MAX_OPS];
    size_t offsets[TALLY__MODEL_MAX_OPS + 1]; /* layer boundaries in the flat buffers, for the engine */
    size_t nparams;
    int ntensors;
    tally__tensor tensor[TALLY__MODEL_MAX_TENSORS]; /* every weight and bias, in buffer order */
    float *params;           /* [nparams]: every layer's w then b, layers in forward order */
    float *grads;            /* [nparams], same layout; from tally_mem_alloc when a comm is given */
    tally_comm *grads_comm;  /* who allocated grads (NULL: plain memory) */
    int max_batch;
    float *act[TALLY__MODEL_MAX_OPS + 1]; /* act[0] is the input batch, act[i+1] the output of op i */
    float *dact[TALLY__MODEL_MAX_OPS + 1];
    float *probs;            /* softmax output */
    int32_t *argmax[TALLY__MODEL_MAX_OPS];
    float *scratch;          /* im2col, shared by the conv ops */
    double flops_per_sample; /* forward + backward multiply-adds x 2 */
    size_t activation_bytes;
} tally__model;

/* "linear", "mlp", "cnn" and the reverse (-1 when unknown). */
const char *tally__model_name(tally__model_kind k);
int tally__model_parse(const char *name);

/* Lays out the model, allocates its buffers for batches up to max_batch (grads through
 * tally_mem_alloc(comm) when comm is not NULL) and initialises the parameters from seed as PyTorch
 * does (uniform in +-1/sqrt(fan_in)). Returns 0 or a TALLY_E_* code with a message. */
int tally__model_init(tally__model *m, const tally__model_cfg *cfg, int max_batch, uint64_t seed, tally_comm *comm);
void tally__model_free(tally__model *m);

/* Forward of B samples x[B, in_dim] with labels (classification) or targets (regression); returns the
 * mean loss. Keeps the activations for backward. */
float tally__model_forward(tally__model *m, const float *x, const int32_t *y, const float *t, int B);
/* Backward of the last forward: adds the gradients into m->grads, marking each layer ready on the
 * engine (NULL: none) as soon as its gradients are complete. */
int tally__model_backward(tally__model *m, const int32_t *y, const float *t, int B, tally_ddp *ddp);
/* Correct predictions among the B samples of the last forward (classification), or its summed squared
 * error (regression). */
double tally__model_score(const tally__model *m, const int32_t *y, const float *t, int B);

#endif
