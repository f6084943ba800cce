/* boot_int.h - private to src/boot: the boot handle, the control-connection frame format shared by the
 * rendezvous (boot.c, serve.c), the monitor (monitor.c) and the setup watch (watch.c). Transports use boot.h. */
#ifndef TALLY_BOOT_BOOT_INT_H
#define TALLY_BOOT_BOOT_INT_H

#include <pthread.h>
#include <stdint.h>

#include "../core/bytes.h"
#include "boot.h"

/* Control frame: 16-byte header (network byte order) then `len` payload bytes.
 *   magic u32 | type u8 | 3 zero bytes | aux u32 | len u32 */
#define CTL_MAGIC 0x544c5946u /* "TLYF" */
#define CTL_HDR   16
enum {
    CTL_HELLO = 1, /* connector -> rank 0 after auth: who I am (fixed layout, HELLO_LEN) */
    CTL_TABLE,     /* rank 0 -> all: the peer table; aux = size */
    CTL_REFUSE,    /* rank 0 -> connector: aux = -code, payload = message */
    CTL_DATA,      /* bootstrap collective payload; aux = sequence number */
    CTL_FAULT,     /* payload: code i32, culprit i32, message */
    CTL_BYE,       /* clean goodbye: the close that follows is not a death */
    CTL_TYPE_MAX
};
/* The CTL_HELLO payload, fixed layout (network byte order):
 *   magic u32 | version u32 | rank i32 | size i32 | pid i32 | fd_hard u32 | hostid u64 | hostname[64] | ip[64]
 * fd_hard is 0, or the sender's hard RLIMIT_NOFILE when that cannot hold the descriptors the world needs
 * (rank 0 then tells every rank so; an older sender's 0 there means it never checked). */
#define HELLO_MAGIC     0x544c5948u /* "TLYH" */
#define BOOT_VERSION    1u
#define HELLO_LEN       160
#define CTL_MSG_MAX     767 /* fault/refusal text, as tally__fault.msg without the NUL */
#define CTL_FAULT_MAX   (8 + CTL_MSG_MAX)
#define CTL_FAULT_SETUP 1u  /* FAULT aux: raised while its rank built its transport; ends the others' setup too */
#define PEER_LEN        144 /* a peer table entry: pid, job u32, hostid u64, ip[64], hostname[64] */
#define TABLE_GRACE_S   5.0 /* connectors wait this much past rank 0's limit so its verdict arrives first */

typedef struct ctl_frame {
    int type;
    uint32_t aux, len;
} ctl_frame;

struct tally__boot {
    int rank, size;
    tally__fault *fault;
    double timeout_s;     /* bootstrap collectives (TALLY_TIMEOUT) */
    double rdv_timeout_s; /* the rendezvous (TALLY_BOOT_TIMEOUT, else timeout_s) */
    tally__peer *peers;   /* [size] */
    int *ctl;             /* [size]: fd of the control connection to that rank, -1 if none/self */
    char token[TALLY__TOKEN_MAX];
    size_t token_len;
    uint32_t seq;          /* bootstrap collectives done: every rank counts the same */
    pthread_mutex_t wlock; /* one frame at a time on the control sockets, from any thread */
    int monitor_on;        /* the monitor thread was started (it then owns every read) */
    pthread_t monitor;
    int stop_fd;                    /* eventfd that tells the monitor to exit */
    struct ctl_mon *mon;            /* the monitor thread's poll set and read buffers */
    int own_wake_fd;                /* we created fault->wake_fd and close it in free */
    unsigned char *watch;           /* [size]: what the setup watch saw on each control connection (monitor.c) */
    int watch_ended;                /* the watch ended this rank's setup: another rank failed or died */
    int in_setup;                   /* building the transport: faults raised now go out as setup failures */
    int setup_relayed;              /* rank 0 relayed a setup failure already */
    char fd_short[CTL_MSG_MAX + 1]; /* this rank cannot hold the descriptors the world needs: why ("" if it can) */
    uint32_t fd_hard;               /* then its hard RLIMIT_NOFILE, told to rank 0 in the hello */
    const char *transport;          /* the one the config asks for ("tcp", "shm"), or NULL: for messages */
};

/* Frames (monitor.c). send takes wlock so frames from several threads never interleave. */
void tally__ctl_hdr_put(unsigned char h[CTL_HDR], int type, uint32_t aux, uint32_t len);
int tally__ctl_hdr_get(const unsigned char h[CTL_HDR], ctl_frame *f); /* 0 or TALLY_E_PROTOCOL */
int tally__ctl_send(tally__boot *b, int peer, int type, uint32_t aux, const void *p, size_t len, uint64_t deadline);
/* Reads a header with the deadline. 0, TALLY_E_TIMEOUT, _PEER_LOST, _SYSTEM or _PROTOCOL. */
int tally__ctl_recv_hdr(int fd, ctl_frame *f, uint64_t deadline);
/* A FAULT payload from `from`: adopts it and, on rank 0, relays it to every other rank if it is the
 * first fault here. Returns the fault's code (TALLY_E_PROTOCOL if the payload is malformed). */
int tally__ctl_on_fault(tally__boot *b, int from, const unsigned char *p, size_t len);
/* The same, for a frame whose header's aux is known: a setup failure (CTL_FAULT_SETUP) is relayed by rank 0
 * even when another fault came first, with its flag. */
int tally__ctl_on_fault_aux(tally__boot *b, int from, uint32_t aux, const unsigned char *p, size_t len);
/* A FAULT payload's fields, checked (msg gets the text, NUL-terminated). 0 or TALLY_E_PROTOCOL. */
int tally__ctl_fault_parse(const tally__boot *b, const unsigned char *p, size_t len, int *code, int *culprit,
                           char msg[CTL_MSG_MAX + 1]);
/* fault->propagate: sends FAULT to rank 0 (non-zero rank) or to every rank (rank 0). */
void tally__ctl_propagate(void *arg, int code, int culprit, const char *msg);
/* "rank 3 (pid 1234 on host foo)" */
void tally__ctl_who(const tally__boot *b, int rank, char *buf, size_t n);
/* Stops and joins the monitor if it runs (free). */
void tally__ctl_stop_monitor(tally__boot *b);
/* Rank 0's check of a hello (boot.c; h holds its HELLO_LEN bytes, read after authentication): the rank
 * it names, or -1 with the refusal's code and text. Changes nothing, so the frame fuzzer calls it. */
int tally__boot_hello_check(const tally__boot *b, const unsigned char *h, int *code, char *why, size_t n);
/* Rank 0's side of the rendezvous (serve.c): every other rank joins, or every rank is told why not. */
int tally__boot_serve(tally__boot *b, const tally__boot_env *env, uint64_t deadline);
/* A fixed 64-byte string field from the wire: NUL-terminated and printable. */
int tally__boot_str_ok(const unsigned char *s, size_t n);
/* One peer table entry, PEER_LEN bytes, out and back in (peers.c); the way in refuses bad strings
 * with TALLY_E_PROTOCOL. */
void tally__boot_peer_put(unsigned char *o, const tally__peer *p);
int tally__boot_peer_get(const unsigned char *in, tally__peer *p);
/* Descriptors rank `rank` of a world of `size` holds at once from init to free (peers.c), and the world
 * in words for messages about them: "a tcp world of 64 ranks" (transport: the one asked for, or NULL). */
int tally__boot_fd_need(int rank, int size);
void tally__boot_fd_world(const char *transport, int size, char *buf, size_t n);

#endif
