/* zero.c - what each rank owns at each stage (stage 0 nothing: every layer whole, as a tail): the pieces and
 * tails, the shard buffers, the optimizer on them, averaging, clipping, and the state dict's access. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/alloc.h"
#include "../core/err.h"
#include "../core/rng.h"
#include "../optim/optim_int.h"
#include "norm.h"
#include "sync_int.h"

static float *zero_alloc(size_t n) { return tally__alloc_zeroed(n * sizeof(float)); }

int tally__sync_layout(tally__sync *s) {
    tally__model *m = s->m;
    if (!(s->layer = calloc((size_t)m->nlayers, sizeof *s->layer)))
        return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory for %d layers", s->rank, m->nlayers);
    s->nlayers = m->nlayers;
    for (int l = 0; l < m->nlayers; l++) {
        tally__sync_layer *L = &s->layer[l];
        L->off = m->offsets[l];
        L->n = m->offsets[l + 1] - m->offsets[l];
        L->piece = s->stage ? L->n / (size_t)s->size : 0;
        L->tail = L->n - L->piece * (size_t)s->size;
        L->shard_off = s->shard_len;
        L->decay_n = L->n;
        s->shard_len += L->piece + L->tail;
        if (L->n > s->largest) s->largest = L->n;
        int rc = tally_optim_init(&L->opt_piece, &s->optim_cfg, L->piece);
        if (!rc) rc = tally_optim_init(&L->opt_tail, &s->optim_cfg, L->tail);
        if (rc) return rc;
    }
    return 0;
}

/* Stage 3 never holds the whole model: each layer is drawn into a gather buffer, as the model would
 * draw it, and this rank keeps its piece and tail. */
static void zero_draw_params(tally__sync *s, uint64_t seed) {
    tally__rng r;
    tally__model_init_rng(&r, seed);
    for (int l = 0; l < s->nlayers; l++) {
        const tally__sync_layer *L = &s->layer[l];
        tally__model_init_layer(s->m, l, s->gathered[0], &r);
        memcpy(s->pshard + L->shard_off, s->gathered[0] + (size_t)s->rank * L->piece, L->piece * sizeof(float));
        memcpy(s->pshard + L->shard_off + L->piece, s->gathered[0] + (size_t)s->size * L->piece,
               L->tail * sizeof(float));
    }
}

int tally__sync_alloc_shards(tally__sync *s, uint64_t seed) {
    int copies = s->overlap ? 2 : 1, bad = 0;
    if (s->stage >= 2) bad |= !(s->gshard = zero_alloc(s->shard_len));
    for (int i = 0; i < copies && s->stage == 2; i++) /* stage 3's gradients go where its parameters were */
        bad |= !(s->staging[i] = zero_alloc(s->largest));
    if (s->stage == 3) bad |= !(s->pshard = zero_alloc(s->shard_len));
    for (int i = 0; i < copies && s->stage == 3; i++) bad |= !(s->gathered[i] = zero_alloc(s->largest));
    if (bad)
        return tally__seterr(TALLY_E_NOMEM, "rank %d: zero stage %d: out of memory for a shard of %zu parameters",
                             s->rank, s->stage, s->shard_len);
    if (s->stage == 3) zero_draw_params(s, seed);
    return 0;
}

void tally__sync_free_shards(tally__sync *s) {
    for (int l = 0; l < s->nlayers; l++) {
        tally_optim_free(&s->layer[l].opt_piece);
        tally_optim_free(&s->layer[l].opt_tail);
    }
    free(s->layer);
    free(s->gshard);
    free(s->pshard);
    for (int i = 0; i < 2; i++) {
        free(s->staging[i]);
        free(s->gathered[i]);
    }
    s->layer = NULL;
    s->gshard = s->pshard = NULL;
    s->staging[0] = s->staging[1] = s->gathered[0] = s->gathered[1] = NULL;
    s->nlayers = 0;
}

void tally__sync_decay_matrices(tally__sync *s) {
    for (int l = 0; l < s->nlayers; l++) {
        const tally__op *op = &s->m->op[tally__model_layer_op(s->m, l)];
        int t = 0; /* the layer's weight tensor: the first whose offset is the layer's */
        while (t < s->m->ntensors && s->m->tensor[t].offset != op->w_off) t++;
        s->layer[l].decay_n = t < s->m->ntensors && s->m->tensor[t].ndim >= 2 ? op->b_off - op->w_off : 0;
    }
}

/* Where this rank's piece and tail of layer l live, for the optimizer. */
typedef struct zero_view {
    float *p_piece, *p_tail, *g_piece, *g_tail;
} zero_view;

static zero_view zero_view_of(const tally__sync *s, int l) {
    const tally__sync_layer *L = &s->layer[l];
    zero_view v;
    size_t mine = L->off + (size_t)s->rank * L->piece, tail = L->off + (size_t)s->size * L->piece;
    if (s->stage == 3) {
        v.p_piece = s->pshard + L->shard_off;
        v.p_tail = v.p_piece + L->piece;
    } else {
        v.p_piece = s->m->params + mine;
        v.p_tail = s->m->params + tail;
    }
    if (s->stage >= 2) {
        v.g_piece = s->gshard + L->shard_off;
        v.g_tail = v.g_piece + L->piece;
    } else {
        v.g_piece = s->m->grads + mine;
        v.g_tail = s->m->grads + tail;
    }
    return v;
}

static void scale(float *x, size_t n, float denom) {
    for (size_t i = 0; i < n; i++) x[i] /= denom;
}

void tally__sync_average(tally__sync *s) {
    const float denom = (float)s->size * (float)s->accum;
    for (int l = 0; l < s->nlayers && s->accum > 1 && !s->averaged; l++) {
        zero_view v = zero_view_of(s, l);
        scale(v.g_piece, s->layer[l].piece, denom);
        scale(v.g_tail, s->layer[l].tail, denom);
    }
    s->averaged = 1;
}

/* Every rank holds whole gradients at stage 0: their norm needs no communication. Else each adds the
 * squares of its pieces (rank 0 also the tails, which every rank holds) and one allreduce sums them. */
int tally__sync_clip_shards(tally__sync *s, float max_norm, double *norm) {
    if (!s->stage) {
        float *g = s->m->grads;
        *norm = tally__grad_clip_to(g, s->m->nparams, tally__grad_sumsq(g, s->m->nparams), max_norm);
        return 0;
    }
    double part = 0;
    for (int l = 0; l < s->nlayers; l++) {
        zero_view v = zero_view_of(s, l);
        part += tally__grad_sumsq(v.g_piece, s->layer[l].piece);
        if (s->rank == 0) part += tally__grad_sumsq(v.g_tail, s->layer[l].tail);
    }
    int rc = tally_allreduce(s->comm, &part, &part, 1, TALLY_F64, TALLY_SUM);
    if (rc) return rc;
    *norm = sqrt(part);
    for (int l = 0; l < s->nlayers; l++) {
        zero_view v = zero_view_of(s, l);
        tally__grad_clip_to(v.g_piece, s->layer[l].piece, part, max_norm);
        tally__grad_clip_to(v.g_tail, s->layer[l].tail, part, max_norm);
    }
    return 0;
}

/* A piece or tail starting at flat element `first` of layer L: the part before L's decay boundary
 * decays, the rest not (bit for bit tally_optim_step when all of it decays). */
static void zero_update(tally_optim *o, float *p, const float *g, size_t n, size_t first, const tally__sync_layer *L,
                        float lr) {
    size_t bound = L->off + L->decay_n, k = bound <= first ? 0 : bound - first < n ? bound - first : n;
    if (k == n) {
        tally_optim_step(o, p, g, lr);
        return;
    }
    tally__optim_step_range(o, p, g, 0, k, lr, 1);
    tally__optim_step_range(o, p, g, k, n, lr, 0);
    tally__optim_count_step(o);
}

void tally__sync_update_layer(tally__sync *s, int l, float lr) {
    tally__sync_layer *L = &s->layer[l];
    zero_view v = zero_view_of(s, l);
    zero_update(&L->opt_piece, v.p_piece, v.g_piece, L->piece, L->off + (size_t)s->rank * L->piece, L, lr);
    zero_update(&L->opt_tail, v.p_tail, v.g_tail, L->tail, L->off + (size_t)s->size * L->piece, L, lr);
}

void tally__sync_clear_step(tally__sync *s) {
    if (s->stage >= 2)
        memset(s->gshard, 0, s->shard_len * sizeof(float));
    else
        memset(s->m->grads, 0, s->m->nparams * sizeof(float));
    s->held[0] = s->held[1] = -1; /* the parameters may have changed */
    s->last_micro = s->accum == 1;
    s->averaged = !s->stage; /* stage 0's buckets divide as they reduce */
}

tally__sync_mem tally__sync_shard_memory(const tally__sync *s) {
    tally__sync_mem b = {0};
    size_t f = sizeof(float);
    b.params = s->stage == 3 ? s->shard_len * f : s->m->params_bytes;
    b.grads = s->stage >= 2 ? s->shard_len * f : s->m->grads_bytes;
    for (int l = 0; l < s->nlayers; l++)
        b.optim += tally_optim_state_bytes(&s->layer[l].opt_piece) + tally_optim_state_bytes(&s->layer[l].opt_tail);
    for (int i = 0; i < 2; i++) b.buffers += ((s->staging[i] ? 1 : 0) + (s->gathered[i] ? 1 : 0)) * s->largest * f;
    if (s->m->tied_copy) b.buffers += tally__model_tied_floats(s->m) * f;
    return b;
}

/* ---- the state dict's access ---- */

static float *state_of(const tally_optim *o, int second) { return second ? o->v : o->m; }

/* A layer's pieces from their owners, then the tail every rank holds alike; a layer with no pieces (every
 * layer at stage 0) is its tail. */
const float *tally__sync_opt_layer(tally__sync *s, int second, int layer, float *buf, int *rc) {
    tally__sync_layer *L = &s->layer[layer];
    *rc = 0;
    if (!L->piece) return state_of(&L->opt_tail, second);
    if ((*rc = tally_allgather(s->comm, state_of(&L->opt_piece, second), buf, L->piece, TALLY_F32))) return NULL;
    if (L->tail) memcpy(buf + (size_t)s->size * L->piece, state_of(&L->opt_tail, second), L->tail * sizeof(float));
    return buf;
}

/* This rank's piece of each layer, then the layer's tail; parameters below stage 3 are whole. */
int tally__sync_load_part(tally__sync *s, int what, int (*read)(void *, size_t, size_t, float *), void *arg) {
    if (what == 0 && s->stage < 3) return read(arg, 0, s->m->nparams, s->m->params);
    int rc = 0;
    for (int l = 0; l < s->nlayers && !rc; l++) {
        tally__sync_layer *L = &s->layer[l];
        float *piece = what == 0 ? s->pshard + L->shard_off : state_of(&L->opt_piece, what == 2);
        float *tail = what == 0 ? piece + L->piece : state_of(&L->opt_tail, what == 2);
        if (L->piece) rc = read(arg, L->off + (size_t)s->rank * L->piece, L->piece, piece);
        if (!rc) rc = read(arg, L->off + (size_t)s->size * L->piece, L->tail, tail);
    }
    return rc;
}

/* Every optimizer counts the same updates: the first stands for all. */
long long tally__sync_opt_step(const tally__sync *s) { return s->layer[0].opt_piece.step; }

void tally__sync_set_opt_step(tally__sync *s, long long step) {
    for (int l = 0; l < s->nlayers; l++) s->layer[l].opt_piece.step = s->layer[l].opt_tail.step = step;
}

void tally__sync_params_changed(tally__sync *s) { s->held[0] = s->held[1] = -1; }
