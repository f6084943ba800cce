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
    [TALLY__MODEL_CNN] = {{"cnn", TALLY__DATA_IMAGES, 0.05f, 0, NULL, tally__cnn_arch}, tally__build_cnn},
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

int tally__model_layout(tally__model *m, const tally__model_cfg *cfg) {
    if (!cfg->build && (unsigned)cfg->kind >= MODEL_COUNT)
        return tally__seterr(TALLY_E_INVALID, "model: unknown kind %d", (int)cfg->kind);
    m->nvalues = 1; /* value 0: the input batch */
    m->value_n[0] = (size_t)cfg->in_dim;
    m->positions = 1;
    m->tied_owner = -1;
    int rc = (cfg->build ? cfg->build : model_defs[cfg->kind].build)(m, cfg);
    return rc ? rc : m->layout_rc;
}
