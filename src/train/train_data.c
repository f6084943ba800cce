/* train_data.c - which data a training run uses: Fashion-MNIST (the Debian package or a directory),
 * the synthetic stand-in (asked for, or when the default set is absent), or the least-squares set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/err.h"
#include "trainer.h"

#define LINEAR_NOISE  0.1f
#define TRAIN_STR_(x) #x
#define TRAIN_STR(x)  TRAIN_STR_(x) /* a macro's value as a string literal */

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Moves the last `tail` samples of `all` into `test`: a held-out set from the same generating weights. */
static int split_tail(tally_dataset *all, size_t tail, tally_dataset *test) {
    *test = *all;
    test->n = tail;
    test->x = malloc(tail * (size_t)all->dim * sizeof(float));
    test->t = malloc(tail * (size_t)all->tdim * sizeof(float));
    test->y = NULL;
    if (!test->x || !test->t) {
        free(test->x);
        free(test->t);
        memset(test, 0, sizeof *test);
        return tally__seterr(TALLY_E_NOMEM, "linear data: out of memory");
    }
    all->n -= tail;
    memcpy(test->x, all->x + all->n * all->dim, tail * (size_t)all->dim * sizeof(float));
    memcpy(test->t, all->t + all->n * all->tdim, tail * (size_t)all->tdim * sizeof(float));
    return 0;
}

static int train_linear_data(const tally__train_cfg *cfg, tally_dataset *train, tally_dataset *test, float *true_w) {
    size_t n = cfg->data.linear_samples ? cfg->data.linear_samples : TALLY__TRAIN_LINEAR_SAMPLES_DEFAULT,
           held_out = n / 8 ? n / 8 : 1;
    int rc = tally_dataset_linear(cfg->seed, n + held_out, TALLY__TRAIN_LINEAR_FEATURES, LINEAR_NOISE, true_w, train);
    if (!rc && (rc = split_tail(train, held_out, test))) tally_dataset_free(train);
    return rc;
}

int tally__train_data(const tally__train_cfg *cfg, int rank, tally_dataset *train, tally_dataset *test, float *true_w,
                      const char **name) {
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    const char *want = cfg->data.source ? cfg->data.source : TALLY__TRAIN_DATA_DEFAULT;
    const tally__model_info *info = tally__model_info_of(cfg->model.kind);
    if (info && info->data == TALLY__DATA_LEAST_SQUARES) {
        if (strcmp(want, "synthetic") && strcmp(want, "fashion-mnist") && strcmp(want, "linear"))
            return tally__seterr(TALLY_E_INVALID,
                                 "rank %d: the %s model trains on its own least-squares data; drop --data %s", rank,
                                 info->name, want);
        *name = "least-squares (" TRAIN_STR(TALLY__TRAIN_LINEAR_FEATURES) " features)";
        return train_linear_data(cfg, train, test, true_w);
    }
    size_t ntrain = cfg->data.synthetic_train ? cfg->data.synthetic_train : TALLY__TRAIN_SYNTHETIC_TRAIN_DEFAULT;
    size_t ntest = cfg->data.synthetic_test ? cfg->data.synthetic_test : TALLY__TRAIN_SYNTHETIC_TEST_DEFAULT;
    if (!strcmp(want, "synthetic")) {
        *name = "synthetic";
        return tally_dataset_synthetic(cfg->seed, ntrain, ntest, train, test);
    }
    if (!strcmp(want, "fashion-mnist")) {
        if (!is_dir(TALLY_FASHION_MNIST_DIR)) {
            if (rank == 0)
                fprintf(stderr,
                        "tally train: %s is absent (Debian's dataset-fashion-mnist package provides it); "
                        "training on synthetic data instead\n",
                        TALLY_FASHION_MNIST_DIR);
            *name = "synthetic (fashion-mnist absent)";
            return tally_dataset_synthetic(cfg->seed, ntrain, ntest, train, test);
        }
        *name = "fashion-mnist";
        return tally_dataset_load_mnist(TALLY_FASHION_MNIST_DIR, train, test);
    }
    *name = want;
    return tally_dataset_load_mnist(want, train, test);
}
