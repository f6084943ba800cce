/* flags.c - getopt_long for every subcommand, with messages that name the flag and point to --help
 * instead of a page of usage; the values themselves go through src/core/parse.c. */
#include "flags.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <tally.h>

static void point_to_help(const char *cmd) { fprintf(stderr, "Try 'tally %s --help' for its flags.\n", cmd); }

/* Where getopt is: the flag just read, for messages. */
typedef struct flags_at {
    const tally_flags *f;
    char name[64];
} flags_at;

static const char *flag_name_of(flags_at *at, int val, int longindex) {
    const struct option *longs = at->f->longs;
    if (longindex >= 0) {
        snprintf(at->name, sizeof at->name, "--%s", longs[longindex].name);
        return at->name;
    }
    for (int i = 0; longs[i].name; i++)
        if (longs[i].val == val && (val > 255 || !strchr(at->f->shorts, val))) {
            snprintf(at->name, sizeof at->name, "--%s", longs[i].name);
            return at->name;
        }
    snprintf(at->name, sizeof at->name, "-%c", val > 0 && val < 256 ? val : '?');
    return at->name;
}

/* The next option, -1 after the last, or '?' after printing why it is not one. */
static int flags_next(flags_at *at, int argc, char **argv, const char **flag) {
    char shorts[64];
    snprintf(shorts, sizeof shorts, ":%s", at->f->shorts); /* ':' first: a missing value returns ':' */
    int idx = -1, ch = getopt_long(argc, argv, shorts, at->f->longs, &idx);
    const char *cmd = at->f->cmd;
    if (ch == -1) return -1;
    if (ch == ':') {
        tally_flags_usage_error(cmd, "%s needs a value", flag_name_of(at, optopt, -1));
        return '?';
    }
    if (ch == '?') {
        const char *arg = argv[optind - 1];
        if (optopt && !strncmp(arg, "--", 2)) /* a long flag that takes no value, given one */
            tally_flags_usage_error(cmd, "%s takes no value (in '%s')", flag_name_of(at, optopt, -1), arg);
        else if (optopt)
            tally_flags_usage_error(cmd, "unknown flag '-%c'", optopt);
        else
            tally_flags_usage_error(cmd, "unknown flag '%s'", arg);
        return '?';
    }
    *flag = flag_name_of(at, ch, idx);
    return ch;
}

int tally_flags_parse(const tally_flags *f, int argc, char **argv, void *ctx) {
    flags_at at = {.f = f};
    const char *flag = "";
    int ch;
    optind = f->first;
    opterr = 0;
    while ((ch = flags_next(&at, argc, argv, &flag)) != -1) {
        if (ch == '?') return 2;
        if (ch == 'h') return f->usage(stdout), 1;
        if (f->one(ch, flag, optarg, ctx)) {
            fprintf(stderr, "tally %s: %s\n", f->cmd, tally_last_error());
            point_to_help(f->cmd);
            return 2;
        }
    }
    if (optind != argc) return tally_flags_usage_error(f->cmd, "unexpected argument '%s'", argv[optind]);
    return 0;
}

int tally_flags_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tally %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    point_to_help(cmd);
    return 2;
}
