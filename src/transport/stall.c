/* stall.c - whom a wait that ran out of TALLY_TIMEOUT blames: the awaited rank may itself wait, so the chain
 * of waits is followed to the rank that is not waiting (it never arrived, or is stuck), named by every rank. */
#include <stdio.h>
#include <string.h>

#include "transport.h"

#define STALL_SHOWN 8 /* hops spelled out in a message; longer chains are elided in the middle */

/* Follows the waits from s->awaited. Returns the chain's length; *cycle is set when it loops back.
 * seqs[i] is the collective chain[i] waits in (chain[len - 1] waits in none). */
static int stall_chain(const tally__stall *s, int *chain, uint64_t *seqs, int *cycle) {
    int len = 0;
    *cycle = 0;
    chain[len++] = s->awaited;
    while (len < s->size) {
        int q = s->awaits(s->arg, chain[len - 1], &seqs[len - 1]);
        if (q < 0 || q >= s->size) break;
        for (int i = 0; i < len; i++) *cycle |= chain[i] == q;
        if (q == s->me || *cycle) {
            *cycle = 1;
            break;
        }
        chain[len++] = q;
    }
    return len;
}

/* "rank 0, which waits for rank 3 (in #7), which waits for rank 2": a rank that waits in another
 * collective than ours says which. */
static void stall_path(const tally__stall *s, const int *chain, const uint64_t *seqs, int len, char *out, size_t n) {
    size_t used = (size_t)snprintf(out, n, "rank %d", chain[0]);
    for (int i = 1; i < len && used < n; i++) {
        if (len > STALL_SHOWN && i == STALL_SHOWN / 2) {
            used += (size_t)snprintf(out + used, n - used, ", which waits for ... (%d more)", len - STALL_SHOWN);
            i = len - STALL_SHOWN / 2;
        }
        if (seqs[i - 1] != s->sig->seq && used < n)
            used += (size_t)snprintf(out + used, n - used, " (in #%llu)", (unsigned long long)seqs[i - 1]);
        if (used < n) used += (size_t)snprintf(out + used, n - used, ", which waits for rank %d", chain[i]);
    }
}

/* The end of the chain may itself wait where this rank cannot see (a host-mate over shm): a rank that
 * sees that link times out about as soon, and names the rank that holds both up; its verdict, when it
 * comes within the grace, is taken instead (1), so every rank names the same one. */
static int stall_defer(tally__fault *f, const tally__stall *s, int end) {
    return s->hidden && s->hidden(s->arg, end) && tally__fault_await(f, TALLY__LOST_GRACE_S);
}

int tally__stall_raise(tally__fault *f, const tally__stall *s) {
    int chain[TALLY__STALL_MAX], cycle = 0, len = 1;
    uint64_t seqs[TALLY__STALL_MAX];
    char who[160] = "", coll[160], path[400];
    chain[0] = s->awaited;
    if (s->awaits && s->size <= TALLY__STALL_MAX) len = stall_chain(s, chain, seqs, &cycle);
    tally__sig_format(s->sig, coll, sizeof coll);
    if (len == 1 || cycle) {
        if (!cycle && stall_defer(f, s, s->awaited)) return tally__fault_report(f);
        if (s->label) s->label(s->arg, s->awaited, who, sizeof who);
        if (cycle) stall_path(s, chain, seqs, len, path, sizeof path);
        return tally__fault_raise(f, TALLY_E_TIMEOUT, s->awaited,
                                  "rank %d%s %s within %g s (TALLY_TIMEOUT); is it stuck, stopped, or in a different "
                                  "call?%s%s%s",
                                  s->awaited, who, s->detail, s->timeout_s,
                                  cycle ? " The ranks wait for each other: " : "", cycle ? path : "",
                                  cycle ? ", which waits for one of them." : "");
    }
    int h = chain[len - 1];
    if (stall_defer(f, s, h)) return tally__fault_report(f);
    if (s->label) s->label(s->arg, h, who, sizeof who);
    stall_path(s, chain, seqs, len, path, sizeof path);
    return tally__fault_raise(f, TALLY_E_TIMEOUT, h,
                              "rank %d%s holds up %s: rank %d waited %g s (TALLY_TIMEOUT) for %s, which is not "
                              "waiting for anyone; is rank %d stuck, stopped, or in a different call?",
                              h, who, coll, s->me, s->timeout_s, path, h);
}
