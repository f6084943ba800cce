/* flight.h - the flight recorder: each communicator's last K collectives (fingerprint, times, how each
 * ended, the peer it waited for), written to a directory when a collective fails for a peer, and the reader
 * that merges every rank's records into a verdict (the first sequence number where ranks diverge, the
 * rank that holds the job up). */
#ifndef TALLY_COLL_FLIGHT_H
#define TALLY_COLL_FLIGHT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "../core/sig.h"

#define TALLY__FLIGHT_MAX  65536 /* tally_config.flight_depth's upper bound (TALLY_FLIGHT) */
#define TALLY__FLIGHT_PATH 512
#define TALLY__FLIGHT_JOB  96
/* A record's bounds, which the writer keeps and the reader holds every file to (a record comes from a
 * directory others may write in): a line of at most TALLY__FLIGHT_LINE bytes, its end included (an
 * entry's at most TALLY__FLIGHT_ENTRY_LINE: 13 numbers and names of at most 20 characters), at most
 * TALLY__FLIGHT_HEAD header lines, and so a file of at most TALLY__FLIGHT_FILE_MAX bytes. */
/* The record format's version, its first line ("tally-flight 2"): 1, the first (a job line added later,
 * optional), 2, a job line in every record, named for its job, within the bounds below. The reader reads
 * every version up to this one and names a newer one rather than read it as one it knows. */
#define TALLY__FLIGHT_FORMAT 2
#define TALLY__FLIGHT_LINE   1024
/* Version 1 writers did not cut the message: "message ", an error of up to 1023 characters, its end. */
#define TALLY__FLIGHT_LINE_V1    1032
#define TALLY__FLIGHT_ENTRY_LINE 256
#define TALLY__FLIGHT_HEAD       64
#define TALLY__FLIGHT_FILE_MAX                                                                                         \
    ((uint64_t)TALLY__FLIGHT_HEAD * TALLY__FLIGHT_LINE + (uint64_t)TALLY__FLIGHT_MAX * TALLY__FLIGHT_ENTRY_LINE)

enum { TALLY__FL_RUNNING, TALLY__FL_DONE, TALLY__FL_FAILED };

typedef struct tally__flight_entry {
    tally__sig sig;
    uint64_t begin_ns, end_ns; /* CLOCK_REALTIME, so ranks' records line up (end 0: still running) */
    int32_t state;             /* TALLY__FL_* */
    int32_t rc;                /* the call's code when it failed */
    int32_t peer;              /* the peer the transport last waited for in this call, -1 none */
    int32_t culprit;           /* the rank the failure named, -1 none */
} tally__flight_entry;

typedef struct tally__flight {
    int on;                     /* 0: TALLY_FLIGHT=0 */
    tally__flight_entry *ring;  /* [cap] */
    size_t cap;                 /* entries kept */
    uint64_t n;                 /* entries written since init */
    int open;                   /* the newest entry is a call in flight */
    _Atomic int awaited;        /* the transports' slow wait path says whom it waits for (tp_ctx.awaited) */
    _Atomic int dumped;         /* written once: the first failure's records are the ones that explain it */
    _Atomic int written;        /* 0 not yet, 1 written, 1 + errno when the write failed */
    int rank, world_rank, size; /* world_rank: this rank in the world (a split's files name it so) */
    char label[48];             /* "world", or "comm<K>-<world rank of its rank 0>" for a split (fl_label) */
    char host[64];
    const char *transport;
    char job[TALLY__FLIGHT_JOB];         /* "<host of rank 0>-<its pid>-<its draw>": the same on all the job's ranks */
    char path[TALLY__FLIGHT_PATH + 192]; /* the file it writes: dir, then tally__flight_file_name */
    char dir[TALLY__FLIGHT_PATH];
    size_t base;  /* dir + base: its last component (the directory made or checked; the rest must exist) */
    size_t name;  /* path + name: the file's name in dir */
    int user_dir; /* dir was TALLY_FLIGHT_DIR (the user's choice), not the default under $TMPDIR */
    int why;      /* why the last write failed: TALLY__FL_WHY_* */
    unsigned why_uid, why_mode; /* the owner and mode of what was refused */
} tally__flight;

/* Why records were not written (tally__flight_why says it in words). */
enum {
    TALLY__FL_WHY_NONE,
    TALLY__FL_WHY_ERRNO, /* a system call failed: written holds 1 + errno */
    TALLY__FL_WHY_LINK,  /* the directory's name is a symbolic link another user made */
    TALLY__FL_WHY_OWNER, /* the directory belongs to another user (a chosen one: other than root's sticky) */
    TALLY__FL_WHY_MODE,  /* open to group or others (a chosen one: to their writing, and not sticky) */
};

/* Sets f up for a communicator (rank of size; world_rank, first_world: this rank's and rank 0's rank in
 * the world; parent: the recorder of the communicator it was split from, whose directory, job and label
 * it takes its own from, NULL for a world; parent_seq: the parent's collectives so far, the same on all
 * its ranks; job: rank 0's host name, pid and random draw (tally__peer.job), the same on every rank, for
 * a world's default directory and its records' job line; depth: entries kept, 0 none; dir: where a world
 * writes, "" for the default). Out of memory leaves it off. Registers it for the fatal-signal dump. */
void tally__flight_init(tally__flight *f, int rank, int size, int world_rank, int first_world,
                        const tally__flight *parent, uint64_t parent_seq, const char *job_host, int job_pid,
                        uint32_t job_draw, int depth, const char *dir);
void tally__flight_set_transport(tally__flight *f, const char *name);
/* The name a record is written under: rank<world rank>.<label>.<job>.flight, each character but
 * [A-Za-z0-9._-] made '_' (a job names rank 0's host, which TALLY_HOST may spell with a '/'). The job
 * keeps two jobs that share a directory (TALLY_FLIGHT_DIR=/tmp) from replacing each other's records. */
void tally__flight_file_name(char *out, size_t n, int world_rank, const char *label, const char *job);
void tally__flight_fini(tally__flight *f);
/* A collective starts (its fingerprint stamped) and ends (rc 0, or its failure and the rank named). */
void tally__flight_begin(tally__flight *f, const tally__sig *sig);
void tally__flight_end(tally__flight *f, int rc, int culprit);
/* 1 for the codes whose records are written: a timeout, a lost peer, a mismatch, an abort. */
int tally__flight_wants(int rc);
/* "TIMEOUT", "PEER_LOST", "MISMATCH", "ABORTED", or "error" for another code. */
const char *tally__flight_reason(int rc);
/* Writes f's records (once: later calls do nothing) with why (a tally__flight_reason), the rank the
 * failure named and its message. 0, or -1 when the file could not be written (errno says why). */
int tally__flight_dump(tally__flight *f, const char *reason, int culprit, const char *msg);
/* Why the last dump wrote nothing, in words naming the path ("/tmp/tally-flight-h-12 belongs to uid
 * 65534, not this user (uid 0): ..."), with what to do. Not for a signal handler. */
void tally__flight_why(const tally__flight *f, char *out, size_t n);

/* ---- reading (tally flight) ---- */

typedef struct tally__flight_rank {
    int rank, world_rank, size;
    char label[48], host[64], transport[16], reason[32];
    char job[TALLY__FLIGHT_JOB]; /* "" in a record of a tally before job lines */
    char file[256];              /* its name in the directory */
    int pid, culprit;
    char msg[768];
    uint64_t dumped_ns;
    tally__flight_entry *e; /* [n], in sequence order */
    size_t n;
    size_t n_old;     /* its older entries not kept: the reader's room is shared by the directory's records */
    size_t n_flagged; /* entries naming a rank outside its size (read as none) */
} tally__flight_rank;

/* A file of the directory that was not read, and why ("is a symbolic link ...", "from another job ..."). */
typedef struct tally__flight_skip {
    char file[256];
    char why[512];
} tally__flight_skip;

/* What `tally flight` reads of one directory at most: files (the rest are counted, not read) and
 * entries kept in memory, shared alike by the files listed: each record keeps its newest
 * TALLY__FLIGHT_KEPT / files entries (the rest counted in n_old), so none is set aside for want of room
 * and the window every rank holds, the one judged, ends where the failure was. A world of
 * TALLY__BOOT_MAX_SIZE ranks with the default depth and a few communicators fits whole. */
#define TALLY__FLIGHT_FILES 16384
#define TALLY__FLIGHT_KEPT  (1 << 22)

typedef struct tally__flight_set {
    tally__flight_rank *r; /* [n], by label then rank: the records of one job */
    size_t n;
    char job[TALLY__FLIGHT_JOB]; /* that job ("" for records that name none) */
    tally__flight_skip *skip;    /* [n_skip], by name: every *.flight file set aside */
    size_t n_skip;
    size_t n_unread;  /* *.flight names past TALLY__FLIGHT_FILES, not looked at */
    size_t n_entries; /* entries of the records read, at most TALLY__FLIGHT_KEPT */
    size_t share;     /* entries each record keeps at most: TALLY__FLIGHT_KEPT / the files listed */
    unsigned dir_uid; /* the directory's owner: what its owner's files say is taken for the job's */
} tally__flight_set;

/* Loads the records of one job from the *.flight files in dir. A file is set aside (skip, with why)
 * when it is a symbolic link or not a regular file, belongs to a user who is neither the reader nor the
 * directory's owner (the job's ranks are one user, who owns the directory or writes into a shared one:
 * a stranger's file there is a forgery), is not a flight record, is of another job than the one with
 * records of the most ranks (distinct world ranks: one rank's records under several names count once;
 * ties: the one with rank 0's world record, then the newest), or repeats a
 * communicator's rank (the file named for it is kept). TALLY_E_SYSTEM naming the directory when it
 * cannot be read, TALLY_E_NOMEM; a directory with no records is an empty set. */
int tally__flight_load(const char *dir, tally__flight_set *s);
void tally__flight_set_free(tally__flight_set *s);

/* What the records of one communicator (a set's run of one label, in rank order as loaded) say. */
typedef struct tally__flight_verdict {
    int size;              /* the communicator's ranks */
    int missing;           /* ranks that left no record */
    uint64_t diverge_seq;  /* the first collective not every rank completed alike; 0: none found */
    int mismatch;          /* ranks called different collectives there */
    int holder;            /* the rank that holds the job up, -1 when the records cannot tell */
    int holder_recorded;   /* it left a record */
    int waiting_on_holder; /* ranks whose wait led to it */
    double holder_late_s;  /* how long after the first rank it began the collective (-1: it never did) */
} tally__flight_verdict;

void tally__flight_analyze(const tally__flight_rank *r, size_t n, tally__flight_verdict *v);
/* The entry of rank record r for sequence seq, or NULL. */
const tally__flight_entry *tally__flight_find(const tally__flight_rank *r, uint64_t seq);
const char *tally__flight_state_name(int state);

#endif
