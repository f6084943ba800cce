/* test_precision.c - tally train --precision: bf16 trains as f32 does within bf16's rounding (same data,
 * same steps) and keeps the replicas identical, says so where no AMX makes it slower, or, where the build or
 * CPU has no bf16, is refused with a message naming the rank and what to do; an unknown precision is a usage
 * error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "nn/gemm_bf16.h"
#include "tool_runner.h"

static double json_number(const char *path, const char *key) {
    char cmd[512], out[128];
    snprintf(cmd, sizeof cmd, "sed -n 's/.*\"%s\": \\([-0-9.e]*\\).*/\\1/p' '%s' | head -1", key, path);
    th_shell(cmd, 10, out, sizeof out);
    return out[0] ? atof(out) : NAN;
}

static void train(const char *precision, const char *json, th_tool *r) {
    const char *args[] = {"train",          "-n",          "2",       "--model", "mlp", "--data",
                          "synthetic:1024", "--steps",     "30",      "--batch", "16",  "--no-eval",
                          "--quiet",        "--precision", precision, "--json",  json,  NULL};
    th_tool_opts o = {.wall_s = 60};
    th_tool_run(args, &o, r);
}

/* --max-mem's prediction under bf16 counts the linear layers' bf16 copies: the activations it names are
 * the bytes the run then reports. */
static void check_max_mem_counts_bf16(void) {
    double act[2];
    for (int k = 0; k < 2; k++) {
        const char *args[] = {"train",          "-n",      "1", "--model",   "mlp",         "--data",
                              "synthetic:1024", "--steps", "2", "--no-eval", "--precision", k ? "bf16" : "fp32",
                              "--max-mem",      "1K",      NULL};
        static th_tool t;
        th_tool_opts o = {.wall_s = 30};
        th_tool_run(args, &o, &t);
        const char *at = strstr(t.out, "activations ");
        act[k] = at ? atof(at + strlen("activations ")) : 0;
        th_tool_expect(&t, t.rc == 1 && at, "--max-mem 1K is refused with the activations named");
    }
    /* MLP 784-512-512-10 at batch 64: inputs 64 x (784 + 512 + 512), weights 784x512 + 512x512 + 512x10,
     * the largest output gradient 64 x 512, all in 2 bytes */
    double want = 2.0 * (64 * (784 + 512 + 512) + 784 * 512 + 512 * 512 + 512 * 10 + 64 * 512);
    TH_CHECK(act[1] - act[0] == want, "--max-mem under bf16 adds %.0f bytes of activations, want %.0f", act[1] - act[0],
             want);
}

/* Whether the kernel lists AMX's bf16 tiles for this CPU, read apart from the library's own CPUID test. */
static int cpuinfo_has_amx_bf16(void) {
    char out[16];
    th_shell("grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\\n' | grep -c -x -e amx_bf16 -e amx_tile", 10, out,
             sizeof out);
    return atoi(out) == 2;
}

/* A bf16 run without AMX says, once and on rank 0, that it may be slower than f32; with AMX it says nothing;
 * --version names which the products run on. */
static void check_amx_named(const th_tool *r) {
    int amx = cpuinfo_has_amx_bf16();
    const char *note = "--precision bf16 without AMX";
    const char *at = strstr(r->out, note);
    printf("  this CPU %s AMX's bf16 tiles\n", amx ? "has" : "shows no");
    TH_CHECK(amx ? !at : at && strstr(at, "--precision fp32") && strstr(r->out, "tally[rank 0]"),
             "the run %s the note that bf16 without AMX may be slower: %s", amx ? "gives" : "lacks", r->out);
    TH_CHECK(!at || !strstr(at + 1, note), "the note is given once, not by every rank: %s", r->out);
    char cmd[512], out[512];
    snprintf(cmd, sizeof cmd, "'%s' --version | grep '^bf16 products'", getenv("TALLY_BIN"));
    th_shell(cmd, 20, out, sizeof out);
    TH_CHECK(strstr(out, amx ? ": AMX" : ": AVX512_BF16 without AMX") != NULL, "tally --version says: %s", out);
}

int main(void) {
    static th_tool r;
    char dir[] = "/tmp/tally_test_precision.XXXXXX";
    if (!mkdtemp(dir)) return perror("mkdtemp"), 2;
    const char *f32 = th_path(dir, "f32.json"), *b16 = th_path(dir, "bf16.json");
    train("fp32", f32, &r);
    th_tool_expect(&r, r.rc == 0, "--precision fp32 trains");
    train("bf16", b16, &r);
    if (tally__bf16_check() == 0) {
        th_tool_expect(&r, r.rc == 0, "--precision bf16 trains where the CPU has AVX512_BF16");
        double lf = json_number(f32, "train_loss"), lb = json_number(b16, "train_loss");
        printf("  train loss after 30 steps: fp32 %.5f, bf16 %.5f\n", lf, lb);
        TH_CHECK(fabs(lf - lb) <= 0.02 * fabs(lf), "bf16 ends at loss %g, fp32 at %g", lb, lf);
        TH_CHECK(lf != lb, "bf16 and fp32 give the same loss %g: is bf16 on?", lf);
        char cmd[512], out[256];
        snprintf(cmd, sizeof cmd, "grep -c '\"precision\": \"bf16\"' '%s'; grep -c '\"replicas_identical\": true' '%s'",
                 b16, b16);
        th_shell(cmd, 10, out, sizeof out);
        TH_CHECK(!strcmp(out, "1\n1\n"), "--json says precision bf16 and identical replicas: %s", out);
        check_max_mem_counts_bf16();
        check_amx_named(&r);
    } else {
        th_tool_expect(&r, r.rc == 1 && strstr(r.out, "rank ") && strstr(r.out, "--precision fp32"),
                       "--precision bf16 is refused here, naming the rank and the way out");
    }
    const char *bad[] = {"train", "--precision", "fp16", NULL};
    th_tool_opts o = {.wall_s = 20};
    th_tool_run(bad, &o, &r);
    th_tool_expect(&r, r.rc == 2 && strstr(r.out, "--precision"), "--precision fp16 is a usage error");
    th_rm_dir(dir);
    return th_verdict("test_precision");
}
