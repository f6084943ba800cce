/* po.c - a communicator's post office: its listener and the ports every rank publishes at creation, the
 * thread started with it, the posts, and the end (drained by free, cut by abort). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../boot/fdlimit.h"
#include "../boot/net.h"
#include "../core/clock.h"
#include "po_int.h"

/* How long a driver looks at its connections without sleeping: a peer's reply within this wakes nobody
 * (a sleeping waiter's wake-up costs about 8 us of the 14 us a message takes over loopback on the 2-core
 * EPYC VM; polling, 6 us). Where the host has more ranks than CPUs the driver yields between looks: the
 * peer may need its CPU. */
#define PO_SPIN_NS 50000u

int tally__po_port(const tally__po *po) { return po ? po->port : -1; }

static uint64_t po_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Every rank listens and tells its port (a rank that cannot tells -1, so every rank fails alike). */
static int po_publish(tally__po *po) {
    const tally__peer *me = &tally__boot_peers(po->boot)[po->rank];
    char why[512] = "";
    int32_t port = -1, *all = malloc((size_t)po->size * sizeof *all);
    if (!all) return tally__seterr(TALLY_E_NOMEM, "rank %d: point-to-point: out of memory", po->rank);
    if (tally__net_listen(me->ip, 0, po->size + 16, &po->lfd) == 0) port = tally__net_local_port(po->lfd);
    if (port < 0) snprintf(why, sizeof why, "%s", tally_last_error());
    int rc = tally__boot_allgather(po->boot, &port, all, sizeof port);
    for (int r = 0; !rc && r < po->size; r++) {
        if (all[r] >= 0) continue;
        rc = r == po->rank ? tally__seterr(TALLY_E_SYSTEM, "rank %d: cannot listen for point-to-point connections: %s",
                                           po->rank, why)
                           : tally__seterr(TALLY_E_SYSTEM,
                                           "rank %d: rank %d could not listen for point-to-point connections (its "
                                           "message says why)",
                                           po->rank, r);
    }
    po->ports = all;
    po->port = port;
    return rc;
}

int tally__po_open(const tally__po_cfg *cfg, tally__po **out) {
    *out = NULL;
    tally__po *po = calloc(1, sizeof *po);
    if (!po) return tally__seterr(TALLY_E_NOMEM, "rank %d: point-to-point: out of memory", cfg->rank);
    po->rank = cfg->rank;
    po->size = cfg->size;
    po->boot = cfg->boot;
    po->fault = cfg->fault;
    po->timeout_s = cfg->timeout_s;
    po->cma_wanted = cfg->cma;
    po->spin_ns = PO_SPIN_NS;
    po->lfd = po->wake_fd = po->drive_fd = -1;
    po->pidns = po_pidns();
    po->probe = tally__now_ns() ^ ((uint64_t)getpid() << 32);
    pthread_mutex_init(&po->mu, NULL);
    pthread_cond_init(&po->drove, NULL);
    tally__po_copier_init(&po->copier);
    po->in_of = calloc((size_t)po->size, sizeof *po->in_of);
    po->lost = calloc((size_t)po->size, sizeof *po->lost);
    po->lost_why = calloc((size_t)po->size, sizeof *po->lost_why);
    po->out = calloc((size_t)po->size, sizeof *po->out);
    po->dpfd = calloc((size_t)po->size + 1, sizeof *po->dpfd);
    po->din = calloc((size_t)po->size + 1, sizeof *po->din);
    if (!po->in_of || !po->lost || !po->lost_why || !po->out || !po->dpfd || !po->din) {
        tally__po_free(po);
        return tally__seterr(TALLY_E_NOMEM, "rank %d: point-to-point: out of memory for %d ranks", cfg->rank,
                             cfg->size);
    }
    for (int r = 0; r < po->size; r++) po->out[r].fd = po->out[r].dead_fd = -1;
    int rc = po->size > 1 ? po_publish(po) : 0;
    if (rc) {
        tally__po_free(po);
        return rc;
    }
    *out = po;
    return 0;
}

/* The thread (mu held). */
static int po_start(tally__po *po) {
    if (po->started) return 0;
    po->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    po->drive_fd = po->wake_fd < 0 ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (po->drive_fd < 0) {
        char why[256];
        tally__fd_explain(errno, why, sizeof why);
        if (po->wake_fd >= 0) close(po->wake_fd);
        po->wake_fd = -1;
        return tally__seterr(TALLY_E_SYSTEM, "rank %d: point-to-point: cannot create an eventfd: %s", po->rank, why);
    }
    int err = pthread_create(&po->th, NULL, tally__po_main, po);
    if (err) {
        close(po->wake_fd);
        close(po->drive_fd);
        po->wake_fd = po->drive_fd = -1;
        return tally__seterr(TALLY_E_SYSTEM, "rank %d: point-to-point: cannot start its thread: %s", po->rank,
                             strerror(err));
    }
    po->started = 1;
    return 0;
}

int tally__po_start(tally__po *po) {
    pthread_mutex_lock(&po->mu);
    int rc = po_start(po);
    pthread_mutex_unlock(&po->mu);
    return rc;
}

/* A receive posted; one that took an in-place message still at its sender reads it here, on its own
 * thread, and the thread sends the ack. */
static void po_recv_now(tally__po *po, tally__po_op *op) {
    tally__po_msg *m = tally__po_post_recv(po, op);
    if (!m) return;
    /* A failed read fails the receive itself; an ack with no memory to queue it leaves its sender to
     * its timeout. The ack goes from here when the socket takes it (the sender waits for it); a failure
     * of the connection is left to the thread, which closes what it polls. */
    tally__po_in *in = m->from;
    tally__po_cma_read(po, in, m, 0);
    if (tally__po_cma_flush(po, in) || in->n_acks) tally__po_wake(po);
}

static int po_post(tally__po *po, tally__po_op *op) {
    pthread_mutex_lock(&po->mu);
    int rc = po->closed ? tally__seterr(po->closed, "%s", po->closed_why) : tally__fault_check(po->fault);
    if (!rc) rc = po_start(po);
    if (!rc) {
        op->deadline = tally__deadline(po->timeout_s);
        if (op->is_recv)
            po_recv_now(po, op);
        else if (op->peer == po->rank)
            tally__po_self_send(po, op);
        else
            tally__po_out_post(po, op);
    }
    tally__po_op *done = tally__po_take_done(po);
    pthread_mutex_unlock(&po->mu);
    tally__po_run_done(po, done);
    if (rc) free(op);
    return rc;
}

static tally__po_op *po_op_new(size_t count, tally_dtype t, int peer, int tag, tally__po_done_fn done, void *arg) {
    tally__po_op *op = calloc(1, sizeof *op);
    if (!op) return NULL;
    op->peer = peer;
    op->tag = tag;
    op->dtype = t;
    op->count = count;
    op->bytes = count * tally_dtype_size(t);
    op->done = done;
    op->arg = arg;
    op->source = -1;
    return op;
}

int tally__po_send(tally__po *po, const void *buf, size_t count, tally_dtype t, int dst, int tag,
                   tally__po_done_fn done, void *arg) {
    tally__po_op *op = po_op_new(count, t, dst, tag, done, arg);
    if (!op) return tally__seterr(TALLY_E_NOMEM, "rank %d: tally_send: out of memory", po->rank);
    op->sbuf = buf;
    return po_post(po, op);
}

int tally__po_recv(tally__po *po, void *buf, size_t count, tally_dtype t, int src, int tag, tally__po_done_fn done,
                   void *arg) {
    tally__po_op *op = po_op_new(count, t, src, tag, done, arg);
    if (!op) return tally__seterr(TALLY_E_NOMEM, "rank %d: tally_recv: out of memory", po->rank);
    op->is_recv = 1;
    op->rbuf = buf;
    return po_post(po, op);
}

static void po_close_all(tally__po *po) {
    while (po->ins) tally__po_in_close(po, po->ins, TALLY_E_ABORTED, "the communicator is gone");
    for (int r = 0; po->out && r < po->size; r++) {
        tally__po_out *o = &po->out[r];
        if (o->fd >= 0) close(o->fd);
        if (o->dead_fd >= 0) close(o->dead_fd);
        o->fd = o->dead_fd = -1;
    }
    if (po->lfd >= 0) close(po->lfd);
    po->lfd = -1;
    if (po->wake_fd >= 0) close(po->wake_fd);
    po->wake_fd = -1;
}

void tally__po_shutdown(tally__po *po, int abandon) {
    if (!po) return;
    pthread_mutex_lock(&po->mu);
    if (po->shut) {
        pthread_mutex_unlock(&po->mu);
        return;
    }
    po->shut = 1;
    const char *how = abandon ? "aborted (tally_comm_abort)" : "freed (tally_comm_free)";
    char why[256];
    snprintf(why, sizeof why, "the communicator was %s before it finished", how);
    if (!po->closed) {
        po->closed = TALLY_E_ABORTED;
        snprintf(po->closed_why, sizeof po->closed_why,
                 "rank %d: the communicator was %s: no point-to-point call "
                 "may follow",
                 po->rank, how);
    }
    tally__po_fail_recvs(po, TALLY_E_ABORTED, why);
    if (abandon) tally__po_fail_sends(po, TALLY_E_ABORTED, why);
    po->draining = 1;
    po->stopping |= abandon;
    int started = po->started;
    tally__po_op *done = tally__po_take_done(po);
    pthread_mutex_unlock(&po->mu);
    tally__po_run_done(po, done);
    if (started) {
        tally__po_wake(po);
        pthread_join(po->th, NULL);
        po->started = 0;
    }
    pthread_mutex_lock(&po->mu);
    po_close_all(po);
    done = tally__po_take_done(po); /* none is left by now; were one, its caller still hears */
    pthread_mutex_unlock(&po->mu);
    tally__po_run_done(po, done);
}

void tally__po_free(tally__po *po) {
    if (!po) return;
    tally__po_shutdown(po, 1);
    pthread_mutex_lock(&po->mu); /* a waiter still driving leaves at its next turn: its request has ended */
    while (atomic_load(&po->driving)) pthread_cond_wait(&po->drove, &po->mu);
    pthread_mutex_unlock(&po->mu);
    if (po->drive_fd >= 0) close(po->drive_fd);
    tally__po_copier_end(&po->copier);
    tally__po_free_msgs(po);
    for (int r = 0; po->out && r < po->size; r++) free(po->out[r].why);
    for (int r = 0; po->lost_why && r < po->size; r++) free(po->lost_why[r]);
    free(po->ports);
    free(po->in_of);
    free(po->lost);
    free(po->lost_why);
    free(po->out);
    free(po->pfd);
    free(po->slot);
    free(po->dpfd);
    free(po->din);
    pthread_cond_destroy(&po->drove);
    pthread_mutex_destroy(&po->mu);
    free(po);
}
