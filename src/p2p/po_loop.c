/* po_loop.c - the post office's thread: one poll() over its wake-up, the communicator's fault, the listener
 * and every connection; the deadlines kept; the requests' callbacks run with no lock held. */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../boot/net.h"
#include "../core/clock.h"
#include "../core/trace.h"
#include "po_int.h"

enum { PO_SLOT_WAKE, PO_SLOT_FAULT, PO_SLOT_LISTEN, PO_SLOT_IN, PO_SLOT_OUT };

/* The thread looks round this often even when nothing happens (every event wakes it anyway). */
#define PO_IDLE_NS 1000000000ull
/* While a driver reads the ready connections the thread polls without them, and looks round this often:
 * the driver leaves without waking it, and what arrives after is read within this. */
#define PO_MASKED_NS 1000000ull

static int po_add(tally__po *po, size_t *n, int fd, short events, tally__po_slot slot) {
    if (*n == po->pfd_cap) {
        size_t cap = po->pfd_cap ? 2 * po->pfd_cap : 16;
        struct pollfd *p = realloc(po->pfd, cap * sizeof *p);
        if (p) po->pfd = p;
        tally__po_slot *s = p ? realloc(po->slot, cap * sizeof *s) : NULL;
        if (!s) return -1;
        po->slot = s;
        po->pfd_cap = cap;
    }
    po->pfd[*n] = (struct pollfd){.fd = fd, .events = events};
    po->slot[(*n)++] = slot;
    return 0;
}

/* The poll set, from what each connection waits for now. Out of memory, the connections wait a turn. */
static size_t po_fill(tally__po *po, uint64_t now) {
    size_t n = 0;
    po_add(po, &n, po->wake_fd, POLLIN, (tally__po_slot){.kind = PO_SLOT_WAKE});
    if (!po->fault_seen && po->fault->wake_fd >= 0)
        po_add(po, &n, po->fault->wake_fd, POLLIN, (tally__po_slot){.kind = PO_SLOT_FAULT});
    if (po->lfd >= 0 && now >= po->accept_pause_until)
        po_add(po, &n, po->lfd, POLLIN, (tally__po_slot){.kind = PO_SLOT_LISTEN});
    int driving = atomic_load(&po->driving);
    atomic_store(&po->ins_masked, driving);
    for (tally__po_in *in = po->ins; in; in = in->next) {
        short ev = tally__po_in_events(in);
        tally__po_slot s = {.kind = PO_SLOT_IN, .in = in, .driven = in->state == PO_IN_READY && ev == POLLIN};
        if (po_add(po, &n, s.driven && driving ? -1 : in->fd, ev, s)) break; /* -1: poll skips it */
    }
    for (int r = 0; r < po->size; r++) {
        short ev = tally__po_out_events(&po->out[r]);
        if (po->out[r].fd >= 0 && ev &&
            po_add(po, &n, po->out[r].fd, ev, (tally__po_slot){.kind = PO_SLOT_OUT, .peer = r}))
            break;
    }
    return n;
}

/* The communicator failed (a dead peer, a failed collective, an abort): every request fails with it. */
static void po_check_fault(tally__po *po) {
    int code = atomic_load_explicit(&po->fault->code, memory_order_acquire);
    if (po->fault_seen || !code) return;
    po->fault_seen = 1;
    if (!po->closed) {
        po->closed = code;
        snprintf(po->closed_why, sizeof po->closed_why, "%s", po->fault->msg);
    }
    char why[900];
    snprintf(why, sizeof why, "the communicator failed: %s", po->fault->msg);
    tally__po_fail_recvs(po, code, why);
    tally__po_fail_sends(po, code, why);
}

/* epoch: the post office's when the set was filled; a connection freed since (by a driver, or by an
 * earlier entry's event) may be another's memory now, so the connections wait for the next turn. */
static void po_dispatch(tally__po *po, size_t n, uint64_t epoch) {
    for (size_t i = 0; i < n; i++) {
        short re = po->pfd[i].revents;
        tally__po_slot s = po->slot[i];
        if (!re) continue;
        if (s.kind == PO_SLOT_WAKE) {
            uint64_t v;
            ssize_t k = read(po->wake_fd, &v, sizeof v);
            (void)k; /* a spurious wake costs one turn */
        } else if (s.kind == PO_SLOT_LISTEN) {
            tally__po_accept(po);
        } else if (s.kind == PO_SLOT_IN && po->epoch == epoch) {
            tally__po_in_event(po, s.in, re); /* only its own event closes a connection */
        } else if (s.kind == PO_SLOT_OUT && po->out[s.peer].fd == po->pfd[i].fd) {
            tally__po_out_event(po, s.peer, re);
        }
    }
}

/* Only connections a driver reads fired: the thread leaves them to it, unlocked, so the driver's reads
 * never wait on the thread's turn. 1 when it did (their entries now out of the set, ins_masked said). */
static int po_leave_to_driver(tally__po *po, size_t n) {
    if (!atomic_load(&po->driving)) return 0;
    for (size_t i = 0; i < n; i++)
        if (po->pfd[i].revents && !(po->slot[i].kind == PO_SLOT_IN && po->slot[i].driven)) return 0;
    for (size_t i = 0; i < n; i++)
        if (po->slot[i].kind == PO_SLOT_IN && po->slot[i].driven) po->pfd[i].fd = -1; /* poll skips it */
    atomic_store(&po->ins_masked, 1);
    return 1;
}

/* Polls until something but the driver's connections fires, or the deadline; while they are left to a
 * driver, for PO_MASKED_NS at most. */
static int po_poll(tally__po *po, size_t n, uint64_t next) {
    for (;;) {
        uint64_t until = next;
        if (atomic_load(&po->ins_masked)) {
            uint64_t soon = tally__now_ns() + PO_MASKED_NS;
            if (soon < until) until = soon;
        }
        int k = poll(po->pfd, (nfds_t)n, tally__net_poll_ms(until));
        if (k <= 0 || !po_leave_to_driver(po, n)) return k;
    }
}

void *tally__po_main(void *arg) {
    tally__po *po = arg;
    tally__trace_thread("p2p thread");
    pthread_mutex_lock(&po->mu);
    for (;;) {
        po_check_fault(po);
        if (po->stopping || (po->draining && !tally__po_sends_pending(po))) break;
        uint64_t now = tally__now_ns(), next = now + PO_IDLE_NS;
        tally__po_expire(po, now, &next);
        tally__po_out_expire(po, now, &next);
        tally__po_in_expire(po, now, &next);
        int rc;
        tally__po_in *failed;
        while ((failed = tally__po_cma_due(po, now, &next, &rc))) tally__po_in_ended(po, failed, rc, errno);
        if (po->accept_pause_until > now && po->accept_pause_until < next) next = po->accept_pause_until;
        tally__po_out_reap(po);
        size_t n = po_fill(po, now);
        uint64_t epoch = po->epoch;
        po->poll_until = next;
        tally__po_op *done = tally__po_take_done(po);
        pthread_mutex_unlock(&po->mu);
        tally__po_run_done(po, done);
        int k = po_poll(po, n, next);
        pthread_mutex_lock(&po->mu);
        if (k > 0) po_dispatch(po, n, epoch);
    }
    tally__po_op *done = tally__po_take_done(po);
    pthread_mutex_unlock(&po->mu);
    tally__po_run_done(po, done);
    return NULL;
}
