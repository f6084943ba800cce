/* host_cpus.h - the CPUs the ranks on this kernel cover together: whether the ranks outnumber them (then
 * a waiter must yield rather than spin), and how many copies may run there at once. */
#ifndef TALLY_BOOT_HOST_CPUS_H
#define TALLY_BOOT_HOST_CPUS_H

struct tally__boot;

/* Collective over every rank (one bootstrap allgather). *crowded = 1 when the ranks on this rank's
 * kernel (its boot id; network namespaces do not part them) outnumber the CPUs of the union of their
 * sets; 0 otherwise, also when a set could not be read. *cpus = how many CPUs that union holds (0 when a
 * set could not be read). */
int tally__host_crowded(struct tally__boot *boot, int rank, int size, int *crowded, int *cpus);

#endif
