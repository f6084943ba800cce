/* test_ckpt_compat.c - checkpoints written by an earlier tally (tests/fixtures/ckpt_v1) still load exactly:
 * resumed, they reach the parameters that tally reached (across world size and ZeRO stage for one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tool_runner.h"

/* Written by tally at a8744b5 with `tally train -n 2 ... --steps 6 --ckpt-keep 1`, then resumed by it to
 * step 12 with the flags below; its params_sha256 then. The MLPs' sgemm rounds by OpenBLAS's kernel, so
 * each has one per kernel the earlier tally was run with: the one OpenBLAS picks on an AVX-512 machine,
 * and Haswell's (where OPENBLAS_CORETYPE=Haswell is set, as on some machines here). */
#define COMPAT_KERNELS 2
typedef struct compat_case {
    const char *dir;
    const char *flags[24];
    const char *sha256[COMPAT_KERNELS];
} compat_case;

static const compat_case cases[] = {
    {"linear_adamw",
     {"-n", "2", "--model", "linear", "--optimizer", "adamw", "--batch", "16", NULL},
     {"0e205813f480d4f451d6dfad9778787f47ea759f6bb25c6cd0919b3da963d955"}},
    {"mlp_powersgd",
     {"-n", "2", "--model", "mlp", "--hidden", "8", "--compress", "powersgd:1", "--data", "synthetic:512", "--batch",
      "16", NULL},
     {"317eab5ff8e2bac27612724b83e95a6ccbb677a44174faf1c28b6b3a96ef79fb",
      "20e613c2ce23039ad8218f6b5dbd3f898d310847ed21e69e2c7d806a745c92d2"}},
    /* Written at 2 ranks under --zero 3, loaded by one rank at stage 0 (the same 32 samples a step). */
    {"mlp_zero3",
     {"-n", "1", "--model", "mlp", "--hidden", "8", "--zero", "0", "--optimizer", "adamw", "--data", "synthetic:512",
      "--batch", "32", NULL},
     {"b3321d642d8bd272aee8c34682555f2fb13c6583abe11d7d39ec889091ff8cfe",
      "6b6be9953528cb330c4f3831c5fc132475007837f7fe4601cceaf2bdf386b2c2"}},
};

static void check_case(const compat_case *c, const char *data_dir, const char *tmp) {
    char dir[512], cmd[1200], out[512], json[600];
    snprintf(dir, sizeof dir, "%s/%s", tmp, c->dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s/%s' '%s/'", data_dir, c->dir, tmp);
    TH_CHECK(th_shell(cmd, 20, out, sizeof out) == 0, "%s: copying the checkpoint: %s", c->dir, out);
    snprintf(json, sizeof json, "%s/%s.json", tmp, c->dir);
    const char *args[40];
    int n = 0;
    args[n++] = "train";
    for (int i = 0; c->flags[i]; i++) args[n++] = c->flags[i];
    const char *tail[] = {"--steps", "12", "--seed",   "3",      "--quiet", "--no-eval",
                          "--ckpt",  dir,  "--resume", "--json", json,      NULL};
    for (int i = 0; tail[i]; i++) args[n++] = tail[i];
    args[n] = NULL;
    static th_tool r;
    th_tool_opts o = {.wall_s = 60};
    th_tool_run(args, &o, &r);
    TH_CHECK(r.rc == 0, "%s: tally train --resume failed (%d): %.600s", c->dir, r.rc, r.out);
    TH_CHECK(strstr(r.out, "resumed from the checkpoint of step 6") != NULL, "%s: did not resume from step 6: %.400s",
             c->dir, r.out);
    snprintf(cmd, sizeof cmd, "sed -n 's/.*\"params_sha256\": \"\\([0-9a-f]*\\)\".*/\\1/p' '%s'", json);
    th_shell(cmd, 10, out, sizeof out);
    out[strcspn(out, "\n")] = 0;
    int same = 0;
    for (int k = 0; k < COMPAT_KERNELS && !same; k++) same = c->sha256[k] && !strcmp(out, c->sha256[k]);
    TH_CHECK(same, "%s: parameters %s after resuming, the earlier tally reached %s (or %s with Haswell's sgemm)",
             c->dir, out, c->sha256[0], c->sha256[1] ? c->sha256[1] : "-");
    printf("  %s: %s\n", c->dir, same ? "the same parameters" : "DIFFERENT");
}

int main(void) {
    const char *src = getenv("TALLY_SOURCE_DIR");
    char data_dir[512], tmp[] = "/tmp/tally_test_ckpt_compat.XXXXXX";
    snprintf(data_dir, sizeof data_dir, "%s/tests/fixtures/ckpt_v1", src ? src : ".");
    if (!mkdtemp(tmp)) return perror("mkdtemp"), 2;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], data_dir, tmp);
    char cmd[600], out[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    th_shell(cmd, 20, out, sizeof out);
    return th_verdict("test_ckpt_compat");
}
