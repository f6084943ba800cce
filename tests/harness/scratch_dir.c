/* scratch_dir.c - the scratch directory: made with mkdtemp, paths in it from a small ring of buffers (a
 * call may hold several at once), removed with rm -rf since tests leave links, FIFOs and read-only trees. */
#include "scratch_dir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char base[96];

const char *th_scratch_make(const char *prefix, unsigned mode) {
    snprintf(base, sizeof base, "/tmp/%s-XXXXXX", prefix);
    if (mkdtemp(base) && chmod(base, (mode_t)mode) == 0) return base;
    fprintf(stderr, "no scratch directory %s: %s\n", base, strerror(errno));
    return NULL;
}

const char *th_at(const char *name) {
    static char paths[8][384];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", base, name);
    return p;
}

void th_put_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

int th_scratch_remove(void) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) == 0) return 0;
    fprintf(stderr, "could not remove the scratch directory %s\n", base);
    return -1;
}
