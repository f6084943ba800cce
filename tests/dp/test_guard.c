/* test_guard.c - numerical faults and diverged replicas: the finite scan on every kind of non-finite
 * value, the global norm and its clipping against a reference, a NaN on one rank skipping the step on
 * every rank with parameters unchanged (all ZeRO stages), --nan error, and --check-replicas naming the
 * rank and tensor of a flipped bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "dp/guard.h"
#include "dp/norm.h"
#include "train_runner.h"

static void test_all_finite(void) {
    static float v[1037];
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    const size_t sizes[] = {0, 1, 15, 16, 17, 33, 1037};
    for (size_t i = 0; i < 1037; i++) v[i] = (i % 3 ? 1e-40f : -3.4e38f) * (i % 2 ? 1 : -1); /* subnormal, huge */
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        TH_CHECK(tally__all_finite(v, n), "finite values of length %zu taken for non-finite", n);
        for (size_t at = 0; at < n; at += (n > 40 ? 37 : 1))
            for (int b = 0; b < 4; b++) {
                float keep = v[at];
                v[at] = bad[b];
                TH_CHECK(!tally__all_finite(v, n), "length %zu: %f at %zu not found", n, bad[b], at);
                v[at] = keep;
            }
    }
}

/* The sum of squares against one in long double, and the clipped values against each element scaled
 * in double, at every length class of the kernels' lanes. */
static void test_norm(void) {
    static float v[1037], c[1037];
    const size_t sizes[] = {0, 1, 7, 8, 15, 16, 17, 33, 1037};
    for (size_t i = 0; i < 1037; i++) v[i] = (float)((i * 7919 % 1000) - 500) * (i % 5 ? 1e-3f : 1e3f);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        long double want = 0;
        for (size_t i = 0; i < n; i++) want += (long double)v[i] * v[i];
        double got = tally__grad_sumsq(v, n);
        TH_CHECK(fabsl(got - want) <= 1e-12L * want, "sum of squares of %zu: %.17g, want %.17Lg", n, got, want);
        memcpy(c, v, n * sizeof *c);
        double norm = tally__grad_clip_to(c, n, got, 1.0f), coef = 1.0 / (norm + 1e-6);
        TH_CHECK(norm == sqrt(got), "length %zu: norm %.17g, want %.17g", n, norm, sqrt(got));
        for (size_t i = 0; i < n; i++)
            if (c[i] != (float)(v[i] * coef)) {
                TH_CHECK(0, "length %zu: element %zu clipped to %.9g, want %.9g", n, i, c[i], (float)(v[i] * coef));
                break;
            }
        memcpy(c, v, n * sizeof *c);
        tally__grad_clip_to(c, n, got, (float)(sqrt(got) * 2 + 1)); /* under the maximum: unchanged */
        TH_CHECK(!memcmp(c, v, n * sizeof *c), "length %zu: a norm under the maximum changed the values", n);
    }
}

static tally__train_cfg gcfg(int zero, long steps) {
    tally__train_cfg c = tr_small_cfg(2048, steps, 5);
    c.sync.zero = zero;
    tally_optim_cfg_default(&c.opt.optim, zero == 2 ? TALLY_OPTIM_ADAMW : TALLY_OPTIM_SGD);
    return c;
}

static float g_before[TR_MAX_PARAMS], g_after[TR_MAX_PARAMS], g_clean[TR_MAX_PARAMS];

/* A NaN fed to one rank at step K: every rank skips step K, so after K steps the parameters are those
 * after K - 1; the run then goes on with finite values. */
static void test_skip(int zero, int n, int nan_rank) {
    const int K = 6;
    char what[80];
    snprintf(what, sizeof what, "zero %d n=%d nan on rank %d", zero, n, nan_rank);
    tally__train_cfg before = gcfg(zero, K - 1), after = gcfg(zero, K), longer = gcfg(zero, K + 4);
    const tally__train_faults nan = {.nan_rank = nan_rank, .nan_step = K};
    if (tr_train_on("shm", n, &before, g_before, what) || tr_train_faulty("shm", n, &after, &nan, g_after, what))
        return;
    size_t np = tr->res[0].nparams;
    TH_CHECK(!memcmp(g_before, g_after, np * sizeof(float)), "%s: the skipped step changed the parameters", what);
    for (int r = 0; r < n; r++)
        TH_CHECK(tr->res[r].skipped_steps == 1, "%s: rank %d skipped %ld steps", what, r, tr->res[r].skipped_steps);
    if (tr_train_faulty("shm", n, &longer, &nan, g_after, what)) return;
    TH_CHECK(tally__all_finite(g_after, np), "%s: parameters not finite after the skipped step", what);
    tally__train_cfg clean = gcfg(zero, K + 4);
    if (tr_train_on("shm", n, &clean, g_clean, what)) return;
    TH_CHECK(memcmp(g_clean, g_after, np * sizeof(float)) != 0, "%s: skipping a step changed nothing", what);
}

static void test_nan_error(void) {
    char err[4096];
    char *args[] = {"tally",        "train", "-n",      "2",     "--data",    "synthetic:4096",
                    "--hidden",     "16",    "--steps", "10",    "--no-eval", "--quiet",
                    "--inject-nan", "1:4",   "--nan",   "error", NULL};
    int rc = tr_run_tally(args, err, sizeof err);
    TH_CHECK(rc != 0 && strstr(err, "step 4") && strstr(err, "on rank 1") && strstr(err, "--nan error"),
             "--nan error: exit %d, stderr '%s'", rc, err);
    char *skip[] = {"tally",          "train",    "-n",           "2",       "--data",
                    "synthetic:4096", "--hidden", "16",           "--steps", "10",
                    "--no-eval",      "--quiet",  "--inject-nan", "0:3",     NULL};
    rc = tr_run_tally(skip, err, sizeof err);
    TH_CHECK(rc == 0 && strstr(err, "step 3") && strstr(err, "rank 0") && strstr(err, "skips this step"),
             "--nan skip: exit %d, stderr '%s'", rc, err);
}

/* A bit flipped on rank 2 after step 10 is found by the check at step 10 (every 5), named with the
 * rank and the tensor; with 2 ranks both are named and the message says the check cannot tell more. */
static void test_replicas(void) {
    char err[8192];
    char *three[] = {"tally",
                     "train",
                     "-n",
                     "3",
                     "--data",
                     "synthetic:4096",
                     "--hidden",
                     "16",
                     "--steps",
                     "30",
                     "--no-eval",
                     "--quiet",
                     "--check-replicas",
                     "5",
                     "--inject-flip",
                     "2:10",
                     NULL};
    int rc = tr_run_tally(three, err, sizeof err);
    TH_CHECK(rc != 0 && strstr(err, "after step 10") && strstr(err, "rank 2's parameters differ") &&
                 strstr(err, "'fc1.weight'"),
             "flip on rank 2: exit %d, stderr '%s'", rc, err);
    char *clean[] = {"tally", "train",   "-n", "3",         "--data",  "synthetic:4096",   "--hidden",
                     "16",    "--steps", "30", "--no-eval", "--quiet", "--check-replicas", "5",
                     NULL};
    rc = tr_run_tally(clean, err, sizeof err);
    TH_CHECK(rc == 0, "healthy replicas reported: exit %d, stderr '%s'", rc, err);
    char *two[] = {"tally",
                   "train",
                   "-n",
                   "2",
                   "--data",
                   "synthetic:4096",
                   "--hidden",
                   "16",
                   "--steps",
                   "12",
                   "--no-eval",
                   "--quiet",
                   "--check-replicas",
                   "3",
                   "--inject-flip",
                   "1:7",
                   NULL};
    rc = tr_run_tally(two, err, sizeof err);
    TH_CHECK(rc != 0 && strstr(err, "after step 9") && strstr(err, "rank 1's parameters differ from rank 0's") &&
                 strstr(err, "cannot tell"),
             "flip on rank 1 of 2: exit %d, stderr '%s'", rc, err);
    char *z3[] = {"tally",  "train",   "-n", "2",         "--data",  "synthetic:4096",   "--hidden",
                  "16",     "--steps", "3",  "--no-eval", "--quiet", "--check-replicas", "3",
                  "--zero", "3",       NULL};
    rc = tr_run_tally(z3, err, sizeof err);
    TH_CHECK(rc != 0 && strstr(err, "--zero 3"), "--check-replicas with --zero 3: exit %d, stderr '%s'", rc, err);
}

int main(void) {
    if (th_quick()) test_all_finite(), test_norm();
    /* A skipped step at stages 0 and 3 in the quick tier, at 1 and 2 and on 3 ranks in the long one. */
    for (int zero = 0; zero <= 3; zero++)
        if ((zero == 0 || zero == 3 ? th_quick() : th_long()) && (!th_light() || zero == 0 || zero == 3))
            test_skip(zero, zero == 3 ? 3 : 2, zero % 2);
    if (!th_light() && th_long()) test_skip(0, 3, 2);
    if (th_quick()) test_nan_error();
    if (th_long()) test_replicas();
    return th_verdict("test_guard");
}
