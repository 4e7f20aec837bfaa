/* The router-log lines worth parsing, in one call per batch (see observed_logs.NOISE, the
 * regex this must equal; tests/core/test_noise_native.py compares them). Optional: built at
 * install time when a compiler is there, the regex serves otherwise.
 *
 * kept(lines, first, key, prefixes) -> list[(int, str)] | None
 *   each line (a str of the list) in which no occurrence of ``key`` is followed by one of
 *   ``prefixes`` (bytes), with its number (``first`` + its index); None when a line is no
 *   str or has no UTF-8 form (a lone surrogate): the caller reads that batch with the regex.
 *   The key and prefixes are ASCII, so a match in a line's UTF-8 bytes is one in its text.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <string.h>

static int is_noise(const char *s, Py_ssize_t n, const char *key, Py_ssize_t klen,
                    PyObject *prefixes) {
    Py_ssize_t np = PyTuple_GET_SIZE(prefixes);
    const char *end = s + n, *at = s;
    while (at < end) {
        const char *hit = memmem(at, (size_t)(end - at), key, (size_t)klen);
        if (hit == NULL)
            return 0;
        const char *after = hit + klen;
        for (Py_ssize_t i = 0; i < np; i++) {
            PyObject *p = PyTuple_GET_ITEM(prefixes, i);
            Py_ssize_t plen = PyBytes_GET_SIZE(p);
            if (end - after >= plen && memcmp(after, PyBytes_AS_STRING(p), (size_t)plen) == 0)
                return 1;
        }
        at = hit + 1; /* as a regex search: the next occurrence may start inside this one */
    }
    return 0;
}

static PyObject *kept(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[0]) || !PyBytes_Check(args[2]) ||
        !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "kept(lines: list, first: int, key: bytes, "
                                         "prefixes: tuple[bytes, ...])");
        return NULL;
    }
    PyObject *lines = args[0], *prefixes = args[3];
    Py_ssize_t first = PyLong_AsSsize_t(args[1]);
    if (first == -1 && PyErr_Occurred())
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(prefixes, i))) {
            PyErr_SetString(PyExc_TypeError, "prefixes must be bytes");
            return NULL;
        }
    }
    const char *key = PyBytes_AS_STRING(args[2]);
    Py_ssize_t klen = PyBytes_GET_SIZE(args[2]);
    if (klen == 0) {
        PyErr_SetString(PyExc_ValueError, "empty key");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(lines);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        if (!PyUnicode_CheckExact(line))
            goto fallback;
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(line, &len);
        if (s == NULL) {
            PyErr_Clear();
            goto fallback;
        }
        if (is_noise(s, len, key, klen, prefixes))
            continue;
        PyObject *num = PyLong_FromSsize_t(first + i);
        PyObject *pair = num ? PyTuple_Pack(2, num, line) : NULL;
        Py_XDECREF(num);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(pair);
    }
    return out;
fallback:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"kept", (PyCFunction)(void (*)(void))kept, METH_FASTCALL,
     "The (number, line) pairs of the lines that are not noise; None: use the regex."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lines", NULL, -1, methods};

PyMODINIT_FUNC PyInit__lines(void) { return PyModule_Create(&module); }
