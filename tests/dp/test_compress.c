/* test_compress.c - the codecs in real training runs: topk:1 against no compression, fp16/bf16 near f32,
 * every codec with accumulation, overlap on and off and the ZeRO stages it supports (replicas identical),
 * 1 and 3 ranks over shm and tcp, the refused combinations, an fp16 overflow, a skipped step, and an
 * exact resume. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "train_runner.h"

/* topk:1 sends every value and sums them in rank order; bound on tr_max_rel_diff: 1e-5 (the sum's order
 * may differ from the allreduce's in the last bit, which 50 SGD steps carry to ~1e-6; measured: 0, bit
 * for bit, at 2 and 3 ranks). fp16/bf16 round each value to 11 / 8 significant bits on the wire (fp16
 * also loses small gradients to its subnormal range); bound on the relative L2 distance of the
 * parameters after 50 steps: 5% / 10% (measured: fp16 1e-4 at 2 ranks, 0.018 at 3; bf16 0.006, 0.027). */
#define TOPK1_TOL 1e-5
#define FP16_TOL  0.05
#define BF16_TOL  0.10
#define STEPS     50

static tally__train_cfg ccfg(const char *codec, int ef, int zero, int accum, int no_overlap) {
    tally__train_cfg c = tr_small_cfg(4096, STEPS, 3);
    c.sync.accum = accum;
    c.sync.zero = zero;
    c.sync.no_overlap = no_overlap;
    c.sync.bucket_mb = 0.02; /* several buckets: per-bucket state and order matter */
    c.opt.lr = 0.02f;
    tally__codec_parse(codec, &c.sync.codec);
    c.sync.codec.error_feedback = ef;
    return c;
}

static float g_ref[TR_MAX_PARAMS], g_got[TR_MAX_PARAMS];

static void test_against_f32(const char *tp, int n) {
    char what[96];
    tally__train_cfg ref = ccfg("none", 1, 0, 1, 0);
    snprintf(what, sizeof what, "%s n=%d none", tp, n);
    if (tr_train_on(tp, n, &ref, g_ref, what)) return;
    size_t np = tr->res[0].nparams;
    const char *codecs[] = {"topk:1", "fp16", "bf16"};
    const double tol[] = {TOPK1_TOL, FP16_TOL, BF16_TOL};
    for (int k = 0; k < 3; k++) {
        tally__train_cfg c = ccfg(codecs[k], 1, 0, 1, 0);
        snprintf(what, sizeof what, "%s n=%d %s", tp, n, codecs[k]);
        if (tr_train_on(tp, n, &c, g_got, what)) continue;
        double d = k ? tr_rel_l2(g_got, g_ref, np) : tr_max_rel_diff(g_got, g_ref, np);
        fprintf(stderr, "%s: %s %g from f32\n", what, k ? "relative L2 distance" : "max rel diff", d);
        TH_CHECK(d <= tol[k], "%s: %s %g from f32 (bound %g)", what, k ? "relative L2 distance" : "max rel diff", d,
                 tol[k]);
        TH_CHECK(k == 0 || d > 0, "%s: no difference at all from f32: is it compressing?", what);
        /* Half the bytes of f32 on the wire; fp16 adds its scale's allreduce, one float per bucket. */
        unsigned long long half = tr->res[0].grad_bytes_f32_step * STEPS / 2,
                           scales = k == 1 ? (unsigned long long)STEPS * (unsigned long long)tr->res[0].buckets * 4 *
                                                 (unsigned long long)n
                                           : 0;
        if (n > 1 && k)
            TH_CHECK(tr->res[0].grad_bytes >= half + (scales ? 1 : 0) && tr->res[0].grad_bytes <= half + scales,
                     "%s: %llu gradient bytes in %d steps, f32 would send %llu per step", what, tr->res[0].grad_bytes,
                     STEPS, tr->res[0].grad_bytes_f32_step);
    }
}

/* Every codec x accum 2 x overlap on/off x the ZeRO stages it works with: the run completes and every
 * replica is bit-identical (tr_train_on checks it). */
static void test_matrix(void) {
    const char *codecs[] = {"fp16",       "bf16", "topk:0.1", "topk:0.1", "powersgd:2",
                            "powersgd:1", "int8", "int8",     "dgc:0.1"};
    const int efs[] = {1, 1, 1, 0, 1, 0, 1, 0, 1};
    for (int k = 0; k < 9; k++)
        for (int ov = 0; ov < 2; ov++)
            for (int z = 0; z <= 3; z++) {
                int half = codecs[k][0] == 'f' || codecs[k][0] == 'b';
                if (z && !half) continue;
                if (th_light() && z == 3) continue;
                /* The quick tier: every codec with overlap, and fp16 at every stage. */
                if (!(ov == 0 && (z == 0 || k == 0) ? th_quick() : th_long())) continue;
                char what[96];
                snprintf(what, sizeof what, "%s%s accum 2 overlap %d zero %d", codecs[k], efs[k] ? "" : " no-ef", !ov,
                         z);
                tally__train_cfg c = ccfg(codecs[k], efs[k], z, 2, ov);
                if (tr_train_on("shm", 3, &c, NULL, what)) continue;
                TH_CHECK(tr->res[0].grad_bytes < tr->res[0].grad_bytes_f32_step * STEPS,
                         "%s: %llu bytes, not fewer "
                         "than f32's %llu",
                         what, tr->res[0].grad_bytes, tr->res[0].grad_bytes_f32_step * STEPS);
            }
}

static void test_sizes(void) {
    const char *codecs[] = {"fp16", "topk:0.05", "powersgd:2", "int8"};
    for (int k = 0; k < 4; k++) {
        char what[96];
        tally__train_cfg c = ccfg(codecs[k], 1, 0, 1, 0);
        snprintf(what, sizeof what, "%s n=1", codecs[k]);
        tr_train_on("shm", 1, &c, NULL, what);
        snprintf(what, sizeof what, "%s tcp n=3", codecs[k]);
        tr_train_on("tcp", 3, &c, NULL, what);
    }
}

/* The CLI refuses these before starting ranks, with a message saying what to do. */
static void test_refused(void) {
    struct {
        const char *args[8];
        const char *says;
    } cases[] = {
        {{"tally", "train", "--compress", "topk:0.1", "--zero", "1", NULL}, "--zero 0 only"},
        {{"tally", "train", "--compress", "powersgd:4", "--zero", "2", NULL}, "--zero 0 only"},
        {{"tally", "train", "--compress", "int8", "--zero", "3", NULL}, "int8 works with --zero 0 only"},
        {{"tally", "train", "--compress", "dgc:0.01", "--zero", "1", NULL}, "dgc works with --zero 0 only"},
        {{"tally", "train", "--compress", "dgc:0.01", "--no-error-feedback", NULL}, "accumulates what it did not"},
        {{"tally", "train", "--compress", "fp16", "--no-error-feedback", NULL}, "powersgd:r and int8 only"},
        {{"tally", "train", "--no-error-feedback", NULL}, "powersgd:r and int8 only"},
        {{"tally", "train", "--compress", "topk:0", NULL}, "(0, 1]"},
        {{"tally", "train", "--compress", "topk:2", NULL}, "(0, 1]"},
        {{"tally", "train", "--compress", "powersgd:0", NULL}, "from 1 to"},
        {{"tally", "train", "--compress", "gzip", NULL}, "unknown codec"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[4096];
        int rc = tr_run_tally((char *const *)cases[i].args, err, sizeof err);
        TH_CHECK(rc == 2 && strstr(err, cases[i].says), "%s %s: exit %d, stderr: %s", cases[i].args[2],
                 cases[i].args[3] ? cases[i].args[3] : "", rc, err);
    }
    /* dgc moves SGD's momentum into the codec: another optimizer, given or the gpt's default AdamW, is a
     * usage error before any rank starts; the library refuses it too, naming the rank. */
    char *adamw[] = {"tally",      "train",    "--steps",     "1",     "--data", "synthetic:256",
                     "--compress", "dgc:0.01", "--optimizer", "adamw", NULL};
    char *gpt[] = {"tally", "train", "--model", "gpt", "--steps", "1", "--compress", "dgc:0.01", NULL};
    char *const *refused[] = {adamw, gpt};
    for (int i = 0; i < 2; i++) {
        char err[4096];
        int rc = tr_run_tally(refused[i], err, sizeof err);
        TH_CHECK(rc == 2 && strstr(err, "corrects SGD's momentum") && strstr(err, "optimizer is adamw"),
                 "dgc with adamw (%s): exit %d, %s", i ? "the gpt's default" : "given", rc, err);
    }
    tally__train_cfg cfg;
    tally__train_cfg_default(&cfg);
    cfg.sync.codec.kind = TALLY__CODEC_DGC;
    tally_optim_cfg_default(&cfg.opt.optim, TALLY_OPTIM_ADAMW);
    TH_CHECK(tally__train_dgc_check(&cfg, 3) == TALLY_E_INVALID && strstr(tally_last_error(), "rank 3"),
             "the library's dgc check: %s", tally_last_error());
    tally_optim_cfg_default(&cfg.opt.optim, TALLY_OPTIM_SGD);
    TH_CHECK(tally__train_dgc_check(&cfg, 3) == 0, "dgc with sgd refused: %s", tally_last_error());
}

/* A least-squares model with a rate that makes it diverge: its gradients pass fp16's 65504 long before
 * f32's range. The overflowed fp16 sum counts as an Inf gradient: --nan skip skips those steps on every
 * rank (f32 takes them all), --nan error stops. */
static void test_overflow(void) {
    tally__train_cfg c = ccfg("fp16", 1, 0, 1, 0);
    c.model.kind = TALLY__MODEL_LINEAR;
    c.data.source = "linear";
    c.data.linear_samples = 2048;
    c.opt.lr = 2.0f;
    c.max_steps = 60;
    tally__train_cfg f32 = c;
    f32.sync.codec.kind = TALLY__CODEC_NONE;
    if (!tr_train_on("shm", 2, &f32, NULL, "diverging f32"))
        TH_CHECK(tr->res[0].skipped_steps == 0, "diverging f32 skipped %ld steps", tr->res[0].skipped_steps);
    for (int z = 0; z <= 1; z++) {
        c.sync.zero = z;
        if (!tr_train_on("shm", 2, &c, NULL, "diverging fp16"))
            TH_CHECK(tr->res[0].skipped_steps > 0, "fp16 zero %d: an overflowed sum skipped no step", z);
    }
    char out[8192];
    int rc = th_shell("\"$TALLY_BIN\" train -n 2 --model linear --lr 2 --steps 60 --batch 8 --compress fp16 "
                      "--nan error --quiet --no-eval",
                      60, out, sizeof out);
    TH_CHECK(rc != 0 && strstr(out, "fp16 sum of bucket 0 overflowed") && strstr(out, "--nan error"),
             "fp16 overflow with --nan error: exit %d: %s", rc, out);
}

/* A NaN fed into one rank's data at step 10 makes NaN gradients: that step is skipped on every rank and
 * leaves no trace in the codecs' residuals or factors, so it is the only one skipped. */
static void test_nan_step(void) {
    const char *codecs[] = {"topk:0.05", "powersgd:2"};
    for (int k = 0; k < 2; k++) {
        tally__train_cfg c = ccfg(codecs[k], 1, 0, 1, 0);
        const tally__train_faults nan = {.nan_rank = 1, .nan_step = 10};
        char what[96];
        snprintf(what, sizeof what, "%s with a NaN at step 10", codecs[k]);
        if (tr_train_faulty("shm", 2, &c, &nan, g_got, what)) continue;
        TH_CHECK(tr->res[0].skipped_steps == 1, "%s: %ld steps skipped", what, tr->res[0].skipped_steps);
        int finite = 1;
        for (size_t i = 0; i < tr->res[0].nparams; i++) finite &= isfinite(g_got[i]) != 0;
        TH_CHECK(finite, "%s: parameters not finite", what);
    }
}

static char g_dir[256];

/* Stopped at K (as if killed), resumed: bit-identical to the run that never stopped. */
static void test_resume(const char *codec, int n) {
    const long K = 30, END = 70;
    char what[96];
    snprintf(what, sizeof what, "resume %s n=%d", codec, n);
    th_rm_dir(g_dir);
    tally__train_cfg straight = ccfg(codec, 1, 0, 1, 0);
    straight.max_steps = END;
    if (tr_train_on("shm", n, &straight, g_ref, what)) return;
    tally__train_cfg first = straight, second = straight;
    first.ckpt.dir = second.ckpt.dir = g_dir;
    first.ckpt.every = 10;
    const tally__train_faults halt = {.halt_after = K};
    second.ckpt.resume = 1;
    if (tr_train_faulty("shm", n, &first, &halt, NULL, what) || tr_train_on("shm", n, &second, g_got, what)) return;
    TH_CHECK(tr->res[0].resumed_from == K, "%s: resumed from step %ld", what, tr->res[0].resumed_from);
    TH_CHECK(!memcmp(g_ref, g_got, tr->res[0].nparams * sizeof(float)),
             "%s: differs from the run that never "
             "stopped (max rel diff %g)",
             what, tr_max_rel_diff(g_got, g_ref, tr->res[0].nparams));
    /* At another world size each rank starts from the mean of the saved residuals. */
    if (n == 2) {
        tally__train_cfg third = second;
        third.max_steps = END + 10;
        if (!tr_train_on("shm", 3, &third, NULL, "resume topk written at n=2 on 3 ranks"))
            TH_CHECK(tr->res[0].resumed_from == END, "%s at n=3: resumed from step %ld", what, tr->res[0].resumed_from);
    }
    /* Another codec on the same directory is refused, naming both. */
    char cmd[600], out[4096];
    snprintf(cmd, sizeof cmd,
             "\"$TALLY_BIN\" train -n 2 --data synthetic:4096 --hidden 20,21 --batch 8 --seed 3 "
             "--steps 80 --ckpt %s --resume --compress bf16 --quiet --no-eval",
             g_dir);
    int rc = th_shell(cmd, 60, out, sizeof out);
    TH_CHECK(rc != 0 && strstr(out, codec) && strstr(out, "'bf16'"), "%s: resumed with bf16: exit %d: %s", what, rc,
             out);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/tally_test_compress.%d", (int)getpid());
    if (th_quick()) {
        test_refused();
        test_against_f32("shm", 2);
    }
    if (th_long()) test_against_f32("shm", 3);
    test_matrix();
    if (th_quick()) {
        test_sizes();
        test_overflow();
        test_nan_step();
        test_resume("topk:0.05", 2);
        test_resume("dgc:0.05", 2); /* the velocity and the warm-up's step come back */
    }
    if (th_long()) test_resume("powersgd:2", 3);
    th_rm_dir(g_dir);
    return th_verdict("test_compress");
}
