/* place.h - where the local ranks tally starts run: rank r on its own CPUs of the set tally was given
 * (one thread of each physical core first), or, when they do not fit or --bind none, unpinned. */
#ifndef TALLY_TOOLS_PLACE_H
#define TALLY_TOOLS_PLACE_H

/* Rank r's CPUs are order[r * per .. r * per + per) when pinned; else every rank keeps the inherited set. */
typedef struct tally_place {
    int n, per;
    int *order;  /* the CPUs of the set tally was given, one thread of every core first */
    int pinned;  /* 1 when every rank has CPUs of its own */
    int allowed; /* CPUs in that set */
    int cores;   /* physical cores among them */
} tally_place;

/* "core" (the default, also when s is NULL) or "none"; anything else is TALLY_E_INVALID naming `name`
 * (a flag or TALLY_CPU_BIND). */
int tally_place_parse(const char *name, const char *s, int *bind_core);

/* Plans n ranks of `per` CPUs each (a rank's BLAS threads) within this process's affinity set: with
 * bind_core and n * per <= the CPUs there, rank r gets the r-th block of `per` of them, each physical
 * core's first thread before any core's second, so ranks share a core only when there are more ranks
 * than cores; otherwise no rank is pinned and the scheduler spreads them over the whole set. Never a
 * CPU outside the set. 0, or -1 when out of memory. */
int tally_place_plan(int n, int per, int bind_core, tally_place *p);
void tally_place_free(tally_place *p);

#endif
