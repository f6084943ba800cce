/* generate.h - text from a trained model: the model rebuilt from a checkpoint alone (its shape and its
 * parameters), and sampling one byte after another with a temperature and a top-k cut. */
#ifndef TALLY_TRAIN_GENERATE_H
#define TALLY_TRAIN_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "../nn/model.h"

/* The newest checkpoint of dir as a model for one sequence: TALLY_E_INVALID when it holds no model
 * description (written before tally recorded one) or a model that does not read tokens. */
int tally__generate_load(const char *dir, tally__model *m);

/* Sampling's defaults (`tally generate` starts from them, and its --help prints them). */
#define TALLY__SAMPLE_TOKENS_DEFAULT      200
#define TALLY__SAMPLE_TEMPERATURE_DEFAULT 0.8f
#define TALLY__SAMPLE_TOP_K_DEFAULT       40
#define TALLY__SAMPLE_SEED_DEFAULT        1
typedef struct tally__sample_cfg {
    int tokens;        /* bytes to generate */
    float temperature; /* > 0: logits / temperature before the softmax; 0: always the likeliest byte */
    int top_k;         /* > 0: only the k likeliest bytes can be drawn */
    uint64_t seed;
} tally__sample_cfg;

/* Continues prompt[len] (bytes; len may be 0) by cfg->tokens bytes, each handed to emit as it is
 * drawn. The model sees the last context-length bytes. 0 or a forward's error. */
int tally__generate(tally__model *m, const uint8_t *prompt, size_t len, const tally__sample_cfg *cfg,
                    void (*emit)(void *arg, int byte), void *arg);

#endif
