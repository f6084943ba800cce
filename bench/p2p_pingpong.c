/* p2p_pingpong.c - point-to-point ping-pong between ranks 0 and 1 (`tally run -n 2 build/bench_p2p`):
 * the median one-way time and bandwidth of tally_send/tally_recv at each size from -b to -e bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One round trip: rank 0 sends and waits for the echo. */
static int round_trip(tally_comm *c, int rank, char *buf, size_t n) {
    if (rank == 0) {
        int rc = tally_send(c, buf, n, TALLY_U8, 1, 0);
        return rc ? rc : tally_recv(c, buf, n, TALLY_U8, 1, 0, NULL);
    }
    int rc = tally_recv(c, buf, n, TALLY_U8, 0, 0, NULL);
    return rc ? rc : tally_send(c, buf, n, TALLY_U8, 0, 0);
}

int main(int argc, char **argv) {
    size_t minb = 1024, maxb = 64u << 20;
    int reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-b")) minb = strtoull(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "-e")) maxb = strtoull(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "-r")) reps = atoi(argv[i + 1]);
    }
    tally_comm *c;
    if (tally_comm_init(&c)) return fprintf(stderr, "init: %s\n", tally_last_error()), 1;
    int rank = tally_comm_rank(c);
    char *buf = calloc(1, maxb);
    double *t = calloc((size_t)reps, sizeof *t);
    if (rank == 0)
        printf("# transport %s; one-way time (median of %d round trips / 2)\n%14s %12s %10s\n", tally_comm_transport(c),
               reps, "bytes", "time_us", "GB/s");
    for (size_t n = minb; n <= maxb && rank < 2; n *= 4) {
        int iters = n >= (1u << 20) ? 1 : 10;
        if (round_trip(c, rank, buf, n)) break; /* warm-up: connections, pages */
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            for (int k = 0; k < iters; k++)
                if (round_trip(c, rank, buf, n)) return fprintf(stderr, "%s\n", tally_last_error()), 1;
            t[r] = (now() - t0) / iters / 2;
        }
        qsort(t, (size_t)reps, sizeof *t, by_value);
        if (rank == 0) printf("%14zu %12.2f %10.3f\n", n, t[reps / 2] * 1e6, n / t[reps / 2] * 1e-9);
    }
    tally_barrier(c);
    tally_comm_free(c);
    free(buf);
    free(t);
    return 0;
}
