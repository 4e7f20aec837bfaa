/* Records whose every field holds a value of its declared type: their JSON reads back under
 * the strict decode the readers use, so the write path need not decode it to know
 * (``typed_check.py`` builds the specs from the dataclasses' annotations; it stays the
 * judge of what may be skipped: tests/core/test_typed_check.py holds that a record this
 * passes reads back, for random records).
 *
 * setup(specs: dict[type, tuple[(field, kind), ...]]) -> None
 * all_typed(records: list) -> bool    every record of a spec'd type, each field as declared
 * setup_compact(omits: dict[type, tuple[(field, omit), ...]]) -> None
 * compact(records: list) -> list      each record as a dict of its fields, less those at
 *                                      their default (omit 1: None, 2: an empty list)
 *
 * A kind is (code, arg): the codes below; arg a frozenset of the allowed strings (LITERAL),
 * the item's kind (LIST, DICT_STR), the record's type (RECORD), a tuple of kinds (UNION), or
 * None.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

enum { STR = 1, INT, FLOAT, BOOL, LITERAL, LIST, DICT_STR, RECORD, ANY, UNION };
#define OPTIONAL 32 /* or'ed with a code: None too */
#define MAX_DEPTH 16

static PyObject *specs; /* type -> tuple of (offset, name, code, arg) */

static int typed(PyObject *v, long code, PyObject *arg, int depth);

static int record_typed(PyObject *o, int depth) {
    PyObject *spec = PyDict_GetItemWithError(specs, (PyObject *)Py_TYPE(o));
    if (spec == NULL)
        return PyErr_Occurred() ? -1 : 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(spec); i++) {
        PyObject *f = PyTuple_GET_ITEM(spec, i);
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(f, 0));
        PyObject *v = *(PyObject **)((char *)o + off);
        if (v == NULL) /* an unset slot: no JSON of it */
            return 0;
        int r = typed(v, PyLong_AsLong(PyTuple_GET_ITEM(f, 2)), PyTuple_GET_ITEM(f, 3), depth);
        if (r <= 0)
            return r;
    }
    return 1;
}

/* An int msgspec writes and reads back as one: -2^63 <= v < 2^64 */
static int int_in_range(PyObject *v) {
    int overflow = 0;
    (void)PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0)
        return 1;
    if (overflow < 0)
        return 0;
    (void)PyLong_AsUnsignedLongLong(v);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static int typed(PyObject *v, long code, PyObject *arg, int depth) {
    if (depth > MAX_DEPTH)
        return 0;
    if (v == Py_None)
        return (code & OPTIONAL) != 0;
    switch (code & ~OPTIONAL) {
    case STR:
        return PyUnicode_Check(v);
    case INT:
        return PyLong_CheckExact(v) && int_in_range(v);
    case FLOAT: /* a float, or an int read as one */
        return PyFloat_CheckExact(v) || (PyLong_CheckExact(v) && int_in_range(v));
    case BOOL:
        return PyBool_Check(v);
    case LITERAL:
        return PyUnicode_CheckExact(v) ? PySet_Contains(arg, v) : 0;
    case LIST: {
        if (!PyList_CheckExact(v))
            return 0;
        long item = PyLong_AsLong(PyTuple_GET_ITEM(arg, 0));
        PyObject *item_arg = PyTuple_GET_ITEM(arg, 1);
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
            int r = typed(PyList_GET_ITEM(v, i), item, item_arg, depth + 1);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    case DICT_STR: {
        if (!PyDict_CheckExact(v))
            return 0;
        long item = PyLong_AsLong(PyTuple_GET_ITEM(arg, 0));
        PyObject *item_arg = PyTuple_GET_ITEM(arg, 1), *k, *x;
        Py_ssize_t pos = 0;
        while (PyDict_Next(v, &pos, &k, &x)) {
            if (!PyUnicode_CheckExact(k))
                return 0;
            int r = typed(x, item, item_arg, depth + 1);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    case RECORD:
        return Py_IS_TYPE(v, (PyTypeObject *)arg) ? record_typed(v, depth + 1) : 0;
    case ANY: /* what msgspec writes of it decodes as Any; what it cannot write fails there */
        return 1;
    case UNION: /* one of the kinds (of distinct JSON types, as msgspec's unions are) */
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(arg); i++) {
            PyObject *alt = PyTuple_GET_ITEM(arg, i);
            int r = typed(v, PyLong_AsLong(PyTuple_GET_ITEM(alt, 0)), PyTuple_GET_ITEM(alt, 1),
                          depth + 1);
            if (r != 0)
                return r;
        }
        return 0;
    default:
        return 0;
    }
}

static PyObject *all_typed(PyObject *self, PyObject *records) {
    if (specs == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_typed.setup() was not called");
        return NULL;
    }
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "all_typed(records: list)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        int r = record_typed(PyList_GET_ITEM(records, i), 0);
        if (r < 0)
            return NULL;
        if (r == 0)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* given: type -> ((field name, ...), ...) -> type -> ((slot offset, interned name, ...), ...)
 * (NULL and an error unless every field is a slot of its slots dataclass) */
static PyObject *slot_specs(PyObject *given) {
    if (!PyDict_Check(given)) {
        PyErr_SetString(PyExc_TypeError, "setup: a dict of specs");
        return NULL;
    }
    PyObject *out = PyDict_New(), *type, *fields;
    Py_ssize_t pos = 0;
    if (out == NULL)
        return NULL;
    while (PyDict_Next(given, &pos, &type, &fields)) {
        if (!PyType_Check(type) || !PyTuple_Check(fields))
            goto bad;
        PyObject *spec = PyTuple_New(PyTuple_GET_SIZE(fields));
        if (spec == NULL || PyDict_SetItem(out, type, spec) < 0) {
            Py_XDECREF(spec);
            goto fail;
        }
        Py_DECREF(spec);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); i++) {
            PyObject *given_f = PyTuple_GET_ITEM(fields, i);
            if (!PyTuple_Check(given_f) || PyTuple_GET_SIZE(given_f) < 1 ||
                !PyUnicode_CheckExact(PyTuple_GET_ITEM(given_f, 0)))
                goto bad;
            PyObject *name = PyTuple_GET_ITEM(given_f, 0);
            PyObject *descr = PyDict_GetItemWithError(((PyTypeObject *)type)->tp_dict, name);
            if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
                ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX)
                goto bad;
            Py_ssize_t n = PyTuple_GET_SIZE(given_f);
            PyObject *f = PyTuple_New(n + 1);
            if (f == NULL)
                goto fail;
            PyTuple_SET_ITEM(spec, i, f);
            PyObject *off = PyLong_FromSsize_t(((PyMemberDescrObject *)descr)->d_member->offset);
            if (off == NULL)
                goto fail;
            PyTuple_SET_ITEM(f, 0, off);
            Py_INCREF(name);
            PyUnicode_InternInPlace(&name);
            PyTuple_SET_ITEM(f, 1, name);
            for (Py_ssize_t k = 1; k < n; k++)
                PyTuple_SET_ITEM(f, k + 1, Py_NewRef(PyTuple_GET_ITEM(given_f, k)));
        }
    }
    return out;
bad:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "setup: specs of slots dataclasses' fields");
fail:
    Py_DECREF(out);
    return NULL;
}

/* specs: type -> ((field name, code, arg), ...) */
static PyObject *setup(PyObject *self, PyObject *given) {
    PyObject *out = slot_specs(given);
    if (out == NULL)
        return NULL;
    Py_XSETREF(specs, out);
    Py_RETURN_NONE;
}

static PyObject *omits; /* type -> tuple of (offset, interned name, omit) */

enum { KEEP = 0, OMIT_NONE = 1, OMIT_EMPTY_LIST = 2 };

static PyObject *compact_one(PyObject *o) {
    PyObject *spec = PyDict_GetItemWithError(omits, (PyObject *)Py_TYPE(o));
    if (spec == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "compact: a record of a type not set up");
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(spec); i++) {
        PyObject *f = PyTuple_GET_ITEM(spec, i);
        PyObject *v = *(PyObject **)((char *)o + PyLong_AsSsize_t(PyTuple_GET_ITEM(f, 0)));
        long omit = PyLong_AsLong(PyTuple_GET_ITEM(f, 2));
        if (v == NULL) { /* an unset slot: as msgspec, nothing written */
            continue;
        }
        if ((omit == OMIT_NONE && v == Py_None) ||
            (omit == OMIT_EMPTY_LIST && PyList_CheckExact(v) && PyList_GET_SIZE(v) == 0))
            continue;
        if (PyDict_SetItem(out, PyTuple_GET_ITEM(f, 1), v) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *compact(PyObject *self, PyObject *records) {
    if (omits == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_typed.setup_compact() was not called");
        return NULL;
    }
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "compact(records: list)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = compact_one(PyList_GET_ITEM(records, i));
        if (d == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, d);
    }
    return out;
}

/* omits: type -> ((field name, omit), ...) of every field, in the order written */
static PyObject *setup_compact(PyObject *self, PyObject *given) {
    PyObject *out = slot_specs(given);
    if (out == NULL)
        return NULL;
    Py_XSETREF(omits, out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)setup, METH_O, "The records' field kinds."},
    {"all_typed", (PyCFunction)all_typed, METH_O,
     "True when every record holds values of its fields' declared types."},
    {"setup_compact", (PyCFunction)setup_compact, METH_O, "The records' omittable fields."},
    {"compact", (PyCFunction)compact, METH_O,
     "Each record as a dict of its fields, less those at their default."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_typed", NULL, -1, methods};

PyMODINIT_FUNC PyInit__typed(void) { return PyModule_Create(&module); }
