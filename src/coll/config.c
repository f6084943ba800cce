/* config.c - tally_config as a communicator takes it: copied within the size the caller was built with
 * (the fields it does not know keep their defaults), and every field checked once, naming it. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "../boot/boot.h"
#include "../core/env.h"
#include "../core/err.h"
#include "../core/parse.h"
#include "../core/trace.h"
#include "../transport/transport.h"
#include "algo.h"
#include "coll.h"
#include "flight.h"

/* The size of version 1 of the struct: a caller's struct is at least this big. When fields are added
 * (at the end, with TALLY_CONFIG_VERSION raised), this stays the offset where version 2 begins. */
#define CONFIG_SIZE_V1 sizeof(tally_config)

/* Numbers are checked by the one parser, as their variables are: the field's value written out and
 * read back, so the message has the same shape ("tally_config.timeout='0' is out of range: ..."). */
static int field_int(const char *field, long long v, long long lo, long long hi) {
    char name[64], text[32];
    long long out;
    snprintf(name, sizeof name, "tally_config.%s", field);
    snprintf(text, sizeof text, "%lld", v);
    return tally__parse_int(name, text, lo, hi, &out);
}

static int field_real(const char *field, double v, double lo, int lo_open, double hi) {
    char name[64], text[48];
    double out;
    snprintf(name, sizeof name, "tally_config.%s", field);
    snprintf(text, sizeof text, "%.17g", v);
    return tally__parse_real(name, text, lo, lo_open, hi, &out);
}

static int field_str(const char *field, const char *s, size_t cap) {
    if (memchr(s, '\0', cap)) return 0;
    return tally__seterr(TALLY_E_INVALID, "tally_config.%s holds no terminating NUL within its %zu bytes", field, cap);
}

int tally__config_check_algo(const char *name, const char *s) {
    if (tally__algo_parse(s) >= 0) return 0;
    char names[256], takes[300];
    tally__algo_names(names, sizeof names, TALLY__ALGO_WITH_AUTO | TALLY__ALGO_WITH_HIER, ", ", " or ");
    snprintf(takes, sizeof takes, "it takes %s", names);
    return tally__parse_fail(name, s, "is not an algorithm", takes);
}

int tally__config_check_path(const char *name, const char *s, size_t max, const char *what) {
    char accepts[96];
    snprintf(accepts, sizeof accepts, "it takes %s of at most %zu characters", what, max);
    if (!s[0]) return tally__parse_fail(name, s, "is empty", accepts);
    if (strlen(s) > max) return tally__parse_fail(name, s, "is too long", accepts);
    return 0;
}

int tally__config_algo(const tally_config *cfg) {
    int a = cfg->algo[0] ? tally__algo_parse(cfg->algo) : TALLY__ALGO_AUTO;
    return a < 0 ? TALLY__ALGO_AUTO : a;
}

static int check_strings(const tally_config *c) {
    int rc;
    char host[256];
    int port;
    if ((rc = field_str("address", c->address, sizeof c->address)) ||
        (rc = field_str("token", c->token, sizeof c->token)) || (rc = field_str("bind", c->bind, sizeof c->bind)) ||
        (rc = field_str("host", c->host, sizeof c->host)) || (rc = field_str("algo", c->algo, sizeof c->algo)) ||
        (rc = field_str("flight_dir", c->flight_dir, sizeof c->flight_dir)) ||
        (rc = field_str("trace_file", c->trace_file, sizeof c->trace_file)) ||
        (rc = field_str("source", c->source, sizeof c->source)))
        return rc;
    if (c->address[0] && (rc = tally__boot_parse_addr("tally_config.address", c->address, host, sizeof host, &port)))
        return rc;
    if (c->bind[0] && (rc = tally__boot_parse_bind("tally_config.bind", c->bind, host, sizeof host))) return rc;
    if (c->host[0] && (rc = tally__boot_check_host_name("tally_config.host", c->host))) return rc;
    if (c->algo[0] && (rc = tally__config_check_algo("tally_config.algo", c->algo))) return rc;
    return 0;
}

/* alpha, beta and gamma are given together or not at all. */
static int check_cost(const tally_config *c) {
    int rc;
    if (c->cost_alpha_us == 0 && c->cost_beta_gbps == 0 && c->cost_gamma_gbps == 0) return 0;
    if ((rc = field_real("cost_alpha_us", c->cost_alpha_us, 0, 0, TALLY__COST_MAX)) ||
        (rc = field_real("cost_beta_gbps", c->cost_beta_gbps, 0, 1, TALLY__COST_MAX)) ||
        (rc = field_real("cost_gamma_gbps", c->cost_gamma_gbps, 0, 1, TALLY__COST_MAX)))
        return tally__err_wrap(rc, "", " (the three are given together, or all 0 to measure them)");
    return 0;
}

static int check_numbers(const tally_config *c) {
    int rc;
    if ((rc = field_int("size", c->size, 0, TALLY__BOOT_MAX_SIZE)) ||
        (rc = field_int("rank", c->rank, -1, c->size > 0 ? c->size - 1 : TALLY__BOOT_MAX_SIZE - 1)) ||
        (rc = field_real("timeout", c->timeout, 0, 1, TALLY__TIMEOUT_MAX_S)) ||
        (c->boot_timeout != 0 && (rc = field_real("boot_timeout", c->boot_timeout, 0, 1, TALLY__TIMEOUT_MAX_S))) ||
        (rc = field_int("transport", c->transport, TALLY_TRANSPORT_AUTO, TALLY_TRANSPORT_TCP)) ||
        (rc = field_int("tcp_streams", c->tcp_streams, 1, TALLY__TCP_STREAMS_MAX)) ||
        (rc = field_int("shm_large", c->shm_large, TALLY_SHM_LARGE_AUTO, TALLY__SHM_LARGE_MAX)) ||
        (rc = field_int("shm_cma", c->shm_cma, 0, 1)) ||
        (rc = field_int("isa", c->isa, TALLY_ISA_AUTO, TALLY_ISA_AVX512)) ||
        (rc = field_int("log_level", c->log_level, 0, 2)) ||
        (rc = field_int("flight_depth", c->flight_depth, 0, TALLY__FLIGHT_MAX)) ||
        (rc = field_int("trace_events", c->trace_events, TALLY__TRACE_EVENTS_MIN, TALLY__TRACE_MAX)))
        return rc;
    return check_cost(c);
}

int tally__config_check_header(const tally_config *in, const char *fn) {
    if (!in) return tally__seterr(TALLY_E_INVALID, "%s: the config is NULL", fn);
    if (in->struct_size >= CONFIG_SIZE_V1 && in->struct_size <= sizeof(tally_config) && in->version >= 1 &&
        in->version <= TALLY_CONFIG_VERSION)
        return 0;
    return tally__seterr(TALLY_E_INVALID,
                         "tally_config.struct_size is %zu and .version %d: start from TALLY_CONFIG_INIT (or "
                         "tally_config_from_env), which set them; this library takes %zu to %zu bytes, versions 1 "
                         "to %d (a program built against a newer tally.h needs a newer libtally)",
                         in->struct_size, in->version, (size_t)CONFIG_SIZE_V1, sizeof(tally_config),
                         TALLY_CONFIG_VERSION);
}

int tally__config_take(const tally_config *in, tally_config *out) {
    int rc = tally__config_check_header(in, "tally_comm_init_config");
    if (rc) return rc;
    *out = (tally_config)TALLY_CONFIG_INIT;
    memcpy(out, in, in->struct_size);
    out->struct_size = sizeof *out;
    out->version = TALLY_CONFIG_VERSION;
    if ((rc = check_strings(out)) || (rc = check_numbers(out))) {
        char rank[32] = "";
        if (out->rank >= 0 && out->rank < out->size) snprintf(rank, sizeof rank, "rank %d: ", out->rank);
        return tally__err_wrap(rc, rank, "");
    }
    return 0;
}
