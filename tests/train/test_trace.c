/* test_trace.c - the timeline: a 2-rank MLP run with --trace has its buckets' allreduces overlapping
 * backward with overlap on and after it with --no-overlap (tests/train/check_trace.py reads the JSON); tally
 * bench --trace; TALLY_TRACE from a program of the library's own, merged from 3 ranks; a broken communicator
 * leaves each rank its own file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <tally.h>
#include <unistd.h>

#include "harness.h"
#include "tool_runner.h"

static char dir[128];
static char out[1 << 16];

static const char *src_dir(void) {
    const char *s = getenv("TALLY_SOURCE_DIR");
    return s ? s : "..";
}

/* python3 on a timeline: the checker with its mode, or a one-line program that finds the file's spans in s. */
static int py(const char *code_or_mode, const char *file, int ranks, int is_mode) {
    char cmd[1024];
    if (is_mode)
        snprintf(cmd, sizeof cmd, "python3 %s/tests/train/check_trace.py %s %d %s", src_dir(), file, ranks,
                 code_or_mode);
    else
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
                 "s=[e for e in d[\"traceEvents\"] if e.get(\"ph\")==\"X\"]; %s' %s",
                 code_or_mode, file);
    int rc = th_shell(cmd, 60, out, sizeof out);
    printf("  %s\n%s", cmd, out);
    return rc;
}

static void train_run(const char *what, const char *extra) {
    const char *file = th_path(dir, "train.json");
    unlink(file);
    const char *args[] = {"train",       "-n",  "2",         "--data",  "synthetic", "--steps", "30",  "--batch", "64",
                          "--bucket-mb", "0.5", "--no-eval", "--quiet", "--trace",   file,      extra, NULL};
    th_tool_opts o = {.wall_s = 120};
    th_tool *t = malloc(sizeof *t);
    th_tool_run(args, &o, t);
    TH_CHECK(t->rc == 0, "%s: tally train exited %d:\n%s", what, t->rc, t->out);
    TH_CHECK(strstr(t->out, "timeline of 2 ranks in"), "%s: tally train does not say where the timeline is:\n%s", what,
             t->out);
    free(t);
    TH_CHECK(py(extra ? "no-overlap" : "overlap", file, 2, 1) == 0, "%s: the timeline fails its checks", what);
}

static void bench_run(void) {
    const char *file = th_path(dir, "bench.json");
    const char *args[] = {"bench", "allreduce", "-n",      "2", "-b",      "1K", "-e", "64K",
                          "-f",    "4",         "--iters", "5", "--trace", file, NULL};
    th_tool_opts o = {.wall_s = 60};
    th_tool *t = malloc(sizeof *t);
    th_tool_run(args, &o, t);
    TH_CHECK(t->rc == 0, "bench --trace: exited %d:\n%s", t->rc, t->out);
    free(t);
    const char *code = "s=[e for e in s if e[\"cat\"]==\"coll\"]; assert {e[\"pid\"] for e in s}=={0,1}, s[:3]; "
                       "assert {e[\"args\"][\"bytes\"] for e in s}>={1024,4096,16384,65536}; "
                       "assert all(e[\"args\"][\"transport\"]==\"shm\" for e in s); print(len(s), \"calls\")";
    TH_CHECK(py(code, file, 2, 0) == 0, "bench --trace: the timeline lacks a rank or a size");
}

/* TALLY_TRACE in a program of the library's own: 3 ranks, 10 allreduces each; rank 1 of the broken case
 * leaves after 3, and each rank then writes its own file. It leaves 0.3 s late, so that rank 0 is inside
 * its 4th call when it goes: the timeline has spans of the calls that began (a call the communicator
 * refuses, once its monitor has seen the peer go, has none), and a loaded machine could otherwise let the
 * monitor see it first. */
static int g_broken;
static void trace_env(int rank, void *arg) {
    (void)rank;
    setenv("TALLY_TRACE", (const char *)arg, 1);
}

static int lib_rank(int rank, int size, void *arg) {
    (void)size;
    (void)arg;
    tally_comm *c;
    if (tally_comm_init(&c)) return 1;
    float v[64] = {0};
    int rc = 0;
    for (int i = 0; i < 10 && !rc; i++) {
        if (g_broken && rank == 1 && i == 3) {
            usleep(300000);
            _exit(0);
        }
        rc = tally_allreduce(c, v, v, 64, TALLY_F32, TALLY_SUM);
    }
    int frc = tally_comm_free(c);
    return (g_broken ? rc != 0 : rc == 0) && frc == 0 ? 0 : 1;
}

static void library_run(int broken) {
    const char *file = th_path(dir, broken ? "broken.json" : "lib.json");
    g_broken = broken;
    th_opts o = {.wall_s = 60, .timeout_s = 10, .child_env = trace_env};
    th_job job;
    TH_CHECK(th_start(&job, broken ? 2 : 3, &o, lib_rank, (void *)file) == 0, "fork");
    int bad = th_wait(&job, 60);
    if (!broken) {
        TH_CHECK(bad == 0, "TALLY_TRACE: %d ranks failed", bad);
        const char *code = "assert sorted({e[\"pid\"] for e in s})==[0,1,2]; "
                           "assert all(sum(1 for e in s if e[\"pid\"]==r and e[\"name\"]==\"allreduce\")==10 "
                           "for r in range(3)); print(len(s), \"spans\")";
        TH_CHECK(py(code, file, 3, 0) == 0, "TALLY_TRACE: the merged timeline lacks a rank's 10 allreduces");
        return;
    }
    TH_CHECK(WIFEXITED(job.status[0]) && WEXITSTATUS(job.status[0]) == 0, "broken: rank 0 ended 0x%x", job.status[0]);
    char own[256];
    snprintf(own, sizeof own, "%s.rank0", file);
    const char *code = "assert {e[\"pid\"] for e in s}=={0}; assert any(e[\"cat\"]==\"coll-failed\" for e in s); "
                       "print(len(s), \"spans of rank 0 alone\")";
    TH_CHECK(py(code, own, 1, 0) == 0, "broken: rank 0 did not write its own timeline %s", own);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tally-test-trace-%d", (int)getpid());
    th_rm_dir(dir);
    mkdir(dir, 0700);
    if (th_quick()) {
        train_run("MLP, overlap", NULL);
        bench_run();
        library_run(0);
        library_run(1);
    }
    if (th_long()) train_run("MLP, --no-overlap", "--no-overlap");
    th_rm_dir(dir);
    return th_verdict("test_trace");
}
