/* One KV batch read straight from its msgpack bytes into its events (``kv_fast.fast_batch``,
 * which stays the reference: tests/core/test_kv_batch.py holds the two equal).
 *
 * decode_batch(payload, worker, seq, default_rank, BlockStored, BlockRemoved,
 *              AllBlocksCleared, array) -> (ts, rank, events) | None
 *
 * It takes a subset of what ``fast_batch`` takes: the layouts engines send (vLLM's map events,
 * the positional ones of older vLLM and SGLang; no mixing), each field of the type it has
 * there. Anything else (a field of another type, an image ref it does not read here, a
 * non-ASCII string where one is skipped, a duplicate field, ...) gives None, and the caller
 * goes the msgspec way, which decides. No Python object is made for a field it skips.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "../native/msgpack_ints.h"

#define MAX_TS 8589934592.0 /* kv_events.MAX_TS: 2^33 */
#define MAX_BLOCK_SIZE 65536
#define MAX_DEPTH 32

typedef struct {
    const uint8_t *p, *end;
} Reader;

/* A container header of kind base (0x90 array, 0x80 map); -1 when the next value is not one. */
static int rd_len(Reader *r, uint8_t fix, uint8_t b16, uint8_t b32, size_t *n) {
    if (r->p >= r->end)
        return -1;
    uint8_t c = *r->p;
    if ((c & 0xf0) == fix) {
        *n = c & 0x0f;
        r->p += 1;
    } else if (c == b16 && r->end - r->p >= 3) {
        *n = (size_t)be(r->p + 1, 2);
        r->p += 3;
    } else if (c == b32 && r->end - r->p >= 5) {
        *n = (size_t)be(r->p + 1, 4);
        r->p += 5;
    } else {
        return -1;
    }
    return *n <= (size_t)(r->end - r->p) ? 0 : -1; /* each element takes a byte at least */
}

#define rd_array(r, n) rd_len(r, 0x90, 0xdc, 0xdd, n)
#define rd_map(r, n) rd_len(r, 0x80, 0xde, 0xdf, n)

/* A str: its bytes; -1 when the next value is not one. */
static int rd_str(Reader *r, const char **s, size_t *len) {
    if (r->p >= r->end)
        return -1;
    uint8_t c = *r->p;
    int head;
    if ((c & 0xe0) == 0xa0) {
        *len = c & 0x1f;
        head = 1;
    } else if (c == 0xd9 && r->end - r->p >= 2) {
        *len = r->p[1];
        head = 2;
    } else if (c == 0xda && r->end - r->p >= 3) {
        *len = (size_t)be(r->p + 1, 2);
        head = 3;
    } else if (c == 0xdb && r->end - r->p >= 5) {
        *len = (size_t)be(r->p + 1, 4);
        head = 5;
    } else {
        return -1;
    }
    if ((size_t)(r->end - r->p - head) < *len)
        return -1;
    *s = (const char *)r->p + head;
    r->p += head + *len;
    return 0;
}

/* An int (no bool): its two's-complement bits and whether it is negative; -1 for another. */
static int rd_int(Reader *r, uint64_t *v, int *neg) {
    if (r->p >= r->end)
        return -1;
    uint8_t c = *r->p;
    int width;
    if (c < 0x80) {
        *v = c;
        *neg = 0;
        r->p += 1;
        return 0;
    }
    if (c >= 0xe0) {
        *v = (uint64_t)(int64_t)(int8_t)c;
        *neg = 1;
        r->p += 1;
        return 0;
    }
    width = int_width(c);
    if (!width || r->end - r->p < 1 + width)
        return -1;
    uint64_t u = be(r->p + 1, width);
    *neg = 0;
    if (c >= 0xd0 && (r->p[1] & 0x80)) { /* sign-extend a negative signed int */
        if (width < 8)
            u |= ~0ull << (8 * width);
        *neg = 1;
    }
    *v = u;
    r->p += 1 + width;
    return 0;
}

static int ascii(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0x80)
            return 0;
    return 1;
}

/* Past one value of any kind (strings only ASCII: others are left to msgspec); -1 if not. */
static int skip(Reader *r, int depth) {
    if (r->p >= r->end || depth > MAX_DEPTH)
        return -1;
    uint8_t c = *r->p;
    size_t n;
    const char *s;
    uint64_t v;
    int neg;
    if ((c & 0xf0) == 0x90 || c == 0xdc || c == 0xdd) {
        if (rd_array(r, &n) < 0)
            return -1;
        while (n--) { /* the ints of hashes and token ids stepped over here */
            if (r->p >= r->end)
                return -1;
            uint8_t e = *r->p;
            if (e < 0x80 || e >= 0xe0) {
                r->p += 1;
                continue;
            }
            if (e >= 0xcc && e <= 0xd3) {
                int w = 1 << (e & 3);
                if (r->end - r->p < 1 + w)
                    return -1;
                r->p += 1 + w;
                continue;
            }
            if (skip(r, depth + 1) < 0)
                return -1;
        }
        return 0;
    }
    if ((c & 0xf0) == 0x80 || c == 0xde || c == 0xdf) {
        if (rd_map(r, &n) < 0)
            return -1;
        while (n--)
            if (skip(r, depth + 1) < 0 || skip(r, depth + 1) < 0)
                return -1;
        return 0;
    }
    if ((c & 0xe0) == 0xa0 || (c >= 0xd9 && c <= 0xdb))
        return rd_str(r, &s, &n) == 0 && ascii(s, n) ? 0 : -1;
    if (c == 0xc0 || c == 0xc2 || c == 0xc3) {
        r->p += 1;
        return 0;
    }
    if (c == 0xca || c == 0xcb) {
        int w = c == 0xca ? 4 : 8;
        if (r->end - r->p < 1 + w)
            return -1;
        r->p += 1 + w;
        return 0;
    }
    return rd_int(r, &v, &neg);
}

/* A field msgspec types Any and mmlens keeps only as a str: that str (new reference), None
 * for a nil, bool, int or float; NULL (no error set) for anything else. */
static PyObject *rd_text_or_none(Reader *r) {
    if (r->p >= r->end)
        return NULL;
    uint8_t c = *r->p;
    if ((c & 0xe0) == 0xa0 || (c >= 0xd9 && c <= 0xdb)) {
        const char *s;
        size_t len;
        if (rd_str(r, &s, &len) < 0)
            return NULL;
        PyObject *out = PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, NULL);
        if (!out)
            PyErr_Clear();
        return out;
    }
    if ((c & 0xf0) == 0x90 || (c & 0xf0) == 0x80 || (c >= 0xdc && c <= 0xdf) || c == 0xc1
            || (c >= 0xc4 && c <= 0xc9) || (c >= 0xd4 && c <= 0xd8))
        return NULL; /* containers, bin, ext: decoded by msgspec if at all */
    if (skip(r, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Block hashes: a list of ints as unsigned 64-bit (every one masked when any is negative,
 * as kv_fast._hashes does); NULL (no error set) when not an array of ints. */
static PyObject *rd_hashes(Reader *r) {
    size_t n;
    if (rd_array(r, &n) < 0)
        return NULL;
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        int neg;
        PyObject *h;
        if (rd_int(r, &v, &neg) < 0 || !(h = PyLong_FromUnsignedLongLong(v))) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, h);
    }
    return out;
}

/* Token ids: native u32 bytes of an array of ints in [0, 2^32) (kv_fast.tokens_of); NULL
 * with no error set and r where it was for another value. */
static PyObject *rd_token_bytes(Reader *r) {
    size_t n;
    Reader start = *r;
    if (rd_array(r, &n) < 0) {
        *r = start;
        return NULL;
    }
    PyObject *buf = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 4));
    if (!buf)
        return NULL;
    uint32_t *dst = (uint32_t *)PyBytes_AS_STRING(buf);
    const uint8_t *p = r->p;
    if (read_u32s(&p, r->end, n, dst) < 0)
        goto bad;
    r->p = p;
    return buf;
bad:
    Py_DECREF(buf);
    *r = start;
    return NULL;
}

/* extra_keys: per block None or ((name, offset),) from [[name, offset]] with an ASCII name
 * and an int offset within int32 (the form kv_events reads; native.images_of's fast case);
 * *images None when no block has one. -1 (no error set) for any other form. */
static int rd_images(Reader *r, PyObject **images) {
    *images = NULL;
    if (r->p < r->end && *r->p == 0xc0) {
        r->p += 1;
        Py_INCREF(Py_None);
        *images = Py_None;
        return 0;
    }
    size_t n;
    if (rd_array(r, &n) < 0)
        return -1;
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (!out)
        return -1;
    int any = 0;
    PyObject *name = NULL; /* an image's blocks name it alike: one str for the run */
    const char *name_s = NULL;
    size_t name_len = 0;
    for (size_t b = 0; b < n; b++) {
        PyObject *refs;
        size_t k;
        const char *s;
        size_t len;
        uint64_t v;
        int neg;
        if (r->p < r->end && *r->p == 0xc0) {
            r->p += 1;
            Py_INCREF(Py_None);
            refs = Py_None;
        } else if (rd_array(r, &k) == 0 && k == 1 && rd_array(r, &k) == 0 && k == 2
                   && rd_str(r, &s, &len) == 0 && ascii(s, len) && rd_int(r, &v, &neg) == 0
                   && (neg ? (int64_t)v >= -INT32_MAX : v <= INT32_MAX)) {
            if (!name || len != name_len || memcmp(s, name_s, len) != 0) {
                Py_XDECREF(name);
                if (!(name = PyUnicode_FromStringAndSize(s, (Py_ssize_t)len))) {
                    Py_DECREF(out);
                    return -1;
                }
                name_s = s;
                name_len = len;
            }
            refs = Py_BuildValue("((OL))", name, (long long)(int64_t)v);
            if (!refs) {
                Py_DECREF(name);
                Py_DECREF(out);
                return -1;
            }
            any = 1;
        } else {
            Py_XDECREF(name);
            Py_DECREF(out);
            return -1;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)b, refs);
    }
    Py_XDECREF(name);
    if (!any) {
        Py_DECREF(out);
        Py_INCREF(Py_None);
        out = Py_None;
    }
    *images = out;
    return 0;
}

enum { F_TYPE, F_HASHES, F_PARENT, F_TOKENS, F_BS, F_MEDIUM, F_LORA, F_EXTRA, F_LORA_ID, NF };
enum { K_STORED, K_REMOVED, K_CLEARED };

/* Where each field's value starts (NULL: absent), read from an event map or array. */
typedef struct {
    const uint8_t *at[NF];
    int kind;
    PyObject *tokens; /* token_ids read as they are passed (a store's: not walked twice) */
} Fields;

/* Past the value at r, read as token ids into fs when it is an array of them. */
static int pass_tokens(Reader *r, Fields *fs) {
    Py_CLEAR(fs->tokens);
    fs->tokens = rd_token_bytes(r);
    if (fs->tokens)
        return 0;
    return PyErr_Occurred() ? -1 : skip(r, 1);
}

static int kind_of(Reader *r, int *kind) {
    const char *s;
    size_t len;
    if (rd_str(r, &s, &len) < 0)
        return -1;
    if (len == 11 && memcmp(s, "BlockStored", 11) == 0)
        *kind = K_STORED;
    else if (len == 12 && memcmp(s, "BlockRemoved", 12) == 0)
        *kind = K_REMOVED;
    else if (len == 16 && memcmp(s, "AllBlocksCleared", 16) == 0)
        *kind = K_CLEARED;
    else
        return -1;
    return 0;
}

static int field_of(const char *s, size_t len) {
    static const char *names[NF] = {"type", "block_hashes", "parent_block_hash", "token_ids",
                                    "block_size", "medium", "lora_name", "extra_keys", NULL};
    for (int f = 0; f < F_LORA_ID; f++)
        if (strlen(names[f]) == len && memcmp(names[f], s, len) == 0)
            return f;
    return -1;
}

static int map_fields(Reader *r, Fields *fs) {
    size_t n;
    if (rd_map(r, &n) < 0)
        return -1;
    memset(fs, 0, sizeof(*fs));
    while (n--) {
        const char *s;
        size_t len;
        if (rd_str(r, &s, &len) < 0 || !ascii(s, len))
            return -1;
        int f = field_of(s, len);
        if (f >= 0) {
            if (fs->at[f]) /* a duplicate: left to msgspec */
                return -1;
            fs->at[f] = r->p;
        }
        if ((f == F_TOKENS ? pass_tokens(r, fs) : skip(r, 1)) < 0)
            return -1;
    }
    if (!fs->at[F_TYPE])
        return -1;
    Reader t = {fs->at[F_TYPE], r->end};
    if (kind_of(&t, &fs->kind) < 0)
        return -1;
    /* the fields the tag's struct reads; the others are unknown to it, skipped */
    if (fs->kind == K_CLEARED)
        return 0;
    if (!fs->at[F_HASHES])
        return -1;
    if (fs->kind == K_REMOVED) {
        fs->at[F_PARENT] = fs->at[F_TOKENS] = fs->at[F_BS] = NULL;
        fs->at[F_LORA] = fs->at[F_EXTRA] = NULL;
        return 0;
    }
    return fs->at[F_TOKENS] && fs->at[F_BS] ? 0 : -1;
}

static int array_fields(Reader *r, Fields *fs) {
    /* positions after the tag (kv_fast._ArrayStored, _ArrayRemoved) */
    static const int stored[] = {F_HASHES, F_PARENT, F_TOKENS, F_BS, F_LORA_ID, F_MEDIUM, F_LORA,
                                 F_EXTRA};
    static const int removed[] = {F_HASHES, F_MEDIUM};
    size_t n;
    if (rd_array(r, &n) < 0 || n < 1)
        return -1;
    memset(fs, 0, sizeof(*fs));
    fs->at[F_TYPE] = r->p;
    if (kind_of(r, &fs->kind) < 0)
        return -1;
    const int *order = fs->kind == K_STORED ? stored : removed;
    size_t known = fs->kind == K_STORED ? 8 : fs->kind == K_REMOVED ? 2 : 0;
    size_t required = fs->kind == K_STORED ? 4 : fs->kind == K_REMOVED ? 1 : 0;
    if (n - 1 < required)
        return -1;
    for (size_t i = 1; i < n; i++) {
        int f = i - 1 < known ? order[i - 1] : -1;
        if (f >= 0)
            fs->at[f] = r->p;
        if ((f == F_TOKENS ? pass_tokens(r, fs) : skip(r, 1)) < 0)
            return -1;
    }
    return 0;
}

/* ---- events made without calling their class ------------------------------------------------
 * The event classes are slots dataclasses whose generated __init__ only sets each field: run as
 * Python bytecode, that was the largest per-event cost of a batch after reading it. Where a
 * class is such a dataclass (no __post_init__, every field an init field kept in a writable
 * slot, the first ones named as the call passes them, the rest with plain defaults), its
 * events are allocated here and their slots set as __init__ would set them; any other class
 * is called. The check runs once per class object. */

#define MAX_FIELDS 24

typedef struct {
    PyObject *cls; /* the class planned for (a strong reference), NULL before the first */
    int direct;    /* 1: built here, 0: called */
    Py_ssize_t n_fields;
    Py_ssize_t offset[MAX_FIELDS];
    PyObject *fallback[MAX_FIELDS]; /* the defaults of the fields after those passed */
} Layout;

static const char *const STORED_ARGS[] = {"worker", "rank", "seq", "ts", "block_hashes",
                                          "parent", "token_ids", "block_size", "medium",
                                          "lora_name", "images", "idx", NULL};
static const char *const REMOVED_ARGS[] = {"worker", "rank", "seq", "ts", "block_hashes",
                                           "medium", "idx", NULL};
static const char *const CLEARED_ARGS[] = {"worker", "rank", "seq", "ts", "idx", NULL};

static Layout layouts[3];

/* 1 when the field f named name of tp can be set straight into its slot (its offset in *off),
 * 0 when not, -1 on an error. */
static int slot_field(PyTypeObject *tp, PyObject *name, PyObject *f, PyObject *field_kind,
                      Py_ssize_t *off) {
    PyObject *kind = PyObject_GetAttrString(f, "_field_type");
    PyObject *init = kind ? PyObject_GetAttrString(f, "init") : NULL;
    int ok = init && kind == field_kind && init == Py_True;
    Py_XDECREF(kind);
    Py_XDECREF(init);
    if (PyErr_Occurred())
        return -1;
    PyObject *descr = ok ? PyDict_GetItemWithError(tp->tp_dict, name) : NULL;
    if (!descr)
        return PyErr_Occurred() ? -1 : 0;
    if (Py_TYPE(descr) != &PyMemberDescr_Type)
        return 0;
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY))
        return 0;
    *off = m->offset;
    return 1;
}

/* Plan L for cls; 0 (L->direct says how), -1 on an error. */
static int plan(Layout *L, PyObject *cls, const char *const *args) {
    for (Py_ssize_t i = 0; i < MAX_FIELDS; i++)
        Py_CLEAR(L->fallback[i]);
    Py_XSETREF(L->cls, Py_NewRef(cls));
    L->direct = 0;
    if (!PyType_Check(cls))
        return 0;
    PyTypeObject *tp = (PyTypeObject *)cls;
    if (tp->tp_new != PyBaseObject_Type.tp_new || tp->tp_alloc != PyType_GenericAlloc
            || PyObject_HasAttrString(cls, "__post_init__"))
        return 0;
    PyObject *dc = PyImport_ImportModule("dataclasses");
    PyObject *missing = dc ? PyObject_GetAttrString(dc, "MISSING") : NULL;
    PyObject *field_kind = missing ? PyObject_GetAttrString(dc, "_FIELD") : NULL;
    PyObject *fields = field_kind ? PyObject_GetAttrString(cls, "__dataclass_fields__") : NULL;
    int rc = -1, direct = 0;
    if (!fields) {
        if (field_kind && PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            rc = 0;
        }
        goto done;
    }
    if (!PyDict_Check(fields)) {
        rc = 0;
        goto done;
    }
    Py_ssize_t pos = 0, i = 0, n_args = 0;
    while (args[n_args])
        n_args++;
    PyObject *name, *f;
    direct = 1;
    while (direct && PyDict_Next(fields, &pos, &name, &f)) {
        if (i >= MAX_FIELDS || !PyUnicode_Check(name)) {
            direct = 0;
            break;
        }
        int got = slot_field(tp, name, f, field_kind, &L->offset[i]);
        if (got < 0)
            goto done;
        if (!got) {
            direct = 0;
            break;
        }
        if (i < n_args) {
            direct = PyUnicode_CompareWithASCIIString(name, args[i]) == 0;
        } else {
            PyObject *dflt = PyObject_GetAttrString(f, "default");
            PyObject *factory = dflt ? PyObject_GetAttrString(f, "default_factory") : NULL;
            if (!factory) {
                Py_XDECREF(dflt);
                goto done;
            }
            direct = dflt != missing && factory == missing;
            Py_DECREF(factory);
            L->fallback[i] = dflt;
        }
        i++;
    }
    L->n_fields = i;
    L->direct = direct && i >= n_args;
    rc = 0;
done:
    Py_XDECREF(dc);
    Py_XDECREF(missing);
    Py_XDECREF(field_kind);
    Py_XDECREF(fields);
    return rc;
}

/* An event of cls from its first fields (argv, as many as L's names), a new reference. */
static PyObject *make_event(int kind, PyObject *cls, PyObject *const *argv, Py_ssize_t n) {
    static const char *const *const ARGS[3] = {STORED_ARGS, REMOVED_ARGS, CLEARED_ARGS};
    Layout *L = &layouts[kind];
    if (L->cls != cls && plan(L, cls, ARGS[kind]) < 0)
        return NULL;
    if (!L->direct)
        return PyObject_Vectorcall(cls, argv, (size_t)n, NULL);
    PyTypeObject *tp = (PyTypeObject *)cls;
    PyObject *ev = tp->tp_alloc(tp, 0);
    if (!ev)
        return NULL;
    for (Py_ssize_t i = 0; i < L->n_fields; i++)
        *(PyObject **)((char *)ev + L->offset[i]) = Py_NewRef(i < n ? argv[i] : L->fallback[i]);
    return ev;
}

/* The event of fs (a new reference); NULL with no error for a batch to leave to msgspec. */
static PyObject *event_of(Fields *fs, const uint8_t *end, PyObject *const *head, Py_ssize_t idx,
                          PyObject *const *classes, PyObject *array_cls, PyObject *code) {
    PyObject *ix = PyLong_FromSsize_t(idx);
    if (!ix)
        return NULL;
    if (fs->kind == K_CLEARED) {
        PyObject *argv[5] = {head[0], head[1], head[2], head[3], ix};
        PyObject *out = make_event(K_CLEARED, classes[K_CLEARED], argv, 5);
        Py_DECREF(ix);
        return out;
    }
    PyObject *hashes = NULL, *medium = NULL, *out = NULL;
    PyObject *parent = NULL, *tokens = NULL, *bs = NULL, *lora = NULL, *images = NULL;
    Reader r = {fs->at[F_HASHES], end};
    if (!(hashes = rd_hashes(&r)))
        goto done;
    if (fs->at[F_MEDIUM]) {
        r.p = fs->at[F_MEDIUM];
        if (!(medium = rd_text_or_none(&r)))
            goto done;
    } else {
        medium = Py_NewRef(Py_None);
    }
    if (fs->kind == K_REMOVED) {
        PyObject *argv[7] = {head[0], head[1], head[2], head[3], hashes, medium, ix};
        out = make_event(K_REMOVED, classes[K_REMOVED], argv, 7);
        goto done;
    }
    uint64_t v;
    int neg;
    r.p = fs->at[F_PARENT];
    if (!r.p || *r.p == 0xc0)
        parent = Py_NewRef(Py_None);
    else if (rd_int(&r, &v, &neg) < 0 || !(parent = PyLong_FromUnsignedLongLong(v)))
        goto done;
    r.p = fs->at[F_BS];
    if (rd_int(&r, &v, &neg) < 0 || neg || v == 0 || v > MAX_BLOCK_SIZE
            || !(bs = PyLong_FromUnsignedLongLong(v)))
        goto done;
    if (!fs->tokens)
        goto done;
    PyObject *targv[2] = {code, fs->tokens};
    if (!(tokens = PyObject_Vectorcall(array_cls, targv, 2, NULL)))
        goto done;
    if (fs->at[F_LORA]) {
        r.p = fs->at[F_LORA];
        if (!(lora = rd_text_or_none(&r)))
            goto done;
    } else {
        lora = Py_NewRef(Py_None);
    }
    if (fs->at[F_LORA_ID]) { /* read (Any) but not kept */
        r.p = fs->at[F_LORA_ID];
        PyObject *ignored = rd_text_or_none(&r);
        if (!ignored)
            goto done;
        Py_DECREF(ignored);
    }
    if (fs->at[F_EXTRA]) {
        r.p = fs->at[F_EXTRA];
        if (rd_images(&r, &images) < 0)
            goto done;
    } else {
        images = Py_NewRef(Py_None);
    }
    PyObject *argv[12] = {head[0], head[1], head[2], head[3], hashes, parent, tokens, bs,
                          PyUnicode_Check(medium) ? medium : Py_None,
                          PyUnicode_Check(lora) ? lora : Py_None, images, ix};
    out = make_event(K_STORED, classes[K_STORED], argv, 12);
done:
    Py_DECREF(ix);
    Py_XDECREF(hashes);
    Py_XDECREF(medium);
    Py_XDECREF(parent);
    Py_XDECREF(tokens);
    Py_XDECREF(bs);
    Py_XDECREF(lora);
    Py_XDECREF(images);
    return out;
}

static int rd_ts(Reader *r, double *ts) {
    if (r->p >= r->end)
        return -1;
    uint8_t c = *r->p;
    if (c == 0xcb && r->end - r->p >= 9) {
        uint64_t bits = be(r->p + 1, 8);
        memcpy(ts, &bits, 8);
        r->p += 9;
        return 0;
    }
    if (c == 0xca && r->end - r->p >= 5) {
        uint32_t bits = (uint32_t)be(r->p + 1, 4);
        float f;
        memcpy(&f, &bits, 4);
        *ts = f;
        r->p += 5;
        return 0;
    }
    uint64_t v;
    int neg;
    if (rd_int(r, &v, &neg) < 0)
        return -1;
    *ts = neg ? (double)(int64_t)v : (double)v;
    return 0;
}

static PyObject *decode_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "decode_batch(payload, worker, seq, default_rank, "
                        "BlockStored, BlockRemoved, AllBlocksCleared, array)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    static PyObject *code;
    if (!code && !(code = PyUnicode_InternFromString("I"))) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Reader r = {view.buf, (const uint8_t *)view.buf + view.len};
    PyObject *events = NULL, *ts_obj = NULL, *rank_obj = NULL, *out = NULL;
    Fields *fs = NULL;
    size_t n, n_events = 0;
    double ts;
    if (rd_array(&r, &n) < 0 || n < 2 || rd_ts(&r, &ts) < 0 || !(ts >= 0 && ts <= MAX_TS))
        goto none;
    if (rd_array(&r, &n_events) < 0)
        goto none;
    /* the events' fields first: the batch is left to msgspec before any object is made */
    fs = PyMem_Calloc(n_events + 1, sizeof(Fields));
    if (!fs) {
        PyErr_NoMemory();
        goto done;
    }
    int maps = -1;
    for (size_t i = 0; i < n_events; i++) {
        if (r.p >= r.end)
            goto none;
        uint8_t c = *r.p;
        int is_map = (c & 0xf0) == 0x80 || c == 0xde || c == 0xdf;
        if (maps >= 0 && is_map != maps) /* one decoder reads the whole batch: no mixing */
            goto none;
        maps = is_map;
        if ((is_map ? map_fields(&r, &fs[i]) : array_fields(&r, &fs[i])) < 0)
            goto none;
    }
    long rank = -1;
    if (n >= 3) {
        uint64_t v;
        int neg;
        if (r.p < r.end && *r.p == 0xc0)
            r.p += 1;
        else if (rd_int(&r, &v, &neg) < 0 || neg || v > 65535)
            goto none;
        else
            rank = (long)v;
        for (size_t i = 3; i < n; i++)
            if (skip(&r, 1) < 0)
                goto none;
    }
    if (r.p != r.end)
        goto none;
    if (rank < 0) {
        rank_obj = Py_NewRef(args[3]);
    } else if (!(rank_obj = PyLong_FromLong(rank))) {
        goto done;
    }
    if (!(ts_obj = PyFloat_FromDouble(ts)) || !(events = PyList_New((Py_ssize_t)n_events)))
        goto done;
    PyObject *head[4] = {args[1], rank_obj, args[2], ts_obj};
    for (size_t i = 0; i < n_events; i++) {
        PyObject *ev = event_of(&fs[i], r.end, head, (Py_ssize_t)i, args + 4, args[7], code);
        if (!ev)
            goto none;
        PyList_SET_ITEM(events, (Py_ssize_t)i, ev);
    }
    out = PyTuple_Pack(3, ts_obj, rank_obj, events);
    goto done;
none:
    if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_ValueError)
            || PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        out = Py_NewRef(Py_None);
    }
done:
    for (size_t i = 0; fs && i < n_events; i++)
        Py_XDECREF(fs[i].tokens);
    PyMem_Free(fs);
    Py_XDECREF(events);
    Py_XDECREF(ts_obj);
    Py_XDECREF(rank_obj);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"decode_batch", (PyCFunction)(void (*)(void))decode_batch, METH_FASTCALL,
     "(ts, rank, events) of a KV batch in a layout read here, or None (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kvbatch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kvbatch(void) { return PyModule_Create(&module); }
