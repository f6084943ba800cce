/* ckpt_seam.c - the checkpoint writer's test seam (test builds only): the process killed as a writer
 * reaches a chosen stage of its commit, so a test can check what a crash there leaves behind. */
#include "ckpt_seam.h"

#include <signal.h>

static int kill_stage = -1; /* a forked writer inherits it */

void tally__ckpt_seam_kill_at(int stage) { kill_stage = stage; }

void tally__ckpt_seam_stage(int stage) {
    if (stage == kill_stage) raise(SIGKILL);
}
