/* boot.h - rendezvous: who am I (rank, size, address, token from TALLY_* or the launcher's variables),
 * an authenticated star of control connections to rank 0, small bootstrap collectives over it, and
 * the monitor thread that turns a peer's death or fault report into a fault on every rank. */
#ifndef TALLY_BOOT_BOOT_H
#define TALLY_BOOT_BOOT_H

#include <stddef.h>
#include <stdint.h>
#include "../core/err.h"

struct pollfd;

#define TALLY__TOKEN_MAX 256

#define TALLY__BOOT_MAX_SIZE 4096 /* ranks a world may have */

/* Descriptors a rank holds besides one per peer and its control connections: the tcp listener or shm's
 * segment and probe memfd, the monitor's two eventfds, and short-lived ones (a name lookup, /proc files,
 * a pidfd_getfd, a rendezvous connection being refused). What a rank adds on top of its budget must
 * leave these spare. */
#define TALLY__BOOT_FD_EXTRA 12

/* What the rendezvous needs to know about this process, before any connection: from the config
 * (tally__boot_env_from_config), or from the parent communicator (a split). */
typedef struct tally__boot_env {
    int rank, size;
    char host[256]; /* rank 0's rendezvous host (name or IP) */
    int port;       /* rank 0's rendezvous port */
    char token[TALLY__TOKEN_MAX];
    size_t token_len;
    char source[32];       /* where rank and size came from: "TALLY", "Open MPI", ..., "tally_config" */
    int token_derived;     /* 1: no TALLY_TOKEN, token derived from the launcher's job id (not secret) */
    char bind[256];        /* TALLY_BIND: where rank 0 listens instead of `host` ("" = host itself) */
    double boot_timeout_s; /* TALLY_BOOT_TIMEOUT: limit of the rendezvous; 0 = the timeout boot_init gets */
    char named_host[64];   /* TALLY_HOST: this host's name ("" = kernel and network namespace tell) */
    const char *transport; /* "tcp" or "shm" when the config forces one, else NULL: for messages */
    int split;             /* a communicator split from another (the environment never sets these): the log
                            * keeps the world's rank, and rank 0 serves on listen_fd when has_listener, already
                            * listening on the port it picked, and closes it */
    int has_listener, listen_fd;
    int crowded; /* a split's: its parent found this rank's kernel crowded (its CPUs fewer than the ranks
                  * there, some of which the split may not hold), so its waiters yield too */
} tally__boot_env;

/* The world's boot env from its config (whose fields are checked already): TALLY_E_BOOT naming what is
 * missing (the rank and size; beyond one rank the address and the token) and where to give it. */
int tally__boot_env_from_config(const tally_config *cfg, tally__boot_env *env);
/* Says at log level 1 where env came from (and that a derived token is no secret). */
void tally__boot_env_say(const tally__boot_env *env);
/* The knobs a split's env takes from the config too: the host's name, the transport asked for. */
void tally__boot_env_knobs(const tally_config *cfg, tally__boot_env *env);
/* The parsers the config's reader and checks share, with parse.c's message shape naming `name` (the
 * variable, or the field): "host:port" or "[v6]:port" into host (cap bytes) and port; an address
 * without a port ("[v6]" unbracketed) into out; a host name of 1-63 letters, digits, '.', '-', '_'.
 * 0 or TALLY_E_INVALID. */
int tally__boot_parse_addr(const char *name, const char *val, char *host, size_t cap, int *port);
int tally__boot_parse_bind(const char *name, const char *val, char *out, size_t cap);
int tally__boot_check_host_name(const char *name, const char *s);

/* One entry per rank, the same table on every rank after tally__boot_init. */
typedef struct tally__peer {
    int pid;
    uint64_t hostid; /* equal for processes on the same host (hostname, boot id, network namespace; or TALLY_HOST) */
    char ip[64];     /* numeric address this rank reaches rank 0 from (where its listeners bind) */
    char hostname[64];
    uint32_t job; /* rank 0's entry: a number it drew at random for this rendezvous, which tells this job
                   * from an earlier one of the same host and pid (the flight records carry it); 0 in others */
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
/* Each rank's host index (hosts numbered in order of their first rank) into host[size] and its index
 * among its host's ranks into local[size] (hosts.c); returns the number of hosts, -1 out of memory. */
int tally__hosts_of(const tally__peer *p, int size, int *host, int *local);
/* This kernel's boot id (/proc/sys/kernel/random/boot_id, "" when unreadable): one per running kernel,
 * shared by its containers and network namespaces. */
void tally__boot_kernel_id(char *id, size_t n);
/* 1 if every rank reported the same hostid. */
int tally__boot_single_host(const tally__boot *b);
/* The token, for the transports' own authenticated handshakes. */
const void *tally__boot_token(const tally__boot *b, size_t *len);

/* Bootstrap collectives over the control star (slow; for setup only, before the monitor starts). */
int tally__boot_bcast(tally__boot *b, void *buf, size_t len, int root);
int tally__boot_allgather(tally__boot *b, const void *mine, void *all, size_t len);
int tally__boot_barrier(tally__boot *b);

/* Setup steps outside the bootstrap collectives (the tcp mesh) must still hear that another rank failed
 * its setup: a rank that fails while in the setup phase reports it (fault->propagate, or tell_setup_failure
 * where a fault was recorded before) as a setup failure, which rank 0 relays. The watch puts the control
 * connections in the step's poll set and looks at what arrived without taking any frame a later step reads.
 * watch_max: pollfds fill may add; fill returns how many it added. check returns 0, or the code of a setup
 * failure reported meanwhile (in this thread's message), or TALLY_E_PEER_LOST when a rank died; other faults
 * are recorded and left for the first collective. failed_elsewhere: check ended this rank's setup.
 * b may be NULL (a transport made without the boot layer). */
void tally__boot_setup_phase(tally__boot *b, int on);
void tally__boot_tell_setup_failure(tally__boot *b, int code, const char *msg);
int tally__boot_watch_max(const tally__boot *b);
int tally__boot_watch_fill(const tally__boot *b, struct pollfd *pfd);
int tally__boot_watch_check(tally__boot *b);
int tally__boot_setup_failed_elsewhere(const tally__boot *b);
/* Rank 0, after its own part of such a step: waits (watching, so it relays what fails meanwhile) until
 * every other rank has sent its next bootstrap frame, i.e. finished the step or reported why not. The
 * bootstrap collective that follows then reads them without waiting on one rank while another fails.
 * 0, a setup failure's code, or TALLY_E_TIMEOUT past the deadline (raised, naming the rank). Others: 0. */
int tally__boot_watch_all_done(tally__boot *b, uint64_t deadline);

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
#define TALLY__AUTH_IN    32 /* connector's nonce */
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

/* The connector's side in steps, for a dialer that waits on more than its own socket: send a->nonce;
 * read TALLY__AUTH_REPLY bytes and call answer (1: the acceptor proved the token; 0: it did not, and
 * a->proof is zeros so it learns nothing it could replay; TALLY_E_SYSTEM: HMAC failed); send a->proof;
 * when the acceptor proved itself, read the verdict byte (1 accepted). tally__auth_connect is these. */
typedef struct tally__auth_con {
    unsigned char nonce[TALLY__AUTH_IN];
    unsigned char proof[TALLY__AUTH_PROOF];
} tally__auth_con;
int tally__auth_connect_begin(tally__auth_con *a); /* 0, or TALLY_E_SYSTEM when RAND_bytes failed */
int tally__auth_connect_answer(tally__auth_con *a, const void *token, size_t token_len, const char *role,
                               const unsigned char reply[TALLY__AUTH_REPLY]);

#endif
