/* host_cpus.c - whether every rank on this kernel can have a CPU of its own: the union of the kernel's
 * ranks' affinity sets against their count, gathered once at init for the transports' wait policy. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "boot.h"
#include "../core/err.h"
#include "host_cpus.h"

/* What each rank tells: its CPU set and its kernel. CPUs belong to a kernel, not to a host as the peer
 * table tells hosts apart: ranks in two network namespaces of one kernel (containers, the test hosts of
 * scripts/hosts.sh) are two hosts to the transports but share its CPUs. */
typedef struct cpus_of {
    cpu_set_t set;
    char kernel[40]; /* /proc/sys/kernel/random/boot_id, "" when unreadable */
} cpus_of;

/* A rank's own set is no guide: one bound to a single CPU sees one CPU however many its kernel's ranks
 * share between them; and ranks in different cpusets may each see all of theirs. */
int tally__host_crowded(tally__boot *boot, int rank, int size, int *crowded, int *cpus) {
    cpus_of mine;
    cpu_set_t all_cpus;
    *crowded = 0;
    *cpus = 0;
    memset(&mine, 0, sizeof mine);
    if (sched_getaffinity(0, sizeof mine.set, &mine.set) != 0) CPU_ZERO(&mine.set);
    tally__boot_kernel_id(mine.kernel, sizeof mine.kernel);
    cpus_of *all = malloc((size_t)size * sizeof *all);
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
        all[r].kernel[sizeof all[r].kernel - 1] = '\0';
        int same = mine.kernel[0] ? !strcmp(all[r].kernel, mine.kernel) : peers[r].hostid == peers[rank].hostid;
        if (!same) continue;
        local++;
        unknown |= CPU_COUNT(&all[r].set) == 0;
        CPU_OR(&all_cpus, &all_cpus, &all[r].set);
    }
    free(all);
    if (!unknown) {
        *cpus = CPU_COUNT(&all_cpus);
        *crowded = local > *cpus;
    }
    return 0;
}
