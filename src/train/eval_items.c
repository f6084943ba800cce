/* eval_items.c - scoring held-out items shared out by rank, the loop under both evaluations: the data
 * sets' test samples (run_common.c) and the text's validation windows (train_text.c). */
#include <tally.h>

#include "trainer_int.h"

int tally__train_eval_items(train_run *r, size_t count, tally__train_eval_fill fill, double sums[3]) {
    int B = r->cfg->batch;
    size_t *items = r->idx;
    sums[0] = sums[1] = sums[2] = 0;
    size_t per_rank = (count + (size_t)r->size - 1) / (size_t)r->size, batches = (per_rank + (size_t)B - 1) / (size_t)B;
    for (size_t k = 0, i = (size_t)r->rank; k < batches; k++) {
        int n = 0;
        for (; n < B && i < count; n++, i += (size_t)r->size) items[n] = i;
        int real = n;
        if (!n) items[n++] = 0;
        fill(r, items, n);
        float loss;
        int rc = tally__model_forward(&r->model, r->xb, r->yb, r->tb, n, &r->hooks, &loss);
        if (rc) return rc;
        if (!real) continue;
        sums[0] += tally__model_score(&r->model, r->yb, r->tb, n);
        sums[1] += (double)loss * n;
        sums[2] += n;
    }
    int rc = tally__sync_is_open(&r->sync) ? tally__sync_drain(&r->sync) : 0; /* async runs have no engine */
    return rc ? rc : tally_allreduce(r->comm, sums, sums, 3, TALLY_F64, TALLY_SUM);
}
