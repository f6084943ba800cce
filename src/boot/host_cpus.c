/* host_cpus.c - whether every rank on this host can have a CPU of its own: the union of the host's
 * ranks' affinity sets against their count, gathered once at init for the transports' wait policy. */
#include <sched.h>
#include <stdlib.h>

#include "boot.h"
#include "../core/err.h"
#include "host_cpus.h"

/* A rank's own set is no guide: one bound to a single CPU sees one CPU however many its host's ranks
 * share between them; and ranks in different cpusets may each see all of theirs. */
int tally__host_crowded(tally__boot *boot, int rank, int size, int *crowded) {
    cpu_set_t mine, all_cpus;
    *crowded = 0;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);
    cpu_set_t *all = malloc((size_t)size * sizeof *all);
    if (!all) return tally__seterr(TALLY_E_NOMEM, "rank %d: out of memory gathering the ranks' CPU sets", rank);
    int rc = tally__boot_allgather(boot, &mine, all, sizeof mine);
    if (rc) {
        free(all);
        return rc;
    }
    const tally__peer *peers = tally__boot_peers(boot);
    int local = 0, unknown = 0;
    CPU_ZERO(&all_cpus);
    for (int r = 0; r < size; r++) {
        if (peers[r].hostid != peers[rank].hostid) continue;
        local++;
        unknown |= CPU_COUNT(&all[r]) == 0;
        CPU_OR(&all_cpus, &all_cpus, &all[r]);
    }
    free(all);
    if (!unknown) *crowded = local > CPU_COUNT(&all_cpus);
    return 0;
}
