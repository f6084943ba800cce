/* test_blas_core.c - tally runs OpenBLAS's fastest kernels this CPU has, even where OpenBLAS's detection
 * falls back to SSE ones (a CPU newer than its release); a user's OPENBLAS_CORETYPE always stands. Under
 * an address-space limit OpenBLAS loads with one thread unless the user chose, and the ranks of tally run
 * do not inherit that. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "harness.h"
#include "nn/blas_core.h"

static const char *const sse_only[] = {"Prescott",  "Katmai",     "Coppermine", "Northwood", "Banias", "Core2",
                                       "Penryn",    "Dunnington", "Nehalem",    "Atom",      "Athlon", "Opteron",
                                       "Barcelona", "Bobcat",     "Nano",       "unknown",   NULL};

static int is_sse_only(const char *core) {
    for (int i = 0; sse_only[i]; i++)
        if (!strcasecmp(core, sse_only[i])) return 1;
    return 0;
}

static int cpu_has_avx2(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* The core `tally --version` names, run with the shell prefix env (it sets or unsets the variables). */
static void version_core(const char *env, char *core, size_t cap, char *line, size_t line_cap) {
    char cmd[1024], out[2048];
    snprintf(cmd, sizeof cmd, "%s '%s' --version", env, getenv("TALLY_BIN"));
    int rc = th_shell(cmd, 20, out, sizeof out);
    TH_CHECK(rc == 0, "%s: tally --version failed (%d): %s", cmd, rc, out);
    const char *at = strstr(out, "OpenBLAS kernels: ");
    core[0] = line[0] = 0;
    TH_CHECK(at != NULL, "tally --version names no OpenBLAS kernels: %s", out);
    if (!at) return;
    snprintf(line, line_cap, "%.*s", (int)strcspn(at, "\n"), at);
    at += strlen("OpenBLAS kernels: ");
    snprintf(core, cap, "%.*s", (int)strcspn(at, " \n"), at);
}

/* Unset: not an SSE-only set on a CPU with AVX2; the ranks of tally run get the same choice. */
static void t_unset_picks_the_cpu_best(void) {
    char core[64], line[256], cmd[1024], out[512];
    version_core("env -u OPENBLAS_CORETYPE -u TALLY_BLAS_CORE_DETECTED", core, sizeof core, line, sizeof line);
    if (cpu_has_avx2()) TH_CHECK(!is_sse_only(core), "an AVX2 CPU runs OpenBLAS's %s kernels: %s", core, line);
    printf("  unset: %s\n", line);
    snprintf(cmd, sizeof cmd,
             "env -u OPENBLAS_CORETYPE -u TALLY_BLAS_CORE_DETECTED '%s' run -n 1 --timeout 20 -- sh -c "
             "'echo \"core=$OPENBLAS_CORETYPE\"'",
             getenv("TALLY_BIN"));
    int rc = th_shell(cmd, 30, out, sizeof out);
    TH_CHECK(rc == 0, "tally run -n 1 -- sh failed (%d): %s", rc, out);
    char want[128];
    snprintf(want, sizeof want, "core=%s\n", strstr(line, "set by tally") ? core : "");
    TH_CHECK(strstr(out, want) != NULL, "a rank of tally run sees %s, want %s", out, want);
}

/* Set: the user's choice stands, even an SSE one. */
static void t_set_is_respected(void) {
    char core[64], line[256];
    version_core("env -u TALLY_BLAS_CORE_DETECTED OPENBLAS_CORETYPE=Prescott", core, sizeof core, line, sizeof line);
    TH_CHECK(!strcmp(core, "Prescott"), "OPENBLAS_CORETYPE=Prescott gave %s: %s", core, line);
    if (cpu_has_avx2()) {
        version_core("env -u TALLY_BLAS_CORE_DETECTED OPENBLAS_CORETYPE=Haswell", core, sizeof core, line, sizeof line);
        TH_CHECK(!strcmp(core, "Haswell"), "OPENBLAS_CORETYPE=Haswell gave %s: %s", core, line);
    }
}

/* In a process: nothing to suggest while the variable is set; a suggestion only for an SSE-only pick. */
static void t_library_suggestion(void) {
    const char *better = tally__blas_core_better(), *core = tally__blas_core_name();
    if (getenv("OPENBLAS_CORETYPE"))
        TH_CHECK(better == NULL, "OPENBLAS_CORETYPE is set, yet %s is suggested", better);
    else if (!is_sse_only(core))
        TH_CHECK(better == NULL, "OpenBLAS runs %s, yet %s is suggested", core, better);
    else if (cpu_has_avx2())
        TH_CHECK(better != NULL && !is_sse_only(better), "OpenBLAS runs %s on an AVX2 CPU, suggested %s", core,
                 better ? better : "nothing");
    printf("  this process: %s, suggested %s\n", core, better ? better : "nothing");
}

/* Under ulimit -v: one thread at load, said by --version; a rank of tally run sees the environment the
 * user gave (no OPENBLAS_NUM_THREADS of tally's), and a thread count the user set stands. */
static void t_address_space_limit(void) {
    static const char limit[] = "prlimit --as=2048000000"; /* a finite limit that tally runs under */
    char cmd[1024], out[2048];
    snprintf(cmd, sizeof cmd, "%s env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS -u GOTO_NUM_THREADS '%s' --version",
             limit, getenv("TALLY_BIN"));
    int rc = th_shell(cmd, 20, out, sizeof out);
    TH_CHECK(rc == 0 && strstr(out, "OpenBLAS threads at load: 1 (one: an address-space limit"),
             "under ulimit -v, OpenBLAS loads with one thread and --version says why (%d): %s", rc, out);
    snprintf(
        cmd, sizeof cmd,
        "%s env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS -u GOTO_NUM_THREADS '%s' run -n 1 --timeout 20 -- sh -c "
        "'echo \"threads=$OPENBLAS_NUM_THREADS mark=$TALLY_BLAS_THREADS_CAPPED.\"'",
        limit, getenv("TALLY_BIN"));
    rc = th_shell(cmd, 30, out, sizeof out);
    TH_CHECK(rc == 0 && strstr(out, "threads= mark=."), "a rank under ulimit -v inherits tally's cap (%d): %s", rc,
             out);
    snprintf(cmd, sizeof cmd, "%s env OPENBLAS_NUM_THREADS=2 '%s' --version", limit, getenv("TALLY_BIN"));
    rc = th_shell(cmd, 20, out, sizeof out);
    TH_CHECK(rc == 0 && strstr(out, "OpenBLAS threads at load: 2\n"), "OPENBLAS_NUM_THREADS=2 stands (%d): %s", rc,
             out);
    snprintf(cmd, sizeof cmd, "env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS -u GOTO_NUM_THREADS '%s' --version",
             getenv("TALLY_BIN"));
    rc = th_shell(cmd, 20, out, sizeof out);
    TH_CHECK(rc == 0 && strstr(out, "OpenBLAS threads at load: ") && !strstr(out, "(one: an address-space"),
             "without a limit OpenBLAS keeps its own thread count (%d): %s", rc, out);
}

int main(void) {
    if (!getenv("TALLY_BIN")) return fprintf(stderr, "test_blas_core: TALLY_BIN is not set\n"), 2;
    if (!th_light()) t_address_space_limit(); /* a sanitizer's shadow memory needs more than any such limit */
    t_library_suggestion();
    t_unset_picks_the_cpu_best();
    t_set_is_respected();
    return th_verdict("test_blas_core");
}
