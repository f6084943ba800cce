/* po_int.h - what the post office's files share: the frames on its connections, a posted send or receive,
 * a message arriving or kept, the two ends of a connection, and the post office itself. */
#ifndef TALLY_P2P_PO_INT_H
#define TALLY_P2P_PO_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "p2p.h"

/* Wire (native byte order, as the tcp transport's: every rank of a job runs one build). A connection
 * carries one direction's messages: the dialer's to the acceptor. After the token's challenge/response
 * (auth.c, role "p2p") the dialer names itself (hello), the acceptor answers one byte (welcome: bit 0,
 * it reads our large payloads in place), then the dialer sends frames: a header, then `bytes` of payload
 * (none when CMA: the acceptor reads them from the sender's memory and answers with an ack). */
#define TALLY__PO_MAGIC_HELLO 0x48504154u /* "TAPH" */
#define TALLY__PO_MAGIC_MSG   0x4d504154u /* "TAPM" */
#define TALLY__PO_MAGIC_ACK   0x41504154u /* "TAPA" */
#define TALLY__PO_ROLE        "p2p"
#define TALLY__PO_CMA         1u /* header flag: the payload stays at the sender until acked */

typedef struct tally__po_hello {
    uint32_t magic, rank, size, pid;
    uint64_t pidns;             /* the dialer's pid namespace (its pid means something only in the same one) */
    uint64_t probe_addr, probe; /* a word of the dialer's memory and its value: can the acceptor read it? */
} tally__po_hello;
_Static_assert(sizeof(tally__po_hello) == 40, "the hello is sent as is");

typedef struct tally__po_hdr {
    uint32_t magic, flags;
    int32_t src, tag;
    uint32_t dtype, reserved;
    uint64_t count, bytes;
    uint64_t addr, id; /* CMA: the payload's address in the sender, and the id its ack names */
} tally__po_hdr;
_Static_assert(sizeof(tally__po_hdr) == 56, "the header is sent as is");

typedef struct tally__po_ack {
    uint32_t magic;
    int32_t rc; /* 0: read; else why the reader could not */
    uint64_t id;
} tally__po_ack;
_Static_assert(sizeof(tally__po_ack) == 16, "the ack is sent as is");

/* Payloads from this long on go CMA where the peer reads in place: below it the socket's two copies stay
 * in cache and cost less than the ack's round trip (1 MiB: 4.5-5.6 GB/s one-way through loopback against
 * 2.8-5.0 in place; 4 MiB: 4.8-5.4 against 4.9-7.4, bench/p2p_pingpong.c on the 2-core EPYC VM). */
#define TALLY__PO_CMA_MIN ((size_t)4 << 20)
/* How long an in-place message may wait at its sender for its receive before it is copied here: a
 * receive posted a moment after its message (a ping-pong's reply outrunning the ack of the ping) then
 * costs one copy, not two into fresh memory. */
#define TALLY__PO_CMA_GRACE_NS 2000000u
/* ... and longer for a larger one: 4 ns a byte (a 64 MiB message waits up to a quarter of a second).
 * Kept, it is read into fresh memory whose pages fault in: through PyTorch on the 2-core EPYC VM, a 64 MiB
 * ping-pong whose receiver was still making its tensor took 24 ms a message, against 8 ms read in place.
 * Two ranks that both send before they receive still finish, each message a grace later. */
#define TALLY__PO_CMA_GRACE_NS_PER_BYTE 4u
/* An in-place read this long or longer is split with the copier thread (po_cma.c): process_vm_readv pins
 * the sender's pages one by one and copies at about half the memory's speed, so two threads reading the
 * halves take about half the time (64 MiB from a peer's 4 KiB pages on the 2-core EPYC VM: 9 GB/s by one,
 * 14-18 GB/s by two). The hand-over costs a wake-up (tens of microseconds): a tenth of the smallest such
 * read's time at most. */
#define TALLY__PO_CMA_SPLIT_MIN TALLY__PO_CMA_MIN
/* Payloads past this are refused as malformed (the collectives' limit on counts, in bytes). */
#define TALLY__PO_MAX_BYTES ((uint64_t)1 << 50)

/* What a receiver makes of a header from rank src, before any payload (pure). */
enum {
    TALLY__PO_HDR_OK,
    TALLY__PO_HDR_BAD_MAGIC,
    TALLY__PO_HDR_BAD_SRC,
    TALLY__PO_HDR_BAD_TAG,
    TALLY__PO_HDR_BAD_DTYPE,
    TALLY__PO_HDR_BAD_LEN,
    TALLY__PO_HDR_BAD_CMA
};
int tally__po_hdr_judge(const tally__po_hdr *h, int src, int cma_ok);
const char *tally__po_hdr_why(int verdict);
/* Moves the rest of buf (*off of len done) over a non-blocking socket, out or in: 1 when all has, 0 when
 * the socket would block, TALLY_E_PEER_LOST at its end or a reset, TALLY_E_SYSTEM otherwise (errno kept). */
int tally__po_io(int fd, void *buf, size_t len, size_t *off, int out);

/* ---- requests and messages ---- */

typedef struct tally__po_msg tally__po_msg;

typedef struct tally__po_op {
    struct tally__po_op *next; /* in its queue */
    int is_recv;
    int peer; /* a send's destination; a receive's source, or TALLY_ANY_SOURCE */
    int tag;
    tally_dtype dtype;
    size_t count, bytes;
    const unsigned char *sbuf;
    unsigned char *rbuf;
    uint64_t deadline, id;
    tally__po_done_fn done;
    void *arg;
    tally__po_msg *msg; /* a receive's message, arriving into rbuf */
    tally__po_hdr hdr;  /* a send's header */
    size_t off;         /* a send's bytes of header and payload written */
    int acking;         /* a CMA send: written, its payload read by the peer until the ack */
    int rc, source;
    char why[768];
} tally__po_op;

struct tally__po_msg {
    tally__po_msg *next; /* in the queue of messages no receive has taken */
    int src, tag;
    tally_dtype dtype;
    size_t count, bytes, got;
    unsigned char *data; /* staging while no receive has it; grows as the payload arrives */
    size_t cap;
    tally__po_op *to; /* the receive it arrives into */
    int discard;      /* nobody wants the rest (a mismatch, or its receive timed out) */
    int complete;
    uint64_t addr, id; /* CMA: where the payload lies in the sender, and the ack's id */
    int cma;
    /* CMA, no receive yet: the payload is still at the sender, on connection `from`, until a receive
     * reads it straight into its buffer or, past `grace`, the thread keeps it (a sender never waits on
     * a receiver that has not asked) */
    int unread;
    struct tally__po_in *from;
    uint64_t grace;
};

/* ---- connections ---- */

enum { PO_IN_NONCE, PO_IN_REPLY, PO_IN_PROOF, PO_IN_VERDICT, PO_IN_HELLO, PO_IN_WELCOME, PO_IN_READY };

/* An accepted connection: a peer's messages to this rank. */
typedef struct tally__po_in {
    struct tally__po_in *next;
    int fd, state, rank; /* rank -1 until its hello */
    uint64_t auth_deadline;
    tally__auth_acc acc;
    unsigned char hs[64]; /* a handshake's bytes being read (hs_off of hs_len) or written */
    size_t hs_len, hs_off;
    tally__po_hdr hdr;
    size_t hdr_got;
    tally__po_msg *cur; /* the message whose payload comes next */
    int proved;         /* its proof of the token matched */
    int cma;            /* we read its large payloads in place */
    pid_t pid;
    tally__po_ack *acks; /* acks owed to the sender, sent in order */
    size_t n_acks, cap_acks, ack_off;
} tally__po_in;

enum {
    PO_OUT_IDLE,
    PO_OUT_CONNECTING,
    PO_OUT_NONCE,
    PO_OUT_REPLY,
    PO_OUT_PROOF,
    PO_OUT_VERDICT,
    PO_OUT_HELLO,
    PO_OUT_WELCOME,
    PO_OUT_READY,
    PO_OUT_BROKEN
};

/* This rank's connection to a peer: its messages to that peer. */
typedef struct tally__po_out {
    int fd, state;
    int dead_fd; /* a broken connection's socket, closed by the thread (a poster never closes one it polls) */
    tally__auth_con con;
    int proved;
    unsigned char hs[64];
    size_t hs_len, hs_off;
    tally__po_op *head, *tail; /* sends in order; the head is being written */
    tally__po_op *acking;      /* CMA sends written, waiting for their acks (in order) */
    tally__po_ack ack;         /* an ack being read */
    size_t ack_got;
    int cma;   /* the peer reads our large payloads in place */
    int err;   /* broken: the code later sends fail with, */
    char *why; /* and its message */
} tally__po_out;

/* ---- the copier: the second half of a large in-place read (po_cma.c) ---- */

typedef struct tally__po_copier {
    pthread_mutex_t mu; /* everything below */
    pthread_cond_t go, done;
    pthread_t th;
    int state; /* PO_COPIER_* */
    int stop;
    int busy; /* a part is posted and not read yet */
    pid_t pid;
    unsigned char *dst;
    uint64_t addr;
    size_t n;
    int err; /* the part's: 0, or the errno */
} tally__po_copier;
enum { PO_COPIER_UNTRIED, PO_COPIER_RUNNING, PO_COPIER_NONE };

/* ---- the post office ---- */

struct tally__po {
    int rank, size;
    struct tally__boot *boot;
    tally__fault *fault;
    double timeout_s;
    int cma_wanted;   /* the config lets large payloads be read in place (shm_cma) */
    uint64_t spin_ns; /* how long a driver polls without sleeping before it sleeps */
    int lfd, port;
    int32_t *ports; /* [size]: where each rank's post office listens */
    uint64_t pidns;
    uint64_t probe;     /* the word a peer reads to prove it can read our memory */
    pthread_mutex_t mu; /* everything below */
    pthread_t th;
    int started, stopping, draining, shut;
    int closed; /* no new posts: the code they fail with, and why */
    char closed_why[768];
    int wake_fd;
    int fault_seen;
    uint64_t poll_until;                /* when the thread's poll ends at the latest */
    tally__po_op *posted, *posted_tail; /* receives waiting for a message, in posting order */
    tally__po_msg *unx, *unx_tail;      /* messages no receive has taken, in order of arrival */
    tally__po_op *done, *done_tail;     /* finished: their callbacks run once mu is released */
    tally__po_in *ins;                  /* accepted connections */
    int n_ins;
    tally__po_in **in_of; /* [size]: where rank r's messages arrive */
    int *lost;            /* [size]: rank r's messages stopped (its connection ended): the code */
    char **lost_why;      /* [size]: and what the failure said, for receives posted after it (or NULL) */
    tally__po_out *out;   /* [size] */
    uint64_t next_id;
    uint64_t accept_pause_until; /* accept() found no descriptor: the listener rests a moment */
    struct pollfd *pfd;          /* the thread's poll set, */
    struct tally__po_slot *slot; /* what each entry is */
    size_t pfd_cap;
    unsigned char scratch[65536]; /* where discarded payloads are read */
    /* A thread waiting for a receive reads the peers' messages itself (po_drive.c), one such driver at a
     * time, beside the post office's thread: a message then wakes its waiter alone, not the thread that
     * would then wake the waiter. */
    _Atomic int driving;
    _Atomic int ins_masked; /* the thread's poll leaves the ready connections to the driver */
    int drive_fd;           /* eventfd the driver polls: poked when what it cannot see changes */
    uint64_t epoch;         /* bumped when a connection is freed or becomes ready: poll sets filled before are stale */
    pthread_cond_t drove;   /* the driver left (free waits for that) */
    struct pollfd *dpfd;    /* the driver's poll set: drive_fd, then the ready connections, */
    struct tally__po_in **din; /* which connection each entry is */
    tally__po_copier copier;
};

/* Wakes the thread from its poll (its poll set, or its next deadline, changed). */
static inline void tally__po_wake(tally__po *po) {
    if (po->wake_fd < 0) return;
    uint64_t one = 1;
    ssize_t w = write(po->wake_fd, &one, sizeof one);
    (void)w; /* a full eventfd is already awake */
}

/* This thread is a post office's driver (po_drive.c): it needs no poke of its own. */
extern _Thread_local int tally__po_driver_here;

/* Wakes the driver's poll: a request finished on another thread, or a connection came or went. */
static inline void tally__po_poke_driver(tally__po *po) {
    if (tally__po_driver_here || !atomic_load_explicit(&po->driving, memory_order_acquire) || po->drive_fd < 0) return;
    uint64_t one = 1;
    ssize_t w = write(po->drive_fd, &one, sizeof one);
    (void)w; /* a full eventfd is already awake */
}

/* A connection was freed or became ready (mu held): the poll sets filled before name stale ones. */
static inline void tally__po_changed(tally__po *po) {
    po->epoch++;
    tally__po_poke_driver(po);
}

/* po_match.c: a request ends (its callback is queued for when mu is released); the why is formatted,
 * named in world ranks for a split. */
void tally__po_finish(tally__po *po, tally__po_op *op, int rc, int source, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
tally__po_op *tally__po_take_done(tally__po *po);
/* Runs the callbacks of list (mu not held), then pokes a driver, whose request may be among them. */
void tally__po_run_done(tally__po *po, tally__po_op *list);
/* Posts a receive: matched at once, or waiting. Returns an in-place message it took that is still at its
 * sender (the caller reads it), else NULL. */
tally__po_msg *tally__po_post_recv(tally__po *po, tally__po_op *op);
void tally__po_self_send(tally__po *po, tally__po_op *op);
/* A header from in's rank passed the judge: the message it starts, matched or kept (NULL: no memory,
 * the connection is failed). */
tally__po_msg *tally__po_arrive(tally__po *po, tally__po_in *in);
/* n more payload bytes of m arrived (written where tally__po_msg_dst said); 1 when that was the last
 * (m is then the receive's, the queue's, or freed: the connection forgets it). */
int tally__po_msg_grew(tally__po *po, tally__po_msg *m, size_t n);
/* Where the next payload bytes of m go and how many fit there now (growing its staging). NULL: no
 * memory. Discarded messages read into scratch. */
unsigned char *tally__po_msg_dst(tally__po_msg *m, size_t *room, unsigned char *scratch, size_t scratch_len);
void tally__po_msg_lost(tally__po *po, tally__po_msg *m, int rc, const char *why);
/* Ends op with rc: "<rank: tally_recv from ... with tag ...>: why". */
void tally__po_fail(tally__po *po, tally__po_op *op, int rc, const char *why);
/* The waiting receives from rank (not any-source ones), or all of them, fail so. */
void tally__po_fail_from(tally__po *po, int rank, int rc, const char *why);
void tally__po_fail_recvs(tally__po *po, int rc, const char *why);
/* Receives past their deadline fail (TALLY_E_TIMEOUT); *next becomes the earliest deadline left if sooner. */
void tally__po_expire(tally__po *po, uint64_t now, uint64_t *next);
void tally__po_free_msgs(tally__po *po);
/* The in-place messages still unread on in (which is closing) cannot be read any more: dropped. */
void tally__po_forget_from(tally__po *po, tally__po_in *in);
/* po_in.c */
void tally__po_accept(tally__po *po);
void tally__po_in_event(tally__po *po, tally__po_in *in, short revents);
short tally__po_in_events(const tally__po_in *in);
void tally__po_in_close(tally__po *po, tally__po_in *in, int rc, const char *why);
/* in's connection ended or failed (rc, errno err): closed, with words for the requests it fails. */
void tally__po_in_ended(tally__po *po, tally__po_in *in, int rc, int err);
void tally__po_in_expire(tally__po *po, uint64_t now, uint64_t *next);
/* po_out.c: a send is queued (a connection dialed for its first), and written at once where it can be */
void tally__po_out_post(tally__po *po, tally__po_op *op);
void tally__po_out_event(tally__po *po, int peer, short revents);
short tally__po_out_events(const tally__po_out *o);
void tally__po_out_break(tally__po *po, int peer, int rc, const char *why);
void tally__po_out_expire(tally__po *po, uint64_t now, uint64_t *next);
void tally__po_fail_sends(tally__po *po, int rc, const char *why);
int tally__po_sends_pending(const tally__po *po);
void tally__po_out_reap(tally__po *po); /* closes the broken connections' sockets (the thread, between polls) */
/* po_cma.c: large payloads of a peer on this host read from its memory (process_vm_readv) */
int tally__po_cma_probe(tally__po *po, const tally__po_hello *h); /* 1: in->cma, the peer's memory is readable */
/* Reads m (into its receive's buffer, or kept; nothing when discarded) and owes its sender the ack,
 * sent at once when flush. 0, or the code of a failure of in's connection (its caller closes it). */
int tally__po_cma_read(tally__po *po, tally__po_in *in, tally__po_msg *m, int flush);
int tally__po_cma_flush(tally__po *po, tally__po_in *in); /* the acks owed: 0, or the connection's failure */
/* The copier's state, made with the post office; its end stops its thread (if it ever started). */
void tally__po_copier_init(tally__po_copier *k);
void tally__po_copier_end(tally__po_copier *k);
/* The unread messages past their grace are kept: their connection, when one failed (*rc its code), else
 * NULL; *next becomes the earliest grace left if sooner. */
tally__po_in *tally__po_cma_due(tally__po *po, uint64_t now, uint64_t *next, int *rc);
/* po_loop.c */
typedef struct tally__po_slot {
    int kind; /* PO_SLOT_* */
    int peer;
    tally__po_in *in;
    int driven; /* a ready connection only read from: a driver reads it too */
} tally__po_slot;
void *tally__po_main(void *arg);

#endif
