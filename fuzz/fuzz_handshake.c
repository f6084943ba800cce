/* fuzz_handshake.c - fuzz target for the rendezvous as a stranger meets it: a live rank 0 of a 2-rank
 * world runs in a thread of this process, and each input is one loopback TCP connection to it. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "boot/boot_int.h"
#include "boot/net.h"
#include "core/clock.h"
#include "fuzz.h"

/* Rank 0 listens afresh after this long without a join; the inputs never rely on it. */
#define HS_RDV_S 600.0
/* The longest any one step of an input may take (the client's dial, proof, reply; rank 0's wait for
 * the monitor to read what rank 1 sent). Every real step takes microseconds: past it, something hangs.
 * Generous, because a fuzzer run at low priority on a busy machine can wait seconds for a core (5 s
 * was once exceeded that way by an input that replays in 0.2 s). */
#define HS_STEP_S 30.0
/* Once rank 1 has shut its side, the monitor is taken to have stopped reading (after a frame it
 * refused) when its socket's backlog stays put this long. */
#define HS_STILL_NS    2000000u
#define HS_CHECK_EVERY 500 /* inputs between checks that a genuine rank 1 still gets in */
#define HS_FD_SLACK    4   /* rank 0 holds 1 to 3 descriptors, by where it is in its cycle */
/* The last genuine rank 1 sends this in the allgather; rank 0 stops on it once stopping was asked
 * (hs_stop), so no input can stop it early. */
#define HS_LAST "rank-1:q"

static atomic_int hs_port;
static atomic_int hs_stop; /* set at exit */
static pthread_t hs_thread;
static long hs_inputs;
static int hs_fd_base = -1;

static void hs_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void hs_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_handshake: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (after %ld inputs)\n", hs_inputs);
    va_end(ap);
    abort(); /* the fuzzer reports the input that led here */
}

static void hs_nap_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static int hs_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len))
        hs_die("no free loopback port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static int hs_count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own fd */
}

static void hs_env(tally__boot_env *env, int rank) {
    memset(env, 0, sizeof *env);
    env->rank = rank;
    env->size = FZ_HS_SIZE;
    snprintf(env->host, sizeof env->host, "127.0.0.1");
    env->port = atomic_load(&hs_port);
    env->token_len = sizeof FZ_HS_TOKEN - 1;
    memcpy(env->token, FZ_HS_TOKEN, env->token_len);
    snprintf(env->source, sizeof env->source, "fuzz");
}

/* ---- rank 0: the listener ---- */

/* Waits until rank 1 has shut its side and the monitor has read all it sent, or has stopped reading
 * (a fault, or a frame it will not take), so every input is decoded in full before the next. */
static void hs_drained(tally__boot *b, tally__fault *f) {
    int fd = b->ctl[1], last = -1;
    uint64_t end = tally__deadline(HS_STEP_S), still = 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    int rc;
    do rc = poll(&p, 1, tally__net_poll_ms(end));
    while ((rc < 0 && errno == EINTR) || (rc == 0 && tally__now_ns() < end));
    if (rc <= 0) hs_die("rank 1 did not shut its side of the connection within %.0f s", HS_STEP_S);
    while (!atomic_load(&f->code)) {
        int inq = 0;
        if (ioctl(fd, FIONREAD, &inq) != 0 || inq == 0) return;
        uint64_t now = tally__now_ns();
        if (inq != last)
            last = inq, still = now;
        else if (now - still > HS_STILL_NS)
            return;
        if (now > end) hs_die("rank 0's monitor left %d bytes of rank 1 unread for %.0f s", inq, HS_STEP_S);
        hs_nap_us(20);
    }
}

/* What rank 0 does after the rendezvous, as a communicator's setup does: bootstrap collectives over
 * the control connection, then the monitor that watches it for fault reports and goodbyes. Returns 1
 * when rank 1 was the last genuine peer of a shutdown. */
static int hs_serve(tally__boot *b, tally__fault *f) {
    unsigned char mine[8] = "rank-0!", all[2 * sizeof mine];
    if (tally__boot_allgather(b, mine, all, sizeof mine) || tally__boot_barrier(b) || tally__boot_start_monitor(b))
        return 0;
    hs_drained(b, f);
    return atomic_load(&hs_stop) && !memcmp(all + 8, HS_LAST, 8);
}

static void *hs_server(void *arg) {
    (void)arg;
    for (int last = 0; !last;) {
        tally__fault f;
        tally__fault_init(&f);
        tally__boot_env env;
        hs_env(&env, 0);
        tally__boot *b = NULL;
        int rc = tally__boot_init(&b, &env, &f, HS_RDV_S);
        if (rc == TALLY_E_BOOT) { /* the port was taken meanwhile: move */
            atomic_store(&hs_port, hs_free_port());
            hs_nap_us(1000);
        }
        if (rc) continue;
        last = hs_serve(b, &f);
        tally__boot_free(b);
    }
    return NULL;
}

/* ---- rank 1's side: a stranger, and now and then a genuine peer ---- */

/* Connects to rank 0, retrying while it is between two rendezvous (its listener closed). */
static int hs_dial(void) {
    uint64_t end = tally__deadline(HS_STEP_S);
    for (;;) {
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)atomic_load(&hs_port)),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) hs_die("socket(): %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            /* Reset on close: no TIME_WAIT left behind, so millions of inputs cannot run out of ports. */
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            if (tally__net_tune(fd) || setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg))
                hs_die("cannot set up the socket: %s", strerror(errno));
            return fd;
        }
        int e = errno;
        close(fd);
        /* EINTR: libFuzzer's timer interrupted it; rank 0 drops the half-made connection. */
        if ((e != ECONNREFUSED && e != EINTR) || tally__now_ns() > end) hs_die("cannot reach rank 0: %s", strerror(e));
        hs_nap_us(100);
    }
}

/* Reads until rank 0 closes the connection: it has then finished with this input. */
static void hs_await_close(int fd) {
    uint64_t end = tally__deadline(HS_STEP_S);
    char buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) continue;
        if (n == 0) return;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return; /* reset: closed too */
        if (tally__net_wait(fd, POLLIN, end)) hs_die("rank 0 did not close the connection within %.0f s", HS_STEP_S);
    }
}

static void hs_stranger(const uint8_t *data, size_t size) {
    int mode = data[0] % FZ_HS_MODES, fd = -1;
    for (int tries = 0; fd < 0; tries++) {
        fd = hs_dial();
        if (mode != FZ_HS_AUTH) break;
        int rc = tally__auth_connect(fd, FZ_HS_TOKEN, sizeof FZ_HS_TOKEN - 1, "ctl", tally__deadline(HS_STEP_S));
        if (rc == 0) break;
        close(fd);
        fd = -1;
        /* Rank 0 drops what is still queued when it ends a rendezvous by its deadline; once is luck. */
        if (rc != TALLY_E_PEER_LOST || tries == 2) hs_die("rank 0 refused a correct proof: %s", tally_last_error());
    }
    /* Rank 0 may hang up part way (it refused what it read): that is its right, not an error. */
    (void)tally__net_send_all(fd, data + 1, size - 1, tally__deadline(HS_STEP_S));
    shutdown(fd, SHUT_WR);
    hs_await_close(fd);
    close(fd);
}

/* A genuine rank 1 must still join, run the bootstrap collectives and leave cleanly; and the inputs
 * so far must not have left descriptors behind. The last one tells rank 0 to stop. */
static void hs_check(int last) {
    tally__fault f;
    tally__fault_init(&f);
    tally__boot_env env;
    hs_env(&env, 1);
    tally__boot *b = NULL;
    if (tally__boot_init(&b, &env, &f, HS_STEP_S)) hs_die("a genuine rank 1 cannot join: %s", tally_last_error());
    unsigned char mine[8], all[2 * sizeof mine];
    memcpy(mine, last ? HS_LAST : "rank-1!", sizeof mine);
    int rc = tally__boot_allgather(b, mine, all, sizeof mine);
    if (!rc) rc = tally__boot_barrier(b);
    if (rc) hs_die("a genuine rank 1's bootstrap collectives failed: %s", tally_last_error());
    if (memcmp(all, "rank-0!", 8) || memcmp(all + 8, mine, 8)) hs_die("a genuine rank 1's allgather got wrong data");
    if (tally__boot_start_monitor(b)) hs_die("a genuine rank 1 cannot start its monitor: %s", tally_last_error());
    tally__boot_free(b);
    int fds = hs_count_fds();
    if (hs_fd_base < 0)
        hs_fd_base = fds;
    else if (fds > hs_fd_base + HS_FD_SLACK)
        hs_die("%d descriptors open, %d after the first check", fds, hs_fd_base);
}

/* At exit: one last genuine join, which rank 0 takes for the signal to stop. */
static void hs_shutdown(void) {
    atomic_store(&hs_stop, 1);
    hs_check(1);
    pthread_join(hs_thread, NULL);
}

static void hs_start(void) {
    /* OpenSSL registers an exit handler that tears it down at its first use: used before ours is
     * registered, it is torn down after our last check needs it. */
    unsigned char x;
    if (RAND_bytes(&x, 1) != 1) hs_die("OpenSSL cannot start");
    atomic_store(&hs_port, hs_free_port());
    if (pthread_create(&hs_thread, NULL, hs_server, NULL)) hs_die("cannot start the listener thread");
    atexit(hs_shutdown);
    hs_check(0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, hs_start);
    if (size < 1) return 0;
    hs_stranger(data, size);
    if (++hs_inputs % HS_CHECK_EVERY == 0) hs_check(0);
    return 0;
}
