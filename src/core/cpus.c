/* cpus.c - the CPUs this process may use, from sched_getaffinity (the set taskset or a cgroup gave it),
 * falling back to the online count; where this thread runs, and a move to a CPU nobody uses. */
#include "cpus.h"

#include <sched.h>
#include <stdio.h>
#include <unistd.h>

int tally__cpus_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void tally__cpus_list(char *buf, size_t n) {
    cpu_set_t set;
    size_t o = 0;
    buf[0] = '\0';
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        snprintf(buf, n, "?");
        return;
    }
    for (int c = 0; c < CPU_SETSIZE && o < n; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) e++;
        o += (size_t)snprintf(buf + o, n - o, e > c ? "%s%d-%d" : "%s%d", o ? "," : "", c, e);
        c = e;
    }
}

unsigned tally__cpus_current(void) {
    int c = sched_getcpu();
    return c < 0 ? 0u : (unsigned)c + 1u;
}

int tally__cpus_move_off(const cpu_set_t *busy, int salt) {
    cpu_set_t mine, one;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) return -1;
    int nfree = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) nfree += CPU_ISSET(c, &mine) && !CPU_ISSET(c, busy);
    if (nfree == 0) return -1;
    int k = (salt < 0 ? -salt : salt) % nfree, to = -1;
    for (int c = 0; c < CPU_SETSIZE && to < 0; c++)
        if (CPU_ISSET(c, &mine) && !CPU_ISSET(c, busy) && k-- == 0) to = c;
    CPU_ZERO(&one);
    CPU_SET(to, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) return -1;
    sched_setaffinity(0, sizeof mine, &mine);
    return to;
}

#define CROWDING_MOVE_NS 100000u  /* yielding to a peer on our CPU this long (summed) before one moves */
#define CROWDING_GAP_NS  5000000u /* yields further apart than this are different spells */

int tally__crowding_yield(tally__crowding *c, uint64_t now) {
    c->ns = now - c->at > CROWDING_GAP_NS ? 0 : c->ns + (now - c->at);
    c->at = now;
    if (c->ns <= CROWDING_MOVE_NS) return 0;
    c->ns = 0;
    return 1;
}
