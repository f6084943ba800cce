/* fuzz_frame.c - fuzz target for the wire frame decoders: the TCP transport's data headers (and the
 * payload reduction they let through), the boot layer's control frames, FAULT reports and hellos. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot/boot_int.h"
#include "core/numeric/reduce.h"
#include "core/sig.h"
#include "fuzz.h"
#include "transport/tcp_int.h"

#define FZ_MAX_ELEMS 255 /* elements per message in the TCP mode: its count is one input byte */

static volatile size_t fz_sink; /* results go here so no decoding is optimized away */

/* ---- the TCP data connection, as a receiver reads it ---- */

/* The op of the TCP mode's third byte: its bits 0-1 and 4 (bits 2 and 3 say copy and in place). A float
 * with a bitwise op is a pair the kernels refuse: they must leave dst alone, not misread it. */
static const tally_op fz_ops[8] = {TALLY_SUM,  TALLY_PROD, TALLY_MIN,  TALLY_MAX,
                                   TALLY_BAND, TALLY_BOR,  TALLY_BXOR, TALLY_SUM};
static tally_op fz_op(int opb) { return fz_ops[(opb & 3) | ((opb >> 2) & 4)]; }

/* The receiving side of the transport, rank 0 of FZ_CTL_SIZE, reading peer 1's stream: its
 * connection's read-ahead buffer holds the input, so the control-frame parsers (WAIT, FAULT) read
 * exactly what a peer could have sent. Fresh per input: no fault, no WAIT heard. */
static tally__tcp_tp fz_t;
static tally__tcp_conn fz_conns[FZ_CTL_SIZE];
static tally__fault fz_tfault;

static tally__tcp_conn *fz_tcp_reader(const tally__sig *mine, unsigned char *rb, size_t n) {
    memset(fz_conns, 0, sizeof fz_conns);
    for (int k = 0; k < FZ_CTL_SIZE; k++) fz_conns[k].fd = -1, fz_conns[k].w_peer = -1;
    tally__fault_init(&fz_tfault);
    fz_t.base.ctx = (tally__tp_ctx){.rank = 0, .size = FZ_CTL_SIZE, .fault = &fz_tfault, .timeout_s = 1.0, .sig = mine};
    fz_t.conns = fz_conns;
    fz_conns[1].rb = rb;
    fz_conns[1].rb_tail = n;
    return &fz_conns[1];
}

/* What the transport makes of a peer's stream once nothing more will arrive: the fault a peer that
 * left may have sent, whether it said goodbye, whom its last WAIT named. */
static void fz_tcp_after(tally__tcp_conn *c) {
    tally__fault_init(&fz_tfault);
    fz_sink += (size_t)-tally__tcp_scan_fault(&fz_t, 1);
    fz_sink += (size_t)tally__tcp_ends_with_bye(c);
    uint64_t seq = 0;
    fz_sink += (size_t)tally__tcp_awaits(&fz_t, 1, &seq) + (size_t)seq;
}

/* A receiver expecting a run of messages of one shape, each a new collective (seq + 1), as
 * tcp_check_hdr reads them: control frames first, then every header judged by the transport's own
 * check before its payload is touched; an admitted payload is staged 8-aligned (as tcp_align does) and
 * reduced by the transport's kernels. The stream lives in an exact-size buffer, so a walk past its end
 * is caught. */
static void fz_tcp(const uint8_t *p, size_t n) {
    static _Alignas(64) unsigned char dst[FZ_MAX_ELEMS * 8], src[FZ_MAX_ELEMS * 8], pay[FZ_MAX_ELEMS * 8];
    if (n < 3) return;
    size_t count = p[0];
    tally_dtype dt = (tally_dtype)(p[1] % TALLY_DTYPE_COUNT);
    int opb = p[2];
    p += 3, n -= 3;
    size_t want = count * tally_dtype_size(dt);
    tally__sig mine = {.seq = FZ_TCP_SEQ0,
                       .count = count,
                       .root = -1,
                       .coll = TALLY__ALLREDUCE,
                       .dtype = (uint8_t)dt,
                       .op = (uint8_t)fz_op(opb),
                       .algo = 1};
    memset(src, 0x3c, sizeof src);
    memset(dst, 0, sizeof dst);
    unsigned char *rb = malloc(n ? n : 1);
    if (!rb) abort();
    if (n) memcpy(rb, p, n);
    tally__tcp_conn *c = fz_tcp_reader(&mine, rb, n);
    while (!tally__tcp_take_ctl(&fz_t, 1) && !tally__tcp_ctl_partial(c) &&
           c->rb_tail - c->rb_head >= sizeof(tally__tcp_hdr)) {
        tally__tcp_hdr h;
        memcpy(&h, rb + c->rb_head, sizeof h);
        int v = tally__tcp_hdr_judge(&h, &mine, want);
        if (v == TALLY__TCP_HDR_MISMATCH) { /* the transport names the peer's collective in its message */
            char theirs[160];
            tally__sig_format(&h.sig, theirs, sizeof theirs);
            fz_sink += strlen(theirs);
        }
        if (v != TALLY__TCP_HDR_OK) break;
        c->rb_head += sizeof h;
        if (c->rb_tail - c->rb_head < want) break; /* the rest of the payload has not arrived */
        memcpy(pay, rb + c->rb_head, want);
        if (opb & 4)
            memcpy(dst, pay, want);
        else
            tally__reduce(dst, (opb & 8) ? dst : src, pay, count, dt, fz_op(opb));
        c->rb_head += want;
        mine.seq++;
    }
    c->rb_head = 0; /* the idle watcher and a departed peer's scan start from the buffered bytes */
    fz_tcp_after(c);
    free(rb);
}

/* ---- control connections: a boot handle of FZ_CTL_SIZE ranks that sends nowhere ---- */

static tally__boot fz_b;
static tally__fault fz_fault;
static tally__peer fz_peers[FZ_CTL_SIZE];
static int fz_ctl[FZ_CTL_SIZE];
static int fz_null = -1; /* rank 2's control fd: already joined, so a hello naming it is a duplicate */

static void fz_boot_once(void) {
    fz_null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fz_null < 0) abort();
    pthread_mutex_init(&fz_b.wlock, NULL);
    fz_b.size = FZ_CTL_SIZE;
    fz_b.fault = &fz_fault;
    fz_b.timeout_s = 1.0;
    fz_b.peers = fz_peers;
    fz_b.ctl = fz_ctl;
    fz_b.stop_fd = -1;
}

/* Fresh state per input: no fault yet, no rank joined but rank 2. Relayed faults find no socket
 * (fd -1) or /dev/null (not a socket): either fails at once, as a send to a dead peer does. */
static tally__boot *fz_boot(int rank) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fz_boot_once);
    tally__fault_init(&fz_fault);
    memset(fz_peers, 0, sizeof fz_peers);
    for (int k = 0; k < FZ_CTL_SIZE; k++) fz_ctl[k] = -1;
    fz_ctl[2] = fz_null;
    fz_peers[2].pid = 4242;
    snprintf(fz_peers[2].hostname, sizeof fz_peers[2].hostname, "holder");
    fz_b.rank = rank;
    return &fz_b;
}

/* Rank 0's hello check; its verdict (the rank, or -1 and a refusal) feeds the sink. */
static int fz_hello_check(const tally__boot *b, const unsigned char *h) {
    char why[512];
    int code = 0, rank = tally__boot_hello_check(b, h, &code, why, sizeof why);
    return rank >= 0 ? rank : (int)strlen(why) - code;
}

/* Frames as a control connection carries them: each header checked by tally__ctl_hdr_get; FAULT
 * payloads go to the monitor's parser, hellos to rank 0's. Other types have no parser of their own. */
static void fz_ctl_stream(const uint8_t *p, size_t n) {
    if (n < 1) return;
    tally__boot *b = fz_boot(p[0] % FZ_CTL_SIZE);
    p++, n--;
    size_t at = 0;
    for (int i = 0; n - at >= CTL_HDR; i++) {
        ctl_frame f;
        if (tally__ctl_hdr_get(p + at, &f)) break;
        at += CTL_HDR;
        if (f.len > n - at) break; /* the reader would still be waiting for the payload */
        if (f.type == CTL_FAULT) {
            int from = b->rank == 0 ? 1 + i % (FZ_CTL_SIZE - 1) : 0;
            fz_sink += (size_t)-tally__ctl_on_fault(b, from, p + at, f.len);
            tally__fault_init(&fz_fault); /* sticky: the next report must be parsed afresh */
        } else if (f.type == CTL_HELLO && b->rank == 0 && f.len == FZ_HELLO_LEN) {
            fz_sink += (size_t)fz_hello_check(b, p + at);
        }
        at += f.len;
    }
}

static void fz_hello(const uint8_t *p, size_t n) {
    unsigned char h[FZ_HELLO_LEN] = {0};
    memcpy(h, p, n < sizeof h ? n : sizeof h);
    fz_sink += (size_t)fz_hello_check(fz_boot(0), h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    switch (data[0] % FZ_FRAME_MODES) {
    case FZ_FRAME_TCP: fz_tcp(data + 1, size - 1); break;
    case FZ_FRAME_CTL: fz_ctl_stream(data + 1, size - 1); break;
    default: fz_hello(data + 1, size - 1); break;
    }
    return 0;
}
