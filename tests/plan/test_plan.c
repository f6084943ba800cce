/* test_plan.c - `tally plan`: the ZeRO paper's worked example, the fp32 formulas on an uneven shard,
 * bytes and rounds per algorithm, Amdahl, unit parsing, the real MLP's layout, and the CLI end to end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <tally/optim.h>

#include "coll/coll.h"
#include "harness.h"
#include "nn/model.h"
#include "core/units.h"
#include "plan/plan.h"

static int near(double got, double want, double tol) { return fabs(got - want) <= tol; }
static int rel(double got, double want) { return fabs(got - want) <= 1e-9 * fmax(1, fabs(want)); }

/* Rajbhandari et al. (2020), Figure 1: P = 7.5 B, N = 64, Adam in mixed precision (K = 12). */
static void test_zero_paper(void) {
    tally__plan_cfg c;
    tally__plan_cfg_default(&c);
    c.params = 7500000000ull;
    c.workers = 64;
    c.precision = TALLY__PLAN_MIXED;
    const double want[4] = {120, 31.4, 16.6, 1.9};
    for (int z = 0; z <= 3; z++) {
        double gb = tally__plan_memory(&c, z, 64).total / 1e9;
        TH_CHECK(near(gb, want[z], 0.05), "ZeRO paper stage %d: %.3f GB, want %.1f", z, gb, want[z]);
    }
}

/* fp32 as the trainer allocates, on P prime and N = 3 (shards of ceil(P/3)); L is the largest layer. */
static void test_fp32_formulas(void) {
    tally__plan_cfg c;
    tally__plan_cfg_default(&c);
    c.params = 1000003; /* prime: 3 x 333334 + 1, so the largest shard is 333335 */
    c.largest = 400009;
    c.nlayers = 3;
    c.workers = 3;
    TH_CHECK(tally__plan_shard(c.params, 3) == 333335, "shard of a prime: %llu", tally__plan_shard(c.params, 3));
    const double P = 1000003, sh = 333335, L = 400009;
    for (int adam = 0; adam <= 1; adam++) {
        c.optimizer = adam ? TALLY_OPTIM_ADAMW : TALLY_OPTIM_SGD;
        double k = adam ? 8 : 4;
        /* buffers as tally train overlaps (its default): two gradient staging buffers at stage 2,
         * two gathered layers at stage 3 (which then take their gradients) */
        const double want[4][4] = {/* params, grads, optim, buffers */
                                   {4 * P, 4 * P, k * P, 0},
                                   {4 * P, 4 * P, k * sh, 0},
                                   {4 * P, 4 * sh, k * sh, 8 * L},
                                   {4 * sh, 4 * sh, k * sh, 8 * L}};
        for (int z = 0; z <= 3; z++) {
            tally__plan_mem m = tally__plan_memory(&c, z, 3);
            double state = want[z][0] + want[z][1] + want[z][2] + want[z][3];
            TH_CHECK(m.params == want[z][0] && m.grads == want[z][1] && m.optim == want[z][2] &&
                         m.buffers == want[z][3] && m.state == state && m.total == state,
                     "fp32 %s stage %d: %.0f %.0f %.0f %.0f (state %.0f), want %.0f %.0f %.0f %.0f (%.0f)",
                     adam ? "adam" : "sgd", z, m.params, m.grads, m.optim, m.buffers, m.state, want[z][0], want[z][1],
                     want[z][2], want[z][3], state);
        }
    }
    c.activation_bytes = 12345;
    TH_CHECK(tally__plan_memory(&c, 0, 3).total == tally__plan_memory(&c, 0, 3).state + 12345,
             "activations are added to the total");
}

/* Bytes and rounds: the alpha and beta coefficients of the cost model, and what the code sends. */
static void test_comm_counts(void) {
    const tally__cost unit_a = {.alpha = 1}, unit_b = {.beta = 1};
    const double S = 1e8;
    const int ns[] = {1, 2, 3, 4, 8};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        int n = ns[i], p = n == 3 ? 2 : n, fold = p != n, lg = n == 1 ? 0 : (int)ceil(log2(n));
        tally__plan_comm ra = tally__plan_allreduce(&unit_a, TALLY__ALGO_RING, n, S);
        tally__plan_comm rb = tally__plan_allreduce(&unit_b, TALLY__ALGO_RING, n, S);
        TH_CHECK(ra.rounds == 2 * (n - 1) && ra.seconds == 2 * (n - 1), "ring N=%d: %g rounds", n, ra.rounds);
        TH_CHECK(rel(rb.bytes, 2 * S * (n - 1) / n) && rel(rb.sent, rb.bytes), "ring N=%d: %g bytes, %g sent", n,
                 rb.bytes, rb.sent);
        ra = tally__plan_allreduce(&unit_a, TALLY__ALGO_RHD, n, S);
        rb = tally__plan_allreduce(&unit_b, TALLY__ALGO_RHD, n, S);
        TH_CHECK(ra.rounds == 2 * lg, "rhd N=%d: %g rounds, want 2 ceil(log2 N) = %d", n, ra.rounds, 2 * lg);
        /* a rank that sits out (N not a power of two) hands its vector over and gets the result back */
        double rhd = n == 1 ? 0 : 2 * S * (p - 1) / p;
        TH_CHECK(rel(rb.bytes, rhd + fold * 2 * S) && rel(rb.sent, rhd + fold * S), "rhd N=%d: %g bytes, %g sent", n,
                 rb.bytes, rb.sent);
        ra = tally__plan_allreduce(&unit_a, TALLY__ALGO_DIRECT, n, S);
        rb = tally__plan_allreduce(&unit_b, TALLY__ALGO_DIRECT, n, S);
        TH_CHECK(ra.rounds == 2 * (n - 1) && rel(rb.bytes, 2.0 * (n - 1) * S) && rel(rb.sent, (n - 1) * S),
                 "direct N=%d: %g rounds, %g bytes, %g sent", n, ra.rounds, rb.bytes, rb.sent);
    }
    TH_CHECK(tally__plan_sent(TALLY__ALGO_TREE, 8, S) == 3 * S && tally__plan_sent(TALLY__ALGO_TREE, 4, S) == 2 * S &&
                 tally__plan_sent(TALLY__ALGO_TREE, 2, S) == S,
             "tree: an inner rank sends up once and down twice");
    /* Time is alpha-beta-gamma: ring 2(N-1)a + 2S(N-1)/N b + S(N-1)/N g. */
    tally__cost m = {.alpha = 5e-6, .beta = 3.2e-10, .gamma = 1e-10};
    double t = tally__plan_allreduce(&m, TALLY__ALGO_RING, 4, S).seconds;
    TH_CHECK(rel(t, 6 * 5e-6 + 1.5 * S * 3.2e-10 + 0.75 * S * 1e-10), "ring time %g", t);
}

static tally__plan_cfg step_cfg(void) {
    tally__plan_cfg c;
    tally__plan_cfg_default(&c);
    c.params = 100000000; /* 400 MB of fp32 gradients: 16 buckets of 25 MiB */
    c.nlayers = 10;
    c.largest = 10000000;
    c.workers = 8;
    c.flops_per_sample = 6e8;
    return c;
}

/* Step time: compute x accum, communication once per step; overlap only helps. ZeRO 3 moves 3S(N-1)/N. */
static void test_step(void) {
    tally__plan_cfg c = step_cfg();
    tally__plan_step s = tally__plan_step_time(&c, 8);
    TH_CHECK(rel(s.compute, 6e8 * 64 / 100e9) && rel(s.backward, 2 * s.forward), "compute %g", s.compute);
    TH_CHECK(rel(s.t_sum, s.compute + s.comm + s.update) && s.t_max <= s.t_pred && s.t_pred <= s.t_sum &&
                 s.buckets == 16,
             "T sum %g, max %g, pred %g, %d buckets", s.t_sum, s.t_max, s.t_pred, s.buckets);
    c.accum = 4;
    tally__plan_step s4 = tally__plan_step_time(&c, 8);
    TH_CHECK(rel(s4.compute, 4 * s.compute) && rel(s4.comm, s.comm), "accum 4: compute %g, comm %g", s4.compute,
             s4.comm);
    c.accum = 1;
    const tally__cost unit_b = {.beta = 1};
    c.cost = unit_b;
    c.nlayers = 0; /* unknown layers: one vector, as the ZeRO paper counts */
    double S = 4e8;
    TH_CHECK(rel(tally__plan_step_comm(&c, 3, TALLY__ALGO_RING, 8).bytes, 3 * S * 7 / 8) &&
                 rel(tally__plan_step_comm(&c, 1, TALLY__ALGO_RING, 8).bytes, 2 * S * 7 / 8),
             "ZeRO 3 moves 3S(N-1)/N, ZeRO 1 2S(N-1)/N");
    TH_CHECK(tally__plan_step_time(&c, 1).comm == 0, "one rank does not communicate");
}

/* Local SGD: compute and update alone, and one f32 (or int8: a quarter) allreduce of the parameters every
 * H steps, exposed; the pick keeps sync on a fast link and takes the smallest H whose averaging is at most
 * TALLY__PLAN_COMM_SHARE_OK of a step on a slow one. */
static void test_local(void) {
    tally__plan_cfg c = step_cfg();
    tally__plan_step s = tally__plan_step_time(&c, 8);
    tally__plan_comm all = tally__plan_allreduce_on(&c, c.algo, 8, 4.0 * (double)c.params);
    for (int H = 1; H <= 64; H *= 4) {
        tally__plan_local l = tally__plan_local_step(&c, 8, H, 1);
        TH_CHECK(rel(l.t_step, s.compute + s.update + all.seconds / H) && rel(l.bytes_per_step, all.sent / H),
                 "H=%d: step %g, bytes %g", H, l.t_step, l.bytes_per_step);
    }
    tally__plan_local q = tally__plan_local_step(&c, 8, 16, 0.25), f = tally__plan_local_step(&c, 8, 16, 1);
    TH_CHECK(near(q.bytes_per_step / f.bytes_per_step, 0.25, 0.01), "int8: %g of f32's bytes",
             q.bytes_per_step / f.bytes_per_step);
    TH_CHECK(tally__plan_local_step(&c, 1, 16, 1).comm == 0, "one rank does not average");
    c.cost.beta = 1 / 1e12; /* a link so fast sync's communication is a small share of its step */
    TH_CHECK(tally__plan_pick_mode(&c, 8).H == 0, "a fast link: the pick is sync, not H=%d",
             tally__plan_pick_mode(&c, 8).H);
    c.cost.beta = 8 / 1e8; /* 100 Mbit/s */
    tally__plan_local p = tally__plan_pick_mode(&c, 8);
    TH_CHECK(p.H >= 2 && p.comm_share <= TALLY__PLAN_COMM_SHARE_OK, "100 Mbit/s: H=%d at share %g", p.H, p.comm_share);
    TH_CHECK(p.H == 2 || tally__plan_local_step(&c, 8, p.H / 2, p.ratio).comm_share > TALLY__PLAN_COMM_SHARE_OK,
             "the pick H=%d is not the smallest that meets the share", p.H);
}

static void test_amdahl(void) {
    TH_CHECK(rel(tally__plan_amdahl(0.9, 1), 1) && rel(tally__plan_amdahl(0.9, 2), 1 / 0.55) &&
                 rel(tally__plan_amdahl(0.9, 8), 1 / (0.1 + 0.9 / 8)),
             "Amdahl S(n)");
    TH_CHECK(rel(tally__plan_ceiling(0.9), 10) && isinf(tally__plan_ceiling(1)), "ceiling 1/(1-P)");
    tally__plan_step s = {.n = 4, .parallel = 3, .serial = 1};
    TH_CHECK(rel(tally__plan_parallel_fraction(&s), 12.0 / 13), "P = N c / (N c + s)");
}

static void test_units(void) {
    double v = 0;
    TH_CHECK(!tally__units_rate("25Gbps", &v) && rel(v, 25e9 / 8), "25Gbps = %g B/s", v);
    TH_CHECK(!tally__units_rate("10GB/s", &v) && rel(v, 10e9), "10GB/s = %g B/s", v);
    TH_CHECK(!tally__units_rate("1GiB/s", &v) && rel(v, 1073741824.0), "1GiB/s = %g", v);
    TH_CHECK(!tally__units_time("5us", &v) && rel(v, 5e-6), "5us = %g s", v);
    TH_CHECK(!tally__units_time("1.5ms", &v) && rel(v, 1.5e-3), "1.5ms = %g s", v);
    TH_CHECK(!tally__units_count("7.5G", &v) && rel(v, 7.5e9), "7.5G = %g", v);
    TH_CHECK(!tally__units_count("2T", &v) && rel(v, 2e12), "2T = %g", v);
    TH_CHECK(!tally__units_gflops("100", &v) && rel(v, 100) && !tally__units_gflops("1.5TFLOPS", &v) && rel(v, 1500),
             "GFLOP/s");
    const char *bad_rates[] = {"25G", "fast", "-1GB/s", "10 GB/s", "10GB/h", ""};
    for (size_t i = 0; i < sizeof bad_rates / sizeof *bad_rates; i++)
        TH_CHECK(tally__units_rate(bad_rates[i], &v) == -1, "rate '%s' accepted", bad_rates[i]);
    TH_CHECK(tally__units_time("5 parsecs", &v) == -1 && tally__units_count("7.5X", &v) == -1, "bad units accepted");
}

static tally__model_desc mlp_desc(void) {
    tally__model_cfg m = {.kind = TALLY__MODEL_MLP,
                          .in_dim = 784,
                          .channels = 1,
                          .height = 28,
                          .width = 28,
                          .outputs = 10,
                          .nhidden = 2,
                          .hidden = {512, 512}};
    tally__model_desc d = {0};
    TH_CHECK(tally__model_describe(&m, 64, &d) == 0, "describe mlp: %s", tally_last_error());
    return d;
}

/* ---- the CLI ---- */

static const char *tally_bin(void) {
    const char *b = getenv("TALLY_BIN");
    return b && *b ? b : "./tally";
}

static int run(const char *args, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s plan %s", tally_bin(), args);
    return th_shell(cmd, 60, out, cap);
}

/* JSON-ish: braces and brackets balance outside strings, and it is one object. */
static int balanced(const char *s) {
    int depth = 0, in_str = 0;
    while (*s == ' ' || *s == '\n') s++;
    if (*s != '{') return 0;
    for (; *s; s++) {
        if (in_str)
            in_str = !(*s == '"' && s[-1] != '\\');
        else if (*s == '"')
            in_str = 1;
        else if (*s == '{' || *s == '[')
            depth++;
        else if ((*s == '}' || *s == ']') && --depth < 0)
            return 0;
    }
    return depth == 0 && !in_str;
}

/* Hosts: on one host the link inside; across hosts the flat algorithms take the slower link, and hier is
 * the host reduce-scatter + the shard's allreduce between hosts (the host's link shared by its M shards)
 * + the host all-gather, each level's cheapest algorithm; auto takes the cheaper. */
static double cheapest(const tally__cost *m, int coll, int n, double bytes) {
    double best = HUGE_VAL;
    for (int a = 1; a <= tally__algo_count(); a++) {
        double t = tally__algo_cost(m, a, coll, n, (size_t)bytes);
        if (t < best) best = t;
    }
    return best;
}

static void test_hosts(void) {
    tally__plan_cfg c;
    tally__plan_cfg_default(&c);
    c.params = 1000000;
    c.hosts = 2;
    c.per_host = 2;
    c.workers = 4;
    c.cost = (tally__cost){.alpha = 1e-6, .beta = 1.0 / 5e9, .gamma = 1.0 / 10e9};
    c.net = (tally__cost){.alpha = 2e-5, .beta = 1.0 / 125e6, .gamma = 0};
    const double S = 4e6;
    tally__cost slow = {.alpha = 2e-5, .beta = 1.0 / 125e6, .gamma = 1.0 / 10e9},
                shared = {.alpha = 2e-5, .beta = 2.0 / 125e6, .gamma = 1.0 / 10e9};
    double ring = tally__algo_cost(&slow, TALLY__ALGO_RING, TALLY__ALLREDUCE, 4, (size_t)S);
    double hier = cheapest(&c.cost, TALLY__REDUCE_SCATTER, 2, S) + cheapest(&shared, TALLY__ALLREDUCE, 2, S / 2) +
                  cheapest(&c.cost, TALLY__ALLGATHER, 2, S);
    double got_ring = tally__plan_allreduce_on(&c, TALLY__ALGO_RING, 4, S).seconds,
           got_hier = tally__plan_allreduce_on(&c, TALLY__ALGO_HIER, 4, S).seconds,
           got_auto = tally__plan_allreduce_on(&c, TALLY__ALGO_AUTO, 4, S).seconds;
    TH_CHECK(fabs(got_ring - ring) <= 1e-12 * ring && fabs(got_hier - hier) <= 1e-12 * hier &&
                 got_auto == fmin(got_ring, got_hier) && hier < ring,
             "2 hosts x 2: ring %.6g (want %.6g), hier %.6g (want %.6g), auto %.6g", got_ring, ring, got_hier, hier,
             got_auto);
    double one_host = tally__plan_allreduce_on(&c, TALLY__ALGO_RING, 2, S).seconds;
    TH_CHECK(one_host == tally__algo_cost(&c.cost, TALLY__ALGO_RING, TALLY__ALLREDUCE, 2, (size_t)S) &&
                 tally__plan_has_levels(&c, 4) && !tally__plan_has_levels(&c, 2) && !tally__plan_has_levels(&c, 3),
             "2 ranks fit one host: %.6g; levels at 4, not 2 or 3", one_host);
    printf("  2 hosts x 2, 4 MB at 1 Gbit/s between hosts: ring %.1f ms, hier %.1f ms\n", 1e3 * got_ring,
           1e3 * got_hier);
}

static void test_cli(void) {
    static char out[1 << 16];
    int st = run("--params 7.5G --workers 64 --precision mixed", out, sizeof out);
    TH_CHECK(st == 0, "plan exited %d:\n%s", st, out);
    const char *figs[] = {"120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB", "Amdahl", "ring", "rhd", "tree", "direct"};
    for (size_t i = 0; i < sizeof figs / sizeof *figs; i++)
        TH_CHECK(strstr(out, figs[i]) != NULL, "plan output lacks '%s':\n%s", figs[i], out);

    TH_CHECK(strstr(out, "communication modes") && strstr(out, "local SGD, H = 16, int8") && strstr(out, "pick:"),
             "plan output lacks the communication modes:\n%s", out);
    st = run("--params 7.5G --workers 64 --precision mixed --zero 3 --accum 4 --json", out, sizeof out);
    TH_CHECK(st == 0 && balanced(out), "--json exited %d or does not balance:\n%s", st, out);
    const char *keys[] = {"\"params\"",  "\"workers\"",      "\"memory\"", "\"total\"",
                          "\"comm\"",    "\"algorithms\"",   "\"rounds\"", "\"step\"",
                          "\"t_sum_s\"", "\"t_max_s\"",      "\"amdahl\"", "\"parallel_fraction\"",
                          "\"ceiling\"", "\"samples_per_s\""};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        TH_CHECK(strstr(out, keys[i]) != NULL, "--json lacks %s", keys[i]);

    tally__model_desc d = mlp_desc();
    TH_CHECK(d.nparams == 669706, "mlp 784-512-512-10: %zu parameters, want 669706", d.nparams);
    st = run("--model mlp --workers 2 --optimizer sgd --json", out, sizeof out);
    char want[96];
    snprintf(want, sizeof want, "\"activations\": %zu,", d.activation_bytes);
    TH_CHECK(st == 0 && strstr(out, "\"params\": 669706,") && strstr(out, want),
             "--model mlp: exit %d, want P = 669706 and %s:\n%s", st, want, out);
    st = run("--model mlp --hidden 100 --workers 1", out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "784-100-10") && strstr(out, "79510 parameters"), "--hidden 100: %d\n%s", st, out);
    /* GPT: V C + T C + L (12 C^2 + 13 C) + 2 C parameters, 6 x (L 12 C^2 + C V) + 12 L T C FLOP per token */
    st = run("--model gpt --workers 2", out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "3257856 parameters") && strstr(out, "GPT L4 C256 H4 T128 V256") &&
                 strstr(out, "20.84 M FLOP/token"),
             "--model gpt: exit %d\n%s", st, out);
    st = run("--model gpt --hosts 4 --ranks-per-host 2 --net-bandwidth 1Gbps", out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "8 workers") && strstr(out, "layout: 4 hosts x 2 ranks") && strstr(out, "  hier "),
             "--hosts 4 --ranks-per-host 2: exit %d\n%s", st, out);
    st = run("--model gpt --layers 48 --width 1600 --heads 25 --context 1024 --workers 64 --zero 3", out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "1477609600 parameters") && strstr(out, "9.79 G FLOP/token"),
             "--model gpt shaped as GPT-2 XL (byte vocabulary): exit %d\n%s", st, out);

    const char *bad[] = {"--params 1G",
                         "--workers 4",
                         "--params 1G --workers 0",
                         "--params 1G --workers 4 --bogus",
                         "--params 1G --workers 4 --bandwidth 25G",
                         "--params 1G --workers 4 --zero 4",
                         "--params 1G --workers 4 --optimizer lion",
                         "--params 1G --workers 4 --algo fastest",
                         "--params 1G --workers 4 --model mlp",
                         "--params 1G --workers 4 extra",
                         "--params 1G --hosts 2",
                         "--params 1G --hosts 2 --ranks-per-host 2 --workers 5",
                         "--params 1G --workers 4 --algo hier",
                         "--params 1G --hosts 2 --ranks-per-host 2 --net-bandwidth fast"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        st = run(bad[i], out, sizeof out);
        TH_CHECK(st == 2 && strstr(out, "tally plan: ") && strstr(out, "tally plan --help"),
                 "'plan %s' exited %d, want 2 with a message and where the flags are described:\n%s", bad[i], st, out);
    }
}

/* Layouts the closed forms cannot answer go to tally sim, and the plan says which it used. */
static void test_simulated(void) {
    static char out[1 << 16];
    int st = run("--params 10M --hosts 2 --ranks-per-host 2", out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "T simulated") && strstr(out, "hierarchical layout"),
             "2 hosts x 2: exit %d, want a simulated step for the hierarchical layout:\n%s", st, out);
    st = run("--params 10M --workers 8 --slow 3:1.5 --json", out, sizeof out);
    TH_CHECK(st == 0 && balanced(out) && strstr(out, "\"why\": \"stragglers\"") && strstr(out, "\"pace_rank\": 3"),
             "--slow 3:1.5: exit %d, want stragglers simulated with rank 3 setting the pace:\n%s", st, out);
    st = run("--params 10M --hosts 8 --ranks-per-host 1 --fabric fat-tree --hosts-per-leaf 2 --oversub 4", out,
             sizeof out);
    TH_CHECK(st == 0 && strstr(out, "oversubscribed fabric"), "a 4:1 fat tree: exit %d, want it simulated:\n%s", st,
             out);
    st = run("--params 10M --workers 8 --json", out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "\"simulated\": null"), "8 ranks on one host: want no simulation:\n%s", out);
    const char *bad[] = {"--params 10M --workers 8 --slow 9:2", "--params 10M --workers 8 --fabric fat-tree",
                         "--params 10M --hosts 2 --ranks-per-host 2 --oversub 0.5",
                         "--params 10M --workers 8 --slow 3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        st = run(bad[i], out, sizeof out);
        TH_CHECK(st == 2 && strstr(out, "tally plan: "), "'plan %s' exited %d, want 2 with a message:\n%s", bad[i], st,
                 out);
    }
}

int main(void) {
    test_zero_paper();
    test_fp32_formulas();
    test_comm_counts();
    test_step();
    test_local();
    test_amdahl();
    test_units();
    test_hosts();
    test_cli();
    test_simulated();
    return th_verdict("test_plan");
}
