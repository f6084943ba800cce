/* sync.c - the one place that knows which engine keeps the replicas in step: lays out the model for the
 * stage (the buffers it keeps whole), then opens stage 0's engine or ZeRO's. */
#include "sync.h"

#include <string.h>

/* Gradients in the communicator's shared memory, so its peers read them in place. */
static void *sync_grads_alloc(void *comm, size_t bytes) { return tally_mem_alloc(comm, bytes); }
static void sync_grads_release(void *comm, void *p) { tally_mem_free(comm, p); }

int tally__sync_open(tally__sync *s, tally_comm *comm, tally__model *m, const tally__model_cfg *mc, int max_batch,
                     const tally__sync_cfg *cfg, const tally_optim_cfg *optim, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->comm = comm;
    s->m = m;
    /* Stages 2-3 keep gradients in shards, stage 3 parameters too: the model leaves those out. */
    int flags = (cfg->zero >= 2 ? TALLY__MODEL_NO_GRADS : 0) | (cfg->zero == 3 ? TALLY__MODEL_NO_PARAMS : 0);
    tally__mem_source src = {.alloc = sync_grads_alloc, .release = sync_grads_release, .ctx = comm};
    int rc = tally__model_init(m, mc, max_batch, seed, cfg->zero >= 2 ? NULL : &src, flags);
    /* Identical initialisation already follows from the seed; the broadcast makes it so by contract. */
    if (!rc && m->params) rc = tally_ddp_sync_params(comm, m->params, m->nparams);
    if (rc) return rc;
    s->optim_cfg = *optim;
    s->codec_cfg = cfg->codec;
    s->seed = seed;
    return cfg->zero ? tally__sync_open_zero(s, cfg) : tally__sync_open_ddp(s, cfg);
}

void tally__sync_close(tally__sync *s) {
    if (s->ops) s->ops->close(s);
    s->ops = NULL;
}
