/* file.h - how the library opens files: a file it reads must be a regular file (a FIFO or a device can
 * neither block the open nor be read), a file it creates is new (never a planted link or an existing file). */
#ifndef TALLY_CORE_FILE_H
#define TALLY_CORE_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

/* What a user can do about errno `e` after a failed create or write ("free space there or choose another
 * directory"); "" when there is nothing better to say than strerror. */
const char *tally__errno_hint(int e);

/* Opens `name` under dirfd (AT_FDCWD: a plain path) to read it. The open cannot block (O_NONBLOCK,
 * cleared after it), and anything but a regular file is refused: TALLY_E_INVALID, "<label>: is a FIFO,
 * not a regular file". A failing open is TALLY_E_SYSTEM naming label and the error, with errno left as
 * the open set it, so a caller can tell a missing file (ENOENT) apart. *size (when not NULL) is the
 * file's size as the check saw it. */
int tally__file_open_read(int dirfd, const char *name, const char *label, int *fd, uint64_t *size);
/* The same for a directory (O_DIRECTORY). */
int tally__file_open_dir(const char *path, const char *label, int *fd);
/* As tally__file_open_read, but never through a symbolic link at `name` (O_NOFOLLOW: TALLY_E_INVALID, "<label>: is a
 * symbolic link ...", errno ELOOP), with the file's stat in *st (its owner, for a caller that reads only
 * some users' files). For a directory others can write into. */
int tally__file_open_read_nofollow(int dirfd, const char *name, const char *label, int *fd, struct stat *st);

/* Creates `name` under dirfd to write it, new (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644 less the umask):
 * nothing that was there is ever opened, followed or truncated. A regular file already there is taken
 * for a leftover of an interrupted write of ours and unlinked (which removes the name, never touches
 * what another name links to), then the create is tried once more; a symbolic link or anything else
 * there is refused, naming it. TALLY_E_SYSTEM or TALLY_E_INVALID with label, the error and the hint. */
int tally__file_create(int dirfd, const char *name, const char *label, int *fd);

/* A file that replaces `path` whole, as a user expects of an output such as --json FILE: written to a new
 * temporary file beside it (tally__file_create), then renamed over path, so a link at path is replaced,
 * not followed, and a reader sees the old file or the new one. */
typedef struct tally__file_out {
    FILE *f;
    char *path, *tmp;
    int dirfd;
} tally__file_out;

int tally__file_out_open(tally__file_out *o, const char *path);
/* Flushes, checks every write, fsyncs and renames; on any failure removes the temporary file and says
 * why (ENOSPC, EROFS, ... with the hint). Always releases o. */
int tally__file_out_commit(tally__file_out *o);
/* Drops the temporary file (NULL-safe on a zeroed o). */
void tally__file_out_abort(tally__file_out *o);

#endif
