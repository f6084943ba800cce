/* models.c - the table of models: each one's name (for --model) and builder. Adding a model is a file
 * with its builder and one line here (and its name in tally__model_kind). */
#include <string.h>

#include "../core/err.h"
#include "model_build.h"

typedef struct model_def {
    const char *name;
    int (*build)(tally__model *m, const tally__model_cfg *cfg);
} model_def;

static const model_def model_defs[] = {
    [TALLY__MODEL_LINEAR] = {"linear", tally__build_linear},
    [TALLY__MODEL_MLP] = {"mlp", tally__build_mlp},
    [TALLY__MODEL_CNN] = {"cnn", tally__build_cnn},
};
#define MODEL_COUNT ((int)(sizeof model_defs / sizeof *model_defs))

const char *tally__model_name(tally__model_kind k) { return (unsigned)k < MODEL_COUNT ? model_defs[k].name : "?"; }

int tally__model_parse(const char *name) {
    for (int i = 0; i < MODEL_COUNT; i++)
        if (name && !strcmp(name, model_defs[i].name)) return i;
    return -1;
}

int tally__model_layout(tally__model *m, const tally__model_cfg *cfg) {
    if (!cfg->build && (unsigned)cfg->kind >= MODEL_COUNT)
        return tally__seterr(TALLY_E_INVALID, "model: unknown kind %d", (int)cfg->kind);
    m->nvalues = 1; /* value 0: the input batch */
    m->value_n[0] = (size_t)cfg->in_dim;
    m->positions = 1;
    return (cfg->build ? cfg->build : model_defs[cfg->kind].build)(m, cfg);
}
