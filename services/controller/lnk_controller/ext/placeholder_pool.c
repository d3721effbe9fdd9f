/* placeholder_pool.c: lnk_controller._placeholder_pool, a write grant's empty-folder placeholders
 * renamed in from a pool of the owner's and back, with the GIL released (placeholder_pool.py
 * keeps the pool and calls these; placeholder_make.py's making and placeholders.py's removal
 * use them where the pool is on the grant's own mount).
 *
 * Why: a write grant makes and frees ~49 empty folders a launch. On ext4 without a journal each
 * new inode is searched for past every inode its group freed in the last 30 s (ext4's
 * `recently_deleted`), and on a disk mounted `discard` each freed folder's block waits for the
 * device: the launches of a busy box make each other slower (bench/README, session 14). A rename
 * allocates and frees nothing.
 *
 *   take(dir_fd, pool_fd, entries) -> (made, errno, taken)
 *     entries as placeholder_calls.make's, each with a 4th element: the name of a folder in the
 *     pool (or None). With a pool name, the folder is walked to as make does (each step
 *     O_NOFOLLOW), then renameat2(pool_fd, pool_name, parent, name, RENAME_NOREPLACE), opened
 *     O_NOFOLLOW and made 0555; where the pool has no such folder or is on another mount
 *     (ENOENT, EXDEV), the folder is made as make does. Any other error stops the batch, as in
 *     make. The folder renamed in must be empty (its owner may have kept a descriptor on it in
 *     the pool and filled it): one that is not goes back into the pool and a folder is made.
 *     made and errno as make's; taken: one int per made entry, TAKEN (from the pool), DROPPED
 *     (its pool name found filled: not the pool's to lend again, left for the start's sweep
 *     to log) or MADE (not from the pool: its pool name, if any, is still the pool's).
 *   put_back(pool_fd, pool_uid, items) -> results
 *     items: a tuple of (path, dev, ino, pool_name): a placeholder's host path and inode. For
 *     each: its folder opened with openat2 RESOLVE_NO_SYMLINKS (no link anywhere on the path:
 *     root never renames through a folder someone swapped for a link); the name opened
 *     O_NOFOLLOW as a folder, and it must be (dev, ino), owned by pool_uid; FS_IMMUTABLE_FL
 *     cleared and the mode made 0700 (the owner's to rename again, under the owner's file ids);
 *     renameat2 into the pool as pool_name, RENAME_NOREPLACE; then the folder now in the pool
 *     must be that inode and empty, or it is renamed back where it was. results: one
 *     (status, errno) per item: POOLED; NOT_POOLED (nothing renamed: not ours, not a folder, a
 *     link on the path, another mount; the caller removes it as before, placeholder_calls'
 *     remove); KEPT (someone filled it or swapped it in the moment it was not immutable: it was
 *     renamed back and is theirs now); ERROR (it could not be renamed back: it stays in the pool
 *     as pool_name, errno why; the pool's sweep leaves a folder that is not empty where it is).
 *
 * The pool is a folder of the owner's (mode 0700) in a folder only root may enter
 * (placeholder_pool.py): no one but root reaches it by path, and a folder in it is only ever a
 * placeholder of that owner's, checked empty and its inode as it went in. take runs on the
 * calling thread under its file ids (the owner's, inside as_caller.caller_credentials), so the
 * kernel checks the owner may write the folder it lands in, as for a mkdir; put_back runs as
 * root.
 *
 * What this does NOT do: decide which names or which pool (the Python does); take a file
 * placeholder from the pool (those inside `.git` are files: made as make does); put back a
 * placeholder found only through its staged mount (another mount: NOT_POOLED, removed as before);
 * undo a take whose open fails after the rename (it is renamed back to the pool; if that fails,
 * the folder stays unrecorded under its name, as with make's mkdir then open).
 */
#define _GNU_SOURCE
#include "placeholder_syscalls.h"

#include <linux/openat2.h>
#include <stdio.h>
#include <sys/syscall.h>

enum { POOLED = 4, NOT_POOLED = 5 };
enum { MADE = 0, TAKEN = 1, DROPPED = 2 }; /* take's answer for each entry's pool name */

static int rename_at(int from_dir, const char *from, int to_dir, const char *to) {
    int r;
    do r = renameat2(from_dir, from, to_dir, to, RENAME_NOREPLACE);
    while (r < 0 && errno == EINTR);
    return r;
}

/* Whether the open folder holds nothing but "." and "..": 1, 0, or -1 with errno set. */
static int is_empty(int fd) {
    char buf[512];
    long got;
    do got = syscall(SYS_getdents64, fd, buf, sizeof buf);
    while (got < 0 && errno == EINTR);
    if (got < 0) return -1;
    for (long at = 0; at < got;) {
        const char *name = buf + at + 19; /* struct linux_dirent64: d_name after 19 bytes */
        unsigned short reclen;
        memcpy(&reclen, buf + at + 16, sizeof reclen);
        if (strcmp(name, ".") != 0 && strcmp(name, "..") != 0) return 0;
        at += reclen;
    }
    return 1; /* a folder's first read holds more than "." and ".." if it has more */
}

/* The entry renamed in from the pool, or made where the pool has no such folder here: 0 with
 * *out and *taken set, or the errno (all it opened closed again). */
static int take_one(int dir_fd, int pool_fd, const entry_t *e, made_t *out, int *taken) {
    int parent = walk_to(dir_fd, e), fd = -1, err;
    if (parent < 0) return errno;
    *taken = MADE;
    if (e->pool != NULL && e->content == NULL) {
        if (rename_at(pool_fd, e->pool, parent, e->name) == 0) {
            fd = open_at(parent, e->name, DIR_FLAGS, 0);
            if (fd < 0) {
                err = errno;
                rename_at(parent, e->name, pool_fd, e->pool); /* back; else the docstring's gap */
                close(parent);
                return err;
            }
            if (is_empty(fd) == 1) {
                (void)fchmod(fd, 0555); /* cosmetic: the immutable flag, set next, holds */
                *taken = TAKEN;
                return keep_made(parent, fd, out);
            }
            /* Filled in the pool (its owner kept a descriptor on it): back where it was, the
             * pool's name dropped, and a folder made. */
            close(fd);
            fd = -1;
            if (rename_at(parent, e->name, pool_fd, e->pool) != 0) {
                close_keeping_errno(parent);
                return errno;
            }
            *taken = DROPPED;
        } else if (errno != ENOENT && errno != EXDEV) {
            close_keeping_errno(parent);
            return errno;
        }
    }
    err = make_here(parent, e, &fd);
    if (err != 0) {
        close(parent);
        return err;
    }
    return keep_made(parent, fd, out);
}

static PyObject *take(PyObject *module, PyObject *args) {
    (void)module;
    int dir_fd, pool_fd;
    PyObject *entries;
    entry_t e[MAX_BATCH];
    made_t m[MAX_BATCH];
    int taken[MAX_BATCH];
    if (!PyArg_ParseTuple(args, "iiO!", &dir_fd, &pool_fd, &PyTuple_Type, &entries)) return NULL;
    Py_ssize_t n = read_entries(entries, e), done = 0;
    if (n < 0) return NULL;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; done < n; done++) {
        err = names_ok(&e[done]) ? take_one(dir_fd, pool_fd, &e[done], &m[done], &taken[done])
                                 : EINVAL;
        if (err != 0) break;
    }
    Py_END_ALLOW_THREADS
    PyObject *made = PyList_New(done), *flags = PyList_New(done);
    for (Py_ssize_t i = 0; made != NULL && flags != NULL && i < done; i++) {
        PyObject *one = Py_BuildValue("(iiKKII)", m[i].fd, m[i].parent_fd,
                                      (unsigned long long)m[i].st.st_dev,
                                      (unsigned long long)m[i].st.st_ino,
                                      (unsigned)m[i].st.st_uid, (unsigned)m[i].st.st_gid);
        if (one == NULL) Py_CLEAR(made);
        else PyList_SET_ITEM(made, i, one);
        PyList_SET_ITEM(flags, i, PyLong_FromLong(taken[i]));
    }
    if (made == NULL || flags == NULL) { /* no answer to give: nothing stays open */
        Py_XDECREF(made);
        Py_XDECREF(flags);
        for (Py_ssize_t i = 0; i < done; i++) {
            close(m[i].fd);
            close(m[i].parent_fd);
        }
        return NULL;
    }
    return Py_BuildValue("(NiN)", made, err, flags);
}

typedef struct {
    const char *path, *pool;
    unsigned long long dev, ino;
    int status, err;
} back_t;

static int same(const struct stat *st, const back_t *b) {
    return (unsigned long long)st->st_dev == b->dev && (unsigned long long)st->st_ino == b->ino;
}

/* Open the folder holding path, no link followed anywhere on it: the fd, or -1. */
static int open_folder_of(const char *path, const char **name) {
    const char *slash = strrchr(path, '/');
    char folder[4096];
    if (slash == NULL || slash == path || (size_t)(slash - path) >= sizeof folder)
        return errno = EINVAL, -1;
    memcpy(folder, path, (size_t)(slash - path));
    folder[slash - path] = '\0';
    *name = slash + 1;
    if (!one_name(*name)) return errno = EINVAL, -1;
    struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                           .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    long fd;
    do fd = syscall(SYS_openat2, AT_FDCWD, folder, &how, sizeof how);
    while (fd < 0 && errno == EINTR);
    return (int)fd;
}

static void put_back_one(int pool_fd, uid_t pool_uid, back_t *b) {
    const char *name;
    struct stat st;
    b->status = NOT_POOLED;
    b->err = 0;
    int parent = open_folder_of(b->path, &name);
    if (parent < 0) return;
    int fd = open_at(parent, name, DIR_FLAGS, 0);
    if (fd < 0) goto done;
    if (fstat(fd, &st) < 0 || !same(&st, b) || st.st_uid != pool_uid) goto done_fd;
    if (set_immutable(fd, 0) != 1 || fchmod(fd, 0700) < 0) goto done_fd;
    if (rename_at(parent, name, pool_fd, b->pool) < 0) goto done_fd;
    /* Renamed: is what went in the pool our placeholder, still empty? Not immutable for the
     * moment before the rename, its owner could have swapped or filled it. */
    int empty = is_empty(fd);
    if (fstatat(pool_fd, b->pool, &st, AT_SYMLINK_NOFOLLOW) == 0 && same(&st, b) && empty == 1) {
        b->status = POOLED;
        goto done_fd;
    }
    if (rename_at(pool_fd, b->pool, parent, name) == 0) {
        b->status = KEPT;
    } else {
        b->status = ERROR;
        b->err = errno;
    }
done_fd:
    close(fd);
done:
    close(parent);
}

static PyObject *put_back(PyObject *module, PyObject *args) {
    (void)module;
    int pool_fd;
    unsigned int pool_uid;
    PyObject *items;
    back_t b[MAX_BATCH];
    if (!PyArg_ParseTuple(args, "iIO!", &pool_fd, &pool_uid, &PyTuple_Type, &items)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (n > MAX_BATCH) {
        PyErr_Format(PyExc_ValueError, "at most %d placeholders in one batch", MAX_BATCH);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "an item is a tuple");
            return NULL;
        }
        Py_ssize_t path_len, pool_len;
        if (!PyArg_ParseTuple(item, "y#KKy#;an item is (path, dev, ino, pool_name)", &b[i].path,
                              &path_len, &b[i].dev, &b[i].ino, &b[i].pool, &pool_len))
            return NULL;
        if (strlen(b[i].path) != (size_t)path_len || strlen(b[i].pool) != (size_t)pool_len ||
            !one_name(b[i].pool)) {
            PyErr_SetString(PyExc_ValueError, "a path or pool name holds a NUL, or a pool name a /");
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) put_back_one(pool_fd, (uid_t)pool_uid, &b[i]);
    Py_END_ALLOW_THREADS
    PyObject *results = PyList_New(n);
    for (Py_ssize_t i = 0; results != NULL && i < n; i++) {
        PyObject *one = Py_BuildValue("(ii)", b[i].status, b[i].err);
        if (one == NULL) Py_CLEAR(results);
        else PyList_SET_ITEM(results, i, one);
    }
    return results;
}

static PyMethodDef methods[] = {
    {"take", take, METH_VARARGS,
     "take(dir_fd, pool_fd, entries) -> (made, errno, taken): see placeholder_pool.c's header."},
    {"put_back", put_back, METH_VARARGS,
     "put_back(pool_fd, pool_uid, items) -> [(status, errno)]: see placeholder_pool.c's header."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "lnk_controller._placeholder_pool",
    "A write grant's empty-folder placeholders renamed in from the owner's pool and back, the GIL "
    "released (lnk_controller/ext/placeholder_pool.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__placeholder_pool(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "POOLED", POOLED) < 0 ||
        PyModule_AddIntConstant(m, "NOT_POOLED", NOT_POOLED) < 0 ||
        PyModule_AddIntConstant(m, "KEPT", KEPT) < 0 ||
        PyModule_AddIntConstant(m, "ERROR", ERROR) < 0 ||
        PyModule_AddIntConstant(m, "MAX_BATCH", MAX_BATCH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
