/* harness.h - multi-process test runner: forks N ranks with the TALLY_* environment set, runs a
 * function in each, and reaps them all within a bound (stragglers are killed and reported). */
#ifndef TALLY_TEST_HARNESS_H
#define TALLY_TEST_HARNESS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#define TH_MAX_RANKS 64

typedef int (*th_rank_fn)(int rank, int size, void *arg);

#define TH_COST "2,5,10" /* alpha 2 us, 5 GB/s links, 10 GB/s reduction */

typedef struct th_opts {
    const char *transport; /* TALLY_TRANSPORT, NULL = leave unset */
    const char *algo;      /* TALLY_ALGO, NULL = leave unset */
    double timeout_s;      /* TALLY_TIMEOUT, 0 = leave unset */
    double wall_s;         /* ranks still running after this are killed (default 120) */
    /* Measure the links at init as a user's job does (the cost model's own tests). Otherwise the ranks get
     * TH_COST as TALLY_COST unless the environment has one: the ping-pong is two thirds of a small job's
     * time, and a test that checks results, faults or messages gains nothing from it. */
    int measure;
    /* Called in each child after the TALLY_* variables are set, before fn: adjust the env. */
    void (*child_env)(int rank, void *arg);
} th_opts;

typedef struct th_job {
    int n;
    pid_t pid[TH_MAX_RANKS];
    int status[TH_MAX_RANKS];    /* as from waitpid */
    double exit_s[TH_MAX_RANKS]; /* seconds from start to exit */
    int killed_by_harness[TH_MAX_RANKS];
    double t0;
} th_job;

/* Forks n ranks. Returns 0, or -1 if a fork failed (the ones started are killed and reaped). */
int th_start(th_job *job, int n, const th_opts *o, th_rank_fn fn, void *arg);
/* Reaps every rank; kills those alive after wall_s. Returns the number of ranks that did not exit 0. */
int th_wait(th_job *job, double wall_s);
/* th_start + th_wait; prints each failing rank. Returns 0 when all ranks exited 0. */
int th_run(int n, const th_opts *o, th_rank_fn fn, void *arg);

/* Memory shared between the parent and the ranks (MAP_SHARED), for results. Zeroed. */
void *th_shared_alloc(size_t bytes);
void th_shared_free(void *p, size_t bytes);

/* A free TCP port on 127.0.0.1 (bind to port 0, read it, close). */
int th_free_port(void);
double th_now(void);
/* Open file descriptors of this process (entries of /proc/self/fd), -1 if unreadable. */
int th_count_fds(void);
/* Threads of this process (entries of /proc/self/task), -1 if unreadable. */
int th_count_threads(void);
/* The count once it is back to `before` or 200 ms have passed: a joined thread can stay listed in
 * /proc/self/task a moment after pthread_join returns (the kernel wakes the joiner when the thread
 * clears its tid, before the task is gone). */
int th_count_threads_after(int before);
/* Returns once *flag, written by another process through th_shared_alloc memory, is no longer 0, or
 * after limit_s; 1 when it was set. */
int th_wait_set(const double *flag, double limit_s);
/* The rank a message names first ("rank 2 (pid ...) ..."), or -1. */
int th_first_rank_named(const char *msg);
/* Points TALLY_FLIGHT_DIR (unless set) at a directory of this test's that th_verdict removes; th_start
 * and th_tool_run call it. */
void th_flight_default(void);
/* Removes dir and the files in it (not subdirectories); quiet when it does not exist. */
void th_rm_dir(const char *dir);
/* dir/name in one of four rotating buffers (four results may be live at once). */
const char *th_path(const char *dir, const char *name);
/* Writes n bytes to path (created or truncated); exits the test with status 2 when it cannot. */
void th_write_file(const char *path, const void *data, size_t n);
/* Runs a shell command bounded by timeout(1) (KILL after timeout_s); returns its exit status (128+signal
 * when killed) and its stdout and stderr together in out. */
int th_shell(const char *cmd, int timeout_s, char *out, size_t cap);
/* TALLY_TEST_LIGHT=1 (the sanitizer pass): tests trim their largest cases, keeping every kind. */
int th_light(void);
/* The tiers (CONTRIBUTING.md, "Tests"): ctest runs a test file whose cases fall in several tiers once per tier,
 * with TALLY_TEST_TIER=quick, long or external (tests/CMakeLists.txt). th_quick() is true where the quick
 * cases run, th_long() the long ones, th_external() those that need an outside stack (a browser, PyTorch,
 * mpirun); with the variable unset (a test run by hand) all are. A case belongs to one tier; where the
 * quick tier runs a case at smaller sizes, the long tier runs it again at full size, so the tiers' union
 * is every case of the file at every size. Any other value ends the test with status 2. */
int th_quick(void);
int th_long(void);
int th_external(void);

/* Test bookkeeping: counts and a verdict line "NAME: N passed, M failed". */
extern int th_passed, th_failed;
#define TH_CHECK(cond, ...)                                                                                            \
    do {                                                                                                               \
        if (cond) {                                                                                                    \
            th_passed++;                                                                                               \
        } else {                                                                                                       \
            th_failed++;                                                                                               \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)
int th_verdict(const char *name);
/* A check inside a rank: counts into that rank's own failure counter and names the rank. */
#define TH_RANK_CHECK(fails, rank, cond, ...)                                                                          \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            (fails)++;                                                                                                 \
            fprintf(stderr, "FAIL rank %d %s:%d: ", (rank), __FILE__, __LINE__);                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0) /* prints the verdict; returns the process exit code */

#endif
