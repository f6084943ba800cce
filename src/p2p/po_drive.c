/* po_drive.c - a thread waiting for a receive reads the peers' messages itself, beside the post office's
 * thread: the message's arrival then wakes the waiter alone, one thread switch where the hand-over took two. */
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "../core/clock.h"
#include "po_int.h"

/* The driver looks round this often even when nothing wakes it (a bound; every change pokes it). */
#define PO_DRIVE_SLICE_MS 100

/* drive_fd, then the connections that are ready: a handshake is the thread's. */
static size_t drive_fill(tally__po *po) {
    size_t n = 0;
    po->dpfd[n] = (struct pollfd){.fd = po->drive_fd, .events = POLLIN};
    po->din[n++] = NULL;
    for (tally__po_in *in = po->ins; in && n < (size_t)po->size + 1; in = in->next) {
        if (in->state != PO_IN_READY) continue;
        po->dpfd[n] = (struct pollfd){.fd = in->fd, .events = POLLIN};
        po->din[n++] = in;
    }
    return n;
}

/* What the poll found, read under mu; a connection freed since the fill (epoch moved) waits a turn. */
static void drive_dispatch(tally__po *po, size_t n, uint64_t epoch) {
    for (size_t i = 0; i < n && po->epoch == epoch; i++) {
        if (!po->dpfd[i].revents) continue;
        if (!po->din[i]) {
            uint64_t v;
            ssize_t k = read(po->drive_fd, &v, sizeof v);
            (void)k; /* a poke read by nobody costs one turn */
            continue;
        }
        tally__po_in_event(po, po->din[i], po->dpfd[i].revents);
    }
}

/* Looks without sleeping for spin_ns (or until another thread ends the request), then sleeps in poll.
 * It yields between looks whether or not the host is crowded: a socket's reader is woken on its writer's
 * CPU (the kernel expects the writer to sleep next), so a ping-pong's two waiters can end up sharing one
 * CPU, and a waiter that only spun held the peer that would answer off it for the whole spin: one start in
 * ten ran 1 KiB messages at 60-70 us one way instead of 7-10. */
static int drive_poll(tally__po *po, size_t n, _Atomic int *done) {
    uint64_t until = po->spin_ns ? tally__now_ns() + po->spin_ns : 0;
    for (;;) {
        int k = poll(po->dpfd, (nfds_t)n, 0);
        if (k != 0 || atomic_load_explicit(done, memory_order_acquire)) return k;
        if (!until || tally__now_ns() >= until) break;
        sched_yield();
    }
    return poll(po->dpfd, (nfds_t)n, PO_DRIVE_SLICE_MS);
}

int tally__po_drive(tally__po *po, _Atomic int *done) {
    pthread_mutex_lock(&po->mu);
    if (atomic_load(&po->driving) || !po->started || po->shut || po->stopping) {
        pthread_mutex_unlock(&po->mu);
        return 0;
    }
    atomic_store_explicit(&po->driving, 1, memory_order_release);
    tally__po_driver_here = 1;
    tally__po_op *list = NULL;
    while (!po->shut) {
        size_t n = drive_fill(po);
        uint64_t epoch = po->epoch;
        list = tally__po_take_done(po);
        pthread_mutex_unlock(&po->mu);
        tally__po_run_done(po, list);
        if (atomic_load_explicit(done, memory_order_acquire)) {
            pthread_mutex_lock(&po->mu);
            break;
        }
        int k = drive_poll(po, n, done);
        pthread_mutex_lock(&po->mu);
        if (k > 0) drive_dispatch(po, n, epoch);
    }
    atomic_store(&po->driving, 0); /* the thread polls the connections again within PO_MASKED_NS */
    tally__po_driver_here = 0;
    pthread_cond_broadcast(&po->drove);
    list = tally__po_take_done(po);
    pthread_mutex_unlock(&po->mu);
    tally__po_run_done(po, list);
    return 1;
}
