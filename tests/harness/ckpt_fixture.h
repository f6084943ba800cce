/* ckpt_fixture.h - what the checkpoint tests share: a scratch directory, file helpers, a bounded reap,
 * and checkpoints whose every byte is a function of (step, tensor, offset), written and checked back. */
#ifndef TALLY_TESTS_CKPT_FIXTURE_H
#define TALLY_TESTS_CKPT_FIXTURE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckpt/ckpt.h"

enum { NT = 5 }; /* tensors in content_desc */

/* The test's scratch directory (scratch_dir.h's, /tmp/tally_NAME-XXXXXX, 0700); ck_root_remove deletes it
 * and all in it. */
int ck_root_make(const char *test_name);
void ck_root_remove(void);

/* Helpers: splitmix64's finaliser, paths in the scratch directory (th_at, copied into out), files (written
 * with harness.h's th_write_file), and a reap that kills after limit_s. */
uint64_t mix(uint64_t z);
void subdir(char *out, size_t cap, const char *name);
int has(const char *msg, const char *needle);
int exists(const char *dir, const char *name);
int count_suffix(const char *dir, const char *suffix);
unsigned char *read_all(const char *path, size_t *len); /* the whole file, malloc()ed; NULL if unreadable */
int reap(pid_t pid, double limit_s);
/* Checkpoints of NT tensors whose bytes are a function of (step, tensor, offset): written in uneven
 * chunks, and checked back byte for byte (content_check, step_check return the bad bytes' count). */
void content_desc(tally__ckpt_tensor d[NT], size_t nw, size_t nm);
size_t desc_bytes(const tally__ckpt_tensor *d);
void content_fill(int64_t s, int t, size_t off, unsigned char *out, size_t n);
int write_tensors(const char *dir, int64_t step, const tally__ckpt_tensor *d, int n, int keep);
int write_step(const char *dir, int64_t step, size_t nw, size_t nm, int keep);
int content_check(const tally__ckpt *c, int64_t s, const tally__ckpt_tensor *d, int n, const char *what);
int step_check(const tally__ckpt *c, int64_t s, size_t nw, size_t nm, const char *what);

#endif
