/* err.c - the error table's strings, the per-thread detailed message, and the sticky fault record
 * shared by waiters, transports and the monitor thread. */
#include "err.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static _Thread_local char tally__errmsg[1024];

TALLY_API const char *tally_strerror(int err) {
    switch (err) {
    case TALLY_OK: return "success";
#define TALLY__ERR_CASE(name, code, text)                                                                              \
    case TALLY_E_##name: return "TALLY_E_" #name ": " text;
        TALLY_ERRNO_MAP(TALLY__ERR_CASE)
#undef TALLY__ERR_CASE
    default: return "unknown tally error";
    }
}

TALLY_API const char *tally_last_error(void) { return tally__errmsg; }

void tally__clearerr(void) { tally__errmsg[0] = '\0'; }

int tally__vseterr(int code, const char *fmt, va_list ap) {
    vsnprintf(tally__errmsg, sizeof tally__errmsg, fmt, ap);
    return code;
}

int tally__err_wrap(int code, const char *before, const char *after) {
    char msg[sizeof tally__errmsg];
    snprintf(msg, sizeof msg, "%s", tally__errmsg);
    snprintf(tally__errmsg, sizeof tally__errmsg, "%s%s%s", before, msg, after);
    return code;
}

int tally__seterr(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tally__vseterr(code, fmt, ap);
    va_end(ap);
    return code;
}

void tally__fault_init(tally__fault *f) {
    memset(f, 0, sizeof *f);
    f->culprit = -1;
    f->wake_fd = -1;
}

static void tally__fault_wake(tally__fault *f) {
    if (f->wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t rc = write(f->wake_fd, &one, sizeof one);
        (void)rc; /* a full eventfd is already awake */
    }
}

/* Writes the rewrite of "rank N" (not already "world rank N" or "rank N (world rank ..)") into out, or
 * returns 0 to leave it as it is. to_local: N is a world rank, named in the words of the communicator
 * whose world ranks are world[0..n); else N is a rank of it, named with its world rank too. */
static int err_rank_words(char *out, size_t cap, int rank, const int *world, int n, int to_local) {
    if (!to_local) return rank < n ? snprintf(out, cap, "rank %d (world rank %d)", rank, world[rank]) : 0;
    for (int l = 0; l < n; l++)
        if (world[l] == rank) return snprintf(out, cap, "rank %d (world rank %d)", l, rank);
    return snprintf(out, cap, "world rank %d", rank);
}

static void err_rewrite_ranks(char *msg, size_t cap, const int *world, int n, int to_local) {
    char out[1024];
    size_t o = 0;
    const char *m = msg;
    while (*m && o + 40 < sizeof out) {
        int r, used = 0, k = 0, named = m >= msg + 6 && !strncmp(m - 6, "world ", 6);
        if (!named && !strncmp(m, "rank ", 5) && m[5] >= '0' && m[5] <= '9' && sscanf(m + 5, "%d%n", &r, &used) == 1 &&
            strncmp(m + 5 + used, " (world rank", 12) &&
            (k = err_rank_words(out + o, sizeof out - o, r, world, n, to_local)) > 0) {
            o += (size_t)k;
            m += 5 + used;
            continue;
        }
        out[o++] = *m++;
    }
    snprintf(out + o, sizeof out - o, "%s", m); /* what did not fit, as it was */
    size_t len = strnlen(out, cap - 1);
    memcpy(msg, out, len);
    msg[len] = '\0';
}

void tally__err_name_world(char *msg, size_t cap, const int *world, int n) { err_rewrite_ranks(msg, cap, world, n, 0); }

/* The other way round, for a message already in the world's words recorded on a communicator of some of
 * its ranks (a level or the host of a world, through the link): "rank W" becomes "rank L (world rank W)"
 * where W is its rank L, else "world rank W", so that the record reads right in that communicator's
 * words, also to the peers that adopt it from there. */
static void tally__err_world_to_local(char *msg, size_t cap, const int *world, int n) {
    err_rewrite_ranks(msg, cap, world, n, 1);
}

/* Writes the record once; returns 1 if this call was the first. A later call returns only once the first
 * one's code is published (it follows its message at once): a raiser that then checked the fault would
 * otherwise read 0, and take the message it was refusing for a good one. */
static int tally__fault_record_as(tally__fault *f, int code, int culprit, const char *given, int name_world) {
    char msg[sizeof f->msg];
    snprintf(msg, sizeof msg, "%s", given);
    if (f->world && name_world) tally__err_name_world(msg, sizeof msg, f->world, f->world_n);
    if (f->world && !name_world) tally__err_world_to_local(msg, sizeof msg, f->world, f->world_n);
    int expected = 0;
    if (!atomic_compare_exchange_strong(&f->claimed, &expected, 1)) {
        while (!atomic_load_explicit(&f->code, memory_order_acquire)) sched_yield();
        return 0;
    }
    f->culprit = culprit;
    snprintf(f->msg, sizeof f->msg, "%s", msg);
    /* The linked records first: a caller that sees our code may at once tear down what they belong to
     * (an abort of the world aborts its host communicator), whose own fault must not come first there. */
    tally__fault *linked;
    for (int k = 0; k < 2; k++) /* already in the world's words: recorded as it is */
        if ((linked = atomic_load_explicit(&f->linked[k], memory_order_acquire)))
            tally__fault_record_as(linked, code, -1, msg, 0);
    atomic_store_explicit(&f->code, code, memory_order_release);
    tally__fault_wake(f);
    return 1;
}

static int tally__fault_record(tally__fault *f, int code, int culprit, const char *msg) {
    return tally__fault_record_as(f, code, culprit, msg, 1);
}

void tally__fault_link(tally__fault *f, int k, tally__fault *to) {
    atomic_store_explicit(&f->linked[k], to, memory_order_release);
    /* A fault being recorded as we stored may not have seen the link: its message is complete once its
     * code is published (a second record of it in `to` is a no-op). */
    if (!atomic_load_explicit(&f->claimed, memory_order_acquire)) return;
    while (!atomic_load_explicit(&f->code, memory_order_acquire)) sched_yield();
    tally__fault_record_as(to, atomic_load(&f->code), -1, f->msg, 0);
}

int tally__fault_raise(tally__fault *f, int code, int culprit, const char *fmt, ...) {
    char msg[sizeof f->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tally__fault_record(f, code, culprit, msg)) { /* its message as recorded: a split's names world ranks */
        tally__log_warn("%s", f->msg);
        if (f->propagate) f->propagate(f->propagate_arg, code, culprit, f->msg);
    }
    return tally__fault_check(f);
}

void tally__fault_adopt(tally__fault *f, int code, int culprit, const char *msg) {
    if (tally__fault_record(f, code, culprit, msg)) tally__log_warn("%s", f->msg);
}

void tally__fault_adopt_relay(tally__fault *f, int code, int culprit, const char *msg) {
    if (!tally__fault_record(f, code, culprit, msg)) return;
    tally__log_warn("%s", f->msg);
    if (f->propagate) f->propagate(f->propagate_arg, code, culprit, f->msg);
}

int tally__fault_await(tally__fault *f, double grace_s) {
    struct timespec nap = {0, 1000000};
    for (double waited = 0; waited < grace_s; waited += 1e-3) {
        if (atomic_load_explicit(&f->code, memory_order_acquire)) return tally__fault_report(f);
        nanosleep(&nap, NULL);
    }
    return tally__fault_check(f);
}

int tally__fault_report(tally__fault *f) {
    /* The code is published after msg is written, so msg is complete here. */
    int c = atomic_load_explicit(&f->code, memory_order_acquire);
    snprintf(tally__errmsg, sizeof tally__errmsg, "%s", f->msg);
    return c;
}
