# cython: language_level=3, boundscheck=False, wraparound=False
"""The DUST learner's per-page observation (``DustLearner.observe``), its hot parts in C.

``Evidence``  one archived page of a host's evidence window (``dust_evidence``): a C record the
              cyclic collector does not track (it holds strings, ints and the parsed URL, never a
              container that could lead back to it), made from and written to the host record's
              lists (``from_lists``, ``to_lists``) in one call.
``window_counts``  what a window's RAM estimate counts (``dust_hosts.host_state_bytes``).
``scan``      the first pass of ``HostState.learn`` over the window: which earlier pages the new
              one must be compared with in Python (their digests or simhashes are near), and
              which may differ from it in one name (``differing_name``); every other pair is a
              disagreement that says nothing, decided here without a Python object per pair.
``probe``,    the archived set's RAM side (``DustStore.archived`` / ``add_archived``): the
``put``       entries not written yet and the Bloom filters in front of the two generations.

Reference (the same answers, the Python it replaces): ``dustobs_ref``; the tests compare the two,
and a learner built with ``native=False`` runs on the reference throughout.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING
from libc.stdint cimport uint64_t
from libc.string cimport memchr, memcmp

from crawlerd.frontier.dust_rules import parse


cdef extern from *:
    """
    #define DUSTOBS_POPCOUNT(x) __builtin_popcountll(x)
    """
    int DUSTOBS_POPCOUNT(unsigned long long x) noexcept nogil


cimport cython


@cython.no_gc
@cython.freelist(64)
cdef class Evidence:
    """One archived page. ``digest``: first 8 bytes of the payload SHA-1 as an int; ``simhash``
    0 when the page had no text; ``canonical`` its declared same-host canonical URL or ""."""

    cdef public str url
    cdef public uint64_t digest
    cdef public uint64_t simhash
    cdef public str canonical
    cdef object _parts

    def __init__(self, str url, uint64_t digest, uint64_t simhash, str canonical=""):
        self.url, self.digest, self.simhash, self.canonical = url, digest, simhash, canonical
        self._parts = None

    @property
    def parts(self):
        if self._parts is None:
            self._parts = parse(self.url)
        return self._parts

    @property
    def parsed(self):
        """``parts`` was asked for (it is kept from then on)."""
        return self._parts is not None

    def to_list(self) -> list:
        return [self.url, self.digest, self.simhash, self.canonical]


def from_lists(records) -> list:
    """A host record's evidence lists ``[url, digest, simhash, canonical]`` as ``Evidence``."""
    cdef list out = []
    cdef Evidence e
    for x in records:
        e = Evidence.__new__(Evidence)
        e.url, e.digest, e.simhash, e.canonical = x[0], x[1], x[2], x[3] if len(x) > 3 else ""
        e._parts = None
        out.append(e)
    return out


def to_lists(list evidence) -> list:
    """``Evidence.to_list`` of each (the host record's form)."""
    cdef Evidence e
    return [[e.url, e.digest, e.simhash, e.canonical] for e in evidence]


def window_counts(list window) -> tuple:
    """(URL and canonical characters, canonicals, parsed entries, their URLs' characters) of an
    evidence window: what its RAM estimate counts (``dust_hosts.host_state_bytes``), in one pass."""
    cdef Evidence e
    cdef Py_ssize_t chars = 0, canonicals = 0, parsed = 0, parsed_chars = 0, n
    for e in window:
        n = len(e.url)
        chars += n
        if e.canonical:
            canonicals += 1
            chars += len(e.canonical)
        if e._parts is not None:
            parsed += 1
            parsed_chars += n
    return chars, canonicals, parsed, parsed_chars


cdef extern from "Python.h":
    int PyUnicode_KIND(object o)
    void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    Py_UCS4 PyUnicode_READ(int kind, const void *data, Py_ssize_t index) nogil


cdef extern from "string.h":
    void *memrchr(const void *s, int c, size_t n) nogil


cdef struct _Shape:
    const char *data       # the string's characters (``kind`` bytes each)
    int kind
    Py_ssize_t n
    Py_ssize_t path        # end of the path (the first "?", else the length)
    Py_ssize_t last        # start of the last segment
    bint semi              # a ";" anywhere


cdef inline Py_ssize_t _find(_Shape *s, Py_UCS4 c, Py_ssize_t end) noexcept nogil:
    """The first ``c`` in s[:end], or -1."""
    cdef const char *p
    cdef Py_ssize_t i
    if s.kind == 1:
        p = <const char *>memchr(s.data, <int>c, <size_t>end)
        return -1 if p == NULL else p - s.data
    for i in range(end):
        if PyUnicode_READ(s.kind, s.data, i) == c:
            return i
    return -1


cdef inline Py_ssize_t _rfind(_Shape *s, Py_UCS4 c, Py_ssize_t end) noexcept nogil:
    """The last ``c`` in s[:end], or -1."""
    cdef const char *p
    cdef Py_ssize_t i = end - 1
    if s.kind == 1:
        p = <const char *>memrchr(s.data, <int>c, <size_t>end)
        return -1 if p == NULL else p - s.data
    while i >= 0:
        if PyUnicode_READ(s.kind, s.data, i) == c:
            return i
        i -= 1
    return -1


cdef inline bint _same(_Shape *a, Py_ssize_t i, Py_ssize_t ia, _Shape *b, Py_ssize_t j, Py_ssize_t jb) noexcept nogil:
    """a[i:ia] == b[j:jb]"""
    cdef Py_ssize_t k
    if ia - i != jb - j:
        return False
    if a.kind == b.kind:
        return memcmp(a.data + i * a.kind, b.data + j * b.kind, <size_t>((ia - i) * a.kind)) == 0
    for k in range(ia - i):
        if PyUnicode_READ(a.kind, a.data, i + k) != PyUnicode_READ(b.kind, b.data, j + k):
            return False
    return True


cdef inline void _shape(str a, _Shape *s) noexcept:
    s.data = <const char *>PyUnicode_DATA(a)
    s.kind = PyUnicode_KIND(a)
    s.n = PyUnicode_GET_LENGTH(a)
    s.path = _find(s, u"?", s.n)
    if s.path < 0:
        s.path = s.n
    s.last = _rfind(s, u"/", s.path) + 1
    s.semi = _find(s, u";", s.n) >= 0


cdef bint _may_differ_by_one(_Shape *sa, _Shape *sb) noexcept nogil:
    """``dust_evidence``'s cheap pre-test for ``differing_name``: the same path, or the same last
    segment and query (or path parameters on either side)."""
    if _same(sa, 0, sa.path, sb, 0, sb.path):
        return True
    if sa.semi or sb.semi:
        return True
    # the queries: after the "?" ("" without one)
    if not _same(sa, min(sa.path + 1, sa.n), sa.n, sb, min(sb.path + 1, sb.n), sb.n):
        return False
    return _same(sa, sa.last, sa.path, sb, sb.last, sb.path)


COMPARE = 1         # ``scan``'s flags: the pair's digests or simhashes are near (``compare`` decides)
BY_ONE = 2          # the two URLs may differ in one name (``differing_name`` when they disagree)


def scan(list window, Evidence ev, int near_bits) -> tuple:
    """(the window without ``ev``'s URL (a refetch is no pair), [(i, flags)] for each page i of it
    that the Python pass must look at, in order). Every pair not listed disagrees (far digests and
    simhashes) and cannot differ in one name: it teaches nothing."""
    cdef list old = []
    cdef list out = []
    cdef Evidence e
    cdef str url = ev.url
    cdef uint64_t digest = ev.digest, simhash = ev.simhash
    cdef _Shape sa, sb
    cdef int flags
    cdef Py_ssize_t i = 0
    _shape(url, &sa)
    for e in window:
        _shape(e.url, &sb)
        if sb.n == sa.n and _same(&sa, 0, sa.n, &sb, 0, sb.n):
            continue
        flags = 0
        if e.digest == digest or (simhash and e.simhash and DUSTOBS_POPCOUNT(simhash ^ e.simhash) <= near_bits):
            flags = COMPARE
        if _may_differ_by_one(&sa, &sb):
            flags |= BY_ONE
        if flags:
            out.append((i, flags))
        old.append(e)
        i += 1
    return old, out


# -- the archived set's RAM side ------------------------------------------------------------------
cdef inline bint _maybe(bytearray filt, uint64_t mask, uint64_t fp) noexcept:
    cdef unsigned char *f = <unsigned char *>PyByteArray_AS_STRING(filt)
    cdef uint64_t a = fp & mask, b = (fp >> 32) & mask
    return (f[a >> 3] >> (a & 7)) & 1 and (f[b >> 3] >> (b & 7)) & 1


def probe(list pending, object filters, uint64_t mask, int g, object fp):
    """The first step of ``DustStore.archived``: generation ``g`` first, then the other, the first
    entry not written yet that holds ``fp`` (its packed value, bytes), else the first generation
    whose filter may hold it (an int: read the table from there on), else None (not archived)."""
    cdef uint64_t k = fp
    cdef int gen
    cdef object raw
    for gen in (g, 1 - g):
        raw = (<dict>pending[gen]).get(fp)
        if raw is not None:
            return raw
        if filters is None or _maybe((<list>filters)[gen], mask, k):
            return gen
    return None


def put(dict pending, bytearray filt, uint64_t mask, object fp, bytes value) -> None:
    """Record one entry not written yet: in ``pending`` and in the generation's filter (None: none)."""
    cdef uint64_t k = fp, a, b
    cdef unsigned char *f
    pending[fp] = value
    if filt is not None:
        f = <unsigned char *>PyByteArray_AS_STRING(filt)
        a, b = k & mask, (k >> 32) & mask
        f[a >> 3] |= 1 << (a & 7)
        f[b >> 3] |= 1 << (b & 7)
