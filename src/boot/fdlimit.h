/* fdlimit.h - file descriptors under RLIMIT_NOFILE: room for what a step will hold open (raising the soft
 * limit toward the hard one, once, when short), and the words that name the limit when that cannot be. */
#ifndef TALLY_BOOT_FDLIMIT_H
#define TALLY_BOOT_FDLIMIT_H

#include <stddef.h>

typedef struct tally__fd_limit {
    unsigned long long soft, hard;  /* RLIMIT_NOFILE now; TALLY__FD_UNLIMITED for RLIM_INFINITY */
    long open;                      /* descriptors open now (numbers below soft) */
    long want;                      /* open + what the caller asked room for */
    unsigned long long raised_from; /* 0, or the soft limit before tally__fd_room raised it */
} tally__fd_limit;

#define TALLY__FD_UNLIMITED (~0ull)

/* Makes room for `more` descriptors on top of those open now. 0 when the soft limit has it, having
 * raised it if it had to (to what is wanted plus the headroom the program had, at most the hard
 * limit; lim->raised_from says from what). -1 when the hard limit is too low: nothing changed. */
int tally__fd_room(long more, tally__fd_limit *lim);

/* 1 when the soft limit already has room for `more` descriptors on top of those open now, raising
 * nothing: for what a rank can do without (0 when the limit cannot be read). */
int tally__fd_spare(long more);

/* The limit and the way out, for messages: "RLIMIT_NOFILE is 64 (hard 64): raise it with `ulimit -n
 * 1024` ..." (with how to raise the hard limit when it is below lim->want). */
void tally__fd_advice(const tally__fd_limit *lim, char *buf, size_t n);

/* 1 for errno values that mean a full descriptor table: EMFILE (this process) or ENFILE (the system). */
int tally__fd_exhausted(int err);

/* Such an errno in words, with the limit that was hit and how to raise it. */
void tally__fd_explain(int err, char *buf, size_t n);

#endif
