/* hosts.c - which host each rank is on, as the peer table tells hosts apart (hostid): each host's index
 * among the hosts, numbered in order of their first rank, and each rank's index among its host's ranks. */
#include <stdlib.h>

#include "boot.h"

int tally__hosts_of(const tally__peer *p, int size, int *host, int *local) {
    int hosts = 0, *seen = calloc((size_t)size, sizeof *seen); /* ranks met so far, per host index */
    if (!seen) return -1;
    for (int r = 0; r < size; r++) {
        int first = 0;
        while (p[first].hostid != p[r].hostid) first++;
        host[r] = first == r ? hosts++ : host[first];
        local[r] = seen[host[r]]++;
    }
    free(seen);
    return hosts;
}
