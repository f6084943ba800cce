/* test_hostile_model.c - models and data a hostile or careless user hands tally, end to end through the CLI:
 * a checkpoint with valid CRCs whose model.config is out of bounds or disagrees with its tensors, one whose
 * parameters are NaN, Inf or 3e38, a model asked for on the command line past its bounds, and a text file
 * truncated under a training run. Each is refused at once, by name; nothing spins, emits garbage or dies
 * of a signal. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/file.h"
#include "harness.h"
#include "nn/model.h"
#include "scratch_dir.h"
#include "tool_runner.h"

static th_tool R;

#define expect(cond, what) th_tool_expect(&R, (cond), (what))

/* A text file of n bytes of words, as a corpus. */
static void write_text(const char *path, size_t n) {
    static const char *words[] = {"the ", "model ", "reads ", "bytes ", "and ", "draws ", "one ", "more.\n"};
    FILE *f = fopen(path, "w");
    TH_CHECK(f != NULL, "fopen %s: %s", path, strerror(errno));
    if (!f) return;
    for (size_t k = 0, w = 0; k < n; w = (w * 7 + 3) % 8) {
        size_t len = strlen(words[w]);
        if (len > n - k) len = n - k;
        fwrite(words[w], 1, len, f);
        k += len;
    }
    fclose(f);
}

/* The tiny GPT every case trains: one block of width 16 and 2 heads over a context of 16 bytes. */
#define GPT_FLAGS "--model", "gpt", "--width", "16", "--heads", "2", "--context", "16"

static void train_gpt(const char *dir, const char *layers, const char *resume, const char *steps) {
    char data[360];
    snprintf(data, sizeof data, "text:%s", th_at("corpus.txt"));
    const char *args[] = {"train",   "-n",  "1",       GPT_FLAGS, "--layers", layers, "--data", data,
                          "--steps", steps, "--quiet", "--ckpt",  dir,        resume, NULL};
    th_tool_opts o = {.wall_s = 60};
    th_tool_run(args, &o, &R);
}

static void generate(const char *dir) {
    const char *args[] = {"generate", "--ckpt", dir, "--prompt", "the ", "--tokens", "20", NULL};
    th_tool_opts o = {.wall_s = 30};
    th_tool_run(args, &o, &R);
}

/* ---- a checkpoint copied with edits: its CRCs right, its contents what the edit made them ---- */

typedef struct edit {
    const char *name;     /* the tensor to change */
    int64_t config[3][2]; /* model.config: up to 3 (index + 1, value) pairs, CFG(index, value); 0 for none */
    float value;          /* name's elements from `first` on, `count` of them, become value */
    size_t first, count;
    uint64_t rows; /* > 0: name becomes [rows, its columns], the rows past its own a copy of its first */
    int64_t i64;   /* name is an I64 scalar: it becomes this */
} edit;

static int copy_edited(const char *from, const char *to, const edit *e) {
    tally__ckpt *c = NULL;
    if (tally__ckpt_open_latest(from, &c)) return -1;
    int n = tally__ckpt_count(c), rc = 0;
    tally__ckpt_tensor *t = calloc((size_t)n, sizeof *t);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    for (int i = 0; i < n && !rc; i++) {
        t[i] = *tally__ckpt_at(c, i);
        int mine = e->name && !strcmp(t[i].name, e->name);
        size_t row = t[i].ndim == 2 ? t[i].bytes / t[i].shape[0] : 0;
        if (mine && e->rows) {
            t[i].shape[0] = e->rows;
            t[i].bytes = row * e->rows;
        }
        bufs[i] = malloc(t[i].bytes + 1);
        size_t own = tally__ckpt_at(c, i)->bytes;
        memcpy(bufs[i], t[i].data, own < t[i].bytes ? own : t[i].bytes);
        for (size_t b = own; b < t[i].bytes; b += row) memcpy((char *)bufs[i] + b, t[i].data, row);
        if (mine && t[i].dtype == TALLY_I64) memcpy(bufs[i], &e->i64, sizeof e->i64);
        if (mine && e->count) {
            float *f = bufs[i];
            for (size_t k = e->first; k < e->first + e->count && k < t[i].bytes / 4; k++) f[k] = e->value;
        }
        if (!strcmp(t[i].name, "model.config"))
            for (int k = 0; k < 3; k++)
                if (e->config[k][0] > 0) ((int64_t *)bufs[i])[e->config[k][0] - 1] = e->config[k][1];
        t[i].data = bufs[i];
    }
    tally__ckpt_writer *w = NULL;
    if (!rc) rc = tally__ckpt_write_begin(to, tally__ckpt_step(c), t, n, &w);
    for (int i = 0; i < n && !rc; i++)
        if (t[i].bytes) rc = tally__ckpt_write(w, i, t[i].data, t[i].bytes);
    if (!rc)
        rc = tally__ckpt_write_commit(w, 0);
    else if (w)
        tally__ckpt_write_abort(w);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(t);
    tally__ckpt_close(c);
    return rc;
}

#define CFG(index, value)                                                                                              \
    { (index) + 1, (value) }

/* Copies the checkpoint of "gpt" into dir with edit e and runs generate on it. */
static void generate_edited(const char *dir, edit e) {
    TH_CHECK(copy_edited(th_at("gpt"), th_at(dir), &e) == 0, "rewriting the checkpoint into %s: %s", dir,
             tally_last_error());
    generate(th_at(dir));
}

/* ---- 6: a model.config out of bounds, or at odds with the tensors stored beside it ---- */

static void test_config(void) {
    generate(th_at("gpt"));
    expect(R.rc == 0 && !strncmp(R.out, "the ", 4), "the untouched checkpoint generates");

    /* 10^9 layers: the 14-minute spin through the node limit, now refused before anything is laid out. */
    generate_edited("layers", (edit){.config = {CFG(2, 1000000000)}});
    expect(R.rc == 1 && R.secs < 10 && strstr(R.out, "model.config[2], the gpt model's layers, is 1000000000") &&
               strstr(R.out, "outside 0..16777216"),
           "a model.config of 10^9 layers is refused at once, naming the field, its value and the bound");
    generate_edited("layers1000", (edit){.config = {CFG(2, 1000)}});
    expect(R.rc == 1 && R.secs < 10 && strstr(R.out, "model.config: model gpt: layers 1000 is outside 1..102"),
           "a model.config of 1000 layers is refused by the model's own bound");
    /* 2^32 + 32 was taken as 32 by the cast to int. */
    generate_edited("width", (edit){.config = {CFG(3, (1ll << 32) + 32)}});
    expect(R.rc == 1 && strstr(R.out, "model.config[3]") && strstr(R.out, "width") && strstr(R.out, "4294967328") &&
               strstr(R.out, "outside 0..16777216"),
           "a width past 2^31 is refused before it is cast");
    generate_edited("context", (edit){.config = {CFG(0, (1ll << 32) + 16)}});
    expect(R.rc == 1 && strstr(R.out, "context") && strstr(R.out, "4294967312"), "a context past 2^31 is refused");
    generate_edited("negative", (edit){.config = {CFG(4, -2)}});
    expect(R.rc == 1 && strstr(R.out, "heads") && strstr(R.out, "-2"), "a negative field is refused");
    /* In bounds each, at odds together: 3 heads do not divide a width of 16. */
    generate_edited("heads", (edit){.config = {CFG(4, 3)}});
    expect(R.rc == 1 && strstr(R.out, "not a multiple of its 3 heads"), "heads that do not divide the width");
    /* A width past what may be allocated: laid out, refused by its parameters' count before allocating. */
    generate_edited("huge", (edit){.config = {CFG(3, 1 << 20), CFG(4, 1)}});
    expect(R.rc == 1 && R.secs < 10 && strstr(R.out, "parameters, more than the 2147483648"),
           "a model of 10^13 parameters is refused before it is allocated");
    /* Vocabulary 300 with an embedding of 300 rows: consistent with itself, not with bytes. */
    generate_edited("vocab", (edit){.name = "param.wte.weight", .rows = 300, .config = {CFG(1, 300)}});
    expect(R.rc == 1 && strstr(R.out, "vocabulary of 300") && strstr(R.out, "has 256"),
           "a byte-level model whose vocabulary is not 256 is refused");
    /* Fewer layers than the tensors stored: the extra block is not silently ignored. */
    TH_CHECK(copy_edited(th_at("gpt2"), th_at("fewer"), &(edit){.config = {CFG(2, 1)}}) == 0, "rewriting: %s",
             tally_last_error());
    generate(th_at("fewer"));
    expect(R.rc == 1 && strstr(R.out, "'param.h.1.") && strstr(R.out, "does not have"),
           "a model.config of fewer layers than the tensors stored is refused");
    /* Widths past nhidden, which nothing reads, must be 0. */
    generate_edited("past", (edit){.config = {CFG(10, 64)}});
    expect(R.rc == 1 && strstr(R.out, "model.config[10]") && strstr(R.out, "outside 0..0"),
           "a width past the hidden layers is refused");
}

/* The same bounds on the command line and for tally plan: said by field, at once. */
static void test_flags(void) {
    const char *layers[] = {"train", "-n", "1", "--model", "gpt", "--layers", "1000", "--steps", "1", "--quiet", NULL};
    th_tool_opts o = {.wall_s = 30};
    th_tool_run(layers, &o, &R);
    expect(R.rc != 0 && R.secs < 10 && strstr(R.out, "layers 1000 is outside 1..102"),
           "--layers 1000 is refused by the model's bound");
    const char *plan[] = {"plan", "--model", "gpt", "--context", "16000000", "--workers", "2", NULL};
    th_tool_run(plan, &o, &R);
    expect(R.rc != 0 && R.secs < 10 && strstr(R.out, "context 16000000 is outside 1..1048576"),
           "tally plan refuses a context past the model's bound");

    /* The bounds themselves, straight: every one refuses its first value past it, in no time. */
    tally__model_cfg gpt = {
        .kind = TALLY__MODEL_GPT, .in_dim = 16, .outputs = 256, .layers = 1, .embd = 16, .heads = 2};
    TH_CHECK(tally__model_check(&gpt) == 0, "a small gpt: %s", tally_last_error());
    struct {
        int *field, bad;
        const char *says;
    } cases[] = {{&gpt.layers, TALLY__MODEL_MAX_GPT_LAYERS + 1, "layers 103"},
                 {&gpt.layers, 0, "layers 0"},
                 {&gpt.embd, TALLY__MODEL_MAX_WIDTH + 16, "width 1048592"},
                 {&gpt.heads, 32, "heads 32 is outside 1..16"},
                 {&gpt.in_dim, TALLY__MODEL_MAX_CONTEXT + 1, "context 1048577"},
                 {&gpt.outputs, TALLY__MODEL_MAX_OUTPUTS + 1, "vocabulary 1048577"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tally__model_cfg keep = gpt;
        *cases[i].field = cases[i].bad;
        int rc = tally__model_check(&gpt);
        TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), cases[i].says), "'%s': rc %d, %s", cases[i].says,
                 rc, tally_last_error());
        gpt = keep;
    }
    tally__model_cfg mlp = {.kind = TALLY__MODEL_MLP, .in_dim = 784, .outputs = 10, .nhidden = 2, .hidden = {16, -5}};
    TH_CHECK(tally__model_check(&mlp) == TALLY_E_INVALID && strstr(tally_last_error(), "hidden layer 1's width -5"),
             "a negative hidden width: %s", tally_last_error());
    tally__model_cfg cnn = {
        .kind = TALLY__MODEL_CNN, .in_dim = 784, .outputs = 10, .channels = 1, .height = 28, .width = 29};
    TH_CHECK(tally__model_check(&cnn) == TALLY_E_INVALID && strstr(tally_last_error(), "images of 1x28x29"),
             "a CNN whose geometry is not its inputs: %s", tally_last_error());
    /* Activations: a context of 2^16 at batch 64 is 2^42 bytes of attention alone. */
    gpt.in_dim = 1 << 16;
    tally__model m;
    int rc = tally__model_init(&m, &gpt, 64, 1, NULL, 0);
    TH_CHECK(rc == TALLY_E_INVALID && strstr(tally_last_error(), "activations at batch 64"), "rc %d: %s", rc,
             tally_last_error());
    if (!rc) tally__model_free(&m);
}

/* ---- 7: parameters that are not numbers, or too large for a forward pass ---- */

static void test_nonfinite(void) {
    generate_edited("nan", (edit){.name = "param.h.0.c_fc.weight", .value = NAN, .first = 37, .count = 1});
    expect(R.rc == 1 && strstr(R.out, "'param.h.0.c_fc.weight' holds NaN at [2, 5] (element 37 of 1024)"),
           "a NaN parameter is refused at load, naming the tensor and the element");
    expect(R.len < 4 || strncmp(R.out, "the ", 4), "nothing is printed before the refusal");
    generate_edited("inf", (edit){.name = "param.wte.weight", .value = -INFINITY, .first = 4000, .count = 2});
    expect(R.rc == 1 && strstr(R.out, "'param.wte.weight' holds -Inf at [250, 0]"), "an infinite parameter");
    /* 3e38 is a float: loaded, and the first forward pass overflows; refused, not 20 NUL bytes. */
    generate_edited("huge-values", (edit){.name = "param.wte.weight", .value = 3e38f, .first = 0, .count = 4096});
    expect(R.rc == 1 && strstr(R.out, "forward pass overflows") && !memchr(R.out, '\0', R.len),
           "parameters of 3e38 end in an error, not NUL bytes");

    /* --resume refuses it too: the parameters, and the optimizer's state (AdamW's exp_avg_sq). */
    TH_CHECK(copy_edited(th_at("gpt"), th_at("resume-nan"),
                         &(edit){.name = "param.ln_f.bias", .value = NAN, .first = 3, .count = 1}) == 0,
             "rewriting: %s", tally_last_error());
    train_gpt(th_at("resume-nan"), "1", "--resume", "4");
    expect(R.rc == 1 && strstr(R.out, "'param.ln_f.bias' holds NaN at [3]"), "--resume refuses a NaN parameter");
    TH_CHECK(copy_edited(
                 th_at("gpt"), th_at("resume-inf"),
                 &(edit){.name = "optim.h.0.c_attn.weight.exp_avg_sq", .value = INFINITY, .first = 100, .count = 1}) ==
                 0,
             "rewriting: %s", tally_last_error());
    train_gpt(th_at("resume-inf"), "1", "--resume", "4");
    expect(R.rc == 1 && strstr(R.out, "'optim.h.0.c_attn.weight.exp_avg_sq' holds +Inf"),
           "--resume refuses infinite optimizer state");
    /* And a count of the optimizer's updates that no run reaches (AdamW's bias correction divides by it). */
    TH_CHECK(copy_edited(th_at("gpt"), th_at("resume-step"), &(edit){.name = "optim.step", .i64 = -5}) == 0,
             "rewriting: %s", tally_last_error());
    train_gpt(th_at("resume-step"), "1", "--resume", "4");
    expect(R.rc == 1 && strstr(R.out, "optim.step is -5, outside 0..4503599627370496"),
           "--resume refuses a negative optimizer step");
}

/* ---- 8: a text file truncated under the trainer ---- */

typedef struct shrink {
    const char *path;
    double after_s;
} shrink;

static void *truncate_later(void *arg) {
    const shrink *s = arg;
    nanosleep(&(struct timespec){(time_t)s->after_s, (long)((s->after_s - (time_t)s->after_s) * 1e9)}, NULL);
    if (truncate(s->path, 0) != 0) fprintf(stderr, "test_hostile_model: truncate: %s\n", strerror(errno));
    return NULL;
}

static void test_text_shrinks(void) {
    /* While it runs: a mapped file faulted with SIGBUS (exit 135) at the first window past its new end. */
    write_text(th_at("shrinking.txt"), 1 << 20);
    char data[360];
    snprintf(data, sizeof data, "text:%s", th_at("shrinking.txt"));
    /* About 2 s here (a sanitized build is slower: fewer steps); the file is read within 0.2 s of the start. */
    const char *args[] = {"train",   "-n",     "1",  GPT_FLAGS, "--layers",
                          "1",       "--data", data, "--steps", th_light() ? "300" : "800",
                          "--quiet", NULL};
    shrink s = {th_at("shrinking.txt"), 0.3};
    pthread_t th;
    pthread_create(&th, NULL, truncate_later, &s);
    th_tool_opts o = {.wall_s = 60};
    th_tool_run(args, &o, &R);
    pthread_join(th, NULL);
    struct stat st;
    TH_CHECK(stat(s.path, &st) == 0 && st.st_size == 0, "the file was not truncated during the run");
    expect(!R.timed_out && R.rc < 128 && (R.rc == 0 || strstr(R.out, "shrinking.txt")),
           "a text file truncated under a run: the run goes on with what it read, or names the file; no signal");
    expect(R.secs > s.after_s, "the run lasted past the truncation (make it longer if it did not)");
    /* Before: an empty file is refused by name. */
    const char *empty[] = {"train",  "-n", "1",       GPT_FLAGS, "--layers", "1",
                           "--data", data, "--steps", "1",       "--quiet",  NULL};
    th_tool_run(empty, &o, &R);
    expect(R.rc == 1 && strstr(R.out, "shrinking.txt: the file is empty"), "an empty text file is refused by name");

    /* While it is read: the file is shorter than the size it had when opened. */
    write_text(th_at("short.txt"), 1000);
    int fd;
    uint64_t size;
    TH_CHECK(tally__file_open_read(AT_FDCWD, th_at("short.txt"), "short.txt", &fd, &size) == 0 && size == 1000,
             "open: %s", tally_last_error());
    unsigned char *buf = NULL;
    TH_CHECK(truncate(th_at("short.txt"), 400) == 0, "truncate: %s", strerror(errno));
    int rc = tally__file_read_all(fd, "short.txt", size, &buf);
    TH_CHECK(rc == TALLY_E_INVALID && !buf &&
                 strstr(tally_last_error(), "short.txt: the file shrank while it was read") &&
                 strstr(tally_last_error(), "it had 1000 bytes, and it ends after 400"),
             "a file that shrinks while it is read: rc %d, %s", rc, tally_last_error());
    close(fd);
}

int main(void) {
    if (!th_scratch_make("tally-hostile-model", 0700)) return 1;
    write_text(th_at("corpus.txt"), 20000);
    train_gpt(th_at("gpt"), "1", NULL, "2");
    expect(R.rc == 0, "a checkpoint to rewrite");
    train_gpt(th_at("gpt2"), "2", NULL, "1");
    expect(R.rc == 0, "a checkpoint of two layers");
    test_config();
    test_flags();
    test_nonfinite();
    test_text_shrinks();
    th_scratch_remove();
    return th_verdict("test_hostile_model");
}
