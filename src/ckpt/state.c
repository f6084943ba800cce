/* state.c - what components' loads share: a string entry that must hold this run's value, and a
 * one-element integer entry. */
#include "state.h"

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
