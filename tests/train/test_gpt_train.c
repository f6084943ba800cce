/* test_gpt_train.c - the GPT in the trainer, in real processes, on a generated text file: N ranks equal
 * one with N times the batch, accumulation equals a bigger batch, ZeRO 1-3 equal stage 0, several
 * buckets overlapped with backward change nothing, every codec trains, an exact resume, a checkpoint
 * written at N = 4 loads at 2 and 1, the NaN guard, --check-replicas, --mode async at S = 0; and text
 * generated from a checkpoint: greedy twice alike, a seed's draws reproducible, refusals by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "plan/memory.h"
#include "train/generate.h"
#include "train_runner.h"

/* Bounds, as tr_max_rel_diff: ZeRO, overlap and resumes are bit-identical with the algorithm pinned (rhd
 * adds in the same order however the vector is cut). A world size or accumulation change reorders the
 * batch's sums (sgemm over 8 windows against two of 4 added by the allreduce): with SGD-momentum that
 * stays at ~4e-7 after 30 steps (bound 1e-5, as test_train's); AdamW's per-coordinate scaling grows the
 * same rounding to ~2e-4, so the world-size test runs SGD. */
#define REL_TOL_REORDER 1e-5
#define STEPS           30

static char g_text[256], g_dir[256];
static float g_ref[TR_MAX_PARAMS], g_got[TR_MAX_PARAMS];

/* 64 KB of sentences drawn from a small vocabulary: structure enough that a model learns in 30 steps. */
static void write_corpus(void) {
    static const char *words[] = {"the",  "king", "said", "unto", "them", "and",   "lord", "of", "hosts", "is",
                                  "with", "us",   "in",   "that", "day",  "shall", "be",   "a",  "light", "house"};
    FILE *f = fopen(g_text, "w");
    uint64_t s = 7;
    for (size_t n = 0; n < 65536;) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const char *w = words[(s >> 33) % 20];
        n += (size_t)fprintf(f, "%s%s", w, (s >> 40) % 9 == 0 ? ".\n" : " ");
    }
    fclose(f);
}

/* GPT L2 C16 H2 T16 (10,944 parameters) with GPT training's defaults, as tally train sets them, and a
 * larger learning rate for 30 steps. */
static tally__train_cfg gcfg(int batch) {
    tally__train_cfg c = tr_small_cfg(0, STEPS, 5);
    c.model.kind = TALLY__MODEL_GPT;
    c.model.nhidden = 0;
    c.model.layers = 2;
    c.model.embd = 16;
    c.model.heads = 2;
    c.model.in_dim = 16;
    c.data.source = NULL;
    static char src[300];
    snprintf(src, sizeof src, "text:%s", g_text);
    c.data.source = src;
    c.data.val_windows = 8;
    c.batch = batch;
    tally__train_gpt_defaults(&c, 0);
    c.opt.lr = 3e-3f;
    return c;
}

static void expect_close(const char *what, double tol) {
    size_t np = tr->res[0].nparams;
    double d = tr_max_rel_diff(g_got, g_ref, np);
    printf("  %-44s max relative difference %.2e (bound %.0e)\n", what, d, tol);
    TH_CHECK(tol > 0 ? d <= tol : !memcmp(g_got, g_ref, np * sizeof(float)), "%s: %.3g from the reference", what, d);
}

static void test_world_and_accum(void) {
    tally__train_cfg one = gcfg(8), two, acc;
    tally_optim_cfg_default(&one.opt.optim, TALLY_OPTIM_SGD);
    one.opt.lr = 0.05f;
    two = acc = one;
    two.batch = 4;
    acc.batch = 2;
    acc.sync.accum = 2;
    if (tr_train_on("shm", 1, &one, g_ref, "gpt 1 rank, batch 8")) return;
    TH_CHECK(tr->res[0].nparams == 10944, "gpt L2 C16 H2 T16: %zu parameters, expected 10944", tr->res[0].nparams);
    if (!tr_train_on("shm", 2, &two, g_got, "gpt 2 ranks, batch 4"))
        expect_close("2 ranks x 4 vs 1 x 8", REL_TOL_REORDER);
    if (!tr_train_on("shm", 2, &acc, g_got, "gpt 2 ranks, batch 2 x accum 2"))
        expect_close("2 ranks x 2 x accum 2 vs 1 x 8", REL_TOL_REORDER);
}

/* ZeRO-3's layer buffers, overlapped: two of the largest layer (each gathers a layer's parameters, then
 * takes its gradients) and the tied head's copy of the embedding; the planner predicts the same. */
static void check_zero3_buffers(const tally__train_cfg *c, size_t held) {
    tally__model_desc d;
    tally__model_cfg mc = c->model;
    mc.outputs = 256; /* the byte vocabulary, which the trainer sets from the data */
    TH_CHECK(tally__model_describe(&mc, c->batch, &d) == 0, "describe: %s", tally_last_error());
    size_t want = (2 * d.largest_layer + d.tied_floats) * sizeof(float);
    tally__mem_need need = tally__mem_predict(&d, 3, 3, &c->opt.optim, 1);
    TH_CHECK(d.tied_floats == 256 * 16 && held == want && need.buffers == want,
             "gpt stage 3: %zu bytes of layer buffers, predicted %zu, expected %zu (largest layer %zu, tied %zu)", held,
             need.buffers, want, d.largest_layer, d.tied_floats);
}

static void test_zero_and_buckets(void) {
    tally__train_cfg ref = gcfg(4);
    ref.sync.bucket_mb = 0.004; /* about 1,000 floats a bucket: several */
    if (tr_train_on("shm", 3, &ref, g_ref, "gpt stage 0, n=3")) return;
    TH_CHECK(tr->res[0].buckets > 5, "0.004 MB buckets: %d buckets, expected several", tr->res[0].buckets);
    tally__train_cfg off = ref;
    off.sync.no_overlap = 1;
    if (!tr_train_on("shm", 3, &off, g_got, "gpt stage 0 without overlap")) expect_close("overlap off vs on", 0);
    for (int z = 1; z <= 3; z++) {
        tally__train_cfg c = ref;
        c.sync.zero = z;
        char what[64];
        snprintf(what, sizeof what, "gpt ZeRO stage %d vs stage 0, n=3", z);
        if (tr_train_on("shm", 3, &c, g_got, what)) continue;
        expect_close(what, 0);
        if (z == 3) check_zero3_buffers(&c, tr->res[0].mem_buffers);
    }
    /* Stage 3 makes each layer's gradients in the buffer its parameters were gathered into, and the
     * embedding's also takes the tied head's share: with accumulation, overlapped and inline, the bits
     * of stage 2, whose gradients have buffers of their own (both reduce every micro-batch) */
    tally__train_cfg acc2 = ref, acc3;
    acc2.batch = 2;
    acc2.sync.accum = 2;
    acc2.sync.zero = 2;
    if (tr_train_on("shm", 3, &acc2, g_ref, "gpt stage 2, accum 2")) return;
    for (int inline_ = 0; inline_ <= 1; inline_++) {
        acc3 = acc2;
        acc3.sync.zero = 3;
        acc3.sync.no_overlap = inline_;
        const char *what = inline_ ? "stage 3 inline vs 2, accum 2" : "stage 3 vs 2, accum 2";
        if (!tr_train_on("shm", 3, &acc3, g_got, what)) expect_close(what, 0);
    }
}

static void test_codecs_learn(void) {
    const char *codecs[] = {"none", "fp16", "bf16", "topk:0.1", "powersgd:2"};
    for (int k = 0; k < 5; k++) {
        tally__train_cfg c = gcfg(4);
        c.eval = 1;
        tally__codec_parse(codecs[k], &c.sync.codec);
        char what[64];
        snprintf(what, sizeof what, "gpt --compress %s", codecs[k]);
        if (tr_train_on("shm", 2, &c, NULL, what)) continue;
        double loss = tr->res[0].test_loss;
        printf("  %-44s validation loss %.3f after %d steps (uniform: %.3f)\n", what, loss, STEPS, log(256.0));
        TH_CHECK(tr->res[0].evaluated && loss < log(256.0) - 0.5, "%s: validation loss %.3f: it did not learn", what,
                 loss);
    }
}

static void test_checkpoints(void) {
    tally__train_cfg straight = gcfg(4), first = gcfg(4), second = gcfg(4);
    snprintf(g_dir, sizeof g_dir, "/tmp/tally-test-gpt-%d", (int)getpid());
    th_rm_dir(g_dir);
    if (tr_train_on("shm", 2, &straight, g_ref, "gpt straight")) return;
    first.ckpt.dir = second.ckpt.dir = g_dir;
    first.max_steps = STEPS; /* saves at 15 and at the end; the halt makes 15 the last */
    first.ckpt.every = 15;
    const tally__train_faults halt = {.halt_after = 15};
    second.ckpt.resume = 1;
    if (!tr_train_faulty("shm", 2, &first, &halt, NULL, "gpt first 15 steps") &&
        !tr_train_on("shm", 2, &second, g_got, "gpt resumed at 15")) {
        TH_CHECK(tr->res[0].resumed_from == 15, "resumed from %ld, expected 15", tr->res[0].resumed_from);
        expect_close("stopped at 15 and resumed vs straight", 0);
    }
    th_rm_dir(g_dir);
    tally__train_cfg w = gcfg(2), l = gcfg(4);
    w.ckpt.dir = l.ckpt.dir = g_dir;
    w.max_steps = l.max_steps = 10;
    l.ckpt.resume = 1;
    if (tr_train_on("shm", 4, &w, g_ref, "gpt written at n=4")) return;
    for (int n = 2; n >= 1; n--) {
        char what[64];
        snprintf(what, sizeof what, "gpt checkpoint of n=4 loaded at n=%d", n);
        if (!tr_train_on("shm", n, &l, g_got, what)) expect_close(what, 0);
    }
    th_rm_dir(g_dir);
}

static void test_guards_and_async(void) {
    tally__train_cfg c = gcfg(4);
    const tally__train_faults nan = {.nan_rank = 1, .nan_step = 5};
    c.check_replicas = 5;
    if (!tr_train_faulty("shm", 2, &c, &nan, NULL, "gpt NaN at step 5 on rank 1, --check-replicas 5"))
        TH_CHECK(tr->res[0].skipped_steps == 1, "the NaN step: %ld steps skipped, expected 1",
                 tr->res[0].skipped_steps);
    tally__train_cfg sync = gcfg(4), async = gcfg(4);
    sync.opt.clip = async.opt.clip = 0; /* the server applies the gradients: no clipping there */
    sync.sync.decay_matrices = async.sync.decay_matrices = 0;
    async.async.enabled = 1;
    if (!tr_train_on("shm", 2, &sync, g_ref, "gpt sync for async") &&
        !tr_train_on("shm", 2, &async, g_got, "gpt async S = 0"))
        expect_close("async S = 0 vs sync", 1e-5);
}

typedef struct gen_out {
    char text[512];
    int n;
} gen_out;

static void gen_keep(void *arg, int byte) {
    gen_out *o = arg;
    if (o->n < (int)sizeof o->text - 1) o->text[o->n++] = (char)byte;
}

static int gen_run(tally__model *m, const char *prompt, float temperature, uint64_t seed, gen_out *o) {
    memset(o, 0, sizeof *o);
    tally__sample_cfg s = {.tokens = 40, .temperature = temperature, .top_k = 8, .seed = seed};
    return tally__generate(m, (const uint8_t *)prompt, strlen(prompt), &s, gen_keep, o);
}

/* A model trained 30 steps, its checkpoint loaded back with nothing but the directory; a prompt longer
 * than the context slides the window. */
static void test_generate(void) {
    tally__train_cfg c = gcfg(4);
    snprintf(g_dir, sizeof g_dir, "/tmp/tally-test-gpt-gen-%d", (int)getpid());
    th_rm_dir(g_dir);
    c.ckpt.dir = g_dir;
    if (tr_train_on("shm", 2, &c, g_ref, "gpt for generate")) return;
    tally__model m;
    if (tally__generate_load(g_dir, &m)) {
        TH_CHECK(0, "generate: the checkpoint does not load: %s", tally_last_error());
        return;
    }
    TH_CHECK(m.nparams == tr->res[0].nparams && !memcmp(m.params, g_ref, m.nparams * sizeof(float)),
             "generate: the model rebuilt from the checkpoint is not the one trained");
    gen_out a, b;
    const char *longer = "the king said unto them and the lord of hosts is with us in that day";
    TH_CHECK(!gen_run(&m, "the king ", 0, 1, &a) && !gen_run(&m, "the king ", 0, 2, &b), "greedy: %s",
             tally_last_error());
    TH_CHECK(a.n == 40 && !memcmp(a.text, b.text, 40), "greedy: two runs differ or are short (%d bytes)", a.n);
    TH_CHECK(!gen_run(&m, longer, 0.8f, 7, &a) && !gen_run(&m, longer, 0.8f, 7, &b) && !memcmp(a.text, b.text, 40),
             "sampling with seed 7 twice: different text");
    TH_CHECK(!gen_run(&m, "", 0.8f, 8, &b) && b.n == 40, "no prompt: %s", tally_last_error());
    printf("  generated (seed 7, temperature 0.8): \"%.40s\"\n", a.text);
    tally__model_free(&m);
    th_rm_dir(g_dir);
    char old[512];
    const char *src = getenv("TALLY_SOURCE_DIR");
    snprintf(old, sizeof old, "%s/tests/fixtures/ckpt_v1/mlp_zero3", src ? src : ".");
    TH_CHECK(tally__generate_load(old, &m) == TALLY_E_INVALID && strstr(tally_last_error(), "does not describe"),
             "a checkpoint without a model description: %s", tally_last_error());
    TH_CHECK(tally__generate_load("/nonexistent-tally-dir", &m) != 0 && strstr(tally_last_error(), "/nonexistent"),
             "no checkpoint directory: %s", tally_last_error());
}

int main(void) {
    snprintf(g_text, sizeof g_text, "/tmp/tally-test-gpt-%d.txt", (int)getpid());
    write_corpus();
    if (th_quick()) { /* a few steps each: world size and accumulation, a checkpoint resumed, generation */
        test_world_and_accum();
        test_checkpoints();
        test_generate();
    }
    if (th_long()) { /* the whole trainer's features on the GPT */
        test_zero_and_buckets();
        test_codecs_learn();
        test_guards_and_async();
    }
    unlink(g_text);
    return th_verdict("test_gpt_train");
}
