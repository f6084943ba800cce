/* test_sim.c - the simulator against hand-computed cases: ring, tree and rhd on small layouts against
 * closed forms written here, two flows on one NIC, a slow rank on the critical path, the fast path
 * against the event level, cluster files and their errors, and `tally sim` end to end (--calibrate too). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/coll.h"
#include "core/sig.h"
#include "harness.h"
#include "sim/sim_int.h"

static int close_to(double got, double want, double rel) { return fabs(got - want) <= rel * fabs(want) + 1e-15; }

/* One host of n ranks, a core each, round figures: alpha 10 us, 1 GB/s copies, 2 GB/s reductions. */
static tally__sim_cluster one_host(int n) {
    tally__sim_cluster c;
    tally__sim_cluster_default(&c);
    c.per_host = n;
    c.cores = n;
    c.shm = (tally__cost){.alpha = 10e-6, .beta = 1e-9, .gamma = 0.5e-9};
    return c;
}

static double play(const tally__sim_cluster *c, int coll, int algo, size_t bytes, int method, tally__sim_result *r) {
    tally__sim_coll q = {.coll = coll, .algo = algo, .bytes = bytes, .dtype = TALLY_F32, .method = method};
    int rc = tally__sim_collective(c, &q, r);
    TH_CHECK(rc == 0, "sim of %s %zu bytes: %s", tally__algo_name(algo), bytes, rc ? tally_last_error() : "");
    return rc ? -1 : r->seconds;
}

/* Ring allreduce: 2(n-1) steps of one block each, reduce-scatter steps copy and reduce, all-gather
 * steps copy: 2(n-1)a + 2S(n-1)/n b + S(n-1)/n g (DESIGN.md's table, which the library's model uses). */
static void test_ring_closed_form(void) {
    const int ns[] = {2, 3, 4, 8};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        int n = ns[i];
        tally__sim_cluster c = one_host(n);
        size_t S = (size_t)n * 4 * 100000; /* blocks of 100000 floats */
        double a = c.shm.alpha, b = c.shm.beta, g = c.shm.gamma, f = (n - 1.0) / n;
        double want = 2 * (n - 1) * a + 2 * S * f * b + S * f * g;
        tally__sim_result r;
        double ev = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_RING, S, TALLY__SIM_EVENT, &r);
        TH_CHECK(close_to(ev, want, 1e-9), "ring n=%d event level: %.9f s, closed form %.9f s", n, ev, want);
        TH_CHECK(r.steps == 2 * (n - 1), "ring n=%d: %ld steps, want %d", n, r.steps, 2 * (n - 1));
        double fa = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_RING, S, TALLY__SIM_FAST, &r);
        TH_CHECK(close_to(fa, want, 1e-9), "ring n=%d fast path: %.9f s, closed form %.9f s", n, fa, want);
        double bus = S / want * 2 * f;
        TH_CHECK(close_to(r.busbw, bus, 1e-9), "ring n=%d busbw %.4g, want %.4g", n, r.busbw, bus);
    }
}

/* A cache-resident copy rate for vectors up to 4 MiB, the large one's from 64 MiB, log size between. */
static void test_cache_rate(void) {
    tally__sim_cluster c = one_host(2);
    c.cache_beta = c.shm.beta / 2;
    c.cache_bytes = 4 << 20;
    c.beta_bytes = 64 << 20;
    double b[4] = {tally__sim_at_size(&c, 1 << 20).shm.beta, tally__sim_at_size(&c, 16 << 20).shm.beta,
                   tally__sim_at_size(&c, 64 << 20).shm.beta, tally__sim_at_size(&c, 1 << 30).shm.beta};
    TH_CHECK(close_to(b[0], c.cache_beta, 1e-12) && close_to(b[1], c.shm.beta / sqrt(2), 1e-9) &&
                 close_to(b[2], c.shm.beta, 1e-12) && close_to(b[3], c.shm.beta, 1e-12),
             "beta by size: %g %g %g %g, want cache, halfway in log size, large, large", b[0], b[1], b[2], b[3]);
    c.cache_bytes = 0;
    TH_CHECK(tally__sim_at_size(&c, 1 << 20).shm.beta == c.shm.beta, "no cache rate: one beta for every size");
}

/* Tree on 3 ranks, one segment (S <= 128 KiB): the second child sends up (reduced at the root), then the
 * first child, then the root sends the result to both at once: 3a + S(3b + 2g). */
static void test_tree_closed_form(void) {
    tally__sim_cluster c = one_host(3);
    size_t S = 64 << 10;
    double a = c.shm.alpha, b = c.shm.beta, g = c.shm.gamma;
    double want = 3 * a + S * (3 * b + 2 * g);
    tally__sim_result r;
    double got = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_TREE, S, TALLY__SIM_EVENT, &r);
    TH_CHECK(close_to(got, want, 1e-9), "tree n=3: %.9f s, closed form %.9f s", got, want);
    /* the same on 3 ranks sharing one core: every message waits a sleeping waiter's wake-up (once per rank
     * more than the cores), then its own copy at a core's rate; the root's two receivers, at the last
     * step, also share the core, which ends that step when their copies outlast the wake-up */
    c.cores = 1;
    for (int big = 0; big < 2; big++) {
        S = big ? 64 << 10 : 4 << 10;
        double w = 2 * c.crowded_alpha;
        want = 2 * (w + S * (b + g)) + fmax(w + S * b, a + 2 * S * b);
        got = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_TREE, S, TALLY__SIM_EVENT, &r);
        TH_CHECK(close_to(got, want, 1e-9), "tree n=3 on one core, %zu bytes: %.9f s, want %.9f s", S, got, want);
        TH_CHECK(big ? want == 2 * (w + S * (b + g)) + a + 2 * S * b : want == 3 * w + S * (2 * (b + g) + b),
                 "the case meant: %s", big ? "shared copies outlast the wake-up" : "the wake-up outlasts them");
    }
}

/* rhd on 4 ranks past the small-vector switch: halving S/2 and S/4 (reduced), doubling S/4 and S/2:
 * 4a + 1.5 S b + 0.75 S g. On 8 ranks: 6a + 2S(7/8) b + S(7/8) g. */
static void test_rhd_closed_form(void) {
    for (int n = 4; n <= 8; n *= 2) {
        tally__sim_cluster c = one_host(n);
        size_t S = 1 << 20;
        double a = c.shm.alpha, b = c.shm.beta, g = c.shm.gamma, f = (n - 1.0) / n, lg = n == 4 ? 2 : 3;
        double want = 2 * lg * a + 2 * S * f * b + S * f * g;
        tally__sim_result r;
        double ev = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_RHD, S, TALLY__SIM_EVENT, &r);
        TH_CHECK(close_to(ev, want, 1e-9), "rhd n=%d event level: %.9f s, closed form %.9f s", n, ev, want);
        double fa = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_RHD, S, TALLY__SIM_FAST, &r);
        TH_CHECK(close_to(fa, want, 1e-9), "rhd n=%d fast path: %.9f s, closed form %.9f s", n, fa, want);
    }
    /* 4 ranks on 2 cores, 32 KiB: every message's wake-up (two ranks past the cores) and then its own copy
     * outlast the four copies shared by the two cores, at every step, on both levels of the model */
    tally__sim_cluster c = one_host(4);
    c.cores = 2;
    size_t S = 32 << 10;
    double w = 2 * c.crowded_alpha, b = c.shm.beta, g = c.shm.gamma;
    double want = 4 * w + 0.75 * S * (2 * b + g);
    tally__sim_result r;
    double ev = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_RHD, S, TALLY__SIM_EVENT, &r);
    double fa = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_RHD, S, TALLY__SIM_FAST, &r);
    TH_CHECK(close_to(ev, want, 1e-9) && close_to(fa, want, 1e-9),
             "rhd n=4 on 2 cores: event %.9f s, fast %.9f s, closed form %.9f s", ev, fa, want);
}

/* Two hosts of two ranks: rank 0 alone sends X to rank 2, then ranks 0 and 1 both send X to host 1 at once
 * over the one NIC: twice the time (latency 0, so the transfer is all there is). payload: the share of the
 * NIC's rate the data gets. */
static double nic_program(int both, double payload, tally__sim_result *r) {
    tally__sim_cluster c;
    tally__sim_cluster_default(&c);
    c.hosts = 2;
    c.per_host = 2;
    c.nic_alpha = 0;
    c.nic_rate = 1e9;
    c.nic_payload = payload;
    tally__sim_prog p;
    tally__sim_prog_init(&p, 4);
    for (int s = 0; s < 1 + both; s++) {
        tally__sim_msg snd = {.peer = 2 + s, .send = 1, .bytes = 1000000}, rcv = {.peer = s, .bytes = 1000000};
        int first[2] = {0, 1};
        tally__sim_sched a = {.msg = &snd, .first = first, .nmsg = 1, .nstep = 1};
        tally__sim_sched b = {.msg = &rcv, .first = first, .nmsg = 1, .nstep = 1};
        tally__sim_prog_append(&p, s, 0, &a, 0, 1, -1, 0, 0);
        tally__sim_prog_append(&p, 2 + s, 0, &b, 0, 1, -1, 0, 0);
    }
    tally__sim_prog_seal(&p);
    int rc = tally__sim_event_run(&c, &p, r);
    TH_CHECK(rc == 0, "nic program: %s", rc ? tally_last_error() : "");
    tally__sim_prog_free(&p);
    return r->seconds;
}

static void test_contention(void) {
    tally__sim_result r;
    double framed = nic_program(0, 0.5, &r), one = nic_program(0, 1, &r), two = nic_program(1, 1, &r);
    TH_CHECK(close_to(one, 1e-3, 1e-9), "one flow of 1 MB on a 1 GB/s NIC: %.6f s, want 0.001", one);
    TH_CHECK(close_to(framed, 2e-3, 1e-9), "1 MB on a 1 GB/s NIC whose frames are half headers: %.6f s, want 0.002",
             framed);
    TH_CHECK(close_to(two, 2 * one, 1e-9), "two flows on one NIC: %.6f s, want twice %.6f", two, one);
    TH_CHECK(r.crit_kind == TALLY__SIM_NIC_TX || r.crit_kind == TALLY__SIM_NIC_RX,
             "two flows: the critical link is %s, want a NIC", tally__sim_kind_name(r.crit_kind));
    TH_CHECK(close_to(r.util[TALLY__SIM_NIC_TX], 1, 1e-9), "two flows: the NIC was busy %.3f of the time, want 1",
             r.util[TALLY__SIM_NIC_TX]);
    /* an oversubscribed fat tree: 4 hosts, 2 per leaf; a ring of one rank per host crosses each leaf's
     * uplink with one flow a step */
    tally__sim_cluster c;
    tally__sim_cluster_default(&c);
    c.hosts = 4;
    c.per_host = 1;
    c.fabric = TALLY__SIM_FAT_TREE;
    c.hosts_per_leaf = 2;
    c.oversub = 4; /* uplink = 2 x NIC / 4 = half a NIC: the crossing flow runs at half rate */
    c.nic_alpha = 0;
    c.nic_rate = 1e9;
    c.nic_payload = 1;
    size_t S = 4 << 20;
    double want = 6 * (S / 4.0) / 0.5e9; /* each of the 6 steps waits for the block crossing at half rate */
    double ev = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_RING, S, TALLY__SIM_EVENT, &r);
    TH_CHECK(close_to(ev, want, 1e-6), "ring over a 4:1 fat tree: %.6f s, want %.6f s", ev, want);
    TH_CHECK(r.crit_kind == TALLY__SIM_UP || r.crit_kind == TALLY__SIM_DOWN,
             "fat tree: critical link %s, want an uplink", tally__sim_kind_name(r.crit_kind));
    double fa = play(&c, TALLY__ALLREDUCE, TALLY__ALGO_RING, S, TALLY__SIM_FAST, &r);
    TH_CHECK(close_to(fa, want, 1e-6), "ring over a 4:1 fat tree, fast path: %.6f s, want %.6f s", fa, want);
}

/* Rank 3 computes 10 ms before a ring allreduce, the others 1 ms: the critical path runs through it. */
static void test_slow_rank(void) {
    tally__sim_cluster c = one_host(6);
    tally__sim_prog p;
    tally__sim_prog_init(&p, 6);
    for (int k = 0; k < 6; k++) {
        tally__sim_sched s;
        tally__sim_trace(TALLY__ALGO_RING, TALLY__ALLREDUCE, k, 6, 6 << 20, TALLY_F32, 0, &s);
        tally__sim_prog_append(&p, k, 0, &s, 0, 1, -1, 0, 0);
        p.lane[(size_t)k * TALLY__SIM_LANES].step[0].compute = k == 3 ? 10e-3 : 1e-3;
        tally__sim_sched_free(&s);
    }
    tally__sim_prog_seal(&p);
    tally__sim_result r;
    int rc = tally__sim_event_run(&c, &p, &r);
    tally__sim_prog_free(&p);
    TH_CHECK(rc == 0 && r.crit_rank == 3, "slow rank 3: the critical path names rank %d (share %.2f), want 3",
             r.crit_rank, r.crit_rank_share);
    /* a training step: --slow 5:2 on 8 ranks paces every step; its step is about the compute longer */
    tally__sim_cluster d = one_host(8);
    tally__sim_train t = {.grad_bytes = 4e6,
                          .bucket_bytes = 1e6,
                          .nlayers = 4,
                          .accum = 1,
                          .compute_s = 0.1,
                          .update_s = 0.001,
                          .steps = 5,
                          .algo = TALLY__ALGO_AUTO};
    tally__sim_step even, slow;
    rc = tally__sim_train_step(&d, &t, &even);
    tally__sim_cluster_set(&d, "slow", "5:2");
    rc |= tally__sim_train_step(&d, &t, &slow);
    TH_CHECK(rc == 0 && slow.pace_rank == 5 && close_to(slow.pace_share, 1, 1e-12),
             "--slow 5:2: pace set by rank %d (%.2f of steps), want 5 in all", slow.pace_rank, slow.pace_share);
    TH_CHECK(even.pace_rank == -1, "no slow rank: pace rank %d, want none", even.pace_rank);
    TH_CHECK(close_to(slow.step_s - even.step_s, 0.1, 0.05), "a rank twice as slow adds %.4f s to a step, want ~0.1",
             slow.step_s - even.step_s);
}

/* Local SGD: a step is compute + update + the averaging over H (nothing hides it); no rank waits for
 * another inside a round, so drawn compute costs sync (the slowest rank every step) more than local SGD
 * (the slowest sum of H steps). */
static void test_local(void) {
    tally__sim_cluster d = one_host(8);
    tally__sim_train t = {.grad_bytes = 4e6,
                          .accum = 1,
                          .compute_s = 0.01,
                          .update_s = 0.001,
                          .steps = 64,
                          .algo = TALLY__ALGO_AUTO,
                          .nlayers = 1};
    tally__sim_step sync, l1, l16, q16;
    int rc = tally__sim_train_step(&d, &t, &sync);
    t.local_steps = 1;
    rc |= tally__sim_train_step(&d, &t, &l1);
    t.local_steps = 16;
    rc |= tally__sim_train_step(&d, &t, &l16);
    t.outer_ratio = 0.25;
    rc |= tally__sim_train_step(&d, &t, &q16);
    TH_CHECK(rc == 0, "local runs failed: %s", tally_last_error());
    double avg = l1.step_s - 0.011;
    TH_CHECK(avg > 0 && close_to(l16.step_s, 0.011 + avg / 16, 1e-9), "H=16: step %g, want %g", l16.step_s,
             0.011 + avg / 16);
    TH_CHECK(q16.comm_s < l16.comm_s * 0.5, "int8 averaging %g against f32's %g", q16.comm_s, l16.comm_s);
    TH_CHECK(l1.step_s >= sync.step_s - 1e-12, "H=1 (nothing overlapped) %g against sync's %g", l1.step_s, sync.step_s);
    tally__sim_cluster_set(&d, "compute-sd", "0.3");
    t.outer_ratio = 0;
    t.local_steps = 0;
    rc = tally__sim_train_step(&d, &t, &sync);
    t.local_steps = 16;
    rc |= tally__sim_train_step(&d, &t, &l16);
    TH_CHECK(rc == 0 && l16.step_s < sync.step_s * 0.9, "drawn compute: local SGD %g against sync %g", l16.step_s,
             sync.step_s);
}

/* The fast path against the event level where both apply (layouts across hosts, hier's pipeline). */
static void test_fast_matches_event(void) {
    struct {
        int hosts, per, algo;
        size_t bytes;
        int fat;
    } cases[] = {{4, 2, TALLY__ALGO_RING, 1 << 20, 0},  {4, 2, TALLY__ALGO_RING, 64 << 20, 0},
                 {8, 1, TALLY__ALGO_RING, 8 << 20, 1},  {4, 2, TALLY__ALGO_RHD, 8 << 20, 0},
                 {4, 2, TALLY__ALGO_HIER, 64 << 20, 0}, {4, 4, TALLY__ALGO_HIER, 1 << 20, 1},
                 {2, 4, TALLY__ALGO_HIER, 16 << 20, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (!(cases[i].bytes <= (8u << 20) && i != 2 ? th_quick() : th_long())) continue; /* quick: 3 of 7 */
        tally__sim_cluster c;
        tally__sim_cluster_default(&c);
        c.hosts = cases[i].hosts;
        c.per_host = cases[i].per;
        c.nic_rate = 10e9 / 8;
        if (cases[i].fat) c.fabric = TALLY__SIM_FAT_TREE, c.hosts_per_leaf = 2, c.oversub = 2;
        tally__sim_result r;
        double ev = play(&c, TALLY__ALLREDUCE, cases[i].algo, cases[i].bytes, TALLY__SIM_EVENT, &r);
        double fa = play(&c, TALLY__ALLREDUCE, cases[i].algo, cases[i].bytes, TALLY__SIM_FAST, &r);
        TH_CHECK(close_to(fa, ev, 0.05), "%d x %d %s %zu bytes%s: fast %.6f s, event %.6f s (want within 5%%)",
                 cases[i].hosts, cases[i].per, tally__algo_name(cases[i].algo), cases[i].bytes,
                 cases[i].fat ? " (fat tree 2:1)" : "", fa, ev);
    }
}

/* ---- `tally sim` end to end ---- */

static int sim(const char *args, char *out, size_t cap) {
    const char *b = getenv("TALLY_BIN");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s sim %s", b && *b ? b : "./tally", args);
    return th_shell(cmd, 120, out, cap);
}

static void test_cli(void) {
    static char out[1 << 16];
    int st = sim("--hosts 4 --ranks-per-host 2 --nic 10Gbps --size 1K,1M,64M", out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "hier(") && strstr(out, "64 MiB") && strstr(out, "nic tx"),
             "sim on 4 x 2: exit %d, want hier picked and the NIC named:\n%s", st, out);
    st = sim("--hosts 4 --ranks-per-host 2 --size 4M --algo ring --json", out, sizeof out);
    const char *keys[] = {"\"results\"",     "\"seconds\"",  "\"busbw\"",
                          "\"utilisation\"", "\"critical\"", "\"algo\": \"ring\""};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        TH_CHECK(st == 0 && strstr(out, keys[i]), "--json: exit %d, no %s:\n%s", st, keys[i], out);
    char path[] = "/tmp/tally-sim-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f) {
        fputs("# a described cluster\nhosts = 3\nranks-per-host = 2   # two a host\nnic = 10Gbps\n", f);
        fclose(f);
    }
    char args[512];
    snprintf(args, sizeof args, "--config %s --size 1M --json", path);
    st = sim(args, out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "\"hosts\": 3") && strstr(out, "\"ranks_per_host\": 2"),
             "--config: exit %d, want 3 hosts x 2:\n%s", st, out);
    f = fopen(path, "w");
    if (f) {
        fputs("hosts = 2\nbogus = 1\n", f);
        fclose(f);
    }
    st = sim(args, out, sizeof out);
    TH_CHECK(st == 2 && strstr(out, "line 2") && strstr(out, "bogus"), "a config's bad key: exit %d:\n%s", st, out);
    unlink(path);
    st = sim("--train --params 10M --layers 4 --compute 50ms --hosts 2 --ranks-per-host 2 --slow 1:2 --json", out,
             sizeof out);
    TH_CHECK(st == 0 && strstr(out, "\"step_s\"") && strstr(out, "\"pace_rank\": 1"),
             "--train --slow 1:2: exit %d, want a step paced by rank 1:\n%s", st, out);
    st = sim("--train --params 10M --compute 50ms --hosts 2 --ranks-per-host 2 --mode async --staleness 2", out,
             sizeof out);
    TH_CHECK(st == 0 && strstr(out, "async"), "--mode async: exit %d:\n%s", st, out);
}

/* `sim BEFORE --config F --cores 7 ... AFTER`, F a 16 x 4 cluster whose rank 3 takes 2x and `more` ranks
 * after it 1x (4 ranks on 7 CPUs are not crowded), with --train's 10 ms of compute: its compute_s, or -1. */
static double slow_compute(int more, const char *before, const char *after, char *out, size_t cap) {
    char conf[] = "/tmp/tally-sim-XXXXXX", args[512];
    int fd = mkstemp(conf);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    TH_CHECK(f != NULL, "a config file in /tmp");
    if (!f) return -1;
    fputs("hosts = 16\nranks-per-host = 4\nslow = 3:2\n", f);
    for (int r = 4; r < 4 + more; r++) fprintf(f, "slow = %d:1\n", r);
    fclose(f);
    snprintf(args, sizeof args, "%s --config %s --cores 7 --train --params 1M --compute 10ms --size 1K --json %s",
             before, conf, after);
    int st = sim(args, out, cap);
    unlink(conf);
    const char *at = st == 0 ? strstr(out, "\"compute_s\": ") : NULL;
    return at ? strtod(at + strlen("\"compute_s\": "), NULL) : -1;
}

/* --calibrate measures, then sets what was given after it, in order: a --config file's settings once (rank
 * 3's factor 2, not 4; 40 slow lines of the 64 a cluster takes, not 80) and --cores over the CPUs it
 * counted (7, which this machine is unlikely to have). */
static void test_cli_calibrate(void) {
    static char out[1 << 16];
    char saved[64];
    snprintf(saved, sizeof saved, "/tmp/tally-sim-saved-%d", (int)getpid());
    char save[96];
    snprintf(save, sizeof save, "--save %s", saved);
    for (int more = 0; more <= 39; more += 39) {
        double given = slow_compute(more, "", "", out, sizeof out);
        TH_CHECK(close_to(given, 0.02, 1e-6), "%d slow lines, rank 3 2x: want compute_s 0.02:\n%s", more + 1, out);
        if (!more && !th_long()) continue; /* quick: the 40 lines alone, which also failed the count before */
        double calibrated = slow_compute(more, "--calibrate", more ? save : "", out, sizeof out);
        TH_CHECK(calibrated == given, "--calibrate --config of %d slow lines: want compute_s %g as without it:\n%s",
                 more + 1, given, out);
    }
    FILE *s = fopen(saved, "r");
    char line[256];
    int cores = 0;
    while (s && fgets(line, sizeof line, s)) cores |= !strcmp(line, "cores = 7\n");
    if (s) fclose(s);
    TH_CHECK(cores, "--cores 7 after --calibrate: want 'cores = 7' in the saved cluster, not the CPUs counted");
    unlink(saved);
}

/* The scale the issue asks for: a ring of 65,536 ranks, and a step on 8,192 hosts x 8 (fast path). */
static void test_cli_scale(void) {
    static char out[1 << 16];
    int st = sim("--hosts 8192 --ranks-per-host 8 --nic 100Gbps --algo ring --size 64M --json", out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "\"method\": \"fast\""), "65,536-rank ring: exit %d:\n%s", st, out);
    st = sim("--hosts 8192 --ranks-per-host 8 --nic 100Gbps --train --params 1.5G --layers 48 --compute 2s --json", out,
             sizeof out);
    TH_CHECK(st == 0 && strstr(out, "\"step_s\""), "a step on 8,192 x 8: exit %d:\n%s", st, out);
}

/* Refusals by the CLI. */
static void test_cli_refused(void) {
    static char out[1 << 16];
    int st;
    const char *bad[] = {"--hosts 0",
                         "--nic fast",
                         "--hosts 2 --slow 9:2",
                         "--config /nonexistent/tally.conf",
                         "--train --params 1M",
                         "--size 1K,,2K",
                         "--params 1M --compute 1s",
                         "--fabric star",
                         "--method quick",
                         "--train --params 1M --compute 1s --outer-compress int8",
                         "--train --params 1M --compute 1s --local-steps 4 --mode async"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        st = sim(bad[i], out, sizeof out);
        TH_CHECK(st == 2 && strstr(out, "tally sim: "), "'sim %s' exited %d, want 2 with a message:\n%s", bad[i], st,
                 out);
    }
    st = sim("--hosts 8192 --ranks-per-host 8 --algo ring --method event", out, sizeof out);
    TH_CHECK(st == 1 && strstr(out, "--method auto or fast"), "a 65,536-rank event level: exit %d, want refused:\n%s",
             st, out);
    st =
        sim("--hosts 2 --nic 100Mbps --train --params 3M --compute 300ms --local-steps 16 --outer-compress int8 --json",
            out, sizeof out);
    TH_CHECK(st == 0 && strstr(out, "\"mode\": \"local\"") && strstr(out, "\"pick\": \"local\""),
             "local SGD at 100 Mbit/s: exit %d:\n%s", st, out);
    st = sim("--hosts 1 --ranks-per-host 4 --algo hier", out, sizeof out);
    TH_CHECK(st == 1 && strstr(out, "hier needs"), "hier on one host: exit %d, want 1 saying why:\n%s", st, out);
}

int main(void) {
    if (th_quick()) {
        test_ring_closed_form();
        test_cache_rate();
        test_tree_closed_form();
        test_rhd_closed_form();
        test_contention();
        test_slow_rank();
        test_local();
    }
    test_fast_matches_event();
    if (th_quick()) {
        test_cli();
        test_cli_calibrate();
        test_cli_refused();
    }
    if (th_long()) test_cli_scale();
    return th_verdict("test_sim");
}
