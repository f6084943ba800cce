/* tcp_duplex.c - the loopback "wire" a 2-rank tcp allreduce runs on: two processes stream each other BYTES
 * ITERS times over one TCP connection, both ways at once; prints the mean microseconds per BYTES. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* At most this many bytes per send() or recv(), as tally's tcp transport hands the kernel its pieces. */
#define DUPLEX_PIECE (1u << 20)

typedef struct duplex {
    int fd, iters;
    size_t n;
    char *out, *in;
    int failed;
} duplex;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Streams iters x n bytes out, on a thread of its own so sending never waits for receiving: a bound, not
 * a protocol. */
static void *send_all(void *arg) {
    duplex *d = arg;
    for (int i = 0; i < d->iters && !d->failed; i++)
        for (size_t at = 0; at < d->n;) {
            ssize_t w = send(d->fd, d->out + at, d->n - at < DUPLEX_PIECE ? d->n - at : DUPLEX_PIECE, MSG_NOSIGNAL);
            if (w <= 0) {
                d->failed = 1;
                break;
            }
            at += (size_t)w;
        }
    return NULL;
}

static int recv_one(duplex *d) {
    for (size_t at = 0; at < d->n;) {
        ssize_t r = recv(d->fd, d->in + at, d->n - at < DUPLEX_PIECE ? d->n - at : DUPLEX_PIECE, 0);
        if (r <= 0) return -1;
        at += (size_t)r;
    }
    return 0;
}

/* Every wait of this program ends: an accept, a send or a receive that waits this long fails it. */
static int bounded(int fd) {
    struct timeval limit = {.tv_sec = 10};
    return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) ||
           setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
}

/* A connected pair: the listener's end in the parent, the connecting end in the child (*child = 1). */
static int connect_pair(int *child) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0 || bounded(ls) || bind(ls, (struct sockaddr *)&a, sizeof a) ||
        getsockname(ls, (struct sockaddr *)&a, &len) || listen(ls, 1))
        return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    *child = pid == 0;
    int fd;
    if (*child) {
        close(ls);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a)) fd = -1;
    } else {
        fd = accept(ls, NULL, NULL);
        close(ls);
    }
    int one = 1;
    if (fd < 0 || bounded(fd) || setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) return -1;
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 3 || atol(argv[1]) <= 0 || atoi(argv[2]) <= 0) {
        fprintf(stderr, "usage: tcp_duplex BYTES ITERS\n");
        return 2;
    }
    enum { WARMUP = 3 }; /* socket buffers grow, pages fault in */
    duplex d = {.n = (size_t)atol(argv[1]), .iters = atoi(argv[2]) + WARMUP};
    int child = 0;
    d.out = malloc(d.n);
    d.in = malloc(d.n);
    d.fd = d.out && d.in ? connect_pair(&child) : -1;
    if (d.fd < 0) {
        perror("tcp_duplex");
        return 1;
    }
    memset(d.out, 1, d.n);
    memset(d.in, 0, d.n);
    pthread_t sender;
    if (pthread_create(&sender, NULL, send_all, &d)) return 1;
    double t = 0;
    int rc = 0;
    for (int i = 0; i < d.iters && !rc; i++) {
        if (i == WARMUP) t = now();
        rc = recv_one(&d);
    }
    t = now() - t;
    if (rc) shutdown(d.fd, SHUT_RDWR); /* the sender stops too */
    pthread_join(sender, NULL);
    if (rc || d.failed || d.in[d.n - 1] != 1) {
        fprintf(stderr, "tcp_duplex: the exchange failed\n");
        return 1;
    }
    if (child) return 0;
    printf("%.2f\n", t / (d.iters - WARMUP) * 1e6);
    int status;
    wait(&status);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
