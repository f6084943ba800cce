/* cluster.c - the simulated cluster's description: defaults, one setting by name (flags and config files
 * share the names), config files of "key = value" lines, the checks, and the links' capacities. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/err.h"
#include "../core/file.h"
#include "../core/parse.h"
#include "../core/units.h"
#include "sim_int.h"

static const char *const kind_names[TALLY__SIM_KINDS] = {"cpu", "nic tx", "nic rx", "uplink", "downlink"};

const char *tally__sim_kind_name(int kind) { return kind >= 0 && kind < TALLY__SIM_KINDS ? kind_names[kind] : "?"; }

void tally__sim_cluster_default(tally__sim_cluster *c) {
    memset(c, 0, sizeof *c);
    c->hosts = 1;
    c->per_host = 2;
    c->shm = (tally__cost){.alpha = 5e-6, .beta = 1.0 / 10e9, .gamma = 1.0 / 10e9};
    c->crowded_alpha = 20e-6;
    c->beta_bytes = 64.0 * 1048576;
    c->nic_rate = 25e9 / 8;
    c->nic_payload = 1448.0 / 1538.0; /* 1500 less IP and TCP headers (timestamps on), of the frame,
                                       * its FCS, preamble and gap */
    c->nic_alpha = 20e-6;
    c->fabric = TALLY__SIM_FULL;
    c->hosts_per_leaf = 32;
    c->oversub = 1;
    c->seed = 1;
}

tally__sim_cluster tally__sim_at_size(const tally__sim_cluster *c, double bytes) {
    tally__sim_cluster s = *c;
    if (!(c->cache_bytes > 0 && c->cache_beta > 0) || bytes >= c->beta_bytes) return s;
    if (bytes <= c->cache_bytes || c->cache_bytes >= c->beta_bytes) {
        s.shm.beta = c->cache_beta;
        return s;
    }
    double f = log(bytes / c->cache_bytes) / log(c->beta_bytes / c->cache_bytes); /* 0 at cache, 1 at large */
    s.shm.beta = exp((1 - f) * log(c->cache_beta) + f * log(c->shm.beta));
    return s;
}

double tally__sim_nic_bytes(const tally__sim_cluster *c) { return c->nic_rate * c->nic_payload; }

tally__cost tally__sim_net_cost(const tally__sim_cluster *c) {
    return (tally__cost){.alpha = c->nic_alpha, .beta = 1.0 / tally__sim_nic_bytes(c), .gamma = c->shm.gamma};
}

double tally__sim_capacity(const tally__sim_cluster *c, int kind) {
    switch (kind) {
    case TALLY__SIM_CPU: return tally__sim_cores(c);
    case TALLY__SIM_NIC_TX:
    case TALLY__SIM_NIC_RX: return tally__sim_nic_bytes(c);
    default: return tally__sim_nic_bytes(c) * c->hosts_per_leaf / c->oversub;
    }
}

static int bad(const char *key, const char *value, const char *takes) {
    char name[64];
    snprintf(name, sizeof name, "--%s", key);
    return tally__parse_fail(name, value, "is not valid", takes);
}

/* RANK:FACTOR, added to the list. */
static int set_slow(tally__sim_cluster *c, const char *v) {
    char *end;
    errno = 0;
    long rank = strtol(v, &end, 10);
    if (end == v || *end != ':' || errno || rank < 0 || rank > 1 << 30) goto fail;
    double f;
    if (tally__units_count(end + 1, &f) || !(f > 0) || f > 1e6) goto fail;
    if (c->nslow == TALLY__SIM_MAX_SLOW) return bad("slow", v, "it takes at most 64 slow ranks");
    c->slow[c->nslow++] = (tally__sim_slow){.rank = (int)rank, .factor = f};
    return 0;
fail:
    return bad("slow", v, "it takes RANK:FACTOR, a rank and how many times longer its compute takes (3:1.5)");
}

static int set_int(const char *key, const char *v, long long lo, long long hi, int *out) {
    char name[64];
    long long x;
    snprintf(name, sizeof name, "--%s", key);
    int rc = tally__parse_int(name, v, lo, hi, &x);
    if (!rc) *out = (int)x;
    return rc;
}

/* A time, or a rate taken as its inverse (seconds per byte). */
static int set_time(const char *key, const char *v, double *out) {
    double t;
    if (tally__units_time(v, &t) || t > 1e3) return bad(key, v, "it takes a time: 5us, 1.5ms, 200ns");
    *out = t;
    return 0;
}
static int set_per_byte(const char *key, const char *v, double *out) {
    double r;
    if (tally__units_rate(v, &r) || !(r > 0)) return bad(key, v, "it takes a rate: 10GB/s, 25Gbps, 800MiB/s");
    *out = 1.0 / r;
    return 0;
}

int tally__sim_cluster_set(tally__sim_cluster *c, const char *key, const char *v) {
    static const char *const fabrics[] = {"full", "fat-tree", NULL};
    if (!strcmp(key, "hosts")) return set_int(key, v, 1, 1 << 20, &c->hosts);
    if (!strcmp(key, "ranks-per-host")) return set_int(key, v, 1, 1 << 12, &c->per_host);
    if (!strcmp(key, "cores")) return set_int(key, v, 0, 1 << 12, &c->cores);
    if (!strcmp(key, "hosts-per-leaf")) return set_int(key, v, 1, 1 << 20, &c->hosts_per_leaf);
    if (!strcmp(key, "shm-latency")) return set_time(key, v, &c->shm.alpha);
    if (!strcmp(key, "crowded-latency")) return set_time(key, v, &c->crowded_alpha);
    if (!strcmp(key, "call-overhead")) return set_time(key, v, &c->call_s);
    if (!strcmp(key, "shm-bandwidth")) return set_per_byte(key, v, &c->shm.beta);
    if (!strcmp(key, "cache-bandwidth")) return set_per_byte(key, v, &c->cache_beta);
    if (!strcmp(key, "shm-bandwidth-bytes") || !strcmp(key, "cache-bytes")) {
        uint64_t b;
        char name[64];
        snprintf(name, sizeof name, "--%s", key);
        int rc = tally__parse_bytes(name, v, 1, (uint64_t)1 << 40, &b);
        if (!rc) *(key[0] == 's' ? &c->beta_bytes : &c->cache_bytes) = (double)b;
        return rc;
    }
    if (!strcmp(key, "reduce-bandwidth")) return set_per_byte(key, v, &c->shm.gamma);
    if (!strcmp(key, "nic-latency")) return set_time(key, v, &c->nic_alpha);
    if (!strcmp(key, "tcp-bandwidth")) return set_per_byte(key, v, &c->tcp_cpu);
    if (!strcmp(key, "shared-cores")) {
        static const char *const yes_no[] = {"no", "yes", NULL};
        return tally__parse_word("--shared-cores", v, yes_no, &c->shared_cores);
    }
    if (!strcmp(key, "nic")) {
        double r;
        if (tally__units_rate(v, &r) || !(r > 0)) return bad(key, v, "it takes a rate: 10Gbps, 100Gbps, 1.25GB/s");
        c->nic_rate = r;
        return 0;
    }
    if (!strcmp(key, "fabric")) {
        char name[64];
        snprintf(name, sizeof name, "--%s", key);
        return tally__parse_word(name, v, fabrics, &c->fabric);
    }
    if (!strcmp(key, "nic-payload")) return tally__parse_real("--nic-payload", v, 0, 1, 1, &c->nic_payload);
    if (!strcmp(key, "oversub")) return tally__parse_real("--oversub", v, 1, 0, 1e6, &c->oversub);
    if (!strcmp(key, "compute-sd")) return tally__parse_real("--compute-sd", v, 0, 0, 10, &c->compute_sd);
    if (!strcmp(key, "slow")) return set_slow(c, v);
    if (!strcmp(key, "seed")) {
        uint64_t s;
        int rc = tally__parse_u64("--seed", v, &s);
        if (!rc) c->seed = s;
        return rc;
    }
    return 1;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = '\0';
    return s;
}

#define CLUSTER_FILE_MAX (1 << 20) /* a cluster file is a screenful of settings: far more is not one */

/* Why line no (len bytes, its newline not among them) cannot be a line of text, or NULL: a NUL byte or a
 * control character. */
static int binary_line(const char *path, int no, const char *line, size_t len) {
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)line[i];
        if (b >= 0x20 && b != 0x7f) continue;
        if (b == '\t' || b == '\r') continue;
        return tally__seterr(TALLY_E_INVALID,
                             "sim: %s line %d: byte %zu is %s (0x%02x); a cluster file is text, 'key = value' lines",
                             path, no, i + 1, b ? "a control character" : "a NUL", b);
    }
    return 0;
}

/* One line, NUL-terminated in place of its newline: its setting, or nothing for a blank or a comment;
 * a setting made is handed to seen (when there is one). */
static int cluster_line(tally__sim_cluster *c, const char *path, int no, char *line, tally__sim_seen seen, void *ctx) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *s = trim(line);
    if (!*s) return 0;
    char *eq = strchr(s, '=');
    if (!eq) return tally__seterr(TALLY_E_INVALID, "sim: %s line %d: '%s' is not 'key = value'", path, no, s);
    *eq = '\0';
    char *key = trim(s), *val = trim(eq + 1);
    int r = tally__sim_cluster_set(c, key, val);
    if (r == 1)
        return tally__seterr(TALLY_E_INVALID, "sim: %s line %d: no setting '%s' (see tally sim --help)", path, no, key);
    if (r) { /* the setting's own message, after where it is (never formatted from itself) */
        char where[4200];
        snprintf(where, sizeof where, "sim: %s line %d: ", path, no);
        return tally__err_wrap(r, where, "");
    }
    if (seen && seen(ctx, key, val))
        return tally__seterr(TALLY_E_NOMEM, "sim: %s line %d: out of memory keeping the setting '%s'", path, no, key);
    return 0;
}

/* The file at fd, read whole: its size checked against the bound before anything is allocated, and a
 * file holding more than that size said (a kernel file that says 0, one still being written) refused
 * rather than read on. */
static int cluster_bytes(int fd, const char *path, const char *label, uint64_t size, unsigned char **out) {
    *out = NULL;
    if (size > CLUSTER_FILE_MAX)
        return tally__seterr(TALLY_E_INVALID,
                             "sim: %s: more than %d bytes; a cluster file is a few 'key = value' lines", path,
                             CLUSTER_FILE_MAX);
    int rc = tally__file_read_all(fd, label, size, out);
    char more;
    ssize_t k = rc ? 0 : pread(fd, &more, 1, (off_t)size);
    if (!rc && k != 0)
        rc = k < 0 ? tally__seterr(TALLY_E_SYSTEM, "%s: cannot read it: %s", label, strerror(errno))
                   : tally__seterr(TALLY_E_INVALID,
                                   "%s: holds more than the %llu bytes its size said when it was opened (a kernel "
                                   "file, or one still being written); give tally a file nothing changes",
                                   label, (unsigned long long)size);
    if (rc) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

int tally__sim_cluster_read_seen(tally__sim_cluster *c, const char *path, tally__sim_seen seen, void *ctx) {
    char label[4200];
    snprintf(label, sizeof label, "sim: the cluster file %s", path);
    int fd;
    uint64_t size = 0;
    int rc = tally__file_open_read(AT_FDCWD, path, label, &fd, &size); /* a FIFO, a device... refused */
    if (rc) return rc;
    unsigned char *bytes;
    rc = cluster_bytes(fd, path, label, size, &bytes);
    close(fd);
    char *line = (char *)bytes, *end = line + (rc ? 0 : size);
    for (int no = 1; !rc && line < end; no++) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t len = nl ? (size_t)(nl - line) : (size_t)(end - line);
        line[len] = '\0'; /* the newline, or the NUL past the last byte */
        if (!(rc = binary_line(path, no, line, len))) rc = cluster_line(c, path, no, line, seen, ctx);
        line += len + 1;
    }
    free(bytes);
    return rc;
}

int tally__sim_cluster_read(tally__sim_cluster *c, const char *path) {
    return tally__sim_cluster_read_seen(c, path, NULL, NULL);
}

int tally__sim_cluster_check(const tally__sim_cluster *c) {
    long long n = (long long)c->hosts * c->per_host;
    if (c->hosts < 1 || c->per_host < 1 || n > (1 << 24))
        return tally__seterr(TALLY_E_INVALID,
                             "sim: %d hosts x %d ranks per host: need at least 1 x 1, at most 2^24 ranks", c->hosts,
                             c->per_host);
    if (!(c->nic_rate > 0) || !(c->nic_payload > 0 && c->nic_payload <= 1) || !(c->shm.beta > 0) ||
        !(c->shm.gamma >= 0) || !(c->shm.alpha >= 0) || !(c->nic_alpha >= 0))
        return tally__seterr(TALLY_E_INVALID, "sim: the links need positive rates and latencies of 0 or more");
    if (c->fabric == TALLY__SIM_FAT_TREE && (c->hosts_per_leaf < 1 || !(c->oversub >= 1)))
        return tally__seterr(TALLY_E_INVALID, "sim: a fat tree needs --hosts-per-leaf >= 1 and --oversub >= 1");
    for (int i = 0; i < c->nslow; i++)
        if (c->slow[i].rank >= n)
            return tally__seterr(TALLY_E_INVALID, "sim: --slow %d:%g names rank %d, but the world has ranks 0..%lld",
                                 c->slow[i].rank, c->slow[i].factor, c->slow[i].rank, n - 1);
    return 0;
}
