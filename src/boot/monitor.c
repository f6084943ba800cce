/* monitor.c - control-connection frames, fault propagation between ranks (setup failures flagged as such),
 * and the monitor thread that turns a peer's fault report or unannounced close into a fault on this rank. */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/log.h"
#include "boot_int.h"
#include "fdlimit.h"
#include "net.h"

/* A control frame is at most ~800 bytes: a healthy peer takes it at once, so a short bound only
 * matters for a hung peer, which must not stall the rank reporting a fault. */
#define CTL_SEND_S 5.0

void tally__ctl_hdr_put(unsigned char h[CTL_HDR], int type, uint32_t aux, uint32_t len) {
    tally__put_be32(h, CTL_MAGIC);
    h[4] = (unsigned char)type;
    h[5] = h[6] = h[7] = 0;
    tally__put_be32(h + 8, aux);
    tally__put_be32(h + 12, len);
}

int tally__ctl_hdr_get(const unsigned char h[CTL_HDR], ctl_frame *f) {
    if (tally__get_be32(h) != CTL_MAGIC || h[4] == 0 || h[4] >= CTL_TYPE_MAX || h[5] || h[6] || h[7])
        return TALLY_E_PROTOCOL;
    f->type = h[4];
    f->aux = tally__get_be32(h + 8);
    f->len = tally__get_be32(h + 12);
    return 0;
}

int tally__ctl_recv_hdr(int fd, ctl_frame *f, uint64_t deadline) {
    unsigned char h[CTL_HDR];
    int rc = tally__net_recv_all(fd, h, sizeof h, deadline);
    return rc ? rc : tally__ctl_hdr_get(h, f);
}

int tally__ctl_send(tally__boot *b, int peer, int type, uint32_t aux, const void *p, size_t len, uint64_t deadline) {
    int fd = b->ctl[peer];
    unsigned char small[1024];
    if (fd < 0) return TALLY_E_PEER_LOST;
    if (len > UINT32_MAX) return TALLY_E_INVALID;
    tally__ctl_hdr_put(small, type, aux, (uint32_t)len);
    pthread_mutex_lock(&b->wlock);
    int rc;
    if (len <= sizeof small - CTL_HDR) { /* one segment for the common small frame */
        if (len) memcpy(small + CTL_HDR, p, len);
        rc = tally__net_send_all(fd, small, CTL_HDR + len, deadline);
    } else {
        rc = tally__net_send_all(fd, small, CTL_HDR, deadline);
        if (!rc) rc = tally__net_send_all(fd, p, len, deadline);
    }
    pthread_mutex_unlock(&b->wlock);
    return rc;
}

void tally__ctl_who(const tally__boot *b, int rank, char *buf, size_t n) {
    if (rank < 0 || rank >= b->size || !b->peers) {
        snprintf(buf, n, "rank %d", rank);
        return;
    }
    const tally__peer *p = &b->peers[rank];
    snprintf(buf, n, "rank %d (pid %d on host %s)", rank, p->pid, p->hostname[0] ? p->hostname : "?");
}

static size_t ctl_fault_payload(unsigned char *buf, int code, int culprit, const char *msg) {
    size_t ml = strnlen(msg, CTL_MSG_MAX);
    tally__put_be32(buf, (uint32_t)code);
    tally__put_be32(buf + 4, (uint32_t)culprit);
    memcpy(buf + 8, msg, ml);
    return 8 + ml;
}

/* Sends a FAULT to every rank but `skip` and ourselves (rank 0), or to rank 0. Best effort: a peer
 * that cannot take it is dead or hung, and its own monitor or timeout will notice. aux: CTL_FAULT_SETUP
 * or 0. */
static void ctl_send_fault(tally__boot *b, int skip, uint32_t aux, int code, int culprit, const char *msg) {
    unsigned char buf[CTL_FAULT_MAX];
    size_t len = ctl_fault_payload(buf, code, culprit, msg);
    uint64_t deadline = tally__deadline(CTL_SEND_S);
    for (int k = 0; k < b->size; k++) {
        if (k == b->rank || k == skip || (b->rank != 0 && k != 0)) continue;
        (void)tally__ctl_send(b, k, CTL_FAULT, aux, buf, len, deadline);
    }
}

void tally__ctl_propagate(void *arg, int code, int culprit, const char *msg) {
    tally__boot *b = arg;
    ctl_send_fault(b, -1, b->in_setup ? CTL_FAULT_SETUP : 0, code, culprit, msg);
}

void tally__boot_setup_phase(tally__boot *b, int on) {
    if (!b) return;
    b->in_setup = on;
    if (!on) return;
    memset(b->watch, 0, (size_t)b->size); /* a new step: what an earlier one's watch saw is read by now */
    b->watch_ended = b->setup_relayed = 0;
}

void tally__boot_tell_setup_failure(tally__boot *b, int code, const char *msg) {
    if (b && b->size > 1) ctl_send_fault(b, -1, CTL_FAULT_SETUP, code, b->rank, msg);
}

int tally__ctl_fault_parse(const tally__boot *b, const unsigned char *p, size_t len, int *code, int *culprit,
                           char msg[CTL_MSG_MAX + 1]) {
    if (len < 8 || len > CTL_FAULT_MAX) return TALLY_E_PROTOCOL;
    *code = (int32_t)tally__get_be32(p);
    *culprit = (int32_t)tally__get_be32(p + 4);
    if (*code >= 0 || *code < -1000 || *culprit < -1 || *culprit >= b->size) return TALLY_E_PROTOCOL;
    memcpy(msg, p + 8, len - 8);
    msg[len - 8] = '\0';
    return 0;
}

int tally__ctl_on_fault_aux(tally__boot *b, int from, uint32_t aux, const unsigned char *p, size_t len) {
    int code, culprit;
    char msg[CTL_MSG_MAX + 1];
    if (tally__ctl_fault_parse(b, p, len, &code, &culprit, msg)) return TALLY_E_PROTOCOL;
    /* Relay only a fault that is the first here: a later one lost the race and every rank already
     * has (or is being sent) the winner. A concurrent local raise may win between the load and the
     * adopt; then both reach the others and the first to arrive wins there, which is harmless. The
     * first setup failure is relayed too, whatever came before it: it ends setup on ranks still in it. */
    int first = atomic_load(&b->fault->claimed) == 0, setup = (aux & CTL_FAULT_SETUP) && !b->setup_relayed;
    tally__fault_adopt(b->fault, code, culprit, msg);
    if (b->rank == 0 && (first || setup)) ctl_send_fault(b, from, aux & CTL_FAULT_SETUP, code, culprit, msg);
    if (aux & CTL_FAULT_SETUP) b->setup_relayed = 1;
    return code;
}

int tally__ctl_on_fault(tally__boot *b, int from, const unsigned char *p, size_t len) {
    return tally__ctl_on_fault_aux(b, from, 0, p, len);
}

/* ---- the monitor thread ---- */

typedef struct ctl_conn {
    int rank;
    int bye; /* said goodbye: its close is a clean exit */
    size_t have;
    unsigned char buf[CTL_HDR + CTL_FAULT_MAX];
} ctl_conn;

struct ctl_mon {
    int n;              /* connections watched */
    struct pollfd *pfd; /* [n + 1]; the last is stop_fd */
    ctl_conn *conn;     /* [n] */
};

static void mon_lost(tally__boot *b, ctl_conn *c) {
    if (c->bye) return;
    char who[160];
    tally__ctl_who(b, c->rank, who, sizeof who);
    tally__fault_raise(b->fault, TALLY_E_PEER_LOST, c->rank,
                       "%s exited or closed its connection; the collective cannot complete. Check that rank's "
                       "output for the cause.",
                       who);
}

/* Handles one complete frame. Returns 1 to stop watching the connection. */
static int mon_frame(tally__boot *b, ctl_conn *c, const ctl_frame *f) {
    if (f->type == CTL_BYE) {
        c->bye = 1;
        tally__log_debug(2, "rank %d said goodbye", c->rank);
        return 0;
    }
    if (tally__ctl_on_fault_aux(b, c->rank, f->aux, c->buf + CTL_HDR, f->len) != TALLY_E_PROTOCOL) return 0;
    tally__fault_raise(b->fault, TALLY_E_PROTOCOL, c->rank, "rank %d sent a malformed fault report", c->rank);
    return 1;
}

/* Reads what is available on one connection. Returns 1 when it is closed or unusable. */
static int mon_read(tally__boot *b, ctl_conn *c, int fd) {
    ctl_frame f = {0};
    size_t need = CTL_HDR;
    if (c->have >= CTL_HDR) {
        tally__ctl_hdr_get(c->buf, &f);
        need = CTL_HDR + f.len;
    }
    ssize_t n = recv(fd, c->buf + c->have, need - c->have, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (n <= 0) { /* EOF, or reset: either way the peer is gone */
        mon_lost(b, c);
        return 1;
    }
    c->have += (size_t)n;
    if (c->have < need) return 0;
    if (need == CTL_HDR) {
        int bad = tally__ctl_hdr_get(c->buf, &f) != 0 ||
                  !((f.type == CTL_FAULT && f.len >= 8 && f.len <= CTL_FAULT_MAX) || (f.type == CTL_BYE && f.len == 0));
        if (bad) {
            if (c->bye) return 1;
            tally__fault_raise(b->fault, TALLY_E_PROTOCOL, c->rank,
                               "rank %d sent an unexpected control message after setup (type %d, %u bytes): the "
                               "ranks disagree on the setup steps, or it is not a tally peer of this version",
                               c->rank, c->buf[4], (unsigned)tally__get_be32(c->buf + 12));
            return 1;
        }
        if (f.len > 0) return 0; /* the payload comes next */
    }
    c->have = 0;
    return mon_frame(b, c, &f);
}

static void *mon_main(void *arg) {
    tally__boot *b = arg;
    struct ctl_mon *m = b->mon;
    for (;;) {
        int rc = poll(m->pfd, (nfds_t)m->n + 1, -1); /* blocks: no spinning */
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) {
            tally__fault_raise(b->fault, TALLY_E_SYSTEM, -1, "rank %d: the monitor's poll() failed: %s", b->rank,
                               strerror(errno));
            return NULL;
        }
        if (m->pfd[m->n].revents) return NULL; /* stop_fd: tally__boot_free */
        for (int i = 0; i < m->n; i++)
            if (m->pfd[i].revents && mon_read(b, &m->conn[i], m->pfd[i].fd)) m->pfd[i].fd = -1;
    }
}

static int mon_alloc(tally__boot *b) {
    struct ctl_mon *m = calloc(1, sizeof *m);
    if (!m) return TALLY_E_NOMEM;
    m->n = b->rank == 0 ? b->size - 1 : 1;
    m->pfd = calloc((size_t)m->n + 1, sizeof *m->pfd);
    m->conn = calloc((size_t)m->n, sizeof *m->conn);
    if (!m->pfd || !m->conn) {
        free(m->pfd);
        free(m->conn);
        free(m);
        return TALLY_E_NOMEM;
    }
    for (int i = 0; i < m->n; i++) {
        int r = b->rank == 0 ? i + 1 : 0;
        m->conn[i].rank = r;
        m->pfd[i] = (struct pollfd){.fd = b->ctl[r], .events = POLLIN};
    }
    m->pfd[m->n] = (struct pollfd){.fd = b->stop_fd, .events = POLLIN};
    b->mon = m;
    return 0;
}

/* Raised, not only returned: the peers have their monitors running and would otherwise take our exit
 * for a clean one. Out of descriptors, the message names the limit. */
static int mon_eventfd_failed(tally__boot *b, int err) {
    char why[600];
    if (tally__fd_exhausted(err))
        tally__fd_explain(err, why, sizeof why);
    else
        snprintf(why, sizeof why, "%s", strerror(err));
    return tally__fault_raise(b->fault, TALLY_E_SYSTEM, b->rank, "rank %d: cannot create the monitor's eventfd: %s",
                              b->rank, why);
}

int tally__boot_start_monitor(tally__boot *b) {
    if (b->monitor_on) return tally__seterr(TALLY_E_INVALID, "rank %d: the boot monitor is already running", b->rank);
    if (b->fault->wake_fd < 0) { /* transports poll() this alongside their sockets */
        int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (fd < 0) return mon_eventfd_failed(b, errno);
        b->fault->wake_fd = fd;
        b->own_wake_fd = 1;
    }
    b->monitor_on = 1;          /* from here on the bootstrap collectives are refused */
    if (b->size == 1) return 0; /* nobody to watch */
    b->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (b->stop_fd < 0) return mon_eventfd_failed(b, errno);
    if (mon_alloc(b)) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory starting the monitor", b->rank);
    int rc = pthread_create(&b->monitor, NULL, mon_main, b);
    if (rc) {
        free(b->mon->pfd);
        free(b->mon->conn);
        free(b->mon);
        b->mon = NULL;
        return tally__seterr(TALLY_E_SYSTEM, "rank %d: cannot start the monitor thread: %s", b->rank, strerror(rc));
    }
    tally__log_debug(2, "monitor thread watching %d control connection(s)", b->rank == 0 ? b->size - 1 : 1);
    return 0;
}

void tally__ctl_stop_monitor(tally__boot *b) {
    if (!b->mon) return;
    uint64_t one = 1;
    ssize_t w = write(b->stop_fd, &one, sizeof one);
    (void)w; /* cannot fail on a fresh eventfd */
    pthread_join(b->monitor, NULL);
    free(b->mon->pfd);
    free(b->mon->conn);
    free(b->mon);
    b->mon = NULL;
}
