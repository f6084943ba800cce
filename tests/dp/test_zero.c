/* test_zero.c - ZeRO stages 1-3 against stage 0 in real processes: the same parameters after 50 steps
 * (N = 2, 3, 4; SGD-momentum and AdamW; a model whose parameter count is prime; accumulation), the
 * per-rank bytes held against the ZeRO formulas, the bytes sent per step, and --max-mem. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "plan/memory.h"
#include "train_runner.h"

/* Equivalence bound, as tests/train/test_train.c states it: tr_max_rel_diff <= 1e-5. The runner pins the
 * algorithm to rhd, whose order of addition does not depend on how the vector is cut into layers or
 * buckets, and stages 1-3 then come out bit-identical to stage 0. (With the ring, a block's sum starts
 * at a different rank in a layer's reduce-scatter than in the whole gradient's allreduce; for N >= 3
 * the last bits differ, and AdamW, dividing each coordinate by its own RMS, grows them to ~4e-5 in 50
 * steps. Accumulation at stages 2-3 reduces every micro-batch, another order too: ~2e-6.) */
#define REL_TOL 1e-5
#define STEPS   50
/* Hidden widths 20 and 21 make P = 784*20+20 + 20*21+21 + 21*10+10 = 16361, a prime: no layer and no
 * total divides evenly by 2, 3 or 4, so every shard is uneven and every layer has a tail. */
#define PRIME_P 16361

/* 4096 samples, of which a run reads at most 1200; the quick tier's short runs, 1024 (drawing them is most
 * of a short run's time under ThreadSanitizer). */
static tally__train_cfg zcfg(int zero, tally_optim_kind opt, int accum) {
    tally__train_cfg c = tr_small_cfg(th_long() ? 4096 : 1024, STEPS, 11);
    c.model.kind = TALLY__MODEL_MLP;
    c.sync.accum = accum;
    c.sync.zero = zero;
    tally_optim_cfg_default(&c.opt.optim, opt);
    c.opt.lr = opt == TALLY_OPTIM_ADAMW ? 1e-3f : 0.01f;
    return c;
}

static float g_ref[TR_MAX_PARAMS], g_got[TR_MAX_PARAMS];

/* The quick tier (and ThreadSanitizer's pass, where each run is slow): N = 3 with AdamW for 10 steps,
 * which still runs every stage with the communication thread and without; the long tier: every N and
 * optimizer for 50 steps. */
static void test_equivalence(void) {
    const tally_optim_kind opts[] = {TALLY_OPTIM_SGD, TALLY_OPTIM_ADAMW};
    int nmax = th_light() ? 3 : 4;
    long steps = th_long() ? STEPS : 10;
    for (int n = 2; n <= nmax; n++)
        for (int o = 0; o < 2; o++) {
            if (!th_long() && !(n == 3 && o == 1)) continue;
            const char *on = tally_optim_name(opts[o]);
            tally__train_cfg ref = zcfg(0, opts[o], 1);
            ref.max_steps = steps;
            char what[96];
            snprintf(what, sizeof what, "stage 0 %s n=%d", on, n);
            if (tr_train_on("shm", n, &ref, g_ref, what)) continue;
            TH_CHECK(tr->res[0].nparams == PRIME_P, "%zu parameters, expected the prime %d", tr->res[0].nparams,
                     PRIME_P);
            for (int z = 1; z <= 3; z++) {
                tally__train_cfg c = zcfg(z, opts[o], 1);
                c.max_steps = steps;
                snprintf(what, sizeof what, "stage %d %s n=%d", z, on, n);
                if (tr_train_on("shm", n, &c, g_got, what)) continue;
                double d = tr_max_rel_diff(g_got, g_ref, PRIME_P);
                double tol = REL_TOL;
                printf("%-24s vs stage 0: max relative difference %.2e (bound %.0e)\n", what, d, tol);
                TH_CHECK(d <= tol, "%s: max relative difference %.3g > %.0e", what, d, tol);
                /* the communication thread changes when collectives run, never what they compute */
                static float serial[TR_MAX_PARAMS];
                c.sync.no_overlap = 1;
                snprintf(what, sizeof what, "stage %d %s n=%d without overlap", z, on, n);
                if (!tr_train_on("shm", n, &c, serial, what))
                    TH_CHECK(!memcmp(serial, g_got, PRIME_P * sizeof(float)),
                             "%s: overlap on and off give different parameters", what);
            }
        }
}

/* Accumulation: every stage with accum 2 x batch 4 against stage 0 with the same. */
static void test_accum(void) {
    tally__train_cfg ref = zcfg(0, TALLY_OPTIM_SGD, 2);
    ref.batch = 4;
    if (tr_train_on("shm", 3, &ref, g_ref, "accum stage 0")) return;
    for (int z = 1; z <= 3; z++) {
        tally__train_cfg c = ref;
        c.sync.zero = z;
        char what[64];
        snprintf(what, sizeof what, "accum 2, stage %d, n=3", z);
        if (tr_train_on("shm", 3, &c, g_got, what)) continue;
        double d = tr_max_rel_diff(g_got, g_ref, PRIME_P);
        printf("%-24s vs stage 0: max relative difference %.2e\n", what, d);
        TH_CHECK(d <= REL_TOL, "%s: max relative difference %.3g", what, d);
    }
}

/* Per-rank model state (AdamW, fp32) against the ZeRO formulas, within 5%; layer buffers at most two
 * of the largest layer; bytes sent per step against 2P(N-1)/N x 4 (stages 0-2) and 3P(N-1)/N x 4. */
static void test_bytes(void) {
    const int n = 4;
    const double P = PRIME_P, N = n;
    const double want_state[4] = {16 * P, 8 * P + 8 * P / N, 4 * P + 12 * P / N, 16 * P / N};
    const double want_sent[4] = {2 * P * (N - 1) / N * 4, 2 * P * (N - 1) / N * 4, 2 * P * (N - 1) / N * 4,
                                 3 * P * (N - 1) / N * 4};
    const size_t largest = 784 * 20 + 20;
    for (int z = 0; z <= 3; z++) {
        tally__train_cfg c = zcfg(z, TALLY_OPTIM_ADAMW, 1);
        c.max_steps = 5;
        char what[32];
        snprintf(what, sizeof what, "bytes, stage %d", z);
        if (tr_train_on("shm", n, &c, NULL, what)) continue;
        for (int r = 0; r < n; r++) {
            const tally__train_result *res = &tr->res[r];
            double state = (double)(res->mem_params + res->mem_grads + res->mem_optim);
            double sent = (double)res->bytes_sent / (double)res->steps;
            if (r == 0)
                printf(
                    "stage %d: model state %.0f bytes (formula %.0f), buffers %zu, sent %.0f per step (formula %.0f)\n",
                    z, state, want_state[z], res->mem_buffers, sent, want_sent[z]);
            TH_CHECK(fabs(state - want_state[z]) <= 0.05 * want_state[z],
                     "stage %d rank %d: model state %.0f bytes, formula %.0f", z, r, state, want_state[z]);
            /* overlapped (the default): two staging buffers at stage 2, two gathered layers at 3 (each
             * then takes its layer's gradients) */
            size_t want_buffers = (z >= 2 ? 2 : 0) * largest * sizeof(float);
            TH_CHECK(res->mem_buffers == want_buffers, "stage %d: %zu bytes of layer buffers, expected %zu", z,
                     res->mem_buffers, want_buffers);
            /* stage 3 gathers the last layer once for forward and backward both, so a little under */
            TH_CHECK(sent <= want_sent[z] * 1.05 && sent >= want_sent[z] * (z == 3 ? 0.9 : 0.95),
                     "stage %d rank %d: %.0f bytes sent per step, formula %.0f", z, r, sent, want_sent[z]);
        }
    }
}

/* The prediction the trainer checks --max-mem against: stage 0 refused up front with both figures,
 * stage 3 runs under the same limit and holds what was predicted. Four hidden layers of 512 keep the
 * largest layer (784 x 512) well under the model, so stage 3's shards and layer buffers are smaller
 * than stage 0's replicas. */
static void test_max_mem(void) {
    tally__train_cfg c = zcfg(0, TALLY_OPTIM_ADAMW, 1);
    c.model.nhidden = 4;
    c.model.hidden[0] = c.model.hidden[1] = c.model.hidden[2] = c.model.hidden[3] = 512;
    tally__model_cfg mc = {
        .kind = TALLY__MODEL_MLP, .in_dim = 784, .outputs = 10, .nhidden = 4, .hidden = {512, 512, 512, 512}};
    tally__model_desc d;
    TH_CHECK(tally__model_describe(&mc, c.batch, &d) == 0, "describe: %s", tally_last_error());
    tally__mem_need s0 = tally__mem_predict(&d, 0, 2, &c.opt.optim, 1),
                    s3 = tally__mem_predict(&d, 3, 2, &c.opt.optim, 1);
    TH_CHECK(s0.params + s0.grads + s0.optim == 16 * d.nparams, "stage 0 prediction %zu",
             s0.params + s0.grads + s0.optim);
    TH_CHECK(s3.total < s0.total, "stage 3 predicted %zu, not below stage 0's %zu", s3.total, s0.total);
    char limit[32], err[8192];
    snprintf(limit, sizeof limit, "%zu", (s0.total + s3.total) / 2);
    char *run0[] = {"tally",   "train",     "-n",          "2",       "--hidden",  "512,512,512,512",
                    "--data",  "synthetic", "--optimizer", "adamw",   "--batch",   "8",
                    "--steps", "2",         "--no-eval",   "--quiet", "--max-mem", limit,
                    "--zero",  "0",         NULL};
    int rc = tr_run_tally(run0, err, sizeof err);
    TH_CHECK(rc == 1 && strstr(err, "needs") && strstr(err, "--max-mem allows") && strstr(err, limit),
             "stage 0 under --max-mem %s: exit %d, %s", limit, rc, err);
    run0[19] = "3";
    rc = tr_run_tally(run0, err, sizeof err);
    TH_CHECK(rc == 0, "stage 3 under --max-mem %s: exit %d, %s", limit, rc, err);
    /* what a rank then holds is what was predicted (shards counted as ceil(P/N) there: each layer's
     * tail, under N elements, is the difference) */
    c.sync.zero = 3;
    c.max_mem = (s0.total + s3.total) / 2;
    c.max_steps = 2;
    if (tr_train_on("shm", 2, &c, NULL, "stage 3 under --max-mem")) return;
    const tally__train_result *r = &tr->res[0];
    size_t held = r->mem_params + r->mem_grads + r->mem_optim + r->mem_buffers + r->mem_activations;
    TH_CHECK(held <= s3.total + 16 * 2 * 6 && held + 64 >= s3.total, "stage 3 holds %zu bytes, predicted %zu", held,
             s3.total);
}

/* Without overlap one layer-sized buffer: stage 2's staged gradients, stage 3's gathered layer, which
 * then takes its gradients. */
static void test_serial_buffers(void) {
    const size_t largest = 784 * 20 + 20;
    for (int z = 2; z <= 3; z++) {
        tally__train_cfg c = zcfg(z, TALLY_OPTIM_ADAMW, 1);
        c.max_steps = 2;
        c.sync.no_overlap = 1;
        if (tr_train_on("shm", 2, &c, NULL, "serial buffers")) continue;
        size_t want = largest * sizeof(float);
        TH_CHECK(tr->res[0].mem_buffers == want, "stage %d without overlap: %zu bytes of buffers, expected %zu", z,
                 tr->res[0].mem_buffers, want);
    }
}

/* GPT's optimizer (clipping to a global norm, weight decay on matrices only) under every stage: the
 * norm is the whole model's from the ranks' shards (tails counted once), the decay boundary falls
 * inside shards, and stages 1-3 stay within the bound of stage 0 (bit-identical here without accumulation);
 * with accumulation, where ZeRO averages before clipping, SGD-momentum: stages 2-3 reduce each
 * micro-batch, another order of addition, which AdamW's per-coordinate scaling would grow past the bound
 * (see the top of the file). The clipping and the decay change training (they are not silently off). */
static void test_clip_decay(void) {
    for (int accum = 1; accum <= 2; accum++) {
        tally__train_cfg ref = zcfg(0, accum == 1 ? TALLY_OPTIM_ADAMW : TALLY_OPTIM_SGD, accum);
        ref.opt.clip = 0.05f; /* below the gradients' norm from the first step */
        ref.opt.optim.weight_decay = 0.1f;
        ref.sync.decay_matrices = 1;
        char what[96];
        snprintf(what, sizeof what, "clip + decay matrices, stage 0, accum %d", accum);
        if (tr_train_on("shm", 3, &ref, g_ref, what)) continue;
        for (int z = 1; z <= 3; z++) {
            tally__train_cfg c = ref;
            c.sync.zero = z;
            snprintf(what, sizeof what, "clip + decay matrices, stage %d, accum %d", z, accum);
            if (tr_train_on("shm", 3, &c, g_got, what)) continue;
            double d = tr_max_rel_diff(g_got, g_ref, PRIME_P);
            printf("%-42s vs stage 0: max relative difference %.2e\n", what, d);
            TH_CHECK(d <= REL_TOL, "%s: max relative difference %.3g > %.0e", what, d, REL_TOL);
        }
    }
    tally__train_cfg base = zcfg(1, TALLY_OPTIM_ADAMW, 1), clipped = base, decayed = base;
    base.opt.optim.weight_decay = decayed.opt.optim.weight_decay = 0.1f;
    clipped.opt.optim.weight_decay = 0.1f;
    clipped.opt.clip = 0.05f;
    decayed.sync.decay_matrices = 1;
    if (tr_train_on("shm", 3, &base, g_ref, "stage 1, neither")) return;
    if (!tr_train_on("shm", 3, &clipped, g_got, "stage 1, clipped"))
        TH_CHECK(tr_max_rel_diff(g_got, g_ref, PRIME_P) > 1e-3, "--clip 0.05 changed nothing");
    if (!tr_train_on("shm", 3, &decayed, g_got, "stage 1, decay on matrices only"))
        TH_CHECK(tr_max_rel_diff(g_got, g_ref, PRIME_P) > 1e-6, "decay on matrices only changed nothing");
}

int main(void) {
    test_equivalence();
    if (th_long()) {
        test_clip_decay();
        test_serial_buffers();
        test_accum();
        test_bytes();
        test_max_mem();
    }
    return th_verdict("test_zero");
}
