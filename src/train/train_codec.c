/* train_codec.c - compression's policy in a training run: a 16-bit sum that overflowed counts as a
 * non-finite gradient, which --nan then handles (skip the step, or stop). */
#include <stdio.h>

#include "../core/err.h"
#include "../core/log.h"
#include "trainer_int.h"

void tally__train_codec_check_overflow(train_run *r, long step) {
    int bucket = tally__sync_overflow(&r->sync);
    if (bucket == -1) return;
    r->guard.bad = 1;
    char where[48] = "a layer";
    if (bucket >= 0) snprintf(where, sizeof where, "bucket %d", bucket);
    if (bucket >= 0 && r->rank != 0) return; /* every rank has the same sums: one says so */
    tally__log_notice("step %ld: the %s sum of %s overflowed (a value past 65504): counted as a non-finite "
                      "gradient (--nan decides: skip the step, or stop); bf16 has f32's range",
                      step + 1, r->cfg->sync.codec.kind == TALLY__CODEC_FP16 ? "fp16" : "16-bit", where);
}
