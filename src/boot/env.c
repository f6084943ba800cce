/* env.c - who am I: rank, world size, rank 0's address and the token, from TALLY_* or from the
 * launcher that started us (Open MPI, PMI, Slurm, torchrun). Validates everything it reads. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/env.h"
#include "../core/log.h"
#include "../core/parse.h"
#include "boot.h"

#define BOOT_MAX_SIZE 4096
/* Derived ports fall in [29500, 32767]: torchrun's customary 29500 upwards, and below Linux's default
 * ephemeral range (32768-60999), where any outgoing connection on the host may hold the port and make
 * rank 0's listener fail (seen in CI while other tests churned through connections). */
#define BOOT_PORT_BASE 29500
#define BOOT_PORT_SPAN 3268

typedef enum { L_NONE, L_OMPI, L_PMI, L_SLURM, L_TORCHRUN } boot_launcher;

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

/* Slurm's variables make a rank only inside a job step (srun sets SLURM_STEP_ID): a batch script has
 * SLURM_PROCID and SLURM_NTASKS too, but it is one process, which starts the ranks itself. */
static boot_launcher boot_detect(void) {
    for (int l = L_OMPI; l <= L_TORCHRUN; l++)
        if (tally__env_str(launchers[l].rank_var) && (l != L_SLURM || tally__env_str("SLURM_STEP_ID")))
            return (boot_launcher)l;
    return L_NONE;
}

/* Strict integer in [lo, hi] (parse.c's message, then `why_range`); unset is a boot error. */
static int boot_int(const char *var, long lo, long hi, const char *why_range, long *out) {
    const char *s = tally__env_knob(var); /* set but empty is refused, not taken for unset */
    if (!s) return tally__seterr(TALLY_E_BOOT, "%s is not set", var);
    long long v;
    int rc = tally__parse_int(var, s, lo, hi, &v);
    if (rc) return tally__err_wrap(rc, "", why_range);
    *out = (long)v;
    return 0;
}

static int boot_port(const char *var, const char *s, int *out) {
    long long v;
    if (tally__parse_int(var, s, 1, 65535, &v))
        return tally__seterr(TALLY_E_INVALID, "%s: port '%s' is not a number in 1..65535", var, s);
    *out = (int)v;
    return 0;
}

/* "host:port" or "[v6]:port" into env->host / env->port. */
static int boot_parse_addr(const char *var, const char *val, tally__boot_env *env) {
    const char *host = val, *colon;
    size_t hl;
    if (!*val) return tally__parse_fail(var, val, "", "it takes host:port (e.g. node0:29500)");
    if (val[0] == '[') {
        const char *rb = strchr(val, ']');
        if (!rb || rb[1] != ':') return tally__seterr(TALLY_E_INVALID, "%s='%s' is not [ipv6]:port", var, val);
        host = val + 1;
        hl = (size_t)(rb - host);
        colon = rb + 1;
    } else {
        colon = strrchr(val, ':');
        if (!colon)
            return tally__seterr(TALLY_E_INVALID, "%s='%s' has no port: use host:port (e.g. node0:29500)", var, val);
        hl = (size_t)(colon - val);
        if (memchr(val, ':', hl))
            return tally__seterr(TALLY_E_INVALID, "%s='%s': write IPv6 addresses in brackets, [addr]:port", var, val);
    }
    if (hl == 0) return tally__seterr(TALLY_E_INVALID, "%s='%s' has an empty host: use host:port", var, val);
    if (hl >= sizeof env->host) return tally__seterr(TALLY_E_INVALID, "%s: host name is longer than 255 bytes", var);
    memcpy(env->host, host, hl);
    env->host[hl] = '\0';
    char label[64];
    snprintf(label, sizeof label, "%s='%s'", var, val);
    return boot_port(label, colon + 1, &env->port);
}

/* Something that is equal on every rank of one launch and differs between launches, or 0 if none. */
static int boot_job_identity(char *buf, size_t n) {
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

static int boot_derived_port(const char *identity) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a: stable across processes and builds */
    for (const unsigned char *p = (const unsigned char *)identity; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return BOOT_PORT_BASE + (int)(h % BOOT_PORT_SPAN);
}

/* A count the launcher gave: strict, as our own variables are. */
static int boot_count(const char *var, const char *v, long long *out) {
    return tally__parse_int(var, v, 0, BOOT_MAX_SIZE, out);
}

/* 1 if the launcher says every rank is on this host; 0 if they span hosts or it does not say;
 * TALLY_E_INVALID when the count it gives is not a number. */
static int boot_one_host(boot_launcher l, int size, const char **why) {
    long long k;
    static const char *ompi[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", NULL};
    static const char *pmi[] = {"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "PMIX_LOCAL_SIZE", NULL};
    const char **vars = l == L_OMPI ? ompi : l == L_PMI ? pmi : NULL;
    for (int i = 0; vars && vars[i]; i++) {
        const char *v = tally__env_str(vars[i]);
        if (v) return *why = vars[i], boot_count(vars[i], v, &k) ? TALLY_E_INVALID : k == size;
    }
    /* srun --mpi=pmi2 gives PMI's ranks and no local size, but it is a Slurm step: Slurm's node count */
    int slurm_step = l == L_SLURM || (l == L_PMI && tally__env_str("SLURM_STEP_ID"));
    const char *nodes = l == L_OMPI  ? tally__env_str("OMPI_MCA_orte_num_nodes")
                        : slurm_step ? (tally__env_str("SLURM_STEP_NUM_NODES") ? tally__env_str("SLURM_STEP_NUM_NODES")
                                                                               : tally__env_str("SLURM_NNODES"))
                                     : NULL;
    *why = "the node count";
    if (!nodes) return 0;
    return boot_count("the launcher's node count", nodes, &k) ? TALLY_E_INVALID : k == 1;
}

static int boot_need_addr(const char *launcher, const char *why) {
    return tally__seterr(TALLY_E_BOOT,
                         "no rendezvous address: TALLY_ADDR is not set and %s (%s); export TALLY_ADDR=<rank 0's "
                         "host>:<port> to every rank, e.g. `mpirun -x TALLY_ADDR=node0:29500 ...`",
                         launcher, why);
}

/* Rank 0's address: TALLY_ADDR, else what the launcher implies. */
static int boot_env_addr(tally__boot_env *env, boot_launcher l) {
    const char *a = tally__env_knob("TALLY_ADDR");
    if (a) {
        tally__log_debug(1, "rendezvous address %s from TALLY_ADDR", a);
        return boot_parse_addr("TALLY_ADDR", a, env);
    }
    if (l == L_TORCHRUN) {
        const char *ma = tally__env_str("MASTER_ADDR"), *mp = tally__env_str("MASTER_PORT");
        if (!ma || !mp) return boot_need_addr("torchrun", !ma ? "MASTER_ADDR is not set" : "MASTER_PORT is not set");
        if (strlen(ma) >= sizeof env->host)
            return tally__seterr(TALLY_E_INVALID, "MASTER_ADDR is longer than 255 bytes");
        snprintf(env->host, sizeof env->host, "%s", ma);
        int rc = boot_port("MASTER_PORT", mp, &env->port);
        if (rc) return rc;
        const char *agent = tally__env_str("TORCHELASTIC_USE_AGENT_STORE");
        if (agent && (!strcmp(agent, "True") || !strcmp(agent, "1"))) {
            /* torchrun's agent already listens on MASTER_PORT with its own store; take the next one. */
            env->port = env->port == 65535 ? 65534 : env->port + 1;
        }
        tally__log_debug(1, "rendezvous address %s:%d from torchrun's MASTER_ADDR/MASTER_PORT", env->host, env->port);
        return 0;
    }
    char id[512];
    const char *why = "";
    int have_id = boot_job_identity(id, sizeof id);
    int local = boot_one_host(l, env->size, &why);
    if (local < 0) return local;
    if (l == L_NONE) return boot_need_addr("no launcher was detected", "TALLY_WORLD_SIZE > 1 needs rank 0's address");
    if (!have_id) return boot_need_addr(launchers[l].name, "it gives no job id to derive a port from");
    if (local) {
        snprintf(env->host, sizeof env->host, "127.0.0.1");
        env->port = boot_derived_port(id);
        tally__log_debug(1, "rendezvous address 127.0.0.1:%d: all ranks on one host (%s), port derived from %s",
                         env->port, why, id);
        return 0;
    }
    const char *launch_ip = l == L_SLURM ? tally__env_str("SLURM_LAUNCH_NODE_IPADDR") : NULL;
    if (launch_ip && strlen(launch_ip) < sizeof env->host) {
        snprintf(env->host, sizeof env->host, "%s", launch_ip);
        env->port = boot_derived_port(id);
        tally__log_debug(1, "rendezvous address %s:%d from SLURM_LAUNCH_NODE_IPADDR, port derived from %s", env->host,
                         env->port, id);
        return 0;
    }
    return boot_need_addr(launchers[l].name, "its ranks span several hosts or it does not say they share one");
}

static int boot_env_token(tally__boot_env *env) {
    const char *t = tally__env_knob("TALLY_TOKEN");
    if (t) {
        env->token_len = strlen(t);
        if (env->token_len == 0)
            return tally__parse_fail("TALLY_TOKEN", t, "",
                                     "set it to the job's shared secret, or unset it where the "
                                     "launcher gives a job id to derive one from");
        if (env->token_len >= sizeof env->token)
            return tally__seterr(TALLY_E_INVALID, "TALLY_TOKEN is %zu bytes long; at most %d are allowed",
                                 env->token_len, TALLY__TOKEN_MAX - 1);
        memcpy(env->token, t, env->token_len + 1);
        return 0;
    }
    char id[512], seed[600];
    if (!boot_job_identity(id, sizeof id))
        return tally__seterr(TALLY_E_BOOT, "TALLY_TOKEN is not set and the launcher gives no job id to derive one "
                                           "from: export TALLY_TOKEN=<secret> to every rank (e.g. "
                                           "TALLY_TOKEN=$(openssl rand -hex 16))");
    int n = snprintf(seed, sizeof seed, "tally-derived-token|%s", id);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(seed, (size_t)n, md, &mdlen, EVP_sha256(), NULL))
        return tally__seterr(TALLY_E_SYSTEM, "OpenSSL SHA-256 failed while deriving a token");
    for (unsigned i = 0; i < mdlen && 2 * i + 2 < sizeof env->token; i++)
        snprintf(env->token + 2 * i, 3, "%02x", md[i]);
    env->token_len = strlen(env->token);
    env->token_derived = 1;
    tally__log_debug(1,
                     "TALLY_TOKEN is not set: using a token derived from %s; it is NOT a secret (anyone who "
                     "can read the job id can join), so set TALLY_TOKEN for security",
                     id);
    return 0;
}

/* TALLY_BIND: an address without a port (TALLY_ADDR's port is used); "0.0.0.0" or "::" for all
 * interfaces, which nothing else ever selects. */
static int boot_env_bind(tally__boot_env *env) {
    const char *v = tally__env_knob("TALLY_BIND");
    if (!v) return 0;
    const char *colon = strchr(v, ':');
    size_t len = strlen(v);
    if (v[0] == '[' && len > 2 && v[len - 1] == ']') { /* [v6] as in TALLY_ADDR */
        v++;
        len -= 2;
    } else if (colon && !strchr(colon + 1, ':')) {
        return tally__parse_fail("TALLY_BIND", v, "has a port",
                                 "it takes only the address rank 0 listens on (e.g. 0.0.0.0 for every interface); "
                                 "the port is TALLY_ADDR's");
    }
    if (len == 0 || len >= sizeof env->bind || memchr(v, '[', len) || memchr(v, ']', len))
        return tally__parse_fail("TALLY_BIND", tally__env_knob("TALLY_BIND"), "is not an address",
                                 "it takes an address without a port: 10.0.0.5, 0.0.0.0, ::, [fe80::1]");
    memcpy(env->bind, v, len);
    env->bind[len] = '\0';
    return 0;
}

/* TALLY_BOOT_TIMEOUT: seconds the rendezvous may take; unset means TALLY_TIMEOUT's value. */
static int boot_env_timeout(tally__boot_env *env) {
    return tally__env_real("TALLY_BOOT_TIMEOUT", 0, 1, TALLY__TIMEOUT_MAX_S, 0, &env->boot_timeout_s);
}

/* What is read once the rank is known: the rendezvous time limit, the listen address, rank 0's address
 * and the token. */
static int boot_env_rest(tally__boot_env *env, boot_launcher l) {
    int rc;
    if ((rc = boot_env_timeout(env)) || (rc = boot_env_bind(env))) return rc;
    if (env->size == 1) { /* a world of one needs no address and no token, but a given one must be valid */
        const char *a = tally__env_knob("TALLY_ADDR"), *t = tally__env_knob("TALLY_TOKEN");
        if (a && (rc = boot_parse_addr("TALLY_ADDR", a, env))) return rc;
        if (t && (rc = boot_env_token(env))) return rc;
        return 0;
    }
    if ((rc = boot_env_addr(env, l))) return rc;
    return boot_env_token(env);
}

int tally__boot_env_read(tally__boot_env *env) {
    memset(env, 0, sizeof *env);
    boot_launcher l = boot_detect();
    int tally = tally__env_knob("TALLY_RANK") || tally__env_knob("TALLY_WORLD_SIZE");
    boot_launcher from = tally ? L_NONE : l;
    if (!tally && l == L_NONE)
        return tally__seterr(TALLY_E_BOOT, "cannot tell this process's rank: set TALLY_RANK and TALLY_WORLD_SIZE "
                                           "(or start it with tally run, mpirun, srun or torchrun)");
    env->source = launchers[from].name;
    long size = 0, rank = 0;
    char range[96];
    int rc = boot_int(launchers[from].size_var, 1, BOOT_MAX_SIZE, "", &size);
    if (rc) return rc;
    snprintf(range, sizeof range, " (below %s=%ld)", launchers[from].size_var, size);
    if ((rc = boot_int(launchers[from].rank_var, 0, size - 1, range, &rank))) return rc;
    env->rank = (int)rank;
    env->size = (int)size;
    tally__log_debug(1, "rank %d of %d from %s (%s, %s)", env->rank, env->size, env->source, launchers[from].rank_var,
                     launchers[from].size_var);
    if ((rc = boot_env_rest(env, l))) {
        char who[32];
        snprintf(who, sizeof who, "rank %d: ", env->rank);
        return tally__err_wrap(rc, who, "");
    }
    return 0;
}
