/* json_scan_module.c: lnk_proxy._json_scan, the CPython module around json_scan.c's one pass
 * (scan(body, max_depth, max_values) -> (code, may_fetch)): arguments in, a tuple out, and the
 * pass's constants for strict_json and the tests. The pass itself is json_scan.c, no Python.
 * Also nesting_within, json_shape.depth_within's one-pass twin (below). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "json_scan.h"

/* The pass over a bytes-like argument: its code, may_fetch and the content's spans. */
static int run_scan(PyObject *args, int *code, int *may_fetch, json_span_t *spans, int *count) {
    Py_buffer body;
    int max_depth;
    long max_values;
    if (!PyArg_ParseTuple(args, "y*il", &body, &max_depth, &max_values)) return -1;
    if (max_depth < 1 || max_depth > MAX_LEVELS || body.len >= (Py_ssize_t)UINT32_MAX) {
        PyBuffer_Release(&body);
        PyErr_Format(PyExc_ValueError, "max_depth must be 1..%d and the body under 4 GiB",
                     MAX_LEVELS);
        return -1;
    }
    *may_fetch = 0;
    *code = json_scan(body.buf, (size_t)body.len, max_depth, max_values, may_fetch, spans, count);
    PyBuffer_Release(&body);
    return 0;
}

static PyObject *scan(PyObject *module, PyObject *args) {
    (void)module;
    json_span_t spans[4];
    int code, may_fetch, count;
    if (run_scan(args, &code, &may_fetch, spans, &count) < 0) return NULL;
    return Py_BuildValue("(iO)", code, may_fetch ? Py_True : Py_False);
}

/* scan, and the content members' spans: a tuple of (key index, start, end), or None when one
 * of them holds something judged (or the code is not OK). */
static PyObject *scan_content(PyObject *module, PyObject *args) {
    (void)module;
    json_span_t spans[4];
    int code, may_fetch, count;
    if (run_scan(args, &code, &may_fetch, spans, &count) < 0) return NULL;
    if (code != SCAN_OK || count < 0)
        return Py_BuildValue("(iOO)", code, may_fetch ? Py_True : Py_False, Py_None);
    PyObject *found = PyTuple_New(count);
    if (found == NULL) return NULL;
    for (int i = 0; i < count; i++) {
        PyObject *span = Py_BuildValue("(iII)", spans[i].key, spans[i].start, spans[i].end);
        if (span == NULL) {
            Py_DECREF(found);
            return NULL;
        }
        PyTuple_SET_ITEM(found, i, span);
    }
    return Py_BuildValue("(iON)", code, may_fetch ? Py_True : Py_False, found);
}

/* A tuple of the C strings names[0..count), or NULL with an exception set. */
static PyObject *names_tuple(const char *const *names, size_t count) {
    PyObject *tuple = PyTuple_New((Py_ssize_t)count);
    if (tuple == NULL) return NULL;
    for (size_t i = 0; i < count; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (name == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, (Py_ssize_t)i, name);
    }
    return tuple;
}

/* Whether a shape (json_shape: structural bytes outside strings) nests at most max_depth deep,
 * `{}` and `[]` as one kind and `:` ignored: True iff it is balanced, no deeper, and holds
 * nothing else. json_shape.depth_within answers the same with up to max_depth passes over the
 * shape; one pass here, so a body of a million brackets costs one read, not a thousand. */
static int nesting_within_c(const unsigned char *p, size_t n, long max_depth) {
    long depth = 0;
    for (size_t i = 0; i < n; i++) {
        switch (p[i]) {
        case '[':
        case '{':
            if (++depth > max_depth) return 0;
            break;
        case ']':
        case '}':
            if (depth-- == 0) return 0; /* a close with nothing open: never balanced */
            break;
        case ':':
            break;
        default:
            return 0; /* a byte no pass deletes: never empties */
        }
    }
    return depth == 0;
}

static PyObject *nesting_within(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer shape;
    long max_depth;
    if (!PyArg_ParseTuple(args, "y*l", &shape, &max_depth)) return NULL;
    int within = nesting_within_c(shape.buf, (size_t)shape.len, max_depth);
    PyBuffer_Release(&shape);
    return PyBool_FromLong(within);
}

static PyMethodDef methods[] = {
    {"nesting_within", nesting_within, METH_VARARGS,
     "nesting_within(shape, max_depth) -> bool: json_shape.depth_within in one pass."},
    {"scan", scan, METH_VARARGS,
     "scan(body, max_depth, max_values) -> (code, may_fetch): see json_scan.c's header."},
    {"scan_content", scan_content, METH_VARARGS,
     "scan_content(body, max_depth, max_values) -> (code, may_fetch, spans or None)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "lnk_proxy._json_scan",
    "The strict JSON pass before msgspec's parse (lnk_proxy/native/json_scan.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__json_scan(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    static const struct {
        const char *name;
        int value;
    } codes[] = {
        {"OK", SCAN_OK},
        {"NOT_JSON", SCAN_NOT_JSON},
        {"KEY_TWICE", SCAN_KEY_TWICE},
        {"TOO_DEEP", SCAN_TOO_DEEP},
        {"TOO_MANY", SCAN_TOO_MANY},
        {"LONE_SURROGATE", SCAN_LONE_SURROGATE},
        {"TOO_MANY_KEYS", SCAN_TOO_MANY_KEYS},
        {"MAX_LEVELS", MAX_LEVELS},
        {"MAX_KEYS", MAX_KEYS},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        if (PyModule_AddIntConstant(m, codes[i].name, codes[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    /* the counts are not constant expressions (extern): an initialiser cannot take them */
    const char *const list_names[] = {"FETCH_NAMES", "CONTENT_KEYS", "PLAIN_TYPES"};
    const char *const *lists[] = {JSON_SCAN_FETCH_NAMES, JSON_SCAN_CONTENT_KEYS,
                                  JSON_SCAN_PLAIN_TYPES};
    const size_t counts[] = {JSON_SCAN_FETCH_COUNT, JSON_SCAN_CONTENT_COUNT, JSON_SCAN_PLAIN_COUNT};
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        PyObject *names = names_tuple(lists[i], counts[i]);
        if (names == NULL || PyModule_AddObject(m, list_names[i], names) < 0) {
            Py_XDECREF(names);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
