/* split.c - tally_comm_split: the groups agreed over the parent (every rank's color and key gathered),
 * then each group's own rendezvous, its first rank listening on a port it picked and told the others
 * over the parent, so the new communicator has all a communicator of the world has. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../boot/boot.h"
#include "../boot/net.h"
#include "../core/err.h"
#include "coll.h"

typedef struct member {
    int key, rank; /* rank: in the parent */
} member;

static int by_key_then_rank(const void *a, const void *b) {
    const member *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* The members of `color` in their new order; their count. */
static int group_of(const int32_t *all, int size, int color, member *g) {
    int n = 0;
    for (int r = 0; r < size; r++)
        if (all[2 * r] == color) g[n++] = (member){.key = all[2 * r + 1], .rank = r};
    qsort(g, (size_t)n, sizeof *g, by_key_then_rank);
    return n;
}

/* The group's first rank listens on an ephemeral port of the address its peers reach it at (its
 * listeners' address in the parent's peer table); -1 when it cannot, with the reason set. */
static int32_t listen_for_group(const tally__peer *me, int *fd) {
    if (tally__net_listen(me->ip, 0, SOMAXCONN, fd)) return -1;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(*fd, (struct sockaddr *)&ss, &len) != 0) {
        close(*fd);
        *fd = -1;
        tally__seterr(TALLY_E_SYSTEM, "cannot tell the port of the split's listener on %s", me->ip);
        return -1;
    }
    return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* A token of the group's own, from the parent's (secret) and where the group meets: ranks of two
 * groups never take each other's rendezvous for their own. */
static int group_token(const tally__boot *b, int leader_world, int32_t port, int color, tally__boot_env *env) {
    size_t len;
    const unsigned char *tok = tally__boot_token(b, &len);
    char where[64];
    int wn = snprintf(where, sizeof where, "tally_comm_split %d %d %d", leader_world, (int)port, color);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) && EVP_DigestUpdate(c, tok, len) &&
             EVP_DigestUpdate(c, where, (size_t)wn) && EVP_DigestFinal_ex(c, md, &mdlen);
    EVP_MD_CTX_free(c);
    if (!ok) return tally__seterr(TALLY_E_SYSTEM, "tally_comm_split: SHA-256 failed");
    for (unsigned int i = 0; i < mdlen; i++) snprintf(env->token + 2 * i, 3, "%02x", md[i]);
    env->token_len = 2 * (size_t)mdlen;
    return 0;
}

/* The group's rendezvous and communicator, once every rank knows its leader's port. */
static int join_group(tally_comm *comm, const member *g, int n, int sub, int color, int32_t port, int lfd,
                      tally_comm **out) {
    const tally__boot *b = tally__comm_boot(comm);
    const tally__peer *peers = tally__boot_peers(b);
    tally__boot_env env = {
        .rank = sub, .size = n, .source = "tally_comm_split", .split = 1, .has_listener = lfd >= 0, .listen_fd = lfd};
    env.crowded = tally__comm_crowded(comm);
    snprintf(env.host, sizeof env.host, "%s", peers[g[0].rank].ip);
    env.port = port;
    int *world = malloc((size_t)n * sizeof *world);
    int rc = world ? group_token(b, tally__comm_world_rank(comm, g[0].rank), port, color, &env)
                   : tally__seterr(TALLY_E_NOMEM, "tally_comm_split: out of memory");
    if (rc) {
        free(world);
        if (lfd >= 0) close(lfd);
        return rc;
    }
    for (int i = 0; i < n; i++) world[i] = tally__comm_world_rank(comm, g[i].rank);
    return tally__comm_create(comm, &env, world, out); /* takes world and the listener */
}

static int split(tally_comm *comm, int color, int key, tally_comm **out) {
    int rank = tally_comm_rank(comm), size = tally_comm_size(comm), rc;
    int32_t mine[2] = {color < 0 ? TALLY_COLOR_NONE : color, key}, port = 0;
    int32_t *all = malloc((size_t)size * 2 * sizeof *all), *ports = malloc((size_t)size * sizeof *ports);
    member *g = malloc((size_t)size * sizeof *g);
    if (!all || !ports || !g) {
        rc = tally__seterr(TALLY_E_NOMEM, "tally_comm_split: out of memory for %d ranks", size);
        goto out;
    }
    if ((rc = tally_allgather(comm, mine, all, 2, TALLY_I32))) goto out;
    int n = mine[0] < 0 ? 0 : group_of(all, size, mine[0], g), sub = 0, lfd = -1;
    while (sub < n && g[sub].rank != rank) sub++;
    char why[512] = "";
    if (n > 1 && sub == 0 && (port = listen_for_group(&tally__boot_peers(tally__comm_boot(comm))[rank], &lfd)) < 0)
        snprintf(why, sizeof why, "%s", tally_last_error());
    rc = tally_allgather(comm, &port, ports, 1, TALLY_I32); /* every rank, whatever the listen did */
    if (rc || n == 0) {
        if (lfd >= 0) close(lfd);
        goto out;
    }
    if (n > 1 && ports[g[0].rank] < 0) {
        rc = sub == 0 ? tally__seterr(TALLY_E_SYSTEM, "rank %d: tally_comm_split: %s", rank, why)
                      : tally__seterr(TALLY_E_SYSTEM,
                                      "rank %d: tally_comm_split: rank %d, the first of this rank's group, could not "
                                      "listen for the group's rendezvous (its message says why)",
                                      rank, g[0].rank);
        goto out;
    }
    rc = join_group(comm, g, n, sub, mine[0], n > 1 ? ports[g[0].rank] : 0, lfd, out);
out:
    free(all);
    free(ports);
    free(g);
    return rc;
}

TALLY_API int tally_comm_split(tally_comm *comm, int color, int key, tally_comm **newcomm) {
    tally__clearerr();
    if (!newcomm) return tally__seterr(TALLY_E_INVALID, "tally_comm_split: newcomm pointer is NULL");
    *newcomm = NULL;
    if (!comm) return tally__seterr(TALLY_E_INVALID, "tally_comm_split: comm is NULL");
    int foreign = tally__comm_foreign(comm, "tally_comm_split");
    return foreign ? foreign : split(comm, color, key, newcomm);
}

TALLY_API int tally_comm_split_host(tally_comm *comm, tally_comm **newcomm) {
    tally__clearerr();
    if (!newcomm) return tally__seterr(TALLY_E_INVALID, "tally_comm_split_host: newcomm pointer is NULL");
    *newcomm = NULL;
    if (!comm) return tally__seterr(TALLY_E_INVALID, "tally_comm_split_host: comm is NULL");
    int foreign = tally__comm_foreign(comm, "tally_comm_split_host");
    if (foreign) return foreign;
    const tally__peer *p = tally__boot_peers(tally__comm_boot(comm));
    int rank = tally_comm_rank(comm), size = tally_comm_size(comm);
    int *host = malloc((size_t)size * sizeof *host), *local = malloc((size_t)size * sizeof *local);
    int rc = host && local && tally__hosts_of(p, size, host, local) >= 0
                 ? split(comm, host[rank], rank, newcomm)
                 : tally__seterr(TALLY_E_NOMEM, "tally_comm_split_host: out of memory for %d ranks", size);
    free(host);
    free(local);
    return rc;
}
