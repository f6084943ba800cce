/* auth.c - mutual HMAC-SHA256 challenge/response over the shared token, run on every connection
 * before any other byte is parsed. Both sides prove the token without sending it. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <string.h>

#include "boot.h"
#include "net.h"

_Static_assert(TALLY__AUTH_REPLY == 2 * TALLY__AUTH_IN, "the reply is the acceptor's nonce and its proof");

/* Wire protocol (all fixed lengths, so nothing needs parsing):
 *   connector -> acceptor : nc[32]                      fresh nonce
 *   acceptor  -> connector: na[32] macA[32]              macA = H(token, label | role | 'A' | nc | na)
 *   connector -> acceptor : macC[32]                     macC = H(token, label | role | 'C' | nc | na)
 *   acceptor  -> connector: verdict[1]                   1 accepted, 0 refused
 * The direction letter stops a reflected proof; both nonces make every proof fresh; the role keeps a
 * proof for one kind of connection from being replayed on another. The verdict byte lets a refused
 * connector say "wrong token" instead of "connection closed". */
#define AUTH_NONCE    TALLY__AUTH_IN
#define AUTH_MAC      TALLY__AUTH_PROOF
#define AUTH_ROLE_MAX 32
#define AUTH_LABEL    "tally-auth-v1"

static int auth_mac(const void *token, size_t token_len, const char *role, char dir, const unsigned char *nc,
                    const unsigned char *na, unsigned char out[AUTH_MAC]) {
    unsigned char msg[sizeof AUTH_LABEL + AUTH_ROLE_MAX + 2 + 2 * AUTH_NONCE];
    size_t rl = strlen(role), n = 0;
    if (rl > AUTH_ROLE_MAX) return -1;
    memcpy(msg, AUTH_LABEL, sizeof AUTH_LABEL); /* includes the NUL: label and role stay separate */
    n += sizeof AUTH_LABEL;
    memcpy(msg + n, role, rl);
    n += rl;
    msg[n++] = 0;
    msg[n++] = (unsigned char)dir;
    memcpy(msg + n, nc, AUTH_NONCE);
    n += AUTH_NONCE;
    memcpy(msg + n, na, AUTH_NONCE);
    n += AUTH_NONCE;
    unsigned int len = 0;
    static const unsigned char empty = 0;
    if (!HMAC(EVP_sha256(), token_len ? token : &empty, (int)token_len, msg, n, out, &len) || len != AUTH_MAC)
        return -1;
    return 0;
}

/* Message for an I/O failure during the handshake, naming the other end. */
static int auth_io_err(int rc, int fd, const char *role) {
    char peer[TALLY__NET_ADDRSTR];
    tally__net_peer_str(fd, peer, sizeof peer);
    if (rc == TALLY_E_TIMEOUT)
        return tally__seterr(rc, "authentication (%s) with %s timed out: the peer sent nothing in time", role, peer);
    if (rc == TALLY_E_PEER_LOST)
        return tally__seterr(rc, "authentication (%s) with %s failed: the peer closed the connection", role, peer);
    return tally__seterr(TALLY_E_SYSTEM, "authentication (%s) with %s failed: socket error", role, peer);
}

int tally__auth_accept_begin(tally__auth_acc *a, const void *token, size_t token_len, const char *role,
                             const unsigned char nonce[TALLY__AUTH_IN]) {
    memset(a, 0, sizeof *a);
    if (RAND_bytes(a->reply, AUTH_NONCE) != 1 ||
        auth_mac(token, token_len, role, 'A', nonce, a->reply, a->reply + AUTH_NONCE) ||
        auth_mac(token, token_len, role, 'C', nonce, a->reply, a->expect))
        return tally__seterr(TALLY_E_SYSTEM, "authentication (%s): OpenSSL RAND_bytes/HMAC failed", role);
    return 0;
}

int tally__auth_accept_check(const tally__auth_acc *a, const unsigned char proof[TALLY__AUTH_PROOF]) {
    return CRYPTO_memcmp(proof, a->expect, AUTH_MAC) == 0; /* constant time: no timing oracle */
}

int tally__auth_accept(int fd, const void *token, size_t token_len, const char *role, uint64_t deadline) {
    unsigned char nc[AUTH_NONCE], proof[AUTH_MAC];
    tally__auth_acc a;
    int rc = tally__net_recv_all(fd, nc, sizeof nc, deadline);
    if (rc) return auth_io_err(rc, fd, role);
    if ((rc = tally__auth_accept_begin(&a, token, token_len, role, nc))) return rc;
    if ((rc = tally__net_send_all(fd, a.reply, sizeof a.reply, deadline)) ||
        (rc = tally__net_recv_all(fd, proof, sizeof proof, deadline)))
        return auth_io_err(rc, fd, role);
    unsigned char ok = (unsigned char)tally__auth_accept_check(&a, proof);
    rc = tally__net_send_all(fd, &ok, 1, deadline);
    if (!ok) {
        char peer[TALLY__NET_ADDRSTR];
        tally__net_peer_str(fd, peer, sizeof peer);
        return tally__seterr(TALLY_E_AUTH,
                             "authentication (%s) with %s failed: its proof does not match our "
                             "TALLY_TOKEN (a process with a different token, or not a tally process)",
                             role, peer);
    }
    return rc ? auth_io_err(rc, fd, role) : 0;
}

int tally__auth_connect_begin(tally__auth_con *a) {
    memset(a, 0, sizeof *a);
    return RAND_bytes(a->nonce, sizeof a->nonce) == 1 ? 0 : TALLY_E_SYSTEM;
}

int tally__auth_connect_answer(tally__auth_con *a, const void *token, size_t token_len, const char *role,
                               const unsigned char reply[TALLY__AUTH_REPLY]) {
    unsigned char expect[AUTH_MAC];
    if (auth_mac(token, token_len, role, 'A', a->nonce, reply, expect) ||
        auth_mac(token, token_len, role, 'C', a->nonce, reply, a->proof))
        return TALLY_E_SYSTEM;
    int peer_ok = CRYPTO_memcmp(reply + AUTH_NONCE, expect, AUTH_MAC) == 0;
    /* An unproven peer gets no proof from us (zeros), so it learns nothing it could replay. */
    if (!peer_ok) memset(a->proof, 0, sizeof a->proof);
    return peer_ok;
}

/* The token mismatch, as the connector says it. */
static int auth_mismatch(int fd, const char *role) {
    char peer[TALLY__NET_ADDRSTR];
    tally__net_peer_str(fd, peer, sizeof peer);
    return tally__seterr(TALLY_E_AUTH,
                         "authentication (%s) with %s failed: this process's TALLY_TOKEN does not match the "
                         "peer's; every rank of a job must have the same TALLY_TOKEN",
                         role, peer);
}

int tally__auth_connect(int fd, const void *token, size_t token_len, const char *role, uint64_t deadline) {
    unsigned char in[TALLY__AUTH_REPLY], verdict = 0;
    tally__auth_con a;
    if (tally__auth_connect_begin(&a))
        return tally__seterr(TALLY_E_SYSTEM, "authentication (%s): OpenSSL RAND_bytes failed", role);
    int rc = tally__net_send_all(fd, a.nonce, sizeof a.nonce, deadline);
    if (!rc) rc = tally__net_recv_all(fd, in, sizeof in, deadline);
    if (rc) return auth_io_err(rc, fd, role);
    int peer_ok = tally__auth_connect_answer(&a, token, token_len, role, in);
    if (peer_ok < 0) return tally__seterr(TALLY_E_SYSTEM, "authentication (%s): OpenSSL HMAC failed", role);
    rc = tally__net_send_all(fd, a.proof, sizeof a.proof, deadline);
    if (peer_ok && !rc) rc = tally__net_recv_all(fd, &verdict, 1, deadline);
    if (!peer_ok || (!rc && verdict != 1)) return auth_mismatch(fd, role);
    return rc ? auth_io_err(rc, fd, role) : 0;
}
