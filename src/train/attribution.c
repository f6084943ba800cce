/* attribution.c - each rank's data, compute, wait and update time, gathered at the end of a run, and the
 * rank that held the others up, which DDP's equal step times hide. */
#include <stdlib.h>

#include "../core/err.h"
#include "trainer_int.h"

int tally__train_gather_times(train_run *r, tally__train_result *res, int trains) {
    double mine[TALLY__TIMES] = {[TALLY__TIME_DATA] = res->data_s,
                                 [TALLY__TIME_COMPUTE] = res->compute_s,
                                 [TALLY__TIME_WAIT] = res->wait_s,
                                 [TALLY__TIME_UPDATE] = res->update_s,
                                 [TALLY__TIME_STEPS] = trains ? (double)res->steps : 0};
    res->rank_times = malloc(sizeof(double) * TALLY__TIMES * (size_t)r->size);
    if (!res->rank_times) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory", r->rank);
    res->world = r->size;
    return tally_allgather(r->comm, mine, res->rank_times, TALLY__TIMES, TALLY_F64);
}

double tally__train_work_per_step(const double *t) {
    if (!(t[TALLY__TIME_STEPS] > 0)) return 0;
    return (t[TALLY__TIME_DATA] + t[TALLY__TIME_COMPUTE] + t[TALLY__TIME_UPDATE]) / t[TALLY__TIME_STEPS];
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

tally__train_slowest tally__train_find_slowest(const double *rank_times, int world) {
    tally__train_slowest s = {.rank = -1};
    double *work = rank_times && world > 1 ? malloc(sizeof *work * (size_t)world) : NULL;
    if (!work) return s;
    for (int r = 0; r < world; r++) {
        const double *t = rank_times + (size_t)r * TALLY__TIMES;
        if (t[TALLY__TIME_STEPS] > 0 && (s.rank < 0 || tally__train_work_per_step(t) > s.work_s))
            s.rank = r, s.work_s = tally__train_work_per_step(t);
    }
    int n = 0; /* the others that trained */
    for (int r = 0; r < world; r++) {
        const double *t = rank_times + (size_t)r * TALLY__TIMES;
        if (r == s.rank || !(t[TALLY__TIME_STEPS] > 0)) continue;
        work[n++] = tally__train_work_per_step(t);
        s.others_wait += t[TALLY__TIME_WAIT] / t[TALLY__TIME_STEPS];
    }
    if (n < 1) {
        free(work);
        return (tally__train_slowest){.rank = -1};
    }
    qsort(work, (size_t)n, sizeof *work, by_value);
    s.median_s = n % 2 ? work[n / 2] : (work[n / 2 - 1] + work[n / 2]) / 2;
    s.others_wait /= n;
    free(work);
    return s;
}
