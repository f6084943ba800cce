/* ckpt_train.h - a training run's state as a checkpoint: parameters, optimizer state, position and
 * identity saved in one canonical layout, and restored on every rank whatever world size or ZeRO stage
 * wrote it. */
#ifndef TALLY_TRAIN_CKPT_TRAIN_H
#define TALLY_TRAIN_CKPT_TRAIN_H

#include "trainer_int.h"

/* The model a checkpoint holds, for rebuilding it without the flags that trained it: "model.name" (the
 * table's name) and "model.config", i64 { in_dim (gpt: the context), outputs, layers, embd, heads,
 * nhidden, hidden[16] }. Checkpoints written before these entries lack them. */
#define TALLY__CKPT_MODEL_CONFIG (6 + TALLY__MODEL_MAX_HIDDEN)
void tally__ckpt_model_config(const tally__model_cfg *mc, int64_t *v);
/* The inverse for a model of `kind`, from the values a checkpoint (label) holds: each in 0..
 * TALLY__MODEL_MAX_FIELD before it is cast to int (its own bound is tally__model_check's, when the model is
 * laid out), nhidden at most TALLY__MODEL_MAX_HIDDEN and the widths past it 0. TALLY_E_CORRUPT naming the
 * checkpoint, the field and its value. */
int tally__ckpt_model_config_read(const int64_t *v, tally__model_kind kind, const char *label, tally__model_cfg *mc);

/* Refuses, before the first step, a run whose entries' names do not fit a checkpoint (at most
 * TALLY__CKPT_NAME_MAX characters), naming the first; the same on every rank, not collective. */
int tally__train_ckpt_check_names(train_run *r);

/* Saves the state after `steps_done` optimizer steps into cfg->ckpt_dir. Collective: ZeRO shards are
 * gathered layer by layer and rank 0 writes; every rank returns rank 0's outcome. */
int tally__train_ckpt_save(train_run *r, long steps_done);

/* With --resume: loads the newest checkpoint of cfg->ckpt_dir into the run (parameters, optimizer
 * state, start position) on every rank. No checkpoint there is not an error: the run starts from step 0
 * and rank 0 says so. Collective. */
int tally__train_ckpt_resume(train_run *r);

/* Without --resume: refuses a cfg->ckpt_dir that already holds checkpoints (a commit there would remove
 * another run's later ones). Collective. */
int tally__train_ckpt_check_fresh(train_run *r);

#endif
