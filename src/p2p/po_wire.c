/* po_wire.c - the judge of a point-to-point header before any of its payload is read: a header that does
 * not add up is a protocol error, never a crash or an allocation its sender did not pay for. */
#include <errno.h>
#include <sys/socket.h>

#include "../core/numeric/dtype.h"
#include "po_int.h"

int tally__po_hdr_judge(const tally__po_hdr *h, int src, int cma_ok) {
    if (h->magic != TALLY__PO_MAGIC_MSG) return TALLY__PO_HDR_BAD_MAGIC;
    if (h->src != src) return TALLY__PO_HDR_BAD_SRC;
    if (h->tag < 0) return TALLY__PO_HDR_BAD_TAG;
    uint64_t esize = tally__dtype_valid((int)h->dtype) ? tally_dtype_size((tally_dtype)h->dtype) : 0;
    if (!esize) return TALLY__PO_HDR_BAD_DTYPE;
    if (h->bytes > TALLY__PO_MAX_BYTES || h->count > TALLY__PO_MAX_BYTES / esize || h->count * esize != h->bytes)
        return TALLY__PO_HDR_BAD_LEN;
    if ((h->flags & ~TALLY__PO_CMA) || ((h->flags & TALLY__PO_CMA) && (!cma_ok || h->bytes == 0)))
        return TALLY__PO_HDR_BAD_CMA;
    return TALLY__PO_HDR_OK;
}

const char *tally__po_hdr_why(int verdict) {
    switch (verdict) {
    case TALLY__PO_HDR_BAD_MAGIC: return "a frame that is not a message (out of step, or not a tally peer)";
    case TALLY__PO_HDR_BAD_SRC: return "a message that names another rank as its sender";
    case TALLY__PO_HDR_BAD_TAG: return "a message with a negative tag";
    case TALLY__PO_HDR_BAD_DTYPE: return "a message with an unknown dtype";
    case TALLY__PO_HDR_BAD_LEN: return "a message whose length is not its count times its dtype's size, or past 1 PiB";
    case TALLY__PO_HDR_BAD_CMA: return "a message to be read in place that this connection did not agree to";
    default: return "a well-formed message";
    }
}

int tally__po_io(int fd, void *buf, size_t len, size_t *off, int out) {
    unsigned char *p = buf;
    while (*off < len) {
        ssize_t k = out ? send(fd, p + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, p + *off, len - *off, MSG_DONTWAIT);
        if (k > 0) {
            *off += (size_t)k;
            continue;
        }
        if (k == 0) return TALLY_E_PEER_LOST;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN ? TALLY_E_PEER_LOST : TALLY_E_SYSTEM;
    }
    return 1;
}
