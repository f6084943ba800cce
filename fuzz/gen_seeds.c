/* gen_seeds.c - writes the seed inputs of every fuzz target (valid frames of each kind, handshake
 * transcripts, IDX files of each type plain and gzipped, checkpoints) under DIR/<target>/seed-*, one file each. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <tally/data.h>

#include "boot/boot_int.h"
#include "fuzz.h"
#include "ckpt/ckpt.h"
#include "ckpt/ckpt_int.h"
#include "transport/tcp_int.h"

/* An input under construction. */
typedef struct gs_buf {
    unsigned char b[8192];
    size_t n;
} gs_buf;

static const char *gs_dir;
static int gs_count;

static void gs_put(gs_buf *s, const void *p, size_t n) {
    if (s->n + n > sizeof s->b) {
        fprintf(stderr, "gen_seeds: seed too large\n");
        exit(1);
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
}

static void gs_byte(gs_buf *s, unsigned v) {
    unsigned char c = (unsigned char)v;
    gs_put(s, &c, 1);
}

static void gs_write(const char *target, const char *name, const gs_buf *s) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", gs_dir, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/seed-%s", gs_dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(s->b, 1, s->n, f) != s->n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    gs_count++;
}

/* ---- frames ---- */

static tally__sig gs_sig(uint64_t seq, size_t count, int dtype, int op) {
    return (tally__sig){.seq = seq,
                        .count = count,
                        .root = -1,
                        .coll = TALLY__ALLREDUCE,
                        .dtype = (uint8_t)dtype,
                        .op = (uint8_t)op,
                        .algo = 1};
}

static void gs_tcp_hdr(gs_buf *s, uint32_t magic, tally__sig sig, uint64_t len) {
    tally__tcp_hdr h = {.magic = magic, .sig = sig, .len = len};
    gs_put(s, &h, sizeof h);
}

static void gs_ctl(gs_buf *s, int type, uint32_t aux, const void *p, uint32_t len) {
    unsigned char h[CTL_HDR];
    tally__ctl_hdr_put(h, type, aux, len);
    gs_put(s, h, sizeof h);
    if (len) gs_put(s, p, len);
}

/* The 160-byte hello (layout in src/boot/boot.c): magic, version, rank, size, pid, 0, hostid,
 * hostname[64], ip[64]. */
static void gs_hello(unsigned char h[FZ_HELLO_LEN], uint32_t magic, uint32_t version, int rank, int size,
                     const char *host) {
    memset(h, 0, FZ_HELLO_LEN);
    tally__put_be32(h, magic);
    tally__put_be32(h + 4, version);
    tally__put_be32(h + 8, (uint32_t)rank);
    tally__put_be32(h + 12, (uint32_t)size);
    tally__put_be32(h + 16, 31337);
    tally__put_be64(h + 24, 0x0123456789abcdefull);
    memcpy(h + 32, host, strlen(host));
    memcpy(h + 96, "127.0.0.1", 9);
}
#define GS_HELLO_MAGIC 0x544c5948u /* "TLYH" */

static size_t gs_fault(unsigned char *p, int code, int culprit, const char *msg) {
    tally__put_be32(p, (uint32_t)code);
    tally__put_be32(p + 4, (uint32_t)culprit);
    memcpy(p + 8, msg, strlen(msg));
    return 8 + strlen(msg);
}

/* WAIT and FAULT frames between a data connection's messages (tcp_ctl.c): a WAIT before each
 * message, a FAULT after the first, one cut short, one too long, one with a culprit out of range. */
static void gs_tcp_wait(gs_buf *s, uint64_t seq, uint32_t aux) {
    tally__tcp_hdr h = {.magic = TALLY__TCP_MAGIC_WAIT, .aux = aux, .sig = gs_sig(seq, 2, TALLY_F32, TALLY_SUM)};
    gs_put(s, &h, sizeof h);
}

static void gs_tcp_fault(gs_buf *s, int code, int culprit, const char *msg, int64_t len_delta) {
    unsigned char p[512];
    size_t n = gs_fault(p, code, culprit, msg);
    gs_tcp_hdr(s, TALLY__TCP_MAGIC_FAULT, gs_sig(FZ_TCP_SEQ0, 2, TALLY_F32, TALLY_SUM),
               (uint64_t)((int64_t)n + len_delta));
    gs_put(s, p, n);
}

static void gs_frame_tcp_ctl(void) {
    struct {
        const char *name;
        int code, culprit;
        int64_t len_delta;
    } f[] = {
        {"tcp-ctl-fault", TALLY_E_PEER_LOST, 3, 0},
        {"tcp-ctl-fault-cut", TALLY_E_TIMEOUT, 2, 40},
        {"tcp-ctl-fault-culprit", TALLY_E_PEER_LOST, 9, 0},
        {"tcp-ctl-fault-short", TALLY_E_PEER_LOST, 1, -100},
    };
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
        gs_buf s = {0};
        gs_byte(&s, FZ_FRAME_TCP), gs_byte(&s, 2), gs_byte(&s, TALLY_F32), gs_byte(&s, 0);
        gs_tcp_wait(&s, FZ_TCP_SEQ0, 3);
        gs_tcp_hdr(&s, TALLY__TCP_MAGIC_DATA, gs_sig(FZ_TCP_SEQ0, 2, TALLY_F32, TALLY_SUM), 8);
        for (int i = 0; i < 8; i++) gs_byte(&s, 0x40);
        gs_tcp_wait(&s, FZ_TCP_SEQ0 + 1, 0);
        gs_tcp_fault(&s, f[k].code, f[k].culprit, "rank 3 left during allreduce #1 (peer lost)", f[k].len_delta);
        gs_tcp_hdr(&s, TALLY__TCP_MAGIC_BYE, (tally__sig){0}, 0);
        gs_write("frame", f[k].name, &s);
    }
}

static void gs_frame_tcp(void) {
    for (int dt = 0; dt < TALLY_DTYPE_COUNT; dt++) { /* two messages of each dtype, then goodbye */
        gs_buf s = {0};
        size_t count = 3, len = count * tally_dtype_size((tally_dtype)dt);
        /* op byte as fuzz_frame reads it: bits 0-1 and 4; the dtypes after u8 take the bitwise ops */
        int op = dt % 4 + (dt > TALLY_U8 ? 16 : 0);
        int ops[8] = {TALLY_SUM, TALLY_PROD, TALLY_MIN, TALLY_MAX, TALLY_BAND, TALLY_BOR, TALLY_BXOR, TALLY_SUM};
        gs_byte(&s, FZ_FRAME_TCP), gs_byte(&s, (unsigned)count), gs_byte(&s, (unsigned)dt), gs_byte(&s, (unsigned)op);
        for (uint64_t seq = FZ_TCP_SEQ0; seq < FZ_TCP_SEQ0 + 2; seq++) {
            gs_tcp_hdr(&s, TALLY__TCP_MAGIC_DATA, gs_sig(seq, count, dt, ops[(op & 3) | ((op >> 2) & 4)]), len);
            for (size_t i = 0; i < len; i++) gs_byte(&s, (unsigned)(0x3f ^ (i * 7 + seq)));
        }
        gs_tcp_hdr(&s, TALLY__TCP_MAGIC_BYE, (tally__sig){0}, 0);
        char name[64];
        snprintf(name, sizeof name, "tcp-%s", tally_dtype_name((tally_dtype)dt));
        gs_write("frame", name, &s);
    }
    struct {
        const char *name;
        int opb;
        uint32_t magic;
        uint64_t seq, count, len;
    } one[] = {
        {"tcp-copy", 4, TALLY__TCP_MAGIC_DATA, FZ_TCP_SEQ0, 2, 8},
        {"tcp-inplace", 8, TALLY__TCP_MAGIC_DATA, FZ_TCP_SEQ0, 2, 8},
        {"tcp-mismatch", 0, TALLY__TCP_MAGIC_DATA, FZ_TCP_SEQ0, 5, 8},
        {"tcp-later-seq", 0, TALLY__TCP_MAGIC_DATA, FZ_TCP_SEQ0 + 1, 2, 8},
        {"tcp-badlen", 0, TALLY__TCP_MAGIC_DATA, FZ_TCP_SEQ0, 2, 1u << 30},
        {"tcp-badmagic", 0, 0x12345678u, FZ_TCP_SEQ0, 2, 8},
        {"tcp-bye", 0, TALLY__TCP_MAGIC_BYE, 0, 0, 0},
    };
    for (size_t k = 0; k < sizeof one / sizeof one[0]; k++) { /* f32, 2 elements expected */
        gs_buf s = {0};
        gs_byte(&s, FZ_FRAME_TCP), gs_byte(&s, 2), gs_byte(&s, TALLY_F32), gs_byte(&s, (unsigned)one[k].opb);
        gs_tcp_hdr(&s, one[k].magic, gs_sig(one[k].seq, one[k].count, TALLY_F32, TALLY_SUM), one[k].len);
        for (int i = 0; i < 8; i++) gs_byte(&s, 0x40);
        gs_write("frame", one[k].name, &s);
    }
    gs_buf s = {0}; /* header-only messages (barriers), the last one cut short */
    gs_byte(&s, FZ_FRAME_TCP), gs_byte(&s, 0), gs_byte(&s, TALLY_U8), gs_byte(&s, 0);
    for (uint64_t seq = FZ_TCP_SEQ0; seq < FZ_TCP_SEQ0 + 3; seq++)
        gs_tcp_hdr(&s, TALLY__TCP_MAGIC_DATA, gs_sig(seq, 0, TALLY_U8, TALLY_SUM), 0);
    s.n -= 7;
    gs_write("frame", "tcp-empty-truncated", &s);
    gs_frame_tcp_ctl();
}

static void gs_frame_ctl(void) {
    unsigned char h[FZ_HELLO_LEN], p[CTL_FAULT_MAX];
    gs_buf s = {0};
    gs_byte(&s, FZ_FRAME_CTL), gs_byte(&s, 0);
    gs_hello(h, GS_HELLO_MAGIC, 1, 1, FZ_CTL_SIZE, "node-a");
    gs_ctl(&s, CTL_HELLO, 0, h, sizeof h);
    gs_ctl(&s, CTL_FAULT, 0, p, (uint32_t)gs_fault(p, TALLY_E_PEER_LOST, 3, "rank 3 (pid 9 on host b) died"));
    gs_ctl(&s, CTL_BYE, 0, NULL, 0);
    gs_write("frame", "ctl-rank0-hello-fault-bye", &s);

    s.n = 0;
    gs_byte(&s, FZ_FRAME_CTL), gs_byte(&s, 1);
    gs_ctl(&s, CTL_FAULT, 0, p, (uint32_t)gs_fault(p, TALLY_E_MISMATCH, 0, "collective mismatch"));
    gs_ctl(&s, CTL_FAULT, 0, p, (uint32_t)gs_fault(p, TALLY_E_TIMEOUT, -1, ""));
    gs_write("frame", "ctl-rank1-faults", &s);

    s.n = 0;
    gs_byte(&s, FZ_FRAME_CTL), gs_byte(&s, 0);
    gs_hello(h, GS_HELLO_MAGIC, 1, 2, FZ_CTL_SIZE, "node-b"); /* rank 2 is already joined */
    gs_ctl(&s, CTL_HELLO, 0, h, sizeof h);
    unsigned char data[8] = "abcdefgh", table[FZ_CTL_SIZE * 144] = {0};
    gs_ctl(&s, CTL_DATA, 1, data, sizeof data);
    gs_ctl(&s, CTL_TABLE, FZ_CTL_SIZE, table, sizeof table);
    gs_ctl(&s, CTL_REFUSE, (uint32_t)-TALLY_E_BOOT, "go away", 7);
    gs_fault(p, TALLY_E_ABORTED, 2, "");
    memset(p + 8, 'x', CTL_MSG_MAX);
    gs_ctl(&s, CTL_FAULT, 0, p, 8 + CTL_MSG_MAX); /* the longest report */
    gs_write("frame", "ctl-rank0-mixed", &s);

    s.n = 0;
    gs_byte(&s, FZ_FRAME_CTL), gs_byte(&s, 3);
    gs_ctl(&s, CTL_FAULT, 0, p, (uint32_t)gs_fault(p, 5, 7, "a positive code and a culprit out of range"));
    gs_write("frame", "ctl-rank3-bad-fault", &s);

    struct {
        const char *name;
        uint32_t magic, version;
        int rank, size;
        const char *host;
    } hellos[] = {
        {"hello-ok", GS_HELLO_MAGIC, 1, 3, FZ_CTL_SIZE, "node-c"},
        {"hello-version", GS_HELLO_MAGIC, 2, 1, FZ_CTL_SIZE, "node-c"},
        {"hello-size", GS_HELLO_MAGIC, 1, 1, 8, "node-c"},
        {"hello-rank0", GS_HELLO_MAGIC, 1, 0, FZ_CTL_SIZE, "node-c"},
        {"hello-dup", GS_HELLO_MAGIC, 1, 2, FZ_CTL_SIZE, "node-c"},
        {"hello-host", GS_HELLO_MAGIC, 1, 1, FZ_CTL_SIZE, "bad\x01host"},
    };
    for (size_t k = 0; k < sizeof hellos / sizeof hellos[0]; k++) {
        s.n = 0;
        gs_byte(&s, FZ_FRAME_HELLO);
        gs_hello(h, hellos[k].magic, hellos[k].version, hellos[k].rank, hellos[k].size, hellos[k].host);
        gs_put(&s, h, sizeof h);
        gs_write("frame", hellos[k].name, &s);
    }
}

/* ---- handshake transcripts (what rank 1 sends; the target proves the token itself) ---- */

/* After the hello, the bootstrap steps rank 0 runs (allgather of 8 bytes, barrier), then `tail`. */
static void gs_hs_joined(const char *name, const unsigned char *tail, size_t tail_len) {
    unsigned char h[FZ_HELLO_LEN];
    gs_buf s = {0};
    gs_byte(&s, FZ_HS_AUTH);
    gs_hello(h, GS_HELLO_MAGIC, 1, 1, FZ_HS_SIZE, "node-1");
    gs_ctl(&s, CTL_HELLO, 0, h, sizeof h);
    gs_ctl(&s, CTL_DATA, 1, "rank-1!", 8);
    gs_ctl(&s, CTL_DATA, 2, NULL, 0);
    if (tail_len) gs_put(&s, tail, tail_len);
    gs_write("handshake", name, &s);
}

static void gs_handshake(void) {
    gs_buf s = {0}, t = {0};
    unsigned char h[FZ_HELLO_LEN], p[CTL_FAULT_MAX];
    gs_byte(&s, FZ_HS_RAW);
    gs_write("handshake", "raw-empty", &s);
    for (int i = 0; i < 32; i++) gs_byte(&s, (unsigned)i);
    gs_write("handshake", "raw-nonce", &s);
    for (int i = 0; i < 32; i++) gs_byte(&s, 0);
    gs_write("handshake", "raw-nonce-proof", &s);

    s.n = 0;
    gs_byte(&s, FZ_HS_AUTH);
    gs_write("handshake", "auth-then-nothing", &s);

    gs_hs_joined("auth-join-leave", NULL, 0);
    gs_ctl(&t, CTL_BYE, 0, NULL, 0);
    gs_hs_joined("auth-join-bye", t.b, t.n);
    t.n = 0;
    gs_ctl(&t, CTL_FAULT, 0, p, (uint32_t)gs_fault(p, TALLY_E_TIMEOUT, 1, "rank 1 timed out in allreduce #3"));
    gs_hs_joined("auth-join-fault", t.b, t.n);
    t.n = 0;
    gs_ctl(&t, CTL_BYE, 0, NULL, 0);
    gs_ctl(&t, CTL_DATA, 9, "late", 4);
    gs_hs_joined("auth-join-bye-then-data", t.b, t.n);
    t.n = 0;
    gs_ctl(&t, CTL_FAULT, 0, p, 4); /* shorter than a report can be */
    gs_hs_joined("auth-join-short-fault", t.b, t.n);
    t.n = 0;
    gs_ctl(&t, CTL_FAULT, 0, p, (uint32_t)gs_fault(p, TALLY_E_PROTOCOL, 0, "x"));
    t.n -= 3; /* cut inside the report */
    gs_hs_joined("auth-join-cut-fault", t.b, t.n);

    s.n = 0; /* a fault report where rank 0 expects its allgather's data */
    gs_byte(&s, FZ_HS_AUTH);
    gs_hello(h, GS_HELLO_MAGIC, 1, 1, FZ_HS_SIZE, "node-1");
    gs_ctl(&s, CTL_HELLO, 0, h, sizeof h);
    gs_ctl(&s, CTL_FAULT, 0, p, (uint32_t)gs_fault(p, TALLY_E_SYSTEM, 1, "rank 1 could not map memory"));
    gs_write("handshake", "auth-fault-in-allgather", &s);

    s.n = 0; /* the allgather's data of the wrong length, then a wrong step */
    gs_byte(&s, FZ_HS_AUTH);
    gs_ctl(&s, CTL_HELLO, 0, h, sizeof h);
    gs_ctl(&s, CTL_DATA, 1, "rank-1!!!!!!", 12);
    gs_write("handshake", "auth-allgather-mismatch", &s);

    struct {
        const char *name;
        uint32_t version;
        int rank, size;
    } bad[] = {
        {"auth-hello-version", 7, 1, FZ_HS_SIZE},
        {"auth-hello-size", 1, 1, 5},
        {"auth-hello-rank0", 1, 0, FZ_HS_SIZE},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        s.n = 0;
        gs_byte(&s, FZ_HS_AUTH);
        gs_hello(h, GS_HELLO_MAGIC, bad[k].version, bad[k].rank, bad[k].size, "node-1");
        gs_ctl(&s, CTL_HELLO, 0, h, sizeof h);
        gs_write("handshake", bad[k].name, &s);
    }
    s.n = 0;
    gs_byte(&s, FZ_HS_AUTH);
    gs_ctl(&s, CTL_DATA, 1, "rank-1!", 8);
    gs_write("handshake", "auth-data-before-hello", &s);
    s.n = 0;
    gs_byte(&s, FZ_HS_AUTH);
    gs_hello(h, GS_HELLO_MAGIC, 1, 1, FZ_HS_SIZE, "node-1");
    gs_ctl(&s, CTL_HELLO, 0, h, sizeof h);
    s.n -= 100;
    gs_write("handshake", "auth-hello-cut", &s);
}

/* ---- IDX files ---- */

static void gs_be32(gs_buf *s, uint32_t v) {
    unsigned char b[4];
    tally__put_be32(b, v);
    gs_put(s, b, 4);
}

static void gs_idx_file(gs_buf *s, int type, int ndim, const uint32_t *dims, size_t esize) {
    gs_byte(s, 0), gs_byte(s, 0), gs_byte(s, (unsigned)type), gs_byte(s, (unsigned)ndim);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) gs_be32(s, dims[i]), count *= dims[i];
    for (size_t i = 0; i < count * esize; i++) gs_byte(s, (unsigned)(i * 37 + 11));
}

static void gs_gzip(const gs_buf *in, gs_buf *out) {
    uLongf n = sizeof out->b - out->n;
    z_stream zs = {0};
    if (deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) exit(1);
    zs.next_in = (unsigned char *)in->b;
    zs.avail_in = (uInt)in->n;
    zs.next_out = out->b + out->n;
    zs.avail_out = (uInt)n;
    if (deflate(&zs, Z_FINISH) != Z_STREAM_END) exit(1);
    out->n += n - zs.avail_out;
    deflateEnd(&zs);
}

/* One IDX file four ways: plain, as a .gz file's bytes, for the target to gzip, and its header alone. */
static void gs_idx3(const char *name, const gs_buf *file) {
    gs_buf s = {0};
    char n[96];
    gs_byte(&s, FZ_IDX_PLAIN);
    gs_put(&s, file->b, file->n);
    snprintf(n, sizeof n, "%s-plain", name);
    gs_write("idx", n, &s);
    s.n = 0;
    gs_byte(&s, FZ_IDX_GZ_RAW);
    gs_gzip(file, &s);
    snprintf(n, sizeof n, "%s-gz", name);
    gs_write("idx", n, &s);
    s.n = 0;
    gs_byte(&s, FZ_IDX_GZ_WRAP), gs_byte(&s, 6);
    gs_put(&s, file->b, file->n);
    snprintf(n, sizeof n, "%s-wrap", name);
    gs_write("idx", n, &s);
    s.n = 0;
    gs_byte(&s, FZ_IDX_HEADER);
    gs_put(&s, file->b, file->n);
    snprintf(n, sizeof n, "%s-header", name);
    gs_write("idx", n, &s);
}

static void gs_idx(void) {
    struct {
        const char *name;
        int type;
        size_t esize;
    } types[] = {
        {"u8", TALLY_IDX_U8, 1},   {"i8", TALLY_IDX_I8, 1},   {"i16", TALLY_IDX_I16, 2},
        {"i32", TALLY_IDX_I32, 4}, {"f32", TALLY_IDX_F32, 4}, {"f64", TALLY_IDX_F64, 8},
    };
    uint32_t dims2[2] = {2, 3}, images[3] = {2, 4, 4}, labels[1] = {10}, empty[1] = {0};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        gs_buf f = {0};
        gs_idx_file(&f, types[k].type, 2, dims2, types[k].esize);
        gs_idx3(types[k].name, &f);
    }
    gs_buf f = {0};
    gs_idx_file(&f, TALLY_IDX_U8, 3, images, 1);
    gs_idx3("images", &f);
    f.n = 0;
    gs_idx_file(&f, TALLY_IDX_U8, 1, labels, 1);
    gs_idx3("labels", &f);
    f.n = 0;
    gs_idx_file(&f, TALLY_IDX_F32, 1, empty, 4);
    gs_idx3("empty", &f);
    gs_buf kind = {0}; /* not files at all */
    gs_byte(&kind, FZ_IDX_FIFO);
    gs_write("idx", "fifo", &kind);
    kind.n = 0;
    gs_byte(&kind, FZ_IDX_DIR);
    gs_write("idx", "dir", &kind);
    gs_buf cut = {0};
    gs_idx_file(&cut, TALLY_IDX_I32, 2, dims2, 4);
    cut.n -= 5;
    gs_idx3("truncated", &cut);
}

/* ---- checkpoints: small images made by the real writer ---- */

/* Writes tensors t[0..n) (each filled with a byte pattern) as a checkpoint of `step` in a scratch
 * directory, and makes its file a seed. */
static void gs_ckpt_one(const char *name, int64_t step, const tally__ckpt_tensor *t, int n) {
    char dir[] = "/tmp/tally-gen-seeds-XXXXXX", path[128];
    if (!mkdtemp(dir)) {
        fprintf(stderr, "gen_seeds: mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
    tally__ckpt_writer *w = NULL;
    int rc = tally__ckpt_write_begin(dir, step, t, n, &w);
    for (int i = 0; i < n && !rc; i++) {
        size_t bytes = tally_dtype_size(t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) bytes *= (size_t)t[i].shape[d];
        unsigned char buf[1024];
        for (size_t k = 0; k < bytes && k < sizeof buf; k++) buf[k] = (unsigned char)(k * 7 + (size_t)i);
        if (bytes) rc = tally__ckpt_write(w, i, buf, bytes);
    }
    if (!rc) rc = tally__ckpt_write_commit(w, 0);
    snprintf(path, sizeof path, "%s/step-%010lld.tck", dir, (long long)step);
    gs_buf s = {0};
    FILE *f = rc ? NULL : fopen(path, "rb");
    if (f) {
        s.n = fread(s.b, 1, sizeof s.b, f);
        fclose(f);
    }
    if (!f || s.n == 0 || s.n == sizeof s.b) {
        fprintf(stderr, "gen_seeds: could not make checkpoint seed %s: %s\n", name, tally_last_error());
        exit(1);
    }
    gs_write("ckpt", name, &s);
    remove(path);
    snprintf(path, sizeof path, "%s/LATEST", dir);
    remove(path);
    rmdir(dir);
}

static void gs_ckpt(void) {
    gs_buf s = {0};
    gs_write("ckpt", "empty", &s);
    gs_put(&s, "not a checkpoint\n", 17);
    gs_write("ckpt", "text", &s);
    gs_ckpt_one("no-tensors", 0, NULL, 0);
    const tally__ckpt_tensor scalars[] = {
        {.name = "train.step", .dtype = TALLY_I64, .ndim = 1, .shape = {1}},
        {.name = "train.model", .dtype = TALLY_U8, .ndim = 1, .shape = {11}},
        {.name = "optim.step", .dtype = TALLY_I64, .ndim = 0},
    };
    gs_ckpt_one("scalars", 7, scalars, 3);
    const tally__ckpt_tensor model[] = {
        {.name = "train.step", .dtype = TALLY_I64, .ndim = 1, .shape = {1}},
        {.name = "param.fc1.weight", .dtype = TALLY_F32, .ndim = 2, .shape = {5, 7}},
        {.name = "param.fc1.bias", .dtype = TALLY_F32, .ndim = 1, .shape = {5}},
        {.name = "param.conv1.weight", .dtype = TALLY_F32, .ndim = 4, .shape = {2, 1, 3, 3}},
        {.name = "optim.fc1.weight.exp_avg", .dtype = TALLY_F32, .ndim = 2, .shape = {5, 7}},
        {.name = "empty", .dtype = TALLY_F64, .ndim = 1, .shape = {0}},
        {.name = "stats", .dtype = TALLY_F64, .ndim = 3, .shape = {2, 2, 2}},
    };
    gs_ckpt_one("model", 100, model, 7);
}

/* ---- manifests: what the writer writes, and what it never would ---- */

static void gs_text(const char *name, const char *text) {
    gs_buf s = {0};
    gs_put(&s, text, strlen(text));
    gs_write("manifest", name, &s);
}

static void gs_manifest(void) {
    ckpt_manifest m = {.bytes = 4096, .step = 42, .head_crc = 0x1234abcd};
    snprintf(m.file, sizeof m.file, "step-0000000042.tck");
    char text[CKPT_MANIFEST_MAX], v[CKPT_MANIFEST_MAX + 64];
    size_t n = tally__ckpt_manifest_format(&m, text, sizeof text);
    text[n] = '\0';
    gs_text("valid", text);
    snprintf(v, sizeof v, "%.*s", (int)n - 1, text);
    gs_text("no-newline", v);
    snprintf(v, sizeof v, "%sextra line\n", text);
    gs_text("extra-line", v);
    gs_text("empty", "");
    snprintf(v, sizeof v, "%.*s", (int)n / 2, text);
    gs_text("truncated", v);
    m.step = 43; /* the file name says 42 */
    n = tally__ckpt_manifest_format(&m, v, sizeof v);
    v[n] = '\0';
    gs_text("step-disagrees", v);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\nWrites the fuzz targets' seed inputs under DIR/<target>/.\n", argv[0]);
        return 2;
    }
    gs_dir = argv[1];
    gs_frame_tcp();
    gs_frame_ctl();
    gs_handshake();
    gs_idx();
    gs_ckpt();
    gs_manifest();
    printf("gen_seeds: %d seeds written under %s\n", gs_count, gs_dir);
    return 0;
}
