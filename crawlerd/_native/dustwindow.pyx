# cython: language_level=3, boundscheck=False, wraparound=False
"""The DUST learner's window walk (``dust_evidence.HostState.learn``): a page archived on a host
against each entry of the host's evidence window, in one C pass, keeping only the pairs that
can teach something.

``pairs(evidence, url, digest, simhash, near_bits)`` returns ``(old, marks)``: ``old`` the window
without the entries of ``url`` itself (a refetch is no pair), and ``marks`` a bytes of one mark
per entry of ``old``:

0  the pair disagrees (digests differ, simhashes absent or farther than ``near_bits`` apart)
   and the two URLs cannot differ in one name (``_may_differ_by_one`` is False): nothing to do.
1  ``compare`` must judge the pair (equal digests, near or unreadable simhashes).
2  the pair disagrees and the URLs may differ in one name (or are not ASCII: Python decides).

Nearly every pair of a crawl is mark 0. The reference is ``dustwindow_ref.pairs``.
"""

from libc.stdint cimport uint64_t
from libc.string cimport memchr, memcmp

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    const void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)

cdef extern from *:
    """
    static inline int dustwindow_popcount(unsigned long long x) { return __builtin_popcountll(x); }
    """
    int dustwindow_popcount(unsigned long long x) noexcept nogil

cdef enum:
    _NOTHING = 0
    _COMPARE = 1
    _DIFFER = 2


cdef struct _Shape:
    const char *s       # the URL
    Py_ssize_t q        # its first "?" (its length when none): the path ends there
    Py_ssize_t qs       # where its query starts (after that "?"; its length when none)
    Py_ssize_t n
    Py_ssize_t last     # start of the path's last segment (after its last "/" before q)
    bint semi           # it has a ";"


cdef inline void _shape(const char *s, Py_ssize_t n, _Shape *out) noexcept nogil:
    cdef const char *p = <const char *>memchr(s, b'?', n)
    cdef Py_ssize_t i
    out.s, out.n = s, n
    out.q = n if p == NULL else p - s
    out.qs = n if p == NULL else out.q + 1
    out.last = 0
    for i in range(out.q - 1, -1, -1):
        if s[i] == b'/':
            out.last = i + 1
            break
    out.semi = memchr(s, b';', n) != NULL


cdef inline bint _eq(const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb) noexcept nogil:
    return na == nb and memcmp(a, b, na) == 0


cdef inline bint _may_differ_by_one(_Shape *a, _Shape *b) noexcept nogil:
    """``dust_evidence._may_differ_by_one``: the same path, a path parameter on either side, or the
    same last segment and query."""
    if _eq(a.s, a.q, b.s, b.q):
        return True
    if a.semi or b.semi:
        return True
    return _eq(a.s + a.qs, a.n - a.qs, b.s + b.qs, b.n - b.qs) and \
        _eq(a.s + a.last, a.q - a.last, b.s + b.last, b.q - b.last)


cdef inline int _near(object x, object y, int near_bits):
    """1: both simhashes set and within ``near_bits``; 0: not; -1: not readable as u64 (compare)."""
    cdef uint64_t a, b
    try:
        a, b = x, y
    except (OverflowError, TypeError):
        return -1
    return a != 0 and b != 0 and dustwindow_popcount(a ^ b) <= near_bits


def pairs(list evidence, str url, object digest, object simhash, int near_bits):
    """See the module."""
    cdef list old = []
    cdef Py_ssize_t j, m = 0
    cdef _Shape sa, sb
    cdef bint ascii = PyUnicode_IS_COMPACT_ASCII(url)
    cdef int near
    cdef str eu
    if ascii:
        _shape(<const char *>PyUnicode_DATA(url), PyUnicode_GET_LENGTH(url), &sa)
    for e in evidence:
        if e.url != url:
            old.append(e)
    marks = bytearray(len(old))
    for j in range(len(old)):
        e = old[j]
        if e.digest == digest:
            marks[j] = _COMPARE
            continue
        near = _near(simhash, e.simhash, near_bits)
        if near != 0:
            marks[j] = _COMPARE
            continue
        eu = e.url
        if not ascii or not PyUnicode_IS_COMPACT_ASCII(eu):
            marks[j] = _DIFFER
            continue
        _shape(<const char *>PyUnicode_DATA(eu), PyUnicode_GET_LENGTH(eu), &sb)
        if _may_differ_by_one(&sa, &sb):
            marks[j] = _DIFFER
    return old, bytes(marks)
