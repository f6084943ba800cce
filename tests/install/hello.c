/* hello.c - a program built only from the installed tally (pkg-config) and started by mpirun:
 * every rank allreduces its rank number and checks the sum. */
#include <stdio.h>
#include <tally.h>

int main(void) {
    tally_comm *c;
    int rc = tally_comm_init(&c);
    if (rc) {
        fprintf(stderr, "tally_comm_init: %s: %s\n", tally_strerror(rc), tally_last_error());
        return 1;
    }
    int rank = tally_comm_rank(c), n = tally_comm_size(c);
    long long x = rank, want = (long long)n * (n - 1) / 2;
    rc = tally_allreduce(c, &x, &x, 1, TALLY_I64, TALLY_SUM);
    if (rc || x != want) {
        fprintf(stderr, "rank %d: allreduce gave %lld (want %lld): %s\n", rank, x, want, tally_last_error());
        return 1;
    }
    printf("rank %d of %d: sum of ranks %lld over %s\n", rank, n, x, tally_comm_transport(c));
    tally_comm_free(c);
    return 0;
}
