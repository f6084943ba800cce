/* flags.h - what every subcommand shares to read its flags: getopt_long with the tool's own messages
 * (unknown flag, missing value), the name of the flag just read, and the one way a bad value is told. */
#ifndef TALLY_TOOLS_FLAGS_H
#define TALLY_TOOLS_FLAGS_H

#include <getopt.h>

typedef struct tally_flags {
    const char *cmd;     /* "train": messages read "tally train: ..." */
    const char *shorts;  /* getopt's short options, without the leading ':' */
    const struct option *longs;
    const char *flag;    /* the flag just read, "--epochs" or "-n", for messages */
    char name[64];
} tally_flags;

/* Starts reading argv from `first`. */
void tally_flags_begin(tally_flags *f, const char *cmd, const char *shorts, const struct option *longs, int first);
/* The next option (its short letter or long `val`), -1 after the last; on an unknown flag or a missing
 * value prints why and returns '?'. `f->flag` names the option returned. */
int tally_flags_next(tally_flags *f, int argc, char **argv);
/* Prints "tally CMD: <tally_last_error()>" and where the flags are described; returns 2, the exit
 * status of a bad flag. */
int tally_flags_bad(const tally_flags *f);
/* Prints "tally CMD: <text>" and the same pointer; returns 2. */
int tally_flags_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
