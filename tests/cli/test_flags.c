/* test_flags.c - first contact: every flag of every command, and every TALLY_* variable, given bad values:
 * exit 2 (1 for the library's variables, whose tally_comm_init says TALLY_E_INVALID), the name and the
 * value in the message with what is accepted, a bounded output, no hang. The shared parser on its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>

#include "core/parse.h"
#include "harness.h"
#include "tool_runner.h"

#define RUN_WALL_S  20
#define FLOOD_BYTES 2048 /* a refusal is a few lines; a usage page or a runaway loop is more */

static void run_tool(const char *const *args, const char *const *env, th_tool *r) {
    th_tool_opts o = {.env = env, .wall_s = RUN_WALL_S};
    th_tool_run(args, &o, r);
}

static th_tool R;

/* Runs the tool and checks it refused as a first-time user needs: exit `want_rc`, every one of `want`
 * in the output, a few lines, promptly. */
static void expect_refusal(const char *const *args, const char *const *env, int want_rc, const char *want1,
                           const char *want2, const char *what) {
    run_tool(args, env, &R);
    TH_CHECK(!R.timed_out, "%s: still running after %d s", what, RUN_WALL_S);
    TH_CHECK(R.rc == want_rc, "%s: exit %d, want %d:\n%.2000s", what, R.rc, want_rc, R.out);
    TH_CHECK(R.len < FLOOD_BYTES, "%s: %zu bytes of output", what, R.len);
    TH_CHECK(strstr(R.out, want1) != NULL, "%s: no \"%s\" in:\n%.2000s", what, want1, R.out);
    TH_CHECK(!want2 || strstr(R.out, want2) != NULL, "%s: no \"%s\" in:\n%.2000s", what, want2, R.out);
}

/* ---- flags ---- */

typedef struct flag_case {
    const char *flag;   /* as given; NULL ends a table */
    const char *bad[6]; /* values it must refuse */
} flag_case;

/* A flag that takes no value is given one, "--quiet=3". */
#define NOVAL(f)                                                                                                       \
    {                                                                                                                  \
        f, { "=3" }                                                                                                    \
    }

static const flag_case train_flags[] = {
    {"-n", {"0", "abc", "1e-30", "4097", "", "2x"}},
    {"--model", {"resnet", "", "MLP "}},
    {"--hidden", {"0", "1,,2", "1, 2", "abc", ""}},
    {"--data", {"", "synthetic:", "synthetic:12", "synthetic:1e3"}},
    {"--epochs", {"-1", "0", "", "1.5", "2x"}},
    {"--steps", {"", "0", "1e3", "9999999999999999999999"}},
    {"--batch", {"0", "abc", "-4"}},
    {"--lr", {"nan", "inf", "0", "-0.1", "1e-3x", ""}},
    NOVAL("--scale-lr"),
    {"--optimizer", {"adam", "", "lion"}},
    {"--momentum", {"1", "-0.5", "nan"}},
    {"--weight-decay", {"-1", "11", "x"}},
    {"--warmup", {"-1", "abc"}},
    {"--decay", {"linear", ""}},
    {"--min-lr", {"-1", "nan"}},
    {"--step-every", {"0", "x"}},
    {"--step-gamma", {"2", "-1", "nan"}},
    {"--accum", {"0", "1.5"}},
    {"--bucket-mb", {"0", "-1", "inf", "25MB"}},
    NOVAL("--no-overlap"),
    {"--seed", {"-1", "1.5", "0x10", "18446744073709551616"}},
    {"--threads", {"0", "2000", "x"}},
    {"--transport", {"ib", "", "SHM,tcp"}},
    {"--bind", {"socket", "", "Core"}},
    NOVAL("--no-eval"),
    NOVAL("--quiet"),
    {"--json", {""}},
    {"--plot", {""}},
    {"--trace", {""}},
    {"--zero", {"4", "-1", "1.0"}},
    {"--max-mem", {"0", "-1", "1.5", "12q", "nan"}},
    {"--nan", {"maybe", ""}},
    {"--check-replicas", {"0", "x"}},
    {"--inject-nan", {"1", "1:", ":3", "-1:3", "1:0", "1:3x"}},
    {"--inject-flip", {"x:1", "4096:1"}},
    {"--inject-kill", {"1:-1", ""}},
    {"--ckpt", {""}},
    {"--ckpt-every", {"0", "x"}},
    {"--ckpt-keep", {"0", "x"}},
    NOVAL("--resume"),
    {"--max-restarts", {"-1", "1001", "x"}},
    {"--compress", {"zip", "topk:0", "topk:nan", "topk:0x1", "powersgd:0", "powersgd:2x"}},
    NOVAL("--no-error-feedback"),
    {"--mode", {"sometimes", ""}},
    {"--staleness", {"-1", "x", "1.5"}},
    {"--stale-lr", {"sqrt", ""}},
    NOVAL("--ps"),
    {"--straggler", {"1", "1:0", "1:3600001", "a:b"}},
    {"--jitter", {"0", "-1", "3600001", "nan", "x"}},
    {"--quota", {"all", ""}},
    {"--precision", {"fp16", "BF16", ""}},
    {"--layers", {"0", "x", "1025"}},
    {"--width", {"0", "x"}},
    {"--heads", {"0", "1.5"}},
    {"--context", {"0", "x", "65537"}},
    {"--val-frac", {"-0.1", "0.95", "x"}},
    {"--clip", {"-1", "x", "nan"}},
    {"--weight-decay-on", {"biases", ""}},
    {"--normalize", {"standard", "", "MEAN-STD"}},
    {"--local-steps", {"0", "-1", "x", "1.5"}},
    {"--outer-lr", {"0", "-1", "11", "nan", "x"}},
    {"--outer-momentum", {"1", "-0.1", "nan", "x"}},
    {"--outer-compress", {"int4", "", "INT8"}},
    NOVAL("--help"),
    {NULL, {NULL}},
};

static const flag_case bench_flags[] = {
    {"-n", {"abc", "1e-30", "0", ""}},
    {"-b", {"0", "abc", "-8", "1.5", "nan", "65G"}},
    {"-e", {"0", "x", "8Q"}},
    {"-f", {"nan", "1", "0.5", "inf", "2x"}},
    {"-t", {"f33", ""}},
    {"-o", {"median", ""}},
    {"-r", {"abc", "-1", "4096"}},
    {"--algo", {"fastest", "", "ring,fastest", "ring,", "ring,ring", "ring;rhd"}},
    {"--transport", {"ib", "", "shm,ib", ",tcp", "tcp,tcp"}},
    {"--bind", {"socket", ""}},
    {"--iters", {"1,", "0", "abc", ""}},
    {"--svg", {""}},
    {"--trace", {""}},
    {"--warmup", {"abc", "-1"}},
    NOVAL("--shared-mem"),
    NOVAL("--help"),
    {NULL, {NULL}},
};

static const flag_case plan_flags[] = {
    {"--params", {"abc", "0", "1e400", "0x10", "-5", ""}},
    {"--local-steps", {"0", "x", "1.5"}},
    {"--outer-compress", {"int4", ""}},
    {"--layers", {"0", "1.5", "x"}},
    {"--workers", {"0", "2x", "nan"}},
    {"-n", {"0", "x"}},
    {"--optimizer", {"lion", ""}},
    {"--precision", {"fp8", ""}},
    {"--zero", {"4", "x"}},
    {"--batch", {"0", "x"}},
    {"--accum", {"0", "x"}},
    {"--flops-per-sample", {"0", "x", "nan"}},
    {"--model", {"gpt9", ""}},
    {"--hidden", {"0", "x"}},
    {"--compute", {"nan", "0", "5 GFLOPS"}},
    {"--bandwidth", {"25G", "0Gbps", "fast"}},
    {"--latency", {"5 us", "-1us", "5parsecs"}},
    {"--algo", {"fastest", ""}},
    {"--bucket-mb", {"0", "x"}},
    {"--width", {"0", "x"}},
    {"--heads", {"0", "1.5"}},
    {"--context", {"0", "x"}},
    {"--hosts", {"0", "x", "1.5"}},
    {"--ranks-per-host", {"0", "x"}},
    {"--net-bandwidth", {"1G", "0Gbps", "fast"}},
    {"--net-latency", {"20 us", "-1us", "far"}},
    {"--fabric", {"star", ""}},
    {"--hosts-per-leaf", {"0", "x"}},
    {"--oversub", {"0.5", "x", "nan"}},
    {"--slow", {"3", "x:2", "3:0", "-1:2", ""}},
    {"--compute-sd", {"-1", "x", "nan"}},
    NOVAL("--json"),
    NOVAL("--calibrate"),
    {"--svg", {""}},
    NOVAL("--help"),
    {NULL, {NULL}},
};

static const flag_case sim_flags[] = {
    {"--config", {"", "/nonexistent/tally.conf"}},
    {"--hosts", {"0", "x", "1.5"}},
    {"--ranks-per-host", {"0", "x"}},
    {"--cores", {"-1", "x"}},
    {"--shm-latency", {"5 us", "-1us", "x"}},
    {"--shm-bandwidth", {"10G", "0GB/s", "x"}},
    {"--reduce-bandwidth", {"10G", "x"}},
    {"--cache-bandwidth", {"x", "0GB/s"}},
    {"--cache-bytes", {"0", "x", "-1"}},
    {"--shm-bandwidth-bytes", {"0", "x"}},
    {"--crowded-latency", {"x", "-5us"}},
    {"--call-overhead", {"x", ""}},
    {"--tcp-bandwidth", {"1G", "x"}},
    {"--shared-cores", {"maybe", ""}},
    {"--nic", {"25G", "fast", "0Gbps"}},
    {"--nic-latency", {"20 us", "far"}},
    {"--nic-payload", {"0", "1.5", "x"}},
    {"--fabric", {"star", ""}},
    {"--hosts-per-leaf", {"0", "x"}},
    {"--oversub", {"0.5", "x"}},
    {"--coll", {"gather", ""}},
    {"--algo", {"fastest", ""}},
    {"--size", {"1K,,2K", "x", ""}},
    {"--method", {"quick", ""}},
    NOVAL("--train"),
    {"--params", {"0", "x", ""}},
    {"--layers", {"0", "x"}},
    {"--compute", {"x", "5 ms"}},
    {"--update", {"x", "-1ms"}},
    {"--zero", {"4", "x"}},
    {"--accum", {"0", "x"}},
    {"--bucket-mb", {"0", "x"}},
    {"--mode", {"semi", ""}},
    {"--staleness", {"-1", "x"}},
    {"--steps", {"0", "x"}},
    {"--local-steps", {"0", "x", "100001"}},
    {"--outer-compress", {"int4", ""}},
    {"--compute-sd", {"-1", "x"}},
    {"--slow", {"3", "x:2"}},
    {"--seed", {"x", "-1"}},
    {"--save", {""}},
    {"--svg", {""}},
    NOVAL("--calibrate"),
    NOVAL("--json"),
    NOVAL("--help"),
    {NULL, {NULL}},
};

static const flag_case generate_flags[] = {
    {"--ckpt", {""}},
    {"--prompt", {NULL}}, /* any text is a prompt */
    {"--tokens", {"0", "x", "1.5"}},
    {"--temperature", {"-1", "x", "nan"}},
    {"--top-k", {"-1", "x"}},
    {"--seed", {"x", "-1"}},
    NOVAL("--help"),
    {NULL, {NULL}},
};

static const flag_case run_flags[] = {
    {"-n", {"0", "x", "4097", ""}},
    {"--nproc", {"0", "1.5"}},
    {"--transport", {"udp", ""}},
    {"--timeout", {"1e12", "inf", "nan", "0", "5s", ""}},
    {"--max-restarts", {"-1", "x", "1001"}},
    {"--bind", {"socket", ""}},
    NOVAL("--no-prefix"),
    NOVAL("--help"),
    {NULL, {NULL}},
};

/* The quick tier tries each flag's and variable's first bad value, the long tier the others. */
static int tier_wants(int i) { return i == 0 ? th_quick() : th_long(); }

/* The message names the flag and the value given ("--epochs '-1'", or "--quiet=3" in full). */
static void flag_want(const char *flag, const char *bad, char *buf, size_t n) {
    if (bad[0] == '=')
        snprintf(buf, n, "%s", flag);
    else
        snprintf(buf, n, "%s '%s'", flag, bad);
}

static void check_flags(const char *cmd, const char *const *base, const flag_case *cases) {
    for (const flag_case *c = cases; c->flag; c++) {
        for (int i = 0; i < 6 && c->bad[i]; i++) {
            if (!tier_wants(i)) continue;
            const char *args[24];
            int n = 0;
            args[n++] = cmd;
            for (int k = 0; base[k]; k++) args[n++] = base[k];
            char joined[96];
            if (c->bad[i][0] == '=') {
                snprintf(joined, sizeof joined, "%s%s", c->flag, c->bad[i]);
                args[n++] = joined;
            } else {
                args[n++] = c->flag;
                args[n++] = c->bad[i];
            }
            if (!strcmp(cmd, "run")) args[n++] = "true";
            args[n] = NULL;
            char want[128], what[160];
            flag_want(c->flag, c->bad[i], want, sizeof want);
            snprintf(what, sizeof what, "tally %s %s '%s'", cmd, c->flag, c->bad[i]);
            expect_refusal(args, NULL, 2, want, c->bad[i][0] == '=' ? "takes no value" : "it takes", what);
        }
    }
}

/* Every flag --help lists has a row in the table, so a new flag cannot skip these checks. */
static void check_help_covers(const char *cmd, const flag_case *cases) {
    const char *args[] = {cmd, "--help", NULL};
    run_tool(args, NULL, &R);
    TH_CHECK(R.rc == 0, "tally %s --help: exit %d", cmd, R.rc);
    for (const char *p = strstr(R.out, "--"); p; p = strstr(p + 2, "--")) {
        char flag[48];
        size_t len = 2 + strspn(p + 2, "abcdefghijklmnopqrstuvwxyz-");
        if (len <= 2 || len >= sizeof flag || p[len] == '-') continue;
        memcpy(flag, p, len);
        flag[len] = '\0';
        int found = 0;
        for (const flag_case *c = cases; c->flag && !found; c++) found = !strcmp(c->flag, flag);
        TH_CHECK(found, "tally %s --help lists %s, which this test does not try", cmd, flag);
    }
}

static void test_flags(void) {
    static const char *const none[] = {NULL};
    static const char *const plan_base[] = {"--params", "1G", "--workers", "4", NULL};
    static const char *const bench_base[] = {"allreduce", NULL};
    static const char *const run_base[] = {"-n", "1", NULL};
    check_flags("train", none, train_flags);
    check_flags("bench", bench_base, bench_flags);
    check_flags("plan", plan_base, plan_flags);
    check_flags("sim", none, sim_flags);
    check_flags("run", run_base, run_flags);
    static const char *const generate_base[] = {"--ckpt", "/nonexistent", NULL};
    check_flags("generate", generate_base, generate_flags);
    if (!th_quick()) return;
    check_help_covers("generate", generate_flags);
    check_help_covers("train", train_flags);
    check_help_covers("bench", bench_flags);
    check_help_covers("plan", plan_flags);
    check_help_covers("sim", sim_flags);
    check_help_covers("run", run_flags);
}

/* Values each flag is fine with pass the parser (and a short run ends well). */
static void test_good_values(void) {
    const char *train[] = {"train",
                           "-n",
                           "1",
                           "--data",
                           "synthetic:256",
                           "--steps",
                           "2",
                           "--lr",
                           "1e-3",
                           "--seed",
                           "18446744073709551615",
                           "--max-mem",
                           "1.5GiB",
                           "--bucket-mb",
                           "0.5",
                           "--quiet",
                           NULL};
    run_tool(train, NULL, &R);
    TH_CHECK(R.rc == 0, "tally train with good values: exit %d:\n%.2000s", R.rc, R.out);
    const char *bench[] = {"bench", "allreduce", "-n",      "1", "-b",       "8", "-e", "1K",
                           "-f",    "4",         "--iters", "1", "--warmup", "0", NULL};
    run_tool(bench, NULL, &R);
    TH_CHECK(R.rc == 0 && strstr(R.out, "Out of bounds values : 0 OK"),
             "tally bench with good values: exit %d:\n%.2000s", R.rc, R.out);
}

/* bench's loops ended never at -b 0 or a factor just above 1 (millions of rows). */
static void test_bench_bounds(void) {
    const char *zero[] = {"bench", "allreduce", "-n", "1", "-b", "0", "-e", "8", NULL};
    expect_refusal(zero, NULL, 2, "-b '0'", "it takes", "bench -b 0");
    const char *creep[] = {"bench", "allreduce", "-n", "1", "-f", "1.0000001", NULL};
    expect_refusal(creep, NULL, 2, "-f 1.0000001", "rows", "bench -f 1.0000001");
    const char *order[] = {"bench", "allreduce", "-n", "1", "-b", "1M", "-e", "8", NULL};
    expect_refusal(order, NULL, 2, "-b 1048576 is above -e 8", NULL, "bench -b 1M -e 8");
    const char *traced[] = {"bench", "allreduce", "-n", "1", "--algo", "ring,rhd", "--trace", "t.json", NULL};
    expect_refusal(traced, NULL, 2, "--trace t.json times one algorithm and transport", NULL,
                   "bench --algo ring,rhd --trace");
}

/* ---- variables ---- */

typedef struct var_case {
    const char *name;
    const char *bad[8];
} var_case;

/* Read by the library, at tally_comm_init on every rank. */
static const var_case lib_vars[] = {
    {"TALLY_TIMEOUT", {"abc", "-5", "0", "nan", "5s", "1e12", "inf", ""}},
    {"TALLY_BOOT_TIMEOUT", {"abc", "0", "nan", "1e12", "2 ", ""}},
    {"TALLY_DEBUG", {"yes", "-1", "3", "1.5", ""}},
    {"TALLY_ISA", {"sse", "avx2 ", ""}},
    {"TALLY_TRANSPORT", {"ib", "shm,tcp", ""}},
    {"TALLY_ALGO", {"fast", "ring ", ""}},
    {"TALLY_SHM_LARGE", {"12q", "-1", "nan", "1e30", ""}},
    {"TALLY_SHM_CMA", {"2", "yes", "-1", ""}},
    {"TALLY_COST", {"1,2", "1,2,nan", "1,2,3x", "a,b,c", "1,0,3", ""}},
    {"TALLY_TCP_STREAMS", {"0", "abc", "17", "2.5", ""}},
    {"TALLY_FLIGHT", {"-1", "abc", "65537", "1.5", ""}},
    {"TALLY_FLIGHT_DIR", {""}},
    {"TALLY_TRACE", {""}},
    {"TALLY_TRACE_EVENTS", {"5", "abc", "1e9", ""}},
    {"TALLY_BIND", {"0.0.0.0:5", "[]", ""}},
    {"TALLY_ADDR", {"node0", ":5", "h:0", "h:70000", ""}},
    {"TALLY_TOKEN", {""}},
    {NULL, {NULL}},
};

typedef struct init_out {
    int rc;
    char msg[1024];
} init_out;

static init_out *g_init;
static const char *g_var, *g_val;

static int fn_init(int rank, int size, void *arg) {
    setenv(g_var, g_val, 1);
    tally_comm *c = NULL;
    g_init->rc = tally_comm_init(&c);
    snprintf(g_init->msg, sizeof g_init->msg, "%s", tally_last_error());
    if (c) tally_comm_free(c);
    return 0;
}

/* In the library: tally_comm_init returns TALLY_E_INVALID naming the variable and its value. */
static void check_var_init(const char *var, const char *val) {
    g_var = var;
    g_val = val;
    memset(g_init, 0, sizeof *g_init);
    th_opts o = {.wall_s = 30};
    int bad = th_run(1, &o, fn_init, NULL);
    char want[128];
    snprintf(want, sizeof want, "%s='%s'", var, val);
    TH_CHECK(!bad && g_init->rc == TALLY_E_INVALID && strstr(g_init->msg, want), "tally_comm_init with %s: rc %d, '%s'",
             want, g_init->rc, g_init->msg);
}

static void test_variables(void) {
    g_init = th_shared_alloc(sizeof *g_init);
    const char *train[] = {"train", "-n", "2", "--data", "synthetic:256", "--steps", "1", "--quiet", NULL};
    for (const var_case *v = lib_vars; v->name; v++) {
        for (int i = 0; i < 8 && v->bad[i]; i++) {
            if (!tier_wants(i)) continue;
            check_var_init(v->name, v->bad[i]);
            /* tally train's launcher sets the rendezvous variables for its ranks itself */
            if (!strcmp(v->name, "TALLY_ADDR") || !strcmp(v->name, "TALLY_TOKEN")) continue;
            char env0[160], want[160], what[200];
            snprintf(env0, sizeof env0, "%s=%s", v->name, v->bad[i]);
            const char *env[] = {env0, NULL};
            snprintf(want, sizeof want, "%s='%s'", v->name, v->bad[i]);
            snprintf(what, sizeof what, "tally train -n 2 with %s", want);
            expect_refusal(train, env, 1, want, "it takes", what);
        }
    }
    static const char *const rank_bad[][3] = {{"TALLY_RANK", "abc", "TALLY_WORLD_SIZE=1"},
                                              {"TALLY_RANK", "1.0", "TALLY_WORLD_SIZE=1"},
                                              {"TALLY_RANK", "", "TALLY_WORLD_SIZE=1"},
                                              {"TALLY_WORLD_SIZE", "0", "TALLY_RANK=0"},
                                              {"TALLY_WORLD_SIZE", "x", "TALLY_RANK=0"}};
    for (size_t i = 0; i < sizeof rank_bad / sizeof *rank_bad; i++) {
        if (!tier_wants((int)i)) continue;
        char env0[64], want[64], what[96];
        snprintf(env0, sizeof env0, "%s=%s", rank_bad[i][0], rank_bad[i][1]);
        const char *env[] = {env0, rank_bad[i][2], NULL};
        const char *args[] = {"train", "--data", "synthetic:256", "--steps", "1", "--quiet", NULL};
        snprintf(want, sizeof want, "%s='%s'", rank_bad[i][0], rank_bad[i][1]);
        snprintf(what, sizeof what, "tally train with %s", want);
        expect_refusal(args, env, 1, want, "it takes", what);
    }
    th_shared_free(g_init, sizeof *g_init);
    if (!th_quick()) return;
    /* Read by the tool itself: a bad value is a usage error. */
    const char *restart_env[] = {"TALLY_RANK=0", "TALLY_WORLD_SIZE=1", "TALLY_RESTART=x", NULL};
    const char *args[] = {"train", "--data", "synthetic:256", "--steps", "1", "--quiet", NULL};
    expect_refusal(args, restart_env, 2, "TALLY_RESTART='x'", "it takes", "tally train with TALLY_RESTART=x");
}

/* ---- the parser itself ---- */

static void test_parser(void) {
    long long i;
    double d;
    uint64_t b, u;
    int w;
    TH_CHECK(!tally__parse_int("-x", "42", 0, 100, &i) && i == 42, "42");
    TH_CHECK(!tally__parse_int("-x", "-7", -10, 0, &i) && i == -7, "-7");
    TH_CHECK(!tally__parse_int("-x", "+7", 0, 10, &i) && i == 7, "+7");
    static const char *bad_int[] = {"",  " 1", "1 ", "1x", "0x10", "1e3", "1.0", "--1", "+", "9223372036854775808",
                                    NULL};
    for (int k = 0; bad_int[k]; k++)
        TH_CHECK(tally__parse_int("-x", bad_int[k], -1000000, 1000000, &i) == TALLY_E_INVALID, "int '%s' accepted",
                 bad_int[k]);
    TH_CHECK(tally__parse_int("--epochs", "-1", 1, 10, &i) == TALLY_E_INVALID &&
                 !strcmp(tally_last_error(), "--epochs '-1' is out of range: it takes a whole number in 1..10"),
             "int message: %s", tally_last_error());
    TH_CHECK(!tally__parse_real("-x", "1.5e-3", 0, 1, 1, &d) && d == 1.5e-3, "1.5e-3");
    TH_CHECK(!tally__parse_real("-x", ".5", 0, 0, 1, &d) && d == 0.5, ".5");
    static const char *bad_real[] = {"",   "nan", "NaN",   "inf", "-inf", "infinity", "1e400", " 1",
                                     "1 ", "1,",  "0x1p3", "1e",  "e3",   ".",        "-",     NULL};
    for (int k = 0; bad_real[k]; k++)
        TH_CHECK(tally__parse_real("-x", bad_real[k], -1e300, 0, 1e300, &d) == TALLY_E_INVALID, "real '%s' accepted",
                 bad_real[k]);
    TH_CHECK(tally__parse_real("-x", "0", 0, 1, 1, &d) == TALLY_E_INVALID, "an open lower bound excludes it");
    TH_CHECK(tally__parse_real("TALLY_TIMEOUT", "abc", 0, 1, 1e6, &d) == TALLY_E_INVALID &&
                 !strcmp(tally_last_error(), "TALLY_TIMEOUT='abc' is not a number: it takes a number in (0, 1000000]"),
             "real message: %s", tally_last_error());
    struct {
        const char *s;
        uint64_t v;
    } sizes[] = {{"4096", 4096},        {"64M", 64u << 20}, {"1.5GiB", 3ull << 29},
                 {"256kb", 256u << 10}, {"1K", 1024},       {"2TB", 2ull << 40}};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        TH_CHECK(!tally__parse_bytes("-b", sizes[k].s, 0, UINT64_MAX / 2, &b) && b == sizes[k].v, "size %s: %llu",
                 sizes[k].s, (unsigned long long)b);
    static const char *bad_size[] = {"", "-1", "+1", "1.5", "12q", "1KK", "nan", "inf", "1e30", "M", " 1", "1 K", NULL};
    for (int k = 0; bad_size[k]; k++)
        TH_CHECK(tally__parse_bytes("-b", bad_size[k], 0, 1ull << 50, &b) == TALLY_E_INVALID, "size '%s' accepted",
                 bad_size[k]);
    TH_CHECK(!tally__parse_u64("--seed", "18446744073709551615", &u) && u == UINT64_MAX, "u64 max");
    TH_CHECK(tally__parse_u64("--seed", "18446744073709551616", &u) == TALLY_E_INVALID, "u64 overflow");
    TH_CHECK(tally__parse_u64("--seed", "-1", &u) == TALLY_E_INVALID, "u64 negative");
    static const char *const words[] = {"sync", "async", NULL};
    TH_CHECK(!tally__parse_word("--mode", "async", words, &w) && w == 1, "word");
    TH_CHECK(tally__parse_word("--mode", "Async", words, &w) == TALLY_E_INVALID &&
                 strstr(tally_last_error(), "it takes sync or async"),
             "word message: %s", tally_last_error());
}

int main(void) {
    if (th_quick()) test_parser();
    test_flags();
    if (th_quick()) {
        test_good_values();
        test_bench_bounds();
    }
    test_variables();
    return th_verdict("test_flags");
}
