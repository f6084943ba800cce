/* tally.c - main() of the tally tool: picks the subcommand (run, bench, train, ...) and hands it
 * its arguments; --help and --version. Each subcommand lives in its own cmd_*.c. */
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <tally.h>

#include "../src/nn/blas_core.h"
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
 * changed. TALLY_BLAS_CORE_DETECTED keeps OpenBLAS's own pick for --version. */
static void blas_core_upgrade(char **argv) {
    const char *better = tally__blas_core_better();
    if (!better) return;
    if (setenv("TALLY_BLAS_CORE_DETECTED", tally__blas_core_name(), 1) != 0) return;
    if (setenv("OPENBLAS_CORETYPE", better, 1) == 0) execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE"); /* no exec: run on with OpenBLAS's own pick */
    unsetenv("TALLY_BLAS_CORE_DETECTED");
}

static void print_version(void) {
    printf("tally %d.%d.%d\n", TALLY_VERSION_MAJOR, TALLY_VERSION_MINOR, TALLY_VERSION_PATCH);
    const char *detected = getenv("TALLY_BLAS_CORE_DETECTED"), *core = tally__blas_core_name();
    if (detected && strcmp(detected, core) != 0)
        printf("OpenBLAS kernels: %s (OPENBLAS_CORETYPE set by tally: OpenBLAS detected %s on this CPU)\n", core,
               detected);
    else
        printf("OpenBLAS kernels: %s%s\n", core, getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "");
}

int main(int argc, char **argv) {
    blas_core_upgrade(argv);
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
