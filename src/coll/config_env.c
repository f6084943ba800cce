/* config_env.c - tally_config_from_env, the one place the library reads the environment: every TALLY_*
 * knob, parsed strictly and named when bad, and the launcher's rank, size, address and job id when
 * TALLY_RANK is absent (Open MPI, PMI, Slurm, torchrun). */
#include <openssl/evp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../boot/boot.h"
#include "../core/env.h"
#include "../core/err.h"
#include "../core/parse.h"
#include "../core/trace.h"
#include "../transport/transport.h"
#include "config.h"
#include "flight.h"

/* Derived ports fall in [29500, 32767]: torchrun's customary 29500 upwards, and below Linux's default
 * ephemeral range (32768-60999), where any outgoing connection on the host may hold the port and make
 * rank 0's listener fail (seen in CI while other tests churned through connections). */
#define PORT_BASE 29500
#define PORT_SPAN 3268

typedef enum { L_NONE, L_OMPI, L_PMI, L_SLURM, L_TORCHRUN } launcher;

/* Checked in this order: a process started by mpirun inside a Slurm allocation also sees SLURM_*,
 * but its ranks are Open MPI's. */
static const struct {
    const char *name, *rank_var, *size_var;
} launchers[] = {
    [L_NONE] = {"TALLY", "TALLY_RANK", "TALLY_WORLD_SIZE"},
    [L_OMPI] = {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    [L_PMI] = {"PMI", "PMI_RANK", "PMI_SIZE"},
    [L_SLURM] = {"Slurm", "SLURM_PROCID", "SLURM_NTASKS"},
    [L_TORCHRUN] = {"torchrun", "RANK", "WORLD_SIZE"},
};

const char *tally__tmpdir(void) {
    const char *t = tally__env_str("TMPDIR");
    return t ? t : "/tmp";
}

/* ---- the launcher's world ------------------------------------------------------------------------ */

/* Slurm's variables make a rank only inside a job step (srun sets SLURM_STEP_ID): a batch script has
 * SLURM_PROCID and SLURM_NTASKS too, but it is one process, which starts the ranks itself. */
static launcher detect(void) {
    for (int l = L_OMPI; l <= L_TORCHRUN; l++)
        if (tally__env_str(launchers[l].rank_var) && (l != L_SLURM || tally__env_str("SLURM_STEP_ID")))
            return (launcher)l;
    return L_NONE;
}

/* Strict integer in [lo, hi] (parse.c's message, then `why_range`); unset is a boot error: half of the
 * pair is there. */
static int env_count(const char *var, long lo, long hi, const char *why_range, int *out) {
    const char *s = tally__env_knob(var); /* set but empty is refused, not taken for unset */
    if (!s) return tally__seterr(TALLY_E_BOOT, "%s is not set", var);
    long long v;
    int rc = tally__parse_int(var, s, lo, hi, &v);
    if (rc) return tally__err_wrap(rc, "", why_range);
    *out = (int)v;
    return 0;
}

/* Something that is equal on every rank of one launch and differs between launches, or 0 if none. */
static int job_identity(char *buf, size_t n) {
    static const char *vars[] = {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = tally__env_str(vars[i]);
        if (v) return snprintf(buf, n, "%s=%s", vars[i], v), 1;
    }
    const char *job = tally__env_str("SLURM_JOB_ID"), *step = tally__env_str("SLURM_STEP_ID");
    if (job) return snprintf(buf, n, "SLURM_JOB_ID=%s SLURM_STEP_ID=%s", job, step ? step : "-"), 1;
    const char *ma = tally__env_str("MASTER_ADDR"), *mp = tally__env_str("MASTER_PORT");
    const char *run = tally__env_str("TORCHELASTIC_RUN_ID");
    if (ma && mp)
        return snprintf(buf, n, "MASTER_ADDR=%s MASTER_PORT=%s TORCHELASTIC_RUN_ID=%s", ma, mp, run ? run : "-"), 1;
    return 0;
}

static int derived_port(const char *identity) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a: stable across processes and builds */
    for (const unsigned char *p = (const unsigned char *)identity; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return PORT_BASE + (int)(h % PORT_SPAN);
}

/* 1 if the launcher says every rank is on this host; 0 if they span hosts or it does not say;
 * TALLY_E_INVALID when the count it gives is not a number. */
static int one_host(launcher l, int size) {
    long long k;
    static const char *ompi[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", NULL};
    static const char *pmi[] = {"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "PMIX_LOCAL_SIZE", NULL};
    const char **vars = l == L_OMPI ? ompi : l == L_PMI ? pmi : NULL;
    for (int i = 0; vars && vars[i]; i++) {
        const char *v = tally__env_str(vars[i]);
        if (v) return tally__parse_int(vars[i], v, 0, TALLY__BOOT_MAX_SIZE, &k) ? TALLY_E_INVALID : k == size;
    }
    /* srun --mpi=pmi2 gives PMI's ranks and no local size, but it is a Slurm step: Slurm's node count */
    int slurm_step = l == L_SLURM || (l == L_PMI && tally__env_str("SLURM_STEP_ID"));
    const char *nodes = l == L_OMPI  ? tally__env_str("OMPI_MCA_orte_num_nodes")
                        : slurm_step ? (tally__env_str("SLURM_STEP_NUM_NODES") ? tally__env_str("SLURM_STEP_NUM_NODES")
                                                                               : tally__env_str("SLURM_NNODES"))
                                     : NULL;
    if (!nodes) return 0;
    return tally__parse_int("the launcher's node count", nodes, 0, TALLY__BOOT_MAX_SIZE, &k) ? TALLY_E_INVALID : k == 1;
}

static void put_addr(tally_config *c, const char *host, int port) {
    snprintf(c->address, sizeof c->address, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

/* torchrun's MASTER_ADDR and MASTER_PORT (the next port when its agent's store holds that one). */
static int torchrun_addr(tally_config *c) {
    const char *ma = tally__env_str("MASTER_ADDR"), *mp = tally__env_str("MASTER_PORT");
    if (!ma || !mp) return 0; /* tally_comm_init_config says what is missing */
    if (strlen(ma) > 255) return tally__seterr(TALLY_E_INVALID, "MASTER_ADDR is longer than 255 bytes");
    long long port;
    if (tally__parse_int("MASTER_PORT", mp, 1, 65535, &port))
        return tally__seterr(TALLY_E_INVALID, "MASTER_PORT: port '%s' is not a number in 1..65535", mp);
    const char *agent = tally__env_str("TORCHELASTIC_USE_AGENT_STORE");
    if (agent && (!strcmp(agent, "True") || !strcmp(agent, "1"))) port = port == 65535 ? 65534 : port + 1;
    put_addr(c, ma, (int)port);
    return 0;
}

/* Rank 0's address as the launcher implies it, when TALLY_ADDR is not set: loopback with a port derived
 * from the job id on one host, Slurm's launch node across hosts; none otherwise. */
static int launcher_addr(tally_config *c, launcher l) {
    if (l == L_TORCHRUN) return torchrun_addr(c);
    char id[512];
    int have_id = job_identity(id, sizeof id);
    int local = one_host(l, c->size);
    if (local < 0) return local;
    if (l == L_NONE || !have_id) return 0;
    const char *launch_ip = l == L_SLURM ? tally__env_str("SLURM_LAUNCH_NODE_IPADDR") : NULL;
    if (local)
        put_addr(c, "127.0.0.1", derived_port(id));
    else if (launch_ip && strlen(launch_ip) < 256)
        put_addr(c, launch_ip, derived_port(id));
    return 0;
}

/* No TALLY_TOKEN: one derived from the launcher's job id, which every rank of the job computes alike
 * (not a secret: anyone who can read the job id can join; boot says so at TALLY_DEBUG=1). */
static int derived_token(tally_config *c) {
    char id[512], seed[600];
    if (!job_identity(id, sizeof id)) return 0;
    int n = snprintf(seed, sizeof seed, "tally-derived-token|%s", id);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(seed, (size_t)n, md, &mdlen, EVP_sha256(), NULL))
        return tally__seterr(TALLY_E_SYSTEM, "OpenSSL SHA-256 failed while deriving a token");
    for (unsigned i = 0; i < mdlen && 2 * i + 2 < sizeof c->token; i++) snprintf(c->token + 2 * i, 3, "%02x", md[i]);
    c->token_derived = 1;
    return 0;
}

static int env_token(tally_config *c) {
    const char *t = tally__env_knob("TALLY_TOKEN");
    if (!t) return derived_token(c);
    size_t len = strlen(t);
    if (len == 0)
        return tally__parse_fail("TALLY_TOKEN", t, "",
                                 "set it to the job's shared secret, or unset it where the "
                                 "launcher gives a job id to derive one from");
    if (len >= sizeof c->token)
        return tally__seterr(TALLY_E_INVALID, "TALLY_TOKEN is %zu bytes long; at most %zu are allowed", len,
                             sizeof c->token - 1);
    memcpy(c->token, t, len + 1);
    return 0;
}

static int env_addr(tally_config *c, launcher l) {
    const char *a = tally__env_knob("TALLY_ADDR");
    char host[256];
    int port, rc;
    if (!a) return c->size > 1 ? launcher_addr(c, l) : 0;
    if ((rc = tally__boot_parse_addr("TALLY_ADDR", a, host, sizeof host, &port))) return rc;
    snprintf(c->address, sizeof c->address, "%s", a); /* fits: a valid host is under 256 bytes */
    return 0;
}

/* Rank and size from TALLY_RANK and TALLY_WORLD_SIZE, else from the launcher; neither: left unset. */
static int env_world(tally_config *c, launcher l) {
    int tally = tally__env_knob("TALLY_RANK") || tally__env_knob("TALLY_WORLD_SIZE");
    launcher from = tally ? L_NONE : l;
    if (!tally && l == L_NONE) return 0;
    char range[96];
    int size = 0, rank = 0, rc = env_count(launchers[from].size_var, 1, TALLY__BOOT_MAX_SIZE, "", &size);
    if (rc) return rc;
    snprintf(range, sizeof range, " (below %s=%d)", launchers[from].size_var, size);
    if ((rc = env_count(launchers[from].rank_var, 0, size - 1, range, &rank))) return rc;
    c->rank = rank;
    c->size = size;
    snprintf(c->source, sizeof c->source, "%s", launchers[from].name);
    return 0;
}

/* ---- the knobs ----------------------------------------------------------------------------------- */

/* The numbers: each variable, the field it fills (an int, or a double when real) and its range. */
typedef struct num_knob {
    const char *var;
    size_t off;
    int real, lo_open;
    double lo, hi;
} num_knob;

#define INT_KNOB(var, field, lo, hi)                                                                                   \
    { var, offsetof(tally_config, field), 0, 0, lo, hi }
#define REAL_KNOB(var, field, lo, hi)                                                                                  \
    { var, offsetof(tally_config, field), 1, 1, lo, hi }
static const num_knob num_knobs[] = {
    REAL_KNOB("TALLY_TIMEOUT", timeout, 0, TALLY__TIMEOUT_MAX_S),
    REAL_KNOB("TALLY_BOOT_TIMEOUT", boot_timeout, 0, TALLY__TIMEOUT_MAX_S),
    INT_KNOB("TALLY_DEBUG", log_level, 0, 2),
    INT_KNOB("TALLY_TCP_STREAMS", tcp_streams, 1, TALLY__TCP_STREAMS_MAX),
    INT_KNOB("TALLY_SHM_CMA", shm_cma, 0, 1),
    INT_KNOB("TALLY_FLIGHT", flight_depth, 0, TALLY__FLIGHT_MAX),
    INT_KNOB("TALLY_TRACE_EVENTS", trace_events, TALLY__TRACE_EVENTS_MIN, TALLY__TRACE_MAX),
};

static int env_numbers(tally_config *c) {
    for (size_t i = 0; i < sizeof num_knobs / sizeof *num_knobs; i++) {
        const num_knob *k = &num_knobs[i];
        const char *s = tally__env_knob(k->var);
        if (!s) continue;
        char *field = (char *)c + k->off;
        long long v;
        int rc = k->real ? tally__parse_real(k->var, s, k->lo, k->lo_open, k->hi, (double *)field)
                         : tally__parse_int(k->var, s, (long long)k->lo, (long long)k->hi, &v);
        if (rc) return rc;
        if (!k->real) *(int *)field = (int)v;
    }
    return 0;
}

/* A word of `words` (any case), its index in *out. */
static int env_word(const char *var, const char *const *words, const char *problem, const char *accepts, int *out) {
    const char *s = tally__env_knob(var);
    if (!s) return 0;
    for (int i = 0; words[i]; i++)
        if (!strcasecmp(s, words[i])) return *out = i, 0;
    return tally__parse_fail(var, s, problem, accepts);
}

/* TALLY_SHM_LARGE: "off" (or 0) for the slots only, else the size from which messages go single-copy. */
static int env_shm_large(tally_config *c) {
    const char *s = tally__env_knob("TALLY_SHM_LARGE");
    uint64_t b;
    if (!s) return 0;
    if (!strcasecmp(s, "off")) return c->shm_large = TALLY_SHM_LARGE_OFF, 0;
    if (tally__parse_bytes("TALLY_SHM_LARGE", s, 0, (uint64_t)TALLY__SHM_LARGE_MAX, &b))
        return tally__err_wrap(TALLY_E_INVALID, "", ", or off");
    c->shm_large = (long long)b;
    return 0;
}

/* TALLY_COST="alpha_us,beta_GBps,gamma_GBps": three numbers, each checked as any knob is. */
static int env_cost(tally_config *c) {
    static const char accepts[] = "it takes 'alpha_us,beta_GBps,gamma_GBps', alpha >= 0 and the two rates > 0 "
                                  "(e.g. '1.5,8,20')";
    const char *s = tally__env_knob("TALLY_COST");
    if (!s) return 0;
    char part[3][64];
    const char *p = s;
    for (int i = 0; i < 3; i++) {
        size_t len = strcspn(p, ",");
        if (len >= sizeof part[i] || (i < 2 && p[len] != ',') || (i == 2 && p[len]))
            return tally__parse_fail("TALLY_COST", s, "is not three numbers", accepts);
        memcpy(part[i], p, len);
        part[i][len] = '\0';
        p += len + 1;
    }
    double v[3];
    for (int i = 0; i < 3; i++)
        if (tally__parse_real("TALLY_COST", part[i], 0, i > 0, TALLY__COST_MAX, &v[i]))
            return tally__parse_fail("TALLY_COST", s, "holds a value out of range or not a number", accepts);
    c->cost_alpha_us = v[0];
    c->cost_beta_gbps = v[1];
    c->cost_gamma_gbps = v[2];
    return 0;
}

/* A string knob copied into its field once check accepts it (which bounds its length). */
static int env_string(const char *var, char *field, size_t cap, int (*check)(const char *, const char *)) {
    const char *s = tally__env_knob(var);
    int rc;
    if (!s) return 0;
    if ((rc = check(var, s))) return rc;
    snprintf(field, cap, "%s", s);
    return 0;
}

static int check_flight_dir(const char *var, const char *s) {
    return tally__config_check_path(var, s, TALLY__FLIGHT_DIR_MAX, "a directory path");
}
static int check_trace(const char *var, const char *s) {
    return tally__config_check_path(var, s, TALLY__TRACE_FILE_MAX, "the file to write the timeline to");
}
static int check_bind(const char *var, const char *s) {
    char out[256];
    return tally__boot_parse_bind(var, s, out, sizeof out);
}

static int env_knobs(tally_config *c) {
    static const char *const transports[] = {"auto", "shm", "tcp", NULL};
    static const char *const isas[] = {"auto", "scalar", "avx2", "avx512", NULL};
    int rc;
    if ((rc = env_numbers(c)) ||
        (rc = env_word("TALLY_TRANSPORT", transports, "is not a transport", "it takes auto, shm or tcp",
                       &c->transport)) ||
        (rc = env_word("TALLY_ISA", isas, "is not an instruction set", "it takes scalar, avx2, avx512 or auto",
                       &c->isa)) ||
        (rc = env_shm_large(c)) || (rc = env_cost(c)) ||
        (rc = env_string("TALLY_ALGO", c->algo, sizeof c->algo, tally__config_check_algo)) ||
        (rc = env_string("TALLY_FLIGHT_DIR", c->flight_dir, sizeof c->flight_dir, check_flight_dir)) ||
        (rc = env_string("TALLY_TRACE", c->trace_file, sizeof c->trace_file, check_trace)) ||
        (rc = env_string("TALLY_HOST", c->host, sizeof c->host, tally__boot_check_host_name)) ||
        (rc = env_string("TALLY_BIND", c->bind, sizeof c->bind, check_bind)))
        return rc;
    return 0;
}

TALLY_API int tally_config_from_env(tally_config *cfg) {
    tally__clearerr();
    int rc = tally__config_check_header(cfg, "tally_config_from_env");
    if (rc) return rc;
    tally_config c = TALLY_CONFIG_INIT;
    launcher l = detect();
    if ((rc = env_world(&c, l))) return rc;
    if ((rc = env_knobs(&c)) || (rc = env_addr(&c, l)) || (rc = env_token(&c))) {
        char who[32] = "";
        if (c.rank >= 0) snprintf(who, sizeof who, "rank %d: ", c.rank);
        return tally__err_wrap(rc, who, "");
    }
    size_t n = cfg->struct_size;
    int version = cfg->version;
    memcpy(cfg, &c, n); /* the fields a caller built against an older tally.h knows */
    cfg->struct_size = n;
    cfg->version = version;
    return 0;
}
