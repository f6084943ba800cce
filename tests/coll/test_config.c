/* test_config.c - communicators made from a tally_config: worlds of 2 and 3 ranks over shm and tcp with
 * no TALLY_* variable in sight, two communicators of one process each keeping its own timeout, bad
 * fields refused by name, the log callback taking the debug lines, tally_config_from_env naming the
 * variable that is wrong, and the remembered algorithm choice answering as the model does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <unistd.h>

#include "coll/algo.h"
#include "coll/coll.h"
#include "harness.h"

extern char **environ;

typedef struct result {
    int rc, size, left_env, debug_lines, other_levels, a_rc, algo_ok;
    char transport[16], msg[800], line[400];
    double sum, timeout_a, timeout_b, waited;
} result;

static result *R; /* [TH_MAX_RANKS], shared */

/* What the harness gave this rank, then every TALLY_* variable gone, so only the config speaks. */
typedef struct given {
    char addr[272], token[256], flight[449];
} given;

static void take_env_away(given *g) {
    snprintf(g->addr, sizeof g->addr, "%s", getenv("TALLY_ADDR"));
    snprintf(g->token, sizeof g->token, "%s", getenv("TALLY_TOKEN"));
    snprintf(g->flight, sizeof g->flight, "%s", getenv("TALLY_FLIGHT_DIR") ? getenv("TALLY_FLIGHT_DIR") : "");
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++) {
            if (strncmp(*e, "TALLY_", 6)) continue;
            char name[128];
            size_t n = strcspn(*e, "=");
            snprintf(name, sizeof name, "%.*s", (int)n, *e);
            unsetenv(name);
            again = 1; /* environ changed under us: start over */
            break;
        }
    }
}

static void config_of(tally_config *cfg, const given *g, int rank, int size, int transport) {
    *cfg = (tally_config)TALLY_CONFIG_INIT;
    cfg->rank = rank;
    cfg->size = size;
    snprintf(cfg->address, sizeof cfg->address, "%s", g->addr);
    snprintf(cfg->token, sizeof cfg->token, "%s", g->token);
    snprintf(cfg->flight_dir, sizeof cfg->flight_dir, "%s", g->flight);
    cfg->transport = transport;
    cfg->cost_alpha_us = 2; /* TH_COST: no measuring */
    cfg->cost_beta_gbps = 5;
    cfg->cost_gamma_gbps = 10;
}

/* ---- a world from its config alone ---- */

/* The choice tally_comm_algo_for reports is the model's, asked afresh, for sizes asked in turn and again
 * after others (each collective remembers its last choice: a repeated size must not answer a new one). */
static int algo_choice_holds(tally_comm *c, char *msg, size_t n) {
    static const size_t sizes[] = {8, 1024, 65536, 1 << 20, 64 << 20, 1024, 8, 1 << 20, 1 << 20, 0, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        const char *said = tally_comm_algo_for(c, sizes[i]);
        const char *model =
            tally__algo_name(tally__algo_choose(tally__comm_cost(c), TALLY__ALLREDUCE, tally_comm_size(c), sizes[i]));
        if (strcmp(said, model)) {
            snprintf(msg, n, "%zu bytes (ask %zu): algo_for says %s, the model %s", sizes[i], i, said, model);
            return 0;
        }
    }
    return 1;
}

static int fn_plain(int rank, int size, void *arg) {
    given g;
    take_env_away(&g);
    tally_config env = TALLY_CONFIG_INIT, cfg;
    tally_config_from_env(&env);
    R[rank].left_env = env.rank != -1 || env.size != 0; /* the environment says nothing now */
    config_of(&cfg, &g, rank, size, *(const int *)arg);
    tally_comm *c = NULL;
    int rc = tally_comm_init_config(&c, &cfg);
    double v = rank + 1;
    if (!rc) rc = tally_allreduce(c, &v, &R[rank].sum, 1, TALLY_F64, TALLY_SUM);
    if (c) {
        R[rank].algo_ok = algo_choice_holds(c, R[rank].line, sizeof R[rank].line);
        R[rank].size = tally_comm_size(c);
        snprintf(R[rank].transport, sizeof R[rank].transport, "%s", tally_comm_transport(c));
    }
    R[rank].rc = rc;
    if (rc) snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_last_error());
    tally_comm_free(c);
    return 0;
}

static void test_plain(int n, int transport, const char *name) {
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(n, NULL, fn_plain, &transport) == 0, "%d ranks over %s: ranks did not exit cleanly", n, name);
    for (int r = 0; r < n; r++)
        TH_CHECK(R[r].rc == 0 && !R[r].left_env && R[r].size == n && R[r].sum == n * (n + 1) / 2.0 &&
                     !strcmp(R[r].transport, name),
                 "%d ranks over %s: rank %d got rc %d, size %d, sum %g, transport %s, env left %d: %s", n, name, r,
                 R[r].rc, R[r].size, R[r].sum, R[r].transport, R[r].left_env, R[r].msg);
    for (int r = 0; r < n; r++)
        TH_CHECK(R[r].rc || R[r].algo_ok, "%d ranks over %s: rank %d: %s", n, name, r, R[r].line);
}

/* ---- two communicators, two timeouts ---- */

static int *g_port_b;
static double *g_a_failed;

/* A (timeout 1 s) and B (timeout 30 s) over the same two ranks. B waits 2.5 s for a late rank and
 * succeeds; A gives up on a rank that does not come within 1 s; B still works after. */
static int fn_two(int rank, int size, void *arg) {
    given g;
    take_env_away(&g);
    tally_config ca, cb;
    config_of(&ca, &g, rank, size, TALLY_TRANSPORT_AUTO);
    ca.timeout = 1;
    config_of(&cb, &g, rank, size, TALLY_TRANSPORT_AUTO);
    cb.timeout = 30;
    snprintf(cb.address, sizeof cb.address, "127.0.0.1:%d", *g_port_b);
    tally_comm *a = NULL, *b = NULL;
    int rc = tally_comm_init_config(&a, &ca);
    if (!rc) rc = tally_comm_init_config(&b, &cb);
    if (rc) {
        R[rank].rc = rc;
        snprintf(R[rank].msg, sizeof R[rank].msg, "init: %s", tally_last_error());
        tally_comm_free(b);
        tally_comm_free(a);
        return 0;
    }
    R[rank].timeout_a = tally__comm_timeout_s(a);
    R[rank].timeout_b = tally__comm_timeout_s(b);
    double one = 1, sum = 0;
    if (rank == 1) usleep(2500 * 1000);
    double t0 = th_now();
    rc = tally_allreduce(b, &one, &sum, 1, TALLY_F64, TALLY_SUM);
    R[rank].waited = th_now() - t0;
    if (rc || sum != 2) {
        R[rank].rc = rc ? rc : -100;
        snprintf(R[rank].msg, sizeof R[rank].msg, "late rank on B: %s", tally_last_error());
    } else if (rank == 0) {
        R[rank].a_rc = tally_barrier(a); /* rank 1 stays away */
        snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_last_error());
        *g_a_failed = 1;
    } else {
        /* Then its own call finds A broken. Not a barrier: rank 0's part of its barrier may already be
         * here, and a barrier that hears from every rank completes before the fault's notice arrives; a
         * call of another kind fails either way (the notice, or the mismatch with rank 0's barrier). */
        th_wait_set(g_a_failed, 60);
        R[rank].a_rc = tally_allreduce(a, &one, &sum, 1, TALLY_F64, TALLY_SUM);
    }
    if (!R[rank].rc) {
        R[rank].rc = tally_allreduce(b, &one, &sum, 1, TALLY_F64, TALLY_SUM);
        if (R[rank].rc) snprintf(R[rank].msg, sizeof R[rank].msg, "B after A failed: %s", tally_last_error());
    }
    tally_comm_free(a);
    tally_comm_free(b);
    return 0;
}

static void test_two_timeouts(void) {
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    g_port_b = th_shared_alloc(sizeof *g_port_b);
    g_a_failed = th_shared_alloc(sizeof *g_a_failed);
    *g_port_b = th_free_port();
    TH_CHECK(th_run(2, NULL, fn_two, NULL) == 0, "two timeouts: ranks did not exit cleanly");
    for (int r = 0; r < 2; r++) {
        TH_CHECK(R[r].rc == 0 && R[r].timeout_a == 1 && R[r].timeout_b == 30,
                 "two timeouts: rank %d: rc %d, timeouts %g and %g: %s", r, R[r].rc, R[r].timeout_a, R[r].timeout_b,
                 R[r].msg);
        TH_CHECK(R[r].a_rc != 0, "two timeouts: rank %d: A's barrier did not fail", r);
    }
    TH_CHECK(R[0].waited >= 1.5, "two timeouts: B returned after %.1f s, before its late rank came", R[0].waited);
    TH_CHECK(R[0].a_rc == TALLY_E_TIMEOUT && strstr(R[0].msg, "rank 1"),
             "two timeouts: A's barrier on rank 0: rc %d '%s', expected a timeout naming rank 1", R[0].a_rc, R[0].msg);
    th_shared_free(g_port_b, sizeof *g_port_b);
    th_shared_free(g_a_failed, sizeof *g_a_failed);
}

/* ---- fields refused by name ---- */

static void expect_field(const tally_config *cfg, int code, const char *want, const char *what) {
    tally_comm *c = (tally_comm *)1;
    int rc = tally_comm_init_config(&c, cfg);
    TH_CHECK(rc == code && c == NULL && strstr(tally_last_error(), want), "%s: rc %d, '%s', expected %d naming '%s'",
             what, rc, tally_last_error(), code, want);
}

static void test_bad_fields(void) {
    tally_config cfg = TALLY_CONFIG_INIT;
    cfg.rank = 0;
    cfg.size = 1;
    cfg.tcp_streams = 17;
    expect_field(&cfg, TALLY_E_INVALID, "rank 0: tally_config.tcp_streams='17' is out of range", "tcp_streams 17");
    cfg = (tally_config)TALLY_CONFIG_INIT;
    snprintf(cfg.algo, sizeof cfg.algo, "fast");
    expect_field(&cfg, TALLY_E_INVALID, "tally_config.algo='fast' is not an algorithm", "algo fast");
    cfg = (tally_config)TALLY_CONFIG_INIT;
    cfg.timeout = 0;
    expect_field(&cfg, TALLY_E_INVALID, "tally_config.timeout='0' is out of range", "timeout 0");
    cfg = (tally_config)TALLY_CONFIG_INIT;
    cfg.rank = 2;
    cfg.size = 2;
    expect_field(&cfg, TALLY_E_INVALID, "tally_config.rank='2' is out of range", "rank 2 of 2");
    cfg = (tally_config)TALLY_CONFIG_INIT;
    snprintf(cfg.address, sizeof cfg.address, "node0");
    expect_field(&cfg, TALLY_E_INVALID, "tally_config.address='node0' has no port", "address without a port");
    cfg = (tally_config)TALLY_CONFIG_INIT;
    cfg.cost_beta_gbps = 5;
    expect_field(&cfg, TALLY_E_INVALID, "tally_config.cost_gamma_gbps='0' is out of range", "half a cost");
    cfg = (tally_config)TALLY_CONFIG_INIT;
    cfg.struct_size = 0;
    expect_field(&cfg, TALLY_E_INVALID, "tally_config.struct_size is 0", "no struct_size");
    expect_field(NULL, TALLY_E_INVALID, "the config is NULL", "NULL config");
    cfg = (tally_config)TALLY_CONFIG_INIT; /* valid, but nobody said who this process is */
    expect_field(&cfg, TALLY_E_BOOT, "tally_config.rank and .size", "no rank");
    cfg.rank = 0;
    cfg.size = 2;
    expect_field(&cfg, TALLY_E_BOOT, "tally_config.address is empty", "no address");
}

/* ---- the log callback ---- */

static void on_log(void *user, int level, const char *line) {
    result *r = user;
    if (level == TALLY_LOG_DEBUG && strstr(line, "debug: ")) {
        if (!r->debug_lines++) snprintf(r->line, sizeof r->line, "%s", line);
    } else if (level != TALLY_LOG_VERBOSE) {
        r->other_levels++;
    }
}

static int fn_log(int rank, int size, void *arg) {
    given g;
    take_env_away(&g);
    tally_config cfg;
    config_of(&cfg, &g, rank, size, TALLY_TRANSPORT_AUTO);
    cfg.log_level = 1;
    cfg.log_fn = on_log;
    cfg.log_user = &R[rank];
    tally_comm *c = NULL;
    R[rank].rc = tally_comm_init_config(&c, &cfg);
    if (R[rank].rc) snprintf(R[rank].msg, sizeof R[rank].msg, "%s", tally_last_error());
    tally_comm_free(c);
    return 0;
}

static void test_log(void) {
    memset(R, 0, sizeof *R * TH_MAX_RANKS);
    TH_CHECK(th_run(2, NULL, fn_log, NULL) == 0, "log callback: ranks did not exit cleanly");
    for (int r = 0; r < 2; r++) {
        char want[32];
        snprintf(want, sizeof want, "tally[rank %d] debug:", r);
        TH_CHECK(R[r].rc == 0 && R[r].debug_lines > 0 && R[r].other_levels == 0 && strstr(R[r].line, want),
                 "log callback: rank %d: rc %d, %d debug lines (first '%s'), %d of other levels: %s", r, R[r].rc,
                 R[r].debug_lines, R[r].line, R[r].other_levels, R[r].msg);
    }
}

/* ---- the environment's reader ---- */

/* var=val (and TALLY_RANK=rank when rank is not NULL) refused with code, the message naming want. */
static void expect_env(const char *var, const char *val, const char *rank, int code, const char *want) {
    setenv(var, val, 1);
    if (rank) setenv("TALLY_RANK", rank, 1);
    tally_config cfg = TALLY_CONFIG_INIT;
    int rc = tally_config_from_env(&cfg);
    TH_CHECK(rc == code && strstr(tally_last_error(), want), "%s=%s: rc %d, '%s', expected %d naming '%s'", var, val,
             rc, tally_last_error(), code, want);
    unsetenv(var);
    unsetenv("TALLY_RANK");
}

static void test_from_env(void) {
    tally_config cfg = TALLY_CONFIG_INIT;
    setenv("TALLY_TIMEOUT", "7.5", 1);
    setenv("TALLY_ALGO", "ring", 1);
    setenv("TALLY_TRANSPORT", "TCP", 1);
    setenv("TALLY_SHM_LARGE", "off", 1);
    int rc = tally_config_from_env(&cfg);
    TH_CHECK(!rc && cfg.timeout == 7.5 && !strcmp(cfg.algo, "ring") && cfg.transport == TALLY_TRANSPORT_TCP &&
                 cfg.shm_large == TALLY_SHM_LARGE_OFF && cfg.rank == -1 && cfg.size == 0 &&
                 cfg.tcp_streams == TALLY_DEFAULT_TCP_STREAMS && cfg.flight_depth == TALLY_DEFAULT_FLIGHT_DEPTH,
             "from_env: rc %d, timeout %g, algo %s, transport %d, shm_large %lld, rank %d, size %d: %s", rc,
             cfg.timeout, cfg.algo, cfg.transport, cfg.shm_large, cfg.rank, cfg.size, tally_last_error());
    unsetenv("TALLY_TIMEOUT");
    unsetenv("TALLY_ALGO");
    unsetenv("TALLY_TRANSPORT");
    unsetenv("TALLY_SHM_LARGE");
    expect_env("TALLY_TCP_STREAMS", "17", NULL, TALLY_E_INVALID, "TALLY_TCP_STREAMS='17' is out of range");
    expect_env("TALLY_ALGO", "fast", NULL, TALLY_E_INVALID, "TALLY_ALGO='fast' is not an algorithm");
    expect_env("TALLY_TIMEOUT", "abc", NULL, TALLY_E_INVALID, "TALLY_TIMEOUT='abc' is not a number");
    expect_env("TALLY_WORLD_SIZE", "4", "5", TALLY_E_INVALID, "TALLY_RANK='5' is out of range");
    expect_env("TALLY_TIMEOUT", "5", "1", TALLY_E_BOOT, "TALLY_WORLD_SIZE is not set");
    setenv("TALLY_RANK", "1", 1); /* the world, with what completes it (TALLY_ADDR) left to the caller */
    setenv("TALLY_WORLD_SIZE", "4", 1);
    rc = tally_config_from_env(&cfg);
    TH_CHECK(!rc && cfg.rank == 1 && cfg.size == 4 && !strcmp(cfg.source, "TALLY") && !cfg.address[0],
             "TALLY_RANK=1 TALLY_WORLD_SIZE=4: rc %d, rank %d, size %d, source '%s', address '%s'", rc, cfg.rank,
             cfg.size, cfg.source, cfg.address);
    unsetenv("TALLY_RANK");
    unsetenv("TALLY_WORLD_SIZE");
    cfg.struct_size = 3;
    TH_CHECK(tally_config_from_env(&cfg) == TALLY_E_INVALID && strstr(tally_last_error(), "struct_size is 3"),
             "from_env with struct_size 3: '%s'", tally_last_error());
}

int main(void) {
    R = th_shared_alloc(sizeof *R * TH_MAX_RANKS);
    test_bad_fields();
    test_from_env();
    test_plain(2, TALLY_TRANSPORT_SHM, "shm");
    test_plain(3, TALLY_TRANSPORT_SHM, "shm");
    test_plain(2, TALLY_TRANSPORT_TCP, "tcp");
    test_plain(3, TALLY_TRANSPORT_TCP, "tcp");
    test_two_timeouts();
    test_log();
    th_shared_free(R, sizeof *R * TH_MAX_RANKS);
    return th_verdict("test_config");
}
