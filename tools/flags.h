/* flags.h - what every subcommand shares to read its flags: getopt_long with the tool's own messages
 * (unknown flag, missing value), the name of the flag just read, and the one way a bad value is told. */
#ifndef TALLY_TOOLS_FLAGS_H
#define TALLY_TOOLS_FLAGS_H

#include <getopt.h>
#include <stdio.h>

typedef struct tally_flags {
    const char *cmd;    /* "train": messages read "tally train: ..." */
    const char *shorts; /* getopt's short options, without the leading ':'; 'h' is --help */
    const struct option *longs;
    int first; /* argv index of the first flag (2 after bench's collective) */
    /* One flag's value into the command's options (ch: its short letter or long `val`; flag: its name,
     * "--epochs" or "-n", for messages): 0, or nonzero with tally_last_error() saying why. */
    int (*one)(int ch, const char *flag, const char *value, void *ctx);
    void (*usage)(FILE *out); /* the --help text */
} tally_flags;

/* Reads every flag of argv with f->one, then refuses a leftover argument. Returns 0 to go on, 1 when
 * --help was printed (exit 0), 2 after a message naming what was wrong (exit 2): an unknown flag, a
 * missing value, a value to a flag that takes none, or the value f->one refused. */
int tally_flags_parse(const tally_flags *f, int argc, char **argv, void *ctx);
/* Prints "tally CMD: <text>" and where the flags are described; returns 2, the exit status of a bad flag. */
int tally_flags_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
