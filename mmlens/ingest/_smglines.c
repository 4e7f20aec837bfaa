/* SMG's request-span lines read in one compiled loop per batch: what ``smg_typed.typed_line``
 * and ``smg_typed.read_typed`` do line by line in Python, which stay the reference
 * (tests/core/test_smg_fast_lines.py and tests/observed/test_smg_typed_store.py hold the
 * three paths equal: this one, the typed Python one, the whole-object one).
 *
 * setup(config: dict) -> None     the decoders, helpers and types it calls (smg_typed.py)
 * read(kept, seq_on, into, decisions, attempts_failed, note, errors, other) -> None
 *   kept: (number, line) pairs of a batch, in order. A line it takes: decoded by the typed
 *   decoder, its decision appended to ``decisions``, its request's fragment in ``into``
 *   updated. Any other line (no request span, a message read whole, not of the typed shape,
 *   text it cannot see as UTF-8) goes to ``other(number, line)`` in its place in the order.
 *   Rarer parts call back into Python: the cache trace's and a failed attempt's decisions,
 *   image sizes and tokens, a completion or model line, numbers that are no plain int/float.
 *
 * A decision is made without its dataclass __init__ (a slots dataclass with no
 * __post_init__: every field set here, by its member descriptor's offset, as __init__ would
 * set it); setup refuses a class of any other shape and the Python path serves.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <string.h>
#include <structmember.h>

#define MAX_DFIELDS 64

typedef struct {
    PyObject *decode, *decode_error, *unset, *py_decision, *fragment, *parse_ts, *as_int,
        *as_float, *is_request_path, *says_something, *put_image_sizes, *put_image_tokens,
        *tail, *text_fields, *request_paths, *label, *source_log, *smg, *zero, *zero_f;
    PyTypeObject *dtype;
    Py_ssize_t nd, doff[MAX_DFIELDS];
    PyObject *ddefault[MAX_DFIELDS];
    char dfactory[MAX_DFIELDS];
    /* offsets of the decision fields set here */
    Py_ssize_t o_rid, o_router, o_source, o_worker, o_branch, o_overlap, o_reqblocks, o_ratio,
        o_matched, o_input, o_credited, o_policy, o_original, o_expanded, o_ts, o_attempt;
    PyObject *last_ts, *last_when; /* SMG stamps whole seconds: most lines repeat one */
} State;

static State S;
static int ready = 0;

/* interned attribute names */
static PyObject *n_span, *n_message, *n_timestamp, *n_time, *n_fields, *n_worker, *n_model_id,
    *n_branch, *n_overlap_blocks, *n_request_blocks, *n_matched_ratio, *n_matched_units,
    *n_input_units, *n_credited_units, *n_policy, *n_original_tokens, *n_expanded_tokens,
    *n_original_len, *n_expanded_len, *n_item_sizes, *n_total_tokens, *n_item_count,
    *n_request_id, *n_path, *n_trace_id, *n_status_code, *n_latency, *n_ts, *n_provenance,
    *n_model, *n_sent_seq, *n_status, *n_latency_s, *n_processing_mode, *n_rendered_tokens,
    *s_router, *s_log_prefix, *s_token_expansion, *s_mm_timing;

static const char *SELECTIONS[] = {"Cache-aware selection", "Event-driven routing",
                                   "Cache miss routed to a warming worker", NULL};
static const char *DECISIONS[] = {"Cache-aware selection", "Event-driven routing",
                                  "Cache miss routed to a warming worker",
                                  "Cache routing dispatch",
                                  "smg_mm_timing process_multimodal_plan",
                                  "Token expansion complete", "pipeline attempt failed", NULL};
static const char *DECIDED_EXACT[] = {"Cache routing dispatch", "pipeline attempt failed",
                                      "Token expansion complete", NULL};
static const char *DECIDED_PREFIX[] = {"Cache-aware selection", "Event-driven routing",
                                       "Cache miss routed to a warming worker",
                                       "smg_mm_timing process_multimodal_plan", NULL};
static const char *SAYS[] = {"Cache-aware selection", "Event-driven routing",
                             "Cache miss routed to a warming worker",
                             "finished processing request",
                             "Fetched images for multimodal processing",
                             "Multimodal preprocessing complete", "Token expansion complete",
                             "Cache routing dispatch", "started processing request", NULL};
#define MM_TIMING "smg_mm_timing process_multimodal_plan"
#define STREAM_ALIAS "Created AbortOnDropStream"

typedef struct {
    const char *s;
    Py_ssize_t n;
} Text;

static int starts(Text t, const char *p) {
    size_t k = strlen(p);
    return (size_t)t.n >= k && memcmp(t.s, p, k) == 0;
}
static int is(Text t, const char *p) { return (size_t)t.n == strlen(p) && memcmp(t.s, p, t.n) == 0; }
static int starts_any(Text t, const char **ps) {
    for (; *ps; ps++)
        if (starts(t, *ps))
            return 1;
    return 0;
}
static int is_any(Text t, const char **ps) {
    for (; *ps; ps++)
        if (is(t, *ps))
            return 1;
    return 0;
}

/* ---- numbers.as_int / as_float: plain values here, any other in Python ---- */
static PyObject *as_int(PyObject *v) {
    if (v == Py_None)
        Py_RETURN_NONE;
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        (void)PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow == 0)
            return Py_NewRef(v); /* |v| < 2^63, inside ±2^64 */
    }
    return PyObject_CallOneArg(S.as_int, v);
}

static PyObject *as_float(PyObject *v) {
    if (v == Py_None)
        Py_RETURN_NONE;
    if (PyFloat_CheckExact(v))
        return Py_NewRef(v);
    return PyObject_CallOneArg(S.as_float, v);
}

/* ---- observed.put ---- */
static int put(PyObject *t, PyObject *name, PyObject *value) {
    if (value == Py_None || (PyUnicode_Check(value) && PyUnicode_GET_LENGTH(value) == 0))
        return 0;
    if (!PyUnicode_Check(value)) {
        int text = PySet_Contains(S.text_fields, name);
        if (text < 0)
            return -1;
        if (text)
            return 0;
    }
    if (PyObject_SetAttr(t, name, value) < 0)
        return -1;
    PyObject *prov = PyObject_GetAttr(t, n_provenance);
    if (prov == NULL)
        return -1;
    int rc = PyObject_SetItem(prov, name, S.label);
    Py_DECREF(prov);
    return rc;
}

/* put() of a value this function made (a new reference, or NULL on error) */
static int put_new(PyObject *t, PyObject *name, PyObject *value) {
    if (value == NULL)
        return -1;
    int rc = put(t, name, value);
    Py_DECREF(value);
    return rc;
}

static int put_attr(PyObject *t, PyObject *name, PyObject *obj, PyObject *attr) {
    return put_new(t, name, PyObject_GetAttr(obj, attr));
}

/* ---- a RoutingDecision without __init__ ---- */
static void set_slot(PyObject *o, Py_ssize_t off, PyObject *v) { /* steals v */
    PyObject **slot = (PyObject **)((char *)o + off);
    PyObject *old = *slot;
    *slot = v;
    Py_XDECREF(old);
}

static PyObject *new_decision(PyObject *rid, PyObject *source) { /* steals source */
    if (source == NULL)
        return NULL;
    PyObject *d = S.dtype->tp_alloc(S.dtype, 0);
    if (d == NULL) {
        Py_DECREF(source);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < S.nd; i++) {
        PyObject *v = S.dfactory[i] ? PyList_New(0) : Py_NewRef(S.ddefault[i]);
        if (v == NULL) {
            Py_DECREF(source);
            Py_DECREF(d);
            return NULL;
        }
        set_slot(d, S.doff[i], v);
    }
    set_slot(d, S.o_rid, Py_NewRef(rid));
    set_slot(d, S.o_router, Py_NewRef(S.smg));
    set_slot(d, S.o_source, source);
    return d;
}

/* attr of obj through conv (as_int / as_float / none) into the decision's slot */
static int set_conv(PyObject *d, Py_ssize_t off, PyObject *obj, PyObject *attr,
                    PyObject *(*conv)(PyObject *)) {
    PyObject *v = PyObject_GetAttr(obj, attr);
    if (v == NULL)
        return -1;
    if (conv != NULL) {
        PyObject *c = conv(v);
        Py_DECREF(v);
        if (c == NULL)
            return -1;
        v = c;
    }
    set_slot(d, off, v);
    return 0;
}

/* smg_typed._decision of the line: a new reference, Py_None for no decision, NULL on error */
static PyObject *decision(PyObject *line, PyObject *rid, PyObject *msg, Text m,
                          PyObject *errors) {
    PyObject *d;
    if (starts_any(m, SELECTIONS)) {
        d = new_decision(rid, PyUnicode_Concat(s_log_prefix, msg));
        if (d == NULL || set_conv(d, S.o_worker, line, n_worker, NULL) < 0 ||
            set_conv(d, S.o_branch, line, n_branch, NULL) < 0 ||
            set_conv(d, S.o_overlap, line, n_overlap_blocks, as_int) < 0 ||
            set_conv(d, S.o_reqblocks, line, n_request_blocks, as_int) < 0 ||
            set_conv(d, S.o_ratio, line, n_matched_ratio, as_float) < 0 ||
            set_conv(d, S.o_matched, line, n_matched_units, as_int) < 0 ||
            set_conv(d, S.o_input, line, n_input_units, as_int) < 0 ||
            set_conv(d, S.o_credited, line, n_credited_units, as_int) < 0 ||
            set_conv(d, S.o_policy, line, n_policy, NULL) < 0)
            goto fail;
        return d;
    }
    if (is(m, "Cache routing dispatch") || is(m, "pipeline attempt failed"))
        return PyObject_CallFunctionObjArgs(S.py_decision, line, rid, msg, errors, NULL);
    if (is(m, "Token expansion complete")) {
        d = new_decision(rid, Py_NewRef(s_token_expansion));
        if (d == NULL || set_conv(d, S.o_original, line, n_original_len, as_int) < 0 ||
            set_conv(d, S.o_expanded, line, n_expanded_len, as_int) < 0)
            goto fail;
        return d;
    }
    d = new_decision(rid, Py_NewRef(s_mm_timing)); /* typed_line let only mm_timing here */
    if (d == NULL)
        return NULL;
    PyObject *original = PyObject_GetAttr(line, n_original_tokens);
    if (original == NULL)
        goto fail;
    if (original == S.unset) {
        Py_DECREF(original);
    } else {
        PyObject *c = as_int(original);
        Py_DECREF(original);
        if (c == NULL)
            goto fail;
        set_slot(d, S.o_original, c);
    }
    if (set_conv(d, S.o_expanded, line, n_expanded_tokens, as_int) < 0)
        goto fail;
    return d;
fail:
    Py_XDECREF(d);
    return NULL;
}

/* parse_ts(v), the last one's answer kept */
static PyObject *parse_ts(PyObject *v) {
    if (S.last_ts != NULL && PyUnicode_CheckExact(v) && PyUnicode_CheckExact(S.last_ts)) {
        int eq = PyUnicode_Compare(v, S.last_ts);
        if (eq == 0)
            return Py_NewRef(S.last_when);
        if (eq == -1 && PyErr_Occurred())
            return NULL;
    }
    PyObject *when = PyObject_CallOneArg(S.parse_ts, v);
    if (when != NULL) {
        Py_XSETREF(S.last_ts, Py_NewRef(v));
        Py_XSETREF(S.last_when, Py_NewRef(when));
    }
    return when;
}

/* The truth of a value this function is handed (a new reference; NULL: an error, -1) */
static int truth_of(PyObject *v) {
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static int truthy_attr(PyObject *o, PyObject *name) { return truth_of(PyObject_GetAttr(o, name)); }

/* observed_logs.smg_says_something */
static int says_something(PyObject *msg, Text m) {
    if (is_any(m, SAYS) || starts(m, MM_TIMING) || starts(m, "Request "))
        return 1;
    if (memmem(m.s, (size_t)m.n, "Processing", 10) == NULL)
        return 0;
    return truth_of(PyObject_CallOneArg(S.says_something, msg));
}

/* smg_typed._fields: 1 when the line said something of its request, 0 not, -1 error */
static int fields(PyObject *t, PyObject *line, PyObject *span, PyObject *msg, Text m,
                  PyObject *seq) {
    if (is_any(m, SELECTIONS)) {
        if (put_attr(t, n_worker, line, n_worker) < 0 ||
            put_attr(t, n_model, line, n_model_id) < 0 || put(t, n_sent_seq, seq) < 0)
            return -1;
        return 1;
    }
    if (is(m, "finished processing request")) {
        PyObject *status = PyObject_GetAttr(span, n_status_code);
        if (status == NULL || put_new(t, n_status, as_int(status)) < 0) {
            Py_XDECREF(status);
            return -1;
        }
        Py_DECREF(status);
        PyObject *lat = PyObject_GetAttr(span, n_latency);
        PyObject *f = lat == NULL ? NULL : as_float(lat);
        Py_XDECREF(lat);
        if (f == NULL)
            return -1;
        if (f != Py_None)
            Py_SETREF(f, PyFloat_FromDouble(PyFloat_AS_DOUBLE(f) / 1e6));
        return put_new(t, n_latency_s, f) < 0 ? -1 : 1;
    }
    if (is(m, "Fetched images for multimodal processing")) {
        PyObject *sizes = PyObject_GetAttr(line, n_item_sizes);
        PyObject *r = sizes == NULL ? NULL : PyObject_CallFunctionObjArgs(
                                                 S.put_image_sizes, t, sizes, S.label, NULL);
        Py_XDECREF(sizes);
        Py_XDECREF(r);
        return r == NULL ? -1 : 1;
    }
    if (is(m, "Multimodal preprocessing complete")) {
        PyObject *a = PyObject_GetAttr(line, n_total_tokens), *b = NULL, *ta = NULL, *tb = NULL,
                 *r = NULL;
        if (a != NULL)
            b = PyObject_GetAttr(line, n_item_count);
        if (b != NULL)
            ta = as_int(a);
        if (ta != NULL)
            tb = as_int(b);
        if (tb != NULL)
            r = PyObject_CallFunctionObjArgs(S.put_image_tokens, t, ta, tb, S.label, NULL);
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(ta);
        Py_XDECREF(tb);
        Py_XDECREF(r);
        return r == NULL ? -1 : 1;
    }
    if (starts(m, MM_TIMING) || is(m, "Token expansion complete")) {
        if (put(t, n_processing_mode, s_router) < 0)
            return -1;
        PyObject *original = PyObject_GetAttr(line, n_original_tokens);
        if (original == NULL)
            return -1;
        if (original == S.unset) {
            Py_DECREF(original);
            original = PyObject_GetAttr(line, n_original_len);
            if (original == NULL)
                return -1;
        }
        PyObject *c = as_int(original);
        Py_DECREF(original);
        return put_new(t, n_rendered_tokens, c) < 0 ? -1 : 1;
    }
    /* Before the completion and model lines here, unlike in _fields: neither matches these */
    if (is(m, "Cache routing dispatch"))
        return put(t, n_sent_seq, seq) < 0 ? -1 : 1;
    if (is(m, "started processing request"))
        return 1;
    return truth_of(PyObject_CallFunctionObjArgs(S.tail, t, line, span, msg, seq, NULL));
}

/* smg_typed.read_typed of a decoded line */
static int read_typed(PyObject *line, PyObject *span, PyObject *rid_o, PyObject *msg, Text m,
                      int is_decision, PyObject *seq, PyObject *into, PyObject *decisions,
                      PyObject *failed, PyObject *note, PyObject *errors) {
    int rc = -1;
    PyObject *rid = NULL, *ts_o = NULL, *when = NULL, *t = NULL, *path = NULL, *tid = NULL;
    rid = PyUnicode_CheckExact(rid_o) ? Py_NewRef(rid_o) : PyObject_Str(rid_o);
    if (rid == NULL)
        goto done;
    ts_o = PyObject_GetAttr(line, n_timestamp);
    if (ts_o == NULL || (when = parse_ts(ts_o)) == NULL)
        goto done;
    if (is_decision) {
        PyObject *d = decision(line, rid, msg, m, errors);
        if (d == NULL)
            goto done;
        if (d != Py_None) {
            PyObject **dts = (PyObject **)((char *)d + S.o_ts);
            if (*dts == Py_None) {
                int has = PyObject_IsTrue(ts_o);
                PyObject *v = NULL;
                if (has > 0) {
                    v = Py_NewRef(when);
                } else if (has == 0) {
                    PyObject *tm = PyObject_GetAttr(line, n_time);
                    v = tm == NULL ? NULL : parse_ts(tm);
                    Py_XDECREF(tm);
                }
                if (v == NULL) {
                    Py_DECREF(d);
                    goto done;
                }
                set_slot(d, S.o_ts, v);
            }
            /* Attempts.note: a failed attempt's bookkeeping in Python; a selection takes
             * the attempt the failures before it name */
            if (is(m, "pipeline attempt failed")) {
                PyObject *r = PyObject_CallFunctionObjArgs(note, d, msg, NULL);
                if (r == NULL) {
                    Py_DECREF(d);
                    goto done;
                }
                Py_DECREF(r);
            } else if (is_any(m, SELECTIONS) &&
                       *(PyObject **)((char *)d + S.o_attempt) == Py_None) {
                PyObject *a = PyDict_GetItemWithError(failed, rid);
                if (a == NULL && PyErr_Occurred()) {
                    Py_DECREF(d);
                    goto done;
                }
                set_slot(d, S.o_attempt, Py_NewRef(a == NULL ? S.zero : a));
            }
            int app = PyList_Append(decisions, d);
            Py_DECREF(d);
            if (app < 0)
                goto done;
        } else {
            Py_DECREF(d);
        }
    } else if (is(m, "finished processing request")) {
        int has = PyDict_Contains(failed, rid);
        if (has < 0 || (has && PyDict_DelItem(failed, rid) < 0))
            goto done;
    }
    path = PyObject_GetAttr(span, n_path);
    if (path == NULL)
        goto done;
    int ok = PyUnicode_CheckExact(path) ? PySet_Contains(S.request_paths, path) : 0;
    if (ok < 0)
        goto done;
    if (!ok) {
        ok = truth_of(PyObject_CallOneArg(S.is_request_path, path));
        if (ok < 0)
            goto done;
        if (!ok) {
            rc = 0;
            goto done;
        }
    }
    tid = PyObject_GetAttr(span, n_trace_id);
    if (tid == NULL)
        goto done;
    int has_tid = PyObject_IsTrue(tid);
    if (has_tid < 0)
        goto done;
    t = PyDict_GetItemWithError(into, rid);
    if (t == NULL) {
        if (PyErr_Occurred())
            goto done;
        int wt = PyObject_IsTrue(when);
        if (wt < 0)
            goto done;
        t = PyObject_CallFunctionObjArgs(S.fragment, rid, S.source_log, wt ? when : S.zero_f,
                                         S.smg, NULL);
        if (t == NULL)
            goto done;
        PyObject *tv = has_tid ? PyObject_Str(tid) : Py_NewRef(Py_None);
        if (tv == NULL || PyObject_SetAttr(t, n_trace_id, tv) < 0) {
            Py_XDECREF(tv);
            goto done;
        }
        Py_DECREF(tv);
    } else {
        Py_INCREF(t);
        int says = says_something(msg, m);
        if (says <= 0) {
            rc = says;
            goto done;
        }
        int wt = PyObject_IsTrue(when);
        if (wt < 0)
            goto done;
        if (wt) {
            PyObject *cur = PyObject_GetAttr(t, n_ts);
            if (cur == NULL)
                goto done;
            int ct = PyObject_IsTrue(cur);
            int lt = ct > 0 ? PyObject_RichCompareBool(when, cur, Py_LT) : 0;
            Py_DECREF(cur);
            if (ct < 0 || lt < 0)
                goto done;
            if ((!ct || lt) && PyObject_SetAttr(t, n_ts, when) < 0)
                goto done;
        }
        int have = truthy_attr(t, n_trace_id);
        if (have < 0)
            goto done;
        if (!have && has_tid) {
            PyObject *tv = PyObject_Str(tid);
            if (tv == NULL || PyObject_SetAttr(t, n_trace_id, tv) < 0) {
                Py_XDECREF(tv);
                goto done;
            }
            Py_DECREF(tv);
        }
    }
    int said = fields(t, line, span, msg, m, seq);
    if (said < 0 || (said && PyDict_SetItem(into, rid, t) < 0))
        goto done;
    rc = 0;
done:
    Py_XDECREF(rid);
    Py_XDECREF(ts_o);
    Py_XDECREF(when);
    Py_XDECREF(t);
    Py_XDECREF(path);
    Py_XDECREF(tid);
    return rc;
}

/* One line: 1 read here, 0 not of the typed shape (the caller's ``other`` reads it), -1 an
 * error. As ``typed_line``: a JSON object with a request span, decoded as ``SmgLine``. */
static int take(PyObject *text, PyObject *seq, PyObject *into, PyObject *decisions,
                PyObject *failed, PyObject *note, PyObject *errors) {
    if (!PyUnicode_CheckExact(text))
        return 0;
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(text, &len);
    if (s == NULL) { /* a lone surrogate: the whole-object reader scrubs it */
        PyErr_Clear();
        return 0;
    }
    if (len == 0 || s[0] != '{' || memmem(s, (size_t)len, "\"span\":{", 8) == NULL)
        return 0;
    PyObject *line = PyObject_CallOneArg(S.decode, text);
    if (line == NULL) {
        if (PyErr_ExceptionMatches(S.decode_error) ||
            PyErr_ExceptionMatches(PyExc_RecursionError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    int rc = -1;
    PyObject *span = NULL, *rid = NULL, *flds = NULL, *msg = NULL;
    if ((span = PyObject_GetAttr(line, n_span)) == NULL)
        goto done;
    rc = 0;
    if (span == S.unset)
        goto done;
    rc = -1;
    if ((rid = PyObject_GetAttr(span, n_request_id)) == NULL)
        goto done;
    int has = PyObject_IsTrue(rid);
    if (has < 0 || (flds = PyObject_GetAttr(line, n_fields)) == NULL ||
        (msg = PyObject_GetAttr(line, n_message)) == NULL)
        goto done;
    rc = 0;
    if (!has || flds != Py_None || !PyUnicode_CheckExact(msg))
        goto done;
    Text m;
    m.s = PyUnicode_AsUTF8AndSize(msg, &m.n);
    if (m.s == NULL) {
        PyErr_Clear();
        goto done;
    }
    if (starts(m, STREAM_ALIAS))
        goto done;
    int is_decision = starts_any(m, DECISIONS);
    if (is_decision && !is_any(m, DECIDED_EXACT) && !starts_any(m, DECIDED_PREFIX))
        goto done;
    rc = read_typed(line, span, rid, msg, m, is_decision, seq, into, decisions, failed, note,
                    errors) < 0 ? -1 : 1;
done:
    Py_DECREF(line);
    Py_XDECREF(span);
    Py_XDECREF(rid);
    Py_XDECREF(flds);
    Py_XDECREF(msg);
    return rc;
}

static PyObject *read_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "_smglines.setup() was not called");
        return NULL;
    }
    if (nargs != 8 || !PyList_Check(args[0]) || !PyDict_CheckExact(args[2]) ||
        !PyList_Check(args[3]) || !PyDict_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "read(kept: list, seq_on: bool, into: dict, "
                                         "decisions: list, failed: dict, note, errors, other)");
        return NULL;
    }
    PyObject *kept = args[0], *into = args[2], *decisions = args[3], *failed = args[4],
             *note = args[5], *errors = args[6], *other = args[7];
    int seq_on = PyObject_IsTrue(args[1]);
    if (seq_on < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kept); i++) {
        PyObject *pair = PyList_GET_ITEM(kept, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "kept holds (number, line) pairs");
            return NULL;
        }
        PyObject *n = PyTuple_GET_ITEM(pair, 0), *text = PyTuple_GET_ITEM(pair, 1);
        int r = take(text, seq_on ? n : Py_None, into, decisions, failed, note, errors);
        if (r < 0)
            return NULL;
        if (r == 0) {
            PyObject *o = PyObject_CallFunctionObjArgs(other, n, text, NULL);
            if (o == NULL)
                return NULL;
            Py_DECREF(o);
        }
    }
    Py_RETURN_NONE;
}

/* ---- setup ---- */
static PyObject *item(PyObject *config, const char *key) {
    PyObject *v = PyDict_GetItemString(config, key);
    if (v == NULL)
        PyErr_Format(PyExc_KeyError, "setup: no %s", key);
    else
        Py_INCREF(v);
    return v;
}

static int member_offset(PyTypeObject *type, const char *name, Py_ssize_t *off) {
    PyObject *descr = PyDict_GetItemString(type->tp_dict, name);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "setup: %s.%s is no slot", type->tp_name, name);
        return -1;
    }
    *off = ((PyMemberDescrObject *)descr)->d_member->offset;
    return 0;
}

static PyObject *intern(const char *s) { return PyUnicode_InternFromString(s); }

static PyObject *setup(PyObject *self, PyObject *config) {
    if (!PyDict_Check(config)) {
        PyErr_SetString(PyExc_TypeError, "setup(config: dict)");
        return NULL;
    }
    ready = 0;
#define ITEM(field, key)                                                                     \
    do {                                                                                     \
        Py_XSETREF(S.field, item(config, key));                                              \
        if (S.field == NULL)                                                                 \
            return NULL;                                                                     \
    } while (0)
    ITEM(decode, "decode");
    ITEM(decode_error, "decode_error");
    ITEM(unset, "unset");
    ITEM(py_decision, "decision");
    ITEM(fragment, "fragment");
    ITEM(parse_ts, "parse_ts");
    ITEM(as_int, "as_int");
    ITEM(as_float, "as_float");
    ITEM(is_request_path, "is_request_path");
    ITEM(says_something, "says_something");
    ITEM(put_image_sizes, "put_image_sizes");
    ITEM(put_image_tokens, "put_image_tokens");
    ITEM(tail, "tail");
    ITEM(text_fields, "text_fields");
    ITEM(request_paths, "request_paths");
    ITEM(label, "label");
    ITEM(source_log, "source_log");
#undef ITEM
    if (!PyAnySet_Check(S.text_fields) || !PyAnySet_Check(S.request_paths)) {
        PyErr_SetString(PyExc_TypeError, "setup: text_fields and request_paths are sets");
        return NULL;
    }
    PyObject *dtype = PyDict_GetItemString(config, "decision_type");
    PyObject *dfields = PyDict_GetItemString(config, "decision_fields");
    if (dtype == NULL || !PyType_Check(dtype) || dfields == NULL || !PyTuple_Check(dfields) ||
        PyTuple_GET_SIZE(dfields) > MAX_DFIELDS) {
        PyErr_SetString(PyExc_TypeError, "setup: decision_type, decision_fields");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)dtype;
    for (Py_ssize_t i = 0; i < S.nd; i++)
        Py_CLEAR(S.ddefault[i]);
    S.nd = 0;
    /* (name, default, is_factory) per field, in order; the three without a default first */
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dfields); i++) {
        PyObject *f = PyTuple_GET_ITEM(dfields, i);
        const char *name;
        PyObject *dflt;
        int factory;
        if (!PyTuple_Check(f) || !PyArg_ParseTuple(f, "sOp", &name, &dflt, &factory))
            return NULL;
        if (member_offset(type, name, &S.doff[i]) < 0)
            return NULL;
        S.ddefault[i] = Py_NewRef(dflt);
        S.dfactory[i] = (char)factory;
        S.nd = i + 1;
    }
    if (member_offset(type, "request_id", &S.o_rid) < 0 ||
        member_offset(type, "router", &S.o_router) < 0 ||
        member_offset(type, "source", &S.o_source) < 0 ||
        member_offset(type, "worker", &S.o_worker) < 0 ||
        member_offset(type, "branch", &S.o_branch) < 0 ||
        member_offset(type, "overlap_blocks", &S.o_overlap) < 0 ||
        member_offset(type, "request_blocks", &S.o_reqblocks) < 0 ||
        member_offset(type, "matched_ratio", &S.o_ratio) < 0 ||
        member_offset(type, "matched_units", &S.o_matched) < 0 ||
        member_offset(type, "input_units", &S.o_input) < 0 ||
        member_offset(type, "credited_units", &S.o_credited) < 0 ||
        member_offset(type, "policy", &S.o_policy) < 0 ||
        member_offset(type, "original_tokens", &S.o_original) < 0 ||
        member_offset(type, "expanded_tokens", &S.o_expanded) < 0 ||
        member_offset(type, "ts", &S.o_ts) < 0 || member_offset(type, "attempt", &S.o_attempt) < 0)
        return NULL;
    Py_XSETREF(S.dtype, (PyTypeObject *)Py_NewRef(dtype));
    Py_XSETREF(S.smg, intern("smg"));
    Py_XSETREF(S.zero, PyLong_FromLong(0));
    Py_XSETREF(S.zero_f, PyFloat_FromDouble(0.0));
    Py_CLEAR(S.last_ts);
    Py_CLEAR(S.last_when);
    if (S.smg == NULL || S.zero == NULL || S.zero_f == NULL)
        return NULL;
    ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)setup, METH_O, "The decoders, helpers and types read() calls."},
    {"read", (PyCFunction)(void (*)(void))read_batch, METH_FASTCALL,
     "A batch of kept SMG lines into decisions and request fragments."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_smglines", NULL, -1, methods};

PyMODINIT_FUNC PyInit__smglines(void) {
#define NAME(var, s)                                                                         \
    if ((var = intern(s)) == NULL)                                                           \
        return NULL;
    NAME(n_span, "span") NAME(n_message, "message") NAME(n_timestamp, "timestamp")
    NAME(n_time, "time") NAME(n_fields, "fields") NAME(n_worker, "worker")
    NAME(n_model_id, "model_id") NAME(n_branch, "branch")
    NAME(n_overlap_blocks, "overlap_blocks") NAME(n_request_blocks, "request_blocks")
    NAME(n_matched_ratio, "matched_ratio") NAME(n_matched_units, "matched_units")
    NAME(n_input_units, "input_units") NAME(n_credited_units, "credited_units")
    NAME(n_policy, "policy") NAME(n_original_tokens, "original_tokens")
    NAME(n_expanded_tokens, "expanded_tokens") NAME(n_original_len, "original_len")
    NAME(n_expanded_len, "expanded_len") NAME(n_item_sizes, "item_sizes")
    NAME(n_total_tokens, "total_tokens") NAME(n_item_count, "item_count")
    NAME(n_request_id, "request_id") NAME(n_path, "path") NAME(n_trace_id, "trace_id")
    NAME(n_status_code, "status_code") NAME(n_latency, "latency") NAME(n_ts, "ts")
    NAME(n_provenance, "provenance") NAME(n_model, "model") NAME(n_sent_seq, "sent_seq")
    NAME(n_status, "status") NAME(n_latency_s, "latency_s")
    NAME(n_processing_mode, "processing_mode") NAME(n_rendered_tokens, "rendered_tokens")
    NAME(s_router, "router") NAME(s_log_prefix, "log:")
    NAME(s_token_expansion, "log:token_expansion") NAME(s_mm_timing, "log:mm_timing")
#undef NAME
    return PyModule_Create(&module);
}
