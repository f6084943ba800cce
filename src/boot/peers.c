/* peers.c - the peer table as the rendezvous sends it (a fixed-size entry per rank, strings checked
 * before use), and the descriptors each rank holds: shared by rank 0's server and every rank's side. */
#include <stdio.h>
#include <string.h>

#include "boot_int.h"

/* Knob read here only to name the transport in messages about descriptors (comm.c checks and uses it):
 *   TALLY_TRANSPORT */

/* A fixed 64-byte string field from the wire: NUL-terminated and printable, else rejected. */
int tally__boot_str_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n && s[i]) {
        if (s[i] < 0x20 || s[i] > 0x7e) return 0;
        i++;
    }
    return i < n;
}

void tally__boot_peer_put(unsigned char *o, const tally__peer *p) {
    memset(o, 0, PEER_LEN);
    tally__put_be32(o, (uint32_t)p->pid);
    tally__put_be32(o + 4, p->job);
    tally__put_be64(o + 8, p->hostid);
    memcpy(o + 16, p->ip, strnlen(p->ip, 63));
    memcpy(o + 80, p->hostname, strnlen(p->hostname, 63));
}

int tally__boot_peer_get(const unsigned char *in, tally__peer *p) {
    if (!tally__boot_str_ok(in + 16, 64) || !tally__boot_str_ok(in + 80, 64)) return TALLY_E_PROTOCOL;
    p->pid = (int32_t)tally__get_be32(in);
    p->job = tally__get_be32(in + 4);
    p->hostid = tally__get_be64(in + 8);
    memcpy(p->ip, in + 16, 64);
    memcpy(p->hostname, in + 80, 64);
    return 0;
}

int tally__boot_fd_need(int rank, int size) {
    if (size <= 1) return 0;
    /* Rank 0 holds a control connection per rank (and the rendezvous listener); both transports hold
     * one descriptor per peer: a tcp socket, or a shm pidfd. */
    return (rank == 0 ? size : 1) + (size - 1) + TALLY__BOOT_FD_EXTRA;
}

void tally__boot_fd_world(const char *transport, int size, char *buf, size_t n) {
    snprintf(buf, n, "a %s%sworld of %d ranks", transport ? transport : "", transport ? " " : "", size);
}
