/* test_local_sgd.c - --local-steps (DiLoCo): H = 1 with plain averaging is synchronous SGD, and with
 * DiLoCo's outer step it is synchronous Nesterov SGD at the product of the rates; rounds, bytes and
 * compression; a stopped run resumes bit-identical (every rank's optimizer state); checkpoints load at any
 * world size and between sync and local; refusals and a diverged replica get their message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "train_runner.h"

static char g_dir[256];
static float g_a[TR_MAX_PARAMS], g_b[TR_MAX_PARAMS];

/* Plain SGD (no momentum) on the tests' small MLP: what H = 1 can be compared with exactly. */
static tally__train_cfg lcfg(long steps, long H) {
    tally__train_cfg c = tr_small_cfg(2048, steps, 11);
    c.opt.optim.momentum = 0;
    c.opt.lr = 0.05f;
    c.epochs = 3;
    c.local.steps = H;
    return c;
}

/* Averaging every step's parameters is averaging every step's gradients, for plain SGD. */
static void test_h1_is_sync(int n) {
    char what[64];
    snprintf(what, sizeof what, "H=1 plain averaging n=%d", n);
    tally__train_cfg s = lcfg(40, 0), l = lcfg(40, 1);
    l.local.outer_lr = 1;
    l.local.outer_momentum = 0;
    if (tr_train_on("shm", n, &s, g_a, what) || tr_train_on("shm", n, &l, g_b, what)) return;
    double d = tr_rel_l2(g_b, g_a, tr->res[0].nparams);
    TH_CHECK(d < 1e-5, "%s: %g from synchronous SGD's parameters", what, d);
    TH_CHECK(tr->res[0].outer_rounds == 40 && tr->res[0].local_steps == 1, "%s: %ld rounds", what,
             tr->res[0].outer_rounds);
}

/* With inner SGD at lr a, the outer change is a x the mean gradient, and the outer Nesterov step at (lr,
 * mu) is torch.optim.SGD's Nesterov on the mean gradient at lr a x outer lr. */
static void test_nesterov(void) {
    const char *what = "H=1 outer Nesterov";
    tally__train_cfg s = lcfg(40, 0), l = lcfg(40, 1);
    s.opt.optim.momentum = 0.9f;
    s.opt.optim.nesterov = 1;
    s.opt.lr = 0.05f * 0.7f;
    l.local.outer_lr = 0.7;
    l.local.outer_momentum = 0.9;
    if (tr_train_on("shm", 2, &s, g_a, what) || tr_train_on("shm", 2, &l, g_b, what)) return;
    double d = tr_rel_l2(g_b, g_a, tr->res[0].nparams);
    TH_CHECK(d < 1e-4, "%s: %g from synchronous Nesterov SGD's parameters", what, d);
}

/* Rounds of H steps, a short one at the epoch's end (2048 samples / (8 x 2) = 128 steps) and the last;
 * bytes per step H times fewer than an allreduce a step, int8 about 4x fewer again, fp16 2x; no other
 * traffic between the ranks. */
static void test_rounds_and_bytes(void) {
    const long H = 5, steps = 140; /* rounds: 25 to step 125, one at 128, then 133, 138 and 140 */
    double f32_round = 0;
    const char *names[] = {"none", "fp16", "int8"};
    for (int k = 0; k < 3; k++) {
        char what[64];
        snprintf(what, sizeof what, "H=%ld --outer-compress %s", H, names[k]);
        tally__train_cfg l = lcfg(steps, H);
        l.local.compress = k;
        l.opt.optim.momentum = 0.9f;
        if (tr_train_on("shm", 2, &l, g_b, what)) return;
        const tally__train_result *r = &tr->res[0];
        TH_CHECK(r->outer_rounds == 29, "%s: %ld rounds, want 29", what, r->outer_rounds);
        /* Between averagings nothing crosses the world: not a NaN flag, not a norm. */
        TH_CHECK(r->bytes_sent == r->outer_bytes, "%s: %llu bytes sent in the steps, %llu of them averaging", what,
                 r->bytes_sent, r->outer_bytes);
        double per_round = (double)r->outer_bytes / (double)r->outer_rounds;
        if (k == 0) {
            f32_round = per_round;
            TH_CHECK(fabs(per_round - (double)r->f32_bytes_step) < 0.01 * per_round,
                     "%s: %g bytes a round, an f32 allreduce %llu", what, per_round, r->f32_bytes_step);
        } else {
            double want = k == 1 ? 0.5 : 0.25, got = per_round / f32_round;
            TH_CHECK(got > want * 0.9 && got < want * 1.15, "%s: %.3f of f32's bytes a round, want about %.2f", what,
                     got, want);
        }
    }
}

/* Compressed averaging stays near the exact one (H = 1 plain averaging against synchronous SGD). */
static void test_compressed_close(void) {
    tally__train_cfg s = lcfg(40, 0);
    if (tr_train_on("shm", 2, &s, g_a, "sync")) return;
    /* int8's step is 1/127 of a block's largest change, and 40 rounds of it go through the training's
     * own dynamics; test_int8 bounds the averaging itself. */
    const double bound[3] = {0, 1e-3, 5e-2};
    for (int k = 1; k <= 2; k++) {
        tally__train_cfg l = lcfg(40, 1);
        l.local.outer_lr = 1;
        l.local.outer_momentum = 0;
        l.local.compress = k;
        if (tr_train_on("shm", 2, &l, g_b, k == 1 ? "fp16 H=1" : "int8 H=1")) return;
        double d = tr_rel_l2(g_b, g_a, tr->res[0].nparams);
        TH_CHECK(d < bound[k] && d > 0, "%s: %g from synchronous SGD (bound %g)", k == 1 ? "fp16" : "int8", d,
                 bound[k]);
    }
}

/* Stopped at the round end 27 (checkpoints due at 10 and 20 land on the round ends 12 and 21) and resumed
 * from 21: bit-identical to the run that never stopped, the epoch's short round included. */
static void test_exact_resume(tally_optim_kind opt, int n) {
    char what[64];
    snprintf(what, sizeof what, "local resume %s n=%d", tally_optim_name(opt), n);
    const long K = 27, END = 140, H = 3;
    th_rm_dir(g_dir);
    tally__train_cfg straight = lcfg(END, H);
    tally_optim_cfg_default(&straight.opt.optim, opt);
    straight.opt.lr = opt == TALLY_OPTIM_ADAMW ? 2e-3f : 0.02f;
    straight.opt.decay = TALLY_DECAY_COSINE;
    if (tr_train_on("shm", n, &straight, g_a, what)) return;
    tally__train_cfg first = straight, second = straight;
    first.ckpt.dir = second.ckpt.dir = g_dir;
    first.ckpt.every = 10;
    second.ckpt.resume = 1;
    const tally__train_faults halt = {.halt_after = K};
    if (tr_train_faulty("shm", n, &first, &halt, NULL, what) || tr_train_on("shm", n, &second, g_b, what)) return;
    TH_CHECK(tr->res[0].resumed_from == 21, "%s: resumed from step %ld, want 21", what, tr->res[0].resumed_from);
    TH_CHECK(!memcmp(g_a, g_b, tr->res[0].nparams * sizeof(float)),
             "%s: parameters differ from the run that never stopped (rel L2 %g)", what,
             tr_rel_l2(g_b, g_a, tr->res[0].nparams));
}

/* A local checkpoint loads at other world sizes and into a synchronous run, a synchronous one into a
 * local run: the parameters as saved, and training goes on. */
static void test_any_world(void) {
    th_rm_dir(g_dir);
    tally__train_cfg w = lcfg(30, 4);
    tally_optim_cfg_default(&w.opt.optim, TALLY_OPTIM_ADAMW);
    w.ckpt.dir = g_dir;
    if (tr_train_on("shm", 2, &w, g_a, "local written at n=2")) return;
    for (int n = 1; n <= 3; n++)
        for (int local = 0; local <= 1; local++) {
            char what[64];
            snprintf(what, sizeof what, "loaded at n=%d %s", n, local ? "local" : "sync");
            tally__train_cfg l = w;
            l.local.steps = local ? 4 : 0;
            l.ckpt.resume = 1;
            if (tr_train_on("shm", n, &l, g_b, what)) continue;
            TH_CHECK(tr->res[0].resumed_from == 30 && tr->res[0].steps == 0, "%s: from %ld, %ld steps", what,
                     tr->res[0].resumed_from, tr->res[0].steps);
            TH_CHECK(!memcmp(g_a, g_b, tr->res[0].nparams * sizeof(float)), "%s: parameters differ", what);
        }
    tally__train_cfg more = w;
    more.max_steps = 40;
    more.ckpt.resume = 1;
    if (!tr_train_on("shm", 3, &more, NULL, "train on at n=3"))
        TH_CHECK(tr->res[0].steps == 10 && tr->res[0].outer_rounds == 3, "n=2 -> n=3: %ld steps, %ld rounds",
                 tr->res[0].steps, tr->res[0].outer_rounds);
    th_rm_dir(g_dir);
    tally__train_cfg s = w;
    s.local.steps = 0;
    if (tr_train_on("shm", 2, &s, NULL, "sync written")) return;
    more.local.steps = 4;
    if (!tr_train_on("shm", 2, &more, NULL, "sync checkpoint into local"))
        TH_CHECK(tr->res[0].steps == 10, "sync -> local: %ld steps", tr->res[0].steps);
}

static void test_refused(void) {
    tally__train_cfg base = lcfg(10, 4), c = base;
    c.sync.zero = 1;
    TH_CHECK(tally__local_check(&c, 3) && strstr(tally_last_error(), "rank 3") && strstr(tally_last_error(), "--zero"),
             "--zero 1: '%s'", tally_last_error());
    c = base;
    c.sync.codec.kind = TALLY__CODEC_FP16;
    TH_CHECK(tally__local_check(&c, 0) && strstr(tally_last_error(), "--outer-compress"), "--compress: '%s'",
             tally_last_error());
    c = base;
    c.async.enabled = 1;
    TH_CHECK(tally__local_check(&c, 0) && strstr(tally_last_error(), "--mode async"), "async: '%s'",
             tally_last_error());
    c = base;
    c.check_replicas = 5;
    TH_CHECK(tally__local_check(&c, 0) && strstr(tally_last_error(), "--check-replicas"), "check-replicas: '%s'",
             tally_last_error());
    const double lr[] = {0, -1, NAN}, mu[] = {1, -0.1, NAN};
    for (int k = 0; k < 3; k++) {
        c = base;
        c.local.outer_lr = lr[k];
        TH_CHECK(tally__local_check(&c, 0) && strstr(tally_last_error(), "--outer-lr"), "outer lr %g: '%s'", lr[k],
                 tally_last_error());
        c = base;
        c.local.outer_momentum = mu[k];
        TH_CHECK(tally__local_check(&c, 0) && strstr(tally_last_error(), "--outer-momentum"), "outer momentum %g: '%s'",
                 mu[k], tally_last_error());
    }
    c = base;
    c.local.steps = 0;
    c.sync.zero = 2;
    TH_CHECK(tally__local_check(&c, 0) == 0, "without --local-steps nothing is refused");
}

/* Through the CLI: the summary's lines and JSON, and a replica that diverged (a NaN let through by
 * --nan ignore) stopping the run with a message instead of averaging it in. */
static void test_cli(void) {
    char out[16384];
    const char *json = th_path(g_dir, "run.json");
    mkdir(g_dir, 0700);
    char *ok[] = {
        "tally",   "train",  "-n",         "2",       "--data", "synthetic:2048", "--hidden", "16",
        "--steps", "20",     "--no-eval",  "--batch", "8",      "--local-steps",  "4",        "--outer-compress",
        "int8",    "--json", (char *)json, NULL};
    int rc = tr_run_tally_all(ok, out, sizeof out);
    TH_CHECK(rc == 0 && strstr(out, "local SGD        every 4 steps") && strstr(out, "sent as int8") &&
                 strstr(out, "fewer"),
             "summary: exit %d '%s'", rc, out);
    FILE *f = fopen(json, "r");
    size_t got = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[got] = 0;
    if (f) fclose(f);
    TH_CHECK(strstr(out, "\"local_sgd\": {\"steps\": 4") && strstr(out, "\"outer_compress\": \"int8\"") &&
                 strstr(out, "\"rounds\": 5"),
             "json: '%s'", out);
    char *alone[] = {"tally", "train", "--steps", "1", "--outer-lr", "1", NULL};
    rc = tr_run_tally_all(alone, out, sizeof out);
    TH_CHECK(rc == 2 && strstr(out, "need --local-steps"), "--outer-lr alone: exit %d '%s'", rc, out);
    char *zero[] = {"tally", "train", "--steps", "1", "--local-steps", "4", "--zero", "1", NULL};
    rc = tr_run_tally_all(zero, out, sizeof out);
    TH_CHECK(rc == 2 && strstr(out, "--local-steps does not go with --zero"), "--zero 1: exit %d '%s'", rc, out);
    if (!TALLY__TRAIN_SEAMS) return;
    char *nan[] = {"tally", "train",   "-n",           "2",         "--data",  "synthetic:2048", "--hidden",
                   "16",    "--steps", "20",           "--no-eval", "--quiet", "--local-steps",  "4",
                   "--nan", "ignore",  "--inject-nan", "1:2",       NULL};
    rc = tr_run_tally_all(nan, out, sizeof out);
    TH_CHECK(rc != 0 && strstr(out, "diverged") && strstr(out, "round 1"), "a NaN replica: exit %d '%s'", rc, out);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/tally_test_local_sgd.%d", (int)getpid());
    if (th_quick()) {
        test_refused();
        test_h1_is_sync(2);
        test_nesterov();
        test_rounds_and_bytes();
        test_compressed_close();
        test_exact_resume(TALLY_OPTIM_ADAMW, 2);
        test_any_world();
        test_cli();
    }
    if (th_long()) {
        test_h1_is_sync(3);
        test_exact_resume(TALLY_OPTIM_SGD, 3);
    }
    th_rm_dir(g_dir);
    return th_verdict("test_local_sgd");
}
