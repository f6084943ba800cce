/* test_bench.c - `tally bench` end to end: it starts its own ranks, prints the nccl-tests table with
 * every result checked (#wrong 0), and TALLY_DEBUG=1 logs the transport and each algorithm choice. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

static const char *tally_bin(void) {
    const char *b = getenv("TALLY_BIN");
    return b && *b ? b : "./tally";
}

static int run(const char *cmd, char *out, size_t cap) { return th_shell(cmd, 180, out, cap); }

static int count_rows(const char *out) {
    int rows = 0;
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (*l == ' ') rows++;
    return rows;
}

static void check_bench(const char *args, int want_rows) {
    static char out[1 << 16];
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench %s -c --iters 3 --warmup 1", tally_bin(), args);
    int st = run(cmd, out, sizeof out);
    TH_CHECK(st == 0, "'%s' exited %d:\n%s", cmd, st, out);
    TH_CHECK(strstr(out, "# Out of bounds values : 0 OK") != NULL, "'%s': results not all correct:\n%s", cmd, out);
    TH_CHECK(strstr(out, "#wrong") && strstr(out, "busbw") && strstr(out, "algbw") && strstr(out, "redop"),
             "'%s': table header lacks nccl-tests columns:\n%s", cmd, out);
    TH_CHECK(strstr(out, "# Avg bus bandwidth") != NULL, "'%s': no footer:\n%s", cmd, out);
    TH_CHECK(count_rows(out) == want_rows, "'%s': %d rows, want %d:\n%s", cmd, count_rows(out), want_rows, out);
}

int main(void) {
    check_bench("allreduce -n 2 -b 8 -e 1M -f 16", 5);
    check_bench("allreduce -n 3 -b 1K -e 64K -f 4 -t bf16 -o max --transport tcp", 4);
    check_bench("reduce_scatter -n 3 -b 96 -e 96K -f 32 -t i32 -o avg --algo rhd", 3);
    check_bench("allgather -n 4 -b 64 -e 64K -f 32 -t u8 --algo ring", 3);
    check_bench("broadcast -n 3 -b 4 -e 4M -f 1024 -t f64 -r 2 --algo tree", 3);
    check_bench("allreduce -n 5 -b 4 -e 1M -f 256 -t f16 -o prod --algo direct --transport shm", 3);
    check_bench("allreduce -n 3 -b 1 -e 64K -f 64 -t bool -o bxor", 3); /* inputs of 2 are stored as 1 */

    static char out[1 << 16];
    char cmd[512];
    snprintf(cmd, sizeof cmd, "env TALLY_DEBUG=1 %s bench allreduce -n 2 -b 8 -e 4M -f 512 --iters 2", tally_bin());
    int st = run(cmd, out, sizeof out);
    TH_CHECK(st == 0, "'%s' exited %d", cmd, st);
    TH_CHECK(strstr(out, "transport shm") && strstr(out, "alpha"),
             "TALLY_DEBUG=1 does not log the transport "
             "and the measured link:\n%s",
             out);
    TH_CHECK(strstr(out, "allreduce of 8 bytes on 2 ranks:") && strstr(out, "(model:"),
             "TALLY_DEBUG=1 does not log the algorithm chosen by the model:\n%s", out);

    snprintf(cmd, sizeof cmd, "%s bench allreduce -n 2 -t nosuchtype", tally_bin());
    TH_CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "-t 'nosuchtype' is not a type") && strstr(out, "--help"),
             "a bad dtype is not named, with where the flags are described:\n%s", out);
    snprintf(cmd, sizeof cmd, "%s bench allreduce -n 2 -t f32 -o band", tally_bin());
    TH_CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "-o band does not take -t f32") && strstr(out, "bool"),
             "a bitwise op on a float type is not refused, naming both and what the op takes:\n%s", out);
    snprintf(cmd, sizeof cmd, "%s bench reduce_scatter -n 2 -t bool -o avg", tally_bin());
    TH_CHECK(run(cmd, out, sizeof out) == 2 && strstr(out, "-o avg does not take -t bool"),
             "avg on bool is not refused:\n%s", out);
    return th_verdict("test_bench");
}
