/* boot.c - the rendezvous: every rank joins rank 0 (serve.c) over an authenticated control connection
 * and receives the peer table; the descriptor budget of a world; bootstrap bcast/allgather/barrier. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/log.h"
#include "boot_int.h"
#include "fdlimit.h"
#include "net.h"

/* The thread's current message, copied: tally__seterr cannot take its own buffer as an argument. */
static const char *boot_prev(char prev[1024]) {
    snprintf(prev, 1024, "%s", tally_last_error());
    return prev;
}

/* ---- who this process is ---- */

static uint64_t fnv1a(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (h ^ '\n') * 1099511628211ull;
}

#define FNV_OFFSET 1469598103934665603ull

void tally__boot_kernel_id(char *id, size_t n) {
    id[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (!f) return;
    if (!fgets(id, (int)n, f)) id[0] = '\0';
    fclose(f);
}

/* A host is one kernel (hostname and boot id: a hostname alone can repeat across containers) and one
 * network namespace: processes in two namespaces of a kernel (containers, scripts/hosts.sh's test hosts)
 * reach each other only over the network, as hosts do, so they never share memory. TALLY_HOST names the
 * host instead: ranks with the same name are one host, others are not. */
static void boot_self(tally__peer *p, const char *named) {
    memset(p, 0, sizeof *p);
    p->pid = (int)getpid();
    if (named[0]) { /* checked at init */
        snprintf(p->hostname, sizeof p->hostname, "%s", named);
        p->hostid = fnv1a(fnv1a(FNV_OFFSET, "TALLY_HOST"), named);
        return;
    }
    char boot_id[64] = "", netns[64] = "";
    if (gethostname(p->hostname, sizeof p->hostname - 1) != 0) snprintf(p->hostname, sizeof p->hostname, "?");
    tally__boot_kernel_id(boot_id, sizeof boot_id);
    ssize_t k = readlink("/proc/self/ns/net", netns, sizeof netns - 1); /* "net:[4026531840]" */
    netns[k > 0 ? k : 0] = '\0';
    p->hostid = fnv1a(fnv1a(fnv1a(FNV_OFFSET, p->hostname), boot_id), netns);
}

/* Rank 0's draw for this rendezvous (never 0, which an entry of another rank holds). */
static uint32_t boot_job_nonce(void) {
    uint32_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) /* early boot: time and pid will do */
        v = (uint32_t)(tally__now_ns() ^ ((uint64_t)getpid() << 16));
    return v ? v : 1;
}

static void boot_hello_put(unsigned char *o, const tally__boot *b) {
    const tally__peer *me = &b->peers[b->rank];
    memset(o, 0, HELLO_LEN);
    tally__put_be32(o, HELLO_MAGIC);
    tally__put_be32(o + 4, BOOT_VERSION);
    tally__put_be32(o + 8, (uint32_t)b->rank);
    tally__put_be32(o + 12, (uint32_t)b->size);
    tally__put_be32(o + 16, (uint32_t)me->pid);
    tally__put_be64(o + 24, me->hostid);
    tally__put_be32(o + 20, b->fd_hard);
    memcpy(o + 32, me->hostname, strnlen(me->hostname, 63));
    memcpy(o + 96, me->ip, strnlen(me->ip, 63));
}

/* Makes room now, once, for every descriptor this rank will hold (raising the soft limit if it must), so
 * a low limit fails the init by name on every rank instead of leaving a rank "missing" at the timeout.
 * A rank that cannot have them still joins: rank 0 learns it from the hello and tells everyone. */
static void boot_fd_check(tally__boot *b) {
    int need = tally__boot_fd_need(b->rank, b->size);
    tally__fd_limit lim;
    char world[64], adv[420], hard[24] = "unlimited";
    tally__boot_fd_world(b->transport, b->size, world, sizeof world);
    int rc = tally__fd_room(need, &lim);
    if (lim.hard != TALLY__FD_UNLIMITED) snprintf(hard, sizeof hard, "%llu", lim.hard);
    if (rc == 0) {
        if (lim.raised_from)
            tally__log_debug(1,
                             "rank %d: raised RLIMIT_NOFILE's soft limit from %llu to %llu (hard %s): %s needs "
                             "about %ld file descriptors on this rank",
                             b->rank, lim.raised_from, lim.soft, hard, world, lim.want);
        return;
    }
    tally__fd_advice(&lim, adv, sizeof adv);
    snprintf(b->fd_short, sizeof b->fd_short,
             "rank %d: %s needs about %ld file descriptors on rank %d (%d for its "
             "connections, %ld open already) but %s",
             b->rank, world, lim.want, b->rank, need, lim.open, adv);
    b->fd_hard = lim.hard >= UINT32_MAX ? UINT32_MAX - 1 : lim.hard ? (uint32_t)lim.hard : 1;
}

/* ---- ranks 1..n-1: joining ---- */

static int rk_auth_failed(tally__boot *b, const tally__boot_env *env, const char *addr) {
    return tally__seterr(TALLY_E_AUTH,
                         "rank %d: this process's TALLY_TOKEN does not match rank 0's (at %s), so rank 0 refused "
                         "it; every rank must be given the same TALLY_TOKEN%s",
                         b->rank, addr,
                         env->token_derived ? " (this one was derived from the launcher's job id "
                                              "because TALLY_TOKEN is not set)"
                                            : "");
}

/* Connects and authenticates, retrying while rank 0 is not (yet) there. Returns the fd in *fd. */
static int rk_connect(tally__boot *b, const tally__boot_env *env, const char *addr, uint64_t deadline, int *fd) {
    char prev[1024];
    for (;;) {
        int rc = tally__net_connect(env->host, env->port, deadline, fd);
        if (rc == TALLY_E_TIMEOUT)
            return tally__seterr(rc,
                                 "rank %d could not reach rank 0 at %s (from %s) within %g s: %s. Rank 0 is "
                                 "missing: check that it started, that the address and port are right and not "
                                 "firewalled; raise TALLY_BOOT_TIMEOUT (default: TALLY_TIMEOUT) if it starts slowly",
                                 b->rank, addr, env->source, b->rdv_timeout_s, boot_prev(prev));
        if (rc) return tally__seterr(rc, "rank %d: %s (environment: %s)", b->rank, boot_prev(prev), env->source);
        rc = tally__auth_connect(*fd, b->token, b->token_len, "ctl", deadline);
        if (rc == 0) return 0;
        close(*fd);
        *fd = -1;
        if (rc == TALLY_E_AUTH) return rk_auth_failed(b, env, addr);
        /* Closed before answering: a listener of a run that is ending, or one that dropped us; retry. */
        if (rc != TALLY_E_PEER_LOST || tally__now_ns() >= deadline)
            return tally__seterr(rc, "rank %d: rendezvous with rank 0 at %s failed: %s", b->rank, addr,
                                 boot_prev(prev));
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int rk_refused(tally__boot *b, int fd, const ctl_frame *f, const char *addr, uint64_t deadline) {
    char msg[CTL_MSG_MAX + 1];
    int code = -(int32_t)f->aux;
    if (f->len > CTL_MSG_MAX || code >= 0 || code < -1000)
        return tally__seterr(TALLY_E_PROTOCOL,
                             "rank %d: rank 0 at %s sent a malformed refusal (code %d, %u bytes): is "
                             "it the same tally version?",
                             b->rank, addr, code, (unsigned)f->len);
    int rc = tally__net_recv_all(fd, msg, f->len, deadline);
    if (rc)
        return tally__seterr(rc, "rank %d: rank 0 at %s refused this process but its reason did not arrive (%s)",
                             b->rank, addr, tally_strerror(rc));
    msg[f->len] = '\0';
    if (code == TALLY_E_TIMEOUT) return tally__seterr(code, "rank %d: %s", b->rank, msg);
    return tally__seterr(code, "rank %d: rank 0 refused this process: %s", b->rank, msg);
}

static int rk_table(tally__boot *b, int fd, const ctl_frame *f, uint64_t deadline) {
    size_t len = (size_t)b->size * PEER_LEN;
    if (f->aux != (uint32_t)b->size || f->len != len) return TALLY_E_PROTOCOL;
    unsigned char *t = malloc(len);
    if (!t) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory for the peer table", b->rank);
    int rc = tally__net_recv_all(fd, t, len, deadline);
    for (int k = 0; k < b->size && !rc; k++) rc = tally__boot_peer_get(t + (size_t)k * PEER_LEN, &b->peers[k]);
    free(t);
    if (!rc && b->peers[b->rank].pid != (int)getpid()) rc = TALLY_E_PROTOCOL;
    return rc;
}

static int rk_rendezvous(tally__boot *b, const tally__boot_env *env, uint64_t deadline) {
    char addr[TALLY__NET_ADDRSTR + 256];
    int fd;
    tally__net_fmt_addr(env->host, env->port, addr, sizeof addr);
    int rc = rk_connect(b, env, addr, deadline, &fd);
    if (rc) return rc;
    /* Rank 0 listened before we joined, so its own limit ends at most rdv_timeout_s from now: wait that
     * long (plus a grace) for its verdict even when our deadline is nearer, so a rank that started
     * earlier still learns which ranks are missing. */
    uint64_t verdict_by = tally__deadline(b->rdv_timeout_s);
    if (verdict_by < deadline) verdict_by = deadline;
    b->ctl[0] = fd;
    tally__net_local_ip(fd, b->peers[b->rank].ip, sizeof b->peers[b->rank].ip);
    unsigned char h[HELLO_LEN];
    boot_hello_put(h, b);
    rc = tally__ctl_send(b, 0, CTL_HELLO, 0, h, sizeof h, verdict_by);
    /* Rank 0 answers once every rank joined, or with its verdict when its own limit expires. */
    uint64_t dl2 = verdict_by + (uint64_t)(TABLE_GRACE_S * 1e9);
    ctl_frame f;
    if (!rc) rc = tally__ctl_recv_hdr(fd, &f, dl2);
    if (!rc && f.type == CTL_REFUSE) return rk_refused(b, fd, &f, addr, dl2);
    if (!rc) rc = f.type == CTL_TABLE ? rk_table(b, fd, &f, dl2) : TALLY_E_PROTOCOL;
    if (rc == TALLY_E_TIMEOUT)
        return tally__seterr(rc,
                             "rank %d: rank 0 at %s sent neither the peer table nor its verdict within %g s of "
                             "our joining: it is hung (see its output)",
                             b->rank, addr, b->rdv_timeout_s + TABLE_GRACE_S);
    if (rc == TALLY_E_PEER_LOST)
        return tally__seterr(rc,
                             "rank %d: rank 0 at %s closed the connection during the rendezvous: it failed or "
                             "exited; check its output",
                             b->rank, addr);
    if (rc == TALLY_E_PROTOCOL)
        return tally__seterr(rc, "rank %d: rank 0 at %s sent a malformed peer table: is it the same tally version?",
                             b->rank, addr);
    return rc;
}

/* ---- bootstrap collectives over the star ---- */

static int bc_fail(tally__boot *b, int rc, int peer, const char *what) {
    char who[160];
    tally__ctl_who(b, peer, who, sizeof who);
    if (rc == TALLY_E_TIMEOUT)
        return tally__fault_raise(b->fault, rc, peer,
                                  "rank %d waited %g s for %s during setup (bootstrap %s): it is "
                                  "hung or much slower; raise TALLY_TIMEOUT if that is expected",
                                  b->rank, b->timeout_s, who, what);
    if (rc == TALLY_E_PEER_LOST)
        return tally__fault_raise(b->fault, rc, peer,
                                  "%s exited or closed its connection during setup (bootstrap "
                                  "%s); check that rank's output for the cause",
                                  who, what);
    return tally__fault_raise(b->fault, rc, peer, "rank %d: bootstrap %s with %s failed: %s", b->rank, what, who,
                              tally_strerror(rc));
}

static int bc_send(tally__boot *b, int peer, const void *buf, size_t len, const char *what, uint64_t deadline) {
    int rc = tally__ctl_send(b, peer, CTL_DATA, b->seq, buf, len, deadline);
    return rc ? bc_fail(b, rc, peer, what) : 0;
}

static int bc_recv(tally__boot *b, int peer, void *buf, size_t len, const char *what, uint64_t deadline) {
    ctl_frame f;
    int fd = b->ctl[peer];
    int rc = tally__ctl_recv_hdr(fd, &f, deadline);
    if (rc) return bc_fail(b, rc, peer, what);
    if (f.type == CTL_FAULT) { /* a fault elsewhere ends the setup everywhere */
        unsigned char p[CTL_FAULT_MAX];
        if (f.len > sizeof p) return bc_fail(b, TALLY_E_PROTOCOL, peer, what);
        if ((rc = tally__net_recv_all(fd, p, f.len, deadline))) return bc_fail(b, rc, peer, what);
        if (tally__ctl_on_fault_aux(b, peer, f.aux, p, f.len) == TALLY_E_PROTOCOL)
            return bc_fail(b, TALLY_E_PROTOCOL, peer, what);
        return tally__fault_check(b->fault);
    }
    if (f.type == CTL_BYE) return bc_fail(b, TALLY_E_PEER_LOST, peer, what);
    if (f.type != CTL_DATA) return bc_fail(b, TALLY_E_PROTOCOL, peer, what);
    if (f.aux != b->seq || f.len != len)
        return tally__fault_raise(
            b->fault, TALLY_E_MISMATCH, peer,
            "bootstrap %s: rank %d is at setup step %u with %u bytes, rank %d at step %u with %zu "
            "bytes: the ranks ran different setup steps (different settings?)",
            what, peer, (unsigned)f.aux, (unsigned)f.len, b->rank, (unsigned)b->seq, len);
    rc = tally__net_recv_all(fd, buf, len, deadline);
    return rc ? bc_fail(b, rc, peer, what) : 0;
}

/* Common entry check; counts the step on every rank so mismatched sequences are caught. */
static int bc_enter(tally__boot *b, const char *what) {
    if (b->monitor_on)
        return tally__seterr(TALLY_E_INVALID, "rank %d: bootstrap %s called after the monitor started", b->rank, what);
    b->seq++;
    return tally__fault_check(b->fault);
}

int tally__boot_bcast(tally__boot *b, void *buf, size_t len, int root) {
    if (root < 0 || root >= b->size)
        return tally__seterr(TALLY_E_INVALID, "rank %d: bootstrap bcast root %d is not in [0, %d)", b->rank, root,
                             b->size);
    int rc = bc_enter(b, "bcast");
    if (rc || b->size == 1) return rc;
    uint64_t dl = tally__deadline(b->timeout_s);
    if (b->rank == root) {
        if (root != 0) return bc_send(b, 0, buf, len, "bcast", dl);
    } else if (b->rank != 0) {
        return bc_recv(b, 0, buf, len, "bcast", dl);
    } else if ((rc = bc_recv(b, root, buf, len, "bcast", dl))) {
        return rc;
    }
    /* Rank 0 relays to everyone but the root. */
    for (int k = 1; k < b->size && !rc; k++)
        if (k != root) rc = bc_send(b, k, buf, len, "bcast", dl);
    return rc;
}

int tally__boot_allgather(tally__boot *b, const void *mine, void *all, size_t len) {
    if (len && (size_t)-1 / len < (size_t)b->size)
        return tally__seterr(TALLY_E_INVALID, "rank %d: bootstrap allgather of %zu bytes per rank overflows", b->rank,
                             len);
    int rc = bc_enter(b, "allgather");
    if (rc) return rc;
    unsigned char *out = all;
    if (len) memmove(out + (size_t)b->rank * len, mine, len);
    if (b->size == 1) return 0;
    uint64_t dl = tally__deadline(b->timeout_s);
    if (b->rank != 0) {
        rc = bc_send(b, 0, out + (size_t)b->rank * len, len, "allgather", dl);
        return rc ? rc : bc_recv(b, 0, out, len * (size_t)b->size, "allgather", dl);
    }
    for (int k = 1; k < b->size && !rc; k++) rc = bc_recv(b, k, out + (size_t)k * len, len, "allgather", dl);
    for (int k = 1; k < b->size && !rc; k++) rc = bc_send(b, k, out, len * (size_t)b->size, "allgather", dl);
    return rc;
}

int tally__boot_barrier(tally__boot *b) {
    unsigned char none; /* allgather offsets into `all` even for 0 bytes, and NULL + 0 is undefined in C */
    return tally__boot_allgather(b, NULL, &none, 0);
}

/* ---- lifetime and accessors ---- */

/* Reads what a peer already sent: closing a socket with unread bytes sends a reset instead of a FIN,
 * and the peer's monitor should see our goodbye, then a plain end of stream. */
static void boot_drain(int fd) {
    char junk[512];
    while (recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {}
}

static void boot_close(tally__boot *b) {
    for (int k = 0; b->ctl && k < b->size; k++)
        if (b->ctl[k] >= 0) close(b->ctl[k]);
    if (b->stop_fd >= 0) close(b->stop_fd);
    if (b->own_wake_fd) {
        close(b->fault->wake_fd);
        b->fault->wake_fd = -1;
    }
    pthread_mutex_destroy(&b->wlock);
    free(b->ctl);
    free(b->peers);
    free(b->watch);
    free(b);
}

static tally__boot *boot_alloc(const tally__boot_env *env, tally__fault *fault, double timeout_s) {
    tally__boot *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->rank = env->rank;
    b->size = env->size;
    b->fault = fault;
    b->timeout_s = timeout_s;
    b->rdv_timeout_s = env->boot_timeout_s > 0 ? env->boot_timeout_s : timeout_s;
    b->stop_fd = -1;
    b->peers = calloc((size_t)env->size, sizeof *b->peers);
    b->ctl = malloc((size_t)env->size * sizeof *b->ctl);
    b->watch = calloc((size_t)env->size, 1);
    pthread_mutex_init(&b->wlock, NULL);
    if (!b->peers || !b->ctl || !b->watch) {
        boot_close(b);
        return NULL;
    }
    for (int k = 0; k < env->size; k++) b->ctl[k] = -1;
    memcpy(b->token, env->token, env->token_len);
    b->token_len = env->token_len;
    boot_self(&b->peers[env->rank], env->named_host);
    if (env->rank == 0) b->peers[0].job = boot_job_nonce();
    b->transport = env->transport;
    return b;
}

/* A listener handed in is ours to close on every path: the rendezvous closes it, and so do refusals. */
static int boot_refuse(const tally__boot_env *env, int rc) {
    if (env->has_listener && env->listen_fd >= 0) close(env->listen_fd);
    return rc;
}

int tally__boot_init(tally__boot **out, const tally__boot_env *env, tally__fault *fault, double timeout_s) {
    *out = NULL;
    if (env->size < 1 || env->rank < 0 || env->rank >= env->size || env->token_len >= TALLY__TOKEN_MAX ||
        timeout_s <= 0)
        return boot_refuse(env, tally__seterr(TALLY_E_INVALID, "boot: rank %d / size %d / timeout %g is invalid",
                                              env->rank, env->size, timeout_s));
    if (env->size > 1 && env->token_len == 0)
        return boot_refuse(
            env,
            tally__seterr(TALLY_E_BOOT, "rank %d: no token to authenticate peers with: set TALLY_TOKEN", env->rank));
    if (!env->split) tally__log_set_rank(env->rank);
    tally__boot *b = boot_alloc(env, fault, timeout_s);
    if (!b)
        return boot_refuse(env, tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory in the rendezvous", env->rank));
    if (b->size == 1) {
        snprintf(b->peers[0].ip, sizeof b->peers[0].ip, "127.0.0.1");
    } else {
        uint64_t deadline = tally__deadline(b->rdv_timeout_s);
        boot_fd_check(b);
        int rc = b->rank == 0 ? tally__boot_serve(b, env, deadline) : rk_rendezvous(b, env, deadline);
        if (b->fd_short[0]) rc = tally__seterr(TALLY_E_SYSTEM, "%s", b->fd_short); /* ours says more than 0's */
        if (rc) {
            boot_close(b);
            return rc;
        }
    }
    fault->propagate = tally__ctl_propagate;
    fault->propagate_arg = b;
    tally__log_debug(1, "rendezvous done: %d ranks, %s", b->size,
                     tally__boot_single_host(b) ? "all on one host" : "on several hosts");
    *out = b;
    return 0;
}

void tally__boot_free(tally__boot *b) {
    if (!b) return;
    /* The monitor stops first: a fault it is relaying must reach the peers before our goodbye. */
    tally__ctl_stop_monitor(b);
    /* Goodbye, so peers take the close that follows for an exit, not a death. */
    uint64_t dl = tally__deadline(1.0);
    for (int k = 0; k < b->size; k++)
        if (b->ctl[k] >= 0) {
            (void)tally__ctl_send(b, k, CTL_BYE, 0, NULL, 0, dl);
            boot_drain(b->ctl[k]);
        }
    if (b->fault->propagate_arg == b) { /* the fault record may outlive us */
        b->fault->propagate = NULL;
        b->fault->propagate_arg = NULL;
    }
    boot_close(b);
}

int tally__boot_rank(const tally__boot *b) { return b->rank; }
int tally__boot_size(const tally__boot *b) { return b->size; }
const tally__peer *tally__boot_peers(const tally__boot *b) { return b->peers; }

int tally__boot_single_host(const tally__boot *b) {
    for (int k = 1; k < b->size; k++)
        if (b->peers[k].hostid != b->peers[0].hostid) return 0;
    return 1;
}

const void *tally__boot_token(const tally__boot *b, size_t *len) {
    *len = b->token_len;
    return b->token;
}
