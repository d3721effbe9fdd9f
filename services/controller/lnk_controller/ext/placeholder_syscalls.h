/* placeholder_syscalls.h: what placeholder_calls.c (make, seal, remove) and placeholder_pool.c
 * (take, put_back) share: an entry's reading from its Python tuple, the walk down to its folder
 * with no link followed, its making there, and the immutable flag. Static inline: each module is
 * its own translation unit, and nothing here is a symbol of its own.
 *
 * What this does NOT do: hold or release the GIL (read_entries is called with it held, the rest
 * without); check a name (names_ok is the caller's to call before any step).
 */
#ifndef LNK_PLACEHOLDER_SYSCALLS_H
#define LNK_PLACEHOLDER_SYSCALLS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_BATCH 128   /* more than every protected name (~50) in one grant */
#define MAX_PARTS 8     /* folders above a placeholder: `.git/info` is two */
#define MAX_CONTENT 16  /* placeholders.MAX_PLACEHOLDER_BYTES: more was filled by someone */
#define MAX_CONTENTS 4  /* the contents a placeholder may hold: b"" and `.git/commondir`'s */
#define DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

enum { NOT_THERE = 0, KEPT = 1, REMOVED = 2, ERROR = 3 };

typedef struct {
    const char *parts[MAX_PARTS];
    Py_ssize_t nparts;
    const char *name;
    const char *content; /* NULL: an empty folder */
    Py_ssize_t content_len;
    const char *pool; /* placeholder_pool.c's take: the pool's folder to rename in, or NULL */
} entry_t;

typedef struct {
    int fd, parent_fd;
    struct stat st;
} made_t;

/* One step's name: non-empty, not "." or "..", no "/" (then it is one directory entry). */
static inline int one_name(const char *s) {
    return s[0] != '\0' && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && strchr(s, '/') == NULL;
}

static inline int open_at(int dir_fd, const char *name, int flags, mode_t mode) {
    int fd;
    do fd = openat(dir_fd, name, flags, mode);
    while (fd < 0 && errno == EINTR);
    return fd;
}

/* Close fd keeping errno (the error being returned is the one before the close). */
static inline void close_keeping_errno(int fd) {
    int saved = errno;
    close(fd);
    errno = saved;
}

static inline int write_all(int fd, const char *buf, Py_ssize_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, (size_t)len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n == 0 ? (errno = EIO, -1) : -1;
        buf += n;
        len -= n;
    }
    return 0;
}

/* A duplicate of dir_fd walked down the entry's folders, each step O_NOFOLLOW: the open folder
 * (the caller closes it), or -1 with errno set (all it opened closed again). */
static inline int walk_to(int dir_fd, const entry_t *e) {
    int parent = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
    if (parent < 0) return -1;
    for (Py_ssize_t i = 0; i < e->nparts; i++) {
        int below = open_at(parent, e->parts[i], DIR_FLAGS, 0);
        close_keeping_errno(parent);
        if (below < 0) return -1;
        parent = below;
    }
    return parent;
}

/* Make the entry under its open folder: 0 with *fd_out its open fd, or the errno. */
static inline int make_here(int parent, const entry_t *e, int *fd_out) {
    int fd;
    if (e->content == NULL) {
        if (mkdirat(parent, e->name, 0555) < 0) return errno;
        fd = open_at(parent, e->name, DIR_FLAGS, 0);
        if (fd < 0) return errno;
    } else {
        fd = open_at(parent, e->name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0444);
        if (fd < 0) return errno;
        if (write_all(fd, e->content, e->content_len) < 0) {
            close_keeping_errno(fd);
            return errno;
        }
    }
    *fd_out = fd;
    return 0;
}

/* Keep a made entry's fds and fstat in *out: 0, or the errno (fd and parent closed). */
static inline int keep_made(int parent, int fd, made_t *out) {
    if (fstat(fd, &out->st) < 0) {
        close_keeping_errno(fd);
        close_keeping_errno(parent);
        return errno;
    }
    out->fd = fd;
    out->parent_fd = parent;
    return 0;
}

/* entries -> e[]; the count, or -1 with an exception set. */
static inline Py_ssize_t read_entries(PyObject *entries, entry_t *e) {
    Py_ssize_t n = PyTuple_GET_SIZE(entries);
    if (n > MAX_BATCH) {
        PyErr_Format(PyExc_ValueError, "at most %d placeholders in one batch", MAX_BATCH);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(entries, i), *parts, *content, *pool = Py_None;
        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "an entry is a tuple (parts, name, content)");
            return -1;
        }
        if (!PyArg_ParseTuple(item, "O!yO|O", &PyTuple_Type, &parts, &e[i].name, &content, &pool))
            return -1;
        if (pool == Py_None) {
            e[i].pool = NULL;
        } else if (PyBytes_Check(pool) &&
                   strlen(PyBytes_AS_STRING(pool)) == (size_t)PyBytes_GET_SIZE(pool)) {
            e[i].pool = PyBytes_AS_STRING(pool);
        } else {
            PyErr_SetString(PyExc_ValueError, "a pool name is None or bytes without NUL");
            return -1;
        }
        e[i].nparts = PyTuple_GET_SIZE(parts);
        if (e[i].nparts > MAX_PARTS) {
            PyErr_Format(PyExc_ValueError, "at most %d folders above a placeholder", MAX_PARTS);
            return -1;
        }
        for (Py_ssize_t j = 0; j < e[i].nparts; j++) {
            PyObject *part = PyTuple_GET_ITEM(parts, j);
            if (!PyBytes_Check(part) ||
                strlen(PyBytes_AS_STRING(part)) != (size_t)PyBytes_GET_SIZE(part)) {
                PyErr_SetString(PyExc_ValueError, "a folder name is bytes without NUL");
                return -1;
            }
            e[i].parts[j] = PyBytes_AS_STRING(part);
        }
        if (content == Py_None) {
            e[i].content = NULL;
            e[i].content_len = 0;
        } else if (PyBytes_Check(content) && PyBytes_GET_SIZE(content) <= MAX_CONTENT) {
            e[i].content = PyBytes_AS_STRING(content);
            e[i].content_len = PyBytes_GET_SIZE(content);
        } else {
            PyErr_Format(PyExc_ValueError, "content is None or bytes of at most %d", MAX_CONTENT);
            return -1;
        }
    }
    return n;
}

static inline int names_ok(const entry_t *e) {
    for (Py_ssize_t j = 0; j < e->nparts; j++)
        if (!one_name(e->parts[j])) return 0;
    return one_name(e->name) && (e->pool == NULL || one_name(e->pool));
}

static inline int no_flag(int err) { return err == ENOTTY || err == EOPNOTSUPP || err == EINVAL; }

/* Set or clear FS_IMMUTABLE_FL: 1 set as asked, 0 no such flag here, -1 another error. */
static inline int set_immutable(int fd, int on) {
    int flags;
    if (ioctl(fd, FS_IOC_GETFLAGS, &flags) < 0) return no_flag(errno) ? 0 : -1;
    int wanted = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
    if (wanted != flags && ioctl(fd, FS_IOC_SETFLAGS, &wanted) < 0) return no_flag(errno) ? 0 : -1;
    return 1;
}

#endif
