/* accept.h - accepting connections that must prove the job's token before they say who they are, each
 * advanced as far as its bytes allow and none waited on: rank 0's rendezvous and every rank's tcp mesh. */
#ifndef TALLY_BOOT_ACCEPT_H
#define TALLY_BOOT_ACCEPT_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "boot.h"
#include "net.h"

#define TALLY__ACC_BUF 160 /* the largest stage: the rendezvous hello */

/* One connection being accepted. Stages 0 and 1 are the token's (the nonce, then the proof); from 2 on
 * it has proved the token and is one of the job's, and the stages are the user's. */
typedef struct tally__acc_conn {
    int fd, stage;
    size_t got;     /* bytes of this stage received */
    uint64_t until; /* dropped if it is not through by then */
    tally__auth_acc auth;
    unsigned char buf[TALLY__ACC_BUF];
    char from[TALLY__NET_ADDRSTR];
} tally__acc_conn;

typedef struct tally__acc_user {
    void *arg;
    const char *role;                          /* the handshake's role ("ctl", "tcp") */
    size_t (*need)(void *arg, int stage);      /* bytes of user stage >= 2 */
    const char *(*what)(void *arg, int stage); /* its name in messages, "its hello" */
    /* User stage c->stage is complete: 0 on to the next, 1 joined (it took c->fd and set it to -1),
     * -1 dropped (it called tally__acc_drop or tally__acc_drop_quiet). */
    int (*stage)(void *arg, tally__acc_conn *c);
    int (*missing)(void *arg); /* ranks still expected: each has a slot beyond the strangers' */
    /* accept() is out of descriptors and no stranger could give way: whether the acceptor stops
     * listening until one frees (1) or the user has dealt with it (0). */
    int (*out_of_fds)(void *arg, int err);
    void (*note)(void *arg, const char *from, const char *why); /* a refused connection, for the log */
} tally__acc_user;

typedef struct tally__acceptor {
    int lfd, npend, cap, listen_off;
    tally__acc_conn *pend; /* [cap], oldest first */
    const void *tok;
    size_t tlen;
    double auth_s; /* how long a connection may take to get through */
    int strangers; /* slots beyond one per rank still expected */
    tally__acc_user u;
} tally__acceptor;

/* cap: the most connections pending at once (strangers + ranks that may connect). */
int tally__acc_init(tally__acceptor *a, int lfd, const void *tok, size_t tlen, int strangers, int cap, double auth_s,
                    const tally__acc_user *u);
void tally__acc_free(tally__acceptor *a);
/* Refuses c: the reason to the user's note, and the socket closed. */
void tally__acc_drop(tally__acceptor *a, tally__acc_conn *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The listener (first; fd -1 while not listening) and the pending connections: returns how many. */
int tally__acc_poll_fill(const tally__acceptor *a, struct pollfd *pfd);
/* The deadline, or sooner when a pending connection expires then. */
uint64_t tally__acc_wake(const tally__acceptor *a, uint64_t deadline);
/* After poll() on what poll_fill gave: advances the pending connections, expires the late ones, accepts
 * new ones. Returns how many joined. */
int tally__acc_handle(tally__acceptor *a, const struct pollfd *pfd);
/* A reply of a few bytes on a fresh socket, whole or not at all (0 / -1): its buffer always has room,
 * so a peer that leaves none is not one of ours and is not waited for. */
int tally__acc_put(int fd, const void *p, size_t n);

#endif
