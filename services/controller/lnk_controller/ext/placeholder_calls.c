/* placeholder_calls.c: lnk_controller._placeholder_calls, a write grant's placeholder syscalls
 * in batches, made with the GIL released (placeholder_make.py and placeholders.py call them).
 *
 * Why C: a write grant's start makes ~49 placeholders on a worker thread beside the launch's
 * thread. In Python each of their ~8 syscalls gives the GIL up and takes it back, and with two
 * threads in Python the taking back waits for the other's switch interval: the syscalls cost
 * 1-2 ms of CPU, the hand-offs many more of the launch's wall time (bench/README, session 12).
 * Here one call makes a whole batch, one seals it and one removes it, each holding the GIL only
 * to read its arguments and to build its answer.
 *
 *   make(dir_fd, entries) -> (made, errno)
 *     entries: a tuple of (parts, name, content): `parts` a tuple of folder names walked down
 *     from dir_fd, each step openat O_DIRECTORY|O_NOFOLLOW (a link swapped in anywhere on the
 *     way is not followed); then `name` made there: content None an empty folder (mkdirat
 *     0555, then opened O_NOFOLLOW), else a file O_CREAT|O_EXCL|O_NOFOLLOW 0444 holding
 *     `content`; then fstat. made: one (fd, parent_fd, dev, ino, uid, gid) per entry made, in
 *     order; errno 0 once all are made, else the error of entries[len(made)], where the batch
 *     stopped (nothing after it is tried; what it had opened on the way is closed).
 *   seal(items, owner_uid, owner_gid) -> (sealed, errno)
 *     items: a tuple of (fd, parent_fd, name, dev, ino, uid, gid), as made returned them. For
 *     each: fchown to the owner if (uid, gid) differ; FS_IOC_GETFLAGS, and FS_IOC_SETFLAGS
 *     with FS_IMMUTABLE_FL if not set; then whether `name` under parent_fd is still (dev, ino)
 *     (fstatat AT_SYMLINK_NOFOLLOW). sealed: one bool per item done (False: the filesystem has
 *     no such flag, ENOTTY/EOPNOTSUPP/EINVAL, or the name is another inode now); errno as make's.
 *   remove(items, contents) -> results
 *     items: a tuple of (staged, path, dev, ino): a placeholder's path through its grant's
 *     staged mount (or None) and on the host. For each path in turn (the staged one first, the
 *     host's only if the staged one is not that inode): lstat, a folder or regular file only;
 *     open O_NOFOLLOW|O_NONBLOCK; fstat, the same (dev, ino) or not ours; a file must be at
 *     most MAX_CONTENT bytes and hold exactly one of `contents` (a folder's emptiness is
 *     rmdir's to check); FS_IMMUTABLE_FL cleared; rmdir or unlink by the same path. results:
 *     one (status, value, which) per item: NOT_THERE, KEPT (someone filled it, or it went
 *     meanwhile: ENOENT/ENOTEMPTY), REMOVED (value: the open fd, for late_close), ERROR (value:
 *     the errno, which: 0 the staged path, 1 the host's). Every item is tried, as the clean-up
 *     removes every placeholder it can.
 *
 * The walk, the making and the immutable flag are placeholder_syscalls.h's, shared with
 * placeholder_pool.c (the same placeholders renamed in from the owner's pool and back).
 *
 * Each call runs on the calling thread, so it has that thread's file ids (setfsuid: the
 * owner's, inside as_caller.caller_credentials). Arguments are checked before the GIL is let go
 * and only immutable objects (tuples, bytes) held by the argument tuple are read after.
 *
 * What this does NOT do: decide anything (which names, which owner, what counts as refused:
 * the Python does, and records each made inode before `seal`); record anything; retry an
 * error other than EINTR; free a made placeholder whose answer cannot be built (no memory for
 * the result tuple: its fds are closed, its name stays, unrecorded, as with a controller killed
 * between make and record); accept a part or name that is empty, ".", ".." or holds a "/"
 * (EINVAL: each step is one name); take more than MAX_BATCH entries or MAX_PARTS folders.
 */
#define _GNU_SOURCE
#include "placeholder_syscalls.h"

/* Walk to the entry's folder and make it; 0, or the errno (all it opened closed again). */
static int make_one(int dir_fd, const entry_t *e, made_t *out) {
    int parent = walk_to(dir_fd, e), fd = -1;
    if (parent < 0) return errno;
    int err = make_here(parent, e, &fd);
    if (err != 0) {
        close(parent);
        return err;
    }
    return keep_made(parent, fd, out);
}

static PyObject *make(PyObject *module, PyObject *args) {
    (void)module;
    int dir_fd;
    PyObject *entries;
    entry_t e[MAX_BATCH];
    made_t m[MAX_BATCH];
    if (!PyArg_ParseTuple(args, "iO!", &dir_fd, &PyTuple_Type, &entries)) return NULL;
    Py_ssize_t n = read_entries(entries, e), done = 0;
    if (n < 0) return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (e[i].pool != NULL) {
            PyErr_SetString(PyExc_ValueError, "make takes no pool name (placeholder_pool's take does)");
            return NULL;
        }
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; done < n; done++) {
        err = names_ok(&e[done]) ? make_one(dir_fd, &e[done], &m[done]) : EINVAL;
        if (err != 0) break;
    }
    Py_END_ALLOW_THREADS
    PyObject *made = PyList_New(done);
    for (Py_ssize_t i = 0; made != NULL && i < done; i++) {
        PyObject *one = Py_BuildValue("(iiKKII)", m[i].fd, m[i].parent_fd,
                                      (unsigned long long)m[i].st.st_dev,
                                      (unsigned long long)m[i].st.st_ino,
                                      (unsigned)m[i].st.st_uid, (unsigned)m[i].st.st_gid);
        if (one == NULL) Py_CLEAR(made);
        else PyList_SET_ITEM(made, i, one);
    }
    if (made == NULL) { /* no answer to give: nothing stays open (the docstring's gap) */
        for (Py_ssize_t i = 0; i < done; i++) {
            close(m[i].fd);
            close(m[i].parent_fd);
        }
        return NULL;
    }
    return Py_BuildValue("(Ni)", made, err);
}

typedef struct {
    int fd, parent_fd;
    const char *name;
    unsigned long long dev, ino;
    unsigned int uid, gid;
} seal_t;

/* Seal one: 0 with *sealed set, or the errno. */
static int seal_one(const seal_t *s, uid_t owner_uid, gid_t owner_gid, int *sealed) {
    if ((s->uid != owner_uid || s->gid != owner_gid) && fchown(s->fd, owner_uid, owner_gid) < 0)
        return errno;
    int immutable = set_immutable(s->fd, 1);
    if (immutable < 0) return errno;
    struct stat there;
    *sealed = immutable && fstatat(s->parent_fd, s->name, &there, AT_SYMLINK_NOFOLLOW) == 0 &&
              (unsigned long long)there.st_dev == s->dev &&
              (unsigned long long)there.st_ino == s->ino;
    return 0;
}

static PyObject *seal(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *items;
    unsigned int owner_uid, owner_gid;
    seal_t s[MAX_BATCH];
    int sealed[MAX_BATCH];
    if (!PyArg_ParseTuple(args, "O!II", &PyTuple_Type, &items, &owner_uid, &owner_gid))
        return NULL;
    if (owner_uid == (unsigned)-1 || owner_gid == (unsigned)-1) { /* fchown's "leave it" */
        PyErr_SetString(PyExc_ValueError, "the owner's uid and gid must be real ids");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items), done = 0;
    if (n > MAX_BATCH) {
        PyErr_Format(PyExc_ValueError, "at most %d placeholders in one batch", MAX_BATCH);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyTuple_Check(PyTuple_GET_ITEM(items, i))) {
            PyErr_SetString(PyExc_TypeError, "an item is a tuple");
            return NULL;
        }
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(items, i),
                              "iiyKKII;an item is (fd, parent_fd, name, dev, ino, uid, gid)",
                              &s[i].fd, &s[i].parent_fd, &s[i].name, &s[i].dev, &s[i].ino,
                              &s[i].uid, &s[i].gid))
            return NULL;
    }
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; done < n; done++) {
        err = seal_one(&s[done], owner_uid, owner_gid, &sealed[done]);
        if (err != 0) break;
    }
    Py_END_ALLOW_THREADS
    PyObject *flags = PyList_New(done);
    if (flags == NULL) return NULL;
    for (Py_ssize_t i = 0; i < done; i++) PyList_SET_ITEM(flags, i, PyBool_FromLong(sealed[i]));
    return Py_BuildValue("(Ni)", flags, err);
}

typedef struct {
    const char *paths[2]; /* the staged one (or NULL), the host's */
    unsigned long long dev, ino;
    int status, value, which;
} removal_t;

typedef struct {
    const char *bytes[MAX_CONTENTS];
    Py_ssize_t len[MAX_CONTENTS];
    Py_ssize_t count;
} contents_t;

/* Whether the open file holds exactly one of the contents (read at most MAX_CONTENT + 1). */
static int holds_only(int fd, const struct stat *st, const contents_t *c, int *holds) {
    char buf[MAX_CONTENT + 1];
    *holds = 0;
    if (S_ISDIR(st->st_mode)) return (*holds = 1, 0); /* rmdir refuses one someone filled */
    if (!S_ISREG(st->st_mode) || st->st_size > MAX_CONTENT) return 0;
    ssize_t got;
    do got = pread(fd, buf, sizeof buf, 0);
    while (got < 0 && errno == EINTR);
    if (got < 0) return -1;
    for (Py_ssize_t i = 0; i < c->count; i++)
        if (c->len[i] == got && memcmp(c->bytes[i], buf, (size_t)got) == 0) *holds = 1;
    return 0;
}

/* One path of a placeholder: NOT_THERE, KEPT, REMOVED (*fd_out its fd) or ERROR (errno). */
static int remove_at(const char *path, const removal_t *r, const contents_t *c, int *fd_out) {
    struct stat st;
    if (lstat(path, &st) < 0) return errno == ENOENT || errno == ENOTDIR ? NOT_THERE : ERROR;
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) return NOT_THERE;
    int fd = open_at(AT_FDCWD, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0) return errno == ENOENT || errno == ENOTDIR ? NOT_THERE : ERROR;
    int holds, status;
    if (fstat(fd, &st) < 0) goto failed;
    if ((unsigned long long)st.st_dev != r->dev || (unsigned long long)st.st_ino != r->ino) {
        close(fd);
        return NOT_THERE;
    }
    if (holds_only(fd, &st, c, &holds) < 0) goto failed;
    if (!holds) {
        close(fd);
        return KEPT; /* someone filled it: theirs now */
    }
    if (set_immutable(fd, 0) < 0) goto failed;
    if ((S_ISDIR(st.st_mode) ? rmdir(path) : unlink(path)) < 0) goto failed;
    *fd_out = fd;
    return REMOVED;
failed:
    status = errno == ENOENT || errno == ENOTEMPTY ? KEPT : ERROR;
    close_keeping_errno(fd);
    return status;
}

static void remove_one(removal_t *r, const contents_t *c) {
    for (int which = r->paths[0] == NULL ? 1 : 0; which < 2; which++) {
        int fd = -1;
        r->status = remove_at(r->paths[which], r, c, &fd);
        r->value = r->status == REMOVED ? fd : r->status == ERROR ? errno : 0;
        r->which = which;
        if (r->status != NOT_THERE) return; /* the staged path was it: the host's is not tried */
    }
}

static PyObject *remove_batch(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *items, *allowed;
    removal_t r[MAX_BATCH];
    contents_t c;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &items, &PyTuple_Type, &allowed))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    c.count = PyTuple_GET_SIZE(allowed);
    if (n > MAX_BATCH || c.count > MAX_CONTENTS) {
        PyErr_Format(PyExc_ValueError, "at most %d placeholders and %d contents", MAX_BATCH,
                     MAX_CONTENTS);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < c.count; i++) {
        PyObject *one = PyTuple_GET_ITEM(allowed, i);
        if (!PyBytes_Check(one) || PyBytes_GET_SIZE(one) > MAX_CONTENT) {
            PyErr_Format(PyExc_ValueError, "a content is bytes of at most %d", MAX_CONTENT);
            return NULL;
        }
        c.bytes[i] = PyBytes_AS_STRING(one);
        c.len[i] = PyBytes_GET_SIZE(one);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyTuple_Check(PyTuple_GET_ITEM(items, i))) {
            PyErr_SetString(PyExc_TypeError, "an item is a tuple");
            return NULL;
        }
        PyObject *staged;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(items, i),
                              "OyKK;an item is (staged or None, path, dev, ino)", &staged,
                              &r[i].paths[1], &r[i].dev, &r[i].ino))
            return NULL;
        if (staged == Py_None) {
            r[i].paths[0] = NULL;
        } else if (PyBytes_Check(staged) &&
                   strlen(PyBytes_AS_STRING(staged)) == (size_t)PyBytes_GET_SIZE(staged)) {
            r[i].paths[0] = PyBytes_AS_STRING(staged);
        } else {
            PyErr_SetString(PyExc_ValueError, "a staged path is None or bytes without NUL");
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) remove_one(&r[i], &c);
    Py_END_ALLOW_THREADS
    PyObject *results = PyList_New(n);
    for (Py_ssize_t i = 0; results != NULL && i < n; i++) {
        PyObject *one = Py_BuildValue("(iii)", r[i].status, r[i].value, r[i].which);
        if (one == NULL) Py_CLEAR(results);
        else PyList_SET_ITEM(results, i, one);
    }
    if (results == NULL) /* the names are gone already; only the inodes' freeing is left */
        for (Py_ssize_t i = 0; i < n; i++)
            if (r[i].status == REMOVED) close(r[i].value);
    return results;
}

static PyMethodDef methods[] = {
    {"make", make, METH_VARARGS,
     "make(dir_fd, entries) -> (made, errno): see placeholder_calls.c's header."},
    {"seal", seal, METH_VARARGS,
     "seal(items, owner_uid, owner_gid) -> (sealed, errno): see placeholder_calls.c's header."},
    {"remove", remove_batch, METH_VARARGS,
     "remove(items, contents) -> [(status, value, which)]: see placeholder_calls.c's header."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "lnk_controller._placeholder_calls",
    "A write grant's placeholder syscalls in batches, the GIL released "
    "(lnk_controller/ext/placeholder_calls.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__placeholder_calls(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    static const struct {
        const char *name;
        int value;
    } constants[] = {
        {"NOT_THERE", NOT_THERE}, {"KEPT", KEPT},           {"REMOVED", REMOVED},
        {"ERROR", ERROR},         {"MAX_BATCH", MAX_BATCH}, {"MAX_CONTENT", MAX_CONTENT},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
