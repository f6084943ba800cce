/* flags.c - getopt_long for every subcommand, with messages that name the flag and point to --help
 * instead of a page of usage; the values themselves go through src/core/parse.c. */
#include "flags.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <tally.h>

void tally_flags_begin(tally_flags *f, const char *cmd, const char *shorts, const struct option *longs, int first) {
    *f = (tally_flags){.cmd = cmd, .shorts = shorts, .longs = longs, .flag = ""};
    optind = first;
    opterr = 0;
}

static const char *flag_name_of(tally_flags *f, int val, int longindex) {
    if (longindex >= 0) {
        snprintf(f->name, sizeof f->name, "--%s", f->longs[longindex].name);
        return f->name;
    }
    for (int i = 0; f->longs[i].name; i++)
        if (f->longs[i].val == val && (val > 255 || !strchr(f->shorts, val))) {
            snprintf(f->name, sizeof f->name, "--%s", f->longs[i].name);
            return f->name;
        }
    snprintf(f->name, sizeof f->name, "-%c", val > 0 && val < 256 ? val : '?');
    return f->name;
}

int tally_flags_next(tally_flags *f, int argc, char **argv) {
    char shorts[64];
    snprintf(shorts, sizeof shorts, ":%s", f->shorts); /* ':' first: a missing value returns ':' */
    int idx = -1, ch = getopt_long(argc, argv, shorts, f->longs, &idx);
    if (ch == -1) return -1;
    if (ch == ':') {
        tally_flags_usage_error(f->cmd, "%s needs a value", flag_name_of(f, optopt, -1));
        return '?';
    }
    if (ch == '?') {
        const char *arg = argv[optind - 1];
        if (optopt && !strncmp(arg, "--", 2)) /* a long flag that takes no value, given one */
            tally_flags_usage_error(f->cmd, "%s takes no value (in '%s')", flag_name_of(f, optopt, -1), arg);
        else if (optopt) tally_flags_usage_error(f->cmd, "unknown flag '-%c'", optopt);
        else tally_flags_usage_error(f->cmd, "unknown flag '%s'", arg);
        return '?';
    }
    f->flag = flag_name_of(f, ch, idx);
    return ch;
}

static void point_to_help(const char *cmd) { fprintf(stderr, "Try 'tally %s --help' for its flags.\n", cmd); }

int tally_flags_bad(const tally_flags *f) {
    fprintf(stderr, "tally %s: %s\n", f->cmd, tally_last_error());
    point_to_help(f->cmd);
    return 2;
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
