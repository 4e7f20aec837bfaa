/* Attributes of KV events (slots dataclasses) read and written at their slots' offsets, as
 * their member descriptors read and write them, without a generic attribute lookup each time
 * (mmlens/layout/_chain.c, mmlens/store/_kvrows.c). One cache per attribute name remembers the
 * offset for the last type seen (and that type's version, so a class changed since is looked
 * up again); any object whose attribute is not such a slot goes through the generic lookup. */
#ifndef MMLENS_SLOT_ATTRS_H
#define MMLENS_SLOT_ATTRS_H

#include <Python.h>
#include <structmember.h>

typedef struct {
    PyTypeObject *type; /* a strong reference, or NULL */
    unsigned int version;
    Py_ssize_t offset; /* 0: not a plain object slot of that type */
} SlotWay;

/* Two types per name: a stored and a removed event read the same names in turn. */
typedef struct {
    SlotWay way[2];
    int next; /* the way a new type takes */
} SlotCache;

static Py_ssize_t slot_offset(SlotCache *c, PyObject *obj, PyObject *name) {
    PyTypeObject *tp = Py_TYPE(obj);
    int valid = PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG);
    for (int i = 0; i < 2; i++)
        if (c->way[i].type == tp && valid && c->way[i].version == tp->tp_version_tag)
            return c->way[i].offset;
    Py_ssize_t off = 0;
    if (tp->tp_getattro == PyObject_GenericGetAttr && tp->tp_setattro == PyObject_GenericSetAttr) {
        PyObject *d = _PyType_Lookup(tp, name); /* borrowed; gives the type a version tag */
        if (d && Py_TYPE(d) == &PyMemberDescr_Type) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
                off = m->offset;
        }
    }
    SlotWay *w = &c->way[c->way[0].type == tp ? 0 : c->way[1].type == tp ? 1 : c->next];
    if (w->type != tp) {
        c->next = (int)(w - c->way) ^ 1;
        Py_INCREF(tp);
        Py_XSETREF(w->type, tp);
    }
    w->version = PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) ? tp->tp_version_tag : 0;
    w->offset = w->version ? off : 0;
    return w->offset;
}

/* getattr(obj, name): a new reference, NULL with an error. */
static inline PyObject *get_slot(SlotCache *c, PyObject *obj, PyObject *name) {
    Py_ssize_t off = slot_offset(c, obj, name);
    PyObject *v = off ? *(PyObject **)((char *)obj + off) : NULL;
    return v ? Py_NewRef(v) : PyObject_GetAttr(obj, name);
}

/* setattr(obj, name, v): 0, or -1 with an error. */
static inline int set_slot(SlotCache *c, PyObject *obj, PyObject *name, PyObject *v) {
    Py_ssize_t off = slot_offset(c, obj, name);
    if (!off)
        return PyObject_SetAttr(obj, name, v);
    Py_XSETREF(*(PyObject **)((char *)obj + off), Py_NewRef(v));
    return 0;
}

#endif
