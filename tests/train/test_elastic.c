/* test_elastic.c - elastic restart: tally run --max-restarts starts every rank again after one fails
 * (and gives up after R restarts), and tally train --max-restarts, with a rank killed mid-run, resumes
 * from its last checkpoint and ends with the parameters and accuracy of a run that was never killed. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "train_runner.h"

/* The value of "key": ... in a JSON summary, as text up to the next comma or brace. */
static int json_field(const char *path, const char *key, char *out, size_t n) {
    char buf[8192];
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = 0;
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(buf, pat);
    if (!p) return -1;
    p += strlen(pat);
    size_t k = strcspn(p, ",}\n");
    snprintf(out, n, "%.*s", (int)k, p);
    return 0;
}

static void test_run_restarts(void) {
    char err[8192];
    /* Fails on the first start only: one restart brings success. */
    char *once[] = {"tally", "run", "-n", "2",  "--max-restarts",
                    "2",     "--",  "sh", "-c", "[ \"$TALLY_RESTART\" != 0 ] || [ \"$TALLY_RANK\" != 1 ] || exit 3",
                    NULL};
    int rc = tr_run_tally(once, err, sizeof err);
    TH_CHECK(rc == 0 && strstr(err, "rank 1") && strstr(err, "restarting all 2 ranks (restart 1 of 2)") &&
                 !strstr(err, "restart 2 of 2"),
             "run --max-restarts, failing once: exit %d '%s'", rc, err);
    char *always[] = {
        "tally", "run", "-n", "2", "--max-restarts", "1", "--", "sh", "-c", "[ \"$TALLY_RANK\" != 0 ] || exit 4", NULL};
    rc = tr_run_tally(always, err, sizeof err);
    TH_CHECK(rc == 4 && strstr(err, "restart 1 of 1") && !strstr(err, "restart 2"),
             "run --max-restarts, failing always: exit %d '%s'", rc, err);
}

static void test_train_restart(void) {
    char dir[128], j0[160], j1[160], err[16384];
    snprintf(dir, sizeof dir, "/tmp/tally-test-elastic-%d", (int)getpid());
    snprintf(j0, sizeof j0, "%s.0.json", dir);
    snprintf(j1, sizeof j1, "%s.1.json", dir);
    th_rm_dir(dir);
    char *straight[] = {"tally",   "train", "-n",       "2", "--data",  "synthetic:4096", "--hidden", "64",
                        "--steps", "80",    "--epochs", "3", "--quiet", "--json",         j0,         NULL};
    int rc = tr_run_tally(straight, err, sizeof err);
    TH_CHECK(rc == 0, "uninterrupted run: exit %d '%s'", rc, err);
    char *killed[] = {"tally",    "train",
                      "-n",       "2",
                      "--data",   "synthetic:4096",
                      "--hidden", "64",
                      "--steps",  "80",
                      "--epochs", "3",
                      "--quiet",  "--json",
                      j1,         "--ckpt",
                      dir,        "--ckpt-every",
                      "10",       "--max-restarts",
                      "2",        "--inject-kill",
                      "1:25",     NULL};
    rc = tr_run_tally(killed, err, sizeof err);
    TH_CHECK(rc == 0 && strstr(err, "rank 1") && strstr(err, "restart 1 of 2") &&
                 strstr(err, "resumed from the checkpoint of step 20"),
             "killed and restarted run: exit %d '%s'", rc, err);
    char h0[80] = "", h1[80] = "", a0[32] = "", a1[32] = "", from[32] = "";
    json_field(j0, "params_sha256", h0, sizeof h0);
    json_field(j1, "params_sha256", h1, sizeof h1);
    json_field(j0, "test_accuracy", a0, sizeof a0);
    json_field(j1, "test_accuracy", a1, sizeof a1);
    json_field(j1, "resumed_from", from, sizeof from);
    TH_CHECK(h0[0] && !strcmp(h0, h1), "restarted run's parameters %s, uninterrupted %s", h1, h0);
    TH_CHECK(a0[0] && !strcmp(a0, a1), "restarted run's accuracy %s, uninterrupted %s", a1, a0);
    TH_CHECK(!strcmp(from, "20"), "resumed_from %s", from);
    fprintf(stderr, "  killed after step 25 of 80, resumed from 20: accuracy %s (uninterrupted %s)\n", a1, a0);
    th_rm_dir(dir);
    unlink(j0);
    unlink(j1);
}

int main(void) {
    test_run_restarts();
    test_train_restart();
    return th_verdict("test_elastic");
}
