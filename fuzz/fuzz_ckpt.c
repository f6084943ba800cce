/* fuzz_ckpt.c - fuzz target for the checkpoint loader: each input is a checkpoint image handed to
 * tally__ckpt_parse, which must reject anything malformed without reading or allocating past it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz.h"
#include "ckpt/ckpt.h"
#include <tally.h>

/* A tensor is had with its own dtype and shape, and refused with any other: one dimension more or less,
 * a dimension changed (the same elements in another shape), another dtype. */
static void fz_shapes(const tally__ckpt *c, const tally__ckpt_tensor *t) {
    const void *p = NULL;
    if (tally__ckpt_get(c, t->name, t->dtype, t->ndim, t->shape, &p) != 0 || p != t->data) {
        fprintf(stderr, "fuzz_ckpt: tensor '%s' refused with its own shape: %s\n", t->name, tally_last_error());
        abort();
    }
    uint64_t other[TALLY__CKPT_MAX_DIMS + 1];
    for (int d = 0; d < t->ndim; d++) other[d] = t->shape[d];
    other[t->ndim] = 1;
    int wrong = tally__ckpt_get(c, t->name, t->dtype, t->ndim + 1, other, &p) != TALLY_E_INVALID &&
                t->ndim < TALLY__CKPT_MAX_DIMS;
    if (t->ndim > 0) {
        wrong |= tally__ckpt_get(c, t->name, t->dtype, t->ndim - 1, other + 1, &p) != TALLY_E_INVALID;
        other[0] = t->shape[0] ^ 1;
        wrong |= tally__ckpt_get(c, t->name, t->dtype, t->ndim, other, &p) != TALLY_E_INVALID;
    }
    tally_dtype dt = t->dtype == TALLY_F32 ? TALLY_F64 : TALLY_F32;
    wrong |= tally__ckpt_get(c, t->name, dt, t->ndim, t->shape, &p) != TALLY_E_INVALID;
    if (wrong) {
        fprintf(stderr, "fuzz_ckpt: tensor '%s' had with a shape or dtype not its own\n", t->name);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tally__ckpt *c = NULL;
    int rc = tally__ckpt_parse(data, size, "fuzz-input", &c);
    if (rc > 0 || (rc == 0 && !c)) {
        fprintf(stderr, "fuzz_ckpt: tally__ckpt_parse returned %d with %s checkpoint\n", rc, c ? "a" : "no");
        abort();
    }
    if (rc == 0) {
        for (int i = 0; i < tally__ckpt_count(c); i++) fz_shapes(c, tally__ckpt_at(c, i));
        tally__ckpt_close(c);
    }
    return 0;
}
