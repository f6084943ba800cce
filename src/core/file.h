/* file.h - how the library opens files: a file it reads must be a regular file (a FIFO or a device can
 * neither block the open nor be read), a file it creates is new (never a planted link or an existing file),
 * an output a user names is replaced whole or written in place by what it is (file_out.c). */
#ifndef TALLY_CORE_FILE_H
#define TALLY_CORE_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
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
/* Reads the `size` bytes of the file open at fd (the size tally__file_open_read saw) into *out, a new
 * 64-byte aligned buffer of size + 1 bytes (the last a NUL) the caller frees: a file read whole is the program's own,
 * whatever happens to the file after. One that ends before `size` bytes shrank while it was read:
 * TALLY_E_INVALID naming label and both sizes (never a short buffer); bytes appended past `size` are not
 * read. TALLY_E_NOMEM, or TALLY_E_SYSTEM naming label and the error. */
int tally__file_read_all(int fd, const char *label, uint64_t size, unsigned char **out);
/* The same for a directory (O_DIRECTORY). */
int tally__file_open_dir(const char *path, const char *label, int *fd);
/* As tally__file_open_read, but never through a symbolic link at `name` (O_NOFOLLOW: TALLY_E_INVALID, "<label>: is a
 * symbolic link ...", errno ELOOP), with the file's stat in *st (its owner, for a caller that reads only
 * some users' files). For a directory others can write into. */
int tally__file_open_read_nofollow(int dirfd, const char *name, const char *label, int *fd, struct stat *st);
/* Clears O_NONBLOCK on fd: what was opened so that the open could not block (a FIFO, a device) is then
 * read or written as any file is. TALLY_E_SYSTEM naming label. */
int tally__file_blocking(int fd, const char *label);

/* Creates `name` under dirfd to write it, new (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644 less the umask):
 * nothing that was there is ever opened, followed or truncated. A regular file already there is taken
 * for a leftover of an interrupted write of ours and unlinked (which removes the name, never touches
 * what another name links to), then the create is tried once more; a symbolic link or anything else
 * there is refused, naming it. TALLY_E_SYSTEM or TALLY_E_INVALID with label, the error and the hint. */
int tally__file_create(int dirfd, const char *name, const char *label, int *fd);

/* What st_mode is, in words: "a FIFO", "a character device", "a symbolic link", ... */
const char *tally__file_kind(mode_t m);
/* What the object open at fd is, in words: as tally__file_kind, and beyond what a mode tells, "a pipe"
 * (not "a FIFO": it has no name), "a deleted file", a kernel object that is no file (an eventfd). For a
 * message about a descriptor, whose link in /proc/PID/fd reads "pipe:[1234]", not a path. */
const char *tally__file_kind_fd(int fd);

/* An output a user names (--json, --svg, --plot, --trace, sim --save). What path is decides how it is
 * written; nothing but a regular file is replaced (a link or FIFO put at the name while tally writes
 * is checked for just before the rename, which never follows it):
 * - a new name, or a regular file: replaced whole, as a user expects of an output. The bytes go to a new
 *   temporary file beside it (.NAME.tmp.<random>, O_EXCL: another writer's is never touched), renamed
 *   over it at commit (the replaced file's mode kept, the directory fsynced), so a reader sees the old
 *   file or the new one. A directory on the way that is another user's symbolic link is refused, as the
 *   output's own link would be. Not in /proc or /sys, which take no new files: refused, saying so.
 * - /dev/fd/N, /proc/self/fd/N (and /dev/stdout, /dev/stderr, links to those, and every other spelling
 *   of this process's descriptor in procfs: /dev//fd/N, /proc/PID/fd/N): descriptor N itself,
 *   duplicated, never reopened, so `--json /dev/stdout > f` writes into f at its offset. Every stdio
 *   stream is flushed first, so what was printed before stays before. Messages say what it is in words
 *   ("descriptor 1, a pipe"), never its link's text ("pipe:[1234]"). Another process's descriptor
 *   (/proc/PID/fd/N) is followed as a link only where it leads to a path naming the same file; its
 *   pipe, socket or deleted file is refused, said in words.
 * - a character device or a FIFO: written in place (no O_CREAT, no O_TRUNC, O_NOCTTY). A FIFO no one
 *   reads is refused at once (the open is O_NONBLOCK), never waited on. A write error (ENOSPC from
 *   /dev/full, EPIPE) fails the commit with its reason.
 * - a symbolic link: never replaced. It is followed only when it is this user's or root's (every link on
 *   the way), to a regular file of this user's (then that file is replaced whole, in its own directory),
 *   to a device or FIFO (written in place) or to a descriptor as above; else refused, naming the link and
 *   where it leads: another user's link, a dangling link (nothing is created through it), a loop.
 * - a directory, a socket, a block device: refused, naming what it is.
 * Every refusal and failure is TALLY_E_INVALID or TALLY_E_SYSTEM naming path, with the error and the hint. */
struct tally__out_sink;
typedef struct tally__file_out {
    FILE *f;
    int fd;                       /* f's descriptor: bytes written through it follow what f has flushed */
    char *path;                   /* as given: every message names it */
    char *name;                   /* the name under dirfd that tmp replaces; NULL when written in place */
    char *tmp;                    /* the temporary file under dirfd; NULL when written in place */
    int dirfd;                    /* -1 when written in place */
    char how[112];                /* written in place: what it is ("a FIFO", "descriptor 1, a pipe") */
    struct tally__out_sink *sink; /* f's cookie: keeps the first write error's errno */
} tally__file_out;

int tally__file_out_open(tally__file_out *o, const char *path);
/* Flushes, checks every write, then (replacing) fsyncs and renames; on any failure removes the temporary
 * file and says why (ENOSPC, EROFS, EPIPE... with the hint). Always releases o. */
int tally__file_out_commit(tally__file_out *o);
/* Drops the temporary file; safe on a zeroed o and on one already released. */
void tally__file_out_abort(tally__file_out *o);

#endif
