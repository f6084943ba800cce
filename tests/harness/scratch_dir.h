/* scratch_dir.h - a test's own directory under /tmp: paths in it, small files written into it, and its
 * removal at the end, so tests that plant files for the tally binary share one way of doing it. */
#ifndef TALLY_TEST_SCRATCH_DIR_H
#define TALLY_TEST_SCRATCH_DIR_H

/* Makes /tmp/PREFIX-XXXXXX with the given mode; its path, or NULL after saying why on stderr. */
const char *th_scratch_make(const char *prefix, unsigned mode);

/* The scratch directory's path joined with name. Eight results stay valid at once, so a call can take
 * several paths as arguments. */
const char *th_at(const char *name);

/* Writes text to path, replacing what was there; a failure shows up in the test that reads it. */
void th_put_file(const char *path, const char *text);

/* Removes the scratch directory and all in it; 0, or -1 after saying on stderr what was left. */
int th_scratch_remove(void);

#endif
