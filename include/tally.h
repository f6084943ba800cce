/* tally.h - public API of the tally communicator: collectives over shared memory and TCP.
 * Every fallible call returns 0 or a negative TALLY_E_* code; tally_last_error() says more. */
#ifndef TALLY_H
#define TALLY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TALLY_VERSION_MAJOR 0
#define TALLY_VERSION_MINOR 1
#define TALLY_VERSION_PATCH 0

#if defined(__GNUC__)
#define TALLY_API __attribute__((visibility("default")))
#else
#define TALLY_API
#endif

typedef struct tally_comm tally_comm; /* opaque */

/* Element types. New ones are added at the end, so a value keeps its meaning across versions. BOOL is one
 * byte holding 0 or 1 (as C's bool and torch.bool). */
typedef enum {
    TALLY_F32,
    TALLY_F64,
    TALLY_F16,
    TALLY_BF16,
    TALLY_I32,
    TALLY_I64,
    TALLY_U8,
    TALLY_I8,
    TALLY_I16,
    TALLY_BOOL
} tally_dtype;
/* Reductions. AVG is SUM divided by the ranks (integers: truncating). BAND, BOR and BXOR are bitwise and
 * take the integer types and BOOL only (TALLY_E_INVALID for a floating type). On BOOL, SUM, MAX and BOR are
 * a logical or, PROD, MIN and BAND a logical and, BXOR an exclusive or; AVG takes no BOOL. */
typedef enum { TALLY_SUM, TALLY_AVG, TALLY_PROD, TALLY_MIN, TALLY_MAX, TALLY_BAND, TALLY_BOR, TALLY_BXOR } tally_op;

#define TALLY_DTYPE_COUNT 10
#define TALLY_OP_COUNT    8

/* One table makes the error enum and its strings (as libuv's UV_ERRNO_MAP). */
#define TALLY_ERRNO_MAP(X)                                                                                             \
    X(INVALID, -1, "invalid argument")                                                                                 \
    X(NOMEM, -2, "out of memory")                                                                                      \
    X(SYSTEM, -3, "system call failed")                                                                                \
    X(TIMEOUT, -4, "timed out waiting for a peer")                                                                     \
    X(PEER_LOST, -5, "a peer process died or closed its connection")                                                   \
    X(MISMATCH, -6, "ranks called different collectives, counts, dtypes, ops or roots")                                \
    X(AUTH, -7, "peer authentication failed (wrong TALLY_TOKEN?)")                                                     \
    X(PROTOCOL, -8, "malformed or unexpected message from a peer")                                                     \
    X(BOOT, -9, "rendezvous failed: rank, world size or address missing or inconsistent")                              \
    X(ABORTED, -10, "the communicator was aborted")                                                                    \
    X(UNSUPPORTED, -11, "not supported on this system or build")                                                       \
    X(CORRUPT, -12, "data failed an integrity check (checksum, or replicas that diverged)")                            \
    X(NONFINITE, -13, "a value became NaN or Inf")

typedef enum {
    TALLY_OK = 0,
#define TALLY__ERR_ENUM(name, code, text) TALLY_E_##name = (code),
    TALLY_ERRNO_MAP(TALLY__ERR_ENUM)
#undef TALLY__ERR_ENUM
} tally_err;

/* ---- Configuration (as NCCL's ncclConfig_t): what a communicator is made with ----------------------
 * Start from TALLY_CONFIG_INIT (the defaults, without the environment) or from tally_config_from_env
 * (the defaults, then every TALLY_* variable set), change what you like, and pass it to
 * tally_comm_init_config, which copies it (strings too) and checks every field once, naming the field.
 * docs/config.md lists every field with its variable, range, default and meaning.
 * The struct may grow: struct_size and version tell the library which fields the caller knows, so a
 * program built against an older tally.h keeps working (fields it does not know take their defaults).
 * Process-wide (one per process, not per communicator): log_level, log_fn, log_user and isa are taken
 * from the config of a communicator made while no other one lives (the first one, normally); a split
 * inherits its parent's whole config. */
#define TALLY_CONFIG_VERSION 1

typedef enum { TALLY_TRANSPORT_AUTO, TALLY_TRANSPORT_SHM, TALLY_TRANSPORT_TCP } tally_transport;
typedef enum { TALLY_ISA_AUTO, TALLY_ISA_SCALAR, TALLY_ISA_AVX2, TALLY_ISA_AVX512 } tally_isa;
/* The level a log line is given at: errors and warnings always, decisions at log_level 1, details at 2. */
typedef enum {
    TALLY_LOG_ERROR = -2,
    TALLY_LOG_WARNING = -1,
    TALLY_LOG_DEBUG = 1,
    TALLY_LOG_VERBOSE = 2
} tally_log_kind;
/* Receives each log line (one line, no newline, "tally[rank N] debug: ..."), one call at a time, on
 * whichever thread logged it; it must not call tally. */
typedef void (*tally_log_fn)(void *user, int level, const char *line);

/* The defaults, each written once: TALLY_CONFIG_INIT and tally_config_from_env take them from here. */
#define TALLY_DEFAULT_TIMEOUT      300.0  /* seconds a collective waits for a peer */
#define TALLY_DEFAULT_TCP_STREAMS  1      /* tcp connections per pair of ranks on two hosts */
#define TALLY_DEFAULT_SHM_LARGE    (-1LL) /* TALLY_SHM_LARGE_AUTO */
#define TALLY_DEFAULT_SHM_CMA      1      /* large shm messages read with process_vm_readv */
#define TALLY_DEFAULT_FLIGHT_DEPTH 256    /* collectives each communicator's flight recorder keeps */
#define TALLY_DEFAULT_TRACE_EVENTS 262144 /* timeline spans each process keeps */
#define TALLY_SHM_LARGE_AUTO       (-1LL) /* shm_large: calibration decides */
#define TALLY_SHM_LARGE_OFF        0LL    /* shm_large: every message through the slots */

typedef struct tally_config {
    size_t struct_size; /* sizeof(tally_config) where the caller was built: TALLY_CONFIG_INIT sets it */
    int version;        /* TALLY_CONFIG_VERSION likewise */
    /* Who and where (TALLY_RANK, TALLY_WORLD_SIZE, TALLY_ADDR, TALLY_TOKEN, TALLY_BIND, TALLY_HOST) */
    int rank;          /* 0..size-1; -1: not given */
    int size;          /* ranks, 1..4096; 0: not given */
    char address[272]; /* "host:port" or "[v6]:port" where rank 0 listens for the rendezvous ("": none) */
    char token[256];   /* shared secret every rank proves it knows ("": none; size 1 needs none) */
    char bind[256];    /* where rank 0 listens instead of address's host, no port ("": the host itself) */
    char host[64];     /* this host's name: ranks with the same one are one host ("": kernel and netns) */
    /* Time limits (TALLY_TIMEOUT, TALLY_BOOT_TIMEOUT) */
    double timeout;      /* seconds a collective may wait for a peer, (0, 1e6] */
    double boot_timeout; /* seconds the rendezvous may take, (0, 1e6]; 0: timeout */
    /* How (TALLY_TRANSPORT, TALLY_ALGO, TALLY_TCP_STREAMS, TALLY_SHM_LARGE, TALLY_SHM_CMA, TALLY_COST, TALLY_ISA) */
    int transport;       /* tally_transport */
    char algo[32];       /* "auto" (or ""), "ring", "tree", "rhd", "direct", "hier" */
    int tcp_streams;     /* 1..16 */
    long long shm_large; /* bytes from which shm messages go single-copy, up to 1 TiB; TALLY_SHM_LARGE_* */
    int shm_cma;         /* 0 or 1 */
    /* The cost model's alpha in microseconds (>= 0), link and reduction speeds in GB/s (> 0), given
     * instead of measured at init; all three 0: measured. */
    double cost_alpha_us, cost_beta_gbps, cost_gamma_gbps;
    int isa; /* tally_isa: at most this instruction set for reductions (process-wide) */
    /* Diagnostics (TALLY_DEBUG, TALLY_FLIGHT, TALLY_FLIGHT_DIR, TALLY_TRACE, TALLY_TRACE_EVENTS) */
    int log_level;         /* 0 quiet, 1 decisions, 2 details (process-wide) */
    tally_log_fn log_fn;   /* NULL: stderr (process-wide) */
    void *log_user;        /* log_fn's first argument */
    int flight_depth;      /* collectives the flight recorder keeps, 0..65536 (0: none) */
    char flight_dir[449];  /* where it writes ("": $TMPDIR or /tmp, tally-flight-<host>-<pid of rank 0>) */
    char trace_file[1024]; /* the timeline rank 0 writes ("": none) */
    int trace_events;      /* spans each process keeps, 1024..67108864 */
    /* Where rank, size, address and token came from, for messages: tally_config_from_env writes "TALLY" or
     * the launcher's name ("Open MPI", "PMI", "Slurm", "torchrun"); "" is the caller. token_derived: 1 when
     * the token was derived from the launcher's job id (no TALLY_TOKEN), which is not a secret. */
    char source[16];
    int token_derived;
} tally_config;

/* Every field in order, for C and C++ alike. */
#define TALLY_CONFIG_INIT                                                                                              \
    {                                                                                                                  \
        sizeof(tally_config), TALLY_CONFIG_VERSION, -1, 0, "", "", "", "", TALLY_DEFAULT_TIMEOUT, 0.0,                 \
            TALLY_TRANSPORT_AUTO, "auto", TALLY_DEFAULT_TCP_STREAMS, TALLY_DEFAULT_SHM_LARGE, TALLY_DEFAULT_SHM_CMA,   \
            0.0, 0.0, 0.0, TALLY_ISA_AUTO, 0, 0, 0, TALLY_DEFAULT_FLIGHT_DEPTH, "", "", TALLY_DEFAULT_TRACE_EVENTS,    \
            "", 0                                                                                                      \
    }

/* Sets *cfg to the defaults and then to what the environment says: each TALLY_* variable that is set,
 * parsed strictly, and, when TALLY_RANK and TALLY_WORLD_SIZE are absent, the launcher's variables (Open
 * MPI, PMI, Slurm, torchrun: rank, size, address and a token derived from the job id). What the
 * environment does not give keeps its default (rank -1, size 0: tally_comm_init_config then says what is
 * missing). cfg->struct_size and version must be set (start from TALLY_CONFIG_INIT). The only place the
 * library reads the environment. 0, TALLY_E_INVALID naming the variable that is set to what it does not
 * take, or TALLY_E_BOOT when half of a pair is set (TALLY_RANK without TALLY_WORLD_SIZE). */
TALLY_API int tally_config_from_env(tally_config *cfg);

/* Communicator lifetime. tally_comm_init_config makes the world communicator *cfg describes (checked
 * first: TALLY_E_INVALID naming the field; TALLY_E_BOOT when rank, size, address or token is missing);
 * tally_comm_init is tally_config_from_env then tally_comm_init_config: rank, size, address and token
 * from the environment (TALLY_*, or Open MPI / PMI / Slurm / torchrun variables). Collective over all
 * ranks. */
TALLY_API int tally_comm_init_config(tally_comm **comm, const tally_config *cfg);
TALLY_API int tally_comm_init(tally_comm **comm);
/* A communicator, its requests and its buffers belong to the process that made them. After fork() the
 * child inherits them, but not the threads that run them, and their connections and shared memory are
 * the parent's: every call the child makes on them (collectives, point-to-point, requests, tally_mem_*,
 * split, even tally_comm_free and _abort) returns TALLY_E_INVALID at once, "communicator made in process
 * P, used in process Q: a forked child must make its own communicator", and touches nothing the parent
 * uses, so the parent's communicator goes on as before. The child may simply drop them (and exit, or
 * exec); it may make a communicator of its own. tally_comm_rank, _size and _transport still answer. */
TALLY_API int tally_comm_rank(const tally_comm *comm);
TALLY_API int tally_comm_size(const tally_comm *comm);
TALLY_API int tally_comm_free(tally_comm *comm);

/* Splits comm as MPI_Comm_split does (and ncclCommSplit): the ranks that pass the same color form a new
 * communicator, ranked by key, ties broken by their rank in comm; a rank passing TALLY_COLOR_NONE (any
 * negative color) joins none and gets *newcomm = NULL. Collective over comm: every rank of comm calls
 * it, in the same order among comm's collectives. Each new communicator has its own rendezvous,
 * connections and transport (shm when its ranks share a host), its own fingerprints, timeouts and abort,
 * and lives on after comm is freed; its error messages name each rank it mentions by its rank in the
 * world as well ("rank 1 (world rank 3)"). Free it with tally_comm_free. */
#define TALLY_COLOR_NONE (-1)
TALLY_API int tally_comm_split(tally_comm *comm, int color, int key, tally_comm **newcomm);
/* tally_comm_split by host (color: the host's index among comm's hosts, key: the rank in comm): the
 * ranks of this rank's host (a host as tally tells them apart: TALLY_HOST, else kernel and network
 * namespace). */
TALLY_API int tally_comm_split_host(tally_comm *comm, tally_comm **newcomm);

/* Aborts the communicator, as ncclCommAbort does: for a program that gave up on a collective (a peer is
 * hung, dead or silent) and wants its thread back and a fresh communicator. Callable from any thread,
 * also while another thread is blocked in a collective on comm.
 * - A call in flight on comm (blocked or not) returns TALLY_E_ABORTED within milliseconds, unless it had
 *   already failed or completed: then it keeps that result. A call must not start once abort has been
 *   called: it may find comm freed.
 * - The peers are told: their collectives on this communicator fail with TALLY_E_ABORTED naming this
 *   rank (TALLY_E_PEER_LOST naming it if that report cannot reach them, e.g. while rank 0 is hung),
 *   not after TALLY_TIMEOUT. Each must then free its communicator.
 * - comm is freed, like tally_comm_free but without the goodbyes that wait on peers: connections,
 *   shared memory, the monitor thread and tally_mem_alloc buffers are released, and abort returns
 *   within about a second whatever the peers do (it waits up to 0.9 s for the calls in flight to
 *   leave, which takes milliseconds; one still inside then would release them as it leaves). comm is
 *   invalid on every thread once abort returns: the thread whose call returned TALLY_E_ABORTED must
 *   not free it.
 * - tally_comm_init may be called again at once (the peers too, after freeing theirs) for a new
 *   communicator; the environment may name a new TALLY_ADDR.
 * Returns 0 (TALLY_E_INVALID, and nothing done, in a forked child); comm NULL is a no-op. Call it once per
 * communicator. */
TALLY_API int tally_comm_abort(tally_comm *comm);

/* Collectives. send == recv means in place; count 0 is valid; counts need not divide by the size.
 * reduce_scatter: send holds size*recvcount elements, rank r receives the reduction of block r.
 * allgather: recv holds size*sendcount elements, rank-major.
 * Ranks that disagree on the collective, count, dtype, op or root (or one that skipped a call) get
 * TALLY_E_MISMATCH naming both calls, in that very call and on every rank: no call returns 0 unless every
 * rank made the same one, because every collective has each rank hear, directly or through others, from
 * every other before it returns. A broadcast, whose data flows one way, pays for this with ceil(log2 size)
 * rounds of empty messages (the binomial broadcast's data rides in them): its root waits for its peers as
 * long as a barrier takes instead of returning once its data is out. Not reported as a mismatch: a rank
 * that frees the communicator (or exits) instead of making the call its peers make; they get
 * TALLY_E_PEER_LOST naming it (on shm once its process has exited: TALLY_E_TIMEOUT if it lives on past
 * TALLY_TIMEOUT), and its own tally_comm_free returns 0, as it waits for nobody. Nor a
 * disagreement in which no message of one call ever reaches a rank making the other: it would end in
 * TALLY_E_TIMEOUT. Every pair of calls the tests try (each collective against each, roots, counts,
 * dtypes, ops, skipped calls, every algorithm, 2 to 4 ranks) has a message cross. On shm fingerprints are
 * compared as 64-bit hashes. After TALLY_E_MISMATCH, _PEER_LOST,
 * _TIMEOUT or _ABORTED the communicator is broken on every rank: only tally_comm_free may follow.
 * TALLY_E_TIMEOUT: a rank waited TALLY_TIMEOUT seconds for a peer. Its message names the rank that holds
 * the collective up (the one that waits for nobody at the end of the chain of waiting ranks, so every
 * rank names the same one), the collective and its sequence number (#N: the N-th collective on this
 * communicator). The fault reaches the other ranks at once: one that joined the collective later than
 * the first to wait may fail before its own TALLY_TIMEOUT has passed. A rank resumed after it was
 * stopped may complete the call its peers gave up on, if all it needed had arrived; its next call fails.
 * TALLY_E_PEER_LOST names the rank that died. */
TALLY_API int tally_allreduce(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op);
TALLY_API int tally_reduce_scatter(tally_comm *c, const void *send, void *recv, size_t recvcount, tally_dtype t,
                                   tally_op op);
TALLY_API int tally_allgather(tally_comm *c, const void *send, void *recv, size_t sendcount, tally_dtype t);
TALLY_API int tally_broadcast(tally_comm *c, void *buf, size_t count, tally_dtype t, int root);
TALLY_API int tally_barrier(tally_comm *c);

/* Rooted collectives and all-to-all, under the same rules (every rank calls, fingerprints, timeouts).
 * reduce: root receives in recv the reduction of every rank's send (count elements); recv is read only
 * on root (NULL elsewhere); in place on root when send == recv.
 * gather: root receives in recv size*sendcount elements, rank-major; recv is read only on root.
 * scatter: root's send holds size*recvcount elements, block r going to rank r; send is read only on root.
 * alltoall: send and recv hold size*count elements; block j of send goes to rank j, where it lands as
 * block i (this rank's) of recv. In place when send == recv.
 * alltoallv: sendcounts[j] elements from send + sdispls[j] go to rank j; recvcounts[i] elements from rank
 * i land at recv + rdispls[i] (counts and displacements in elements, arrays of size entries, as
 * MPI_Alltoallv). sendcounts[j] on rank i must equal recvcounts[i] on rank j: else TALLY_E_MISMATCH
 * naming both ranks. send and recv must not overlap. */
TALLY_API int tally_reduce(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op,
                           int root);
TALLY_API int tally_gather(tally_comm *c, const void *send, void *recv, size_t sendcount, tally_dtype t, int root);
TALLY_API int tally_scatter(tally_comm *c, const void *send, void *recv, size_t recvcount, tally_dtype t, int root);
TALLY_API int tally_alltoall(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t);
TALLY_API int tally_alltoallv(tally_comm *c, const void *send, const size_t *sendcounts, const size_t *sdispls,
                              void *recv, const size_t *recvcounts, const size_t *rdispls, tally_dtype t);

/* Point-to-point messages, as MPI_Send/MPI_Recv: between two ranks only, outside the collectives' order
 * (a rank's sends and receives do not wait for its or its peers' collectives, nor they for them). A
 * message carries a tag (0 .. TALLY_TAG_MAX) and its dtype and count; a receive takes the first message
 * from src (TALLY_ANY_SOURCE: from any rank) with its tag, and messages from one rank with one tag arrive
 * in the order they were sent. Its count and dtype must be the message's: else TALLY_E_MISMATCH naming
 * both ranks. A send returns (its request is done) once buf may be reused: the message is on its way or
 * arrived, whether or not the receiver has asked for it yet. A receive waits at most the communicator's
 * timeout (TALLY_E_TIMEOUT naming the rank it waits for); a peer that dies fails it with
 * TALLY_E_PEER_LOST naming the rank. from (may be NULL) receives the sender's rank.
 * A rank may send to itself. Bad arguments (a rank out of range, a negative tag, buf NULL with count > 0)
 * are TALLY_E_INVALID at once (tally_isend and tally_irecv then make no request). A rank's point-to-point
 * starts with its first such call on the communicator: a send to a rank that has made none waits for it,
 * at most the timeout. A failure of the communicator (a dead rank, a failed collective, an abort) fails
 * every pending request; a receive's timeout or mismatch leaves the communicator usable.
 * tally_comm_free completes the pending sends and fails the pending receives (TALLY_E_ABORTED). */
#define TALLY_ANY_SOURCE (-1)
#define TALLY_TAG_MAX    0x7fffffff
TALLY_API int tally_send(tally_comm *c, const void *buf, size_t count, tally_dtype t, int dst, int tag);
TALLY_API int tally_recv(tally_comm *c, void *buf, size_t count, tally_dtype t, int src, int tag, int *from);

/* Non-blocking collectives (as MPI_Iallreduce, or NCCL's calls on a stream). Each returns at once with a
 * request in *req; the communicator's communication thread (started by the first such call) runs the
 * requests one at a time in the order they were posted, so every rank must post the same sequence, as
 * with blocking calls, and a blocking call made while requests are pending runs after them. Buffers
 * must stay valid, and unchanged where they are read, until the request is done. Everything a blocking
 * call can fail with (bad arguments included) is the request's result, returned by tally_wait.
 * tally_comm_free first completes the pending requests; tally_comm_abort fails them (TALLY_E_ABORTED). */
typedef struct tally_request tally_request;
TALLY_API int tally_iallreduce(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op,
                               tally_request **req);
TALLY_API int tally_ireduce_scatter(tally_comm *c, const void *send, void *recv, size_t recvcount, tally_dtype t,
                                    tally_op op, tally_request **req);
TALLY_API int tally_iallgather(tally_comm *c, const void *send, void *recv, size_t sendcount, tally_dtype t,
                               tally_request **req);
TALLY_API int tally_ibroadcast(tally_comm *c, void *buf, size_t count, tally_dtype t, int root, tally_request **req);
TALLY_API int tally_ibarrier(tally_comm *c, tally_request **req);
TALLY_API int tally_ireduce(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t, tally_op op,
                            int root, tally_request **req);
TALLY_API int tally_igather(tally_comm *c, const void *send, void *recv, size_t sendcount, tally_dtype t, int root,
                            tally_request **req);
TALLY_API int tally_iscatter(tally_comm *c, const void *send, void *recv, size_t recvcount, tally_dtype t, int root,
                             tally_request **req);
TALLY_API int tally_ialltoall(tally_comm *c, const void *send, void *recv, size_t count, tally_dtype t,
                              tally_request **req);
/* The four arrays are copied: they may change once the call returns (the buffers may not). */
TALLY_API int tally_ialltoallv(tally_comm *c, const void *send, const size_t *sendcounts, const size_t *sdispls,
                               void *recv, const size_t *recvcounts, const size_t *rdispls, tally_dtype t,
                               tally_request **req);
/* Point-to-point requests stand outside the queue above: they complete in whatever order their messages
 * allow, while collectives run (tally_wait, _test, _on_done and _free take them alike). */
TALLY_API int tally_isend(tally_comm *c, const void *buf, size_t count, tally_dtype t, int dst, int tag,
                          tally_request **req);
TALLY_API int tally_irecv(tally_comm *c, void *buf, size_t count, tally_dtype t, int src, int tag, tally_request **req);
/* Blocks until req is done; returns its result (0 or a TALLY_E_* code, with tally_last_error set to its
 * message). A waiter may run queued requests itself when the thread has not started them. The request
 * stays valid (wait again, or free it). */
TALLY_API int tally_wait(tally_request *req);
/* *done = 1 and req's result once it is done; *done = 0 and 0 before. */
TALLY_API int tally_test(tally_request *req, int *done);
/* tally_wait bounded: waits at most timeout_s seconds (>= 0; 0 is tally_test) for req, then answers as
 * tally_test does. It never runs req on this thread as tally_wait may (the communication thread runs it),
 * so it returns on time whatever the peers do: for a caller that needs its thread back now and then, as
 * Python's blocking calls do to run its signal handlers (Ctrl-C) while a peer keeps them waiting. */
TALLY_API int tally_wait_for(tally_request *req, double timeout_s, int *done);
/* Calls fn(arg, rc, msg) once req is done: on the thread that completed it (the communication thread, or
 * a waiter), before tally_wait returns; or at once on this thread when it already is done. One
 * callback per request. fn must not block on, free or abort the communicator. */
TALLY_API int tally_request_on_done(tally_request *req, void (*fn)(void *arg, int rc, const char *msg), void *arg);
/* The rank a done receive (tally_irecv) got its message from; -1 for another request or one not done. */
TALLY_API int tally_request_source(const tally_request *req);
/* Frees req; NULL is a no-op. A request still pending is freed once it completes (as MPI_Request_free):
 * it still runs, and its callback is still called, but nobody may wait on it any more. A done request
 * may outlive its communicator. */
TALLY_API int tally_request_free(tally_request *req);

/* Memory for collective buffers that the other ranks on this host read in place: on shm a large
 * message from it costs one copy and no system call. 64-byte aligned; usable with every collective
 * like any other memory (plain memory on tcp and self). NULL on failure (see tally_last_error).
 * tally_mem_free accepts NULL and returns TALLY_E_INVALID for a pointer tally_mem_alloc did not return
 * on this communicator; tally_comm_free releases whatever is still allocated. */
TALLY_API void *tally_mem_alloc(tally_comm *comm, size_t bytes);
TALLY_API int tally_mem_free(tally_comm *comm, void *ptr);
/* Keeps ptr (from tally_mem_alloc on comm) past the communicator: tally_comm_free and tally_comm_abort
 * leave it allocated, plain memory from then on, and tally_mem_release(ptr) releases it once comm is gone
 * (tally_mem_free while comm lives). For bindings whose arrays may outlive their communicator (Python's).
 * TALLY_E_INVALID for a pointer tally_mem_alloc did not return on comm. */
TALLY_API int tally_mem_keep(tally_comm *comm, void *ptr);
/* Releases a buffer tally_mem_keep kept past its freed communicator; NULL is a no-op, any other pointer
 * (one whose communicator still lives included) TALLY_E_INVALID. */
TALLY_API int tally_mem_release(void *ptr);

/* Short description of an error code. */
TALLY_API const char *tally_strerror(int err);

/* The detailed message of the last failed call on this thread (which rank, which collective, what
 * to do), or "" when the last call succeeded: each fallible call clears it on entry, except the teardown calls
 * (tally_comm_free, tally_mem_free), which leave it as it was unless they fail themselves. */
TALLY_API const char *tally_last_error(void);

/* Name of the transport in use ("shm", "tcp" or "self") and of the algorithm the next allreduce of
 * `bytes` bytes would use; for logs and benchmarks. */
TALLY_API const char *tally_comm_transport(const tally_comm *comm);
TALLY_API const char *tally_comm_algo_for(const tally_comm *comm, size_t bytes);
/* What large messages do between this communicator's ranks on one host, in words, for summaries: which
 * buffers are read in place (those from tally_mem_alloc; others with process_vm_readv where permitted
 * and fast enough) and, where a path is off, what turned it off ("TALLY_SHM_CMA=0 on a rank", the
 * calibration's figures, ...). "" where the transport has no such choice (tcp, one rank). */
TALLY_API const char *tally_comm_large_path(const tally_comm *comm);
/* The smallest message the other ranks on this host read in place when it lies in tally_mem_alloc
 * memory; 0 where none is (tcp, self, several hosts, TALLY_SHM_LARGE=off, peers' buffers out of reach).
 * For bindings choosing where to stage (the PyTorch backend keeps its staging block there from this size). */
TALLY_API size_t tally_comm_mem_min(const tally_comm *comm);

/* Payload bytes this rank has sent to its peers in collectives since tally_comm_init (headers and the
 * set-up measurements not counted); sample it before and after to get the bytes of one step. Read it
 * from the thread that calls the collectives. */
TALLY_API unsigned long long tally_comm_bytes_sent(const tally_comm *comm);

/* Size in bytes of one element of a dtype, 0 for an invalid dtype. */
TALLY_API size_t tally_dtype_size(tally_dtype t);
/* Names as the CLI spells them ("f32", "sum"), and the reverse; parse returns -1 when unknown. */
TALLY_API const char *tally_dtype_name(tally_dtype t);
TALLY_API const char *tally_op_name(tally_op op);
TALLY_API int tally_dtype_parse(const char *name);
TALLY_API int tally_op_parse(const char *name);

#ifdef __cplusplus
}
#endif
#endif
