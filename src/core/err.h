/* err.h - error codes, the per-thread detailed error message, and the communicator's fault record.
 * A fault is sticky: once raised (by a waiter, a transport or the monitor thread) every wait returns it. */
#ifndef TALLY_CORE_ERR_H
#define TALLY_CORE_ERR_H

#include <stdarg.h>
#include <stdatomic.h>
#include <tally.h>

/* Sets this thread's detailed message (the text of tally_last_error()) and returns `code`.
 * The message should say what went wrong, on which rank, and what to do. */
int tally__seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tally__vseterr(int code, const char *fmt, va_list ap);
/* Puts `before` and `after` around this thread's message (a rank, a hint); returns `code`. */
int tally__err_wrap(int code, const char *before, const char *after);
/* Clears this thread's message (called at the start of each public call). */
void tally__clearerr(void);

/* The first fault wins; later ones are ignored. Waiters poll `code` (one relaxed load). */
typedef struct tally__fault {
    _Atomic int code;    /* 0 while healthy, else a TALLY_E_* code */
    int culprit;         /* rank blamed, -1 if none */
    char msg[768];       /* full message, written before `code` is published */
    _Atomic int claimed; /* guards msg while the first raiser writes it */
    /* Called once by the first raiser (not by adopters) so the fault reaches the other ranks;
     * set by the boot layer after rendezvous. */
    void (*propagate)(void *arg, int code, int culprit, const char *msg);
    void *propagate_arg;
    int wake_fd;      /* eventfd written when a fault is raised (-1 if none): wakes poll() */
    const int *world; /* a split communicator's world rank of each of its world_n ranks: messages name both */
    int world_n;
    /* The faults of communicators a collective of this one runs on (the hierarchy's levels): a fault
     * here is recorded there too, so their waits end with it. */
    struct tally__fault *_Atomic linked[2]; /* set while the monitor may already record faults */
} tally__fault;

/* Rewrites msg (of capacity cap) so each "rank N" with N < n reads "rank N (world rank world[N])"; a
 * mention already so named is left as it is. */
void tally__err_name_world(char *msg, size_t cap, const int *world, int n);

void tally__fault_init(tally__fault *f);
/* Links `to` into f's slot k (see linked): f's faults are recorded there from now on, and one f already
 * had is recorded there at once. */
void tally__fault_link(tally__fault *f, int k, tally__fault *to);
/* Raises a fault seen on this rank: records it, propagates it to every rank, wakes pollers, and sets
 * this thread's message. Returns the fault's code (the first one raised if one already was). */
int tally__fault_raise(tally__fault *f, int code, int culprit, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Records a fault reported by another rank (no propagation). */
void tally__fault_adopt(tally__fault *f, int code, int culprit, const char *msg);
/* Records a fault another rank reported on a path that reaches only some ranks (a transport's own
 * connection) and, if it is the first here, passes it on as a raised one is: the ranks that path does
 * not reach learn it through the monitor's relay. */
void tally__fault_adopt_relay(tally__fault *f, int code, int culprit, const char *msg);
/* A peer that left may have left because of a fault it already reported (a mismatch, a timeout): waits
 * up to grace_s for that report to arrive, so every rank names the cause rather than its consequence.
 * Returns the fault's code, or 0 if none came. */
int tally__fault_await(tally__fault *f, double grace_s);
/* Grace used by transports before reporting a vanished peer. A rank that left because of another
 * rank's death has reported it through rank 0's relay; with 4 ranks on 2 busy cores that relay was
 * once seen to take more than 0.5 s, and the survivor then blamed the messenger. */
#define TALLY__LOST_GRACE_S 1.0
/* Copies the fault into this thread's message and returns its code (the slow half of fault_check). */
int tally__fault_report(tally__fault *f);
/* 0 if healthy; else copies the fault into this thread's message and returns its code. */
static inline int tally__fault_check(tally__fault *f) {
    int c = atomic_load_explicit(&f->code, memory_order_acquire);
    if (c == 0) return 0;
    return tally__fault_report(f);
}

#endif
