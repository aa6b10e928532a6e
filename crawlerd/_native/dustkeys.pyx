# cython: language_level=3, boundscheck=False, wraparound=False
"""The DUST learner's admission keys (``crawlerd.frontier.dust_admit``): for each new URL of a
batch, in one C pass, whether its host's rules must look at it, and else its two suspect keys.

Per URL ``i`` from ``start``, in order (the learner's ``admit_batch``, one URL at a time):

1. With ``lookup`` (the learner has host infos or active priors): the host's info, a
   ``HostInfo`` (``dust_hosts``: ``trusted`` at index 0, ``relevant`` at index 2). A host with
   trusted rules, or a URL containing one of ``marks`` (the active priors' substrings), stops
   the pass: the learner's rules decide that URL (in Python), then it calls again from ``i + 1``
   (an adoption there changes the info the pass reads next). A host with neither costs one
   dictionary look-up and no path work.
2. Without ``defer`` nothing more. Else the URL's keys: ``keys0`` the fingerprint of its
   skeleton (``dust_rules.skeleton``: its query parameters not in ``relevant`` dropped; the URL's
   own ``fps[i]`` when none is), ``keys1`` that of its alternative skeleton (``alt_path``, or
   ``skeleton``'s alternative for a URL with a query; 0 when there is none), ``forced`` when it is
   a seed or a redirect target, ``idx`` its index; written at position ``m``, ``m`` counted up.
   A URL of another shape (not ASCII, a path parameter, no path ``/`` after its host, a ``?``
   before it) also stops the pass: the reference code computes its keys.

Returns ``(i, m)``: the URL that stopped the pass (``len(urls)`` when none did) and the count.
The keys are xxh3_64 of the same bytes ``crawlerd.url.canonical.fingerprint`` hashes. The plain
Python reference of the whole step is ``dustkeys_ref.scan``; the tests compare the two.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memchr, memcpy, memmove

from xxhash import xxh3_64_intdigest as _xxh

from crawlerd._native.dustkeys_ref import keys as _ref_keys

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    const void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    PyObject *PyDict_GetItem(object d, object k)

cdef enum:
    _MAX_VIEW_TOKEN = 6     # dust_rules.MAX_VIEW_TOKEN
    _STOP = 1               # the URL is not of a shape this pass computes

MAX_VIEW_TOKEN = _MAX_VIEW_TOKEN


cdef inline Py_ssize_t _find(const char *s, Py_ssize_t n, char c, Py_ssize_t start) noexcept nogil:
    """``str.find`` of one character from ``start`` (-1 when absent)."""
    cdef const char *p
    if start >= n:
        return -1
    p = <const char *>memchr(s + start, c, n - start)
    return -1 if p == NULL else p - s


cdef inline uint64_t _hash(const char *s, Py_ssize_t n) except? 0:
    return _xxh(PyBytes_FromStringAndSize(s, n))


cdef inline uint64_t _hash2(const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb) except? 0:
    """xxh3_64 of ``a`` followed by ``b``."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, na + nb)
    cdef char *p = PyBytes_AS_STRING(out)
    memcpy(p, a, na)
    memcpy(p + na, b, nb)
    return _xxh(out)


cdef inline bint _relevant(str url, Py_ssize_t a, Py_ssize_t b, object relevant) except -1:
    return relevant is not None and url[a:b] in relevant


cdef class _Scratch:
    """A byte buffer grown as needed (the skeletons of URLs with a query are built in it)."""
    cdef char *buf
    cdef Py_ssize_t cap

    cdef char *room(self, Py_ssize_t n) except NULL:
        cdef char *p
        if n > self.cap:
            p = <char *>PyMem_Realloc(self.buf, n)
            if p == NULL:
                raise MemoryError()
            self.buf, self.cap = p, n
        return self.buf

    def __dealloc__(self):
        PyMem_Free(self.buf)


cdef int _keys(str url, uint64_t fp, object relevant, _Scratch scratch, uint64_t *k0, uint64_t *k1) except -1:
    """The URL's two keys (``keys0``, ``keys1``: see the module), or ``_STOP``. ``relevant``: the
    host's names known to change content, None when it has none."""
    cdef const char *s
    cdef Py_ssize_t n, q, sl, e, st, j, a, b, eq, kept, dropped, plen, out
    cdef char *buf
    if not PyUnicode_IS_COMPACT_ASCII(url):
        return _STOP
    s = <const char *>PyUnicode_DATA(url)
    n = PyUnicode_GET_LENGTH(url)
    if memchr(s, b';', n) != NULL:
        return _STOP
    q = _find(s, n, b'?', 0)
    if q < 0:
        # ``alt_path``: the URL minus a short first directory token followed by another directory
        k0[0] = fp
        k1[0] = 0
        sl = _find(s, n, b'/', 8)
        if sl < 0:
            return 0
        e = _find(s, n, b'/', sl + 1)
        if e < 0 or e == sl + 1 or e - sl - 1 > _MAX_VIEW_TOKEN or _find(s, n, b'/', e + 1) < 0 or \
                _relevant(url, sl + 1, e, relevant):
            return 0
        k1[0] = _hash2(s, sl, s + e, n - e)
        return 0
    # ``skeleton`` (``parse``'s split: origin up to the first "/" after "://", then path ? query)
    st = 2
    for j in range(n - 2):
        if s[j] == b':' and s[j + 1] == b'/' and s[j + 2] == b'/':
            st = j + 3
            break
    sl = _find(s, n, b'/', st)
    if sl < 0 or q < sl:
        return _STOP
    # the query items kept (names in ``relevant``), joined by "&", go after the path in ``buf``
    buf = scratch.room(n + 1)
    out = 0                                 # bytes of kept items written at buf + q + 1
    kept = dropped = 0
    a = q + 1
    if a < n:                               # "" after "?" has no items (``parse``)
        while True:                         # each item [a, b): "a&&b" and "a&" hold empty ones
            b = _find(s, n, b'&', a)
            if b < 0:
                b = n
            eq = _find(s, b, b'=', a)
            if _relevant(url, a, b if eq < 0 else eq, relevant):
                if kept:
                    buf[q + 1 + out] = b'&'
                    out += 1
                memcpy(buf + q + 1 + out, s + a, b - a)
                out += b - a
                kept += 1
            else:
                dropped += 1
            if b == n:
                break
            a = b + 1
    memcpy(buf, s, q)
    buf[q] = b'?'
    k0[0] = _hash(buf, q + 1 + out if kept else q) if dropped else fp
    # the alternative: the path minus its first directory token when the path has 3+ "/" and
    # the token is 1..MAX_VIEW_TOKEN characters not known to matter
    k1[0] = 0
    e = _find(s, q, b'/', sl + 1)
    if e < 0 or e == sl + 1 or e - sl - 1 > _MAX_VIEW_TOKEN or _find(s, q, b'/', e + 1) < 0 or \
            _relevant(url, sl + 1, e, relevant):
        return 0
    plen = sl + (q - e)                     # origin, then the path from its second "/" (< q)
    memcpy(buf + sl, s + e, q - e)
    if kept:
        buf[plen] = b'?'
        memmove(buf + plen + 1, buf + q + 1, out)
        k1[0] = _hash(buf, plen + 1 + out)
    else:
        k1[0] = _hash(buf, plen)
    return 0


def scan(urls, fps, depths, hops, hosts, Py_ssize_t start, dict info, bint lookup, tuple marks, bint defer,
         uint64_t[::1] keys0, uint64_t[::1] keys1, uint8_t[::1] forced, int64_t[::1] idx, Py_ssize_t m):
    """See the module. ``hosts[i]``: the URL's host key; the four outputs hold ``len(urls)``."""
    cdef Py_ssize_t i, n = len(urls)
    cdef PyObject *hi
    cdef object relevant
    cdef uint64_t a, b
    cdef _Scratch scratch = _Scratch()
    cdef str url
    if keys0.shape[0] < n or keys1.shape[0] < n or forced.shape[0] < n or idx.shape[0] < n:
        raise ValueError("outputs shorter than the batch")
    for i in range(start, n):
        url = urls[i]
        relevant = None
        if lookup:
            hi = PyDict_GetItem(info, hosts[i])
            if hi != NULL:
                if (<tuple>hi)[0]:
                    return i, m             # trusted rules: they decide
                if (<tuple>hi)[2]:
                    relevant = (<tuple>hi)[2]
            for mark in marks:
                if mark in url:
                    return i, m             # an active prior may rewrite it
        if not defer:
            continue
        if _keys(url, fps[i], relevant, scratch, &a, &b) == _STOP:
            return i, m
        keys0[m] = a
        keys1[m] = b
        forced[m] = depths[i] == 0 or hops[i] > 0
        idx[m] = i
        m += 1
    return n, m


def keys(str url, uint64_t fp, relevant) -> tuple:
    """One URL's two keys (``dustkeys_ref.keys``: the same answer), natively when it is of a shape
    ``scan`` computes."""
    cdef uint64_t a, b
    cdef _Scratch scratch = _Scratch()
    if _keys(url, fp, relevant if relevant else None, scratch, &a, &b) == _STOP:
        return _ref_keys(url, fp, relevant)
    return a, b
