/* ckpt_seam.h - the checkpoint writer's test seam: the stages of a commit, and a fault that kills the
 * process as the writer reaches one (test builds only, ckpt_seam.c; elsewhere the call is empty). */
#ifndef TALLY_CKPT_CKPT_SEAM_H
#define TALLY_CKPT_CKPT_SEAM_H

/* Where a writer is in its commit: a crash at each must leave a loadable LATEST (tests/ckpt/test_ckpt_dir.c). */
enum tally__ckpt_stage {
    TALLY__CKPT_AT_BEGUN,            /* .tmp created, no data yet */
    TALLY__CKPT_AT_DATA_WRITTEN,     /* all data written, header and table not yet */
    TALLY__CKPT_AT_HEADER_WRITTEN,   /* header written, file not yet fsynced */
    TALLY__CKPT_AT_FILE_SYNCED,      /* fsynced, not yet renamed */
    TALLY__CKPT_AT_FILE_RENAMED,     /* renamed to step-....tck, directory not yet fsynced */
    TALLY__CKPT_AT_FILE_DURABLE,     /* directory fsynced, LATEST not yet started */
    TALLY__CKPT_AT_MANIFEST_WRITTEN, /* LATEST.tmp written and fsynced, not yet renamed */
    TALLY__CKPT_AT_MANIFEST_RENAMED, /* LATEST renamed (the commit), directory not yet fsynced */
    TALLY__CKPT_AT_COMMITTED,        /* directory fsynced, old files not yet removed */
    TALLY__CKPT_AT_REMOVED_ONE,      /* after each old or stale file removed */
    TALLY__CKPT_STAGES
};

#ifdef TALLY_TEST_SEAMS
/* From now on this process dies by SIGKILL when a writer reaches `stage` (-1: never). */
void tally__ckpt_seam_kill_at(int stage);
/* The writer passes `stage`. */
void tally__ckpt_seam_stage(int stage);
#else
static inline void tally__ckpt_seam_stage(int stage) { (void)stage; }
#endif

#endif
