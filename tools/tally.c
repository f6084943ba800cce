/* tally.c - main() of the tally tool: picks the subcommand (run, bench, train, ...) and hands it
 * its arguments; --help and --version. Each subcommand lives in its own cmd_*.c. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <tally.h>

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

int main(int argc, char **argv) {
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
        printf("tally %d.%d.%d\n", TALLY_VERSION_MAJOR, TALLY_VERSION_MINOR, TALLY_VERSION_PATCH);
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
