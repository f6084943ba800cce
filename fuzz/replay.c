/* replay.c - the main of a fuzz target where libFuzzer is absent (the gcc and sanitizer builds): runs
 * LLVMFuzzerTestOneInput once on every file of the directories (or on the files) named, for ctest. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "fuzz.h"

/* Optional in a target, as with libFuzzer. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static double replay_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Runs one input from an exact-size heap copy (as libFuzzer does), so a read past its end is caught. */
static int replay_file(const char *path) {
    FILE *f = fopen(path, "rbe");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, n); /* the last name printed is the culprit of a crash */
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int replay_skip(const struct dirent *e) { return e->d_name[0] != '.'; }

/* Every regular file of a directory, in name order so a run is repeatable. */
static long replay_dir(const char *dir) {
    struct dirent **names;
    int n = scandir(dir, &names, replay_skip, alphasort);
    if (n < 0) {
        fprintf(stderr, "replay: cannot list %s: %s\n", dir, strerror(errno));
        return -1;
    }
    long done = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (done >= 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode)) done = replay_file(path) ? -1 : done + 1;
        free(names[i]);
    }
    free(names);
    return done;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR_OR_FILE...\nRuns the fuzz target once on each input.\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    double t0 = replay_now();
    long total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: no such input %s\n", argv[i]);
            return 1;
        }
        long n = S_ISDIR(st.st_mode) ? replay_dir(argv[i]) : replay_file(argv[i]) ? -1 : 1;
        if (n < 0) return 1;
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "replay: no inputs found in what was named\n");
        return 1;
    }
    printf("replay: %ld inputs in %.2f s, none crashed\n", total, replay_now() - t0);
    return 0;
}
