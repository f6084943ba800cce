/* file.c - regular files only on the read side (opened so a FIFO cannot block), new files only on the
 * write side (O_EXCL | O_NOFOLLOW, a leftover unlinked first), whole-file replacement by rename. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

static const char *kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a regular file";
}

/* The descriptor is what was opened, so the check cannot be raced by a rename between stat and open. */
static int check_regular(int fd, const char *label, uint64_t *size) {
    struct stat st;
    if (fstat(fd, &st) != 0) return tally__seterr(TALLY_E_SYSTEM, "%s: cannot stat it: %s", label, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return tally__seterr(TALLY_E_INVALID, "%s: is %s, not a regular file; tally reads only regular files", label,
                             kind_of(st.st_mode));
    if (size) *size = (uint64_t)st.st_size;
    return 0;
}

int tally__file_open_read(int dirfd, const char *name, const char *label, int *fd, uint64_t *size) {
    *fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (*fd < 0) {
        int e = errno;
        tally__seterr(TALLY_E_SYSTEM, "%s: cannot open it: %s", label, strerror(e));
        errno = e;
        return TALLY_E_SYSTEM;
    }
    int rc = check_regular(*fd, label, size);
    if (!rc && fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = tally__seterr(TALLY_E_SYSTEM, "%s: fcntl: %s", label, strerror(errno));
    if (rc) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

int tally__file_open_read_nofollow(int dirfd, const char *name, const char *label, int *fd, struct stat *st) {
    *fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW);
    if (*fd < 0) {
        int e = errno;
        if (e == ELOOP)
            tally__seterr(TALLY_E_INVALID, "%s: is a symbolic link; tally follows none here", label);
        else
            tally__seterr(TALLY_E_SYSTEM, "%s: cannot open it: %s", label, strerror(e));
        errno = e;
        return e == ELOOP ? TALLY_E_INVALID : TALLY_E_SYSTEM;
    }
    int rc = check_regular(*fd, label, NULL);
    if (!rc && fstat(*fd, st) != 0)
        rc = tally__seterr(TALLY_E_SYSTEM, "%s: cannot stat it: %s", label, strerror(errno));
    if (!rc && fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = tally__seterr(TALLY_E_SYSTEM, "%s: fcntl: %s", label, strerror(errno));
    if (rc) {
        close(*fd);
        *fd = -1;
    }
    return rc;
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
                             label, kind_of(st.st_mode));
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
        if (e != EEXIST || attempt == 1)
            return tally__seterr(TALLY_E_SYSTEM, "%s: cannot create it: %s%s", label, strerror(e),
                                 tally__errno_hint(e));
        int rc = remove_leftover(dirfd, name, label);
        if (rc) return rc;
    }
}

/* ---- whole-file replacement ---- */

int tally__file_out_open(tally__file_out *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->dirfd = -1;
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) : 0;
    char *dir = slash ? strndup(path, dl ? dl : 1) : strdup(".");
    o->path = strdup(path);
    size_t tl = strlen(path) + 32;
    o->tmp = malloc(tl);
    if (!dir || !o->path || !o->tmp) {
        free(dir);
        tally__file_out_abort(o);
        return tally__seterr(TALLY_E_NOMEM, "%s: out of memory", path);
    }
    snprintf(o->tmp, tl, ".%s.tmp.%d", slash ? slash + 1 : path, (int)getpid());
    int rc = tally__file_open_dir(dir, dir, &o->dirfd);
    free(dir);
    int fd = -1;
    if (!rc) rc = tally__file_create(o->dirfd, o->tmp, path, &fd);
    if (!rc && !(o->f = fdopen(fd, "w"))) {
        close(fd);
        unlinkat(o->dirfd, o->tmp, 0);
        rc = tally__seterr(TALLY_E_NOMEM, "%s: out of memory", path);
    }
    if (rc) {
        if (o->dirfd >= 0) close(o->dirfd);
        o->dirfd = -1;
        free(o->path);
        free(o->tmp);
        o->path = o->tmp = NULL;
    }
    return rc;
}

static void out_release(tally__file_out *o) {
    if (o->dirfd >= 0) close(o->dirfd);
    free(o->path);
    free(o->tmp);
    memset(o, 0, sizeof *o);
    o->dirfd = -1;
}

int tally__file_out_commit(tally__file_out *o) {
    int bad = ferror(o->f), e = bad ? EIO : 0;
    if (fflush(o->f) != 0 && !e) bad = 1, e = errno;
    if (!bad && fsync(fileno(o->f)) != 0) bad = 1, e = errno;
    if (fclose(o->f) != 0 && !bad) bad = 1, e = errno;
    o->f = NULL;
    if (!bad && renameat(o->dirfd, o->tmp, o->dirfd, strrchr(o->path, '/') ? strrchr(o->path, '/') + 1 : o->path))
        bad = 1, e = errno;
    int rc = 0;
    if (bad) {
        unlinkat(o->dirfd, o->tmp, 0);
        rc = tally__seterr(TALLY_E_SYSTEM, "cannot write %s: %s%s", o->path, strerror(e), tally__errno_hint(e));
    }
    out_release(o);
    return rc;
}

void tally__file_out_abort(tally__file_out *o) {
    if (o->f) {
        fclose(o->f);
        o->f = NULL;
        if (o->dirfd >= 0 && o->tmp) unlinkat(o->dirfd, o->tmp, 0);
    }
    out_release(o);
}
