/* boot.h - rendezvous: who am I (rank, size, address, token from TALLY_* or the launcher's variables),
 * an authenticated star of control connections to rank 0, small bootstrap collectives over it, and
 * the monitor thread that turns a peer's death or fault report into a fault on every rank. */
#ifndef TALLY_BOOT_BOOT_H
#define TALLY_BOOT_BOOT_H

#include <stddef.h>
#include <stdint.h>
#include "../core/err.h"

#define TALLY__TOKEN_MAX 256

/* What the environment says about this process, before any connection. */
typedef struct tally__boot_env {
    int rank, size;
    char host[256];   /* rank 0's rendezvous host (name or IP) */
    int port;         /* rank 0's rendezvous port */
    char token[TALLY__TOKEN_MAX];
    size_t token_len;
    const char *source; /* "TALLY", "Open MPI", "PMI", "Slurm", "torchrun" */
    int token_derived;  /* 1: no TALLY_TOKEN, token derived from the launcher's job id (not secret) */
    char bind[256];     /* TALLY_BIND: where rank 0 listens instead of `host` ("" = host itself) */
    double boot_timeout_s; /* TALLY_BOOT_TIMEOUT: limit of the rendezvous; 0 = the timeout boot_init gets */
} tally__boot_env;

/* Reads the environment. TALLY_E_BOOT with a message naming the missing variable when incomplete. */
int tally__boot_env_read(tally__boot_env *env);

/* One entry per rank, the same table on every rank after tally__boot_init. */
typedef struct tally__peer {
    int pid;
    uint64_t hostid;  /* equal for processes on the same host (hostname + boot id) */
    char ip[64];      /* numeric address this rank reaches rank 0 from (where its listeners bind) */
    char hostname[64];
} tally__peer;

typedef struct tally__boot tally__boot;

/* Rendezvous with every rank: rank 0 listens on the address (env->bind when set, else env->host: never
 * all interfaces unless one of them names a wildcard), the others connect (retrying until the limit),
 * each proves the token (HMAC-SHA256 challenge, constant-time compare) before anything else is parsed,
 * and all receive the peer table. Rank 0 serves every connection without blocking on any: a stranger
 * that sends nothing or part of a handshake costs no real rank any time. The rendezvous is bounded by
 * env->boot_timeout_s (when > 0) or timeout_s; when it expires, every rank that joined fails with
 * TALLY_E_TIMEOUT naming the missing ranks. timeout_s also bounds the bootstrap collectives. The fault
 * record gets its propagate hook. */
int tally__boot_init(tally__boot **out, const tally__boot_env *env, tally__fault *fault, double timeout_s);
int tally__boot_rank(const tally__boot *b);
int tally__boot_size(const tally__boot *b);
const tally__peer *tally__boot_peers(const tally__boot *b);
/* 1 if every rank reported the same hostid. */
int tally__boot_single_host(const tally__boot *b);
/* The token, for the transports' own authenticated handshakes. */
const void *tally__boot_token(const tally__boot *b, size_t *len);

/* Bootstrap collectives over the control star (slow; for setup only, before the monitor starts). */
int tally__boot_bcast(tally__boot *b, void *buf, size_t len, int root);
int tally__boot_allgather(tally__boot *b, const void *mine, void *all, size_t len);
int tally__boot_barrier(tally__boot *b);

/* Starts the monitor thread: from now on the control connections carry only fault reports and
 * goodbyes. A peer that closes its control connection without saying goodbye raises
 * TALLY_E_PEER_LOST naming it, on every rank. */
int tally__boot_start_monitor(tally__boot *b);
/* Says goodbye (so peers do not take our exit for a death), stops the monitor, closes everything. */
void tally__boot_free(tally__boot *b);

/* HMAC-SHA256 challenge/response for any connection (control or data). The listener side calls
 * tally__auth_accept, the connecting side tally__auth_connect; each proves knowledge of the token
 * and checks the other's proof. `role` binds the proof to its purpose ("ctl", "tcp"). Bounded by the
 * deadline (tally__now_ns units). TALLY_E_AUTH on a wrong token. */
int tally__auth_accept(int fd, const void *token, size_t token_len, const char *role, uint64_t deadline);
int tally__auth_connect(int fd, const void *token, size_t token_len, const char *role, uint64_t deadline);

/* The acceptor's side in steps, for a listener that serves many connections without blocking on any
 * one of them: read TALLY__AUTH_IN bytes, call begin, send a->reply; read TALLY__AUTH_PROOF bytes,
 * call check, send the verdict byte (1 accepted, 0 refused). tally__auth_accept is these steps. */
#define TALLY__AUTH_IN 32    /* connector's nonce */
#define TALLY__AUTH_REPLY 64 /* acceptor's nonce and proof */
#define TALLY__AUTH_PROOF 32 /* connector's proof */
typedef struct tally__auth_acc {
    unsigned char reply[TALLY__AUTH_REPLY];
    unsigned char expect[TALLY__AUTH_PROOF];
} tally__auth_acc;
int tally__auth_accept_begin(tally__auth_acc *a, const void *token, size_t token_len, const char *role,
                             const unsigned char nonce[TALLY__AUTH_IN]);
/* 1 when the proof matches (compared in constant time), else 0. */
int tally__auth_accept_check(const tally__auth_acc *a, const unsigned char proof[TALLY__AUTH_PROOF]);

#endif
