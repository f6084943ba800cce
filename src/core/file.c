/* file.c - regular files only on the read side (opened so a FIFO cannot block), new files only on the
 * write side (O_EXCL | O_NOFOLLOW, a leftover unlinked first); the outputs a user names are file_out.c. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "err.h"

const char *tally__errno_hint(int e) {
    switch (e) {
    case ENOSPC: return "; the disk is full: free space there or choose another directory";
    case EDQUOT: return "; the disk quota is used up: free space or choose another directory";
    case EROFS: return "; the file system is read-only: choose a writable directory";
    case EACCES:
    case EPERM: return "; this user may not write there: fix the permissions or choose another directory";
    case EMFILE:
    case ENFILE: return "; too many open files: raise the limit (ulimit -n)";
    case ENOENT: return "; a directory on the path does not exist";
    case EIO: return "; the device reported an I/O error: check it";
    default: return "";
    }
}

const char *tally__file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISLNK(m)) return "a symbolic link";
    if (S_ISREG(m)) return "a regular file";
    return "not a regular file";
}

int tally__file_blocking(int fd, const char *label) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        return tally__seterr(TALLY_E_SYSTEM, "%s: cannot make its descriptor blocking (fcntl): %s", label,
                             strerror(errno));
    return 0;
}

const char *tally__file_kind_fd(int fd) {
    struct stat st;
    struct statfs fs;
    if (fstat(fd, &st) != 0) return "something that cannot be looked at";
    long type = fstatfs(fd, &fs) == 0 ? (long)fs.f_type : 0;
    if (S_ISFIFO(st.st_mode) && type == PIPEFS_MAGIC) return "a pipe";
    if ((st.st_mode & S_IFMT) == 0 || type == ANON_INODE_FS_MAGIC)
        return "a kernel object that is no file (an eventfd, an epoll, a timer)";
    if (S_ISREG(st.st_mode) && st.st_nlink == 0) return "a deleted file";
    return tally__file_kind(st.st_mode);
}

/* The one open behind tally__file_open_read and _nofollow. The descriptor is what was opened, so the check
 * cannot be raced by a rename between stat and open. */
static int open_read(int dirfd, const char *name, const char *label, int nofollow, int *fd, struct stat *st) {
    *fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (nofollow ? O_NOFOLLOW : 0));
    if (*fd < 0) {
        int e = errno;
        if (nofollow && e == ELOOP)
            tally__seterr(TALLY_E_INVALID, "%s: is a symbolic link; tally follows none here", label);
        else
            tally__seterr(TALLY_E_SYSTEM, "%s: cannot open it: %s", label, strerror(e));
        errno = e;
        return nofollow && e == ELOOP ? TALLY_E_INVALID : TALLY_E_SYSTEM;
    }
    int rc = 0;
    if (fstat(*fd, st) != 0)
        rc = tally__seterr(TALLY_E_SYSTEM, "%s: cannot stat it: %s", label, strerror(errno));
    else if (!S_ISREG(st->st_mode))
        rc = tally__seterr(TALLY_E_INVALID, "%s: is %s, not a regular file; tally reads only regular files", label,
                           tally__file_kind(st->st_mode));
    if (!rc) rc = tally__file_blocking(*fd, label);
    if (rc) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

int tally__file_open_read(int dirfd, const char *name, const char *label, int *fd, uint64_t *size) {
    struct stat st;
    int rc = open_read(dirfd, name, label, 0, fd, &st);
    if (!rc && size) *size = (uint64_t)st.st_size;
    return rc;
}

int tally__file_open_read_nofollow(int dirfd, const char *name, const char *label, int *fd, struct stat *st) {
    return open_read(dirfd, name, label, 1, fd, st);
}

int tally__file_read_all(int fd, const char *label, uint64_t size, unsigned char **out) {
    *out = NULL;
    if (size >= SIZE_MAX)
        return tally__seterr(TALLY_E_NOMEM, "%s: %llu bytes do not fit in memory", label, (unsigned long long)size);
    void *mem = NULL; /* aligned for any vector load of what is read (a checkpoint's tensors) */
    unsigned char *buf = posix_memalign(&mem, 64, (size_t)size + 1) == 0 ? mem : NULL;
    if (!buf)
        return tally__seterr(TALLY_E_NOMEM, "%s: out of memory for its %llu bytes", label, (unsigned long long)size);
    size_t have = 0;
    while (have < size) {
        size_t want = size - have < ((size_t)1 << 30) ? (size_t)(size - have) : (size_t)1 << 30;
        ssize_t k = pread(fd, buf + have, want, (off_t)have);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            free(buf);
            return tally__seterr(TALLY_E_SYSTEM, "%s: read error after %zu of its %llu bytes: %s", label, have,
                                 (unsigned long long)size, strerror(e));
        }
        if (k == 0) {
            free(buf);
            return tally__seterr(TALLY_E_INVALID,
                                 "%s: the file shrank while it was read: it had %llu bytes, and it ends after %zu; "
                                 "something else is writing it: give tally a file nothing changes",
                                 label, (unsigned long long)size, have);
        }
        have += (size_t)k;
    }
    buf[have] = 0;
    *out = buf;
    return 0;
}

int tally__file_open_dir(const char *path, const char *label, int *fd) {
    *fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0) {
        int e = errno;
        tally__seterr(TALLY_E_SYSTEM, "%s: cannot open the directory: %s", label,
                      e == ENOTDIR ? "it is not a directory" : strerror(e));
        errno = e;
        return TALLY_E_SYSTEM;
    }
    return 0;
}

/* What is at name, not following a link: a regular file is a leftover to unlink; anything else stays. */
static int remove_leftover(int dirfd, const char *name, const char *label) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : tally__seterr(TALLY_E_SYSTEM, "%s: cannot stat it: %s", label, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return tally__seterr(TALLY_E_INVALID,
                             "%s: %s is in the way; tally never writes through a link or into a file it did not "
                             "create: remove it, or use a directory only you can write",
                             label, tally__file_kind(st.st_mode));
    if (unlinkat(dirfd, name, 0) != 0 && errno != ENOENT)
        return tally__seterr(TALLY_E_SYSTEM, "%s: a file of that name is in the way and cannot be removed: %s%s", label,
                             strerror(errno), tally__errno_hint(errno));
    return 0;
}

int tally__file_create(int dirfd, const char *name, const char *label, int *fd) {
    for (int attempt = 0;; attempt++) {
        *fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (*fd >= 0) return 0;
        int e = errno;
        /* ENOENT for a plain name in a directory that is open: it takes no new files (procfs) or is gone */
        const char *hint = e == ENOENT && !strchr(name, '/') && dirfd != AT_FDCWD
                               ? "; its directory takes no new files (a kernel file system, or removed meanwhile)"
                               : tally__errno_hint(e);
        if (e != EEXIST || attempt == 1)
            return tally__seterr(TALLY_E_SYSTEM, "%s: cannot create it: %s%s", label, strerror(e), hint);
        int rc = remove_leftover(dirfd, name, label);
        if (rc) return rc;
    }
}
