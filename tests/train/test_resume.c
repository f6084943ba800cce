/* test_resume.c - checkpoints in training: a run stopped at step K and resumed ends bit-identical to one
 * that never stopped (every ZeRO stage, SGD-momentum and AdamW, a cosine schedule); a checkpoint
 * written at N = 4 under any stage loads at N = 2 and 1, and under any other stage, with the same
 * parameters; a flipped byte, another model or seed, and an empty directory each get their answer; names
 * too long for a checkpoint are refused before the first step. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "ckpt/ckpt.h"
#include "nn/model_build.h"
#include "train_runner.h"

static char g_dir[256];

static tally__train_cfg rcfg(int zero, tally_optim_kind opt, long steps) {
    tally__train_cfg c;
    tally__train_cfg_default(&c);
    c.model.nhidden = 2;
    c.model.hidden[0] = 20;
    c.model.hidden[1] = 21; /* 16361 parameters, a prime: uneven shards at every N */
    c.data.source = "synthetic";
    c.data.synthetic_train = 2048;
    c.data.synthetic_test = 128;
    c.epochs = 3;
    c.max_steps = steps;
    c.batch = 8;
    c.eval = 0;
    c.report.quiet = 1;
    c.seed = 7;
    c.sync.zero = zero;
    c.opt.decay = TALLY_DECAY_COSINE;
    c.opt.warmup_steps = 5;
    tally_optim_cfg_default(&c.opt.optim, opt);
    c.opt.lr = opt == TALLY_OPTIM_ADAMW ? 2e-3f : 0.02f;
    c.ckpt.dir = g_dir;
    return c;
}

static float g_a[TR_MAX_PARAMS], g_b[TR_MAX_PARAMS];

/* Stopped after K steps (no final checkpoint: as if killed), resumed, and run to K + 100. The epoch
 * boundary (128 steps at N = 2) falls inside, so the sampler position is part of what must come back. */
static void test_exact(int zero, tally_optim_kind opt, int n) {
    const long K = 60, END = K + 100;
    char what[96];
    snprintf(what, sizeof what, "resume zero %d %s n=%d", zero, tally_optim_name(opt), n);
    th_rm_dir(g_dir);
    tally__train_cfg straight = rcfg(zero, opt, END);
    straight.ckpt.dir = NULL;
    if (tr_train_on("shm", n, &straight, g_a, what)) return;
    tally__train_cfg first = rcfg(zero, opt, END), second = rcfg(zero, opt, END);
    first.ckpt.every = 20;
    const tally__train_faults halt = {.halt_after = K};
    second.ckpt.resume = 1;
    if (tr_train_faulty("shm", n, &first, &halt, NULL, what) || tr_train_on("shm", n, &second, g_b, what)) return;
    TH_CHECK(tr->res[0].resumed_from == K, "%s: resumed from step %ld", what, tr->res[0].resumed_from);
    TH_CHECK(tr->res[0].steps == END - K, "%s: %ld steps after resuming", what, tr->res[0].steps);
    TH_CHECK(!memcmp(g_a, g_b, tr->res[0].nparams * sizeof(float)),
             "%s: parameters differ from the run that never "
             "stopped (max rel diff %.3g)",
             what, tr_max_rel_diff(g_b, g_a, tr->res[0].nparams));
}

/* Written at N = 4 under stage `zero`; loaded at N = 2 and N = 1 under every stage, for zero steps. */
static void test_any_world(int zero) {
    char what[96];
    snprintf(what, sizeof what, "written at n=4 zero %d", zero);
    th_rm_dir(g_dir);
    tally__train_cfg w = rcfg(zero, TALLY_OPTIM_ADAMW, 30);
    if (tr_train_on("shm", 4, &w, g_a, what)) return;
    for (int n = 2; n >= 1; n--)
        for (int z = 0; z <= 3; z++) {
            if (n == 1 && z) continue; /* one rank has nothing to shard */
            if (th_light() && !(n == 2 && z == 1) && n != 1) continue;
            tally__train_cfg l = rcfg(z, TALLY_OPTIM_ADAMW, 30);
            l.ckpt.resume = 1;
            char w2[192];
            snprintf(w2, sizeof w2, "%s, loaded at n=%d zero %d", what, n, z);
            if (tr_train_on("shm", n, &l, g_b, w2)) continue;
            TH_CHECK(tr->res[0].resumed_from == 30 && tr->res[0].steps == 0, "%s: resumed from %ld, %ld steps", w2,
                     tr->res[0].resumed_from, tr->res[0].steps);
            TH_CHECK(!memcmp(g_a, g_b, tr->res[0].nparams * sizeof(float)), "%s: parameters differ", w2);
        }
    /* ... and trains on from there at another world size. */
    tally__train_cfg more = rcfg(1, TALLY_OPTIM_ADAMW, 40);
    more.ckpt.resume = 1;
    if (!tr_train_on("shm", 2, &more, g_b, "train on at n=2 zero 1"))
        TH_CHECK(tr->res[0].steps == 10, "n=4 -> n=2: %ld steps after resuming", tr->res[0].steps);
}

/* The newest checkpoint's file in g_dir. */
static int newest_file(char *path, size_t n) {
    char latest[300], line[200];
    snprintf(latest, sizeof latest, "%s/LATEST", g_dir);
    FILE *f = fopen(latest, "r");
    if (!f) return -1;
    int rc = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "file ", 5)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(path, n, "%s/%s", g_dir, line + 5);
            rc = 0;
        }
    fclose(f);
    return rc;
}

static int run_cli(const char *extra1, const char *extra2, const char *hidden, char *err, size_t errlen) {
    char *args[24];
    int k = 0;
    const char *base[] = {"tally", "train",   "-n", "2",         "--data",  "synthetic:4096", "--hidden",
                          hidden,  "--steps", "8",  "--no-eval", "--quiet", "--ckpt",         g_dir};
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) args[k++] = (char *)base[i];
    if (extra1) args[k++] = (char *)extra1;
    if (extra2) args[k++] = (char *)extra2;
    args[k] = NULL;
    return tr_run_tally(args, err, errlen);
}

static void test_cli(void) {
    char err[8192], path[512];
    th_rm_dir(g_dir);
    int rc = run_cli("--resume", NULL, "16", err, sizeof err);
    TH_CHECK(rc == 0 && strstr(err, "no checkpoint"), "resume from nothing: exit %d '%s'", rc, err);
    rc = run_cli(NULL, NULL, "16", err, sizeof err);
    TH_CHECK(rc != 0 && strstr(err, "already holds checkpoints") && strstr(err, "--resume"),
             "a fresh run into a used directory: exit %d '%s'", rc, err);
    rc = run_cli("--resume", NULL, "17", err, sizeof err);
    TH_CHECK(rc != 0 && strstr(err, "written for the model"), "another model: exit %d '%s'", rc, err);
    rc = run_cli("--resume", "--seed=3", "16", err, sizeof err);
    TH_CHECK(rc != 0 && strstr(err, "--seed"), "another seed: exit %d '%s'", rc, err);
    /* One byte flipped in fc2.weight's data: refused, naming the tensor. Data begins right after the
     * header and the table, in table order (the format in ckpt/ckpt.h). */
    tally__ckpt *ck = NULL;
    if (newest_file(path, sizeof path) || tally__ckpt_open(path, &ck)) {
        TH_CHECK(0, "no checkpoint to corrupt: %s", tally_last_error());
        return;
    }
    const tally__ckpt_tensor *t = tally__ckpt_find(ck, "param.fc2.weight"), *t0 = tally__ckpt_at(ck, 0);
    long at = t && t0 ? TALLY__CKPT_HEADER_BYTES + (long)tally__ckpt_count(ck) * TALLY__CKPT_ENTRY_BYTES +
                            (long)((const char *)t->data - (const char *)t0->data) + 5
                      : -1;
    tally__ckpt_close(ck);
    TH_CHECK(at > 0, "fc2.weight is in the checkpoint");
    int fd = open(path, O_RDWR);
    unsigned char b;
    if (at < 0 || fd < 0 || pread(fd, &b, 1, at) != 1) {
        TH_CHECK(0, "cannot read %s", path);
        if (fd >= 0) close(fd);
        return;
    }
    b ^= 0x10;
    TH_CHECK(pwrite(fd, &b, 1, at) == 1, "flip a byte");
    close(fd);
    rc = run_cli("--resume", NULL, "16", err, sizeof err);
    TH_CHECK(rc != 0 && strstr(err, "param.fc2.weight"), "flipped byte: exit %d '%s'", rc, err);
}

/* The whole job killed at random instants while it writes a checkpoint every step: each time the
 * newest committed checkpoint loads and the run resumes from it. */
static void test_kill_while_saving(void) {
    th_rm_dir(g_dir);
    const char *bin = getenv("TALLY_BIN");
    if (!bin) {
        TH_CHECK(0, "TALLY_BIN is not set");
        return;
    }
    int kills = th_light() ? 1 : 3;
    if (getenv("TALLY_RESUME_KILLS")) kills = atoi(getenv("TALLY_RESUME_KILLS"));
    unsigned seed = (unsigned)time(NULL);
    fprintf(stderr, "  kill-while-saving seed %u\n", seed);
    srand(seed);
    long last = -1;
    for (int k = 0; k < kills; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            setpgid(0, 0);
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            dup2(null, 2);
            execl(bin, "tally", "train", "-n", "2", "--data", "synthetic:4096", "--hidden", "256,256", "--steps",
                  "100000", "--no-eval", "--quiet", "--ckpt", g_dir, "--ckpt-every", "1", "--resume", (char *)NULL);
            _exit(127);
        }
        setpgid(pid, pid);
        usleep((th_light() ? 3000000 : 800000) + (useconds_t)(rand() % 1500000)); /* after start-up */
        kill(-pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        tally__ckpt *ck = NULL;
        int rc = tally__ckpt_open_latest(g_dir, &ck);
        if (rc == TALLY__CKPT_NONE && last < 0) continue; /* killed before its first commit */
        TH_CHECK(rc == 0, "kill %d: the newest checkpoint does not load: %s", k, tally_last_error());
        if (rc) return;
        long step = (long)tally__ckpt_step(ck);
        /* A start killed before its first commit leaves the previous one newest. */
        TH_CHECK(step >= last, "kill %d: the newest checkpoint is step %ld, the one before was %ld", k, step, last);
        fprintf(stderr, "  kill %d: newest checkpoint step %ld\n", k, step);
        last = step;
        tally__ckpt_close(ck);
    }
}

/* 56 characters: "<it>.weight" fits a tensor's name, "param.<it>.weight" (69) not a checkpoint's. */
#define LONG_LAYER "a_linear_layer_named_at_such_length_that_it_cannot_be_st"
static int build_long(tally__model *m, const tally__model_cfg *cfg) {
    tally__graph_linear(m, cfg->in_dim, cfg->outputs, 0, LONG_LAYER);
    return 0;
}

static int long_name_rank(int rank, int size, void *arg) {
    tally__train_cfg c = rcfg(0, TALLY_OPTIM_SGD, 4);
    c.model.build = build_long;
    tally_comm *comm;
    if (tally_comm_init(&comm)) return 2;
    tally__train_result res;
    int rc = tally__train(comm, &c, &res);
    int ok = rc == TALLY_E_INVALID && strstr(tally_last_error(), "param." LONG_LAYER) &&
             strstr(tally_last_error(), "shorten the model's tensor names");
    if (!ok) fprintf(stderr, "rank %d: rc %d: %s\n", rank, rc, tally_last_error());
    tally_comm_free(comm);
    return !ok;
}

/* Refused at set-up on every rank, naming the entry, and nothing written. */
static void test_long_names(void) {
    th_rm_dir(g_dir);
    th_opts o = {.transport = "shm", .timeout_s = 30, .wall_s = 120};
    TH_CHECK(th_run(2, &o, long_name_rank, NULL) == 0, "long names: a rank did not refuse them as expected");
    tally__ckpt *ck = NULL;
    TH_CHECK(tally__ckpt_open_latest(g_dir, &ck) == TALLY__CKPT_NONE, "long names: a checkpoint was written");
    if (ck) tally__ckpt_close(ck);
    fprintf(stderr, "  a checkpoint entry name of 69 characters: refused before the first step\n");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/tally-test-resume-%d", (int)getpid());
    const tally_optim_kind opts[] = {TALLY_OPTIM_SGD, TALLY_OPTIM_ADAMW};
    /* The quick tier: stage 0 with SGD and stage 3 with AdamW resumed exactly, stage 3 at any world size,
     * the CLI; the long one: the other stages and optimizers, and writers killed while saving. */
    for (int zero = 0; zero <= 3; zero++)
        for (int o = 0; o < 2; o++) {
            if (!((zero == 0 && o == 0) || (zero == 3 && o == 1) ? th_quick() : th_long())) continue;
            if (th_light() && (o != zero % 2 || zero == 1 || zero == 2)) continue; /* the sanitizer pass */
            test_exact(zero, opts[o], 2);
        }
    if (!th_light() && th_long()) test_exact(2, TALLY_OPTIM_ADAMW, 3);
    for (int zero = 0; zero <= 3; zero++)
        if ((zero == 3 ? th_quick() : th_long()) && (!th_light() || zero == 3)) test_any_world(zero);
    if (th_quick()) {
        test_cli();
        test_long_names();
    }
    if (th_long()) test_kill_while_saving();
    th_rm_dir(g_dir);
    return th_verdict("test_resume");
}
