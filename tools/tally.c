/* tally.c - main() of the tally tool: picks the subcommand (run, bench, train, ...) and hands it
 * its arguments; --help and --version. Each subcommand lives in its own cmd_*.c. */
#include <cblas.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <tally.h>

#include "../src/nn/blas_core.h"
#include "../src/nn/gemm_bf16.h"
#include "cmd.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv); /* NULL while the subcommand is not built (see cmd.h) */
    const char *summary;
} tally_command;

static const tally_command commands[] = {
    {"run", tally_cmd_run, "start N local ranks of a program: tally run -n N [--] PROG [ARGS...]"},
    {"bench", tally_cmd_bench, "measure collectives across N ranks: tally bench -n N ..."},
    {"train", tally_cmd_train, "train a model data-parallel across N ranks: tally train -n N ..."},
    {"plan", tally_cmd_plan, "predict the cost of a training run before starting it"},
    {"sim", tally_cmd_sim, "simulate collectives and training steps on a described cluster"},
    {"generate", tally_cmd_generate, "sample text from a trained model: tally generate --ckpt DIR ..."},
    {"flight", tally_cmd_flight, "merge a failed job's flight records: tally flight DIR"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "usage: tally <command> [options]\n"
               "       tally --help | --version\n"
               "\n"
               "commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'tally <command> --help' describes a command's options.\n");
}

static const tally_command *find_command(const char *name) {
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

/* What runs at exit (OpenBLAS joins its threads there) must not keep a failed or finished command from
 * ending: past EXIT_GRACE_S the process leaves with its status, without the rest of the exit path. */
#define EXIT_GRACE_S 10
static volatile sig_atomic_t exit_status;

static void exit_now(int sig) {
    (void)sig;
    _exit(exit_status);
}

static int exit_bounded(int rc) {
    exit_status = rc;
    fflush(NULL);
    signal(SIGALRM, exit_now);
    alarm(EXIT_GRACE_S);
    return rc;
}

/* OpenBLAS picks its kernels when it loads, before main. Where it fell back to SSE kernels on a CPU with
 * AVX2 or AVX-512 (a CPU newer than the OpenBLAS release), tally starts itself again with OPENBLAS_CORETYPE
 * naming the better set, which the ranks of tally run inherit; a user's OPENBLAS_CORETYPE is never
 * changed. TALLY_BLAS_CORE_DETECTED keeps OpenBLAS's own pick for --version. 1 when the environment
 * asks for a restart. */
static int blas_core_upgrade(void) {
    const char *better = tally__blas_core_better();
    if (!better) return 0;
    if (setenv("TALLY_BLAS_CORE_DETECTED", tally__blas_core_name(), 1) != 0) return 0;
    if (setenv("OPENBLAS_CORETYPE", better, 1) == 0) return 1;
    unsetenv("TALLY_BLAS_CORE_DETECTED");
    return 0;
}

/* OpenBLAS also starts its threads when it loads, each mapping a buffer of its own; under an
 * address-space limit (ulimit -v) too low for them it retries the mappings for seconds: `tally flight`
 * under 60 MiB took 10 s, against 0.01 s with one thread. There tally starts itself again with
 * OPENBLAS_NUM_THREADS=1 (unless the user set a thread count), and takes the variable away after the
 * restart, so the ranks of tally run do not inherit it; commands that want more threads ask for them
 * (openblas_set_num_threads), train after checking the room for their buffers. 1 when the environment
 * asks for a restart. */
#define BLAS_CAPPED_MARK "TALLY_BLAS_THREADS_CAPPED"
static int blas_capped; /* this process is the restart: --version says why OpenBLAS has one thread */

static int blas_threads_cap(void) {
    if (getenv(BLAS_CAPPED_MARK)) { /* the restart: OpenBLAS has loaded with one thread */
        unsetenv("OPENBLAS_NUM_THREADS");
        unsetenv(BLAS_CAPPED_MARK);
        blas_capped = 1;
        return 0;
    }
    struct rlimit as;
    if (getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return 0;
    if (getenv("OPENBLAS_NUM_THREADS") || getenv("GOTO_NUM_THREADS") || getenv("OMP_NUM_THREADS")) return 0;
    if (setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return 0;
    if (setenv(BLAS_CAPPED_MARK, "1", 1) == 0) return 1;
    unsetenv("OPENBLAS_NUM_THREADS");
    return 0;
}

/* Both of the above in one restart, where either asks for one; without it, on as loaded. */
static void blas_restart_if_needed(char **argv) {
    int capped = blas_threads_cap(), upgraded = blas_core_upgrade();
    if (!capped && !upgraded) return;
    execv("/proc/self/exe", argv);
    if (upgraded) {
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("TALLY_BLAS_CORE_DETECTED");
    }
    if (capped) {
        unsetenv("OPENBLAS_NUM_THREADS");
        unsetenv(BLAS_CAPPED_MARK);
    }
}

static void print_version(void) {
    printf("tally %d.%d.%d\n", TALLY_VERSION_MAJOR, TALLY_VERSION_MINOR, TALLY_VERSION_PATCH);
    const char *detected = getenv("TALLY_BLAS_CORE_DETECTED"), *core = tally__blas_core_name();
    if (detected && strcmp(detected, core) != 0)
        printf("OpenBLAS kernels: %s (OPENBLAS_CORETYPE set by tally: OpenBLAS detected %s on this CPU)\n", core,
               detected);
    else
        printf("OpenBLAS kernels: %s%s\n", core, getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "");
    printf("OpenBLAS threads at load: %d%s\n", openblas_get_num_threads(),
           blas_capped ? " (one: an address-space limit, ulimit -v, is set; OPENBLAS_NUM_THREADS chooses)" : "");
    if (tally__bf16_check())
        printf("bf16 products (--precision bf16): none here (%s)\n", tally_last_error());
    else
        printf("bf16 products (--precision bf16): %s\n",
               tally__bf16_on_amx() ? "AMX, through oneDNN"
                                    : "AVX512_BF16 without AMX, through oneDNN (slower than f32 on many CPUs)");
}

int main(int argc, char **argv) {
    blas_restart_if_needed(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        print_version();
        return 0;
    }
    const tally_command *c = find_command(cmd);
    if (!c) {
        fprintf(stderr, "tally: unknown %s '%s'\n", cmd[0] == '-' ? "option" : "command", cmd);
        usage(stderr);
        return 2;
    }
    if (!c->fn) {
        fprintf(stderr, "tally %s: not built yet\n", c->name);
        return 2;
    }
    return exit_bounded(c->fn(argc - 1, argv + 1));
}
