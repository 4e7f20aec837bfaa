/* The kv_events rows of a list of KV events in one call (mmlens.store.writes.kv_row is the
 * reference: every row equals the one it gives, byte for byte; tests/core/test_kv_rows.py
 * compares them). The block hashes and content keys are written as msgpack the way msgspec
 * writes them; anything this does not take (a hex-string hash, a cleared event, an image
 * name JSON would escape, an int outside 64 bits, ...) is handed to ``fallback(ev)``, the
 * Python form, so its row (or its exception) is the reference's own.
 *
 * With ``bound`` true the rows are in the form SQLite's module binds cheapest
 * (writes.bound_row): blobs as bytearray, a NULL as '' (the statement turns '' back into NULL).
 *
 * kv_rows(events, stored_type, removed_type, fallback, bound) -> list of row tuples
 *
 * copy_binary(rows, types) -> bytes: the rows as a whole PostgreSQL binary COPY stream
 * (signature, tuples, trailer; the format of PostgreSQL's COPY documentation), one type code
 * per column: d float8, i int4, q int8, t text, b bytea; None is NULL. A value the column
 * cannot take raises (TypeError, OverflowError, UnicodeEncodeError) as psycopg's own
 * write_row does, so the caller's fallback is the same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../native/slot_attrs.h"

#define UNSUPPORTED 1 /* not an error: the event goes to the fallback */

typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Buf;

static int grow(Buf *b, Py_ssize_t add) {
    if (b->n + add <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + add)
        cap *= 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put(Buf *b, const void *src, Py_ssize_t n) {
    if (b->n + n > b->cap && grow(b, n) < 0)
        return -1;
    memcpy(b->p + b->n, src, n);
    b->n += n;
    return 0;
}

/* A one-byte marker then n big-endian bytes of v (n: 0, 1, 2, 4 or 8). */
static inline int put_be(Buf *b, uint8_t marker, uint64_t v, int n) {
    if (b->n + 9 > b->cap && grow(b, 9) < 0)
        return -1;
    uint8_t *out = (uint8_t *)b->p + b->n;
    out[0] = marker;
    switch (n) { /* unrolled: a loop over n was a third of the rows' CPU */
    case 8:
        out[1] = (uint8_t)(v >> 56), out[2] = (uint8_t)(v >> 48), out[3] = (uint8_t)(v >> 40);
        out[4] = (uint8_t)(v >> 32), out[5] = (uint8_t)(v >> 24), out[6] = (uint8_t)(v >> 16);
        out[7] = (uint8_t)(v >> 8), out[8] = (uint8_t)v;
        break;
    case 4:
        out[1] = (uint8_t)(v >> 24), out[2] = (uint8_t)(v >> 16), out[3] = (uint8_t)(v >> 8);
        out[4] = (uint8_t)v;
        break;
    case 2:
        out[1] = (uint8_t)(v >> 8), out[2] = (uint8_t)v;
        break;
    case 1:
        out[1] = (uint8_t)v;
        break;
    }
    b->n += 1 + n;
    return 0;
}

/* msgpack's smallest form of an int, as msgspec picks it. */
static inline int put_u64(Buf *b, uint64_t v) {
    if (v < 128)
        return put_be(b, (uint8_t)v, 0, 0);
    if (v < 256)
        return put_be(b, 0xcc, v, 1);
    if (v < 65536)
        return put_be(b, 0xcd, v, 2);
    if (v <= 0xffffffffu)
        return put_be(b, 0xce, v, 4);
    return put_be(b, 0xcf, v, 8);
}

static int put_i64(Buf *b, int64_t v) {
    if (v >= 0)
        return put_u64(b, (uint64_t)v);
    if (v >= -32)
        return put_be(b, (uint8_t)(v & 0xff), 0, 0);
    if (v >= -128)
        return put_be(b, 0xd0, (uint64_t)v & 0xff, 1);
    if (v >= -32768)
        return put_be(b, 0xd1, (uint64_t)v & 0xffff, 2);
    if (v >= -2147483648LL)
        return put_be(b, 0xd2, (uint64_t)v & 0xffffffffu, 4);
    return put_be(b, 0xd3, (uint64_t)v, 8);
}

static int put_array(Buf *b, Py_ssize_t n) {
    if (n < 16)
        return put_be(b, (uint8_t)(0x90 | n), 0, 0);
    if (n < 65536)
        return put_be(b, 0xdc, (uint64_t)n, 2);
    return put_be(b, 0xdd, (uint64_t)n, 4);
}

/* An exact int (not a bool) within [-2^63, 2^64). */
static int put_int(Buf *b, PyObject *o) {
    if (!PyLong_CheckExact(o))
        return UNSUPPORTED;
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    /* 3.11's digits read directly: block hashes are mostly above 2^63, where the public
     * calls overflow the signed conversion first and go through a byte array next */
    Py_ssize_t size = Py_SIZE(o);
    const digit *d = ((PyLongObject *)o)->ob_digit;
    if (size >= 0 && size <= 3 && (size < 3 || d[2] < 16)) {
        uint64_t v = 0;
        for (Py_ssize_t i = size - 1; i >= 0; i--)
            v = v << 30 | d[i];
        return put_u64(b, v);
    }
#endif
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (!overflow)
        return put_i64(b, v);
    if (overflow < 0)
        return UNSUPPORTED;
    unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return UNSUPPORTED;
    }
    return put_u64(b, u);
}

static int put_str(Buf *b, PyObject *o) {
    if (!PyUnicode_CheckExact(o))
        return UNSUPPORTED;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (!s) { /* a lone surrogate: msgspec's own error, from the fallback */
        PyErr_Clear();
        return UNSUPPORTED;
    }
    int rc;
    if (n < 32)
        rc = put_be(b, (uint8_t)(0xa0 | n), 0, 0);
    else if (n < 256)
        rc = put_be(b, 0xd9, (uint64_t)n, 1);
    else if (n < 65536)
        rc = put_be(b, 0xda, (uint64_t)n, 2);
    else
        rc = put_be(b, 0xdb, (uint64_t)n, 4);
    return rc ? rc : put(b, s, n);
}

/* A list or tuple of ints. */
static int put_ints(Buf *b, PyObject *seq) {
    if (!PyList_Check(seq) && !PyTuple_Check(seq))
        return UNSUPPORTED;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int rc = put_array(b, n);
    for (Py_ssize_t i = 0; !rc && i < n; i++)
        rc = put_int(b, items[i]);
    return rc;
}

/* One block's image refs: a tuple (or list) of (identifier, offset) tuples. */
static int put_refs(Buf *b, PyObject *refs) {
    if (!PyList_Check(refs) && !PyTuple_Check(refs))
        return UNSUPPORTED;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(refs);
    int rc = put_array(b, n);
    for (Py_ssize_t i = 0; !rc && i < n; i++) {
        PyObject *ref = PySequence_Fast_ITEMS(refs)[i];
        if (!PyList_Check(ref) && !PyTuple_Check(ref))
            return UNSUPPORTED;
        Py_ssize_t m = PySequence_Fast_GET_SIZE(ref);
        rc = put_array(b, m);
        for (Py_ssize_t j = 0; !rc && j < m; j++) {
            PyObject *v = PySequence_Fast_ITEMS(ref)[j];
            rc = v == Py_None ? put_be(b, 0xc0, 0, 0)
                 : PyUnicode_CheckExact(v) ? put_str(b, v) : put_int(b, v);
        }
    }
    return rc;
}

static PyObject *take(Buf *b, int bound) {
    return bound ? PyByteArray_FromStringAndSize(b->p, b->n)
                 : PyBytes_FromStringAndSize(b->p, b->n);
}

static int truth_of(PyObject *o) {
    return o == Py_None ? 0 : PyObject_IsTrue(o);
}

/* msgpack {"k": keys, "i": [[shape, key, refs] per image block], "e": prompt_end}
 * (availability.stored_content; "e" only when prompt_end is not None). */
static int put_stored_content(Buf *b, PyObject *keys, PyObject *shapes, PyObject *images,
                              PyObject *end) {
    if (!PyList_Check(keys) && !PyTuple_Check(keys))
        return UNSUPPORTED;
    int rc = put(b, end == Py_None ? "\x82\xa1k" : "\x83\xa1k", 3);
    if (rc || (rc = put_ints(b, keys)) || (rc = put(b, "\xa1i", 2)))
        return rc;
    int with_images = truth_of(images), with_shapes = with_images > 0 ? truth_of(shapes) : 0;
    if (with_images < 0 || with_shapes < 0)
        return -1;
    if (!with_images || !with_shapes) {
        rc = put_array(b, 0);
    } else {
        if ((!PyList_Check(shapes) && !PyTuple_Check(shapes))
                || (!PyList_Check(images) && !PyTuple_Check(images)))
            return UNSUPPORTED;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(shapes);
        if (PySequence_Fast_GET_SIZE(keys) < n)
            n = PySequence_Fast_GET_SIZE(keys);
        if (PySequence_Fast_GET_SIZE(images) < n)
            n = PySequence_Fast_GET_SIZE(images);
        PyObject **sh = PySequence_Fast_ITEMS(shapes), **ks = PySequence_Fast_ITEMS(keys),
                 **im = PySequence_Fast_ITEMS(images);
        Py_ssize_t count = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int t = truth_of(im[i]);
            if (t < 0)
                return -1;
            count += t;
        }
        rc = put_array(b, count);
        for (Py_ssize_t i = 0; !rc && i < n; i++) {
            if (truth_of(im[i]) <= 0) /* its error, if any, was raised counting them */
                continue;
            if (!(rc = put_array(b, 3)) && !(rc = put_int(b, sh[i])) && !(rc = put_int(b, ks[i])))
                rc = put_refs(b, im[i]);
        }
    }
    if (!rc && end != Py_None && !(rc = put(b, "\xa1" "e", 2)))
        rc = put_int(b, end);
    return rc;
}

/* JSON of the sorted distinct identifiers of an event's image refs, when each is printable
 * ASCII JSON writes as it is (no quote, backslash or control character). */
static int image_names(PyObject *images, PyObject **out) {
    if (!PyList_Check(images) && !PyTuple_Check(images))
        return UNSUPPORTED;
    /* the common case, one image over the event's blocks: one name, no set */
    PyObject *set = NULL, *sorted = NULL, *only = NULL;
    int rc = 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(images);
    for (Py_ssize_t i = 0; !rc && i < n; i++) {
        PyObject *refs = PySequence_Fast_ITEMS(images)[i];
        if (refs == Py_None)
            continue;
        if (!PyList_Check(refs) && !PyTuple_Check(refs)) {
            rc = UNSUPPORTED;
            break;
        }
        for (Py_ssize_t j = 0; !rc && j < PySequence_Fast_GET_SIZE(refs); j++) {
            PyObject *ref = PySequence_Fast_ITEMS(refs)[j];
            if ((!PyList_Check(ref) && !PyTuple_Check(ref)) || PySequence_Fast_GET_SIZE(ref) < 1
                    || !PyUnicode_CheckExact(PySequence_Fast_ITEMS(ref)[0]))
                rc = UNSUPPORTED;
            else {
                PyObject *name = PySequence_Fast_ITEMS(ref)[0];
                int same = !only ? 0 : name == only ? 1 : PyUnicode_Compare(name, only) == 0;
                if (!only)
                    only = name;
                else if (!same && !set && (!(set = PySet_New(NULL)) || PySet_Add(set, only) < 0))
                    rc = -1;
                if (!rc && set)
                    rc = PySet_Add(set, name);
            }
        }
    }
    if (!rc && !(sorted = set ? PySequence_List(set) : only ? PyList_New(1) : PyList_New(0)))
        rc = -1;
    if (!rc && !set && only) {
        Py_INCREF(only);
        PyList_SET_ITEM(sorted, 0, only);
    }
    if (!rc && PyList_Sort(sorted) < 0)
        rc = -1;
    Buf b = {0};
    if (!rc)
        rc = put(&b, "[", 1);
    for (Py_ssize_t i = 0; !rc && i < PyList_GET_SIZE(sorted); i++) {
        PyObject *s = PyList_GET_ITEM(sorted, i);
        if (!PyUnicode_IS_ASCII(s)) {
            rc = UNSUPPORTED;
            break;
        }
        const char *c = (const char *)PyUnicode_1BYTE_DATA(s);
        Py_ssize_t len = PyUnicode_GET_LENGTH(s);
        for (Py_ssize_t k = 0; k < len && !rc; k++)
            if (c[k] < 0x20 || c[k] == 0x7f || c[k] == '"' || c[k] == '\\')
                rc = UNSUPPORTED;
        if (!rc && i)
            rc = put(&b, ",", 1);
        if (!rc && !(rc = put(&b, "\"", 1)) && !(rc = put(&b, c, len)))
            rc = put(&b, "\"", 1);
    }
    if (!rc && !(rc = put(&b, "]", 1)) && !(*out = PyUnicode_FromStringAndSize(b.p, b.n)))
        rc = -1;
    PyMem_Free(b.p);
    Py_XDECREF(set);
    Py_XDECREF(sorted);
    return rc;
}

static PyObject *s_ts, *s_worker, *s_rank, *s_seq, *s_block_hashes, *s_parent, *s_images,
    *s_idx, *s_keys, *s_shapes, *s_prompt_end, *u_stored, *u_removed, *u_empty;

/* Each attribute's slot (mmlens/native/slot_attrs.h); removed events read the first ones. */
static SlotCache slots[11];

/* The row of one stored or removed event in *row; UNSUPPORTED leaves it NULL. */
static int event_row(PyObject *ev, int stored, int bound, Buf *b, PyObject **row) {
    enum { TS, WORKER, RANK, SEQ, HASHES, IDX, KEYS, PARENT, IMAGES, SHAPES, END, N };
    PyObject *a[N] = {0};
    PyObject *names[N] = {s_ts, s_worker, s_rank, s_seq, s_block_hashes, s_idx, s_keys,
                          s_parent, s_images, s_shapes, s_prompt_end};
    PyObject *hashes = NULL, *content = NULL, *parent = NULL, *imgs = NULL, *nb = NULL;
    int rc = 0, want = stored ? N : PARENT;
    for (int i = 0; i < want && !rc; i++)
        if (!(a[i] = get_slot(&slots[i], ev, names[i])))
            rc = -1;
    if (rc)
        goto done;
    b->n = 0;
    if ((rc = put_ints(b, a[HASHES])))
        goto done;
    if (!(hashes = take(b, bound)) || !(nb = PyLong_FromSsize_t(PySequence_Fast_GET_SIZE(a[HASHES])))) {
        rc = -1;
        goto done;
    }
    b->n = 0;
    int keyed = truth_of(a[KEYS]);
    if (keyed < 0) {
        rc = -1;
        goto done;
    }
    if (keyed) {
        if (stored)
            rc = put_stored_content(b, a[KEYS], a[SHAPES], a[IMAGES], a[END]);
        else if (!(rc = put(b, "\x81\xa1k", 3)))
            rc = put_ints(b, a[KEYS]);
        if (rc)
            goto done;
        if (!(content = take(b, bound))) {
            rc = -1;
            goto done;
        }
    }
    if (stored) {
        if (a[PARENT] != Py_None && !(parent = PyObject_Str(a[PARENT]))) {
            rc = -1;
            goto done;
        }
        int named = truth_of(a[IMAGES]);
        if (named < 0 || (named && (rc = image_names(a[IMAGES], &imgs)))) {
            rc = named < 0 ? -1 : rc;
            goto done;
        }
    }
    if (!(*row = PyTuple_New(11))) {
        rc = -1;
        goto done;
    }
    PyObject *items[11] = {a[TS], a[WORKER], a[RANK], a[SEQ], stored ? u_stored : u_removed,
                           nb, parent, hashes, imgs, a[IDX], content};
    PyObject *null = bound ? u_empty : Py_None;
    for (int i = 0; i < 11; i++) {
        PyObject *v = items[i] ? items[i] : null;
        if (i < 5 || i == 9 || !items[i])
            Py_INCREF(v); /* borrowed from the event, the kind, or the NULL */
        PyTuple_SET_ITEM(*row, i, v);
    }
    nb = parent = hashes = imgs = content = NULL; /* the row holds them */
done:
    for (int i = 0; i < N; i++)
        Py_XDECREF(a[i]);
    Py_XDECREF(hashes);
    Py_XDECREF(content);
    Py_XDECREF(parent);
    Py_XDECREF(imgs);
    Py_XDECREF(nb);
    return rc;
}

static PyObject *kv_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "kv_rows(events, stored_type, removed_type, fallback, bound)");
        return NULL;
    }
    PyObject *events = args[0], *stored_type = args[1], *removed_type = args[2],
             *fallback = args[3];
    int bound = PyObject_IsTrue(args[4]);
    if (bound < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(events);
    PyObject *out = PyList_New(n);
    Buf b = {0};
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *ev = PyList_GET_ITEM(events, i), *row = NULL;
        PyObject *type = (PyObject *)Py_TYPE(ev);
        int rc = UNSUPPORTED;
        if (type == stored_type || type == removed_type)
            rc = event_row(ev, type == stored_type, bound, &b, &row);
        if (rc == UNSUPPORTED)
            row = PyObject_CallOneArg(fallback, ev);
        if (rc < 0 || !row)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, row);
    }
    PyMem_Free(b.p);
    return out;
}

static inline int put_be32(Buf *b, uint32_t v) {
    uint8_t out[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    return put(b, out, 4);
}

static int copy_field(Buf *b, char type, PyObject *v) {
    if (v == Py_None)
        return put_be32(b, 0xffffffffu);
    if (type == 'd') {
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        uint64_t u;
        memcpy(&u, &d, 8);
        return put_be32(b, 8) || put_be32(b, (uint32_t)(u >> 32)) || put_be32(b, (uint32_t)u);
    }
    if (type == 'i' || type == 'q') {
        if (!PyLong_Check(v)) {
            PyErr_SetString(PyExc_TypeError, "copy_binary: an int column takes ints");
            return -1;
        }
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (type == 'i') {
            if (x < INT32_MIN || x > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "copy_binary: int out of int4 range");
                return -1;
            }
            return put_be32(b, 4) || put_be32(b, (uint32_t)x);
        }
        uint64_t u = (uint64_t)x;
        return put_be32(b, 8) || put_be32(b, (uint32_t)(u >> 32)) || put_be32(b, (uint32_t)u);
    }
    const char *data;
    Py_ssize_t n;
    if (type == 't' && PyUnicode_Check(v)) {
        if (!(data = PyUnicode_AsUTF8AndSize(v, &n)))
            return -1;
    } else if (type == 'b' && PyBytes_Check(v)) {
        data = PyBytes_AS_STRING(v);
        n = PyBytes_GET_SIZE(v);
    } else if (type == 'b' && PyByteArray_Check(v)) {
        data = PyByteArray_AS_STRING(v);
        n = PyByteArray_GET_SIZE(v);
    } else {
        PyErr_Format(PyExc_TypeError, "copy_binary: a %s column does not take %.50s",
                     type == 't' ? "text" : type == 'b' ? "bytea" : "?", Py_TYPE(v)->tp_name);
        return -1;
    }
    if (n > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "copy_binary: a value over 2 GiB");
        return -1;
    }
    return put_be32(b, (uint32_t)n) || put(b, data, n);
}

static PyObject *copy_binary(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyUnicode_Check(args[1])
            || !PyUnicode_IS_ASCII(args[1])) {
        PyErr_SetString(PyExc_TypeError, "copy_binary(rows: list, types: str)");
        return NULL;
    }
    PyObject *rows = args[0];
    const char *types = (const char *)PyUnicode_1BYTE_DATA(args[1]);
    Py_ssize_t ncols = PyUnicode_GET_LENGTH(args[1]);
    for (Py_ssize_t j = 0; j < ncols; j++)
        if (!strchr("diqtb", types[j]) || !types[j]) {
            PyErr_SetString(PyExc_ValueError, "copy_binary: type codes are d, i, q, t, b");
            return NULL;
        }
    if (ncols > 0x7fff) {
        PyErr_SetString(PyExc_ValueError, "copy_binary: too many columns");
        return NULL;
    }
    Buf b = {0};
    /* signature, flags (no OIDs), header extension length */
    int rc = put(&b, "PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0", 19);
    for (Py_ssize_t i = 0; !rc && i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != ncols) {
            PyErr_SetString(PyExc_TypeError, "copy_binary: each row a tuple, one per type");
            rc = -1;
            break;
        }
        uint8_t count[2] = {(uint8_t)(ncols >> 8), (uint8_t)ncols};
        rc = put(&b, count, 2);
        for (Py_ssize_t j = 0; !rc && j < ncols; j++)
            rc = copy_field(&b, types[j], PyTuple_GET_ITEM(row, j));
    }
    if (!rc)
        rc = put(&b, "\xff\xff", 2);
    PyObject *out = rc ? NULL : PyBytes_FromStringAndSize(b.p, b.n);
    PyMem_Free(b.p);
    return out;
}

static int intern_names(void) {
    struct { PyObject **p; const char *s; } names[] = {
        {&s_ts, "ts"}, {&s_worker, "worker"}, {&s_rank, "rank"}, {&s_seq, "seq"},
        {&s_block_hashes, "block_hashes"}, {&s_parent, "parent"}, {&s_images, "images"},
        {&s_idx, "idx"}, {&s_keys, "keys"}, {&s_shapes, "shapes"},
        {&s_prompt_end, "prompt_end"}, {&u_stored, "stored"}, {&u_removed, "removed"},
        {&u_empty, ""}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(*names[i].p = PyUnicode_InternFromString(names[i].s)))
            return -1;
    return 0;
}

static PyMethodDef methods[] = {
    {"kv_rows", (PyCFunction)(void (*)(void))kv_rows, METH_FASTCALL,
     "The kv_events rows of a list of KV events (writes.kv_row for each, in one call)."},
    {"copy_binary", (PyCFunction)(void (*)(void))copy_binary, METH_FASTCALL,
     "Rows as one PostgreSQL binary COPY stream (one type code per column: d i q t b)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kvrows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kvrows(void) {
    return intern_names() < 0 ? NULL : PyModule_Create(&module);
}
