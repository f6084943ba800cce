/* models.c - the table of models: name, data needed, defaults, lr, arch and builder. Adding a model is a
 * file with its builder and one line here; the trainer, the checkpoints and the planner ask the table. */
#include <stdio.h>
#include <string.h>

#include "../core/err.h"
#include "model_build.h"

typedef struct model_def {
    tally__model_info info;
    int (*build)(tally__model *m, const tally__model_cfg *cfg);
} model_def;

/* name, data, SGD's default lr, takes --hidden, defaults, arch; builder. */
static const model_def model_defs[] = {
    [TALLY__MODEL_LINEAR] = {{"linear", TALLY__DATA_LEAST_SQUARES, 0.01f, 0, NULL, tally__mlp_arch},
                             tally__build_linear},
    [TALLY__MODEL_MLP] = {{"mlp", TALLY__DATA_FEATURES, 0.05f, 1, tally__mlp_defaults, tally__mlp_arch},
                          tally__build_mlp},
    [TALLY__MODEL_CNN] = {{"cnn", TALLY__DATA_IMAGES, 0.025f, 0, NULL, tally__cnn_arch}, tally__build_cnn},
    [TALLY__MODEL_GPT] = {{"gpt", TALLY__DATA_TOKENS, 0.05f, 0, tally__gpt_defaults, tally__gpt_arch},
                          tally__build_gpt},
};
#define MODEL_COUNT ((int)(sizeof model_defs / sizeof *model_defs))

const tally__model_info *tally__model_info_of(tally__model_kind k) {
    return (unsigned)k < MODEL_COUNT ? &model_defs[k].info : NULL;
}

void tally__model_arch(const tally__model_cfg *mc, char *buf, size_t n) {
    const tally__model_info *info = tally__model_info_of(mc->kind);
    if (info && !mc->build)
        info->arch(mc, buf, n);
    else
        snprintf(buf, n, "%s", info && !mc->build ? info->name : "a graph of its own");
}

const char *tally__model_name(tally__model_kind k) { return (unsigned)k < MODEL_COUNT ? model_defs[k].info.name : "?"; }

int tally__model_parse(const char *name) {
    for (int i = 0; i < MODEL_COUNT; i++)
        if (name && !strcmp(name, model_defs[i].info.name)) return i;
    return -1;
}

#define MODELS_STR_(x) #x
#define MODELS_STR(x)  MODELS_STR_(x) /* a macro's value as a string literal */

/* v within lo..hi, else TALLY_E_INVALID naming the model, the field, v and the bound (`why`: what sets it). */
static int check_field(const char *model, const char *field, long long v, long long lo, long long hi, const char *why) {
    if (v >= lo && v <= hi) return 0;
    return tally__seterr(TALLY_E_INVALID, "model %s: %s %lld is outside %lld..%lld%s%s", model, field, v, lo, hi,
                         why[0] ? " " : "", why);
}

static int check_gpt(const tally__model_cfg *c) {
    int rc = check_field("gpt", "layers", c->layers, 1, TALLY__MODEL_MAX_GPT_LAYERS,
                         "(each block is 10 of a model's at most " MODELS_STR(TALLY__MODEL_MAX_OPS) " nodes)");
    if (!rc) rc = check_field("gpt", "width", c->embd, 1, TALLY__MODEL_MAX_WIDTH, "");
    if (!rc)
        rc = check_field("gpt", "heads", c->heads, 1,
                         c->embd < TALLY__MODEL_MAX_HEADS ? c->embd : TALLY__MODEL_MAX_HEADS,
                         "(at most the width, which they divide)");
    if (!rc) rc = check_field("gpt", "context", c->in_dim, 1, TALLY__MODEL_MAX_CONTEXT, "");
    if (!rc) rc = check_field("gpt", "vocabulary", c->outputs, 1, TALLY__MODEL_MAX_OUTPUTS, "");
    if (!rc && c->embd % c->heads)
        rc = tally__seterr(TALLY_E_INVALID, "model gpt: width %d is not a multiple of its %d heads", c->embd, c->heads);
    return rc;
}

static int check_cnn(const tally__model_cfg *c) {
    int rc = check_field("cnn", "channels", c->channels, 1, TALLY__MODEL_MAX_CHANNELS, "");
    if (!rc) rc = check_field("cnn", "height", c->height, 12, TALLY__MODEL_MAX_SIDE, "(LeNet-5's two pools)");
    if (!rc) rc = check_field("cnn", "width", c->width, 12, TALLY__MODEL_MAX_SIDE, "(LeNet-5's two pools)");
    long long pixels = (long long)c->channels * c->height * c->width; /* < 2^41: no overflow */
    if (!rc && pixels != c->in_dim)
        rc = tally__seterr(TALLY_E_INVALID, "model cnn: %d inputs per sample, and images of %dx%dx%d hold %lld",
                           c->in_dim, c->channels, c->height, c->width, pixels);
    return rc;
}

int tally__model_check(const tally__model_cfg *cfg) {
    const char *name = cfg->build ? "of its own" : tally__model_name(cfg->kind);
    if (!cfg->build && (unsigned)cfg->kind >= MODEL_COUNT)
        return tally__seterr(TALLY_E_INVALID, "model: unknown kind %d", (int)cfg->kind);
    if (!cfg->build && cfg->kind == TALLY__MODEL_GPT) return check_gpt(cfg);
    int rc = check_field(name, "inputs", cfg->in_dim, 1, TALLY__MODEL_MAX_FEATURES, "(floats per sample)");
    if (!rc) rc = check_field(name, "outputs", cfg->outputs, 1, TALLY__MODEL_MAX_OUTPUTS, "");
    if (rc || cfg->build) return rc;
    if (cfg->kind == TALLY__MODEL_CNN) return check_cnn(cfg);
    if (cfg->kind != TALLY__MODEL_MLP) return 0;
    rc = check_field(name, "hidden layers", cfg->nhidden, 0, TALLY__MODEL_MAX_HIDDEN, "");
    char field[48];
    for (int i = 0; i < cfg->nhidden && !rc; i++) {
        snprintf(field, sizeof field, "hidden layer %d's width", i);
        rc = check_field(name, field, cfg->hidden[i], 1, TALLY__MODEL_MAX_WIDTH, "");
    }
    return rc;
}

int tally__model_layout(tally__model *m, const tally__model_cfg *cfg) {
    int crc = tally__model_check(cfg);
    if (crc) return crc;
    m->nvalues = 1; /* value 0: the input batch */
    m->value_n[0] = (size_t)cfg->in_dim;
    m->positions = 1;
    m->tied_owner = -1;
    int rc = (cfg->build ? cfg->build : model_defs[cfg->kind].build)(m, cfg);
    return rc ? rc : m->layout_rc;
}
