"""A page's outlink as a native record: ``crawlerd.records.Link`` (reference: ``linkrec_ref.Link``).

A page brings dozens of links, made twice (the worker's resolver, then the crawl process's
answer decoding) and held while the page's lease waits. As a dataclass each cost a Python
``__init__`` call (~0.1 us) and was an object the crawl loop's collector passes walked (gcpace);
this type is built in C and is not tracked by the cyclic collector (``no_gc``: a link holds two
strings, an int and a bool, which cannot make a cycle). Its fields are read through member
descriptors, as a slotted dataclass's are (the interpreter reads those inline; Cython's own
properties would cost a C call per read, and a page's links are read several times).
"""

cimport cython
from cpython.object cimport PyObject, PyTypeObject


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        const char *name
        int type
        Py_ssize_t offset
        int flags
        const char *doc
    int T_OBJECT_EX
    object PyDescr_NewMember(PyTypeObject *type, PyMemberDef *member)
    void PyType_Modified(PyTypeObject *type)


@cython.no_gc
@cython.freelist(512)
cdef class Link:
    """An outlink: ``url`` (normalised absolute URL), ``fp`` (its 64-bit fingerprint, unsigned),
    ``host_key`` (scheme://host[:port], the politeness key), ``nofollow``. The reference's
    fields, constructor, equality (field by field, with another ``Link`` only), repr and
    pickling; unhashable like it (compared by value and mutable). Its fields are declared in
    ``linkrec.pxd``, so other kernels read them in C."""

    __match_args__ = ("url", "fp", "host_key", "nofollow")

    def __init__(self, url, fp, host_key, nofollow=False):
        self.url = url
        self.fp = fp
        self.host_key = host_key
        self.nofollow = nofollow

    # The methods below read the fields through the descriptors (``o.url`` on an object), not
    # the struct: a deleted field is then an AttributeError, as in the reference, never a NULL.
    def __repr__(self):
        o = <object>self
        return f"Link(url={o.url!r}, fp={o.fp!r}, host_key={o.host_key!r}, nofollow={o.nofollow!r})"

    def __eq__(self, other):
        if type(other) is not Link:
            return NotImplemented
        o = <object>self
        return (o.url, o.fp, o.host_key, o.nofollow) == (other.url, other.fp, other.host_key, other.nofollow)

    __hash__ = None

    def __reduce__(self):
        o = <object>self
        return (Link, (o.url, o.fp, o.host_key, o.nofollow))


cdef PyMemberDef _MEMBERS[4]
_NAMES = (b"url", b"fp", b"host_key", b"nofollow")     # alive as long as the module: the defs point in


cdef void _install_members() except *:
    """Member descriptors for the four fields (writable, AttributeError once deleted). A field's
    offset is found by probing an instance holding a distinct object in each field."""
    marks = (object(), object(), object(), object())
    cdef Link probe = Link(*marks)
    cdef PyTypeObject *tp = <PyTypeObject *>Link
    cdef PyObject **words = <PyObject **><PyObject *>probe
    cdef Py_ssize_t n = tp.tp_basicsize // sizeof(PyObject *), i, j, found
    cdef dict d = <dict>(<object>tp.tp_dict)
    for i in range(4):
        found = -1
        for j in range(n):
            if words[j] == <PyObject *>marks[i]:
                found = j
        if found < 0:
            raise RuntimeError("linkrec: a field's slot was not found")
        _MEMBERS[i].name = <const char *>_NAMES[i]
        _MEMBERS[i].type = T_OBJECT_EX
        _MEMBERS[i].offset = found * sizeof(PyObject *)
        _MEMBERS[i].flags = 0
        _MEMBERS[i].doc = NULL
        d[_NAMES[i].decode()] = PyDescr_NewMember(tp, &_MEMBERS[i])
    PyType_Modified(tp)


_install_members()


def followed(list links not None):
    """A page's links to follow and the hosts they lead to: ``(follow, hosts)``, ``follow`` a new
    list of the links whose ``nofollow`` is false, in order, and ``hosts`` the set of their host
    keys (STAR's edges). One pass reading the native record's fields in C (another record type, or
    one with a field deleted, is read through its attributes)."""
    cdef list follow = []
    cdef set hosts = set()
    cdef Link ln
    for o in links:
        if type(o) is Link and (<PyObject *>(<Link>o).nofollow) != NULL and (<PyObject *>(<Link>o).host_key) != NULL:
            ln = <Link>o
            if ln.nofollow:
                continue
            follow.append(ln)
            hosts.add(ln.host_key)
        elif not o.nofollow:
            follow.append(o)
            hosts.add(o.host_key)
    return follow, hosts
