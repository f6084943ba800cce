/* guard.c - non-finite gradients found layer by layer as backward completes them, one allreduce of
 * every rank's flag to skip (or refuse) the step together, and the periodic replica hash comparison. */
#include "guard.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../core/log.h"

const char *tally__nan_policy_name(tally__nan_policy p) {
    return p == TALLY__NAN_ERROR ? "error" : p == TALLY__NAN_IGNORE ? "ignore" : "skip";
}

int tally__nan_policy_parse(const char *name) {
    if (!strcmp(name, "skip")) return TALLY__NAN_SKIP;
    if (!strcmp(name, "error")) return TALLY__NAN_ERROR;
    if (!strcmp(name, "ignore")) return TALLY__NAN_IGNORE;
    return -1;
}

int tally__all_finite(const float *p, size_t n) {
    /* x * 0 is 0 for every finite x and NaN otherwise; independent lanes let the compiler vectorise
     * without reassociating, so the scan costs about one read of the gradients. */
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += p[i + j] * 0.0f;
    float s = 0.0f;
    for (int j = 0; j < 16; j++) s += acc[j];
    for (; i < n; i++) s += p[i] * 0.0f;
    return s == 0.0f;
}

static int guard_after_backward(void *arg, int layer) {
    tally__guard *g = arg;
    const tally__model *m = g->m;
    const tally__op *op = &m->op[tally__model_layer_op(m, layer)];
    size_t nw = op->b_off - op->w_off, nb = m->offsets[layer + 1] - m->offsets[layer] - nw;
    if (!g->bad && !(tally__all_finite(op->dw, nw) && tally__all_finite(op->db, nb))) g->bad = 1;
    return g->inner.after_backward ? g->inner.after_backward(g->inner.arg, layer) : 0;
}

static int guard_before_forward(void *arg, int layer) {
    tally__guard *g = arg;
    return g->inner.before_forward(g->inner.arg, layer);
}

static int guard_before_backward(void *arg, int layer) {
    tally__guard *g = arg;
    return g->inner.before_backward(g->inner.arg, layer);
}

int tally__guard_init(tally__guard *g, tally_comm *comm, tally__model *m, tally__nan_policy policy,
                      tally__model_hooks *hooks) {
    memset(g, 0, sizeof *g);
    g->policy = policy;
    g->m = m;
    g->rank = tally_comm_rank(comm);
    g->size = tally_comm_size(comm);
    if (policy == TALLY__NAN_IGNORE) return 0;
    if (!(g->flags = calloc((size_t)g->size, 1)))
        return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", g->rank);
    g->inner = *hooks;
    *hooks = (tally__model_hooks){.arg = g,
                                  .before_forward = g->inner.before_forward ? guard_before_forward : NULL,
                                  .before_backward = g->inner.before_backward ? guard_before_backward : NULL,
                                  .after_backward = guard_after_backward};
    return 0;
}

void tally__guard_free(tally__guard *g) {
    free(g->flags);
    g->flags = NULL;
}

/* "1, 3" from the flags; returns how many ranks are set. */
static int guard_list(const tally__guard *g, char *buf, size_t n) {
    int count = 0;
    size_t len = 0;
    buf[0] = '\0';
    for (int r = 0; r < g->size; r++) {
        if (!g->flags[r]) continue;
        if (len < n) len += (size_t)snprintf(buf + len, n - len, "%s%d", count ? ", " : "", r);
        count++;
    }
    return count;
}

int tally__guard_agree(tally__guard *g, tally_comm *comm, long step, int *skip) {
    *skip = 0;
    if (g->policy == TALLY__NAN_IGNORE) return 0;
    memset(g->flags, 0, (size_t)g->size);
    g->flags[g->rank] = (unsigned char)g->bad;
    int rc = tally_allreduce(comm, g->flags, g->flags, (size_t)g->size, TALLY_U8, TALLY_MAX);
    if (rc) return rc;
    int count = guard_list(g, g->bad_ranks, sizeof g->bad_ranks);
    if (!count) return 0;
    if (g->policy == TALLY__NAN_ERROR)
        return tally__seterr(TALLY_E_NONFINITE,
                             "rank %d: step %ld: a gradient is NaN or Inf on rank%s %s; stopping (--nan error). "
                             "Lower the learning rate, check the data, or use --nan skip",
                             g->rank, step + 1, count > 1 ? "s" : "", g->bad_ranks);
    g->skipped++;
    *skip = 1;
    if (g->rank == 0)
        tally__log_notice("step %ld: a gradient is NaN or Inf on rank%s %s; every rank skips this step (parameters "
                          "and optimizer state unchanged)",
                          step + 1, count > 1 ? "s" : "", g->bad_ranks);
    return 0;
}

/* ---- replicas ---- */

#define GUARD_HASH 8

static int guard_hash_tensors(const tally__model *m, unsigned char *out) {
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int ok = md != NULL;
    for (int t = 0; t < m->ntensors && ok; t++) {
        unsigned char full[EVP_MAX_MD_SIZE];
        unsigned int len = 0;
        ok = EVP_DigestInit_ex(md, EVP_sha256(), NULL) &&
             EVP_DigestUpdate(md, m->tensor[t].param, m->tensor[t].count * sizeof(float)) &&
             EVP_DigestFinal_ex(md, full, &len);
        if (ok) memcpy(out + (size_t)t * GUARD_HASH, full, GUARD_HASH);
    }
    EVP_MD_CTX_free(md);
    return ok ? 0 : -1;
}

/* The value most ranks hold for tensor t (ties: the lowest rank's). */
static int guard_majority(const unsigned char *all, int size, int nt, int t) {
    int best = 0, best_votes = 0;
    for (int a = 0; a < size; a++) {
        int votes = 0;
        for (int b = 0; b < size; b++)
            votes +=
                !memcmp(all + ((size_t)a * nt + t) * GUARD_HASH, all + ((size_t)b * nt + t) * GUARD_HASH, GUARD_HASH);
        if (votes > best_votes) best = a, best_votes = votes;
    }
    return best;
}

static int guard_report(const tally__model *m, const unsigned char *all, int rank, int size, long step) {
    int nt = m->ntensors, first_rank = -1, first_tensor = -1, ref = 0, differing = 0;
    for (int t = 0; t < nt; t++) {
        int maj = guard_majority(all, size, nt, t);
        for (int r = 0; r < size; r++) {
            if (!memcmp(all + ((size_t)r * nt + t) * GUARD_HASH, all + ((size_t)maj * nt + t) * GUARD_HASH, GUARD_HASH))
                continue;
            if (first_rank < 0) first_rank = r, first_tensor = t, ref = maj;
            differing++;
        }
    }
    if (first_rank < 0) return 0;
    const tally__tensor *T = &m->tensor[first_tensor];
    return tally__seterr(TALLY_E_CORRUPT,
                         "rank %d: replica check after step %ld: rank %d's parameters differ from rank %d's in "
                         "tensor '%s' (%zu values)%s%s; the replicas diverged (a flipped bit in memory, or a "
                         "non-deterministic update): restart from the last checkpoint",
                         rank, step + 1, first_rank, ref, T->name, T->count,
                         differing > 1 ? " and in other tensors or ranks" : "",
                         size == 2 ? " (with 2 ranks the check cannot tell which of the two is wrong)" : "");
}

int tally__guard_check_replicas(tally_comm *comm, const tally__model *m, long step) {
    int rank = tally_comm_rank(comm), size = tally_comm_size(comm), nt = m->ntensors;
    size_t per = (size_t)nt * GUARD_HASH;
    unsigned char *all = malloc(per * (size_t)size);
    if (!all) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", rank);
    int rc = guard_hash_tensors(m, all + per * (size_t)rank)
                 ? tally__seterr(TALLY_E_SYSTEM, "rank %d: SHA-256 of the parameters failed", rank)
                 : 0;
    unsigned char *mine = malloc(per ? per : 1);
    if (!rc && !mine) rc = tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", rank);
    if (!rc) {
        memcpy(mine, all + per * (size_t)rank, per);
        rc = tally_allgather(comm, mine, all, per, TALLY_U8);
    }
    if (!rc) rc = guard_report(m, all, rank, size, step);
    free(mine);
    free(all);
    return rc;
}
