/* env.c - who am I, from the communicator's config: rank, world size, rank 0's address and the token,
 * checked for what the rendezvous needs; and the parsers of addresses and host names the config uses. */
#include <stdio.h>
#include <string.h>

#include "../core/log.h"
#include "../core/parse.h"
#include "boot.h"

static int boot_port(const char *var, const char *s, int *out) {
    long long v;
    if (tally__parse_int(var, s, 1, 65535, &v))
        return tally__seterr(TALLY_E_INVALID, "%s: port '%s' is not a number in 1..65535", var, s);
    *out = (int)v;
    return 0;
}

int tally__boot_parse_addr(const char *name, const char *val, char *host, size_t cap, int *port) {
    const char *h = val, *colon;
    size_t hl;
    if (!*val) return tally__parse_fail(name, val, "", "it takes host:port (e.g. node0:29500)");
    if (val[0] == '[') {
        const char *rb = strchr(val, ']');
        if (!rb || rb[1] != ':') return tally__seterr(TALLY_E_INVALID, "%s='%s' is not [ipv6]:port", name, val);
        h = val + 1;
        hl = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(val, ':');
        if (!colon)
            return tally__seterr(TALLY_E_INVALID, "%s='%s' has no port: use host:port (e.g. node0:29500)", name, val);
        hl = (size_t)(colon - val);
        if (memchr(val, ':', hl))
            return tally__seterr(TALLY_E_INVALID, "%s='%s': write IPv6 addresses in brackets, [addr]:port", name, val);
    }
    if (hl == 0) return tally__seterr(TALLY_E_INVALID, "%s='%s' has an empty host: use host:port", name, val);
    if (hl >= cap) return tally__seterr(TALLY_E_INVALID, "%s: host name is longer than %zu bytes", name, cap - 1);
    memcpy(host, h, hl);
    host[hl] = '\0';
    char label[64 + 300];
    snprintf(label, sizeof label, "%s='%.300s'", name, val);
    return boot_port(label, colon + 1, port);
}

int tally__boot_parse_bind(const char *name, const char *val, char *out, size_t cap) {
    const char *v = val, *colon = strchr(val, ':');
    size_t len = strlen(v);
    if (v[0] == '[' && len > 2 && v[len - 1] == ']') { /* [v6] as in the address */
        v++;
        len -= 2;
    } else if (colon && !strchr(colon + 1, ':')) {
        return tally__parse_fail(name, val, "has a port",
                                 "it takes only the address rank 0 listens on (e.g. 0.0.0.0 for every interface); "
                                 "the port is the rendezvous address's");
    }
    if (len == 0 || len >= cap || memchr(v, '[', len) || memchr(v, ']', len))
        return tally__parse_fail(name, val, "is not an address",
                                 "it takes an address without a port: 10.0.0.5, 0.0.0.0, ::, [fe80::1]");
    memcpy(out, v, len);
    out[len] = '\0';
    return 0;
}

int tally__boot_check_host_name(const char *name, const char *s) {
    size_t n = strlen(s);
    int ok = n > 0 && n <= 63;
    for (const char *p = s; ok && *p; p++)
        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
             *p == '.' || *p == '_';
    if (ok) return 0;
    return tally__parse_fail(name, s, "is not a host name",
                             "it takes 1-63 letters, digits, '.', '-' or '_'; ranks with the same name are one host");
}

/* The config has no address: in the words of where its rank and size came from. */
static int boot_need_addr(int rank, const char *source) {
    static const char fix[] = "export TALLY_ADDR=<rank 0's host>:<port> to every rank, e.g. `mpirun -x "
                              "TALLY_ADDR=node0:29500 ...`";
    if (!source[0])
        return tally__seterr(TALLY_E_BOOT,
                             "rank %d: no rendezvous address: tally_config.address is empty; set it to "
                             "rank 0's host:port on every rank, or %s",
                             rank, fix);
    const char *launcher = !strcmp(source, "TALLY") ? "no launcher was detected" : source;
    const char *why = !strcmp(source, "TALLY")      ? "TALLY_WORLD_SIZE > 1 needs rank 0's address"
                      : !strcmp(source, "torchrun") ? "MASTER_ADDR or MASTER_PORT is not set"
                                                    : "its ranks span several hosts, it does not say they share one, "
                                                      "or it gives no job id to derive a port from";
    return tally__seterr(TALLY_E_BOOT, "rank %d: no rendezvous address: TALLY_ADDR is not set and %s (%s); %s", rank,
                         launcher, why, fix);
}

static int boot_need_token(int rank) {
    return tally__seterr(TALLY_E_BOOT,
                         "rank %d: TALLY_TOKEN is not set and the launcher gives no job id to derive "
                         "one from: export TALLY_TOKEN=<secret> to every rank (e.g. "
                         "TALLY_TOKEN=$(openssl rand -hex 16)), or set tally_config.token",
                         rank);
}

/* What the rendezvous needs and the config may lack: the rank and size, and beyond one rank rank 0's
 * address and a token. Fields are checked already (tally_comm_init_config). */
static int boot_complete(const tally_config *cfg) {
    if (cfg->rank < 0 || cfg->size < 1)
        return tally__seterr(TALLY_E_BOOT, "cannot tell this process's rank: set TALLY_RANK and TALLY_WORLD_SIZE "
                                           "(or start it with tally run, mpirun, srun or torchrun), or set "
                                           "tally_config.rank and .size");
    if (cfg->size == 1) return 0; /* a world of one needs no address and no token */
    if (!cfg->address[0]) return boot_need_addr(cfg->rank, cfg->source);
    if (!cfg->token[0]) return boot_need_token(cfg->rank);
    return 0;
}

int tally__boot_env_from_config(const tally_config *cfg, tally__boot_env *env) {
    memset(env, 0, sizeof *env);
    int rc = boot_complete(cfg);
    if (rc) return rc;
    env->rank = cfg->rank;
    env->size = cfg->size;
    snprintf(env->source, sizeof env->source, "%s", cfg->source[0] ? cfg->source : "tally_config");
    if (cfg->address[0] &&
        (rc = tally__boot_parse_addr("tally_config.address", cfg->address, env->host, sizeof env->host, &env->port)))
        return rc;
    env->token_len = strlen(cfg->token);
    memcpy(env->token, cfg->token, env->token_len + 1);
    env->token_derived = cfg->token_derived;
    if (cfg->bind[0] && (rc = tally__boot_parse_bind("tally_config.bind", cfg->bind, env->bind, sizeof env->bind)))
        return rc;
    env->boot_timeout_s = cfg->boot_timeout;
    tally__boot_env_knobs(cfg, env);
    return 0;
}

void tally__boot_env_say(const tally__boot_env *env) {
    tally__log_debug(1, "rank %d of %d from %s, rendezvous at %s:%d", env->rank, env->size, env->source,
                     env->host[0] ? env->host : "-", env->port);
    if (env->size > 1 && env->token_derived)
        tally__log_debug(1, "TALLY_TOKEN is not set: using a token derived from the launcher's job id; it is NOT a "
                            "secret (anyone who can read the job id can join), so set TALLY_TOKEN for security");
}

void tally__boot_env_knobs(const tally_config *cfg, tally__boot_env *env) {
    snprintf(env->named_host, sizeof env->named_host, "%s", cfg->host);
    env->transport = cfg->transport == TALLY_TRANSPORT_TCP   ? "tcp"
                     : cfg->transport == TALLY_TRANSPORT_SHM ? "shm"
                                                             : NULL;
}
