/* train_text.c - a training run on text: the corpus (--data text:FILE, or the King James Bible of
 * Debian's bible-kjv, extracted once into a cache file), each step's windows, the validation loss. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../core/err.h"
#include "../core/file.h"
#include "trainer_int.h"

#define TEXT_PREFIX "text:"
#define KJV_PROGRAM "/usr/bin/bible"
#define KJV_RANGE   "gen1:1-rev22:21" /* every verse, Genesis to Revelation */
#define KJV_FILE    "kjv-bible.txt"
#define KJV_WAIT_S  60

extern char **environ;

/* <cache>/tally, where cache is the data config's cache directory (the CLI's: $XDG_CACHE_HOME, or
 * ~/.cache): made when absent. */
static int cache_dir(const char *cache, char *buf, size_t n, int rank) {
    if (!cache || !*cache)
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: no cache directory for the default corpus (tally train takes "
                             "XDG_CACHE_HOME, else HOME, and neither is set); give --data text:FILE",
                             rank);
    snprintf(buf, n, "%s", cache);
    size_t len = strlen(buf);
    if (mkdir(buf, 0755) && errno != EEXIST) goto fail;
    snprintf(buf + len, n - len, "/tally");
    if (mkdir(buf, 0755) && errno != EEXIST) goto fail;
    return 0;
fail:
    return tally__seterr(TALLY_E_SYSTEM, "rank %d: cannot make the cache directory %s: %s; give --data text:FILE", rank,
                         buf, strerror(errno));
}

/* Runs `bible -f RANGE` with its output into fd; bounded: a program that does not finish is killed. */
static int run_bible(int fd, int rank) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
    char *argv[] = {"bible", "-f", KJV_RANGE, NULL};
    pid_t pid;
    int e = posix_spawn(&pid, KJV_PROGRAM, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e)
        return tally__seterr(TALLY_E_SYSTEM,
                             "rank %d: cannot run %s (%s): the default corpus is Debian's bible-kjv "
                             "package; install it (apt-get install bible-kjv, or scripts/deps.sh) "
                             "or give --data text:FILE",
                             rank, KJV_PROGRAM, strerror(e));
    int st = 0;
    for (int waited_ms = 0; waitpid(pid, &st, WNOHANG) == 0; waited_ms += 10) {
        if (waited_ms >= KJV_WAIT_S * 1000) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return tally__seterr(TALLY_E_TIMEOUT, "rank %d: %s -f %s did not finish in %d s", rank, KJV_PROGRAM,
                                 KJV_RANGE, KJV_WAIT_S);
        }
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        return tally__seterr(TALLY_E_SYSTEM, "rank %d: %s -f %s failed (status %d)", rank, KJV_PROGRAM, KJV_RANGE,
                             WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
}

/* The cache file, extracted when absent: written beside it and renamed, so ranks that extract at once
 * each leave a whole file and a reader never sees half of one. */
static int default_corpus(const char *cache, char *path, size_t n, int rank) {
    int rc = cache_dir(cache, path, n, rank);
    if (rc) return rc;
    size_t len = strlen(path);
    snprintf(path + len, n - len, "/%s", KJV_FILE);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) return 0;
    tally__file_out o;
    if ((rc = tally__file_out_open(&o, path))) return rc;
    if ((rc = run_bible(o.fd, rank))) { /* nothing written through o.f yet: the child's bytes come first */
        tally__file_out_abort(&o);
        return rc;
    }
    return tally__file_out_commit(&o);
}

int tally__train_text_open(train_run *r, tally__train_result *res) {
    const tally__train_cfg *cfg = r->cfg;
    const char *src = cfg->data.source, *path;
    int rc;
    if (src && !strncmp(src, TEXT_PREFIX, strlen(TEXT_PREFIX))) {
        path = src + strlen(TEXT_PREFIX);
        res->data_name = path;
    } else if (!src || !strcmp(src, TALLY__TRAIN_DATA_DEFAULT)) { /* the default, not asked for */
        if ((rc = default_corpus(cfg->data.cache_dir, r->text_path, sizeof r->text_path, r->rank))) return rc;
        path = r->text_path;
        res->data_name = "King James Bible (bible-kjv)";
    } else {
        return tally__seterr(TALLY_E_INVALID,
                             "rank %d: this model trains on text: give --data text:FILE, or no --data "
                             "for the King James Bible (not --data %s)",
                             r->rank, src);
    }
    if ((rc = tally_text_open(path, cfg->data.val_frac, &r->text))) return rc;
    r->tokens = 1;
    return 0;
}

void tally__train_text_batch(train_run *r, long step, int k, int worker, int workers) {
    int B = r->cfg->batch, T = r->model.cfg.in_dim;
    size_t *starts = r->idx;
    tally_text_train_starts(&r->text, r->cfg->seed, step, T, ((size_t)k * workers + worker) * B, B, starts);
    int32_t *tok = (int32_t *)r->xb;
    for (int s = 0; s < B; s++) tally_text_window(&r->text, starts[s], T, tok + (size_t)s * T, r->yb + (size_t)s * T);
}

long tally__train_text_steps_per_epoch(const train_run *r, int T, int workers) {
    size_t per_step = (size_t)r->cfg->batch * r->cfg->sync.accum * workers * (size_t)T;
    long steps = (long)(r->text.train_n / per_step);
    return steps > 0 ? steps : 1;
}

static int val_windows(const train_run *r) {
    return r->cfg->data.val_windows ? r->cfg->data.val_windows : TALLY__TRAIN_VAL_WINDOWS_DEFAULT;
}

static void fill_val_windows(train_run *r, const size_t *items, int n) {
    int T = r->model.cfg.in_dim, W = val_windows(r);
    int32_t *tok = (int32_t *)r->xb;
    for (int s = 0; s < n; s++)
        tally_text_window(&r->text, tally_text_val_start(&r->text, T, (int)items[s], W), T, tok + (size_t)s * T,
                          r->yb + (size_t)s * T);
}

int tally__train_text_evaluate(train_run *r, tally__train_result *res) {
    int T = r->model.cfg.in_dim;
    if (r->text.n == r->text.train_n) return 0; /* nothing held out */
    double sums[3];                             /* right predictions, loss x windows, windows */
    int rc = tally__train_eval_items(r, (size_t)val_windows(r), fill_val_windows, sums);
    if (rc) return rc;
    res->evaluated = 1;
    res->test_acc = sums[0] / (sums[2] * T);
    res->test_loss = sums[1] / sums[2];
    return 0;
}
