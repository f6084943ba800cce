/* test_bind.c - where tally run puts its ranks: each on a CPU of its own within the set tally was given
 * (as under taskset) when they fit, unpinned when they do not or under --bind none / TALLY_CPU_BIND=none. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tool_runner.h"

static th_tool R;

/* "0-3,8" into a set. */
static void list_to_set(const char *s, cpu_set_t *set) {
    CPU_ZERO(set);
    while (*s >= '0' && *s <= '9') {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        for (long c = a; c <= b && c < CPU_SETSIZE; c++) CPU_SET((int)c, set);
        s = *end == ',' ? end + 1 : end;
    }
}

/* Rank r's affinity as its own /proc/self/status reported it; 0 when its line is missing. */
static int rank_set(int r, cpu_set_t *set) {
    char key[48];
    snprintf(key, sizeof key, "[%d] Cpus_allowed_list:\t", r);
    const char *p = strstr(R.out, key);
    if (!p) return 0;
    list_to_set(p + strlen(key), set);
    return 1;
}

static void set_affinity(void *arg) { sched_setaffinity(0, sizeof(cpu_set_t), (cpu_set_t *)arg); }

/* `tally run -n N [flags] -- sh -c 'grep Cpus_allowed_list /proc/self/status'` started with `given` as
 * its affinity (NULL: ours) and env. */
static void run_ranks(int n, const char *flag, const char *value, cpu_set_t *given, const char *const *env) {
    char ns[16];
    snprintf(ns, sizeof ns, "%d", n);
    const char *args[12] = {"run", "-n", ns};
    int k = 3;
    if (flag) args[k++] = flag, args[k++] = value;
    args[k++] = "--";
    args[k++] = "sh";
    args[k++] = "-c";
    args[k++] = "grep Cpus_allowed_list /proc/self/status";
    args[k] = NULL;
    th_tool_opts o = {.env = env, .wall_s = 30, .child = given ? set_affinity : NULL, .arg = given};
    th_tool_run(args, &o, &R);
}

/* Every rank's set is within `given`; pinned: one CPU each, all different; else exactly `given`. */
static void check(int n, const cpu_set_t *given, int pinned, const char *what) {
    TH_CHECK(R.rc == 0, "%s: exit %d:\n%s", what, R.rc, R.out);
    cpu_set_t used;
    CPU_ZERO(&used);
    for (int r = 0; r < n; r++) {
        cpu_set_t s, outside;
        if (!rank_set(r, &s)) {
            TH_CHECK(0, "%s: rank %d said nothing of its CPUs:\n%s", what, r, R.out);
            continue;
        }
        CPU_AND(&outside, &s, given);
        TH_CHECK(CPU_EQUAL(&outside, &s), "%s: rank %d runs outside the set tally was given", what, r);
        if (pinned) {
            CPU_AND(&outside, &s, &used);
            TH_CHECK(CPU_COUNT(&s) == 1 && CPU_COUNT(&outside) == 0, "%s: rank %d has %d CPUs (or shares one)", what, r,
                     CPU_COUNT(&s));
            CPU_OR(&used, &used, &s);
        } else {
            TH_CHECK(CPU_EQUAL(&s, given), "%s: rank %d was pinned", what, r);
        }
    }
}

int main(void) {
    cpu_set_t mine, last;
    sched_getaffinity(0, sizeof mine, &mine);
    int cpus = CPU_COUNT(&mine), top = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mine)) top = c;
    CPU_ZERO(&last);
    CPU_SET(top, &last);

    run_ranks(cpus, NULL, NULL, NULL, NULL);
    check(cpus, &mine, 1, "as many ranks as CPUs: one each");
    run_ranks(cpus + 1, NULL, NULL, NULL, NULL);
    check(cpus + 1, &mine, 0, "more ranks than CPUs: none pinned");
    run_ranks(2, "--bind", "none", NULL, NULL);
    check(2, &mine, 0, "--bind none");
    const char *none[] = {"TALLY_CPU_BIND=none", NULL};
    run_ranks(2, NULL, NULL, NULL, none);
    check(2, &mine, 0, "TALLY_CPU_BIND=none");
    /* As under `taskset -c TOP`: the inherited set is the whole world tally may use. */
    run_ranks(1, NULL, NULL, &last, NULL);
    check(1, &last, 1, "one rank in a one-CPU set");
    run_ranks(2, NULL, NULL, &last, NULL);
    check(2, &last, 0, "two ranks in a one-CPU set");
    run_ranks(2, "--bind", "core", &last, NULL);
    check(2, &last, 0, "--bind core, two ranks in a one-CPU set");

    const char *bad[] = {"TALLY_CPU_BIND=socket", NULL};
    run_ranks(2, NULL, NULL, NULL, bad);
    TH_CHECK(R.rc == 2 && strstr(R.out, "TALLY_CPU_BIND='socket'") && strstr(R.out, "core or none"),
             "a bad TALLY_CPU_BIND: exit %d:\n%s", R.rc, R.out);
    run_ranks(2, "--bind", "hwthread", NULL, NULL);
    TH_CHECK(R.rc == 2 && strstr(R.out, "--bind 'hwthread'"), "a bad --bind: exit %d:\n%s", R.rc, R.out);

    const char *debug[] = {"TALLY_DEBUG=1", NULL};
    const char *bench[] = {"bench", "allreduce", "-n", "2", "-b", "8", "-e", "8", "--iters", "2", NULL};
    th_tool_opts o = {.env = debug, .wall_s = 30};
    th_tool_run(bench, &o, &R);
    TH_CHECK(R.rc == 0 && strstr(R.out, "rank 0 of 2: CPUs ") && strstr(R.out, "rank 1 of 2: CPUs "),
             "TALLY_DEBUG=1 names each rank's CPUs: exit %d:\n%s", R.rc, R.out);
    /* A rank of tally train gets as many CPUs as it has BLAS threads: one rank may use them all. */
    char all[16];
    snprintf(all, sizeof all, "%d", cpus);
    const char *threads[] = {"train",         "-n",      "1", "--threads", all, "--data",
                             "synthetic:256", "--steps", "1", "--quiet",   NULL};
    th_tool_run(threads, &o, &R);
    TH_CHECK(R.rc == 0, "train -n 1 --threads %d (every CPU): exit %d:\n%s", cpus, R.rc, R.out);
    return th_verdict("test_bind");
}
