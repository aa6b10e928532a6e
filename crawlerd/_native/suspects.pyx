# cython: language_level=3, boundscheck=False, wraparound=False
"""The DUST learner's suspect table: skeleton keys of the URLs admitted lately, so that a new URL
whose skeleton was admitted before is a suspect (``crawlerd.frontier.dust``).

Key: a 64-bit skeleton fingerprint (0 is stored as 1: 0 marks an empty slot). Layout: ``buckets``
(a power of two, at least 256) rows of ``WAYS`` u64 slots; a key lives in row
``(k ^ k >> 29) & (buckets - 1)``; each row has a u8 cursor, the slot its next key replaces
(round-robin: the oldest goes, O(1)). Invariant: holds at most ``capacity`` keys in
``nbytes`` bytes (fixed at construction); a key lost to replacement makes a later duplicate look
new (fetched), never the reverse.

``add_many`` adds a batch as one step: a key already there (before the batch) is not added
again; the others go in batch order, at most ``WAYS`` per row per batch (the rest of a row's
keys are dropped, as the reference's one-key-per-row rounds do). Bits 2.. of a row's cursor
count the batch's keys in that row while the batch runs (cleared before it returns), so the
batch needs no scratch memory.

``admit`` is the learner's whole suspect pass over a slice (``hits``, the slice's own repeats in
a scratch hash set, ``add_many``) in one call; its reference is ``suspects_ref.ref_admit``.

One C pass over the keys where the reference (``suspects_ref.RefClassTable``, numpy) makes
about ten array calls per batch; the tests compare the two on random key streams.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport calloc, free

from array import array

import numpy as np

cdef enum:
    _WAYS = 4
    _CURSOR = 3         # a row cursor's bits: the slot to replace next
    _RANK_ONE = 4       # one more key of the running batch in the row (bits 2..)

WAYS = _WAYS


cdef inline uint64_t _norm(uint64_t k) noexcept nogil:
    return k if k else 1


cdef inline size_t _row(uint64_t k, uint64_t mask) noexcept nogil:
    return <size_t>((k ^ (k >> 29)) & mask) * _WAYS


cdef extern from *:
    """
    #define SUSPECTS_PREFETCH(p) __builtin_prefetch((p), 0, 0)
    """
    void SUSPECTS_PREFETCH(const void *p) noexcept nogil


cdef struct _Seen:
    uint64_t *slots         # open addressing, 0 = empty (key 0 is the flag ``zero``)
    size_t mask
    bint zero


cdef inline size_t _spot(_Seen *s, uint64_t k) noexcept nogil:
    cdef size_t i = <size_t>((k * <uint64_t>0x9E3779B97F4A7C15ULL) >> 32) & s.mask
    while s.slots[i] != 0 and s.slots[i] != k:
        i = (i + 1) & s.mask
    return i


cdef inline bint _seen_has(_Seen *s, uint64_t k) noexcept nogil:
    if k == 0:
        return s.zero
    return s.slots[_spot(s, k)] == k


cdef inline void _seen_add(_Seen *s, uint64_t k) noexcept nogil:
    if k == 0:
        s.zero = 1
    else:
        s.slots[_spot(s, k)] = k


cdef object _u64(object keys):
    """``keys`` as a buffer of u64 (an ``array('Q')`` or uint64 ndarray as it is, else converted)."""
    if isinstance(keys, array) and keys.typecode == "Q":
        return keys
    if isinstance(keys, np.ndarray):
        return np.ascontiguousarray(keys, dtype=np.uint64)
    return array("Q", keys)


cdef class ClassTable:
    """Set-associative cache of 64-bit keys (``WAYS`` per row, round-robin replacement)."""

    cdef uint64_t *_slots
    cdef uint8_t *_next
    cdef uint64_t _mask
    cdef readonly Py_ssize_t capacity
    cdef readonly Py_ssize_t nbytes
    cdef readonly Py_ssize_t buckets

    WAYS = _WAYS

    def __cinit__(self, entries: int):
        cdef Py_ssize_t nb = 1 << max(8, (max(1, int(entries) // _WAYS) - 1).bit_length())
        self._slots = <uint64_t *>calloc(nb * _WAYS, sizeof(uint64_t))
        self._next = <uint8_t *>calloc(nb, 1)
        if self._slots == NULL or self._next == NULL:
            raise MemoryError()
        self._mask = <uint64_t>(nb - 1)
        self.buckets = nb
        self.capacity = nb * _WAYS
        self.nbytes = nb * _WAYS * sizeof(uint64_t) + nb

    def __dealloc__(self):
        free(self._slots)
        free(self._next)

    cdef inline void _fetch(self, uint64_t k) noexcept nogil:
        # the table is far larger than the caches: a batch's rows are requested first, so their
        # misses overlap instead of stalling one lookup after the other
        SUSPECTS_PREFETCH(self._slots + _row(_norm(k), self._mask))

    cdef inline bint _has(self, uint64_t k) noexcept nogil:
        cdef uint64_t *r
        k = _norm(k)
        r = self._slots + _row(k, self._mask)
        return r[0] == k or r[1] == k or r[2] == k or r[3] == k

    def has_many(self, keys) -> np.ndarray:
        """For each key: is it in the table? (A bool array.)"""
        cdef const uint64_t[::1] k = _u64(keys)
        cdef Py_ssize_t i, n = k.shape[0]
        out = np.empty(n, dtype=np.bool_)
        cdef uint8_t[::1] o = out.view(np.uint8)
        for i in range(n):
            self._fetch(k[i])
        for i in range(n):
            o[i] = self._has(k[i])
        return out

    def hits(self, keys0, keys1, uint64_t tag) -> bytes:
        """For each j, 1 when ``keys0[j]``, ``keys0[j] ^ tag`` or (when not 0) ``keys1[j]`` is in
        the table, else 0: the learner's suspect test of a batch (a URL's skeleton, the same
        marked as an alternative, its alternative skeleton), in one pass."""
        cdef const uint64_t[::1] a = _u64(keys0)
        cdef const uint64_t[::1] b = _u64(keys1)
        cdef Py_ssize_t n = a.shape[0]
        if b.shape[0] != n:
            raise ValueError("keys0 and keys1 differ in length")
        out = bytearray(n)
        cdef unsigned char[::1] o = out
        if n:
            self._hits(&a[0], &b[0], n, tag, &o[0])
        return bytes(out)

    cdef void _hits(self, const uint64_t *a, const uint64_t *b, Py_ssize_t n, uint64_t tag,
                    uint8_t *out) noexcept nogil:
        """``hits`` into ``out[:n]`` (``hits`` and ``admit`` share it)."""
        cdef Py_ssize_t j
        for j in range(n):
            self._fetch(a[j])
            self._fetch(a[j] ^ tag)
            if b[j] != 0:
                self._fetch(b[j])
        for j in range(n):
            out[j] = self._has(a[j]) or self._has(a[j] ^ tag) or (b[j] != 0 and self._has(b[j]))

    def add_many(self, keys) -> None:
        """Add a batch (see the module: keys there before it stay, at most ``WAYS`` per row)."""
        cdef const uint64_t[::1] k = _u64(keys)
        if k.shape[0]:
            self._add(&k[0], k.shape[0])

    cdef int _add(self, const uint64_t *k, Py_ssize_t n) except -1:
        cdef Py_ssize_t i
        cdef uint8_t *fresh
        cdef uint64_t key
        cdef size_t r
        cdef uint8_t c
        if n == 0:
            return 0
        fresh = <uint8_t *>PyMem_Malloc(n)
        if fresh == NULL:
            raise MemoryError()
        for i in range(n):
            self._fetch(k[i])
        for i in range(n):              # presence before the batch, as one step
            fresh[i] = not self._has(k[i])
        for i in range(n):
            if fresh[i]:
                key = _norm(k[i])
                r = _row(key, self._mask)
                c = self._next[r // _WAYS]
                if c < _RANK_ONE * _WAYS:           # fewer than WAYS of this batch in the row yet
                    self._slots[r + (c & _CURSOR)] = key
                    c = (c & ~_CURSOR) + _RANK_ONE + (((c & _CURSOR) + 1) % _WAYS)
                    self._next[r // _WAYS] = c
        for i in range(n):
            if fresh[i]:
                r = _row(_norm(k[i]), self._mask) // _WAYS
                self._next[r] &= _CURSOR
        PyMem_Free(fresh)
        return 0

    def admit(self, keys0, keys1, forced, Py_ssize_t n, uint64_t tag) -> list:
        """The learner's suspect pass over a batch's first ``n`` keys, in one step: ``hits``, then
        in order each j is a suspect (listed) unless ``forced[j]``, when ``keys0[j]`` is a hit, or
        it, ``keys0[j] ^ tag`` or (when not 0) ``keys1[j]`` came earlier in the batch; a j not a
        suspect adds ``keys0[j]`` and (when not 0) ``keys1[j] ^ tag``, the batch's additions going
        in as one ``add_many``. Returns the suspects' j, ascending."""
        cdef const uint64_t[::1] a = _u64(keys0)
        cdef const uint64_t[::1] b = _u64(keys1)
        cdef const unsigned char[::1] f = forced
        cdef Py_ssize_t j, m = 0, size = 16
        cdef uint64_t x, y
        cdef _Seen seen
        cdef uint64_t *add
        cdef uint8_t *hit
        if n < 0 or a.shape[0] < n or b.shape[0] < n or f.shape[0] < n:
            raise ValueError("fewer keys than n")
        out = []
        if n == 0:
            return out
        while size < 4 * n:
            size <<= 1
        seen.slots = <uint64_t *>calloc(size, sizeof(uint64_t))
        seen.mask = size - 1
        seen.zero = 0
        add = <uint64_t *>PyMem_Malloc(2 * n * sizeof(uint64_t))
        hit = <uint8_t *>PyMem_Malloc(n)
        if seen.slots == NULL or add == NULL or hit == NULL:
            free(seen.slots)
            PyMem_Free(add)
            PyMem_Free(hit)
            raise MemoryError()
        try:
            self._hits(&a[0], &b[0], n, tag, hit)
            for j in range(n):
                x, y = a[j], b[j]
                if not f[j] and (hit[j] or _seen_has(&seen, x) or _seen_has(&seen, x ^ tag) or
                                 (y != 0 and _seen_has(&seen, y))):
                    out.append(j)
                    continue
                _seen_add(&seen, x)
                add[m] = x
                m += 1
                if y != 0:
                    y ^= tag
                    _seen_add(&seen, y)
                    add[m] = y
                    m += 1
            self._add(add, m)
        finally:
            free(seen.slots)
            PyMem_Free(add)
            PyMem_Free(hit)
        return out

    def dump(self) -> tuple[bytes, bytes]:
        """The table's slots and row cursors (to compare implementations)."""
        return (bytes((<char *>self._slots)[:self.capacity * sizeof(uint64_t)]),
                bytes((<char *>self._next)[:self.buckets]))
