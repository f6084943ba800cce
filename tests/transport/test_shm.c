/* test_shm.c - the shared-memory transport between real processes: every size tier and pattern against a
 * reference, reductions (also in place), mismatches, a killed peer, a timeout, nothing left in /dev/shm. */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot/boot.h"
#include "core/numeric/dtype.h"
#include "core/sig.h"
#include "boot_env.h"
#include "harness.h"
#include "transport/transport.h"

#define MIB (1u << 20)

/* ---- one rank's transport ---------------------------------------------------------------------- */

typedef struct rank_env {
    int rank, size, fails;
    tally__fault fault;
    tally__boot *boot;
    tally__sig sig;
    tally__tp *tp;
    tally_config cfg; /* the environment's (TALLY_SHM_LARGE, TALLY_SHM_CMA), which the transport reads */
} rank_env;

#define RCHECK(e, cond, ...) TH_RANK_CHECK((e)->fails, (e)->rank, cond, __VA_ARGS__)

static int rank_open(rank_env *e, int rank, int size, double timeout_s) {
    memset(e, 0, sizeof *e);
    e->rank = rank;
    e->size = size;
    tally__fault_init(&e->fault);
    tally__boot_env env;
    int rc = th_boot_env(&e->cfg, &env);
    if (!rc) rc = tally__boot_init(&e->boot, &env, &e->fault, timeout_s);
    e->sig = (tally__sig){
        .seq = 1, .count = 10, .root = -1, .coll = TALLY__ALLREDUCE, .dtype = TALLY_F32, .op = TALLY_SUM, .algo = 1};
    tally__tp_ctx c = {.rank = rank,
                       .size = size,
                       .boot = e->boot,
                       .fault = &e->fault,
                       .timeout_s = timeout_s,
                       .sig = &e->sig,
                       .cfg = &e->cfg};
    if (!rc) rc = tally__shm_create(&c, &e->tp);
    if (rc) fprintf(stderr, "rank %d: setup failed: %s: %s\n", rank, tally_strerror(rc), tally_last_error());
    return rc;
}

static void rank_close(rank_env *e) {
    if (e->tp) e->tp->ops->destroy(e->tp);
    if (e->boot) tally__boot_free(e->boot);
}

static int xchg(rank_env *e, const tally__send *s, int ns, const tally__recv *r, int nr) {
    return e->tp->ops->exchange(e->tp, s, ns, r, nr);
}

/* ---- data every rank can recompute ------------------------------------------------------------- */

static inline uint32_t mix(uint64_t i, int rank, int salt) {
    uint64_t h = i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)rank << 40) ^ ((uint64_t)(unsigned)salt << 20);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return (uint32_t)(h >> 29);
}

static void fill_bytes(unsigned char *b, size_t len, int rank, int salt) {
    size_t words = len / 4;
    uint32_t *w = (uint32_t *)b; /* malloc'd, so aligned */
    for (size_t i = 0; i < words; i++) w[i] = mix(i, rank, salt);
    for (size_t i = words * 4; i < len; i++) b[i] = (unsigned char)mix(i + 7777, rank, salt);
}

/* Values whose sums are exact, so the reference needs no tolerance. */
static void fill_typed(void *b, size_t n, tally_dtype t, int rank, int salt) {
    for (size_t i = 0; i < n; i++) {
        uint32_t h = mix(i, rank, salt);
        if (t == TALLY_F32)
            ((float *)b)[i] = (float)((int)(h % 2001) - 1000);
        else if (t == TALLY_I32)
            ((int32_t *)b)[i] = (int32_t)h;
        else
            ((uint16_t *)b)[i] = tally__f32_to_f16((float)((int)(h % 201) - 100));
    }
}

static void reference(void *out, const void *a, const void *b, size_t n, tally_dtype t) {
    for (size_t i = 0; i < n; i++) {
        if (t == TALLY_F32) {
            ((float *)out)[i] = ((const float *)a)[i] + ((const float *)b)[i];
        } else if (t == TALLY_I32) {
            int32_t x = ((const int32_t *)a)[i], y = ((const int32_t *)b)[i];
            ((int32_t *)out)[i] = x > y ? x : y;
        } else {
            float x = tally__f16_to_f32(((const uint16_t *)a)[i]), y = tally__f16_to_f32(((const uint16_t *)b)[i]);
            ((uint16_t *)out)[i] = tally__f32_to_f16(x + y);
        }
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        _exit(3);
    }
    return p;
}

/* Buffers kept for the life of a rank: fresh pages are slow to fault in (very slow on some VMs), and a
 * 64 MiB malloc/free pair would fault them all in again for every case. */
static void *pool_buf(int slot, size_t len) {
    static void *buf[TH_MAX_RANKS + 8];
    static size_t cap[TH_MAX_RANKS + 8];
    if (!buf[slot] || cap[slot] < len) {
        free(buf[slot]);
        buf[slot] = xmalloc(len);
        cap[slot] = len;
    }
    return buf[slot];
}

static size_t first_diff(const unsigned char *a, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return n;
}

/* ---- patterns ---------------------------------------------------------------------------------- */

/* shift d: send to rank+d, receive from rank-d. d == 0: all-to-all in one exchange. */
static int peers_of(const rank_env *e, int d, int *to, int *from) {
    int n = e->size, k = 0;
    if (d) {
        to[0] = (e->rank + d) % n;
        from[0] = (e->rank - d + n) % n;
        return 1;
    }
    for (int p = 0; p < n; p++)
        if (p != e->rank) {
            to[k] = from[k] = p;
            k++;
        }
    return k;
}

static void plain_case(rank_env *e, size_t len, int d, int salt) {
    int to[TH_MAX_RANKS], from[TH_MAX_RANKS], k = peers_of(e, d, to, from);
    unsigned char *sb = pool_buf(0, len), *want = pool_buf(1, len), *rb[TH_MAX_RANKS];
    tally__send s[TH_MAX_RANKS];
    tally__recv r[TH_MAX_RANKS];
    fill_bytes(sb, len, e->rank, salt);
    for (int i = 0; i < k; i++) {
        rb[i] = pool_buf(2 + i, len);
        memset(rb[i], 0xEE, len);
        s[i] = (tally__send){.peer = to[i], .buf = sb, .len = len};
        r[i] = (tally__recv){.peer = from[i], .dst = rb[i], .len = len};
    }
    e->sig.seq++;
    int rc = xchg(e, s, k, r, k);
    RCHECK(e, rc == 0, "plain len %zu shift %d: %s: %s", len, d, tally_strerror(rc), tally_last_error());
    for (int i = 0; i < k && rc == 0; i++) {
        fill_bytes(want, len, from[i], salt);
        size_t at = first_diff(rb[i], want, len);
        RCHECK(e, at == len, "plain len %zu shift %d from rank %d: byte %zu differs", len, d, from[i], at);
    }
}

/* Receives the left neighbour's vector (shift d) reduced into ours, separately or in place. */
static void reduce_case(rank_env *e, size_t n, tally_dtype t, tally_op op, int d, int in_place, int salt) {
    size_t es = tally_dtype_size(t), len = n * es;
    int to[1], from[1];
    peers_of(e, d, to, from);
    unsigned char *sb = pool_buf(0, len), *mine = pool_buf(1, len), *dst = pool_buf(2, len), *in = pool_buf(3, len),
                  *want = pool_buf(4, len);
    fill_typed(sb, n, t, e->rank, salt);       /* what we send */
    fill_typed(mine, n, t, e->rank, salt + 1); /* our own contribution */
    fill_typed(in, n, t, from[0], salt);       /* what the neighbour sends */
    reference(want, mine, in, n, t);
    memcpy(dst, mine, len);
    tally__send s = {.peer = to[0], .buf = sb, .len = len};
    tally__recv r = {.peer = from[0], .dst = dst, .src = in_place ? dst : mine, .len = len, .dtype = t, .op = op};
    if (!in_place) memset(dst, 0xEE, len);
    e->sig.seq++;
    int rc = xchg(e, &s, 1, &r, 1);
    RCHECK(e, rc == 0, "reduce %s n %zu: %s: %s", tally_dtype_name(t), n, tally_strerror(rc), tally_last_error());
    size_t at = rc ? len : first_diff(dst, want, len);
    RCHECK(e, at == len, "reduce %s/%s n %zu shift %d%s: byte %zu differs", tally_dtype_name(t), tally_op_name(op), n,
           d, in_place ? " in place" : "", at);
}

/* 2000 small exchanges of varying size in a row, plain and reducing, each checked. */
static void many_small(rank_env *e) {
    int to = (e->rank + 1) % e->size, from = (e->rank - 1 + e->size) % e->size;
    unsigned char sb[512], rb[512], want[512];
    float fs[64], fm[64], fd[64], fw[64];
    for (int i = 0; i < 2000 && !e->fails; i++) {
        size_t len = (size_t)(i * 37) % 300;
        e->sig.seq++;
        if (i % 3 == 2) {
            size_t n = len / 4 % 64;
            fill_typed(fs, n, TALLY_F32, e->rank, i);
            fill_typed(fm, n, TALLY_F32, e->rank, i + 1);
            fill_typed(fd, n, TALLY_F32, from, i);
            reference(fw, fm, fd, n, TALLY_F32);
            tally__send s = {to, fs, n * 4};
            tally__recv r = {.peer = from, .dst = fm, .src = fm, .len = n * 4, .dtype = TALLY_F32, .op = TALLY_SUM};
            int rc = xchg(e, &s, 1, &r, 1);
            RCHECK(e, rc == 0 && !memcmp(fm, fw, n * 4), "small reduce #%d (n %zu): rc %d", i, n, rc);
            continue;
        }
        fill_bytes(sb, len, e->rank, i);
        fill_bytes(want, len, from, i);
        tally__send s = {to, sb, len};
        tally__recv r = {.peer = from, .dst = rb, .len = len};
        int rc = xchg(e, &s, 1, &r, 1);
        RCHECK(e, rc == 0 && !memcmp(rb, want, len), "small exchange #%d (len %zu): rc %d", i, len, rc);
    }
}

static const size_t lens[] = {0, 1, 40, 47, 48, 49, 4095, 4096, 32768, 32769, 100000, 262144, MIB, 64 * MIB + 3};
#define NLENS (sizeof lens / sizeof *lens)

/* How a correctness run is configured: TALLY_SHM_LARGE for every rank (NULL: leave unset, so setup
 * calibrates), TALLY_SHM_CMA=0 on one rank (-1: none), and whether to run fewer cases. */
typedef struct run_cfg {
    const char *large;
    int cma_off_rank, quick;
} run_cfg;

static void cfg_env(int rank, void *arg) {
    const run_cfg *c = arg;
    if (c->large) setenv("TALLY_SHM_LARGE", c->large, 1);
    if (rank == c->cma_off_rank) setenv("TALLY_SHM_CMA", "0", 1);
}

static int correctness_rank(int rank, int size, void *arg) {
    int quick = ((const run_cfg *)arg)->quick;
    rank_env e;
    if (rank_open(&e, rank, size, 60)) return 1;
    int salt = 1;
    for (size_t li = 0; li < NLENS; li++) {
        size_t len = lens[li];
        /* The sanitizer pass keeps every smaller size; the quick tier every size up to 1 MiB. */
        if (th_light() && len > 16 * MIB) continue;
        if (!th_long() && len > MIB) continue;
        for (int d = 1; d < size; d++) {
            if (quick && d > 1) break;
            plain_case(&e, len, d, salt++);
        }
        if (len <= MIB || size <= 3) plain_case(&e, len, 0, salt++);
        /* Reductions both ways round the ring; the biggest size only once, it costs the most to check. */
        int maxd = quick || len > MIB ? 1 : size - 1;
        for (int d = 1; d <= maxd; d += (size > 2 ? size - 2 : 1)) {
            reduce_case(&e, len / 4, TALLY_F32, TALLY_SUM, d, 1, salt++);
            if (quick || len > MIB) continue;
            reduce_case(&e, len / 4, TALLY_F32, TALLY_SUM, d, 0, salt++);
            reduce_case(&e, len / 4, TALLY_I32, TALLY_MAX, d, 0, salt++);
            reduce_case(&e, len / 4, TALLY_I32, TALLY_MAX, d, 1, salt++);
            reduce_case(&e, len / 2, TALLY_F16, TALLY_SUM, d, 0, salt++);
            reduce_case(&e, len / 2, TALLY_F16, TALLY_SUM, d, 1, salt++);
        }
        if (e.fails) break;
    }
    many_small(&e);
    /* A caller error is reported, not raised as a fault: the next exchange still works. */
    char b = 1;
    tally__send two[2] = {{(rank + 1) % size, &b, 1}, {(rank + 1) % size, &b, 1}};
    RCHECK(&e, xchg(&e, two, 2, NULL, 0) == TALLY_E_INVALID, "two sends to one peer accepted");
    tally__send self = {rank, &b, 1};
    RCHECK(&e, xchg(&e, &self, 1, NULL, 0) == TALLY_E_INVALID, "send to self accepted");
    plain_case(&e, 8, 1, salt++);
    rank_close(&e);
    return e.fails ? 1 : 0;
}

/* ---- fault cases: results in shared memory ----------------------------------------------------- */

typedef struct shared_res {
    int rc[TH_MAX_RANKS];
    double t[TH_MAX_RANKS];
    char msg[TH_MAX_RANKS][800];
    _Atomic int iters[TH_MAX_RANKS];
    _Atomic int arrived;
    int scenario;
    char large[16]; /* TALLY_SHM_LARGE for the ranks */
} shared_res;

static void res_env(int rank, void *arg) { setenv("TALLY_SHM_LARGE", ((shared_res *)arg)->large, 1); }

/* Every rank stays alive until all have recorded their result, so none looks dead to the others. */
static void gather_results(shared_res *sr, int size) {
    atomic_fetch_add(&sr->arrived, 1);
    double end = th_now() + 30;
    while (atomic_load(&sr->arrived) < size && th_now() < end) usleep(1000);
}

static void record(shared_res *sr, int rank, int rc, double t0) {
    sr->rc[rank] = rc;
    sr->t[rank] = th_now() - t0;
    snprintf(sr->msg[rank], sizeof sr->msg[rank], "%s", rc ? tally_last_error() : "");
}

enum { SC_MISMATCH, SC_SCAN, SC_TIMEOUT };

static int fault_rank(int rank, int size, void *arg) {
    shared_res *sr = arg;
    rank_env e;
    if (rank_open(&e, rank, size, sr->scenario == SC_TIMEOUT ? 2 : 20)) return 1;
    int to = (rank + 1) % size, from = (rank - 1 + size) % size, rc = 0;
    char out[8] = "abcdefg", in[8];
    static char big[MIB];
    tally__send s = {to, out, sizeof out};
    tally__recv r = {.peer = from, .dst = in, .len = sizeof in};
    double t0 = th_now();
    e.sig.seq++;
    if (sr->scenario == SC_MISMATCH) { /* rank 1 asks for one element more */
        if (rank == 1) e.sig.count++;
        rc = xchg(&e, &s, 1, &r, 1);
    } else if (sr->scenario == SC_SCAN) { /* rank 0 waits for rank 1, which never sends; rank 2 differs */
        tally__recv r1 = {.peer = 1, .dst = in, .len = sizeof in};
        tally__send s2 = {0, out, sizeof out};
        if (rank == 2) e.sig.coll = TALLY__BROADCAST, e.sig.root = 2;
        if (rank == 0) rc = xchg(&e, NULL, 0, &r1, 1);
        if (rank == 2) rc = xchg(&e, &s2, 1, NULL, 0);
    } else { /* rank 1 neither sends to rank 0 nor receives rank 2's 1 MiB */
        tally__recv r1 = {.peer = 1, .dst = in, .len = sizeof in};
        tally__send s2 = {1, big, sizeof big};
        if (rank == 0) rc = xchg(&e, NULL, 0, &r1, 1);
        if (rank == 2) rc = xchg(&e, &s2, 1, NULL, 0);
    }
    record(sr, rank, rc, t0);
    gather_results(sr, size);
    rank_close(&e);
    return 0;
}

static int kill_rank(int rank, int size, void *arg) {
    shared_res *sr = arg;
    rank_env e;
    if (rank_open(&e, rank, size, 60)) return 1;
    size_t n = 16 * MIB; /* 64 MiB of f32 */
    float *sb = xmalloc(n * 4), *dst = xmalloc(n * 4);
    fill_typed(sb, n, TALLY_F32, rank, 1);
    fill_typed(dst, n, TALLY_F32, rank, 2);
    int rc = 0;
    double end = th_now() + 60;
    while (rc == 0 && th_now() < end) {
        tally__send s = {(rank + 1) % size, sb, n * 4};
        tally__recv r = {.peer = (rank - 1 + size) % size,
                         .dst = dst,
                         .src = dst,
                         .len = n * 4,
                         .dtype = TALLY_F32,
                         .op = TALLY_SUM};
        e.sig.seq++;
        rc = xchg(&e, &s, 1, &r, 1);
        atomic_fetch_add(&sr->iters[rank], 1);
    }
    sr->t[rank] = th_now(); /* absolute: compared with the moment of the kill */
    sr->rc[rank] = rc;
    snprintf(sr->msg[rank], sizeof sr->msg[rank], "%s", rc ? tally_last_error() : "");
    free(sb);
    free(dst);
    rank_close(&e);
    return 0;
}

/* ---- the parent -------------------------------------------------------------------------------- */

static int made[256], nmade; /* rank 0 pids: their segments are named /tally-<pid>-... */

static int run_job(int n, const th_opts *o, th_rank_fn fn, void *arg, double wall_s) {
    th_job job;
    if (th_start(&job, n, o, fn, arg)) return -1;
    if (nmade < 256) made[nmade++] = job.pid[0];
    int bad = th_wait(&job, wall_s);
    for (int r = 0; r < n && bad; r++)
        if (job.killed_by_harness[r] || !WIFEXITED(job.status[r]) || WEXITSTATUS(job.status[r]))
            fprintf(stderr, "  rank %d/%d: %s (status 0x%x)\n", r, n,
                    job.killed_by_harness[r] ? "hung, killed" : "failed", job.status[r]);
    return bad;
}

static void test_correctness(void) {
    /* Every size and pattern with single-copy forced on for large messages, and with the slot ring
     * for all sizes (what setup picks where the kernel's copy is slow). */
    static const struct {
        int n;
        run_cfg cfg;
        const char *what;
    } runs[] = {
        {2, {"256K", -1, 0}, "single-copy from 256 KiB"}, /* the quick tier: these two, up to 1 MiB */
        {3, {"off", -1, 0}, "slots only"},
        {4, {"256K", -1, 0}, "single-copy from 256 KiB"},
        {8, {"off", -1, 0}, "slots only"},
        {8, {"256K", -1, 1}, "single-copy from 256 KiB, fewer cases"},
        {3, {"64K", 1, 1}, "rank 1 sets TALLY_SHM_CMA=0, so no rank uses single-copy"},
        {2, {NULL, -1, 1}, "as setup calibrates it"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        if (!th_long() && i >= 2) break;
        th_opts o = {.child_env = cfg_env};
        double t0 = th_now();
        int bad = run_job(runs[i].n, &o, correctness_rank, (void *)&runs[i].cfg, 400);
        TH_CHECK(bad == 0, "%d ranks, %s: %d ranks failed", runs[i].n, runs[i].what, bad);
        printf("  %d ranks, %s: %.1f s\n", runs[i].n, runs[i].what, th_now() - t0);
    }
}

/* What base.large says for each configuration: it names the knob or the reason that turned a path off. */
static int large_path_rank(int rank, int size, void *arg) {
    const run_cfg *c = arg;
    rank_env e;
    if (rank_open(&e, rank, size, 30)) return 1;
    const char *d = e.tp->large;
    /* single-copy may be refused here (ptrace rules): then the reason is named instead */
    int denied = strstr(d, "not permitted") != NULL;
    /* the in-place floor for tally_mem_alloc buffers (tally_comm_mem_min): TALLY_SHM_LARGE, never below 256 KiB */
    size_t mem_min = !c->large                  ? 256u << 10
                     : !strcmp(c->large, "off") ? 0
                     : !strcmp(c->large, "1M")  ? 1u << 20
                                                : 256u << 10;
    RCHECK(&e, e.tp->mem_min == mem_min, "TALLY_SHM_LARGE=%s: mem_min %zu, want %zu", c->large ? c->large : "(unset)",
           e.tp->mem_min, mem_min);
    if (c->large && !strcmp(c->large, "off")) {
        RCHECK(&e, strstr(d, "TALLY_SHM_LARGE=off") != NULL, "TALLY_SHM_LARGE=off: '%s'", d);
    } else {
        RCHECK(&e, !strncmp(d, "tally_mem_alloc buffers", 23), "no word on tally_mem_alloc buffers: '%s'", d);
        if (c->cma_off_rank >= 0)
            RCHECK(&e, strstr(d, "others through the shared segment (TALLY_SHM_CMA=0 on a rank)") != NULL,
                   "TALLY_SHM_CMA=0: '%s'", d);
        else if (c->large)
            RCHECK(&e, denied || strstr(d, "others from 1 MiB read with process_vm_readv"), "TALLY_SHM_LARGE=1M: '%s'",
                   d);
        else /* calibrated: single-copy, or its figures against memcpy's */
            RCHECK(&e, denied || strstr(d, "read with process_vm_readv") || strstr(d, "GB/s against memcpy's"),
                   "calibrated: '%s'", d);
    }
    rank_close(&e);
    return e.fails ? 1 : 0;
}

static void test_large_path(void) {
    static const run_cfg cfgs[] = {{"off", -1, 1}, {"64K", 1, 1}, {"1M", -1, 1}, {NULL, -1, 1}};
    for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
        th_opts o = {.child_env = cfg_env};
        int bad = run_job(2, &o, large_path_rank, (void *)&cfgs[i], 60);
        TH_CHECK(bad == 0, "large-message path description, case %zu: %d ranks failed", i, bad);
    }
}

static shared_res *fault_job(int scenario, int n) {
    shared_res *sr = th_shared_alloc(sizeof *sr);
    sr->scenario = scenario;
    snprintf(sr->large, sizeof sr->large, "256K"); /* the timed-out 1 MiB send waits for its reader */
    th_opts o = {.child_env = res_env};
    int bad = run_job(n, &o, fault_rank, sr, 60);
    TH_CHECK(bad == 0, "fault scenario %d: %d ranks did not exit cleanly", scenario, bad);
    return sr;
}

static void test_mismatch(void) {
    shared_res *sr = fault_job(SC_MISMATCH, 3);
    /* Rank 0's own messages match; whether it finishes before the fault that ranks 1 and 2 raise
     * reaches it is a race (rank 2 may stop before its send to rank 0 is done). Either way, never
     * anything but success or the mismatch itself. */
    TH_CHECK(sr->rc[0] == 0 || sr->rc[0] == TALLY_E_MISMATCH, "rank 0 is not part of the mismatch but got %d (%s)",
             sr->rc[0], sr->msg[0]);
    for (int r = 1; r <= 2; r++) {
        TH_CHECK(sr->rc[r] == TALLY_E_MISMATCH, "rank %d: got %d (%s), want TALLY_E_MISMATCH", r, sr->rc[r],
                 sr->msg[r]);
        TH_CHECK(strstr(sr->msg[r], "collective mismatch") && strstr(sr->msg[r], "count 10") &&
                     strstr(sr->msg[r], "count 11"),
                 "rank %d: message should name both calls: %s", r, sr->msg[r]);
    }
    printf("  mismatch seen by rank 2: %s\n", sr->msg[2]);
    th_shared_free(sr, sizeof *sr);

    sr = fault_job(SC_SCAN, 3);
    TH_CHECK(sr->rc[0] == TALLY_E_MISMATCH && strstr(sr->msg[0], "broadcast") && strstr(sr->msg[0], "rank 2"),
             "a mismatched message from a rank we do not wait on: got %d (%s)", sr->rc[0], sr->msg[0]);
    TH_CHECK(sr->t[0] < 2, "stray mismatch found after %.2f s, want well before the 20 s timeout", sr->t[0]);
    th_shared_free(sr, sizeof *sr);
}

static void test_timeout(void) {
    shared_res *sr = fault_job(SC_TIMEOUT, 3);
    TH_CHECK(sr->rc[0] == TALLY_E_TIMEOUT && strstr(sr->msg[0], "rank 1 did not send its part of") &&
                 strstr(sr->msg[0], "TALLY_TIMEOUT"),
             "receiver: got %d (%s), want TALLY_E_TIMEOUT naming rank 1", sr->rc[0], sr->msg[0]);
    TH_CHECK(sr->rc[2] == TALLY_E_TIMEOUT && strstr(sr->msg[2], "rank 1 did not receive"),
             "sender: got %d (%s), want TALLY_E_TIMEOUT naming rank 1", sr->rc[2], sr->msg[2]);
    for (int r = 0; r <= 2; r += 2)
        TH_CHECK(sr->t[r] > 1.9 && sr->t[r] < 5, "rank %d timed out after %.2f s with TALLY_TIMEOUT=2", r, sr->t[r]);
    printf("  timeout: %s\n", sr->msg[0]);
    th_shared_free(sr, sizeof *sr);
}

static void test_kill(const char *large) {
    shared_res *sr = th_shared_alloc(sizeof *sr);
    th_opts o = {.child_env = res_env};
    th_job job;
    int n = 3;
    snprintf(sr->large, sizeof sr->large, "%s", large);
    if (th_start(&job, n, &o, kill_rank, sr)) {
        TH_CHECK(0, "fork failed");
        return;
    }
    if (nmade < 256) made[nmade++] = job.pid[0];
    double end = th_now() + 60;
    while (atomic_load(&sr->iters[1]) < 2 && th_now() < end) usleep(200);
    usleep(3000); /* into the next 64 MiB exchange */
    double t_kill = th_now();
    kill(job.pid[1], SIGKILL);
    th_wait(&job, 90);
    TH_CHECK(WIFSIGNALED(job.status[1]), "rank 1 should have been killed");
    for (int r = 0; r < n; r += 2) {
        TH_CHECK(WIFEXITED(job.status[r]) && WEXITSTATUS(job.status[r]) == 0, "rank %d did not exit cleanly", r);
        TH_CHECK(sr->rc[r] == TALLY_E_PEER_LOST && strstr(sr->msg[r], "rank 1"),
                 "rank %d: got %d (%s), want TALLY_E_PEER_LOST naming rank 1", r, sr->rc[r], sr->msg[r]);
        TH_CHECK(sr->t[r] - t_kill < 5, "rank %d noticed the death after %.2f s", r, sr->t[r] - t_kill);
        printf("  (%s) rank %d after %.1f ms: %s\n", large, r, (sr->t[r] - t_kill) * 1e3, sr->msg[r]);
    }
    th_shared_free(sr, sizeof *sr);
}

static void test_self(void) {
    tally__fault f;
    tally__fault_init(&f);
    tally__sig sig = {0};
    tally__tp_ctx c = {.rank = 0, .size = 1, .fault = &f, .timeout_s = 1, .sig = &sig};
    tally__tp *tp;
    TH_CHECK(tally__self_create(&c, &tp) == 0, "self transport for one rank");
    char b = 0;
    tally__send s = {0, &b, 1};
    TH_CHECK(tp->ops->exchange(tp, NULL, 0, NULL, 0) == 0, "empty exchange on self");
    TH_CHECK(tp->ops->exchange(tp, &s, 1, NULL, 0) == TALLY_E_INVALID, "a send on self must be refused");
    TH_CHECK(!strcmp(tp->ops->name, "self"), "self transport name");
    tp->ops->destroy(tp);
    c.size = 2;
    TH_CHECK(tally__self_create(&c, &tp) == TALLY_E_INVALID, "self transport for two ranks must be refused");
}

static void test_nothing_left(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *de;
    int left = 0;
    while ((de = readdir(d))) {
        int pid;
        if (sscanf(de->d_name, "tally-%d-", &pid) != 1) continue;
        for (int i = 0; i < nmade; i++)
            if (made[i] == pid) {
                fprintf(stderr, "  left behind: /dev/shm/%s\n", de->d_name);
                left++;
            }
    }
    closedir(d);
    TH_CHECK(left == 0, "%d shared-memory segments left in /dev/shm", left);
}

int main(void) {
    test_self();
    test_large_path();
    test_correctness();
    test_mismatch();
    test_kill("256K");
    if (th_long()) { /* waits out a 2 s timeout; a second death */
        test_timeout();
        test_kill("off");
    }
    test_nothing_left();
    return th_verdict("test_shm");
}
