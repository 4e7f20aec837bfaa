/* Content-key chains of KV events in one call per event (see content_keys.py, which holds the
 * scheme and the pure-Python form this must equal; tests/core/test_chain_native.py compares
 * them). Built at install time when a compiler and xxhash.h are there; optional otherwise.
 *
 * event_chain(tokens, block_size, shape, ident, images) -> (states, shapes, keys)
 * u32_tokens(raw) -> bytes | None   msgpack array of ints in [0, 2^32) -> native u32 bytes
 * max_u32(tokens) -> int            largest id of a u32 buffer (0 when empty)
 * remove_blocks(blocks, block_images, image_blocks, hashes) -> (keys, removed, unknown)
 * add_images(block_images, image_blocks, hashes, images) -> None
 * images_of(extra_keys, image_refs) -> list | None   kv_events._images_of
 * (the last two: kv_index's bookkeeping of one event, in one call)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#define IMAGE_TOKEN 0xFFFFFFFFu

/* shape | ident << 64, the packed content state of an image-named block */
static PyObject *packed_state(uint64_t shape, uint64_t ident) {
    PyObject *lo = PyLong_FromUnsignedLongLong(shape);
    PyObject *hi = PyLong_FromUnsignedLongLong(ident);
    PyObject *bits = PyLong_FromLong(64);
    PyObject *shifted = NULL, *out = NULL;
    if (lo && hi && bits && (shifted = PyNumber_Lshift(hi, bits)))
        out = PyNumber_Or(shifted, lo);
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    Py_XDECREF(bits);
    Py_XDECREF(shifted);
    return out;
}

/* One image block: masked shape and identity steps; 0 on success. */
static int image_block(const uint32_t *block, Py_ssize_t bs, PyObject *refs, uint32_t *scratch,
                       uint64_t *shape, uint64_t *ident) {
    PyObject *seq = PySequence_Fast(refs, "image refs must be a sequence");
    if (!seq)
        return -1;
    Py_ssize_t nrefs = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int32_t offs_small[16];
    uint32_t run_small[16];
    int32_t *offs = offs_small;
    uint32_t *run = run_small;
    Py_ssize_t nrun = 0;
    int rc = -1;
    if (nrefs > 16) {
        offs = PyMem_Malloc(nrefs * sizeof(int32_t));
        run = PyMem_Malloc(nrefs * sizeof(uint32_t));
        if (!offs || !run) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < nrefs; i++) {
        PyObject *ref = PySequence_Fast(items[i], "an image ref must be a pair");
        if (!ref)
            goto done;
        if (PySequence_Fast_GET_SIZE(ref) != 2) {
            Py_DECREF(ref);
            PyErr_SetString(PyExc_ValueError, "an image ref must be a pair");
            goto done;
        }
        PyObject *off = PySequence_Fast_GET_ITEM(ref, 1);
        long long o = 0;
        if (off != Py_None) {
            o = PyLong_AsLongLong(off);
            if (o == -1 && PyErr_Occurred()) {
                Py_DECREF(ref);
                goto done;
            }
        }
        Py_DECREF(ref);
        long long pos = o > 0 ? o : 0;
        if (pos < bs) {
            uint32_t t = block[pos];
            Py_ssize_t k = 0;
            while (k < nrun && run[k] != t)
                k++;
            if (k == nrun)
                run[nrun++] = t;
        }
        if (o > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "image offset out of int32 range");
            goto done;
        }
        offs[i] = o > 0 ? (int32_t)o : -1; /* canonical_offset */
    }
    for (Py_ssize_t j = 0; j < bs; j++) {
        uint32_t t = block[j];
        for (Py_ssize_t k = 0; k < nrun; k++) {
            if (run[k] == t) {
                t = IMAGE_TOKEN;
                break;
            }
        }
        scratch[j] = t;
    }
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, *shape);
    XXH3_64bits_update(&st, scratch, (size_t)bs * 4);
    XXH3_64bits_update(&st, offs, (size_t)nrefs * 4);
    uint64_t new_shape = XXH3_64bits_digest(&st);
    XXH3_64bits_reset_withSeed(&st, *ident);
    for (Py_ssize_t i = 0; i < nrefs; i++) {
        PyObject *ref = PySequence_Fast(items[i], "an image ref must be a pair");
        if (!ref)
            goto done;
        Py_ssize_t len;
        const char *name = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(ref, 0), &len);
        Py_DECREF(ref);
        if (!name)
            goto done;
        if (i)
            XXH3_64bits_update(&st, "", 1);
        XXH3_64bits_update(&st, name, (size_t)len);
    }
    *ident = XXH3_64bits_digest(&st);
    *shape = new_shape;
    rc = 0;
done:
    if (offs != offs_small)
        PyMem_Free(offs);
    if (run != run_small)
        PyMem_Free(run);
    Py_DECREF(seq);
    return rc;
}

static PyObject *event_chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "event_chain(tokens, block_size, shape, ident, images)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *states = NULL, *shapes = NULL, *keys = NULL, *out = NULL;
    uint32_t *scratch = NULL;
    Py_ssize_t bs = PyLong_AsSsize_t(args[1]);
    uint64_t shape = PyLong_AsUnsignedLongLong(args[2]);
    uint64_t ident = PyLong_AsUnsignedLongLong(args[3]);
    PyObject *images = args[4];
    if (PyErr_Occurred())
        goto done;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block size must be positive");
        goto done;
    }
    const uint32_t *tokens = view.buf;
    Py_ssize_t n = view.len / 4 / bs;
    Py_ssize_t n_imgs = 0;
    if (images != Py_None) {
        n_imgs = PySequence_Size(images);
        if (n_imgs < 0)
            goto done;
    }
    shapes = PyList_New(n);
    if (!shapes)
        goto done;
    if (n_imgs == 0 && ident == 0) { /* text after text: the three chains coincide */
        for (Py_ssize_t b = 0; b < n; b++) {
            shape = XXH3_64bits_withSeed(tokens + b * bs, (size_t)bs * 4, shape);
            PyObject *v = PyLong_FromUnsignedLongLong(shape);
            if (!v)
                goto done;
            PyList_SET_ITEM(shapes, b, v);
        }
        out = PyTuple_Pack(3, shapes, shapes, shapes);
        goto done;
    }
    states = PyList_New(n);
    keys = PyList_New(n);
    scratch = PyMem_Malloc((size_t)bs * 4);
    if (!states || !keys || !scratch) {
        if (!scratch)
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t b = 0; b < n; b++) {
        const uint32_t *block = tokens + b * bs;
        int refs_true = 0;
        PyObject *refs = NULL;
        if (b < n_imgs) {
            refs = PySequence_GetItem(images, b);
            if (!refs)
                goto done;
            refs_true = PyObject_IsTrue(refs);
            if (refs_true < 0) {
                Py_DECREF(refs);
                goto done;
            }
        }
        if (refs_true) {
            int rc = image_block(block, bs, refs, scratch, &shape, &ident);
            Py_DECREF(refs);
            if (rc < 0)
                goto done;
        } else {
            Py_XDECREF(refs);
            shape = XXH3_64bits_withSeed(block, (size_t)bs * 4, shape);
        }
        PyObject *s = PyLong_FromUnsignedLongLong(shape);
        if (!s)
            goto done;
        PyList_SET_ITEM(shapes, b, s);
        if (ident == 0) {
            Py_INCREF(s);
            PyList_SET_ITEM(states, b, s);
            Py_INCREF(s);
            PyList_SET_ITEM(keys, b, s);
            continue;
        }
        PyObject *st = packed_state(shape, ident);
        if (!st)
            goto done;
        PyList_SET_ITEM(states, b, st);
        PyObject *k = PyLong_FromUnsignedLongLong(XXH3_64bits_withSeed(&shape, 8, ident));
        if (!k)
            goto done;
        PyList_SET_ITEM(keys, b, k);
    }
    out = PyTuple_Pack(3, states, shapes, keys);
done:
    PyBuffer_Release(&view);
    PyMem_Free(scratch);
    Py_XDECREF(states);
    Py_XDECREF(shapes);
    Py_XDECREF(keys);
    return out;
}

static PyObject *u32_tokens(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf, *end = p + view.len;
    PyObject *out = NULL;
    size_t n;
    if (p == end)
        goto none;
    if ((*p & 0xf0) == 0x90) {
        n = *p & 0x0f;
        p += 1;
    } else if (*p == 0xdc && end - p >= 3) {
        n = ((size_t)p[1] << 8) | p[2];
        p += 3;
    } else if (*p == 0xdd && end - p >= 5) {
        n = ((size_t)p[1] << 24) | ((size_t)p[2] << 16) | ((size_t)p[3] << 8) | p[4];
        p += 5;
    } else {
        goto none;
    }
    if (n > (size_t)(end - p)) /* every element takes at least one byte */
        goto none;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 4));
    if (!out)
        goto done;
    uint32_t *dst = (uint32_t *)PyBytes_AS_STRING(out);
    for (size_t i = 0; i < n; i++) {
        if (p >= end)
            goto bad;
        unsigned char c = *p;
        uint64_t v;
        int width;
        if (c < 0x80) {
            dst[i] = c;
            p += 1;
            continue;
        }
        switch (c) {
        case 0xcc: case 0xd0: width = 1; break;
        case 0xcd: case 0xd1: width = 2; break;
        case 0xce: case 0xd2: width = 4; break;
        case 0xcf: case 0xd3: width = 8; break;
        default: goto bad;
        }
        if (end - p < 1 + width)
            goto bad;
        v = 0;
        for (int k = 1; k <= width; k++)
            v = (v << 8) | p[k];
        if (c >= 0xd0 && (p[1] & 0x80)) /* a negative signed int */
            goto bad;
        if (v > 0xFFFFFFFFull)
            goto bad;
        dst[i] = (uint32_t)v;
        p += 1 + width;
    }
    if (p != end)
        goto bad;
    goto done;
bad:
    Py_CLEAR(out);
none:
    out = Py_None;
    Py_INCREF(out);
done:
    PyBuffer_Release(&view);
    return out;
}

static PyObject *max_u32(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint32_t *t = view.buf;
    Py_ssize_t n = view.len / 4;
    uint32_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (t[i] > m)
            m = t[i];
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(m);
}


/* dict.pop(key, <absent>): a new reference, NULL with no error when absent. */
static PyObject *pop_item(PyObject *dict, PyObject *key) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *out = NULL;
    return PyDict_Pop(dict, key, &out) < 0 ? NULL : out;
#else
    static PyObject *absent;
    if (!absent && !(absent = PyTuple_New(0)))
        return NULL;
    PyObject *out = _PyDict_Pop(dict, key, absent);
    if (out == absent) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
#endif
}

/* The content key of a packed state (content_keys.state_key); new reference. */
static PyObject *state_key_of(PyObject *st) {
    uint64_t shape = PyLong_AsUnsignedLongLongMask(st);
    if (shape == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    PyObject *bits = PyLong_FromLong(64);
    PyObject *hi = bits ? PyNumber_Rshift(st, bits) : NULL;
    Py_XDECREF(bits);
    if (!hi)
        return NULL;
    uint64_t ident = PyLong_AsUnsignedLongLong(hi);
    Py_DECREF(hi);
    if (ident == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    if (ident == 0)
        return PyLong_FromUnsignedLongLong(shape);
    return PyLong_FromUnsignedLongLong(XXH3_64bits_withSeed(&shape, 8, ident));
}

/* One block left: its images lose one resident block each (kv_index.forget_all_images). */
static int forget_block_images(PyObject *block_images, PyObject *image_blocks, PyObject *h) {
    PyObject *ids = pop_item(block_images, h);
    if (!ids)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyObject_IsTrue(ids)) {
        Py_DECREF(ids);
        return 0;
    }
    PyObject *seq = PySequence_Fast(ids, "image ids must be a sequence");
    if (!seq)
        goto fail;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *ident = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *cur = PyDict_GetItemWithError(image_blocks, ident);
        long left = -1;
        if (cur) {
            left = PyLong_AsLong(cur) - 1;
            if (left == -2 && PyErr_Occurred()) {
                Py_DECREF(seq);
                goto fail;
            }
        } else if (PyErr_Occurred()) {
            Py_DECREF(seq);
            goto fail;
        }
        int rc;
        if (left > 0) {
            PyObject *v = PyLong_FromLong(left);
            rc = v ? PyDict_SetItem(image_blocks, ident, v) : -1;
            Py_XDECREF(v);
        } else {
            rc = cur ? PyDict_DelItem(image_blocks, ident) : 0;
        }
        if (rc < 0) {
            Py_DECREF(seq);
            goto fail;
        }
    }
    Py_DECREF(seq);
    Py_DECREF(ids);
    return 0;
fail:
    Py_DECREF(ids);
    return -1;
}

/* remove_blocks(blocks, block_images, image_blocks, hashes) -> (keys, removed, unknown):
 * kv_index.ResidentIndex._remove without watermarks. */
static PyObject *remove_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "remove_blocks(blocks, block_images, image_blocks, hashes)");
        return NULL;
    }
    PyObject *blocks = args[0], *block_images = args[1], *image_blocks = args[2];
    PyObject *seq = PySequence_Fast(args[3], "hashes must be a sequence");
    if (!seq)
        return NULL;
    PyObject *keys = PyList_New(0);
    Py_ssize_t removed = 0, unknown = 0;
    if (!keys)
        goto fail;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *h = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *st = pop_item(blocks, h);
        if (!st) {
            if (PyErr_Occurred())
                goto fail;
            unknown++;
            continue;
        }
        removed++;
        if (st != Py_None) {
            PyObject *k;
            if (_PyLong_NumBits(st) <= 64) {
                k = st;
                Py_INCREF(k);
            } else {
                k = state_key_of(st);
            }
            int rc = k ? PyList_Append(keys, k) : -1;
            Py_XDECREF(k);
            if (rc < 0) {
                Py_DECREF(st);
                goto fail;
            }
        }
        Py_DECREF(st);
        if (PyDict_GET_SIZE(block_images) && forget_block_images(block_images, image_blocks, h) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    PyObject *out = Py_BuildValue("(Nnn)", keys, removed, unknown);
    return out;
fail:
    Py_DECREF(seq);
    Py_XDECREF(keys);
    return NULL;
}

/* add_images(block_images, image_blocks, hashes, images): the image bookkeeping of
 * kv_index.ResidentIndex._store for a whole event (no keep set). */
static PyObject *add_images(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "add_images(block_images, image_blocks, hashes, images)");
        return NULL;
    }
    PyObject *block_images = args[0], *image_blocks = args[1];
    PyObject *hs = PySequence_Fast(args[2], "hashes must be a sequence");
    if (!hs)
        return NULL;
    PyObject *ims = PySequence_Fast(args[3], "images must be a sequence");
    if (!ims) {
        Py_DECREF(hs);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hs);
    if (PySequence_Fast_GET_SIZE(ims) < n)
        n = PySequence_Fast_GET_SIZE(ims);
    PyObject *ids = PyTuple_New(0);
    PyObject *out = NULL;
    if (!ids)
        goto done;
    for (Py_ssize_t b = 0; b < n; b++) {
        PyObject *h = PySequence_Fast_GET_ITEM(hs, b);
        PyObject *refs = PySequence_Fast_GET_ITEM(ims, b);
        int truth = PyObject_IsTrue(refs);
        if (truth < 0)
            goto done;
        if (!truth)
            continue;
        int has = PyDict_Contains(block_images, h);
        if (has < 0)
            goto done;
        if (has)
            continue;
        PyObject *rs = PySequence_Fast(refs, "image refs must be a sequence");
        if (!rs)
            goto done;
        Py_ssize_t nr = PySequence_Fast_GET_SIZE(rs);
        PyObject *names = PyList_New(0);
        for (Py_ssize_t i = 0; names && i < nr; i++) {
            PyObject *name = PySequence_GetItem(PySequence_Fast_GET_ITEM(rs, i), 0);
            int dup = 0;
            if (!name) {
                Py_CLEAR(names);
                break;
            }
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(names) && !dup; j++) {
                dup = PyObject_RichCompareBool(PyList_GET_ITEM(names, j), name, Py_EQ);
                if (dup < 0)
                    Py_CLEAR(names);
            }
            if (names && !dup && PyList_Append(names, name) < 0)
                Py_CLEAR(names);
            Py_DECREF(name);
        }
        Py_DECREF(rs);
        if (!names)
            goto done;
        int same = PyTuple_GET_SIZE(ids) == PyList_GET_SIZE(names);
        for (Py_ssize_t j = 0; same > 0 && j < PyList_GET_SIZE(names); j++)
            same = PyObject_RichCompareBool(PyTuple_GET_ITEM(ids, j), PyList_GET_ITEM(names, j),
                                            Py_EQ);
        if (same < 0) {
            Py_DECREF(names);
            goto done;
        }
        if (!same) { /* an image's blocks share one tuple */
            Py_SETREF(ids, PyList_AsTuple(names));
            if (!ids) {
                Py_DECREF(names);
                goto done;
            }
        }
        Py_DECREF(names);
        if (PyDict_SetItem(block_images, h, ids) < 0)
            goto done;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(ids); j++) {
            PyObject *ident = PyTuple_GET_ITEM(ids, j);
            PyObject *cur = PyDict_GetItemWithError(image_blocks, ident);
            long count = 0;
            if (cur) {
                count = PyLong_AsLong(cur);
                if (count == -1 && PyErr_Occurred())
                    goto done;
            } else if (PyErr_Occurred()) {
                goto done;
            }
            PyObject *v = PyLong_FromLong(count + 1);
            int rc = v ? PyDict_SetItem(image_blocks, ident, v) : -1;
            Py_XDECREF(v);
            if (rc < 0)
                goto done;
        }
    }
    out = Py_None;
    Py_INCREF(out);
done:
    Py_XDECREF(ids);
    Py_DECREF(hs);
    Py_DECREF(ims);
    return out;
}

/* images_of(extra_keys, image_refs) -> list | None: kv_events._images_of, the common entry
 * [[identifier, offset]] read here, any other through ``image_refs``. */
static PyObject *images_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "images_of(extra_keys, image_refs)");
        return NULL;
    }
    PyObject *extra = args[0], *slow = args[1];
    if (!PyList_Check(extra))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(extra);
    PyObject *out = PyList_New(n);
    int any = 0;
    if (!out)
        return NULL;
    for (Py_ssize_t b = 0; b < n; b++) {
        PyObject *e = PyList_GET_ITEM(extra, b), *refs = NULL;
        if (e == Py_None) {
            refs = Py_None;
            Py_INCREF(refs);
        } else if (PyList_CheckExact(e) && PyList_GET_SIZE(e) == 1) {
            PyObject *item = PyList_GET_ITEM(e, 0);
            if (PyList_CheckExact(item) && PyList_GET_SIZE(item) == 2) {
                PyObject *name = PyList_GET_ITEM(item, 0), *off = PyList_GET_ITEM(item, 1);
                if (PyUnicode_CheckExact(name) && PyUnicode_IS_ASCII(name)
                        && PyLong_CheckExact(off)) {
                    int overflow;
                    long long o = PyLong_AsLongLongAndOverflow(off, &overflow);
                    if (!overflow && o >= -INT32_MAX && o <= INT32_MAX)
                        refs = Py_BuildValue("((OO))", name, off);
                }
            }
        }
        if (!refs && !PyErr_Occurred())
            refs = PyObject_CallOneArg(slow, e);
        if (!refs) {
            Py_DECREF(out);
            return NULL;
        }
        if (refs != Py_None) {
            int truth = PyObject_IsTrue(refs);
            if (truth < 0) {
                Py_DECREF(refs);
                Py_DECREF(out);
                return NULL;
            }
            any |= truth;
        }
        PyList_SET_ITEM(out, b, refs);
    }
    if (!any) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"event_chain", (PyCFunction)(void (*)(void))event_chain, METH_FASTCALL,
     "Per block of a BlockStored event: content state, shape key and content key."},
    {"u32_tokens", u32_tokens, METH_O,
     "Native u32 bytes of a msgpack array of ints in [0, 2^32); None for anything else."},
    {"max_u32", max_u32, METH_O, "The largest id of a u32 buffer (0 when empty)."},
    {"remove_blocks", (PyCFunction)(void (*)(void))remove_blocks, METH_FASTCALL,
     "Pop removed blocks: (content keys, removed, unknown); their images forgotten."},
    {"images_of", (PyCFunction)(void (*)(void))images_of, METH_FASTCALL,
     "Per block, the image refs of an event's extra_keys; None without any."},
    {"add_images", (PyCFunction)(void (*)(void))add_images, METH_FASTCALL,
     "Record the images of a stored event's blocks."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chain", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chain(void) { return PyModule_Create(&module); }
