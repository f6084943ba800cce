/* net.h - TCP socket helpers shared by the boot layer and the TCP transport: listen on an exact address,
 * connect with retry, full send/recv bounded by a deadline, numeric address strings. */
#ifndef TALLY_BOOT_NET_H
#define TALLY_BOOT_NET_H

#include <stddef.h>
#include <stdint.h>

/* Every socket these helpers make is non-blocking, close-on-exec and TCP_NODELAY; the blocking
 * behaviour comes from poll() inside send_all/recv_all, so a deadline bounds every call.
 * Deadlines are absolute, in tally__now_ns() units (see core/clock.h).
 *
 * Return values: 0 on success, or
 *   TALLY_E_TIMEOUT    the deadline passed first,
 *   TALLY_E_PEER_LOST  the other end closed or reset the connection (EOF, ECONNRESET, EPIPE),
 *   TALLY_E_SYSTEM     any other failure (errno is left as the system call set it).
 * send_all/recv_all/wait do NOT set the thread's error message: the caller knows which peer it was
 * talking to and should say so. listen/connect do set it (they know the address). */

#define TALLY__NET_ADDRSTR 96 /* enough for "[ipv6%scope]:port" */

/* Listens on exactly host:port (a name or numeric address; "0.0.0.0" or "::" for all interfaces),
 * SO_REUSEADDR so a restarted job can reuse the port while old connections sit in TIME_WAIT. */
int tally__net_listen(const char *host, int port, int backlog, int *fd_out);
/* Connects to host:port, retrying refused/unreachable attempts with backoff until the deadline (the
 * listener may start later). An unresolvable host name fails at once, and so does a full descriptor
 * table (TALLY_E_SYSTEM naming RLIMIT_NOFILE). */
int tally__net_connect(const char *host, int port, uint64_t deadline, int *fd_out);
/* Accepts one pending connection. 0 with *fd_out = -1 when none is pending; TALLY_E_SYSTEM with errno
 * kept (EMFILE, ENFILE: the descriptor table is full) when the accept itself failed. */
int tally__net_accept(int lfd, int *fd_out);
/* Makes an existing socket non-blocking, close-on-exec and TCP_NODELAY. */
int tally__net_tune(int fd);

int tally__net_send_all(int fd, const void *buf, size_t len, uint64_t deadline);
int tally__net_recv_all(int fd, void *buf, size_t len, uint64_t deadline);
/* Waits until fd has `events` (POLLIN/POLLOUT) or an error/hangup, or the deadline passes. */
int tally__net_wait(int fd, short events, uint64_t deadline);
/* Milliseconds from now to the deadline for poll(): 0 when past, capped at INT_MAX. */
int tally__net_poll_ms(uint64_t deadline);

/* Numeric IP of this end of a connected or bound socket ("10.0.0.5", "::1"); "" on failure. */
void tally__net_local_ip(int fd, char *buf, size_t n);
int tally__net_local_port(int fd); /* -1 on failure */
/* "ip:port" (or "[ip]:port") of the other end, for log lines; "?" on failure. */
void tally__net_peer_str(int fd, char *buf, size_t n);
/* Formats host and port as "host:port", bracketing IPv6 literals. */
void tally__net_fmt_addr(const char *host, int port, char *buf, size_t n);

#endif
