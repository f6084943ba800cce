/* train_runner.c - forks N ranks that each run tally__train and copy their results into shared
 * memory; the parent checks that they all succeeded and agree. */
#include "train_runner.h"

#include <fcntl.h>
#include <math.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

tr_out *tr;

/* What each forked rank runs. */
typedef struct tr_job {
    const tally__train_cfg *cfg;
    const tally__train_faults *faults; /* NULL: none */
} tr_job;

static int tr_rank(int rank, int size, void *arg) {
    const tr_job *job = arg;
    tally__train_cfg cfg = *job->cfg;
    cfg.keep_params = 1;
    tally__train_faults_arm(job->faults);
    tally_comm *c;
    if (tally_comm_init(&c)) {
        fprintf(stderr, "rank %d: init: %s\n", rank, tally_last_error());
        return 1;
    }
    tally__train_result res;
    int rc = tally__train(c, &cfg, &res);
    if (rc) {
        fprintf(stderr, "rank %d: train: %s\n", rank, tally_last_error());
    } else {
        /* a model too big to bring back is compared by its hash alone */
        if (res.nparams <= TR_MAX_PARAMS) memcpy(tr->params[rank], res.params, res.nparams * sizeof(float));
        memcpy(tr->hash[rank], res.hash, 32);
        tr->identical[rank] = res.replicas_identical;
        tr->res[rank] = res;
        tr->res[rank].params = NULL;
        tr->res[rank].rank_times = NULL;
    }
    tally__train_result_free(&res);
    tally_comm_free(c);
    return rc != 0;
}

int tr_train_faulty(const char *transport, int n, const tally__train_cfg *cfg, const tally__train_faults *faults,
                    float *out, const char *what) {
    if (!tr) tr = th_shared_alloc(sizeof *tr);
    memset(tr, 0, sizeof *tr);
    /* The algorithm is pinned: `auto` chooses by links measured at init, so two runs may sum three or
     * more contributions in different orders, and the tests compare runs bit for bit. rhd's pairwise
     * order is the same however the vector is cut (buckets, layers, shards). */
    th_opts o = {.transport = transport, .algo = "rhd", .timeout_s = 30, .wall_s = 240};
    tr_job job = {cfg, faults};
    int rc = th_run(n, &o, tr_rank, &job);
    TH_CHECK(rc == 0, "%s: n=%d: a rank failed", what, n);
    if (rc) return -1;
    size_t np = tr->res[0].nparams, kept = np <= TR_MAX_PARAMS ? np : 0;
    for (int r = 0; r < n; r++) {
        TH_CHECK(tr->identical[r], "%s: n=%d: rank %d says the replicas differ", what, n, r);
        TH_CHECK(!memcmp(tr->params[0], tr->params[r], kept * sizeof(float)) && !memcmp(tr->hash[0], tr->hash[r], 32),
                 "%s: n=%d: rank %d's parameters are not bit-identical to rank 0's", what, n, r);
    }
    if (out && !kept) {
        TH_CHECK(0, "%s: %zu parameters are more than the test can bring back (%d)", what, np, TR_MAX_PARAMS);
        return -1;
    }
    if (out) memcpy(out, tr->params[0], np * sizeof(float));
    return 0;
}

int tr_train_on(const char *transport, int n, const tally__train_cfg *cfg, float *out, const char *what) {
    return tr_train_faulty(transport, n, cfg, NULL, out, what);
}

double tr_max_rel_diff(const float *a, const float *b, size_t n) {
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]) / fmax(fabs(b[i]), scale * 1e-2));
    return worst;
}

double tr_rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

/* Runs the tally binary with args; returns its exit code and leaves stderr in err. */
static int run_tally(char *const args[], char *err, size_t errlen, int with_stdout) {
    const char *bin = getenv("TALLY_BIN");
    int fd[2];
    if (!bin || pipe(fd)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        int null = open("/dev/null", O_WRONLY);
        dup2(with_stdout ? fd[1] : null, 1);
        close(fd[0]);
        execv(bin, args);
        _exit(127);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t k;
    char rest[4096];
    while ((k = got + 1 < errlen ? read(fd[0], err + got, errlen - 1 - got) : read(fd[0], rest, sizeof rest)) > 0)
        if (got + 1 < errlen) got += (size_t)k; /* past the buffer: read on, so the child never blocks */
    err[got] = 0;
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int tr_run_tally(char *const args[], char *err, size_t errlen) { return run_tally(args, err, errlen, 0); }

int tr_run_tally_all(char *const args[], char *out, size_t outlen) { return run_tally(args, out, outlen, 1); }

int tr_run_tally_json(char *const args[], char *json, size_t jsonlen, char *err, size_t errlen) {
    char path[] = "/tmp/tally_json_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    char *all[32];
    int n = 0;
    while (args[n] && n < 28) {
        all[n] = args[n];
        n++;
    }
    all[n++] = "--json";
    all[n++] = path;
    all[n] = NULL;
    int rc = run_tally(all, err, errlen, 0);
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(json, 1, jsonlen - 1, f) : 0;
    json[got] = 0;
    if (f) fclose(f);
    unlink(path);
    return rc;
}

tally__train_cfg tr_small_cfg(size_t ntrain, long steps, uint64_t seed) {
    tally__train_cfg c;
    tally__train_cfg_default(&c);
    c.model.nhidden = 2;
    c.model.hidden[0] = 20;
    c.model.hidden[1] = 21;
    c.data.source = "synthetic";
    c.data.synthetic_train = ntrain;
    c.data.synthetic_test = ntrain / 16;
    c.max_steps = steps;
    c.batch = 8;
    c.eval = 0;
    c.report.quiet = 1;
    c.seed = seed;
    return c;
}
