/* boot.c - the rendezvous: rank 0 accepts an authenticated control connection from every other rank,
 * checks who they are, and sends everyone the peer table; then bootstrap bcast/allgather/barrier. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/log.h"
#include "boot_int.h"
#include "net.h"

#define PEER_LEN 144        /* pid, 0, hostid u64, ip[64], hostname[64] */
#define PEND_MAX 64         /* accepted connections still authenticating */
#define HANDSHAKE_S 5.0     /* a legitimate peer answers in microseconds; a silent stranger gets this long */
#define R0_LOG_MAX 10       /* refused connections logged one by one; past that, counted */
#define TABLE_GRACE_S 5.0   /* connectors wait this much past rank 0's limit so its verdict arrives first */

/* The thread's current message, copied: tally__seterr cannot take its own buffer as an argument. */
static const char *boot_prev(char prev[1024]) {
    snprintf(prev, 1024, "%s", tally_last_error());
    return prev;
}

/* ---- who this process is ---- */

static void boot_self(tally__peer *p) {
    char boot_id[64] = "";
    memset(p, 0, sizeof *p);
    p->pid = (int)getpid();
    if (gethostname(p->hostname, sizeof p->hostname - 1) != 0) snprintf(p->hostname, sizeof p->hostname, "?");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(boot_id, sizeof boot_id, f)) boot_id[0] = '\0';
        fclose(f);
    }
    /* Hostname alone can repeat across containers; the boot id tells kernels (and so shm) apart. */
    uint64_t h = 1469598103934665603ull;
    for (const char *s = p->hostname; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    h = (h ^ '\n') * 1099511628211ull;
    for (const char *s = boot_id; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    p->hostid = h;
}

/* A fixed 64-byte string field from the wire: NUL-terminated and printable, else rejected. */
static int boot_str_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n && s[i]) {
        if (s[i] < 0x20 || s[i] > 0x7e) return 0;
        i++;
    }
    return i < n;
}

static void boot_peer_put(unsigned char *o, const tally__peer *p) {
    memset(o, 0, PEER_LEN);
    ctl_put32(o, (uint32_t)p->pid);
    ctl_put64(o + 8, p->hostid);
    memcpy(o + 16, p->ip, strnlen(p->ip, 63));
    memcpy(o + 80, p->hostname, strnlen(p->hostname, 63));
}

static int boot_peer_get(const unsigned char *in, tally__peer *p) {
    if (!boot_str_ok(in + 16, 64) || !boot_str_ok(in + 80, 64)) return TALLY_E_PROTOCOL;
    p->pid = (int32_t)ctl_get32(in);
    p->hostid = ctl_get64(in + 8);
    memcpy(p->ip, in + 16, 64);
    memcpy(p->hostname, in + 80, 64);
    return 0;
}

static void boot_hello_put(unsigned char *o, const tally__boot *b) {
    const tally__peer *me = &b->peers[b->rank];
    memset(o, 0, HELLO_LEN);
    ctl_put32(o, HELLO_MAGIC);
    ctl_put32(o + 4, BOOT_VERSION);
    ctl_put32(o + 8, (uint32_t)b->rank);
    ctl_put32(o + 12, (uint32_t)b->size);
    ctl_put32(o + 16, (uint32_t)me->pid);
    ctl_put64(o + 24, me->hostid);
    memcpy(o + 32, me->hostname, strnlen(me->hostname, 63));
    memcpy(o + 96, me->ip, strnlen(me->ip, 63));
}

/* ---- rank 0: accepting and checking the others ---- */

/* Rank 0 serves every connection at once, each one a small state machine fed by poll(): a stranger
 * that sends nothing, or part of a handshake, holds a slot until HANDSHAKE_S and never delays a rank. */
enum { P_NONCE, P_PROOF, P_HDR, P_HELLO }; /* what the connection must send next */

typedef struct r0_pend {
    int fd;
    int stage;
    size_t got;     /* bytes of this stage received */
    uint64_t until; /* dropped if the handshake is not done by then */
    tally__auth_acc auth;
    unsigned char buf[HELLO_LEN]; /* the largest stage */
    char from[TALLY__NET_ADDRSTR];
} r0_pend;

typedef struct r0_state {
    int lfd;
    r0_pend *pend; /* [PEND_MAX], oldest first */
    int npend;
    int joined;
    int refused;        /* connections turned away (logged up to R0_LOG_MAX) */
    struct pollfd *pfd; /* [1 + PEND_MAX + size] */
    int *who;           /* rank of each ctl entry in pfd */
    char addr[TALLY__NET_ADDRSTR + 256];
} r0_state;

static const size_t stage_len[] = {[P_NONCE] = TALLY__AUTH_IN, [P_PROOF] = TALLY__AUTH_PROOF, [P_HDR] = CTL_HDR,
                                   [P_HELLO] = HELLO_LEN};
static const char *const stage_name[] = {[P_NONCE] = "its nonce", [P_PROOF] = "its proof of the token",
                                         [P_HDR] = "a frame header", [P_HELLO] = "its hello"};

/* Logs one turned-away connection; a flood is counted, not logged line by line. */
static void r0_note(r0_state *s, const char *from, const char *why) {
    if (++s->refused <= R0_LOG_MAX)
        tally__log_warn("refused a connection from %s: %s; still waiting for the other ranks", from, why);
    if (s->refused == R0_LOG_MAX)
        tally__log_warn("further refused connections are counted, not logged one by one");
}

static void r0_drop(r0_state *s, r0_pend *p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void r0_drop(r0_state *s, r0_pend *p, const char *fmt, ...) {
    char why[CTL_MSG_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    r0_note(s, p->from, why);
    close(p->fd);
    p->fd = -1;
}

/* Sends a short answer at once: a fresh socket's buffer always has room for it, so a peer that leaves
 * no room is not one of ours and is not waited for. */
static int r0_put(int fd, const void *buf, size_t len) {
    ssize_t k;
    do k = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    return k == (ssize_t)len ? 0 : -1;
}

/* Refuses an authenticated connection: tells the process why (`code` and the text), then drops it. */
static void r0_refuse(r0_state *s, r0_pend *p, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void r0_refuse(r0_state *s, r0_pend *p, int code, const char *fmt, ...) {
    char msg[CTL_MSG_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned char buf[CTL_HDR + CTL_MSG_MAX];
    size_t ml = strlen(msg);
    tally__ctl_hdr_put(buf, CTL_REFUSE, (uint32_t)-code, (uint32_t)ml);
    memcpy(buf + CTL_HDR, msg, ml);
    (void)r0_put(p->fd, buf, CTL_HDR + ml);
    r0_drop(s, p, "%s", msg);
}

/* Checks a hello (h holds its HELLO_LEN bytes) against the job: the rank it names, or -1 with the
 * refusal's code and text in *code and why. Pure, so the frame fuzzer can call it. */
int tally__boot_hello_check(const tally__boot *b, const unsigned char *h, int *code, char *why, size_t n) {
    uint32_t magic = ctl_get32(h), version = ctl_get32(h + 4);
    int rank = (int32_t)ctl_get32(h + 8), size = (int32_t)ctl_get32(h + 12), pid = (int32_t)ctl_get32(h + 16);
    *code = magic != HELLO_MAGIC || version != BOOT_VERSION || !boot_str_ok(h + 32, 64) || !boot_str_ok(h + 96, 64)
                ? TALLY_E_PROTOCOL
                : TALLY_E_BOOT;
    if (magic != HELLO_MAGIC || version != BOOT_VERSION)
        snprintf(why, n,
                 "it speaks rendezvous protocol %u (hello magic %08x), rank 0 speaks %u (magic %08x): every rank "
                 "must run the same tally version", version, magic, BOOT_VERSION, HELLO_MAGIC);
    else if (!boot_str_ok(h + 32, 64) || !boot_str_ok(h + 96, 64))
        snprintf(why, n, "its hello has a malformed host name or address");
    else if (size != b->size)
        snprintf(why, n,
                 "it (rank %d, pid %d) says the world size is %d but rank 0 has %d: every rank must be started "
                 "with the same world size (TALLY_WORLD_SIZE or the launcher's)", rank, pid, size, b->size);
    else if (rank <= 0 || rank >= b->size)
        snprintf(why, n,
                 "it (pid %d) claims rank %d, which is not in 1..%d (rank 0 is this process): check TALLY_RANK or "
                 "the launcher's rank variable", pid, rank, b->size - 1);
    else if (b->ctl[rank] >= 0)
        snprintf(why, n,
                 "it (pid %d on host %s) claims rank %d, which pid %d on host %s already holds: two processes "
                 "have the same rank (check TALLY_RANK or the launcher)",
                 pid, (const char *)h + 32, rank, b->peers[rank].pid, b->peers[rank].hostname);
    else
        return rank;
    return -1;
}

/* Checks a hello; on success the connection becomes rank k's control connection. 1 joined, -1 refused. */
static int r0_hello(tally__boot *b, r0_state *s, r0_pend *p) {
    const unsigned char *h = p->buf;
    char why[CTL_MSG_MAX + 1];
    int code, rank = tally__boot_hello_check(b, h, &code, why, sizeof why);
    if (rank < 0) return r0_refuse(s, p, code, "%s", why), -1;
    int pid = (int32_t)ctl_get32(h + 16);
    tally__peer *q = &b->peers[rank];
    q->pid = pid;
    q->hostid = ctl_get64(h + 24);
    memcpy(q->hostname, h + 32, 64);
    memcpy(q->ip, h + 96, 64);
    b->ctl[rank] = p->fd;
    p->fd = -1;
    if (!b->peers[0].ip[0] || !strcmp(b->peers[0].ip, "0.0.0.0") || !strcmp(b->peers[0].ip, "::"))
        tally__net_local_ip(b->ctl[rank], b->peers[0].ip, sizeof b->peers[0].ip); /* wildcard bind: name a real one */
    tally__log_debug(2, "rank %d joined from %s (pid %d on %s)", rank, p->from, pid, q->hostname);
    return 1;
}

/* Reads what the current stage still lacks, without waiting. 1 complete, 0 not yet, -1 closed/failed. */
static int r0_fill(r0_pend *p) {
    size_t need = stage_len[p->stage];
    while (p->got < need) {
        ssize_t n = recv(p->fd, p->buf + p->got, need - p->got, MSG_DONTWAIT);
        if (n > 0) {
            p->got += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return -1;
    }
    return 1;
}

/* Completes one stage. 0 on to the next, 1 joined, -1 dropped. */
static int r0_stage(tally__boot *b, r0_state *s, r0_pend *p) {
    ctl_frame f;
    unsigned char ok;
    switch (p->stage) {
    case P_NONCE:
        if (tally__auth_accept_begin(&p->auth, b->token, b->token_len, "ctl", p->buf) ||
            r0_put(p->fd, p->auth.reply, sizeof p->auth.reply))
            return r0_drop(s, p, "could not answer its handshake (%s)", tally_last_error()), -1;
        break;
    case P_PROOF:
        ok = (unsigned char)tally__auth_accept_check(&p->auth, p->buf);
        if (r0_put(p->fd, &ok, 1) || !ok)
            return r0_drop(s, p, "wrong TALLY_TOKEN or not a tally process (its proof does not match rank 0's "
                                 "token)"), -1;
        break;
    case P_HDR:
        if (tally__ctl_hdr_get(p->buf, &f) || f.type != CTL_HELLO || f.len != HELLO_LEN)
            return r0_refuse(s, p, TALLY_E_PROTOCOL,
                             "its first frame after authentication is not a hello (magic %08x, type %u, length %u; "
                             "rank 0 expects %08x, %d, %d): every rank must run the same tally version",
                             ctl_get32(p->buf), p->buf[4], ctl_get32(p->buf + 12), CTL_MAGIC, CTL_HELLO, HELLO_LEN), -1;
        break;
    case P_HELLO:
        return r0_hello(b, s, p);
    }
    p->stage++;
    p->got = 0;
    return 0;
}

/* Advances a connection as far as the bytes that arrived allow. 1 joined, 0 pending, -1 dropped. */
static int r0_advance(tally__boot *b, r0_state *s, r0_pend *p) {
    for (;;) {
        int rc = r0_fill(p);
        if (rc == 0) return 0;
        if (rc < 0) {
            if (p->stage == P_NONCE && p->got == 0)
                r0_drop(s, p, "it closed without a byte of the handshake (a port probe?)");
            else
                r0_drop(s, p, "it closed the connection after %zu bytes of %s (not a tally rank?)", p->got,
                        stage_name[p->stage]);
            return -1;
        }
        if ((rc = r0_stage(b, s, p))) return rc;
    }
}

/* Fills the poll set: listener, pending, joined ranks. */
static int r0_pollset(tally__boot *b, r0_state *s) {
    int n = 0;
    s->pfd[n++] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
    for (int i = 0; i < s->npend; i++) s->pfd[n++] = (struct pollfd){.fd = s->pend[i].fd, .events = POLLIN};
    for (int k = 1; k < b->size; k++)
        if (b->ctl[k] >= 0) {
            s->who[n] = k;
            s->pfd[n++] = (struct pollfd){.fd = b->ctl[k], .events = POLLIN};
        }
    return n;
}

static void r0_accept(r0_state *s) {
    for (;;) {
        int fd;
        if (tally__net_accept(s->lfd, &fd) != 0) { /* e.g. out of descriptors: let pending ones finish, not spin */
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
            return;
        }
        if (fd < 0) return;
        if (s->npend == PEND_MAX) { /* the oldest has had the longest to prove itself */
            r0_drop(s, &s->pend[0], "%d connections were authenticating at once; the oldest gave way", PEND_MAX);
            memmove(s->pend, s->pend + 1, sizeof s->pend[0] * (PEND_MAX - 1));
            s->npend--;
        }
        r0_pend *p = &s->pend[s->npend++];
        p->fd = fd;
        p->stage = P_NONCE;
        p->got = 0;
        p->until = tally__deadline(HANDSHAKE_S);
        tally__net_peer_str(fd, p->from, sizeof p->from);
    }
}

/* When poll must return: the rendezvous deadline, or the first pending handshake to expire. */
static uint64_t r0_wake(const r0_state *s, uint64_t deadline) {
    for (int i = 0; i < s->npend; i++)
        if (s->pend[i].until < deadline) deadline = s->pend[i].until;
    return deadline;
}

/* One round: waits for activity and handles it. */
static void r0_round(tally__boot *b, r0_state *s, uint64_t deadline) {
    int n = r0_pollset(b, s);
    if (poll(s->pfd, (nfds_t)n, tally__net_poll_ms(r0_wake(s, deadline))) < 0) return; /* EINTR: next round */
    /* A joined rank has nothing to say before the table: readable means it died or misbehaves. */
    for (int i = 1 + s->npend; i < n; i++)
        if (s->pfd[i].revents) {
            int k = s->who[i];
            tally__log_warn("rank %d (pid %d on host %s) closed its connection during the rendezvous; waiting for it "
                            "to reconnect", k, b->peers[k].pid, b->peers[k].hostname);
            close(b->ctl[k]);
            b->ctl[k] = -1;
            s->joined--;
        }
    uint64_t now = tally__now_ns();
    int keep = 0;
    for (int i = 0; i < s->npend; i++) {
        r0_pend *p = &s->pend[i];
        int st = s->pfd[1 + i].revents ? r0_advance(b, s, p) : 0;
        if (st == 0 && now >= p->until) {
            r0_drop(s, p, "it sent %zu bytes of %s and then nothing for %g s (not a tally rank?)", p->got,
                    stage_name[p->stage], HANDSHAKE_S);
            st = -1;
        }
        if (st > 0) s->joined++;
        if (st == 0 && keep != i) s->pend[keep] = *p;
        keep += st == 0;
    }
    s->npend = keep;
    if (s->pfd[0].revents) r0_accept(s);
}

static int r0_timeout(tally__boot *b, r0_state *s) {
    char list[600] = "";
    size_t len = 0;
    int missing = 0;
    for (int k = 1; k < b->size; k++) {
        if (b->ctl[k] >= 0) continue;
        if (missing++ < 32 && len < sizeof list - 16)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", missing > 1 ? ", " : "", k);
    }
    if (missing > 32) snprintf(list + len, sizeof list - len, ", ...");
    char refused[96] = "";
    if (s->refused) snprintf(refused, sizeof refused, "; rank 0 refused %d connection%s: see its log", s->refused,
                             s->refused == 1 ? "" : "s");
    char msg[1400]; /* sent clamped to CTL_MSG_MAX; a long host name may cut the advice short */
    snprintf(msg, sizeof msg,
             "rendezvous timed out after %g s: rank 0 (listening on %s) is still missing %d of %d ranks: %s. Check "
             "that they were started, can reach that address, and have the same TALLY_TOKEN%s. Raise "
             "TALLY_BOOT_TIMEOUT (default: TALLY_TIMEOUT) if they start slowly",
             b->rdv_timeout_s, s->addr, missing, b->size, list, refused);
    uint64_t dl = tally__deadline(1.0);
    for (int k = 1; k < b->size; k++)
        if (b->ctl[k] >= 0)
            (void)tally__ctl_send(b, k, CTL_REFUSE, (uint32_t)-TALLY_E_TIMEOUT, msg, strnlen(msg, CTL_MSG_MAX), dl);
    return tally__seterr(TALLY_E_TIMEOUT, "%s", msg);
}

static int r0_send_table(tally__boot *b) {
    size_t len = (size_t)b->size * PEER_LEN;
    unsigned char *t = malloc(len);
    if (!t) return tally__seterr(TALLY_E_NOMEM, "rank 0: out of memory for the peer table");
    for (int k = 0; k < b->size; k++) boot_peer_put(t + (size_t)k * PEER_LEN, &b->peers[k]);
    uint64_t dl = tally__deadline(b->timeout_s < TABLE_GRACE_S ? b->timeout_s : TABLE_GRACE_S);
    int rc = 0;
    for (int k = 1; k < b->size && !rc; k++) {
        rc = tally__ctl_send(b, k, CTL_TABLE, (uint32_t)b->size, t, len, dl);
        if (rc) {
            char who[160];
            tally__ctl_who(b, k, who, sizeof who);
            rc = tally__seterr(TALLY_E_PEER_LOST, "rank 0 could not send the peer table to %s (%s): it exited or "
                               "hung during the rendezvous; check its output", who, tally_strerror(rc));
        }
    }
    free(t);
    return rc;
}

static void r0_free(r0_state *s) {
    for (int i = 0; i < s->npend; i++) close(s->pend[i].fd);
    if (s->refused > R0_LOG_MAX) tally__log_warn("refused %d connections in all during the rendezvous", s->refused);
    if (s->lfd >= 0) close(s->lfd); /* a later communicator of this job can listen on the same port */
    free(s->pend);
    free(s->pfd);
    free(s->who);
}

static int r0_rendezvous(tally__boot *b, const tally__boot_env *env, uint64_t deadline) {
    r0_state s = {.lfd = -1};
    const char *host = env->bind[0] ? env->bind : env->host; /* never a wildcard unless one was given */
    tally__net_fmt_addr(host, env->port, s.addr, sizeof s.addr);
    int rc = tally__net_listen(host, env->port, SOMAXCONN, &s.lfd);
    char prev[1024];
    if (rc)
        return tally__seterr(rc, "rank 0 %s (environment: %s%s)", boot_prev(prev), env->source,
                             env->bind[0] ? ", address from TALLY_BIND" : "");
    tally__net_local_ip(s.lfd, b->peers[0].ip, sizeof b->peers[0].ip);
    tally__log_debug(1, "rank 0 listening on %s%s for %d ranks", s.addr, env->bind[0] ? " (TALLY_BIND)" : "",
                     b->size - 1);
    s.pend = calloc(PEND_MAX, sizeof *s.pend);
    s.pfd = calloc((size_t)(1 + PEND_MAX + b->size), sizeof *s.pfd);
    s.who = calloc((size_t)(1 + PEND_MAX + b->size), sizeof *s.who);
    if (!s.pend || !s.pfd || !s.who) rc = tally__seterr(TALLY_E_NOMEM, "rank 0: out of memory in the rendezvous");
    while (!rc && s.joined < b->size - 1) {
        if (tally__now_ns() >= deadline) {
            rc = r0_timeout(b, &s);
            break;
        }
        r0_round(b, &s, deadline);
    }
    r0_free(&s);
    return rc ? rc : r0_send_table(b);
}

/* ---- ranks 1..n-1: joining ---- */

static int rk_auth_failed(tally__boot *b, const tally__boot_env *env, const char *addr) {
    return tally__seterr(TALLY_E_AUTH,
                         "rank %d: this process's TALLY_TOKEN does not match rank 0's (at %s), so rank 0 refused "
                         "it; every rank must be given the same TALLY_TOKEN%s",
                         b->rank, addr, env->token_derived ? " (this one was derived from the launcher's job id "
                                                             "because TALLY_TOKEN is not set)" : "");
}

/* Connects and authenticates, retrying while rank 0 is not (yet) there. Returns the fd in *fd. */
static int rk_connect(tally__boot *b, const tally__boot_env *env, const char *addr, uint64_t deadline, int *fd) {
    char prev[1024];
    for (;;) {
        int rc = tally__net_connect(env->host, env->port, deadline, fd);
        if (rc == TALLY_E_TIMEOUT)
            return tally__seterr(rc, "rank %d could not reach rank 0 at %s (from %s) within %g s: %s. Rank 0 is "
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
        return tally__seterr(TALLY_E_PROTOCOL, "rank %d: rank 0 at %s sent a malformed refusal (code %d, %u bytes): is "
                             "it the same tally version?", b->rank, addr, code, (unsigned)f->len);
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
    for (int k = 0; k < b->size && !rc; k++) rc = boot_peer_get(t + (size_t)k * PEER_LEN, &b->peers[k]);
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
        return tally__seterr(rc, "rank %d: rank 0 at %s sent neither the peer table nor its verdict within %g s of "
                             "our joining: it is hung (see its output)", b->rank, addr, b->rdv_timeout_s + TABLE_GRACE_S);
    if (rc == TALLY_E_PEER_LOST)
        return tally__seterr(rc, "rank %d: rank 0 at %s closed the connection during the rendezvous: it failed or "
                             "exited; check its output", b->rank, addr);
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
        return tally__fault_raise(b->fault, rc, peer, "rank %d waited %g s for %s during setup (bootstrap %s): it is "
                                  "hung or much slower; raise TALLY_TIMEOUT if that is expected",
                                  b->rank, b->timeout_s, who, what);
    if (rc == TALLY_E_PEER_LOST)
        return tally__fault_raise(b->fault, rc, peer, "%s exited or closed its connection during setup (bootstrap "
                                  "%s); check that rank's output for the cause", who, what);
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
        if (tally__ctl_on_fault(b, peer, p, f.len) == TALLY_E_PROTOCOL) return bc_fail(b, TALLY_E_PROTOCOL, peer, what);
        return tally__fault_check(b->fault);
    }
    if (f.type == CTL_BYE) return bc_fail(b, TALLY_E_PEER_LOST, peer, what);
    if (f.type != CTL_DATA) return bc_fail(b, TALLY_E_PROTOCOL, peer, what);
    if (f.aux != b->seq || f.len != len)
        return tally__fault_raise(b->fault, TALLY_E_MISMATCH, peer,
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
        return tally__seterr(TALLY_E_INVALID, "rank %d: bootstrap bcast root %d is not in [0, %d)", b->rank, root, b->size);
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
        return tally__seterr(TALLY_E_INVALID, "rank %d: bootstrap allgather of %zu bytes per rank overflows", b->rank, len);
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
    while (recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {
    }
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
    pthread_mutex_init(&b->wlock, NULL);
    if (!b->peers || !b->ctl) {
        boot_close(b);
        return NULL;
    }
    for (int k = 0; k < env->size; k++) b->ctl[k] = -1;
    memcpy(b->token, env->token, env->token_len);
    b->token_len = env->token_len;
    boot_self(&b->peers[env->rank]);
    return b;
}

int tally__boot_init(tally__boot **out, const tally__boot_env *env, tally__fault *fault, double timeout_s) {
    *out = NULL;
    if (env->size < 1 || env->rank < 0 || env->rank >= env->size || env->token_len >= TALLY__TOKEN_MAX || timeout_s <= 0)
        return tally__seterr(TALLY_E_INVALID, "boot: rank %d / size %d / timeout %g is invalid", env->rank, env->size,
                             timeout_s);
    if (env->size > 1 && env->token_len == 0)
        return tally__seterr(TALLY_E_BOOT, "rank %d: no token to authenticate peers with: set TALLY_TOKEN", env->rank);
    tally__log_set_rank(env->rank);
    tally__boot *b = boot_alloc(env, fault, timeout_s);
    if (!b) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory in the rendezvous", env->rank);
    if (b->size == 1) {
        snprintf(b->peers[0].ip, sizeof b->peers[0].ip, "127.0.0.1");
    } else {
        uint64_t deadline = tally__deadline(b->rdv_timeout_s);
        int rc = b->rank == 0 ? r0_rendezvous(b, env, deadline) : rk_rendezvous(b, env, deadline);
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
