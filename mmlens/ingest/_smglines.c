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

#define MAX_FIELDS 64

/* A slots dataclass made without its __init__: per field in order, its slot's offset and its
 * default (a value, or a fresh list or dict) */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t n, off[MAX_FIELDS];
    PyObject *dflt[MAX_FIELDS];
    char factory[MAX_FIELDS]; /* 0 the value, 1 list, 2 dict */
} Shape;

static Shape DECISION, CANDIDATE, SCORE, GATE, TRACE;

typedef struct {
    PyObject *decode, *decode_alias, *decode_error, *unset, *py_decision, *parse_ts, *as_int,
        *as_float, *is_request_path, *says_something, *put_image_sizes, *put_image_tokens,
        *tail, *text_fields, *request_paths, *label, *source_log, *smg, *zero, *zero_f, *billion;
    PyObject *decode_trace, *score_known, *truncated_warning;
    PyObject *fragment_proto; /* fragment("", source_log, 0.0, "smg") */
    Py_ssize_t o_t_rid, o_t_ts;
    /* offsets of the decision fields set here */
    Py_ssize_t o_rid, o_router, o_source, o_worker, o_branch, o_overlap, o_reqblocks, o_ratio,
        o_matched, o_input, o_credited, o_policy, o_original, o_expanded, o_ts, o_attempt,
        o_origin, o_pred_source, o_block_size, o_candidates, o_scores, o_gates, o_warnings;
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
    *s_router, *s_log_prefix, *s_token_expansion, *s_mm_timing, *n_load, *n_average_load,
    *n_relative_threshold, *n_absolute_threshold, *n_absolute_margin, *n_spill, *n_healthy,
    *n_overloaded, *n_source, *n_score_unit, *n_effective_score, *n_score, *n_device_blocks,
    *n_attempt, *n_dispatch_timestamp_ns, *n_selections, *n_origin, *n_prediction,
    *n_block_size, *n_candidates, *n_scores, *n_gates, *n_unattributed_gates, *n_truncated,
    *n_evidence, *n_aliases, *n_stream, *n_ended_seq, *n_spans;

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
    if (PyLong_CheckExact(v)) { /* float(v); too large for a float: None */
        double d = PyLong_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return NULL;
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return PyFloat_FromDouble(d);
    }
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

/* ---- records without __init__ ---- */
static void set_slot(PyObject *o, Py_ssize_t off, PyObject *v) { /* steals v */
    PyObject **slot = (PyObject **)((char *)o + off);
    PyObject *old = *slot;
    *slot = v;
    Py_XDECREF(old);
}

static PyObject *slot_of(PyObject *o, Py_ssize_t off) { return *(PyObject **)((char *)o + off); }

/* A record of the shape: its first nvals fields from vals (new references, stolen even on
 * error; NULL in vals only after an error, which fails it), the rest their defaults. */
static PyObject *new_record(Shape *sh, PyObject **vals, Py_ssize_t nvals) {
    PyObject *o = NULL;
    for (Py_ssize_t i = 0; i < nvals; i++)
        if (vals[i] == NULL)
            goto fail;
    if ((o = sh->type->tp_alloc(sh->type, 0)) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < sh->n; i++) {
        PyObject *v;
        if (i < nvals) {
            v = vals[i];
            vals[i] = NULL;
        } else {
            v = sh->factory[i] == 1   ? PyList_New(0)
                : sh->factory[i] == 2 ? PyDict_New()
                                      : Py_NewRef(sh->dflt[i]);
            if (v == NULL)
                goto fail;
        }
        set_slot(o, sh->off[i], v);
    }
    return o;
fail:
    for (Py_ssize_t i = 0; i < nvals; i++)
        Py_XDECREF(vals[i]);
    Py_XDECREF(o);
    return NULL;
}

static PyObject *new_decision(PyObject *rid, PyObject *source) { /* steals source */
    PyObject *vals[3] = {Py_NewRef(rid), Py_NewRef(S.smg), source};
    return new_record(&DECISION, vals, 3);
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

/* ---- the cache trace: smg_typed._trace_decision ---- */
static PyObject *attr(PyObject *o, PyObject *name) { return PyObject_GetAttr(o, name); }

static PyObject *attr_conv(PyObject *o, PyObject *name, PyObject *(*conv)(PyObject *)) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL || conv == NULL)
        return v;
    PyObject *c = conv(v);
    Py_DECREF(v);
    return c;
}

static PyObject *bool_or_none(PyObject *v) { /* steals v */
    if (v == NULL)
        return NULL;
    if (PyBool_Check(v))
        return v;
    Py_DECREF(v);
    Py_RETURN_NONE;
}

/* A list (or None: an empty one) of the records conv makes of each item, appended to out */
static int each(PyObject *items, PyObject *out, PyObject *(*conv)(PyObject *)) {
    if (items == Py_None)
        return 0;
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "a typed list");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *r = conv(PyList_GET_ITEM(items, i));
        if (r == NULL || PyList_Append(out, r) < 0) {
            Py_XDECREF(r);
            return -1;
        }
        Py_DECREF(r);
    }
    return 0;
}

static PyObject *gate(PyObject *g) {
    PyObject *vals[7] = {attr(g, n_worker), attr_conv(g, n_load, as_float),
                         attr_conv(g, n_average_load, as_float),
                         attr_conv(g, n_relative_threshold, as_float),
                         attr_conv(g, n_absolute_threshold, as_float),
                         attr_conv(g, n_absolute_margin, as_float), bool_or_none(attr(g, n_spill))};
    return new_record(&GATE, vals, 7);
}

static PyObject *candidate(PyObject *c) {
    PyObject *w = attr(c, n_worker);
    if (w != NULL) {
        if (w == S.unset)
            Py_SETREF(w, PyUnicode_FromString(""));
        else if (!PyUnicode_CheckExact(w))
            Py_SETREF(w, PyObject_Str(w));
    }
    PyObject *vals[4] = {w, attr_conv(c, n_load, as_float), bool_or_none(attr(c, n_healthy)),
                         bool_or_none(attr(c, n_overloaded))};
    return new_record(&CANDIDATE, vals, 4);
}

/* dict.get of a str key, a new reference (None when absent) */
static PyObject *get(PyObject *d, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL && PyErr_Occurred())
        return NULL;
    return Py_NewRef(v == NULL ? Py_None : v);
}

static PyObject *get_conv(PyObject *d, PyObject *key, PyObject *(*conv)(PyObject *)) {
    PyObject *v = get(d, key);
    if (v == NULL)
        return NULL;
    PyObject *c = conv(v);
    Py_DECREF(v);
    return c;
}

/* router_logs.score_of */
static PyObject *score(PyObject *s) {
    if (!PyDict_CheckExact(s)) {
        PyErr_SetString(PyExc_TypeError, "a score is a dict");
        return NULL;
    }
    PyObject *src = PyDict_GetItemWithError(s, n_source);
    if (src == NULL && PyErr_Occurred())
        return NULL;
    PyObject *source = src == NULL ? PyUnicode_FromString("unknown") : PyObject_Str(src);
    if (source == NULL)
        return NULL;
    int affinity = PyUnicode_CompareWithASCIIString(source, "policy_affinity") == 0;
    PyObject *unit = get(s, n_score_unit);
    if (unit != NULL) {
        int t = PyObject_IsTrue(unit);
        if (t < 0)
            Py_CLEAR(unit);
        else if (!t)
            Py_SETREF(unit, affinity ? PyUnicode_FromString("blocks") : Py_NewRef(Py_None));
    }
    PyObject *details = PyDict_New();
    if (details != NULL) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(s, &pos, &k, &v)) {
            int known = PySet_Contains(S.score_known, k);
            if (known < 0 || (!known && PyDict_SetItem(details, k, v) < 0)) {
                Py_CLEAR(details);
                break;
            }
        }
    }
    PyObject *vals[7] = {source, get(s, n_worker),
                         get_conv(s, affinity ? n_effective_score : n_score, as_float), unit,
                         get_conv(s, n_device_blocks, as_float),
                         get_conv(s, n_request_blocks, as_int), details};
    return new_record(&SCORE, vals, 7);
}

static int set_new(PyObject *d, Py_ssize_t off, PyObject *v) { /* steals v */
    if (v == NULL)
        return -1;
    set_slot(d, off, v);
    return 0;
}

static PyObject *trace_decision(PyObject *trace, PyObject *rid) {
    PyObject *d = new_decision(rid, PyUnicode_FromString("log:cache_trace"));
    PyObject *ns = NULL, *sels = NULL, *sel = NULL, *pred = NULL, *items = NULL;
    if (d == NULL || set_new(d, S.o_attempt, attr_conv(trace, n_attempt, as_int)) < 0 ||
        (ns = attr_conv(trace, n_dispatch_timestamp_ns, as_int)) == NULL)
        goto fail;
    if (ns != Py_None) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(ns, &overflow);
        if (v == -1 && PyErr_Occurred())
            goto fail;
        if (overflow == 0 && v > 0 && set_new(d, S.o_ts, PyNumber_TrueDivide(
                                                            ns, S.billion)) < 0)
            goto fail;
    }
    if ((sels = attr(trace, n_selections)) == NULL)
        goto fail;
    if (PyList_Check(sels) && PyList_GET_SIZE(sels) > 0) {
        sel = Py_NewRef(PyList_GET_ITEM(sels, 0));
        if (set_new(d, S.o_worker, attr(sel, n_worker)) < 0 ||
            set_new(d, S.o_policy, attr(sel, n_policy)) < 0 ||
            set_new(d, S.o_origin, attr(sel, n_origin)) < 0 || (pred = attr(sel, n_prediction)) == NULL)
            goto fail;
        if (pred != Py_None) {
            if (set_new(d, S.o_pred_source, attr(pred, n_source)) < 0 ||
                set_new(d, S.o_branch, attr(pred, n_branch)) < 0 ||
                set_new(d, S.o_overlap, attr_conv(pred, n_overlap_blocks, as_int)) < 0 ||
                set_new(d, S.o_reqblocks, attr_conv(pred, n_request_blocks, as_int)) < 0 ||
                set_new(d, S.o_block_size, attr_conv(pred, n_block_size, as_int)) < 0 ||
                set_new(d, S.o_matched, attr_conv(pred, n_matched_units, as_int)) < 0 ||
                set_new(d, S.o_input, attr_conv(pred, n_input_units, as_int)) < 0 ||
                set_new(d, S.o_credited, attr_conv(pred, n_credited_units, as_int)) < 0)
                goto fail;
            PyObject *mu = slot_of(d, S.o_matched), *iu = slot_of(d, S.o_input);
            if (mu != Py_None) {
                int t = PyObject_IsTrue(iu);
                if (t < 0 || (t && set_new(d, S.o_ratio, PyNumber_TrueDivide(mu, iu)) < 0))
                    goto fail;
            }
        }
        if ((items = attr(sel, n_candidates)) == NULL ||
            each(items, slot_of(d, S.o_candidates), candidate) < 0)
            goto fail;
        Py_SETREF(items, attr(sel, n_scores));
        if (items == NULL || each(items, slot_of(d, S.o_scores), score) < 0)
            goto fail;
        Py_SETREF(items, attr(sel, n_gates));
        if (items == NULL || each(items, slot_of(d, S.o_gates), gate) < 0)
            goto fail;
    }
    Py_XSETREF(items, attr(trace, n_unattributed_gates));
    if (items == NULL || each(items, slot_of(d, S.o_gates), gate) < 0)
        goto fail;
    PyObject *truncated = attr(trace, n_truncated);
    if (truncated == NULL)
        goto fail;
    int is_true = truncated == Py_True;
    Py_DECREF(truncated);
    if (is_true && PyList_Append(slot_of(d, S.o_warnings), S.truncated_warning) < 0)
        goto fail;
    Py_XDECREF(ns);
    Py_XDECREF(sels);
    Py_XDECREF(sel);
    Py_XDECREF(pred);
    Py_XDECREF(items);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(ns);
    Py_XDECREF(sels);
    Py_XDECREF(sel);
    Py_XDECREF(pred);
    Py_XDECREF(items);
    return NULL;
}

/* The cache trace's decision read here when its evidence decodes as ``CacheTrace`` (None:
 * the Python reader decides, as for any other evidence) */
static PyObject *cache_dispatch(PyObject *line, PyObject *rid) {
    PyObject *ev = PyObject_GetAttr(line, n_evidence);
    if (ev == NULL)
        return NULL;
    if (!PyUnicode_Check(ev) || PyUnicode_GET_LENGTH(ev) == 0 ||
        PyUnicode_READ_CHAR(ev, 0) != '{') {
        Py_DECREF(ev);
        Py_RETURN_NONE;
    }
    PyObject *trace = PyObject_CallOneArg(S.decode_trace, ev);
    Py_DECREF(ev);
    if (trace == NULL) {
        if (PyErr_ExceptionMatches(S.decode_error) ||
            PyErr_ExceptionMatches(PyExc_RecursionError)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    PyObject *d = trace_decision(trace, rid);
    Py_DECREF(trace);
    if (d == NULL && (PyErr_ExceptionMatches(PyExc_ValueError) ||
                      PyErr_ExceptionMatches(PyExc_TypeError) ||
                      PyErr_ExceptionMatches(PyExc_ArithmeticError) ||
                      PyErr_ExceptionMatches(PyExc_RecursionError))) {
        PyErr_Clear(); /* the Python reader counts it as it counts any */
        Py_RETURN_NONE;
    }
    return d;
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
    if (is(m, "Cache routing dispatch")) {
        d = cache_dispatch(line, rid);
        if (d != Py_None)
            return d;
        Py_DECREF(d);
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

/* Python's \s in a str pattern, for ASCII text */
static int is_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

static int ascii(Text m) {
    for (Py_ssize_t i = 0; i < m.n; i++)
        if ((unsigned char)m.s[i] >= 0x80)
            return 0;
    return 1;
}

/* observed.alias with a str id */
static int alias(PyObject *t, PyObject *rid) {
    PyObject *own = PyObject_GetAttr(t, n_request_id), *aliases = NULL;
    int rc = -1;
    if (own == NULL)
        return -1;
    int same = PyObject_RichCompareBool(rid, own, Py_EQ);
    if (same < 0)
        goto done;
    rc = 0;
    if (same || PyUnicode_GET_LENGTH(rid) == 0)
        goto done;
    rc = -1;
    if ((aliases = PyObject_GetAttr(t, n_aliases)) == NULL)
        goto done;
    int has = PySequence_Contains(aliases, rid);
    if (has < 0 || (!has && PyList_Append(aliases, rid) < 0))
        goto done;
    rc = 0;
done:
    Py_DECREF(own);
    Py_XDECREF(aliases);
    return rc;
}

/* ``^Request (\S+) marked as completed`` of an ASCII message: the id's length, or 0 */
static Py_ssize_t completed_id(Text m) {
    static const char tail[] = " marked as completed";
    Py_ssize_t i = 8; /* after "Request " */
    if (!starts(m, "Request "))
        return 0;
    while (i < m.n && !is_space(m.s[i]))
        i++;
    if (i == 8 || (size_t)(m.n - i) < sizeof tail - 1 || memcmp(m.s + i, tail, sizeof tail - 1))
        return 0;
    return i - 8;
}

/* ``request for model: ([^,\s]+)`` searched in an ASCII message: the group's start, or -1 */
static Py_ssize_t model_in(Text m, Py_ssize_t *len) {
    static const char key[] = "request for model: ";
    const char *at = m.s, *end = m.s + m.n;
    while ((at = memmem(at, (size_t)(end - at), key, sizeof key - 1)) != NULL) {
        const char *g = at + sizeof key - 1, *e = g;
        while (e < end && *e != ',' && !is_space(*e))
            e++;
        if (e > g) {
            *len = e - g;
            return g - m.s;
        }
        at++;
    }
    return -1;
}

/* _fields' completion and model lines of an ASCII message (1 said, 0 not) */
static int completion_or_model(PyObject *t, Text m, PyObject *seq) {
    Py_ssize_t n = completed_id(m);
    if (n > 0) {
        PyObject *rid = PyUnicode_FromStringAndSize(m.s + 8, n);
        if (rid == NULL || alias(t, rid) < 0) {
            Py_XDECREF(rid);
            return -1;
        }
        Py_DECREF(rid);
        if (put(t, n_stream, Py_False) < 0 || put(t, n_ended_seq, seq) < 0)
            return -1;
        return 1;
    }
    Py_ssize_t len, at = model_in(m, &len);
    if (at < 0 || memmem(m.s, (size_t)m.n, "Processing", 10) == NULL)
        return 0;
    return put_new(t, n_model, PyUnicode_FromStringAndSize(m.s + at, len)) < 0 ? -1 : 1;
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
    if (ascii(m))
        return completion_or_model(t, m, seq);
    return truth_of(PyObject_CallFunctionObjArgs(S.tail, t, line, span, msg, seq, NULL));
}

/* smg_typed.read_typed of a decoded line */
/* is_request_path(span.path): 1, 0, or -1 an error */
static int request_path(PyObject *span) {
    PyObject *path = PyObject_GetAttr(span, n_path);
    if (path == NULL)
        return -1;
    int ok = PyUnicode_CheckExact(path) ? PySet_Contains(S.request_paths, path) : 0;
    if (ok == 0)
        ok = truth_of(PyObject_CallOneArg(S.is_request_path, path));
    Py_DECREF(path);
    return ok < 0 ? -1 : ok;
}

/* A new fragment of the request ``rid`` at ``when`` (0.0 if unknown), ``tid`` its trace id
 * when truthy: ``fragment_proto``'s fields (its lists and dicts copies), its id and time
 * these: a new reference, NULL an error */
static PyObject *new_fragment(PyObject *rid, PyObject *when, PyObject *tid) {
    int wt = PyObject_IsTrue(when), has_tid = PyObject_IsTrue(tid);
    if (wt < 0 || has_tid < 0)
        return NULL;
    PyObject *t = TRACE.type->tp_alloc(TRACE.type, 0);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < TRACE.n; i++) {
        PyObject *v = slot_of(S.fragment_proto, TRACE.off[i]);
        v = PyList_CheckExact(v)   ? PyList_GetSlice(v, 0, PyList_GET_SIZE(v))
            : PyDict_CheckExact(v) ? PyDict_Copy(v)
                                   : Py_XNewRef(v);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        set_slot(t, TRACE.off[i], v);
    }
    set_slot(t, S.o_t_rid, Py_NewRef(rid));
    set_slot(t, S.o_t_ts, Py_NewRef(wt ? when : S.zero_f));
    PyObject *tv = has_tid ? PyObject_Str(tid) : Py_NewRef(Py_None);
    if (tv == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    if (PyObject_SetAttr(t, n_trace_id, tv) < 0) {
        Py_DECREF(tv);
        Py_DECREF(t);
        return NULL;
    }
    Py_DECREF(tv);
    return t;
}

static int read_typed(PyObject *line, PyObject *span, PyObject *rid_o, PyObject *msg, Text m,
                      int is_decision, PyObject *seq, PyObject *into, PyObject *decisions,
                      PyObject *failed, PyObject *note, PyObject *errors) {
    int rc = -1;
    PyObject *rid = NULL, *ts_o = NULL, *when = NULL, *t = NULL, *tid = NULL;
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
    int ok = request_path(span);
    if (ok <= 0) {
        rc = ok;
        goto done;
    }
    tid = PyObject_GetAttr(span, n_trace_id);
    if (tid == NULL)
        goto done;
    int has_tid = PyObject_IsTrue(tid);
    if (has_tid < 0)
        goto done;
    t = PyDict_GetItemWithError(into, rid);
    if (t == NULL) {
        if (PyErr_Occurred() || (t = new_fragment(rid, when, tid)) == NULL)
            goto done;
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
    Py_XDECREF(tid);
    return rc;
}

/* decode(text), NULL with no error set when it is not of the decoder's shape (the whole-object
 * reader takes such a line) */
static PyObject *decoded(PyObject *decode, PyObject *text) {
    PyObject *line = PyObject_CallOneArg(decode, text);
    if (line == NULL && (PyErr_ExceptionMatches(S.decode_error) ||
                         PyErr_ExceptionMatches(PyExc_RecursionError)))
        PyErr_Clear();
    return line;
}

/* ``observed_logs._engine_alias`` of a JSON line whose message field is SMG's engine alias:
 * 1 read here (whatever it said), 0 not of the shape read here (the caller goes on with the
 * line), -1 an error. Read when, as the whole object, it has a span, no ``fields``, an ASCII
 * message starting with STREAM_ALIAS and ``spans`` a list of objects. */
static int alias_line(PyObject *text, PyObject *into) {
    PyObject *line = decoded(S.decode_alias, text);
    if (line == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int rc = -1;
    PyObject *span = NULL, *flds = NULL, *msg = NULL, *spans = NULL, *rid = NULL, *tid = NULL,
             *ts_o = NULL, *when = NULL, *t = NULL, *engine = NULL;
    if ((span = PyObject_GetAttr(line, n_span)) == NULL ||
        (flds = PyObject_GetAttr(line, n_fields)) == NULL ||
        (msg = PyObject_GetAttr(line, n_message)) == NULL ||
        (spans = PyObject_GetAttr(line, n_spans)) == NULL)
        goto done;
    rc = 0;
    if (span == S.unset || flds != Py_None || !PyUnicode_CheckExact(msg) ||
        !PyUnicode_IS_ASCII(msg))
        goto done;
    Text m;
    m.s = PyUnicode_AsUTF8AndSize(msg, &m.n);
    if (m.s == NULL || !starts(m, STREAM_ALIAS))
        goto done;
    rc = 1; /* from here the whole reader would read nothing else of the line */
    static const char head[] = STREAM_ALIAS " for request ";
    Py_ssize_t from = (Py_ssize_t)strlen(head), to = from;
    if (!starts(m, head))
        goto done;
    while (to < m.n && !is_space(m.s[to]))
        to++;
    if (to == from || spans == Py_None || PyList_GET_SIZE(spans) == 0)
        goto done;
    PyObject *outer = PyList_GET_ITEM(spans, 0);
    rc = -1;
    if ((rid = PyObject_GetAttr(outer, n_request_id)) == NULL)
        goto done;
    int has = PyObject_IsTrue(rid);
    if (has < 0)
        goto done;
    rc = 1;
    if (!has)
        goto done;
    int ok = request_path(outer);
    if (ok <= 0) {
        rc = ok < 0 ? -1 : 1;
        goto done;
    }
    rc = -1;
    PyObject *key = PyUnicode_CheckExact(rid) ? Py_NewRef(rid) : PyObject_Str(rid);
    if (key == NULL)
        goto done;
    Py_SETREF(rid, key);
    t = PyDict_GetItemWithError(into, rid);
    if (t != NULL) {
        Py_INCREF(t);
    } else {
        if (PyErr_Occurred() || (ts_o = PyObject_GetAttr(line, n_timestamp)) == NULL ||
            (when = parse_ts(ts_o)) == NULL ||
            (tid = PyObject_GetAttr(outer, n_trace_id)) == NULL ||
            (t = new_fragment(rid, when, tid)) == NULL || PyDict_SetItem(into, rid, t) < 0)
            goto done;
    }
    if ((engine = PyUnicode_FromStringAndSize(m.s + from, to - from)) == NULL ||
        alias(t, engine) < 0)
        goto done;
    rc = 1;
done:
    Py_DECREF(line);
    Py_XDECREF(span);
    Py_XDECREF(flds);
    Py_XDECREF(msg);
    Py_XDECREF(spans);
    Py_XDECREF(rid);
    Py_XDECREF(tid);
    Py_XDECREF(ts_o);
    Py_XDECREF(when);
    Py_XDECREF(t);
    Py_XDECREF(engine);
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
    PyObject *line = decoded(S.decode, text);
    if (line == NULL)
        return PyErr_Occurred() ? -1 : 0;
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
    if (starts(m, STREAM_ALIAS)) { /* its outer span is in ``spans``: a decode of its own */
        rc = alias_line(text, into);
        goto done;
    }
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

/* config[key]: (type, ((name, default, factory), ...)) of a slots dataclass, fields in order;
 * factory 0: the default, 1: list, 2: dict */
static int load_shape(Shape *sh, PyObject *config, const char *key) {
    PyObject *spec = PyDict_GetItemString(config, key), *type, *fields;
    if (spec == NULL || !PyArg_ParseTuple(spec, "O!O!", &PyType_Type, &type, &PyTuple_Type,
                                          &fields) ||
        PyTuple_GET_SIZE(fields) > MAX_FIELDS) {
        PyErr_Format(PyExc_TypeError, "setup: %s is (type, fields)", key);
        return -1;
    }
    for (Py_ssize_t i = 0; i < sh->n; i++)
        Py_CLEAR(sh->dflt[i]);
    sh->n = 0;
    Py_XSETREF(sh->type, (PyTypeObject *)Py_NewRef(type));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); i++) {
        const char *name;
        PyObject *dflt;
        int factory;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, i), "sOi", &name, &dflt, &factory) ||
            member_offset(sh->type, name, &sh->off[i]) < 0)
            return -1;
        sh->dflt[i] = Py_NewRef(dflt);
        sh->factory[i] = (char)factory;
        sh->n = i + 1;
    }
    return 0;
}

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
    ITEM(decode_alias, "decode_alias");
    ITEM(decode_error, "decode_error");
    ITEM(unset, "unset");
    ITEM(py_decision, "py_decision");
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
    ITEM(decode_trace, "decode_trace");
    ITEM(score_known, "score_known");
    ITEM(truncated_warning, "truncated_warning");
    ITEM(fragment_proto, "fragment_proto");
#undef ITEM
    if (!PyAnySet_Check(S.text_fields) || !PyAnySet_Check(S.request_paths)) {
        PyErr_SetString(PyExc_TypeError, "setup: text_fields and request_paths are sets");
        return NULL;
    }
    if (load_shape(&DECISION, config, "decision") < 0 ||
        load_shape(&CANDIDATE, config, "candidate") < 0 ||
        load_shape(&SCORE, config, "score") < 0 || load_shape(&GATE, config, "gate") < 0 ||
        load_shape(&TRACE, config, "trace") < 0 ||
        member_offset(TRACE.type, "request_id", &S.o_t_rid) < 0 ||
        member_offset(TRACE.type, "ts", &S.o_t_ts) < 0)
        return NULL;
    if (!Py_IS_TYPE(S.fragment_proto, TRACE.type)) {
        PyErr_SetString(PyExc_TypeError, "setup: fragment_proto is a trace");
        return NULL;
    }
    PyTypeObject *type = DECISION.type;
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
        member_offset(type, "ts", &S.o_ts) < 0 || member_offset(type, "attempt", &S.o_attempt) < 0 ||
        member_offset(type, "origin", &S.o_origin) < 0 ||
        member_offset(type, "prediction_source", &S.o_pred_source) < 0 ||
        member_offset(type, "block_size", &S.o_block_size) < 0 ||
        member_offset(type, "candidates", &S.o_candidates) < 0 ||
        member_offset(type, "scores", &S.o_scores) < 0 ||
        member_offset(type, "gates", &S.o_gates) < 0 ||
        member_offset(type, "warnings", &S.o_warnings) < 0)
        return NULL;
    if (S.o_rid != DECISION.off[0] || S.o_router != DECISION.off[1] ||
        S.o_source != DECISION.off[2]) {
        PyErr_SetString(PyExc_TypeError, "setup: a decision's first fields are its request "
                                         "id, router and source");
        return NULL;
    }
    Py_XSETREF(S.smg, intern("smg"));
    Py_XSETREF(S.zero, PyLong_FromLong(0));
    Py_XSETREF(S.zero_f, PyFloat_FromDouble(0.0));
    Py_XSETREF(S.billion, PyFloat_FromDouble(1e9));
    Py_CLEAR(S.last_ts);
    Py_CLEAR(S.last_when);
    if (S.smg == NULL || S.zero == NULL || S.zero_f == NULL || S.billion == NULL)
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
    NAME(n_load, "load") NAME(n_average_load, "average_load")
    NAME(n_relative_threshold, "relative_threshold")
    NAME(n_absolute_threshold, "absolute_threshold") NAME(n_absolute_margin, "absolute_margin")
    NAME(n_spill, "spill") NAME(n_healthy, "healthy") NAME(n_overloaded, "overloaded")
    NAME(n_source, "source") NAME(n_score_unit, "score_unit")
    NAME(n_effective_score, "effective_score") NAME(n_score, "score")
    NAME(n_device_blocks, "device_blocks") NAME(n_attempt, "attempt")
    NAME(n_dispatch_timestamp_ns, "dispatch_timestamp_ns") NAME(n_selections, "selections")
    NAME(n_origin, "origin") NAME(n_prediction, "prediction") NAME(n_block_size, "block_size")
    NAME(n_candidates, "candidates") NAME(n_scores, "scores") NAME(n_gates, "gates")
    NAME(n_unattributed_gates, "unattributed_gates") NAME(n_truncated, "truncated")
    NAME(n_evidence, "evidence") NAME(n_aliases, "aliases") NAME(n_stream, "stream")
    NAME(n_ended_seq, "ended_seq")
    NAME(n_spans, "spans")
#undef NAME
    return PyModule_Create(&module);
}
