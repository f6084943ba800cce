/* test_train.c - the trainer end to end in real processes: N ranks with batch b equal one rank with
 * batch N*b, accumulation equals a bigger batch, overlap changes nothing, replicas stay identical,
 * the linear model finds its weights; and the `tally train` command line. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "nn/model_build.h"
#include "train/trainer_int.h"
#include "train_runner.h"

/* The bound of the equivalence tests: after STEPS steps, for every parameter,
 *   |a - b| <= 1e-5 * max(|b|, max_j |b_j| * 1e-2)   (tr_max_rel_diff)
 * i.e. a relative difference of 1e-5, with parameters smaller than 1% of the largest one judged
 * against that 1% (their relative error is rounding noise around zero, not a difference in training). */
#define REL_TOL 1e-5
#define STEPS   50

static tally__train_cfg base_cfg(tally__model_kind model, int batch) {
    tally__train_cfg c;
    tally__train_cfg_default(&c);
    c.model.kind = model;
    c.model.nhidden = 2;
    c.model.hidden[0] = 64;
    c.model.hidden[1] = 32;
    c.data.source = "synthetic";
    c.data.synthetic_train = 4096;
    c.data.synthetic_test = 256;
    c.max_steps = STEPS;
    c.batch = batch;
    c.eval = 0;
    c.report.quiet = 1;
    c.seed = 7;
    c.opt.lr = 0.01f;
    c.sync.bucket_mb = 0.02; /* several buckets, so overlap has something to overlap */
    c.keep_params = 1;
    return c;
}

static float g_ref[TR_MAX_PARAMS], g_got[TR_MAX_PARAMS];

/* Equivalence of a distributed configuration with a single-rank reference. */
/* Equivalence of a distributed configuration with a single-rank reference, within tol. */
static void expect_close(const char *what, const char *tp, int n, const tally__train_cfg *cfg,
                         const tally__train_cfg *ref_cfg, double tol, int l2) {
    if (tr_train_on(tp, 1, ref_cfg, g_ref, what)) return;
    size_t np = tr->res[0].nparams;
    if (tr_train_on(tp, n, cfg, g_got, what)) return;
    double d = l2 ? tr_rel_l2(g_got, g_ref, np) : tr_max_rel_diff(g_got, g_ref, np);
    const char *measure = l2 ? "relative L2 distance" : "max relative difference";
    printf("%-46s %s %.2e (bound %.0e)\n", what, measure, d, tol);
    TH_CHECK(d <= tol, "%s: %s %.3g > %.0e", what, measure, d, tol);
}

static void expect_same(const char *what, const char *tp, int n, const tally__train_cfg *cfg,
                        const tally__train_cfg *ref_cfg, double tol) {
    expect_close(what, tp, n, cfg, ref_cfg, tol, 0);
}

/* AdamW divides every coordinate by its own running RMS, so where a gradient is mostly rounding noise
 * the two summation orders (one sgemm over N*b samples, or N over b and an allreduce) take visibly
 * different steps of size ~lr: a few coordinates part by nature, not by a fault of the engine, and by how
 * much depends on OpenBLAS's kernel (1.2e-2 element-wise with its SSE ones, 5e-3 with AVX-512's). So
 * AdamW is judged as a whole, by the relative L2 distance (1e-6 to 4e-6 with every kernel here), where a
 * wrong shard or a lost bucket moves the parameters by 1e-2 or more; SGD keeps the element-wise 1e-5. */
#define ADAMW_TOL 1e-4

static void test_equivalence(void) {
    char what[96];
    for (int n = 2; n <= 4; n++) {
        tally__train_cfg ref = base_cfg(TALLY__MODEL_MLP, 4 * n), cfg = base_cfg(TALLY__MODEL_MLP, 4);
        snprintf(what, sizeof what, "mlp sgd: n=%d batch 4 vs n=1 batch %d", n, 4 * n);
        expect_same(what, "shm", n, &cfg, &ref, REL_TOL);
    }
    for (int n = 2; n <= 4; n += 2) {
        tally__train_cfg ref = base_cfg(TALLY__MODEL_MLP, 4 * n), cfg = base_cfg(TALLY__MODEL_MLP, 4);
        tally_optim_cfg_default(&ref.opt.optim, TALLY_OPTIM_ADAMW);
        tally_optim_cfg_default(&cfg.opt.optim, TALLY_OPTIM_ADAMW);
        ref.opt.lr = cfg.opt.lr = 1e-3f;
        snprintf(what, sizeof what, "mlp adamw: n=%d batch 4 vs n=1 batch %d", n, 4 * n);
        expect_close(what, "shm", n, &cfg, &ref, ADAMW_TOL, 1);
    }
    tally__train_cfg ref = base_cfg(TALLY__MODEL_MLP, 16), acc = base_cfg(TALLY__MODEL_MLP, 4);
    acc.sync.accum = 4;
    expect_same("mlp sgd: n=1 accum 4 batch 4 vs batch 16", "shm", 1, &acc, &ref, REL_TOL);
    acc.sync.accum = 2;
    expect_same("mlp sgd: n=2 accum 2 batch 4 vs n=1 batch 16", "shm", 2, &acc, &ref, REL_TOL);
    tally__train_cfg tcp = base_cfg(TALLY__MODEL_MLP, 8), tref = base_cfg(TALLY__MODEL_MLP, 16);
    expect_same("mlp sgd over tcp: n=2 batch 8 vs n=1 batch 16", "tcp", 2, &tcp, &tref, REL_TOL);
    tally__train_cfg cnn = base_cfg(TALLY__MODEL_CNN, 8), cref = base_cfg(TALLY__MODEL_CNN, 16);
    cnn.max_steps = cref.max_steps = th_light() ? 5 : 20;
    expect_same("cnn sgd: n=2 batch 8 vs n=1 batch 16", "shm", 2, &cnn, &cref, REL_TOL);
}

/* Overlap changes when reductions run, never what they compute. */
static void test_overlap_identical(void) {
    for (int n = 2; n <= 3; n++) {
        tally__train_cfg on = base_cfg(TALLY__MODEL_MLP, 8), off = on;
        off.sync.no_overlap = 1;
        char what[64];
        snprintf(what, sizeof what, "overlap on/off n=%d", n);
        if (tr_train_on("shm", n, &on, g_ref, what) || tr_train_on("shm", n, &off, g_got, what)) continue;
        TH_CHECK(!memcmp(g_ref, g_got, tr->res[0].nparams * sizeof(float)),
                 "n=%d: overlap on and off give different parameters", n);
    }
}

static void test_linear_recovers_weights(void) {
    tally__train_cfg c = base_cfg(TALLY__MODEL_LINEAR, 32);
    c.max_steps = 0;
    c.epochs = 3;
    c.eval = 1;
    c.data.source = "fashion-mnist"; /* ignored by the linear model */
    if (tr_train_on("shm", 2, &c, g_got, "linear")) return;
    TH_CHECK(tr->res[0].true_w_len == 9 && tr->res[0].nparams == 9, "linear: %zu parameters, %d true weights",
             tr->res[0].nparams, tr->res[0].true_w_len);
    double worst = 0;
    for (int i = 0; i < 9; i++) worst = fmax(worst, fabs(g_got[i] - tr->res[0].true_w[i]));
    printf("linear: max |w - w_true| = %.4f, test mse %.5f (noise variance 0.01)\n", worst, tr->res[0].test_loss);
    TH_CHECK(worst < 0.02, "linear: weights off by %.4f", worst);
    TH_CHECK(tr->res[0].test_loss < 0.0125, "linear: test mse %.5f, noise alone gives 0.01", tr->res[0].test_loss);
}

static void test_learns(void) {
    tally__train_cfg c = base_cfg(TALLY__MODEL_MLP, 32);
    c.max_steps = 0;
    c.epochs = 2;
    c.eval = 1;
    c.data.synthetic_test = 1000;
    if (tr_train_on("shm", 2, &c, NULL, "mlp learns")) return;
    TH_CHECK(tr->res[0].test_acc > 0.5, "mlp on synthetic data: test accuracy %.3f", tr->res[0].test_acc);
}

static void test_cli(void) {
    if (!getenv("TALLY_BIN")) {
        TH_CHECK(0, "TALLY_BIN is not set");
        return;
    }
    char err[8192], buf[4096];
    char *ok[] = {"tally", "train",   "-n", "2",        "--data", "synthetic", "--steps",
                  "10",    "--batch", "16", "--hidden", "32",     "--no-eval", NULL};
    int rc = tr_run_tally_json(ok, buf, sizeof buf, err, sizeof err);
    TH_CHECK(rc == 0, "tally train -n 2 ... exited %d: %s", rc, err);
    TH_CHECK(strstr(buf, "\"replicas_identical\": true") && strstr(buf, "\"bytes_sent_per_step\"") &&
                 strstr(buf, "\"world\": 2") && strstr(buf, "\"steps\": 10"),
             "summary JSON lacks expected fields: %s", buf);
    /* two ranks on one host talk shm, whose summary says what the gradients' shared buffers do */
    TH_CHECK(strstr(buf, "\"large_messages\": \"tally_mem_alloc buffers"), "large_messages: %s", buf);
    /* a step's compute from step to step: never negative, and for 10 steps of non-negative time at most
     * the mean x sqrt(10) (all of it in one step) */
    const char *sd = strstr(buf, "\"compute_sd\": "), *mean = strstr(buf, "\"compute\": ");
    double sd_ms = sd ? atof(sd + 14) : -1, mean_ms = mean ? atof(mean + 11) : -1;
    TH_CHECK(sd && mean && sd_ms >= 0 && mean_ms > 0 && sd_ms <= mean_ms * 3.17, "step_ms.compute_sd: %s", buf);
    char *bad_model[] = {"tally", "train", "--model", "transformer", NULL};
    rc = tr_run_tally(bad_model, err, sizeof err);
    TH_CHECK(rc == 2 && strstr(err, "--model 'transformer'") && strstr(err, "linear, mlp, cnn or gpt"),
             "unknown model: exit %d, %s", rc, err);
    char *bad_dir[] = {"tally", "train", "--data", "/nonexistent/fmnist", "--steps", "1", NULL};
    rc = tr_run_tally(bad_dir, err, sizeof err);
    TH_CHECK(rc == 1 && strstr(err, "/nonexistent/fmnist"), "missing data dir: exit %d, %s", rc, err);
    char *big_batch[] = {"tally", "train", "--model", "linear", "--batch", "100000", NULL};
    rc = tr_run_tally(big_batch, err, sizeof err);
    TH_CHECK(rc == 1 && strstr(err, "--batch"), "batch larger than the data: exit %d, %s", rc, err);
}

/* One short run of `tally train` with the flags given after the common ones; its --json into buf (or,
 * when it failed, its exit code and stderr). */
static int cli_json(char *const flags[], char *buf, size_t len) {
    char err[4096];
    char *args[32] = {"tally", "train", "-n", "1", "--data", "synthetic:256", "--steps", "2", "--no-eval", "--quiet"};
    int n = 10;
    for (int i = 0; flags[i] && n < 28; i++) args[n++] = flags[i];
    args[n] = NULL;
    int rc = tr_run_tally_json(args, buf, len, err, sizeof err);
    if (rc) snprintf(buf, len, "exit %d: %s", rc, err);
    return rc;
}

/* LeNet-5's training defaults (batch 16, rate 0.025, weight decay 5e-4 with SGD, cosine decay) apply to the cnn
 * only and give way to each flag the user set; the summary names them. */
static void test_cnn_defaults(void) {
    if (!getenv("TALLY_BIN")) {
        TH_CHECK(0, "TALLY_BIN is not set");
        return;
    }
    static const struct {
        const char *what;
        char *flags[12];
        const char *want[4];
    } cases[] = {
        {"cnn, defaults",
         {"--model", "cnn", NULL},
         {"\"batch_per_rank\": 16,", "\"lr\": 0.025,", "\"decay\": \"cosine\"", "\"weight_decay\": 0.0005,"}},
        {"cnn, standardized inputs by default", {"--model", "cnn", NULL}, {"\"normalize\": \"mean-std\""}},
        {"cnn, each flag set",
         {"--model", "cnn", "--batch", "8", "--decay", "none", "--weight-decay", "0", "--normalize", "none", NULL},
         {"\"batch_per_rank\": 8,", "\"decay\": \"none\"", "\"weight_decay\": 0,", "\"normalize\": \"none\""}},
        {"mlp, standardized when asked",
         {"--model", "mlp", "--normalize", "mean-std", NULL},
         {"\"normalize\": \"mean-std\""}},
        {"cnn, adamw keeps its own weight decay",
         {"--model", "cnn", "--optimizer", "adamw", NULL},
         {"\"batch_per_rank\": 16,", "\"decay\": \"cosine\"", "\"weight_decay\": 0.01,"}},
        {"mlp, unchanged",
         {"--model", "mlp", NULL},
         {"\"batch_per_rank\": 64,", "\"decay\": \"none\"", "\"weight_decay\": 0,", "\"normalize\": \"none\""}},
    };
    char buf[8192];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = cli_json((char *const *)cases[i].flags, buf, sizeof buf);
        for (int k = 0; k < 4 && cases[i].want[k]; k++)
            TH_CHECK(!rc && strstr(buf, cases[i].want[k]), "%s: wanted %s in %s", cases[i].what, cases[i].want[k], buf);
    }
    /* standardizing data that holds no images is refused by name, not skipped */
    char *no_images[][10] = {{"--model", "linear", "--normalize", "mean-std", NULL},
                             {"--model", "gpt", "--layers", "1", "--width", "32", "--normalize", "mean-std"}};
    for (int i = 0; i < 2; i++) {
        int rc = cli_json(no_images[i], buf, sizeof buf);
        TH_CHECK(rc == 1 && strstr(buf, "--normalize mean-std standardizes images"), "%s with --normalize: %s",
                 no_images[i][1], buf);
    }
}

/* The slowest rank by hand: work = data + compute + update per step, set against the median of the other
 * ranks' (6 and 5 ms); a rank of no steps (the parameter server) is left out; under two training ranks
 * there is none. */
static void test_find_slowest(void) {
    /* data, compute, wait, update (seconds over the steps), steps */
    const double t[4 * TALLY__TIMES] = {0.1, 0.4, 2.0, 0.1, 100, /* 6 ms a step of work, waits 20 */
                                        0.1, 2.4, 0.0, 0.1, 100, /* 26 ms: the slowest */
                                        0.0, 0.0, 0.0, 0.0, 0,   /* the server */
                                        0.1, 0.3, 1.8, 0.1, 100};
    tally__train_slowest s = tally__train_find_slowest(t, 4);
    TH_CHECK(s.rank == 1 && fabs(s.work_s - 0.026) < 1e-12 && fabs(s.median_s - 0.0055) < 1e-12 &&
                 fabs(s.others_wait - 0.019) < 1e-12,
             "slowest: rank %d, work %.6f s, others' median %.6f s, others wait %.6f s; want 1, 0.026, 0.0055, 0.019",
             s.rank, s.work_s, s.median_s, s.others_wait);
    TH_CHECK(tally__train_find_slowest(t, 1).rank == -1, "one rank has no slowest");
    TH_CHECK(tally__train_find_slowest(t + 2 * TALLY__TIMES, 2).rank == -1, "one training rank has no slowest");
    TH_CHECK(tally__train_find_slowest(NULL, 4).rank == -1, "no times: no slowest");
}

/* --straggler 1:20 sleeps rank 1 in every step: the summary must name it, in text and in --json. */
static void test_straggler_named(void) {
    char json[] = "/tmp/tally_slow_XXXXXX", out[16384];
    int fd = mkstemp(json);
    close(fd);
    char *args[] = {"tally", "train",    "-n", "2",         "--data",      "synthetic", "--steps", "10", "--batch",
                    "16",    "--hidden", "32", "--no-eval", "--straggler", "1:20",      "--json",  json, NULL};
    int rc = tr_run_tally_all(args, out, sizeof out);
    TH_CHECK(rc == 0 && strstr(out, "slowest rank     1: "), "--straggler 1:20: exit %d, summary: %s", rc, out);
    FILE *f = fopen(json, "r");
    char buf[8192] = {0};
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
        fclose(f);
    }
    const char *slow = strstr(buf, "\"slowest\": {\"rank\": 1, \"work_ms\": ");
    double work = slow ? atof(slow + strlen("\"slowest\": {\"rank\": 1, \"work_ms\": ")) : 0;
    TH_CHECK(slow && work >= 20, "--straggler 1:20: --json names %s", buf);
    TH_CHECK(strstr(buf, "\"ranks\": [{\"rank\": 0, \"steps\": 10") != NULL, "--json lacks the ranks: %s", buf);
    unlink(json);
}

/* The named tensors cover the flat buffer exactly, in order, with PyTorch's names and shapes. */
static void test_tensors(void) {
    tally__model m;
    tally__model_cfg cnn = {
        .kind = TALLY__MODEL_CNN, .in_dim = 784, .channels = 1, .height = 28, .width = 28, .outputs = 10};
    TH_CHECK(tally__model_init(&m, &cnn, 4, 1, NULL, 0) == 0, "cnn: %s", tally_last_error());
    static const char *names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                                  "fc1.bias",     "fc2.weight", "fc2.bias",     "fc3.weight", "fc3.bias"};
    TH_CHECK(m.ntensors == 10 && m.nparams == 61706, "cnn: %d tensors, %zu parameters", m.ntensors, m.nparams);
    size_t at = 0;
    for (int i = 0; i < m.ntensors && i < 10; i++) {
        const tally__tensor *t = &m.tensor[i];
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
        TH_CHECK(!strcmp(t->name, names[i]) && t->offset == at && t->count == count && t->param == m.params + at &&
                     t->grad == m.grads + at,
                 "cnn tensor %d: %s at %zu (%zu elements), expected %s at %zu", i, t->name, t->offset, t->count,
                 names[i], at);
        at += t->count;
    }
    TH_CHECK(at == m.nparams, "cnn tensors cover %zu of %zu parameters", at, m.nparams);
    TH_CHECK(m.tensor[0].ndim == 4 && m.tensor[0].shape[0] == 6 && m.tensor[0].shape[1] == 1 &&
                 m.tensor[0].shape[2] == 5 && m.tensor[4].ndim == 2 && m.tensor[4].shape[0] == 120 &&
                 m.tensor[4].shape[1] == 400,
             "cnn shapes: conv1.weight and fc1.weight are not [6,1,5,5] and [120,400]");
    tally__model_free(&m);
}

/* A graph of the caller's own reaches the trainer (cfg.model.build); one that reads token indices is
 * refused by name on the feature-vector data, not fed floats as tokens. */
static int build_tokens(tally__model *m, const tally__model_cfg *cfg) {
    m->token_input = 1;
    int rc = tally__graph_embedding(m, 16, 4, "wte");
    if (!rc) tally__graph_linear(m, 4, cfg->outputs, 0, "head");
    m->positions = cfg->in_dim;
    return rc;
}

static int token_rank(int rank, int size, void *arg) {
    tally__train_cfg c = base_cfg(TALLY__MODEL_MLP, 8);
    c.model.build = build_tokens;
    tally_comm *comm;
    if (tally_comm_init(&comm)) return 2;
    tally__train_result res;
    int rc = tally__train(comm, &c, &res);
    int ok = rc == TALLY_E_INVALID && strstr(tally_last_error(), "reads token indices");
    if (!ok) fprintf(stderr, "rank %d: rc %d: %s\n", rank, rc, tally_last_error());
    tally_comm_free(comm);
    return !ok;
}

static void test_token_model_refused(void) {
    th_opts o = {.transport = "shm", .timeout_s = 30, .wall_s = 120};
    TH_CHECK(th_run(2, &o, token_rank, NULL) == 0, "a token model on feature data was not refused as expected");
}

/* --jitter's delays: exponential with the mean asked (mean and 95th percentile within 3% over 40,000
 * draws), the same for a seed, different across ranks and steps, none without the flag. */
static void test_jitter_draws(void) {
    tally__train_cfg c;
    tally__train_cfg_default(&c);
    TH_CHECK(tally__train_jitter_ms(&c, 0, 1) == 0, "no --jitter, yet a delay");
    c.jitter_ms = 10;
    enum { N = 40000 };
    static double d[N];
    double sum = 0;
    int above = 0;
    for (int i = 0; i < N; i++) {
        d[i] = tally__train_jitter_ms(&c, i % 4, i / 4);
        sum += d[i];
        above += d[i] > 10 * log(20.0); /* exp(-x/10) = 5% past it */
        TH_CHECK(d[i] >= 0 && isfinite(d[i]), "draw %d: %g ms", i, d[i]);
    }
    printf("jitter 10 ms: mean %.3f ms over %d draws, %.2f%% past the 95th percentile\n", sum / N, N,
           100.0 * above / N);
    TH_CHECK(fabs(sum / N - 10) < 0.3, "mean %g ms, want 10", sum / N);
    TH_CHECK(fabs(100.0 * above / N - 5) < 0.15 * 5, "%.2f%% past the 95th percentile, want 5%%", 100.0 * above / N);
    TH_CHECK(tally__train_jitter_ms(&c, 1, 7) == d[7 * 4 + 1], "the same seed, rank and step draw differently");
    TH_CHECK(d[4] != d[5] && d[4] != d[8], "ranks or steps share a draw");
    c.seed++;
    TH_CHECK(tally__train_jitter_ms(&c, 1, 7) != d[7 * 4 + 1], "another seed draws the same");
}

/* --data text:FILE with a model that reads features or images: refused by name (it once divided by zero). */
static void test_text_for_feature_models(void) {
    char path[] = "/tmp/tally_test_text_XXXXXX";
    int fd = mkstemp(path);
    TH_CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
    if (fd < 0) return;
    close(fd);
    static const char line[] = "In the beginning was a short text that no image model can read.\n";
    char text[64 * (sizeof line - 1)];
    for (size_t i = 0; i < 64; i++) memcpy(text + i * (sizeof line - 1), line, sizeof line - 1);
    th_write_file(path, text, sizeof text);
    char data[64], buf[4096];
    snprintf(data, sizeof data, "text:%s", path);
    const char *models[] = {"mlp", "cnn", "linear"};
    for (int i = 0; i < 3; i++) {
        char *flags[] = {"--model", (char *)models[i], "--data", data, NULL};
        int rc = cli_json(flags, buf, sizeof buf);
        TH_CHECK(rc == 1 && strstr(buf, "does not read text") && strstr(buf, models[i]), "%s on text: %s", models[i],
                 buf);
    }
    unlink(path);
}

int main(void) {
    if (th_quick()) {
        test_jitter_draws();
        test_tensors();
        test_find_slowest();
        test_token_model_refused();
        test_equivalence();
        test_overlap_identical();
        test_linear_recovers_weights();
        test_learns();
        test_cli();
        test_cnn_defaults();
        test_text_for_feature_models();
    }
    if (th_long()) test_straggler_named(); /* 10 steps with a rank 20 ms slow in each */
    return th_verdict("test_train");
}
