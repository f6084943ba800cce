/* state.c - what components' loads share: a string entry that must hold this run's value, a one-element
 * integer entry, float entries whose values must all be finite, and per-rank vectors loaded at any size. */
#include "state.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../core/err.h"

int tally__state_string_is(const tally__ckpt *ck, const char *name, const char *want, int rank, const char *what) {
    const tally__ckpt_tensor *t = tally__ckpt_find(ck, name);
    if (!t || t->dtype != TALLY_U8)
        return tally__seterr(TALLY_E_INVALID, "rank %d: checkpoint %s has no %s ('%s')", rank, tally__ckpt_label(ck),
                             what, name);
    if (t->bytes == strlen(want) && !memcmp(t->data, want, t->bytes)) return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "rank %d: checkpoint %s was written for %s '%.*s', and this run has '%s': resume with the "
                         "settings that wrote it, or use another --ckpt directory",
                         rank, tally__ckpt_label(ck), what, (int)(t->bytes < 200 ? t->bytes : 200),
                         (const char *)t->data, want);
}

int tally__state_i64(const tally__ckpt *ck, const char *name, int64_t *v) {
    const void *p;
    static const uint64_t one[1] = {1};
    int rc = tally__ckpt_get(ck, name, TALLY_I64, 1, one, &p);
    if (!rc) memcpy(v, p, sizeof *v);
    return rc;
}

/* The index of the first element of p[0..n) whose exponent bits are all ones (NaN, +-Inf), or n. */
static size_t first_nonfinite(const float *p, size_t n) {
    for (size_t i = 0; i < n; i += 4096) { /* blocks the compiler vectorises, then the one that has it */
        size_t end = n - i < 4096 ? n : i + 4096;
        uint32_t any = 0;
        for (size_t k = i; k < end; k++) {
            uint32_t bits;
            memcpy(&bits, p + k, sizeof bits);
            any |= (bits & 0x7f800000u) == 0x7f800000u;
        }
        if (any)
            for (size_t k = i; k < end; k++)
                if (!isfinite(p[k])) return k;
    }
    return n;
}

int tally__state_f32(const tally__ckpt *ck, const char *name, int ndim, const uint64_t *shape, size_t first,
                     size_t count, const float **data) {
    const void *p;
    int rc = tally__ckpt_get(ck, name, TALLY_F32, ndim, shape, &p);
    if (rc) return rc;
    const float *f = p;
    size_t total = 1;
    for (int d = 0; d < ndim; d++) total *= (size_t)shape[d]; /* the file holds them: no overflow */
    if (first > total || count > total - first)
        return tally__seterr(TALLY_E_INVALID, "tally__state_f32: elements %zu..%zu of '%s', which has %zu", first,
                             first + count, name, total);
    size_t bad = first + first_nonfinite(f + first, count);
    if (bad == first + count) {
        *data = f;
        return 0;
    }
    size_t idx[TALLY__CKPT_MAX_DIMS], rest = bad;
    for (int d = ndim - 1; d >= 0; d--) { /* row-major: the last dimension varies fastest */
        idx[d] = rest % (size_t)shape[d];
        rest /= (size_t)shape[d];
    }
    char at[160] = "";
    size_t len = 0;
    for (int d = 0; d < ndim; d++)
        len += (size_t)snprintf(at + len, sizeof at - len, "%s%zu%s", d ? ", " : " at [", idx[d],
                                d == ndim - 1 ? "]" : "");
    return tally__seterr(TALLY_E_NONFINITE,
                         "checkpoint %s: tensor '%s' holds %s%s (element %zu of %zu): a checkpoint of values that "
                         "are not numbers is not loaded; resume from an earlier checkpoint, or train again",
                         tally__ckpt_label(ck), name,
                         isnan(f[bad]) ? "NaN"
                         : f[bad] > 0  ? "+Inf"
                                       : "-Inf",
                         at, bad, total);
}

int tally__state_f32_per_rank(const tally__ckpt *ck, const char *prefix, const char *suffix, int saved, int rank,
                              int size, size_t n, float *dst) {
    char name[160];
    const uint64_t flat[1] = {n};
    for (int k = 0; k < saved; k++) {
        if (saved == size && k != rank) continue;
        const float *v;
        snprintf(name, sizeof name, "%s%d%s", prefix, k, suffix);
        int rc = tally__state_f32(ck, name, 1, flat, 0, n, &v);
        if (rc) return rc;
        for (size_t i = 0; i < n; i++) dst[i] = saved == size ? v[i] : (k ? dst[i] : 0.0f) + v[i] / (float)saved;
    }
    return 0;
}
