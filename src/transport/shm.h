/* shm.h - internals of the shared-memory transport: the segment layout (one channel per ordered pair of
 * ranks, every cache line with a single writer) and what shm.c, shm_setup.c and shm_wait.c share. */
#ifndef TALLY_TRANSPORT_SHM_H
#define TALLY_TRANSPORT_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/cpus.h"
#include "transport.h"

#define SHM_LINE   64
#define SHM_NSLOTS 8           /* slots per channel: a ring deep enough to pipeline copy and reduce */
#define SHM_INLINE 48          /* payload bytes that ride in the flag's own cache line */
#define SHM_PIECE  (256 << 10) /* single-copy piece: read into scratch, used while still in L2 */

/* What a slot holds. A message is one head slot (TINY, SLOT or LARGE), then CONT slots for the rest
 * of a SLOT message that did not fit in the first. */
enum { SHM_TINY = 1, SHM_SLOT = 2, SHM_CONT = 3, SHM_LARGE = 4 };

/* One slot's header: two cache lines, both written only by the sender. Line 0 is all a tiny message
 * costs the receiver; line 1 is read for slot/large messages, or to explain a mismatch. */
typedef struct shm_slot {
    _Atomic uint32_t flag; /* slot use index + 1 (mod 2^32), stored last, with release */
    uint16_t kind;         /* SHM_TINY ... */
    uint16_t tiny_len;     /* payload bytes of a TINY message */
    uint64_t sighash;      /* hash of the sender's fingerprint: equal hashes, equal collectives */
    unsigned char data[SHM_INLINE];
    tally__sig sig;   /* the sender's full fingerprint (heads only) */
    uint64_t len;     /* message bytes (SLOT/LARGE heads) */
    uint64_t addr;    /* LARGE: the message in the sender's address space */
    uint64_t mem_id;  /* LARGE: 0, or the sender's tally_mem_alloc region that holds the message */
    uint64_t mem_off; /* LARGE with mem_id: where the message starts in that region */
    int32_t mem_fd;   /* LARGE with mem_id: the region's memfd, as numbered in the sender */
    int32_t mem_pid;  /* LARGE with mem_id: the sender's pid (checked against the one setup saw) */
} shm_slot;
_Static_assert(sizeof(shm_slot) == 2 * SHM_LINE, "a slot header is two cache lines");

/* A word alone on its cache line, so writers never share a line. */
typedef struct shm_word {
    _Alignas(SHM_LINE) _Atomic uint64_t v;
} shm_word;
/* A 32-bit word alone on its line: futexes are 32 bits. */
typedef struct shm_word32 {
    _Alignas(SHM_LINE) _Atomic uint32_t v;
} shm_word32;

/* Each rank's first fault, written once by that rank: peers adopt it in their slow path, so a fault
 * reaches every rank of the segment without the boot layer, and a rank that exits after a fault is
 * not blamed for dying. */
typedef struct shm_fault_rec {
    _Alignas(SHM_LINE) _Atomic int32_t code; /* stored last, with release */
    int32_t culprit;
    char msg[sizeof(((tally__fault *)0)->msg)];
} shm_fault_rec;

/* What each rank is waiting for, written by that rank while it sleeps in an exchange: peers follow these
 * to the rank that holds a collective up when their own wait times out (see tally__stall). */
typedef struct shm_wait_rec {
    _Alignas(SHM_LINE) _Atomic uint64_t seq; /* the collective it waits in */
    _Atomic uint64_t beat_ns;                /* tally__now_ns() of its latest look (it is alive and waiting) */
    _Atomic int32_t peer; /* whom it waits for; -1 when not waiting; SHM_WAIT_ELSEWHERE: a rank over tcp */
} shm_wait_rec;
#define SHM_WAIT_ELSEWHERE (-2)

/* The segment starts with this header; then per rank a doorbell and a sleeping word; then the
 * fault records, the wait records and the CPU words; then the channels, page aligned: [consumed line][slot headers][slot data] each. */
typedef struct shm_seg_hdr {
    uint64_t magic;
    uint32_t nranks, nslots;
    uint64_t slot_bytes, chan_stride, chans_off, bytes;
} shm_seg_hdr;

/* Exchange state: one entry per send and per receive of the current call. */
typedef struct shm_sop {
    int peer, kind, done;
    uint32_t nuse, posted; /* slot uses the message needs / has filled */
    const unsigned char *buf;
    size_t len;
    uint64_t last_use;        /* LARGE: the slot use whose consumption completes the send */
    uint64_t mem_id, mem_off; /* LARGE: the shared region the buffer lies in (mem_id 0: none) */
    int mem_fd;
} shm_sop;

typedef struct shm_rop {
    const tally__recv *r;
    int kind, started, done;
    size_t off, esize;
    uint64_t addr;            /* LARGE: where the message lies in the sender */
    const unsigned char *map; /* LARGE from a shared region: the message in our mapping of it, else NULL */
} shm_rop;

typedef struct shm_tp {
    tally__tp base;
    int me, n;
    unsigned char *seg;
    size_t seg_bytes;
    size_t slot_bytes, chan_stride, chans_off;
    shm_word32 *bell;          /* [n] futex word of each rank, bumped by whoever wakes it */
    shm_word32 *sleeping;      /* [n] 1 while rank r may be asleep on its bell */
    shm_fault_rec *rec;        /* [n] */
    shm_wait_rec *wait;        /* [n] */
    shm_word32 *oncpu;         /* [n] the CPU rank r last ran on + 1 (0: not known), written by r */
    uint32_t mycpu;            /* what oncpu[me] holds */
    tally__crowding crowding;  /* yielding to a peer on our CPU since we last moved */
    int published;             /* our fault is in rec[me] */
    uint64_t *tx;              /* [n] slot uses posted to each peer */
    uint64_t *tx_free;         /* [n] last seen consumed counter of each outgoing channel */
    uint64_t *rx;              /* [n] slot uses consumed from each peer */
    int *pid;                  /* [n] peers' pids (same pid namespace), -1 unknown */
    int *pidfd;                /* [n] for liveness checks, -1 when unavailable */
    int liveness;              /* pids mean something here */
    int cma;                   /* single-copy reads (process_vm_readv) work between every pair */
    size_t large_min;          /* messages of at least this many bytes go single-copy */
    int mem;                   /* every rank can map its peers' shared regions (pidfd_getfd works) */
    size_t mem_min;            /* messages from shared regions of at least this many bytes are read in place */
    int cma_why;               /* shm_cma_why: why single-copy is on or off (for base.large) */
    float cma_gbps, copy_gbps; /* rank 0's calibration: process_vm_readv's and memcpy's GB/s (0: not run) */
    struct shm_mem_state *ms;  /* our regions and our mappings of the peers' (shm_mem.c) */
    unsigned char *scratch;    /* SHM_PIECE bytes that single-copy receives pass through */
    shm_sop *sop;              /* [n] */
    shm_rop *rop;              /* [n] */
    uint32_t *mark;            /* [n] per-peer stamps to reject duplicate peers in one exchange */
    uint32_t stamp;
    uint64_t spin_ns, yield_ns; /* backoff: spin this long idle, then yield, then futex */
    char name[64];              /* segment name while it may still exist (rank 0), else "" */
    _Atomic uint64_t probe;     /* a random word peers read once with process_vm_readv to prove it works */
} shm_tp;

/* The state of one exchange call, shared by the progress loop and the waiting code. */
typedef struct shm_xchg {
    shm_tp *t;
    int ns, nr, left;    /* ops not yet complete */
    uint64_t hash;       /* hash of *ctx.sig for this call */
    uint64_t t_start;    /* tally__now_ns() at the start of the call */
    uint64_t idle_since; /* when the loop last made progress, 0 while busy */
    int waiting_on;      /* the peer our wait record names, -1 while it names none */
} shm_xchg;

static inline size_t shm_chan_index(const shm_tp *t, int src, int dst) {
    return (size_t)src * (size_t)(t->n - 1) + (size_t)(dst < src ? dst : dst - 1);
}
static inline unsigned char *shm_chan(const shm_tp *t, int src, int dst) {
    return t->seg + t->chans_off + shm_chan_index(t, src, dst) * t->chan_stride;
}
/* The receiver's consumed counter of channel src -> dst (slot uses it has finished with). */
static inline _Atomic uint64_t *shm_consumed(const shm_tp *t, int src, int dst) {
    return &((shm_word *)shm_chan(t, src, dst))->v;
}
static inline shm_slot *shm_slot_at(const shm_tp *t, int src, int dst, uint64_t use) {
    return (shm_slot *)(shm_chan(t, src, dst) + SHM_LINE) + use % SHM_NSLOTS;
}
static inline unsigned char *shm_slot_data(const shm_tp *t, int src, int dst, uint64_t use) {
    return shm_chan(t, src, dst) + 4096 + (use % SHM_NSLOTS) * t->slot_bytes;
}

uint64_t tally__shm_sighash(const tally__sig *s);
/* Wakes rank r if it sleeps on its bell; called after publishing a slot or a consumed count. */
void tally__shm_wake(shm_tp *t, int r);
/* Called when the progress loop found nothing to do: spins, yields, or sleeps, and in the slow path
 * checks the fault record, the deadline, the peers' liveness and stray mismatched messages.
 * Returns 0 to go on, or a fault code. */
int tally__shm_idle(shm_xchg *x);
/* Leaves this rank's fault, if any, in the segment for the peers (once; shm.c). */
void tally__shm_publish(shm_tp *t);
/* Where ranks run (shm_cpu.c). Publishes the CPU this rank runs on, when it changed. */
void tally__shm_note_cpu(shm_tp *t);
/* 1 when a peer this idle exchange waits on runs on our CPU, so spinning would only keep it off;
 * it may first move this rank to a CPU of its set that no rank runs on. */
int tally__shm_crowded(shm_xchg *x);
/* Ends an exchange: our wait record no longer names a peer. */
void tally__shm_unwait(shm_xchg *x);
/* Raises the mismatch fault for a head slot from `peer` whose hash differs from ours. */
int tally__shm_sig_fault(shm_tp *t, int peer, const shm_slot *s);
/* Adopts a fault another rank recorded in the segment (rank r, or any when r < 0); returns its code. */
int tally__shm_adopt(shm_tp *t, int r);
/* Liveness: 1 if rank r is known to have exited. */
int tally__shm_peer_dead(shm_tp *t, int r);
int tally__shm_raise_lost(shm_tp *t, int r, const char *doing);
/* Shared regions (shm_mem.c): tally_mem_alloc's memfds, and the peers' ones mapped read-only. */
/* Below this the slot ring is as fast or faster, and does not couple the sender to the receiver: 64 KiB
 * and 128 KiB messages ran 1.7x slower in place than through the slots on a 2-core VM. */
#define SHM_MEM_MIN (256 << 10)

/* Why single-copy (process_vm_readv) is on or off, found at setup. */
typedef enum shm_cma_why {
    SHM_CMA_ON,       /* every rank read its neighbour's probe word and the kernel's copy pays (or was asked for) */
    SHM_CMA_UNWANTED, /* a rank set TALLY_SHM_CMA=0 */
    SHM_CMA_NS,       /* the ranks are in different pid namespaces */
    SHM_CMA_DENIED,   /* a rank could not read its neighbour's memory (ptrace rules, seccomp) */
    SHM_CMA_SLOW      /* calibration: the kernel's copy is much slower than memcpy here */
} shm_cma_why;
int tally__shm_mem_init(shm_tp *t);
void tally__shm_mem_fini(shm_tp *t);
void *tally__shm_mem_alloc(tally__tp *tp, size_t bytes);
int tally__shm_mem_free(tally__tp *tp, void *ptr);
int tally__shm_mem_keep(tally__tp *tp, void *ptr);
/* The region of ours that holds [buf, buf+len): 1 and its id, fd and offset, or 0 when none does. */
int tally__shm_mem_find(shm_tp *t, const void *buf, size_t len, uint64_t *id, int *fd, uint64_t *off);
/* Our read-only mapping of rank p's region `id` (fd is its number in p), mapped on first use and
 * cached; NULL when it cannot be mapped or is shorter than need. */
const unsigned char *tally__shm_mem_map(shm_tp *t, int p, uint64_t id, int fd, size_t need);
/* Setup probe: a memfd of ours holding `word`, and whether we can fetch a peer's such memfd. */
int tally__shm_mem_probe_make(uint64_t word);
int tally__shm_mem_probe_read(int pidfd, int fd, uint64_t word);
/* Setup and teardown (shm_setup.c); exchange lives in shm.c. */
int tally__shm_exchange(tally__tp *tp, const tally__send *s, int ns, const tally__recv *r, int nr);
void tally__shm_destroy(tally__tp *tp);

#endif
