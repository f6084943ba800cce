/* launch.h - starting N local ranks of a program (tally run, and subcommands that run themselves
 * as N ranks: tally bench -n N, tally train -n N). Part of the CLI; the library never launches. */
#ifndef TALLY_TOOLS_LAUNCH_H
#define TALLY_TOOLS_LAUNCH_H

#define TALLY_LAUNCH_GRACE_S 2.0 /* grace_s's default */

/* Zero-initialise, then set n; every other field has a zero default. */
typedef struct {
    int n;                 /* ranks to start, 1..TALLY_LAUNCH_MAX_RANKS */
    const char *transport; /* NULL: leave TALLY_TRANSPORT as inherited; else "shm", "tcp", "auto" */
    double timeout_s;      /* 0: leave TALLY_TIMEOUT as inherited; else exported as TALLY_TIMEOUT */
    int prefix_output;     /* nonzero: relay each line of rank r as "[r] line"; 0: ranks inherit our
                            * stdout and stderr and write to them directly */
    const char *name;      /* how messages start: NULL means "tally run"; bench passes "tally bench" */
    double grace_s;        /* SIGTERM-to-SIGKILL delay when stopping the ranks; 0 means TALLY_LAUNCH_GRACE_S */
    int max_restarts;      /* when a rank fails, stop the others and start all ranks again, up to this
                            * many times (each start gets a fresh port and token, and TALLY_RESTART=k) */
    const char *bind;      /* "core": rank r on its own CPUs of our affinity set when the ranks fit
                            * (place.h); "none": affinity left as inherited; NULL: TALLY_CPU_BIND, else
                            * "core" */
    int cpus_per_rank;     /* CPUs each rank is bound to (tally train: --threads); 0 means 1 */
} tally_launch_opts;

#define TALLY_LAUNCH_MAX_RANKS 4096

/* Starts opts->n ranks of argv[0] (found on PATH as execvp does) with arguments argv[1..] (argv ends
 * with NULL) and waits for all of them. Rank r gets this process's environment plus
 *   TALLY_RANK=r  TALLY_WORLD_SIZE=n  LOCAL_RANK=r  LOCAL_WORLD_SIZE=n
 *   TALLY_ADDR=127.0.0.1:PORT (a port free when picked; rank 0 listens there)
 *   TALLY_TOKEN=<64 hex digits from RAND_bytes, fresh for every launch>
 *   TALLY_TRANSPORT, TALLY_TIMEOUT when opts set them
 *   RANK=r  WORLD_SIZE=n  MASTER_ADDR=127.0.0.1  MASTER_PORT=PORT2 (torchrun's names: PyTorch's env://
 *   rendezvous, whose store rank 0 hosts on another free port).
 * With prefix_output, a line goes out whole once its newline (or EOF) arrives, so lines of different
 * ranks never mix; only a line past 1 MiB is relayed in pieces, which others' lines may split.
 * Rank 0 reads our stdin unless it is a terminal; the other ranks read /dev/null. Each rank runs in
 * its own process group so stopping it also stops what it started. Ranks die with the launcher
 * (PR_SET_PDEATHSIG).
 *
 * When a rank exits non-zero or is killed by a signal, a message on stderr names it, the others get
 * SIGTERM and, grace_s later, SIGKILL. SIGINT, SIGTERM and SIGHUP sent to the launcher are forwarded
 * to every rank; a second one sends SIGKILL. Every wait is bounded once stopping has begun.
 *
 * With max_restarts > 0, a failed launch (a rank exited non-zero or was killed, not the launcher being
 * signalled) is followed by a fresh start of all n ranks, up to max_restarts times; the ranks see
 * TALLY_RESTART (0 for the first start), as torchrun's TORCHELASTIC_RESTART_COUNT, and a program that
 * checkpoints resumes from its last checkpoint.
 *
 * Returns the exit code for the tool: 0 when every rank exited 0; else the first failing rank's exit
 * status, or 128+signal when it was killed (or when the launcher itself was signalled); 127 when the
 * program could not be executed (the message names it); 1 when the launch itself failed; 2 for bad
 * opts.
 *
 * Changes process-wide signal state while it runs (signal mask, SIGPIPE and SIGCHLD dispositions) and
 * restores it on return: call it from the main thread of a process that has no other threads. */
int tally_launch(const tally_launch_opts *opts, char *const argv[]);

/* What tally_launch_self returns in a process that already is a rank. Exit codes are >= 0. */
#define TALLY_LAUNCH_IS_RANK (-1)

/* For subcommands that run themselves as N ranks. argc/argv are the subcommand's own arguments as
 * tally's main passed them (argv[0] is the subcommand's name, e.g. "bench").
 *
 * When this process already is a rank (tally_launch_in_rank()), returns TALLY_LAUNCH_IS_RANK at once
 * and the caller goes on to do its work as that rank. Otherwise it re-executes this very binary
 * (/proc/self/exe) with the same arguments as opts->n ranks under tally_launch and returns the exit
 * code for the tool once they have finished. The ranks see the same flags (including -n), so they
 * can check TALLY_WORLD_SIZE against it. Usage:
 *
 *     int tally_cmd_bench(int argc, char **argv) {
 *         ...parse flags, fill lo (lo.n = n, lo.name = "tally bench", lo.prefix_output = 1)...
 *         int rc = tally_launch_self(&lo, argc, argv);
 *         if (rc != TALLY_LAUNCH_IS_RANK) return rc; // we were the launcher; the ranks are done
 *         ...this process is one rank: tally_comm_init(), measure, report...
 *     }
 */
int tally_launch_self(const tally_launch_opts *opts, int argc, char **argv);

/* Nonzero when some launcher already made this process a rank: TALLY_RANK or TALLY_WORLD_SIZE (set, even
 * empty: the library then names what is wrong), Open MPI's
 * OMPI_COMM_WORLD_RANK, PMI_RANK, or torchrun's RANK together with MASTER_ADDR is set. Slurm's
 * SLURM_PROCID is not taken as a sign: batch scripts have it too, and they are not ranks. */
int tally_launch_in_rank(void);

#endif
