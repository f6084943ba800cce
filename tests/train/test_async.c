/* test_async.c - asynchronous training: staleness 0 against sync (N = 2, 3; SGD momentum, AdamW), the bound
 * under a straggler, --ps, a shared quota, the server alone (model sizes 0, 1, odd, large; a worker torn
 * mid-push), a worker rank killed mid-run, and the refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/boot_int.h"
#include "boot/net.h"
#include "core/clock.h"
#include "harness.h"
#include "ps/ps.h"
#include "train_runner.h"

/* The bound the issue sets: staleness 0 is the synchronous step, summed in worker order where the
 * allreduce's order is rhd's (the same for N = 2 and 3). */
#define REL_TOL 1e-5
#define STEPS   30
#define P_MLP   (784 * 20 + 20 + 20 * 21 + 21 + 21 * 10 + 10)

static tally__train_cfg acfg(tally_optim_kind opt) {
    tally__train_cfg c = tr_small_cfg(4096, STEPS, 5);
    tally_optim_cfg_default(&c.opt.optim, opt);
    c.opt.lr = opt == TALLY_OPTIM_ADAMW ? 1e-3f : 0.01f;
    return c;
}

static float g_ref[TR_MAX_PARAMS], g_got[TR_MAX_PARAMS];

static void test_bsp_equals_sync(void) {
    const tally_optim_kind opts[] = {TALLY_OPTIM_SGD, TALLY_OPTIM_ADAMW};
    for (int n = 2; n <= 3; n++)
        for (int o = 0; o < 2; o++) {
            char what[96];
            tally__train_cfg c = acfg(opts[o]);
            c.opt.warmup_steps = 5; /* the server must take each round's rate from the schedule */
            c.opt.decay = TALLY_DECAY_COSINE;
            snprintf(what, sizeof what, "sync %s n=%d", tally_optim_name(opts[o]), n);
            if (tr_train_on("shm", n, &c, g_ref, what)) continue;
            c.async.enabled = 1;
            snprintf(what, sizeof what, "async S=0 %s n=%d", tally_optim_name(opts[o]), n);
            if (tr_train_on("shm", n, &c, g_got, what)) continue;
            double d = tr_max_rel_diff(g_got, g_ref, P_MLP);
            printf("%-24s vs sync: max relative difference %.2e (bound %.0e)\n", what, d, REL_TOL);
            TH_CHECK(d <= REL_TOL, "%s: max relative difference %.3g > %.0e", what, d, REL_TOL);
            const tally__train_result *r = &tr->res[0];
            TH_CHECK(r->ps_pushes == (long)n * STEPS && r->ps_updates == STEPS && r->max_staleness == 0 &&
                         r->staleness_hist[0] == (long)n * STEPS,
                     "%s: %ld pushes, %ld server steps, max staleness %ld", what, r->ps_pushes, r->ps_updates,
                     r->max_staleness);
        }
}

/* Every applied gradient within the bound, and the straggler makes some of them stale. */
static void test_bound_under_straggler(void) {
    const long S = 2;
    tally__train_cfg c = acfg(TALLY_OPTIM_SGD);
    c.async.enabled = 1;
    c.async.staleness = S;
    c.straggler_rank = 1;
    c.straggler_ms = 20;
    c.max_steps = th_light() ? 12 : 20;
    c.eval = 1;
    if (tr_train_on("shm", 3, &c, NULL, "async S=2 straggler 1:20")) return;
    const tally__train_result *r = &tr->res[0];
    long in = 0, stale = 0;
    for (int i = 0; i < TALLY__TRAIN_STALE_BINS; i++) {
        if (i <= S) in += r->staleness_hist[i];
        if (i > 0) stale += r->staleness_hist[i];
    }
    printf("S=2 under a straggler: staleness 0:%ld 1:%ld 2:%ld, max %ld, %ld of %ld pulls held back\n",
           r->staleness_hist[0], r->staleness_hist[1], r->staleness_hist[2], r->max_staleness, r->pulls_waited,
           r->pulls);
    TH_CHECK(r->max_staleness <= S && in == r->ps_pushes && r->ps_pushes == 3 * c.max_steps,
             "staleness beyond the bound: max %ld, %ld of %ld pushes within %ld", r->max_staleness, in, r->ps_pushes,
             S);
    TH_CHECK(stale > 0 && r->pulls_waited > 0, "a straggler made no gradient stale (%ld) or held no pull (%ld)", stale,
             r->pulls_waited);
    TH_CHECK(r->evaluated && r->test_acc >= 0 && r->test_acc <= 1, "evaluation after async training: %d, accuracy %g",
             r->evaluated, r->test_acc);
}

static void test_dedicated(void) {
    tally__train_cfg c = acfg(TALLY_OPTIM_ADAMW);
    c.async.enabled = 1;
    c.async.staleness = 1;
    c.async.ps_dedicated = 1;
    c.async.stale_lr = TALLY__STALE_LR_NONE;
    if (tr_train_on("tcp", 3, &c, NULL, "async S=1 --ps n=3")) return;
    const tally__train_result *r = &tr->res[0];
    TH_CHECK(r->workers == 2 && r->ps_pushes == 2 * STEPS && r->ps_updates == 2 * STEPS && r->max_staleness <= 1,
             "--ps: %d workers, %ld pushes, %ld steps, max staleness %ld", r->workers, r->ps_pushes, r->ps_updates,
             r->max_staleness);
}

/* A shared quota: the steps x workers gradients in all, the fast workers computing more of them. */
static void test_shared_quota(void) {
    tally__train_cfg c = acfg(TALLY_OPTIM_SGD);
    c.async.enabled = 1;
    c.async.staleness = 8;
    c.async.shared_quota = 1;
    c.straggler_rank = 1;
    c.straggler_ms = 20;
    c.max_steps = 20;
    if (tr_train_on("shm", 3, &c, NULL, "async S=8 --quota shared")) return;
    const tally__train_result *r = tr->res;
    printf("shared quota under a straggler: steps per worker %ld %ld %ld, max staleness %ld\n", r[0].steps, r[1].steps,
           r[2].steps, r[0].max_staleness);
    TH_CHECK(r[0].ps_pushes == 3 * c.max_steps && r[0].steps + r[1].steps + r[2].steps == 3 * c.max_steps,
             "shared quota: %ld pushes, steps %ld + %ld + %ld, expected %ld in all", r[0].ps_pushes, r[0].steps,
             r[1].steps, r[2].steps, 3 * c.max_steps);
    TH_CHECK(r[1].steps < r[0].steps && r[1].steps < r[2].steps && r[0].max_staleness <= 8,
             "the straggler computed as many steps as the others (%ld, %ld, %ld) or staleness %ld > 8", r[0].steps,
             r[1].steps, r[2].steps, r[0].max_staleness);
}

/* ---- the server at the module level: workers in forked processes ---- */

#define MOD_MAX  100003 /* the large size class (prime) */
#define W0_STEPS 10
#define W1_STEPS 3 /* worker 1's complete pushes before the torn one */
#define TEAR_S   4

static size_t g_n; /* the model size of the run in progress */

/* Dyadic values with lr 1 and two workers: every sum is exact, so neither the order of arrival nor
 * S changes the result, and the reference is exact. */
static float mod_grad(int w, long c, size_t i) { return (float)((int)(i % 7) + w + 1) * (float)(c + 1) / 16.0f; }

static const char mod_token[] = "test-token";

/* Worker 1 of a torn run sends a pull, then the header of a push and half its payload, and exits. */
static int mod_tear(tally__ps_worker *k, int w, long c, float *p, float *g) {
    long stale;
    if (tally__ps_worker_pull(k, c, p, &stale)) return 13;
    for (size_t i = 0; i < g_n; i++) g[i] = 1e6f; /* would show in the parameters if applied */
    unsigned char b[TALLY__PS_HDR] = {0};         /* the header as the wire format defines it */
    tally__put_be32(b, TALLY__PS_MAGIC);
    tally__put_be32(b + 4, TALLY__PS_PUSH);
    tally__put_be32(b + 8, (uint32_t)w);
    tally__put_be64(b + 16, (uint64_t)c);
    tally__put_be32(b + 24, (uint32_t)(g_n * sizeof(float)));
    uint64_t dl = tally__deadline(5);
    if (tally__net_send_all(k->fd, b, sizeof b, dl) || tally__net_send_all(k->fd, g, g_n * sizeof(float) / 2, dl))
        return 14;
    return 0;
}

static int mod_worker(int w, int port, int tear, long S) {
    tally__ps_worker k;
    static float p[MOD_MAX + 1], g[MOD_MAX + 1];
    if (tally__ps_worker_connect(&k, "127.0.0.1", port, mod_token, strlen(mod_token), w, w, g_n, 20)) return 10;
    long steps = w == 1 && tear ? W1_STEPS : W0_STEPS, stale;
    for (long c = 0; c < steps; c++) {
        for (size_t i = 0; i < g_n; i++) g[i] = mod_grad(w, c, i);
        if (tally__ps_worker_pull(&k, c, p, &stale) || stale > S || tally__ps_worker_push(&k, c, g)) return 11;
    }
    if (w == 1 && tear) return mod_tear(&k, w, steps, p, g);
    return tally__ps_worker_bye(&k, steps) ? 12 : 0;
}

/* Server in this process, two workers forked; with tear, worker 1 dies in the middle of a push. */
static void mod_run(size_t n, long S, int tear) {
    static float init[MOD_MAX + 1];
    char what[64];
    snprintf(what, sizeof what, "server n=%zu S=%ld%s", n, S, tear ? " torn push" : "");
    g_n = n;
    tally__ps_cfg pc = {.nworkers = 2,
                        .staleness = S,
                        .stale_lr = TALLY__STALE_LR_NONE,
                        .nparams = n,
                        .init = init,
                        .sched = {.lr = 1.0f},
                        .token = mod_token,
                        .token_len = strlen(mod_token),
                        .host = "127.0.0.1",
                        .timeout_s = 20};
    tally_optim_cfg_default(&pc.optim, TALLY_OPTIM_SGD);
    pc.optim.momentum = 0;
    tally__ps_server *s;
    if (tally__ps_server_create(&s, &pc)) {
        TH_CHECK(0, "%s: %s", what, tally_last_error());
        return;
    }
    int port = tally__ps_server_port(s);
    pid_t pid[2];
    for (int w = 0; w < 2; w++)
        if ((pid[w] = fork()) == 0) _exit(mod_worker(w, port, tear, S));
    int rc = tally__ps_server_run(s);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tally_last_error());
    int st[2];
    for (int w = 0; w < 2; w++) waitpid(pid[w], &st[w], 0);
    const tally__ps_stats *ps = tally__ps_server_stats(s);
    long w1 = tear ? W1_STEPS : W0_STEPS;
    if (tear) {
        printf("%s: the server returned %d: %s\n", what, rc, msg);
        TH_CHECK(rc == TALLY_E_PEER_LOST && th_first_rank_named(msg) == 1 && strstr(msg, "after 3 applied"),
                 "%s: the server's verdict on a worker that died: %d, %s", what, rc, msg);
        TH_CHECK(ps->dead_rank == 1 && ps->dead_clock == W1_STEPS, "%s: dead rank %d at clock %ld", what, ps->dead_rank,
                 ps->dead_clock);
    } else {
        TH_CHECK(rc == 0 && ps->dead_rank == -1, "%s: %d, %s", what, rc, msg);
    }
    TH_CHECK(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0 && WIFEXITED(st[1]) && WEXITSTATUS(st[1]) == 0,
             "%s: a worker was held or failed: status %d %d", what, st[0], st[1]);
    TH_CHECK(ps->pushes == W0_STEPS + w1 && ps->max_staleness <= S,
             "%s: %ld pushes applied, %ld complete; staleness %ld", what, ps->pushes, W0_STEPS + w1, ps->max_staleness);
    const float *p = tally__ps_server_params(s);
    size_t bad = n;
    for (size_t i = n; i-- > 0;) {
        float want = 0;
        for (long c = 0; c < W0_STEPS; c++) want -= mod_grad(0, c, i) / 2;
        for (long c = 0; c < w1; c++) want -= mod_grad(1, c, i) / 2;
        if (p[i] != want) bad = i;
    }
    TH_CHECK(bad == n, "%s: parameter %zu is not that of exactly the complete pushes", what, bad);
    tally__ps_server_free(s);
}

static void test_module(void) {
    const size_t sizes[] = {0, 1, 1001, MOD_MAX};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        mod_run(sizes[k], 0, 0);
        mod_run(sizes[k], 3, 0);
    }
    mod_run(1001, TEAR_S, 1);
    mod_run(MOD_MAX, TEAR_S, 1);
}

/* A worker rank killed in a real run: rank 0's server names it, the others are not held, and the run
 * ends with an error on every rank instead of a hang. */
typedef struct kill_out {
    int rc[3];
    char msg[3][1024];
} kill_out;
static kill_out *g_kill;

static int kill_rank(int rank, int size, void *arg) {
    tally__train_cfg c = *(const tally__train_cfg *)arg;
    tally__train_faults_arm(&(tally__train_faults){.kill_rank = 2, .kill_step = 8}); /* this rank's process only */
    tally_comm *comm;
    if (tally_comm_init(&comm)) return 1;
    tally__train_result res;
    g_kill->rc[rank] = tally__train(comm, &c, &res);
    snprintf(g_kill->msg[rank], sizeof g_kill->msg[rank], "%s", tally_last_error());
    tally__train_result_free(&res);
    tally_comm_free(comm);
    return 0;
}

static void test_killed_rank(void) {
    if (!g_kill) g_kill = th_shared_alloc(sizeof *g_kill);
    tally__train_cfg c = acfg(TALLY_OPTIM_SGD);
    c.async.enabled = 1;
    c.async.staleness = 2;
    c.straggler_rank = 1;
    c.straggler_ms = 5;
    th_opts o = {.transport = "shm", .timeout_s = 20, .wall_s = 60};
    th_job job;
    double t0 = th_now();
    if (th_start(&job, 3, &o, kill_rank, &c)) {
        TH_CHECK(0, "could not start 3 ranks");
        return;
    }
    th_wait(&job, 60);
    double took = th_now() - t0;
    printf("rank 2 killed at step 8: rank 0 ended with %d after %.1f s: %s\n", g_kill->rc[0], took, g_kill->msg[0]);
    TH_CHECK(g_kill->rc[0] == TALLY_E_PEER_LOST && th_first_rank_named(g_kill->msg[0]) == 2 &&
                 strstr(g_kill->msg[0], "parameter server"),
             "rank 0 after rank 2 died: %d, %s (rank 2: %d, %s)", g_kill->rc[0], g_kill->msg[0], g_kill->rc[2],
             g_kill->msg[2]);
    TH_CHECK(g_kill->rc[1] != 0 && !job.killed_by_harness[0] && !job.killed_by_harness[1] && took < 30,
             "rank 1 ended with %d (%s); a rank hung: %d %d, %.1f s", g_kill->rc[1], g_kill->msg[1],
             job.killed_by_harness[0], job.killed_by_harness[1], took);
}

static void test_refused(void) {
    struct {
        const char *flags[4], *want;
    } cases[] = {
        {{"--zero", "1"}, "does not work with --zero"},
        {{"--accum", "2"}, "does not work with --accum"},
        {{"--ckpt", "/nonexistent-async-ckpt"}, "does not work with --ckpt"},
        {{"--compress", "fp16"}, "does not work with --compress"},
        {{"--ps"}, "at least 2 ranks"},
    };
    char err[4096];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *args[16] = {"tally",   "train", "-n",      "1",      "--data", "synthetic:256",
                          "--steps", "2",     "--quiet", "--mode", "async"};
        int k = 11;
        for (int j = 0; j < 4 && cases[i].flags[j]; j++) args[k++] = (char *)cases[i].flags[j];
        int rc = tr_run_tally(args, err, sizeof err);
        TH_CHECK(rc == 1 && strstr(err, cases[i].want), "--mode async %s: exit %d, %s", cases[i].flags[0], rc, err);
    }
    char *negative[] = {"tally", "train", "-n", "1", "--mode", "async", "--staleness", "-1", NULL};
    int rc = tr_run_tally(negative, err, sizeof err);
    TH_CHECK(rc == 2 && strstr(err, "--staleness '-1' is out of range"), "--staleness -1: exit %d, %s", rc, err);
    char *sync_only[] = {"tally", "train", "-n", "1", "--staleness", "2", NULL};
    rc = tr_run_tally(sync_only, err, sizeof err);
    TH_CHECK(rc == 2 && strstr(err, "need --mode async"), "--staleness without --mode async: exit %d, %s", rc, err);
}

/* --stale-lr auto (the default) damps stale gradients at a constant rate and not where --decay lowers the
 * rate already; a value given is kept. The summary's JSON says which was applied. */
static void test_stale_lr_auto(void) {
    static const struct {
        const char *flags[4], *want;
    } cases[] = {
        {{NULL}, "\"stale_lr\": \"inverse\""},
        {{"--decay", "cosine"}, "\"stale_lr\": \"none\""},
        {{"--decay", "step"}, "\"stale_lr\": \"none\""},
        {{"--decay", "cosine", "--stale-lr", "inverse"}, "\"stale_lr\": \"inverse\""},
        {{"--stale-lr", "none"}, "\"stale_lr\": \"none\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[4096], buf[8192];
        char *args[24] = {"tally", "train",   "-n",        "2",      "--data", "synthetic:256", "--steps",
                          "4",     "--quiet", "--no-eval", "--mode", "async",  "--staleness",   "1"};
        int k = 14;
        for (int j = 0; j < 4 && cases[i].flags[j]; j++) args[k++] = (char *)cases[i].flags[j];
        int rc = tr_run_tally_json(args, buf, sizeof buf, err, sizeof err);
        TH_CHECK(rc == 0 && strstr(buf, cases[i].want), "--stale-lr by default with %s %s: exit %d, wanted %s: %s%s",
                 cases[i].flags[0] ? cases[i].flags[0] : "no flags", cases[i].flags[1] ? cases[i].flags[1] : "", rc,
                 cases[i].want, err, buf);
    }
}

int main(void) {
    if (th_quick()) {
        test_module();
        test_refused();
        test_stale_lr_auto();
        test_bsp_equals_sync();
        test_dedicated();
        test_killed_rank();
    }
    if (th_long()) { /* a straggler's pace, and a quota shared by several runs */
        test_bound_under_straggler();
        test_shared_quota();
    }
    return th_verdict("test_async");
}
