/* sampler.c - the distributed sampler: one permutation per epoch drawn from (seed, epoch) alone, so
 * every rank computes the same one without talking, and rank r keeps every size-th position of it. */
#include <tally/data.h>

#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../core/rng.h"

TALLY_API int tally_sampler_init(tally_sampler *s, size_t n, int rank, int size, uint64_t seed, int shuffle) {
    tally__clearerr();
    if (!s) return tally__seterr(TALLY_E_INVALID, "tally_sampler_init: sampler is NULL");
    memset(s, 0, sizeof *s);
    if (size < 1 || rank < 0 || rank >= size)
        return tally__seterr(TALLY_E_INVALID, "tally_sampler_init: rank %d is not in [0, %d)", rank, size);
    if (n > SIZE_MAX / sizeof *s->perm)
        return tally__seterr(TALLY_E_INVALID, "tally_sampler_init: data set size %zu is too large", n);
    s->perm = malloc(n ? n * sizeof *s->perm : 1);
    if (!s->perm) return tally__seterr(TALLY_E_NOMEM, "tally_sampler_init: out of memory for %zu indices", n);
    s->n = n;
    s->rank = rank;
    s->size = size;
    s->seed = seed;
    s->shuffle = shuffle;
    tally_sampler_set_epoch(s, 0); /* usable at once, as epoch 0 */
    return 0;
}

TALLY_API void tally_sampler_set_epoch(tally_sampler *s, int epoch) {
    s->epoch = epoch;
    for (size_t i = 0; i < s->n; i++) s->perm[i] = i;
    if (!s->shuffle) return;
    tally__rng r;
    tally__rng_seed(&r, s->seed, (uint64_t)(int64_t)epoch);
    for (size_t i = s->n; i > 1; i--) { /* Fisher-Yates: every permutation equally likely */
        size_t j = (size_t)tally__rng_below(&r, i);
        size_t t = s->perm[i - 1];
        s->perm[i - 1] = s->perm[j];
        s->perm[j] = t;
    }
}

TALLY_API size_t tally_sampler_len(const tally_sampler *s) { return s->n / (size_t)s->size; }

/* An i past the end gives SIZE_MAX rather than reading outside perm. */
TALLY_API size_t tally_sampler_index(const tally_sampler *s, size_t i) {
    if (i >= tally_sampler_len(s)) return SIZE_MAX;
    return s->perm[i * (size_t)s->size + (size_t)s->rank];
}

TALLY_API void tally_sampler_free(tally_sampler *s) {
    if (!s) return;
    free(s->perm);
    memset(s, 0, sizeof *s);
}
