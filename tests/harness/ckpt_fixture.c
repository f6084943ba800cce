/* ckpt_fixture.c - what the checkpoint tests share: a scratch directory, file helpers, a bounded reap,
 * and checkpoints whose every byte is a function of (step, tensor, offset), written and checked back. */
#include "ckpt_fixture.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "scratch_dir.h"

/* The scratch directory is scratch_dir.c's: made and removed as the CLI tests' are. */
int ck_root_make(const char *test_name) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "tally_%s", test_name);
    return th_scratch_make(prefix, 0700) ? 0 : -1;
}

void ck_root_remove(void) { th_scratch_remove(); }

uint64_t mix(uint64_t z) { /* splitmix64's finaliser */
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void subdir(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s", th_at(name)); }

int has(const char *msg, const char *needle) { return msg && strstr(msg, needle) != NULL; }

int exists(const char *dir, const char *name) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* Files in dir whose names end with suffix. */
int count_suffix(const char *dir, const char *suffix) {
    char cmd[300], out[64];
    snprintf(cmd, sizeof cmd, "ls -1 %s | grep -c '%s$'", dir, suffix);
    th_shell(cmd, 10, out, sizeof out);
    return atoi(out);
}

unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*len + 1);
    if (b && fread(b, 1, *len, f) != *len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

/* Waits for pid at most limit_s; kills it past that. Returns its status, or -1 if it had to be killed. */
int reap(pid_t pid, double limit_s) {
    int status = 0;
    for (double t0 = th_now(); waitpid(pid, &status, WNOHANG) == 0; usleep(500)) {
        if (th_now() - t0 > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
    }
    return status;
}

/* ---- content that is a function of the step ---- */

void content_desc(tally__ckpt_tensor d[NT], size_t nw, size_t nm) {
    d[0] = (tally__ckpt_tensor){.name = "model.w", .dtype = TALLY_F32, .ndim = 1, .shape = {nw}};
    d[1] = (tally__ckpt_tensor){.name = "optim.m", .dtype = TALLY_F64, .ndim = 2, .shape = {nm / 4, 4}};
    d[2] = (tally__ckpt_tensor){.name = "train.step", .dtype = TALLY_I64, .ndim = 1, .shape = {1}};
    d[3] = (tally__ckpt_tensor){.name = "rng.state", .dtype = TALLY_U8, .ndim = 1, .shape = {33}};
    d[4] = (tally__ckpt_tensor){.name = "codec.residual", .dtype = TALLY_F32, .ndim = 1, .shape = {0}};
}

size_t desc_bytes(const tally__ckpt_tensor *d) {
    size_t b = tally_dtype_size(d->dtype);
    for (int k = 0; k < d->ndim; k++) b *= d->shape[k];
    return b;
}

/* Bytes [off, off + n) of tensor t at step s. */
void content_fill(int64_t s, int t, size_t off, unsigned char *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t k = off + i;
        uint64_t word = t == 2 ? (uint64_t)s : mix((uint64_t)s << 32 ^ (uint64_t)t << 26 ^ (k >> 3));
        out[i] = (unsigned char)(word >> (8 * (k & 7)));
    }
}

/* Writes tensors d with content_fill, in chunks of uneven sizes (some empty). */
int write_tensors(const char *dir, int64_t step, const tally__ckpt_tensor *d, int n, int keep) {
    tally__ckpt_writer *w;
    int rc = tally__ckpt_write_begin(dir, step, d, n, &w);
    if (rc) return rc;
    static unsigned char chunk[70000];
    uint64_t r = (uint64_t)step * 7 + 3;
    for (int t = 0; t < n && !rc; t++) {
        size_t bytes = desc_bytes(&d[t]);
        for (size_t off = 0; off < bytes && !rc;) {
            r = mix(r);
            size_t c = r % 5 == 0 ? 0 : (size_t)(r >> 20) % sizeof chunk + 1;
            if (c > bytes - off) c = bytes - off;
            content_fill(step, t, off, chunk, c);
            rc = tally__ckpt_write(w, t, chunk, c);
            off += c;
        }
    }
    if (rc) {
        tally__ckpt_write_abort(w);
        return rc;
    }
    return tally__ckpt_write_commit(w, keep);
}

int write_step(const char *dir, int64_t step, size_t nw, size_t nm, int keep) {
    tally__ckpt_tensor d[NT];
    content_desc(d, nw, nm);
    return write_tensors(dir, step, d, NT, keep);
}

/* Mismatches between c and tensors d written at step s (printed, up to a few). */
int content_check(const tally__ckpt *c, int64_t s, const tally__ckpt_tensor *d, int n, const char *what) {
    int bad = 0;
    static unsigned char want[1 << 16];
    if (tally__ckpt_step(c) != s || tally__ckpt_count(c) != n) {
        fprintf(stderr, "%s: step %" PRId64 " count %d, want %" PRId64 " and %d\n", what, tally__ckpt_step(c),
                tally__ckpt_count(c), s, n);
        return 1;
    }
    for (int t = 0; t < n; t++) {
        const tally__ckpt_tensor *x = tally__ckpt_find(c, d[t].name);
        size_t bytes = desc_bytes(&d[t]);
        if (!x || x != tally__ckpt_at(c, t) || x->dtype != d[t].dtype || x->ndim != d[t].ndim || x->bytes != bytes ||
            memcmp(x->shape, d[t].shape, sizeof x->shape) || ((uintptr_t)x->data & 63)) {
            if (bad++ < 3) fprintf(stderr, "%s: tensor '%s' missing or described wrongly\n", what, d[t].name);
            continue;
        }
        for (size_t off = 0; off < bytes; off += sizeof want) {
            size_t k = bytes - off < sizeof want ? bytes - off : sizeof want;
            content_fill(s, t, off, want, k);
            if (memcmp(want, (const unsigned char *)x->data + off, k)) {
                if (bad++ < 3) fprintf(stderr, "%s: tensor '%s' differs near byte %zu\n", what, d[t].name, off);
                break;
            }
        }
    }
    return bad;
}

int step_check(const tally__ckpt *c, int64_t s, size_t nw, size_t nm, const char *what) {
    tally__ckpt_tensor d[NT];
    content_desc(d, nw, nm);
    return content_check(c, s, d, NT, what);
}
