/* ps.h - the parameter server of asynchronous training (stale synchronous parallel): its wire frames,
 * the server that holds the master parameters and optimizer state, and the worker's side of it. */
#ifndef TALLY_PS_PS_H
#define TALLY_PS_PS_H

#include <stddef.h>
#include <stdint.h>
#include <tally.h>
#include <tally/optim.h>

/* ---- frames (ps_wire.c) ----
 * Header, 32 bytes, network byte order: magic u32 | type u32 | rank i32 | aux u32 | clock u64 |
 * len u32 | 0 u32, then len payload bytes (floats in the host's byte order, as the collectives send
 * them: every rank of a job runs on the same architecture). rank is the sender's worker index (the
 * server sends -1); aux is the staleness of a PARAMS answer. */
#define TALLY__PS_MAGIC 0x544c5950u /* "TLYP" */
#define TALLY__PS_HDR   32
enum {
    TALLY__PS_HELLO = 1, /* worker -> server after authentication: its worker index; len 0 */
    TALLY__PS_PULL,      /* worker -> server: "I am about to compute step `clock`"; len 0 */
    TALLY__PS_PARAMS,    /* server -> worker: the parameters, once the bound allows; len = 4 * nparams */
    TALLY__PS_PUSH,      /* worker -> server: the mean gradient of step `clock`; len = 4 * nparams */
    TALLY__PS_BYE,       /* worker -> server: done after `clock` steps; len 0 */
    TALLY__PS_STOP,      /* server -> worker, answering a pull: the shared budget is spent; len 0 */
    TALLY__PS_TYPE_MAX
};

typedef struct tally__ps_hdr {
    int type, rank;
    uint32_t aux;
    uint64_t clock;
    uint32_t len;
} tally__ps_hdr;

/* One whole frame; payload may be NULL when len is 0. Bounded by the deadline (tally__now_ns units).
 * Returns 0 or a net.h code (no message set: the caller names the peer). */
int tally__ps_send(int fd, const tally__ps_hdr *h, const void *payload, uint64_t deadline);
/* Reads a header and checks it: magic, type, the reserved word, and len against what the type must
 * carry for a model of nparams (checked before any payload is read or allocated). TALLY_E_PROTOCOL
 * (with *why saying what was wrong) or a net.h code. */
int tally__ps_recv_hdr(int fd, size_t nparams, tally__ps_hdr *h, uint64_t deadline, const char **why);
/* "pull", "push", ... for messages. */
const char *tally__ps_type_name(int type);

/* ---- the server (ps_server.c) ---- */

/* AUTO is the trainer's choice, made before a server starts (none where the rate decays, which lowers
 * it already, inverse at a constant rate); a server is given NONE or INVERSE. */
typedef enum { TALLY__STALE_LR_NONE, TALLY__STALE_LR_INVERSE, TALLY__STALE_LR_AUTO } tally__stale_lr;
const char *tally__stale_lr_name(tally__stale_lr s); /* "none" / "inverse" / "auto" */
int tally__stale_lr_parse(const char *name);         /* -1 when unknown */

/* --mode async: workers push gradients to a parameter server instead of allreducing them. */
typedef struct tally__async_cfg {
    int enabled;      /* --mode async (rank 0 serves) */
    long staleness;   /* SSP bound S >= 0: no worker more than S steps ahead of the slowest */
    int stale_lr;     /* tally__stale_lr: how a stale gradient's lr is damped (default AUTO) */
    int ps_dedicated; /* --ps: rank 0 only serves; ranks 1..N-1 are the workers */
    int shared_quota; /* the run's steps x workers gradients are shared out to whoever is ready (a
                              * fast worker computes more), not steps to each worker */
} tally__async_cfg;

#define TALLY__PS_STALE_BINS 64 /* histogram bins 0..62 exact; the last counts 63 and more */

typedef struct tally__ps_cfg {
    int nworkers;
    int rank_base;  /* job rank of worker 0 (1 when rank 0 only serves), for messages */
    long staleness; /* S: a worker computes step c only once every worker has pushed c - S */
    tally__stale_lr stale_lr;
    size_t nparams;
    const float *init; /* the initial parameters (copied) */
    tally_optim_cfg optim;
    tally_lr_schedule sched; /* the rate of a gradient computed at step c is sched's at c */
    const void *token;       /* the job token each worker proves (HMAC challenge, role "ps") */
    size_t token_len;
    const char *host; /* the address to listen on (an ephemeral port) */
    double timeout_s; /* the longest any one wait for a worker may take */
    long budget;      /* > 0: answer this many pulls in all, whoever asks, then STOP every one */
} tally__ps_cfg;

typedef struct tally__ps_stats {
    long pushes;                     /* complete gradients applied */
    long updates;                    /* optimizer steps taken (S = 0: one per round of pushes) */
    long hist[TALLY__PS_STALE_BINS]; /* staleness of every applied gradient */
    long max_staleness;
    long pulls, pulls_waited; /* pulls, and those the bound held back */
    double wait_s;            /* what the held-back pulls waited, summed over workers */
    int dead_rank;            /* job rank of a worker that died (-1: none) */
    long dead_clock;          /* the gradients it had pushed */
} tally__ps_stats;

typedef struct tally__ps_server tally__ps_server;

/* Allocates the server and listens; tally__ps_server_port says where. */
int tally__ps_server_create(tally__ps_server **out, const tally__ps_cfg *cfg);
int tally__ps_server_port(const tally__ps_server *s);
/* Serves until every worker has said goodbye or died. A worker that dies (closes without BYE, or
 * sends part of a frame) is logged with its rank and clock, never has a partial gradient applied, and
 * stops holding the others back; the run then returns TALLY_E_PEER_LOST naming it. */
int tally__ps_server_run(tally__ps_server *s);
/* The same on a thread of its own; join returns run's result and sets its message on this thread. */
int tally__ps_server_start(tally__ps_server *s);
int tally__ps_server_join(tally__ps_server *s);
const float *tally__ps_server_params(const tally__ps_server *s);
const tally__ps_stats *tally__ps_server_stats(const tally__ps_server *s);
void tally__ps_server_free(tally__ps_server *s);

/* ---- a worker's connection (ps_worker.c) ---- */

typedef struct tally__ps_worker {
    int fd;
    int worker, rank; /* index among the workers, and job rank */
    size_t nparams;
    double timeout_s;
    double wait_s; /* time spent in pulls (waiting for the bound, and the transfer) */
} tally__ps_worker;

/* Connects to the server at host:port, proves the token and says which worker this is. */
int tally__ps_worker_connect(tally__ps_worker *w, const char *host, int port, const void *token, size_t token_len,
                             int worker, int rank, size_t nparams, double timeout_s);
/* Asks for the parameters to compute step `clock` with; blocks until the bound allows (at most the
 * timeout). *staleness: how many steps behind this worker the slowest one was. Returns
 * TALLY__PS_STOPPED instead when the server's shared budget of steps is spent. */
#define TALLY__PS_STOPPED 1
int tally__ps_worker_pull(tally__ps_worker *w, long clock, float *params, long *staleness);
int tally__ps_worker_push(tally__ps_worker *w, long clock, const float *grads);
int tally__ps_worker_bye(tally__ps_worker *w, long clock);
void tally__ps_worker_close(tally__ps_worker *w);

#endif
