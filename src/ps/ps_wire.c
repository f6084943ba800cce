/* ps_wire.c - the parameter server's frames: a fixed header written and checked field by field, its
 * length held against what the frame's type must carry before a payload byte is read. */
#include <string.h>

#include "../core/bytes.h"
#include "../boot/net.h"
#include "ps.h"

static void hdr_put(unsigned char o[TALLY__PS_HDR], const tally__ps_hdr *h) {
    tally__put_be32(o, TALLY__PS_MAGIC);
    tally__put_be32(o + 4, (uint32_t)h->type);
    tally__put_be32(o + 8, (uint32_t)h->rank);
    tally__put_be32(o + 12, h->aux);
    tally__put_be64(o + 16, h->clock);
    tally__put_be32(o + 24, h->len);
    tally__put_be32(o + 28, 0);
}

int tally__ps_send(int fd, const tally__ps_hdr *h, const void *payload, uint64_t deadline) {
    unsigned char o[TALLY__PS_HDR];
    hdr_put(o, h);
    int rc = tally__net_send_all(fd, o, sizeof o, deadline);
    if (!rc && h->len) rc = tally__net_send_all(fd, payload, h->len, deadline);
    return rc;
}

/* The payload a frame of this type carries: the whole model, or nothing. */
static int len_ok(int type, uint32_t len, size_t nparams) {
    if (type == TALLY__PS_PARAMS || type == TALLY__PS_PUSH) return (size_t)len == nparams * sizeof(float);
    return len == 0;
}

int tally__ps_recv_hdr(int fd, size_t nparams, tally__ps_hdr *h, uint64_t deadline, const char **why) {
    unsigned char b[TALLY__PS_HDR];
    int rc = tally__net_recv_all(fd, b, sizeof b, deadline);
    if (rc) return rc;
    h->type = (int)tally__get_be32(b + 4);
    h->rank = (int)tally__get_be32(b + 8);
    h->aux = tally__get_be32(b + 12);
    h->clock = tally__get_be64(b + 16);
    h->len = tally__get_be32(b + 24);
    *why = tally__get_be32(b) != TALLY__PS_MAGIC                        ? "bad magic (not a parameter-server frame)"
           : h->type < TALLY__PS_HELLO || h->type >= TALLY__PS_TYPE_MAX ? "unknown frame type"
           : tally__get_be32(b + 28) != 0                               ? "reserved header word not zero"
           : h->clock > (uint64_t)1 << 62                               ? "clock out of range"
           : !len_ok(h->type, h->len, nparams)                          ? "payload length does not match the model"
                                                                        : NULL;
    return *why ? TALLY_E_PROTOCOL : 0;
}

const char *tally__ps_type_name(int type) {
    static const char *names[] = {"?", "hello", "pull", "params", "push", "bye", "stop"};
    return type > 0 && type < TALLY__PS_TYPE_MAX ? names[type] : "?";
}
