/* test_rdv_junk.c - junk thrown at the rendezvous port while `tally train` runs on 2 ranks must not
 * change its result: the final parameters' SHA-256 equals that of a clean run. */

/* The junk: random bytes, silent and half-closed connections, resets, handshakes that stop midway (with
 * and without the token), during the rendezvous and after it (when the port is closed). Both runs have
 * a rendezvous limit shorter than the time a stalled stranger may hold its slot, so a rank 0 that
 * waited on one would fail the run. */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "boot/boot.h"
#include "boot/boot_int.h"
#include "boot/net.h"
#include "core/clock.h"
#include "harness.h"

#define HELD_MAX   24 /* connections the thrower keeps open at once */
#define JUNK_KINDS 10

/* What rank 0 tells the parent (shared memory), and what the thrower counts. */
typedef struct shared {
    char host[64];
    int port;
    char token[TALLY__TOKEN_MAX];
    volatile int ready;
} shared;

static shared *S;
static char g_bin[PATH_MAX], g_dir[PATH_MAX];

typedef struct run_cfg {
    const char *tag; /* file names: <dir>/<tag>.json, <dir>/<tag>.r<k>.log */
    int junk;
} run_cfg;

static void usleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the ranks: `tally train` itself, started with the harness's rendezvous variables ---- */

static void env_rank(int rank, void *arg) {
    /* Shorter than the 5 s a stalled stranger may hold a handshake slot: a rank 0 that waited on one
     * would time out. The same in the clean run, so the two differ only by the junk. */
    setenv("TALLY_BOOT_TIMEOUT", "4", 1);
    if (rank != 0) return;
    const char *a = getenv("TALLY_ADDR"), *colon = a ? strrchr(a, ':') : NULL;
    if (!colon || (size_t)(colon - a) >= sizeof S->host) return;
    memcpy(S->host, a, (size_t)(colon - a));
    S->port = atoi(colon + 1);
    snprintf(S->token, sizeof S->token, "%s", getenv("TALLY_TOKEN"));
    __sync_synchronize();
    S->ready = 1;
}

static int fn_rank(int rank, int size, void *arg) {
    const run_cfg *c = arg;
    char json[PATH_MAX + 64], log[PATH_MAX + 64];
    snprintf(json, sizeof json, "%s/%s.json", g_dir, c->tag);
    snprintf(log, sizeof log, "%s/%s.r%d.log", g_dir, c->tag, rank);
    if (!freopen(log, "w", stdout) || dup2(fileno(stdout), 2) < 0) return 90;
    /* Rank 1 comes late, so the junk meets rank 0 while it waits in the rendezvous. */
    if (c->junk && rank == 1) usleep_ms(700);
    char *argv[] = {g_bin,       "train",   "-n",     "2", "--data", "synthetic", "--steps", "30",
                    "--no-eval", "--quiet", "--seed", "7", "--json", json,        NULL};
    execv(g_bin, argv);
    perror("execv");
    return 91;
}

/* ---- the thrower ---- */

typedef struct thrower {
    pthread_t th;
    volatile int stop;
    int held[HELD_MAX], nheld;
    unsigned seed;
    int connected, refused_after, kinds_seen[JUNK_KINDS];
} thrower;

static int junk_connect(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)S->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {0, 300 * 1000}; /* a read that waits on rank 0 gives up soon */
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void junk_hold(thrower *t, int fd) {
    if (t->nheld == HELD_MAX) {
        close(t->held[0]);
        memmove(t->held, t->held + 1, sizeof t->held[0] * (HELD_MAX - 1));
        t->nheld--;
    }
    t->held[t->nheld++] = fd;
}

static void junk_fill(thrower *t, unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)rand_r(&t->seed);
}

/* One connection of the given kind. Returns 1 if it was held open, 0 if closed. */
static int junk_one(thrower *t, int fd, int kind) {
    unsigned char buf[400], hdr[CTL_HDR];
    size_t n = 1 + (size_t)rand_r(&t->seed) % 300;
    uint64_t dl = tally__deadline(1.0);
    junk_fill(t, buf, sizeof buf);
    switch (kind) {
    case 0: (void)!send(fd, buf, n, MSG_NOSIGNAL); return 0;  /* random bytes, then gone */
    case 1: (void)!send(fd, buf, n, MSG_NOSIGNAL); return 1;  /* random bytes, then silence */
    case 2: return 1;                                         /* half-open: connected, silent */
    case 3: shutdown(fd, SHUT_WR); return 1;                  /* half-closed at once */
    case 4: (void)!send(fd, buf, 17, MSG_NOSIGNAL); return 1; /* part of a nonce */
    case 5:                                                   /* a nonce, the reply, no proof */
        (void)!send(fd, buf, 32, MSG_NOSIGNAL);
        (void)!recv(fd, buf, 64, MSG_WAITALL);
        return 1;
    case 6: /* a whole handshake with a wrong proof */
        (void)!send(fd, buf, 32, MSG_NOSIGNAL);
        (void)!recv(fd, buf + 32, 64, MSG_WAITALL);
        (void)!send(fd, buf + 100, 32, MSG_NOSIGNAL);
        (void)!recv(fd, buf, 1, 0);
        return 0;
    case 7: /* the token, then half a frame header */
    case 8: /* the token, a header, then part of the hello */
        if (tally__net_tune(fd) || tally__auth_connect(fd, S->token, strlen(S->token), "ctl", dl)) return 0;
        tally__ctl_hdr_put(hdr, CTL_HELLO, 0, HELLO_LEN);
        (void)!send(fd, hdr, kind == 7 ? 9 : CTL_HDR, MSG_NOSIGNAL);
        if (kind == 8) (void)!send(fd, buf, 77, MSG_NOSIGNAL);
        return 1;
    default: { /* a reset instead of a close */
        struct linger l = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        return 0;
    }
    }
}

static void *junk_main(void *arg) {
    thrower *t = arg;
    for (int k = 0; !t->stop; k++) {
        int fd = junk_connect(), kind = k % JUNK_KINDS;
        if (fd < 0) {
            t->refused_after += t->connected > 0; /* the listener closed after the rendezvous */
            usleep_ms(t->connected ? 20 : 2);
            continue;
        }
        t->connected++;
        t->kinds_seen[kind]++;
        if (junk_one(t, fd, kind))
            junk_hold(t, fd);
        else
            close(fd);
        usleep_ms(2);
    }
    for (int i = 0; i < t->nheld; i++) close(t->held[i]);
    return NULL;
}

/* ---- runs and their summaries ---- */

/* Copies the value of "key": "..." (or a bare value) from a JSON file into out; 0 if found. */
static int json_field(const char *path, const char *key, char *out, size_t n) {
    char buf[8192], pat[64];
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    char *p = strstr(buf, pat);
    if (!p) return -1;
    p += strlen(pat);
    if (*p == '"') p++;
    size_t k = strcspn(p, "\",\n}");
    if (k >= n) return -1;
    memcpy(out, p, k);
    out[k] = '\0';
    return 0;
}

static void print_logs(const char *tag) {
    for (int r = 0; r < 2; r++) {
        char path[PATH_MAX + 64], cmd[PATH_MAX + 128], out[4096];
        snprintf(path, sizeof path, "%s/%s.r%d.log", g_dir, tag, r);
        snprintf(cmd, sizeof cmd, "tail -n 15 '%s'", path);
        th_shell(cmd, 10, out, sizeof out);
        fprintf(stderr, "  --- %s rank %d (last lines) ---\n%s", tag, r, out);
    }
}

/* Counts lines of rank 0's log that contain `text`. */
static int log_count(const char *tag, const char *text) {
    char path[PATH_MAX + 64], line[2048];
    snprintf(path, sizeof path, "%s/%s.r0.log", g_dir, tag);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f)) n += strstr(line, text) != NULL;
    if (f) fclose(f);
    return n;
}

/* The total rank 0 reports once the rendezvous ends ("refused N connections in all"), else the lines. */
static int log_refused(const char *tag) {
    char path[PATH_MAX + 64], line[2048];
    snprintf(path, sizeof path, "%s/%s.r0.log", g_dir, tag);
    FILE *f = fopen(path, "r");
    int total = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "refused ");
        int k;
        if (p && sscanf(p, "refused %d connections in all", &k) == 1) total = k;
    }
    if (f) fclose(f);
    return total >= 0 ? total : log_count(tag, "refused a connection from");
}

/* One training run; fills hash, returns 0 when both ranks exited 0 with a summary. */
static int train_run(const char *transport, const char *tag, int junk, char hash[80], thrower *t) {
    run_cfg c = {tag, junk};
    th_opts o = {.transport = transport, .algo = "ring", .child_env = env_rank};
    th_job job;
    memset((void *)S, 0, sizeof *S);
    if (th_start(&job, 2, &o, fn_rank, &c)) return -1;
    if (junk) {
        double t0 = th_now();
        while (!S->ready && th_now() - t0 < 10) usleep_ms(1);
        memset(t, 0, sizeof *t);
        t->seed = (unsigned)getpid();
        if (pthread_create(&t->th, NULL, junk_main, t)) t->stop = 2;
    }
    int bad = th_wait(&job, 120);
    if (junk && t->stop != 2) {
        t->stop = 1;
        pthread_join(t->th, NULL);
    }
    char json[PATH_MAX + 64], ident[16] = "";
    snprintf(json, sizeof json, "%s/%s.json", g_dir, tag);
    hash[0] = '\0';
    int rc = bad || json_field(json, "params_sha256", hash, 80) || json_field(json, "replicas_identical", ident, 16) ||
                     strcmp(ident, "true")
                 ? -1
                 : 0;
    TH_CHECK(rc == 0, "%s run over %s: %d rank(s) failed or no summary (replicas_identical '%s')", tag, transport, bad,
             ident);
    if (rc) print_logs(tag);
    return rc;
}

static void test_transport(const char *transport) {
    char clean[80], junk[80], tag_c[32], tag_j[32];
    thrower t = {0};
    snprintf(tag_c, sizeof tag_c, "clean-%s", transport);
    snprintf(tag_j, sizeof tag_j, "junk-%s", transport);
    if (train_run(transport, tag_c, 0, clean, NULL)) return;
    int rc = train_run(transport, tag_j, 1, junk, &t);
    int kinds = 0;
    for (int k = 0; k < JUNK_KINDS; k++) kinds += t.kinds_seen[k] > 0;
    printf("%s: %d junk connections reached the port (%d kinds), %d refused once it closed; rank 0 refused %d\n",
           transport, t.connected, kinds, t.refused_after, log_refused(tag_j));
    TH_CHECK(t.stop != 2, "%s: the thrower did not start", transport);
    TH_CHECK(kinds == JUNK_KINDS, "%s: only %d of %d kinds of junk met the listener (rank 1 joined too soon?)",
             transport, kinds, JUNK_KINDS);
    TH_CHECK(t.refused_after > 0, "%s: no junk was thrown after the rendezvous", transport);
    TH_CHECK(log_count(tag_j, "refused a connection from") > 0, "%s: rank 0 logged no refused connection", transport);
    if (rc) return;
    TH_CHECK(!strcmp(clean, junk), "%s: junk changed the result: params_sha256 %s clean, %s with junk", transport,
             clean, junk);
}

/* The tally binary: TALLY_BIN (ctest sets it), else ../tally beside this test's directory. */
static int find_bin(void) {
    const char *b = getenv("TALLY_BIN");
    if (b && *b) return snprintf(g_bin, sizeof g_bin, "%s", b) < (int)sizeof g_bin ? 0 : -1;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash) return -1;
    *slash = '\0';
    snprintf(g_bin, sizeof g_bin, "%.*s/../tally", (int)(sizeof g_bin - 16), self);
    return access(g_bin, X_OK);
}

int main(void) {
    if (find_bin()) {
        fprintf(stderr, "test_rdv_junk: cannot find the tally binary: set TALLY_BIN\n");
        return 1;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/tally-rdv-junk-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    S = th_shared_alloc(sizeof *S);
    if (th_quick()) test_transport("shm");
    if (!th_light() && th_long()) test_transport("tcp");
    th_shared_free(S, sizeof *S);
    char cmd[PATH_MAX + 32], out[256];
    if (!th_failed) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        th_shell(cmd, 30, out, sizeof out);
    } else {
        fprintf(stderr, "test_rdv_junk: logs kept in %s\n", g_dir);
    }
    return th_verdict("test_rdv_junk");
}
