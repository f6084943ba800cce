/* cmd_run.c - `tally run -n N [--transport T] [--timeout S] [--no-prefix] [--] PROG ARGS...`:
 * parses the flags and hands the program to the launcher (launch.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>

#include "../src/core/env.h"
#include "../src/core/parse.h"
#include "cmd.h"
#include "launch.h"
#include "place.h"

static const char run_usage[] =
    "usage: tally run -n N [--transport shm|tcp|auto] [--timeout S] [--max-restarts R] [--bind core|none]\n"
    "                 [--no-prefix] [--] PROG [ARGS...]\n"
    "\n"
    "Starts N ranks of PROG on this machine and waits for them. Each rank gets TALLY_RANK,\n"
    "TALLY_WORLD_SIZE, TALLY_ADDR, TALLY_TOKEN, LOCAL_RANK and LOCAL_WORLD_SIZE, and torchrun's RANK,\n"
    "WORLD_SIZE, MASTER_ADDR and MASTER_PORT (so PyTorch's init_process_group runs unchanged); its\n"
    "output lines are prefixed with \"[rank] \". When one rank fails the others are stopped.\n"
    "\n"
    "  -n, --nproc N        number of ranks (1..4096)\n"
    "  --transport T        sets TALLY_TRANSPORT for the ranks: shm, tcp or auto\n"
    "  --timeout S          sets TALLY_TIMEOUT: seconds a collective waits for a peer\n"
    "  --bind core|none     core (the default, or TALLY_CPU_BIND): rank r runs on its own CPU of the\n"
    "                       set tally was given (one per physical core first) when the ranks fit,\n"
    "                       unpinned when they do not; none: affinity left as inherited\n"
    "  --max-restarts R     when a rank fails, stop the others and start all ranks again, up to R\n"
    "                       times (TALLY_RESTART tells the ranks which start this is)\n"
    "  --no-prefix          let the ranks write to the terminal directly, unprefixed\n"
    "  -h, --help           this text\n"
    "\n"
    "Exit status: 0 when every rank exits 0, else the first failing rank's status (128+signal\n"
    "when it was killed), 127 when PROG cannot be executed, 2 for bad flags.\n";

/* The usage line only; the whole text is one --help away. */
static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "tally run: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%.*s", (int)(strchr(run_usage, '\n') - run_usage + 1), run_usage);
    fprintf(stderr, "Try 'tally run --help' for more.\n");
    return 2;
}

/* "--flag value" or "--flag=value" (and "-nVALUE" for -n); NULL when this argument is another flag.
 * *i moves past a separate value. */
static const char *flag_value(int argc, char **argv, int *i, const char *shortf, const char *longf, int *missing) {
    const char *a = argv[*i];
    size_t ll = strlen(longf);
    const char *v = NULL;
    if (strcmp(a, longf) == 0 || (shortf && strcmp(a, shortf) == 0)) {
        if (*i + 1 >= argc) {
            *missing = 1;
            return NULL;
        }
        v = argv[++*i];
    } else if (strncmp(a, longf, ll) == 0 && a[ll] == '=') {
        v = a + ll + 1;
    } else if (shortf && strncmp(a, shortf, 2) == 0 && a[2] != '\0') {
        v = a + 2;
    }
    return v;
}

/* A value the shared parser refused: its message, then the usage line. */
static int bad_value(void) { return usage_error("%s", tally_last_error()); }

/* One flag at argv[*i]; returns 0, 1 for --help, or 2 after printing a usage error. */
static int parse_flag(int argc, char **argv, int *i, tally_launch_opts *o, int *have_n) {
    const char *a = argv[*i], *v;
    int missing = 0;
    long long k;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
    if (!strncmp(a, "--help=", 7) || !strncmp(a, "--no-prefix=", 12))
        return usage_error("%s takes no value", a[2] == 'h' ? "--help" : "--no-prefix");
    if (strcmp(a, "--no-prefix") == 0) {
        o->prefix_output = 0;
        return 0;
    }
    if ((v = flag_value(argc, argv, i, "-n", "--nproc", &missing))) {
        if (tally__parse_int(a[1] == '-' ? "--nproc" : "-n", v, 1, TALLY_LAUNCH_MAX_RANKS, &k)) return bad_value();
        o->n = (int)k;
        *have_n = 1;
        return 0;
    }
    if (!missing && (v = flag_value(argc, argv, i, NULL, "--transport", &missing))) {
        static const char *const transports[] = {"shm", "tcp", "auto", NULL};
        int w;
        if (tally__parse_word("--transport", v, transports, &w)) return bad_value();
        o->transport = v;
        return 0;
    }
    if (!missing && (v = flag_value(argc, argv, i, NULL, "--timeout", &missing))) {
        if (tally__parse_real("--timeout", v, 0, 1, TALLY__TIMEOUT_MAX_S, &o->timeout_s)) return bad_value();
        return 0;
    }
    if (!missing && (v = flag_value(argc, argv, i, NULL, "--bind", &missing))) {
        int core;
        if (tally_place_parse("--bind", v, &core)) return bad_value();
        o->bind = v;
        return 0;
    }
    if (!missing && (v = flag_value(argc, argv, i, NULL, "--max-restarts", &missing))) {
        if (tally__parse_int("--max-restarts", v, 0, 1000, &k)) return bad_value();
        o->max_restarts = (int)k;
        return 0;
    }
    if (missing) return usage_error("%s needs a value", a);
    return usage_error("unknown flag '%s'", a);
}

int tally_cmd_run(int argc, char **argv) {
    tally_launch_opts o = {.n = 1, .prefix_output = 1, .name = "tally run"};
    int have_n = 0, i = 1;
    /* Flags end at "--" or at the first word that is not a flag: `tally run -n 2 hostname` works. */
    for (; i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        int rc = parse_flag(argc, argv, &i, &o, &have_n);
        if (rc == 1) {
            fputs(run_usage, stdout);
            return 0;
        }
        if (rc) return rc;
    }
    if (!have_n) return usage_error("%s", "-n N is required");
    if (i >= argc) return usage_error("%s", "no program given");
    return tally_launch(&o, argv + i);
}
