/* serve.c - rank 0's side of the rendezvous: every connection served at once by one poll() loop, each
 * authenticated and checked before it joins; room for every rank still expected, strangers capped. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/log.h"
#include "accept.h"
#include "boot_int.h"
#include "fdlimit.h"
#include "net.h"

/* Connections authenticating at once beyond one per rank still expected: strangers get this many slots;
 * past them the oldest unauthenticated one gives way (a rank it was retries, as rk_connect does). */
#define PEND_MAX    64
#define HANDSHAKE_S 5.0 /* a legitimate peer answers in microseconds; a silent stranger gets this long */
#define R0_LOG_MAX  10  /* refused connections logged one by one; past that, counted */

/* Rank 0 serves every connection at once through the job's acceptor (accept.c): a stranger that sends
 * nothing, or part of a handshake, holds a slot until HANDSHAKE_S and never delays a rank. Once it has
 * proved the token, a connection sends a frame header, then its hello (the acceptor's stages 2 and 3). */
enum { P_HDR = 2, P_HELLO = 3 };
_Static_assert(HELLO_LEN <= TALLY__ACC_BUF, "the acceptor holds a whole hello");

typedef struct r0_state {
    tally__boot *b;
    tally__acceptor a;
    int joined;
    int refused;        /* connections turned away (logged up to R0_LOG_MAX) */
    struct pollfd *pfd; /* [1 + PEND_MAX + 2 * size] */
    int *who;           /* rank of each ctl entry in pfd */
    char addr[TALLY__NET_ADDRSTR + 256];
    /* Once the rendezvous cannot succeed (a rank cannot hold the descriptors the world needs, rank 0
     * included), every rank is told why as it says hello, rather than left to its timeout. */
    int refuse_code;
    char refuse_msg[CTL_MSG_MAX + 1];
    unsigned char *told; /* [size]: ranks refused with it */
    int ntold, stuck;    /* stuck: nothing pending, no descriptor free: nobody else can be told */
} r0_state;

/* Logs one turned-away connection; a flood is counted, not logged line by line. */
static void r0_note(void *arg, const char *from, const char *why) {
    r0_state *s = arg;
    if (++s->refused <= R0_LOG_MAX)
        tally__log_warn("refused a connection from %s: %s; still waiting for the other ranks", from, why);
    if (s->refused == R0_LOG_MAX) tally__log_warn("further refused connections are counted, not logged one by one");
}

/* Sends a refusal (`code` and the text) on a control connection; best effort, the close follows. */
static void r0_say_refuse(int fd, int code, const char *msg) {
    unsigned char buf[CTL_HDR + CTL_MSG_MAX];
    size_t ml = strnlen(msg, CTL_MSG_MAX);
    tally__ctl_hdr_put(buf, CTL_REFUSE, (uint32_t)-code, (uint32_t)ml);
    memcpy(buf + CTL_HDR, msg, ml);
    (void)tally__acc_put(fd, buf, CTL_HDR + ml);
}

/* Refuses an authenticated connection: tells the process why (`code` and the text), then drops it. */
static void r0_refuse(r0_state *s, tally__acc_conn *p, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void r0_refuse(r0_state *s, tally__acc_conn *p, int code, const char *fmt, ...) {
    char msg[CTL_MSG_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r0_say_refuse(p->fd, code, msg);
    tally__acc_drop(&s->a, p, "%s", msg);
}

static int r0_missing(const tally__boot *b, const r0_state *s) { return b->size - 1 - s->joined - s->ntold; }
static int r0_missing_cb(void *arg) { return r0_missing(((r0_state *)arg)->b, arg); }

/* Ends the rendezvous for everyone: the ranks that joined are told now (and their descriptors freed),
 * the rest when they say hello. The first reason stays. */
static void r0_refuse_all(tally__boot *b, r0_state *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void r0_refuse_all(tally__boot *b, r0_state *s, int code, const char *fmt, ...) {
    if (s->refuse_code) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->refuse_msg, sizeof s->refuse_msg, fmt, ap);
    va_end(ap);
    s->refuse_code = code;
    tally__log_warn("%s; telling every rank", s->refuse_msg);
    for (int k = 1; k < b->size; k++) {
        if (b->ctl[k] < 0) continue;
        r0_say_refuse(b->ctl[k], code, s->refuse_msg);
        close(b->ctl[k]);
        b->ctl[k] = -1;
        s->told[k] = 1;
        s->ntold++;
        s->joined--;
    }
}

/* A joiner that cannot hold the descriptors the world needs said so in its hello (its hard limit). */
static void r0_short_rank(tally__boot *b, r0_state *s, int rank, uint32_t hard) {
    char world[96];
    tally__boot_fd_world(b->transport, b->size, world, sizeof world);
    r0_refuse_all(b, s, TALLY_E_SYSTEM,
                  "rank 0: rank %d (pid %d on host %s) cannot hold the %d file descriptors "
                  "%s needs on it: its RLIMIT_NOFILE hard limit is %u (its own message says more); raise the "
                  "limit where the ranks start (ulimit -n, or the hard limit: nofile in limits.conf, LimitNOFILE=)",
                  rank, b->peers[rank].pid, b->peers[rank].hostname, tally__boot_fd_need(rank, b->size), world, hard);
}

/* Checks a hello (h holds its HELLO_LEN bytes) against the job: the rank it names, or -1 with the
 * refusal's code and text in *code and why. Pure, so the frame fuzzer can call it. */
int tally__boot_hello_check(const tally__boot *b, const unsigned char *h, int *code, char *why, size_t n) {
    uint32_t magic = tally__get_be32(h), version = tally__get_be32(h + 4);
    int rank = (int32_t)tally__get_be32(h + 8), size = (int32_t)tally__get_be32(h + 12),
        pid = (int32_t)tally__get_be32(h + 16);
    int strings_ok = tally__boot_str_ok(h + 32, 64) && tally__boot_str_ok(h + 96, 64);
    *code = magic != HELLO_MAGIC || version != BOOT_VERSION || !strings_ok ? TALLY_E_PROTOCOL : TALLY_E_BOOT;
    if (magic != HELLO_MAGIC || version != BOOT_VERSION)
        snprintf(why, n,
                 "it speaks rendezvous protocol %u (hello magic %08x), rank 0 speaks %u (magic %08x): every rank "
                 "must run the same tally version",
                 version, magic, BOOT_VERSION, HELLO_MAGIC);
    else if (!strings_ok)
        snprintf(why, n, "its hello has a malformed host name or address");
    else if (size != b->size)
        snprintf(why, n,
                 "it (rank %d, pid %d) says the world size is %d but rank 0 has %d: every rank must be started "
                 "with the same world size (TALLY_WORLD_SIZE or the launcher's)",
                 rank, pid, size, b->size);
    else if (rank <= 0 || rank >= b->size)
        snprintf(why, n,
                 "it (pid %d) claims rank %d, which is not in 1..%d (rank 0 is this process): check TALLY_RANK or "
                 "the launcher's rank variable",
                 pid, rank, b->size - 1);
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
static int r0_hello(tally__boot *b, r0_state *s, tally__acc_conn *p) {
    const unsigned char *h = p->buf;
    char why[CTL_MSG_MAX + 1];
    int code, rank = tally__boot_hello_check(b, h, &code, why, sizeof why);
    if (rank < 0) return r0_refuse(s, p, code, "%s", why), -1;
    int pid = (int32_t)tally__get_be32(h + 16);
    tally__peer *q = &b->peers[rank];
    q->pid = pid;
    q->hostid = tally__get_be64(h + 24);
    memcpy(q->hostname, h + 32, 64);
    memcpy(q->ip, h + 96, 64);
    if (tally__get_be32(h + 20)) r0_short_rank(b, s, rank, tally__get_be32(h + 20));
    if (s->refuse_code) { /* told, not joined: it ends its rendezvous with our reason */
        r0_say_refuse(p->fd, s->refuse_code, s->refuse_msg);
        close(p->fd);
        p->fd = -1;
        s->ntold += !s->told[rank];
        s->told[rank] = 1;
        return -1;
    }
    b->ctl[rank] = p->fd;
    p->fd = -1;
    if (!b->peers[0].ip[0] || !strcmp(b->peers[0].ip, "0.0.0.0") || !strcmp(b->peers[0].ip, "::"))
        tally__net_local_ip(b->ctl[rank], b->peers[0].ip, sizeof b->peers[0].ip); /* wildcard bind: name a real one */
    tally__log_debug(2, "rank %d joined from %s (pid %d on %s)", rank, p->from, pid, q->hostname);
    return 1;
}

static size_t r0_need(void *arg, int stage) { return stage == P_HDR ? CTL_HDR : HELLO_LEN; }
static const char *r0_what(void *arg, int stage) { return stage == P_HDR ? "a frame header" : "its hello"; }

/* An authenticated connection's stage is complete. 0 on to the next, 1 joined, -1 refused. */
static int r0_stage(void *arg, tally__acc_conn *p) {
    r0_state *s = arg;
    ctl_frame f;
    if (p->stage == P_HELLO) return r0_hello(s->b, s, p);
    if (tally__ctl_hdr_get(p->buf, &f) || f.type != CTL_HELLO || f.len != HELLO_LEN)
        return r0_refuse(s, p, TALLY_E_PROTOCOL,
                         "its first frame after authentication is not a hello (magic %08x, type %u, length %u; "
                         "rank 0 expects %08x, %d, %d): every rank must run the same tally version",
                         tally__get_be32(p->buf), p->buf[4], tally__get_be32(p->buf + 12), CTL_MAGIC, CTL_HELLO,
                         HELLO_LEN),
               -1;
    return 0;
}

/* Fills the poll set: listener, pending, joined ranks. */
static int r0_pollset(tally__boot *b, r0_state *s) {
    int n = tally__acc_poll_fill(&s->a, s->pfd);
    for (int k = 1; k < b->size; k++)
        if (b->ctl[k] >= 0) {
            s->who[n] = k;
            s->pfd[n++] = (struct pollfd){.fd = b->ctl[k], .events = POLLIN};
        }
    return n;
}

/* accept() is out of descriptors and no stranger could give way: the job's own (duplicates?) finish or
 * expire; else the limit cannot hold the world, and every rank is told so. 1: stop listening for now. */
static int r0_out_of_fds(void *arg, int err) {
    r0_state *s = arg;
    tally__boot *b = s->b;
    if (s->a.npend > r0_missing(b, s) && !s->refuse_code) return 1;
    if (!s->refuse_code) {
        char why[600];
        tally__fd_explain(err, why, sizeof why);
        r0_refuse_all(b, s, TALLY_E_SYSTEM, "rank 0: rendezvous: accepting the connections of %d ranks: %s",
                      b->size - 1, why);
        return 0; /* the joined ranks' descriptors are free now */
    }
    if (s->a.npend > 0) return 1; /* refused as they say hello, they free theirs */
    s->stuck = 1;
    return 0;
}

/* One round: waits for activity and handles it. */
static void r0_round(tally__boot *b, r0_state *s, uint64_t deadline) {
    if (s->a.listen_off && s->a.npend == 0 && !s->refuse_code) s->a.listen_off = 0; /* nothing left to wait for */
    int n = r0_pollset(b, s), first_ctl = 1 + s->a.npend;
    if (poll(s->pfd, (nfds_t)n, tally__net_poll_ms(tally__acc_wake(&s->a, deadline))) < 0) return; /* EINTR */
    /* A joined rank has nothing to say before the table: readable means it died or misbehaves. */
    for (int i = first_ctl; i < n; i++)
        if (s->pfd[i].revents) {
            int k = s->who[i];
            tally__log_warn("rank %d (pid %d on host %s) closed its connection during the rendezvous; waiting for it "
                            "to reconnect",
                            k, b->peers[k].pid, b->peers[k].hostname);
            close(b->ctl[k]);
            b->ctl[k] = -1;
            s->joined--;
            s->a.listen_off = 0;
        }
    s->joined += tally__acc_handle(&s->a, s->pfd);
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
    if (s->refused)
        snprintf(refused, sizeof refused, "; rank 0 refused %d connection%s: see its log", s->refused,
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
    for (int k = 0; k < b->size; k++) tally__boot_peer_put(t + (size_t)k * PEER_LEN, &b->peers[k]);
    uint64_t dl = tally__deadline(b->timeout_s < TABLE_GRACE_S ? b->timeout_s : TABLE_GRACE_S);
    int rc = 0;
    for (int k = 1; k < b->size && !rc; k++) {
        rc = tally__ctl_send(b, k, CTL_TABLE, (uint32_t)b->size, t, len, dl);
        if (rc) {
            char who[160];
            tally__ctl_who(b, k, who, sizeof who);
            rc = tally__seterr(TALLY_E_PEER_LOST,
                               "rank 0 could not send the peer table to %s (%s): it exited or "
                               "hung during the rendezvous; check its output",
                               who, tally_strerror(rc));
        }
    }
    free(t);
    return rc;
}

static void r0_free(r0_state *s, int lfd) {
    tally__acc_free(&s->a);
    if (s->refused > R0_LOG_MAX) tally__log_warn("refused %d connections in all during the rendezvous", s->refused);
    if (lfd >= 0) close(lfd); /* a later communicator of this job can listen on the same port */
    free(s->pfd);
    free(s->who);
    free(s->told);
}

int tally__boot_serve(tally__boot *b, const tally__boot_env *env, uint64_t deadline) {
    r0_state s = {.b = b};
    int lfd = -1;
    const char *host = env->bind[0] ? env->bind : env->host; /* never a wildcard unless one was given */
    tally__net_fmt_addr(host, env->port, s.addr, sizeof s.addr);
    int rc = env->has_listener ? (lfd = env->listen_fd, 0) : tally__net_listen(host, env->port, SOMAXCONN, &lfd);
    char prev[1024];
    if (rc) {
        snprintf(prev, sizeof prev, "%s", tally_last_error());
        return tally__seterr(rc, "rank 0 %s (environment: %s%s)", prev, env->source,
                             env->bind[0] ? ", address from TALLY_BIND" : "");
    }
    tally__net_local_ip(lfd, b->peers[0].ip, sizeof b->peers[0].ip);
    tally__log_debug(1, "rank 0 listening on %s%s for %d ranks", s.addr, env->bind[0] ? " (TALLY_BIND)" : "",
                     b->size - 1);
    size_t cap = (size_t)PEND_MAX + (size_t)b->size;
    tally__acc_user u = {.arg = &s,
                         .role = "ctl",
                         .need = r0_need,
                         .what = r0_what,
                         .stage = r0_stage,
                         .missing = r0_missing_cb,
                         .out_of_fds = r0_out_of_fds,
                         .note = r0_note};
    s.pfd = calloc(1 + cap + (size_t)b->size, sizeof *s.pfd);
    s.who = calloc(1 + cap + (size_t)b->size, sizeof *s.who);
    s.told = calloc((size_t)b->size, 1);
    if (!s.pfd || !s.who || !s.told ||
        tally__acc_init(&s.a, lfd, b->token, b->token_len, PEND_MAX, (int)cap, HANDSHAKE_S, &u))
        rc = tally__seterr(TALLY_E_NOMEM, "rank 0: out of memory in the rendezvous");
    if (!rc && b->fd_short[0]) r0_refuse_all(b, &s, TALLY_E_SYSTEM, "%s", b->fd_short); /* we cannot hold them all */
    while (!rc && r0_missing(b, &s) > 0 && !s.stuck) {
        if (tally__now_ns() >= deadline) {
            rc = s.refuse_code ? s.refuse_code : r0_timeout(b, &s);
            break;
        }
        r0_round(b, &s, deadline);
    }
    r0_free(&s, lfd);
    if (s.refuse_code && (!rc || rc == s.refuse_code)) return tally__seterr(s.refuse_code, "%s", s.refuse_msg);
    return rc ? rc : r0_send_table(b);
}
