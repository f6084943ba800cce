/* net.c - TCP helpers: exact-address listeners, connect with retry, deadline-bounded full send/recv,
 * numeric address strings. Used by the rendezvous and reusable by the TCP transport. */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/err.h"
#include "fdlimit.h"

int tally__net_poll_ms(uint64_t deadline) {
    uint64_t now = tally__now_ns();
    if (now >= deadline) return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

int tally__net_tune(int fd) {
    int one = 1;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return TALLY_E_SYSTEM;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return TALLY_E_SYSTEM;
    /* Control and data messages are small and latency-bound: never wait for Nagle. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) return TALLY_E_SYSTEM;
    return 0;
}

int tally__net_wait(int fd, short events, uint64_t deadline) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = tally__net_poll_ms(deadline);
        int rc = poll(&p, 1, ms);
        if (rc > 0) return 0; /* ready, or error/hangup: the next send/recv reports which */
        if (rc == 0 && tally__now_ns() >= deadline) return TALLY_E_TIMEOUT;
        if (rc < 0 && errno != EINTR) return TALLY_E_SYSTEM;
    }
}

static int net_is_lost(int e) { return e == ECONNRESET || e == EPIPE || e == ENOTCONN || e == ETIMEDOUT; }

int tally__net_send_all(int fd, const void *buf, size_t len, uint64_t deadline) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL); /* a dead peer is an error code, not SIGPIPE */
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = tally__net_wait(fd, POLLOUT, deadline);
            if (rc) return rc;
            continue;
        }
        return (n < 0 && net_is_lost(errno)) ? TALLY_E_PEER_LOST : TALLY_E_SYSTEM;
    }
    return 0;
}

int tally__net_recv_all(int fd, void *buf, size_t len, uint64_t deadline) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) return TALLY_E_PEER_LOST;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = tally__net_wait(fd, POLLIN, deadline);
            if (rc) return rc;
            continue;
        }
        return net_is_lost(errno) ? TALLY_E_PEER_LOST : TALLY_E_SYSTEM;
    }
    return 0;
}

static void net_sa_str(const struct sockaddr *sa, socklen_t len, char *ip, size_t n, int *port) {
    char serv[16];
    ip[0] = '\0';
    if (getnameinfo(sa, len, ip, (socklen_t)n, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        ip[0] = '\0';
        serv[0] = '\0';
    }
    if (port) *port = serv[0] ? atoi(serv) : -1;
}

void tally__net_local_ip(int fd, char *buf, size_t n) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    buf[0] = '\0';
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0) net_sa_str((struct sockaddr *)&ss, len, buf, n, NULL);
}

int tally__net_local_port(int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char ip[TALLY__NET_ADDRSTR];
    int port = -1;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        net_sa_str((struct sockaddr *)&ss, len, ip, sizeof ip, &port);
    return port;
}

void tally__net_fmt_addr(const char *host, int port, char *buf, size_t n) {
    if (strchr(host, ':'))
        snprintf(buf, n, "[%s]:%d", host, port);
    else
        snprintf(buf, n, "%s:%d", host, port);
}

void tally__net_peer_str(int fd, char *buf, size_t n) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char ip[TALLY__NET_ADDRSTR];
    int port = -1;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) {
        snprintf(buf, n, "?");
        return;
    }
    net_sa_str((struct sockaddr *)&ss, len, ip, sizeof ip, &port);
    tally__net_fmt_addr(ip[0] ? ip : "?", port, buf, n);
}

static int net_resolve(const char *host, int port, int passive, struct addrinfo **res) {
    char serv[16];
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    snprintf(serv, sizeof serv, "%d", port);
    return getaddrinfo(host, serv, &hints, res);
}

int tally__net_listen(const char *host, int port, int backlog, int *fd_out) {
    struct addrinfo *res = NULL;
    char addr[TALLY__NET_ADDRSTR + 256];
    tally__net_fmt_addr(host, port, addr, sizeof addr);
    *fd_out = -1;
    int g = net_resolve(host, port, 1, &res);
    if (g != 0)
        return tally__seterr(TALLY_E_BOOT, "cannot listen on %s: cannot resolve '%s': %s", addr, host, gai_strerror(g));
    int err = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0) {
            freeaddrinfo(res);
            *fd_out = fd;
            return 0;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (tally__fd_exhausted(err)) {
        char why[600];
        tally__fd_explain(err, why, sizeof why);
        return tally__seterr(TALLY_E_SYSTEM, "cannot listen on %s: %s", addr, why);
    }
    if (err == EADDRINUSE)
        return tally__seterr(TALLY_E_BOOT,
                             "cannot listen on %s: the port is already in use (another job, or an earlier run "
                             "still exiting?); choose another port in TALLY_ADDR",
                             addr);
    if (err == EADDRNOTAVAIL)
        return tally__seterr(TALLY_E_BOOT,
                             "cannot listen on %s: this host does not have address '%s'; rank 0 must run on the "
                             "host named in TALLY_ADDR",
                             addr, host);
    return tally__seterr(TALLY_E_BOOT, "cannot listen on %s: %s", addr, strerror(err));
}

/* 1 when a loopback connect landed on its own port (TCP simultaneous open): not the listener. */
static int net_self_connected(int fd) {
    struct sockaddr_storage a, b;
    socklen_t la = sizeof a, lb = sizeof b;
    if (getsockname(fd, (struct sockaddr *)&a, &la) || getpeername(fd, (struct sockaddr *)&b, &lb)) return 0;
    return la == lb && memcmp(&a, &b, la) == 0;
}

/* One attempt on one address. 0 connected; else errno-style failure in *err. */
static int net_try_connect(const struct addrinfo *ai, uint64_t deadline, int *fd_out, int *err) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
        if (tally__net_wait(fd, POLLOUT, deadline) == 0) {
            socklen_t len = sizeof *err;
            *err = 0;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, err, &len) < 0) *err = errno;
            rc = *err ? -1 : 0;
        } else {
            *err = ETIMEDOUT;
        }
    } else if (rc < 0) {
        *err = errno;
    }
    if (rc == 0 && net_self_connected(fd)) {
        *err = ECONNREFUSED;
        rc = -1;
    }
    if (rc == 0 && tally__net_tune(fd) != 0) {
        *err = errno;
        rc = -1;
    }
    if (rc != 0) {
        close(fd);
        return -1;
    }
    *fd_out = fd;
    return 0;
}

int tally__net_connect(const char *host, int port, uint64_t deadline, int *fd_out) {
    char addr[TALLY__NET_ADDRSTR + 256];
    tally__net_fmt_addr(host, port, addr, sizeof addr);
    *fd_out = -1;
    long backoff_ms = 10;
    int err = 0;
    for (;;) {
        struct addrinfo *res = NULL;
        int g = net_resolve(host, port, 0, &res), gerr = errno;
        if (g == EAI_NONAME || g == EAI_SERVICE || g == EAI_FAMILY)
            return tally__seterr(TALLY_E_BOOT, "cannot connect to %s: cannot resolve '%s': %s", addr, host,
                                 gai_strerror(g));
        for (struct addrinfo *ai = g == 0 ? res : NULL; ai; ai = ai->ai_next)
            if (net_try_connect(ai, deadline, fd_out, &err) == 0) {
                freeaddrinfo(res);
                return 0;
            }
        if (res) freeaddrinfo(res);
        if (g == EAI_SYSTEM && tally__fd_exhausted(gerr)) err = gerr; /* could not even read /etc/hosts */
        if (tally__fd_exhausted(err)) { /* no retry frees a descriptor: say which limit, now */
            char why[600];
            tally__fd_explain(err, why, sizeof why);
            return tally__seterr(TALLY_E_SYSTEM, "cannot connect to %s: %s", addr, why);
        }
        if (g != 0) err = EAGAIN;
        /* The listener may not be up yet: back off (10 ms doubling to 250 ms) until the deadline. */
        int left = tally__net_poll_ms(deadline);
        if (left <= 0) break;
        long ms = backoff_ms < left ? backoff_ms : left;
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (backoff_ms < 250) backoff_ms *= 2;
    }
    return tally__seterr(TALLY_E_TIMEOUT, "cannot connect to %s: %s (retried until the timeout)", addr,
                         err ? strerror(err) : "no attempt completed");
}

int tally__net_accept(int lfd, int *fd_out) {
    *fd_out = -1;
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            *fd_out = fd;
            return 0;
        }
        if (errno == EINTR) continue;
        /* Nothing pending, or a connection that died in the backlog: not the listener's failure. */
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EPROTO) return 0;
        return TALLY_E_SYSTEM;
    }
}
