/* Content-key chains of KV events in one call per event (see content_keys.py, which holds the
 * scheme and the pure-Python form this must equal; tests/core/test_chain_native.py compares
 * them). Built at install time when a compiler and xxhash.h are there; optional otherwise.
 *
 * event_chain(tokens, block_size, shape, ident, images) -> (states, shapes, keys)
 * u32_tokens(raw) -> bytes | None   msgpack array of ints in [0, 2^32) -> native u32 bytes
 * max_u32(tokens) -> int            largest id of a u32 buffer (0 when empty)
 * BlockTable: a worker's resident blocks (store and remove an event in one call)
 * apply_events(res, events, start, pad_images, to_u32) -> int   a run of one stream's events
 * add_images(block_images, image_blocks, hashes, images) -> None
 * images_of(extra_keys, image_refs) -> list | None   kv_events._images_of
 * (the last two: kv_index's bookkeeping of one event, in one call)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../native/msgpack_ints.h"
#include "../native/slot_attrs.h"

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

/* The chain over blocks [0, n) of an event from (*shape, *ident): each block's shape and
 * identity into shapes[b], idents[b] (left at their last values in *shape, *ident); 0 on
 * success. ``images``: a sequence of per-block refs or None. */
static int chain_blocks(const uint32_t *tokens, Py_ssize_t n, Py_ssize_t bs, PyObject *images,
                        uint64_t *shape, uint64_t *ident, uint64_t *shapes, uint64_t *idents) {
    Py_ssize_t n_imgs = 0;
    if (images != Py_None) {
        n_imgs = PySequence_Size(images);
        if (n_imgs < 0)
            return -1;
    }
    uint64_t sh = *shape, id = *ident;
    if (n_imgs == 0) {
        for (Py_ssize_t b = 0; b < n; b++) {
            sh = XXH3_64bits_withSeed(tokens + b * bs, (size_t)bs * 4, sh);
            shapes[b] = sh;
            idents[b] = id;
        }
        *shape = sh;
        return 0;
    }
    uint32_t *scratch = PyMem_Malloc((size_t)bs * 4);
    if (!scratch) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = 0;
    for (Py_ssize_t b = 0; b < n && rc == 0; b++) {
        const uint32_t *block = tokens + b * bs;
        int refs_true = 0;
        PyObject *refs = NULL;
        if (b < n_imgs) {
            refs = PySequence_GetItem(images, b);
            if (!refs) {
                rc = -1;
                break;
            }
            refs_true = PyObject_IsTrue(refs);
            if (refs_true < 0) {
                Py_DECREF(refs);
                rc = -1;
                break;
            }
        }
        if (refs_true)
            rc = image_block(block, bs, refs, scratch, &sh, &id);
        else
            sh = XXH3_64bits_withSeed(block, (size_t)bs * 4, sh);
        Py_XDECREF(refs);
        shapes[b] = sh;
        idents[b] = id;
    }
    PyMem_Free(scratch);
    *shape = sh;
    *ident = id;
    return rc;
}

/* The content key of a block from its two chains (content_keys.combine). */
static inline uint64_t combined(uint64_t shape, uint64_t ident) {
    return ident == 0 ? shape : XXH3_64bits_withSeed(&shape, 8, ident);
}

static PyObject *u64_list(const uint64_t *values, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(values[i]);
        if (!v)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, v);
    }
    return out;
}

/* Shape and content-key lists of n blocks (one list object twice when every block is text
 * after text: then the two coincide, and with the states). */
static PyObject *shapes_and_keys(const uint64_t *shapes, const uint64_t *idents, Py_ssize_t n,
                                 PyObject **keys_out) {
    PyObject *sh = u64_list(shapes, n);
    if (!sh)
        return NULL;
    int texts = 1;
    for (Py_ssize_t b = 0; b < n && texts; b++)
        texts = idents[b] == 0;
    if (texts) {
        Py_INCREF(sh);
        *keys_out = sh;
        return sh;
    }
    PyObject *keys = PyList_New(n);
    if (!keys) {
        Py_DECREF(sh);
        return NULL;
    }
    for (Py_ssize_t b = 0; b < n; b++) {
        PyObject *k;
        if (idents[b] == 0) {
            k = PyList_GET_ITEM(sh, b);
            Py_INCREF(k);
        } else if (!(k = PyLong_FromUnsignedLongLong(combined(shapes[b], idents[b])))) {
            Py_DECREF(sh);
            Py_DECREF(keys);
            return NULL;
        }
        PyList_SET_ITEM(keys, b, k);
    }
    *keys_out = keys;
    return sh;
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
    uint64_t *buf = NULL;
    Py_ssize_t bs = PyLong_AsSsize_t(args[1]);
    uint64_t shape = PyLong_AsUnsignedLongLong(args[2]);
    uint64_t ident = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        goto done;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block size must be positive");
        goto done;
    }
    Py_ssize_t n = view.len / 4 / bs;
    buf = PyMem_Malloc((size_t)(2 * n + 1) * sizeof(uint64_t));
    if (!buf) {
        PyErr_NoMemory();
        goto done;
    }
    if (chain_blocks(view.buf, n, bs, args[4], &shape, &ident, buf, buf + n) < 0)
        goto done;
    shapes = shapes_and_keys(buf, buf + n, n, &keys);
    if (!shapes)
        goto done;
    if (keys == shapes) { /* text after text: the three chains coincide */
        out = PyTuple_Pack(3, shapes, shapes, shapes);
        goto done;
    }
    states = PyList_New(n);
    for (Py_ssize_t b = 0; states && b < n; b++) {
        PyObject *st;
        if (buf[n + b] == 0) {
            st = PyList_GET_ITEM(shapes, b);
            Py_INCREF(st);
        } else if (!(st = packed_state(buf[b], buf[n + b]))) {
            Py_CLEAR(states);
            break;
        }
        PyList_SET_ITEM(states, b, st);
    }
    if (states)
        out = PyTuple_Pack(3, states, shapes, keys);
done:
    PyBuffer_Release(&view);
    PyMem_Free(buf);
    Py_XDECREF(states);
    Py_XDECREF(shapes);
    Py_XDECREF(keys);
    return out;
}

static PyObject *u32_tokens(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *p = view.buf, *end = p + view.len;
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
    if (read_u32s(&p, end, n, dst) < 0)
        goto bad;
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

/* count(image_blocks, ids, n) after the blocks of an event so far; failed: an error is set
 * already, kept as it is (the count is still taken, its own error dropped). */
static int take_count(int (*count)(PyObject *, PyObject *, Py_ssize_t), PyObject *image_blocks,
                      PyObject *ids, Py_ssize_t n, int failed) {
    if (!failed)
        return count(image_blocks, ids, n);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (count(image_blocks, ids, n) < 0)
        PyErr_Clear();
    PyErr_Restore(et, ev, tb);
    return -1;
}

/* n blocks of the images ids left: each image loses n resident blocks
 * (kv_index.forget_all_images, for a run of blocks sharing their ids). */
static int uncount_images(PyObject *image_blocks, PyObject *ids, Py_ssize_t n) {
    if (!ids || !n)
        return 0;
    PyObject *seq = PySequence_Fast(ids, "image ids must be a sequence");
    if (!seq)
        return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *ident = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *cur = PyDict_GetItemWithError(image_blocks, ident);
        long left = -1;
        if (cur) {
            left = PyLong_AsLong(cur);
            if (left == -1 && PyErr_Occurred())
                goto fail;
            left -= (long)n;
        } else if (PyErr_Occurred()) {
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
        if (rc < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
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

/* ---- BlockTable: a worker's resident blocks, block hash -> content state --------------------
 * An open-addressing table of u64 keys (linear probing, no tombstones) holding each block's state
 * as its two 64-bit chains, or "unknown" (None in Python: its chain reaches a block never seen).
 * It reads and writes as a mapping of ints (a state is shape | ident << 64), and stores and
 * removes a whole event's blocks in one call with no int object per block. */

enum { EMPTY = 0, KNOWN = 1, UNKNOWN = 2 };

typedef struct {
    uint64_t key, shape, ident;
    uint32_t flag;
    uint32_t imgs; /* it may be in the worker's block_images (mark_images): look it up there */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t cap;  /* a power of two, or 0 */
    size_t used; /* KNOWN or UNKNOWN slots */
} Table;

static PyTypeObject TableType;

static inline size_t slot_of(uint64_t key, size_t cap) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

/* The slot holding key, or NULL. */
static Slot *find(Table *t, uint64_t key) {
    if (!t->cap)
        return NULL;
    for (size_t i = slot_of(key, t->cap);; i = (i + 1) & (t->cap - 1)) {
        Slot *s = &t->slots[i];
        if (s->flag == EMPTY)
            return NULL;
        if (s->key == key)
            return s;
    }
}

/* Zeroed slots. A table of a resident index (tens of MB) is touched at random, a block at a
 * time: on 4 KiB pages nearly every lookup misses the TLB as well as the cache, so a large
 * one asks for transparent huge pages (where the kernel leaves them to madvise). */
#define HUGE_PAGE ((size_t)2 << 20)
static Slot *new_slots(size_t cap) {
    size_t bytes = cap * sizeof(Slot);
    void *p = NULL;
    if (bytes >= HUGE_PAGE) {
        bytes = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        if (posix_memalign(&p, HUGE_PAGE, bytes) != 0)
            return NULL;
#ifdef MADV_HUGEPAGE
        madvise(p, bytes, MADV_HUGEPAGE);
#endif
    } else if (posix_memalign(&p, 64, bytes) != 0) {
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

static int resize(Table *t, size_t want) {
    size_t cap = 16;
    while (cap < want * 2)
        cap <<= 1;
    Slot *slots = new_slots(cap);
    if (!slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < t->cap; i++) {
        Slot *s = &t->slots[i];
        if (s->flag != EMPTY) {
            size_t j = slot_of(s->key, cap);
            while (slots[j].flag != EMPTY)
                j = (j + 1) & (cap - 1);
            slots[j] = *s;
        }
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* Write key's state (flag KNOWN or UNKNOWN); 0 on success. */
static int put(Table *t, uint64_t key, uint32_t flag, uint64_t shape, uint64_t ident) {
    if ((t->used + 1) * 10 >= t->cap * 7 && resize(t, t->used + 1) < 0)
        return -1;
    for (size_t i = slot_of(key, t->cap);; i = (i + 1) & (t->cap - 1)) {
        Slot *s = &t->slots[i];
        if (s->flag == EMPTY) {
            s->key = key;
            s->imgs = 0;
            t->used++;
            s->flag = flag;
            s->shape = shape;
            s->ident = ident;
            return 0;
        }
        if (s->key == key) {
            s->flag = flag;
            s->shape = shape;
            s->ident = ident;
            return 0;
        }
    }
}

/* Remove s's key. The keys probed past it move back into the hole (linear probing's deletion
 * without tombstones): with tombstones, a resident index whose blocks come and go was rebuilt
 * whenever they filled it (a fresh 32 MB table zeroed and refilled at 400k blocks, ~6 % of the
 * ingest's CPU), and lookups stepped over them. A key stays where it is when its home slot
 * lies cyclically in (hole, its slot]: moving it before its home would hide it. */
static inline void drop(Table *t, Slot *s) {
    size_t mask = t->cap - 1, hole = (size_t)(s - t->slots);
    for (size_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
        Slot *next = &t->slots[j];
        if (next->flag == EMPTY)
            break;
        size_t home = slot_of(next->key, t->cap);
        if (hole <= j ? (home > hole && home <= j) : (home > hole || home <= j))
            continue;
        t->slots[hole] = *next;
        hole = j;
    }
    memset(&t->slots[hole], 0, sizeof(Slot));
    t->used--;
}

/* A block hash from Python: 0 on success; 1 (no error set) when it is not an int in
 * [0, 2^64), unless strict, when that raises. */
static int key_of(PyObject *obj, uint64_t *key, int strict) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    /* 3.11's digits read directly (as _kvrows.c does): most block hashes are above 2^63,
     * where PyLong_AsUnsignedLongLong goes through a byte array */
    if (PyLong_CheckExact(obj)) {
        Py_ssize_t size = Py_SIZE(obj);
        const digit *d = ((PyLongObject *)obj)->ob_digit;
        if (size >= 0 && size <= 3 && (size < 3 || d[2] < 16)) {
            uint64_t v = 0;
            for (Py_ssize_t i = size - 1; i >= 0; i--)
                v = v << 30 | d[i];
            *key = v;
            return 0;
        }
    }
#endif
    if (PyLong_Check(obj)) {
        unsigned long long v = PyLong_AsUnsignedLongLong(obj);
        if (!(v == (unsigned long long)-1 && PyErr_Occurred())) {
            *key = v;
            return 0;
        }
        if (!strict) {
            PyErr_Clear();
            return 1;
        }
        return -1;
    }
    if (!strict)
        return 1;
    PyErr_Format(PyExc_TypeError, "a block hash must be an int, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
}

static PyObject *state_of(const Slot *s) {
    if (s->flag == UNKNOWN)
        Py_RETURN_NONE;
    if (s->ident == 0)
        return PyLong_FromUnsignedLongLong(s->shape);
    return packed_state(s->shape, s->ident);
}

/* A state from Python (None or an int in [0, 2^128)) into flag, shape, ident. */
static int parse_state(PyObject *v, uint32_t *flag, uint64_t *shape, uint64_t *ident) {
    if (v == Py_None) {
        *flag = UNKNOWN;
        *shape = *ident = 0;
        return 0;
    }
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "a block state must be an int or None, not %.100s",
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    if (_PyLong_Sign(v) < 0 || _PyLong_NumBits(v) > 128) {
        PyErr_SetString(PyExc_OverflowError, "a block state must be in [0, 2^128)");
        return -1;
    }
    *flag = KNOWN;
    *shape = PyLong_AsUnsignedLongLongMask(v);
    PyObject *bits = PyLong_FromLong(64);
    PyObject *hi = bits ? PyNumber_Rshift(v, bits) : NULL;
    Py_XDECREF(bits);
    if (!hi)
        return -1;
    *ident = PyLong_AsUnsignedLongLong(hi);
    Py_DECREF(hi);
    return (*ident == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

static int table_set(Table *t, PyObject *k, PyObject *v) {
    uint64_t key;
    uint32_t flag;
    uint64_t shape, ident;
    if (key_of(k, &key, 1) < 0 || parse_state(v, &flag, &shape, &ident) < 0)
        return -1;
    return put(t, key, flag, shape, ident);
}

static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Table *t = (Table *)type->tp_alloc(type, 0);
    return (PyObject *)t;
}

static int table_init(Table *t, PyObject *args, PyObject *kw);

static void table_dealloc(Table *t) {
    free(t->slots);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t table_len(Table *t) { return (Py_ssize_t)t->used; }

static PyObject *table_getitem(Table *t, PyObject *k) {
    uint64_t key;
    int rc = key_of(k, &key, 0);
    Slot *s = rc == 0 ? find(t, key) : NULL;
    if (!s) {
        PyErr_SetObject(PyExc_KeyError, k);
        return NULL;
    }
    return state_of(s);
}

static int table_ass(Table *t, PyObject *k, PyObject *v) {
    if (v)
        return table_set(t, k, v);
    uint64_t key;
    Slot *s = key_of(k, &key, 0) == 0 ? find(t, key) : NULL;
    if (!s) {
        PyErr_SetObject(PyExc_KeyError, k);
        return -1;
    }
    drop(t, s);
    return 0;
}

static int table_contains(Table *t, PyObject *k) {
    uint64_t key;
    return key_of(k, &key, 0) == 0 && find(t, key) != NULL;
}

static PyObject *table_keys(Table *t, PyObject *unused) {
    PyObject *out = PyList_New((Py_ssize_t)t->used);
    Py_ssize_t j = 0;
    for (size_t i = 0; out && i < t->cap; i++) {
        Slot *s = &t->slots[i];
        if (s->flag != KNOWN && s->flag != UNKNOWN)
            continue;
        PyObject *k = PyLong_FromUnsignedLongLong(s->key);
        if (!k)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, j++, k);
    }
    return out;
}

static PyObject *table_iter(Table *t) {
    PyObject *keys = table_keys(t, NULL);
    if (!keys)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyObject *table_get(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    uint64_t key;
    Slot *s = key_of(args[0], &key, 0) == 0 ? find(t, key) : NULL;
    if (s)
        return state_of(s);
    PyObject *dflt = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(dflt);
    return dflt;
}

static PyObject *table_pop(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    uint64_t key;
    Slot *s = key_of(args[0], &key, 0) == 0 ? find(t, key) : NULL;
    if (!s) {
        if (nargs == 2) {
            Py_INCREF(args[1]);
            return args[1];
        }
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *out = state_of(s);
    if (out)
        drop(t, s);
    return out;
}

static PyObject *table_clear(Table *t, PyObject *unused) {
    free(t->slots);
    t->slots = NULL;
    t->cap = t->used = 0;
    Py_RETURN_NONE;
}

/* update(mapping or iterable of (hash, state) pairs) */
static PyObject *table_update(Table *t, PyObject *arg) {
    if (PyObject_TypeCheck(arg, &TableType)) {
        Table *o = (Table *)arg;
        for (size_t i = 0; i < o->cap; i++) {
            Slot *s = &o->slots[i];
            if ((s->flag == KNOWN || s->flag == UNKNOWN)
                    && put(t, s->key, s->flag, s->shape, s->ident) < 0)
                return NULL;
        }
        Py_RETURN_NONE;
    }
    if (PyDict_Check(arg)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(arg, &pos, &k, &v))
            if (table_set(t, k, v) < 0)
                return NULL;
        Py_RETURN_NONE;
    }
    PyObject *it = PyObject_GetIter(arg), *item;
    if (!it)
        return NULL;
    while ((item = PyIter_Next(it))) {
        PyObject *pair = PySequence_Fast(item, "update needs (hash, state) pairs");
        int rc = -1;
        if (pair && PySequence_Fast_GET_SIZE(pair) == 2)
            rc = table_set(t, PySequence_Fast_GET_ITEM(pair, 0), PySequence_Fast_GET_ITEM(pair, 1));
        else if (pair)
            PyErr_SetString(PyExc_ValueError, "update needs (hash, state) pairs");
        Py_XDECREF(pair);
        Py_DECREF(item);
        if (rc < 0) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static int table_init(Table *t, PyObject *args, PyObject *kw) {
    PyObject *src = NULL;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "BlockTable takes no keyword arguments");
        return -1;
    }
    if (!PyArg_UnpackTuple(args, "BlockTable", 0, 1, &src))
        return -1;
    if (src) {
        PyObject *r = table_update(t, src);
        if (!r)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* The hashes of a sequence, strictly (each an int in [0, 2^64)); NULL on error. */
static uint64_t *hashes_of(PyObject *seq, Py_ssize_t *n) {
    *n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *out = PyMem_Malloc((size_t)(*n + 1) * sizeof(uint64_t));
    if (!out) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (key_of(PySequence_Fast_GET_ITEM(seq, i), &out[i], 1) < 0) {
            PyMem_Free(out);
            return NULL;
        }
    }
    return out;
}

/* store(hashes, parent, tokens, block_size, images) -> (shapes, keys) | None:
 * kv_index.ResidentIndex._store without watermarks or a keep set. The parent's state (root
 * for None) continues the chain over the event's blocks; the blocks are written with their
 * states, or as unknown (None returned) when the parent is unknown or the tokens are short. */
static PyObject *table_store(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "store(hashes, parent, tokens, block_size, images)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "hashes must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n;
    uint64_t *hs = hashes_of(seq, &n), *buf = NULL;
    Py_DECREF(seq);
    if (!hs)
        return NULL;
    PyObject *out = NULL, *shapes = NULL, *keys = NULL;
    Py_buffer view = {0};
    int known = 1;
    uint64_t shape = 0, ident = 0;
    if (args[1] != Py_None) {
        uint64_t pkey;
        Slot *p = key_of(args[1], &pkey, 0) == 0 ? find(t, pkey) : NULL;
        if (p && p->flag == KNOWN) {
            shape = p->shape;
            ident = p->ident;
        } else {
            known = 0;
        }
    }
    Py_ssize_t bs = PyLong_AsSsize_t(args[3]);
    if (bs == -1 && PyErr_Occurred())
        goto done;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0)
        goto done;
    if (!n) {
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    if (known && bs > 0 && view.len / 4 >= n * bs) {
        /* every full block of the tokens is chained (a bad image ref past the hashes raises,
         * as in Python), the hashes' blocks are written */
        Py_ssize_t nt = view.len / 4 / bs;
        buf = PyMem_Malloc((size_t)(2 * nt) * sizeof(uint64_t));
        if (!buf) {
            PyErr_NoMemory();
            goto done;
        }
        if (chain_blocks(view.buf, nt, bs, args[4], &shape, &ident, buf, buf + nt) < 0)
            goto done;
        shapes = shapes_and_keys(buf, buf + nt, n, &keys);
        if (!shapes)
            goto done;
        for (Py_ssize_t b = 0; b < n; b++)
            if (put(t, hs[b], KNOWN, buf[b], buf[nt + b]) < 0)
                goto done;
        if (keys == shapes) { /* two lists: the event's keys and shapes are its own */
            Py_SETREF(keys, PyList_GetSlice(shapes, 0, n));
            if (!keys)
                goto done;
        }
        out = PyTuple_Pack(2, shapes, keys);
    } else {
        for (Py_ssize_t b = 0; b < n; b++)
            if (put(t, hs[b], UNKNOWN, 0, 0) < 0)
                goto done;
        out = Py_None;
        Py_INCREF(out);
    }
done:
    if (view.obj)
        PyBuffer_Release(&view);
    PyMem_Free(hs);
    PyMem_Free(buf);
    Py_XDECREF(shapes);
    Py_XDECREF(keys);
    return out;
}

/* remove(hashes, block_images, image_blocks) -> (keys, removed, unknown): the blocks
 * popped, the content keys of the known ones, their images forgotten. */
static PyObject *table_remove(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "remove(hashes, block_images, image_blocks)");
        return NULL;
    }
    PyObject *block_images = args[1], *image_blocks = args[2];
    PyObject *seq = PySequence_Fast(args[0], "hashes must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), removed = 0, unknown = 0, run = 0;
    PyObject *run_ids = NULL; /* the images of the latest blocks removed, run of them */
    PyObject *keys = PyList_New(0);
    if (!keys)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = PySequence_Fast_GET_ITEM(seq, i);
        uint64_t key;
        Slot *s = key_of(h, &key, 0) == 0 ? find(t, key) : NULL;
        if (!s) {
            unknown++;
            continue;
        }
        removed++;
        if (s->flag == KNOWN) {
            PyObject *k = PyLong_FromUnsignedLongLong(combined(s->shape, s->ident));
            int rc = k ? PyList_Append(keys, k) : -1;
            Py_XDECREF(k);
            if (rc < 0)
                goto fail;
        }
        int imgs = s->imgs;
        drop(t, s);
        if (!imgs)
            continue;
        /* FIFO eviction removes an image's blocks one after the other: counted per run */
        PyObject *ids = pop_item(block_images, h);
        if (!ids) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        if (ids == run_ids) {
            run++;
            Py_DECREF(ids);
            continue;
        }
        int truth = PyObject_IsTrue(ids);
        if (truth <= 0) {
            Py_DECREF(ids);
            if (truth < 0)
                goto fail;
            continue;
        }
        int rc = uncount_images(image_blocks, run_ids, run);
        run = 0;
        Py_XSETREF(run_ids, ids);
        if (rc < 0)
            goto fail;
        run = 1;
    }
    Py_DECREF(seq);
    int counted = uncount_images(image_blocks, run_ids, run);
    Py_XDECREF(run_ids);
    if (counted < 0) {
        Py_DECREF(keys);
        return NULL;
    }
    return Py_BuildValue("(Nnn)", keys, removed, unknown);
fail: /* the blocks removed before the error lose their counts */
    take_count(uncount_images, image_blocks, run_ids, run, 1);
    Py_XDECREF(run_ids);
    Py_DECREF(seq);
    Py_XDECREF(keys);
    return NULL;
}

/* mark_images(hashes): these blocks are in block_images (every writer of block_images says so:
 * a removal looks only marked blocks up there). */
static PyObject *table_mark_images(Table *t, PyObject *hashes) {
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence");
    if (!seq)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        uint64_t key;
        Slot *s = key_of(PySequence_Fast_GET_ITEM(seq, i), &key, 0) == 0 ? find(t, key) : NULL;
        if (s)
            s->imgs = 1;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyMethodDef table_methods[] = {
    {"get", (PyCFunction)(void (*)(void))table_get, METH_FASTCALL, "get(hash, default=None)"},
    {"pop", (PyCFunction)(void (*)(void))table_pop, METH_FASTCALL, "pop(hash[, default])"},
    {"keys", (PyCFunction)table_keys, METH_NOARGS, "The resident hashes, as a list."},
    {"clear", (PyCFunction)table_clear, METH_NOARGS, "Forget every block."},
    {"mark_images", (PyCFunction)table_mark_images, METH_O,
     "mark_images(hashes): these resident blocks are in block_images."},
    {"update", (PyCFunction)table_update, METH_O, "update(mapping or (hash, state) pairs)"},
    {"store", (PyCFunction)(void (*)(void))table_store, METH_FASTCALL,
     "store(hashes, parent, tokens, block_size, images) -> (shapes, keys) | None"},
    {"remove", (PyCFunction)(void (*)(void))table_remove, METH_FASTCALL,
     "remove(hashes, block_images, image_blocks) -> (keys, removed, unknown)"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods table_mapping = {
    (lenfunc)table_len, (binaryfunc)table_getitem, (objobjargproc)table_ass};
static PySequenceMethods table_sequence = {.sq_contains = (objobjproc)table_contains};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mmlens.layout._chain.BlockTable",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A worker's resident blocks: block hash -> content state (int) or None.",
    .tp_new = table_new,
    .tp_init = (initproc)table_init,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_as_mapping = &table_mapping,
    .tp_as_sequence = &table_sequence,
    .tp_iter = (getiterfunc)table_iter,
    .tp_methods = table_methods,
};

/* apply_events(res, events, start, pad_images, to_u32) -> int:
 * kv_index.ResidentIndex.apply for a run of one stream's stored and removed events on its
 * table (no watermarks), from events[start]; stops at the first other event (a clear, or
 * one of another stream: worker and rank unlike events[start]'s) and returns its index (len(events) when none). ``res`` is the WorkerResidency: its table, image
 * maps and counters (written back even when an event raises, as the Python form counts each
 * event as it goes). ``pad_images(tokens, bs)`` names images by pad values for an event
 * without images whose largest token is one; ``to_u32(tokens)`` turns token ids that are not
 * a u32 buffer into one. */
#define PAD_VALUE_MIN 1000000u

static PyObject *s_blocks, *s_block_images, *s_image_blocks, *s_stored, *s_removed,
    *s_removed_unknown, *s_kind, *s_block_hashes, *s_parent, *s_token_ids, *s_block_size,
    *s_images, *s_keys, *s_shapes, *s_worker, *s_rank, *u_stored, *u_removed;

/* Each event attribute's slot, by the last event type seen (mmlens/native/slot_attrs.h). */
static SlotCache c_block_hashes, c_parent, c_token_ids, c_block_size, c_images, c_worker, c_rank, c_kind, c_shapes, c_keys;

static int add_count(PyObject *res, PyObject *name, Py_ssize_t n) {
    if (!n)
        return 0;
    PyObject *cur = PyObject_GetAttr(res, name);
    if (!cur)
        return -1;
    PyObject *d = PyLong_FromSsize_t(n);
    PyObject *sum = d ? PyNumber_Add(cur, d) : NULL;
    Py_DECREF(cur);
    Py_XDECREF(d);
    int rc = sum ? PyObject_SetAttr(res, name, sum) : -1;
    Py_XDECREF(sum);
    return rc;
}

/* A u32 token buffer of tokens (a new reference): itself, or to_u32(tokens). */
static PyObject *u32_of(PyObject *tokens, PyObject *to_u32) {
    if (PyObject_CheckBuffer(tokens)) {
        Py_buffer v;
        if (PyObject_GetBuffer(tokens, &v, PyBUF_FORMAT | PyBUF_ND) == 0) {
            int ok = v.itemsize == 4 && v.format && strcmp(v.format, "I") == 0;
            PyBuffer_Release(&v);
            if (ok) {
                Py_INCREF(tokens);
                return tokens;
            }
        } else {
            PyErr_Clear();
        }
    }
    return PyObject_CallOneArg(to_u32, tokens);
}

static int count_images(PyObject *image_blocks, PyObject *ids, Py_ssize_t n);

/* The image bookkeeping of kv_index.ResidentIndex._store for a whole event (no keep set):
 * each block with image refs not in block_images yet gets its image ids there (an image's
 * blocks share one tuple) and counts for them in image_blocks. With the event's table t (its
 * blocks stored in it already), a block's slot says whether it may be in block_images at all,
 * which spares the lookup for a new block, and it is marked as there; a run of blocks of the
 * same images is counted once. */
static int record_images(Table *t, PyObject *block_images, PyObject *image_blocks,
                         PyObject *hashes, PyObject *images) {
    PyObject *hs = PySequence_Fast(hashes, "hashes must be a sequence");
    if (!hs)
        return -1;
    PyObject *ims = PySequence_Fast(images, "images must be a sequence");
    if (!ims) {
        Py_DECREF(hs);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hs), run = 0;
    if (PySequence_Fast_GET_SIZE(ims) < n)
        n = PySequence_Fast_GET_SIZE(ims);
    PyObject *ids = PyTuple_New(0);
    int rc = -1;
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
        uint64_t key;
        Slot *sl = t && key_of(h, &key, 0) == 0 ? find(t, key) : NULL;
        if (!sl || sl->imgs) {
            int has = PyDict_Contains(block_images, h);
            if (has < 0)
                goto done;
            if (has)
                continue;
        }
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
            if (count_images(image_blocks, ids, run) < 0) {
                Py_DECREF(names);
                goto done;
            }
            run = 0;
            Py_SETREF(ids, PyList_AsTuple(names));
            if (!ids) {
                Py_DECREF(names);
                goto done;
            }
        }
        Py_DECREF(names);
        if (PyDict_SetItem(block_images, h, ids) < 0)
            goto done;
        if (sl)
            sl->imgs = 1;
        run++;
    }
    rc = 0;
done:
    if (ids) /* the blocks recorded so far are counted, even when one raised */
        rc = take_count(count_images, image_blocks, ids, run, rc < 0);
    Py_XDECREF(ids);
    Py_DECREF(hs);
    Py_DECREF(ims);
    return rc;
}

/* image_blocks[ident] += n for each of ids. */
static int count_images(PyObject *image_blocks, PyObject *ids, Py_ssize_t n) {
    for (Py_ssize_t j = 0; n && j < PyTuple_GET_SIZE(ids); j++) {
        PyObject *ident = PyTuple_GET_ITEM(ids, j);
        PyObject *cur = PyDict_GetItemWithError(image_blocks, ident);
        long count = 0;
        if (cur) {
            count = PyLong_AsLong(cur);
            if (count == -1 && PyErr_Occurred())
                return -1;
        } else if (PyErr_Occurred()) {
            return -1;
        }
        PyObject *v = PyLong_FromLong(count + (long)n);
        int rc = v ? PyDict_SetItem(image_blocks, ident, v) : -1;
        Py_XDECREF(v);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* add_images(block_images, image_blocks, hashes, images): record_images without a table. */
static PyObject *add_images(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "add_images(block_images, image_blocks, hashes, images)");
        return NULL;
    }
    if (record_images(NULL, args[0], args[1], args[2], args[3]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int apply_stored(Table *t, PyObject *bi, PyObject *ib, PyObject *ev, PyObject *pad_images,
                        PyObject *to_u32, Py_ssize_t *stored) {
    int rc = -1;
    PyObject *hashes = get_slot(&c_block_hashes, ev, s_block_hashes), *parent = NULL, *tokens = NULL,
             *bs_obj = NULL, *images = NULL, *got = NULL, *buf = NULL;
    if (!hashes)
        return -1;
    int truth = PyObject_IsTrue(hashes);
    if (truth <= 0) { /* no blocks: nothing stored, nothing counted */
        Py_DECREF(hashes);
        return truth;
    }
    if (!(parent = get_slot(&c_parent, ev, s_parent)) || !(tokens = get_slot(&c_token_ids, ev, s_token_ids))
            || !(bs_obj = get_slot(&c_block_size, ev, s_block_size))
            || !(images = get_slot(&c_images, ev, s_images)))
        goto done;
    Py_ssize_t bs = PyLong_AsSsize_t(bs_obj);
    if (bs == -1 && PyErr_Occurred())
        goto done;
    if (images == Py_None && bs > 0) { /* images named by the pad values of their runs */
        int pads = 1;
        if (PyObject_CheckBuffer(tokens)) {
            Py_buffer v;
            if (PyObject_GetBuffer(tokens, &v, PyBUF_FORMAT | PyBUF_ND) < 0)
                goto done;
            if (v.itemsize == 4 && v.format && strcmp(v.format, "I") == 0) {
                const uint32_t *p = v.buf;
                uint32_t m = 0;
                for (Py_ssize_t i = 0; i < v.len / 4; i++)
                    if (p[i] > m)
                        m = p[i];
                pads = m >= PAD_VALUE_MIN;
            }
            PyBuffer_Release(&v);
        }
        if (pads) {
            PyObject *argv[2] = {tokens, bs_obj};
            PyObject *named = PyObject_Vectorcall(pad_images, argv, 2, NULL);
            if (!named)
                goto done;
            Py_SETREF(images, named);
            if (set_slot(&c_images, ev, s_images, images) < 0)
                goto done;
        }
    }
    if (!(buf = u32_of(tokens, to_u32)))
        goto done;
    PyObject *argv[5] = {hashes, parent, buf, bs_obj, images};
    if (!(got = table_store(t, argv, 5)))
        goto done;
    if (got != Py_None && (set_slot(&c_shapes, ev, s_shapes, PyTuple_GET_ITEM(got, 0)) < 0
                           || set_slot(&c_keys, ev, s_keys, PyTuple_GET_ITEM(got, 1)) < 0))
        goto done;
    *stored += PyObject_Length(hashes);
    truth = images == Py_None ? 0 : PyObject_IsTrue(images);
    if (truth < 0)
        goto done;
    if (truth) {
        if (record_images(t, bi, ib, hashes, images) < 0)
            goto done;
    }
    rc = 0;
done:
    Py_XDECREF(hashes);
    Py_XDECREF(parent);
    Py_XDECREF(tokens);
    Py_XDECREF(bs_obj);
    Py_XDECREF(images);
    Py_XDECREF(buf);
    Py_XDECREF(got);
    return rc;
}

static int apply_removed(Table *t, PyObject *bi, PyObject *ib, PyObject *ev, Py_ssize_t *removed,
                         Py_ssize_t *unknown) {
    PyObject *hashes = get_slot(&c_block_hashes, ev, s_block_hashes);
    if (!hashes)
        return -1;
    PyObject *argv[3] = {hashes, bi, ib};
    PyObject *got = table_remove(t, argv, 3);
    Py_DECREF(hashes);
    if (!got)
        return -1;
    int rc = set_slot(&c_keys, ev, s_keys, PyTuple_GET_ITEM(got, 0));
    *removed += PyLong_AsSsize_t(PyTuple_GET_ITEM(got, 1));
    *unknown += PyLong_AsSsize_t(PyTuple_GET_ITEM(got, 2));
    Py_DECREF(got);
    return rc;
}

static PyObject *apply_events(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "apply_events(res, events, start, pad_images, to_u32)");
        return NULL;
    }
    PyObject *res = args[0], *events = args[1], *pad_images = args[3], *to_u32 = args[4];
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    PyObject *blocks = PyObject_GetAttr(res, s_blocks);
    PyObject *bi = PyObject_GetAttr(res, s_block_images);
    PyObject *ib = PyObject_GetAttr(res, s_image_blocks);
    PyObject *worker = NULL, *rank = NULL;
    Py_ssize_t stored = 0, removed = 0, unknown = 0;
    int failed = 1;
    if (!blocks || !bi || !ib)
        goto done;
    if (i < PyList_GET_SIZE(events)) {
        PyObject *first = PyList_GET_ITEM(events, i);
        if (!(worker = get_slot(&c_worker, first, s_worker)) || !(rank = get_slot(&c_rank, first, s_rank)))
            goto done;
    }
    if (!PyObject_TypeCheck(blocks, &TableType) || !PyDict_Check(bi) || !PyDict_Check(ib)) {
        PyErr_SetString(PyExc_TypeError, "apply_events needs a BlockTable and two dicts");
        goto done;
    }
    for (; i < PyList_GET_SIZE(events); i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        PyObject *w = get_slot(&c_worker, ev, s_worker), *r = w ? get_slot(&c_rank, ev, s_rank) : NULL;
        int same = r ? (w == worker || PyObject_RichCompareBool(w, worker, Py_EQ) == 1)
                           && (r == rank || PyObject_RichCompareBool(r, rank, Py_EQ) == 1) : 0;
        Py_XDECREF(w);
        Py_XDECREF(r);
        if (PyErr_Occurred())
            goto done;
        if (!same)
            break;
        PyObject *kind = get_slot(&c_kind, ev, s_kind);
        if (!kind)
            goto done;
        int is_stored = kind == u_stored || PyUnicode_Compare(kind, u_stored) == 0;
        int is_removed = !is_stored && (kind == u_removed || PyUnicode_Compare(kind, u_removed) == 0);
        Py_DECREF(kind);
        if (PyErr_Occurred())
            goto done;
        int rc;
        if (is_stored)
            rc = apply_stored((Table *)blocks, bi, ib, ev, pad_images, to_u32, &stored);
        else if (is_removed)
            rc = apply_removed((Table *)blocks, bi, ib, ev, &removed, &unknown);
        else
            break;
        if (rc < 0)
            goto done;
    }
    failed = 0;
done:;
    PyObject *et, *evalue, *etb;
    PyErr_Fetch(&et, &evalue, &etb);
    if (res && (add_count(res, s_stored, stored) < 0 || add_count(res, s_removed, removed) < 0
                || add_count(res, s_removed_unknown, unknown) < 0)) {
        Py_XDECREF(et);
        Py_XDECREF(evalue);
        Py_XDECREF(etb);
        failed = 1;
    } else {
        PyErr_Restore(et, evalue, etb);
    }
    Py_XDECREF(blocks);
    Py_XDECREF(bi);
    Py_XDECREF(ib);
    Py_XDECREF(worker);
    Py_XDECREF(rank);
    return failed ? NULL : PyLong_FromSsize_t(i);
}

static int intern_names(void) {
    struct { PyObject **p; const char *s; } names[] = {
        {&s_blocks, "blocks"}, {&s_block_images, "block_images"},
        {&s_image_blocks, "image_blocks"}, {&s_stored, "stored"}, {&s_removed, "removed"},
        {&s_removed_unknown, "removed_unknown"}, {&s_kind, "kind"},
        {&s_block_hashes, "block_hashes"}, {&s_parent, "parent"}, {&s_token_ids, "token_ids"},
        {&s_block_size, "block_size"}, {&s_images, "images"}, {&s_keys, "keys"},
        {&s_shapes, "shapes"}, {&s_worker, "worker"}, {&s_rank, "rank"}, {&u_stored, "stored"}, {&u_removed, "removed"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(*names[i].p = PyUnicode_InternFromString(names[i].s)))
            return -1;
    return 0;
}

static PyMethodDef methods[] = {
    {"event_chain", (PyCFunction)(void (*)(void))event_chain, METH_FASTCALL,
     "Per block of a BlockStored event: content state, shape key and content key."},
    {"u32_tokens", u32_tokens, METH_O,
     "Native u32 bytes of a msgpack array of ints in [0, 2^32); None for anything else."},
    {"max_u32", max_u32, METH_O, "The largest id of a u32 buffer (0 when empty)."},
    {"images_of", (PyCFunction)(void (*)(void))images_of, METH_FASTCALL,
     "Per block, the image refs of an event's extra_keys; None without any."},
    {"add_images", (PyCFunction)(void (*)(void))add_images, METH_FASTCALL,
     "Record the images of a stored event's blocks."},
    {"apply_events", (PyCFunction)(void (*)(void))apply_events, METH_FASTCALL,
     "Apply a run of one stream's stored and removed events to its BlockTable."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chain", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chain(void) {
    if (PyType_Ready(&TableType) < 0 || intern_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "BlockTable", (PyObject *)&TableType) < 0)
        Py_CLEAR(m);
    return m;
}
