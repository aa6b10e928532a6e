"""Indexed min-heap of hosts keyed by due time (the scheduler's politeness clock).

The frontier keeps every host that has queued URLs and no lease in this heap,
keyed by the earliest time its next request may start (IRLbot §6: per-host
spacing). ``pop_due`` hands out the hosts whose time has come, in due order.

Layout: a 4-ary heap of 16-byte entries (double due, int32 host id, padding),
so the four children of a node share one 64-byte cache line, plus a position
index ``pos[host_id] -> heap slot + 1`` (int32, 0 when absent) grown on demand
with calloc, so the zero pages of ids never pushed cost no RAM.
Memory: 16 bytes per queued host (up to 2x while the array has slack) plus
4 bytes per host id up to the largest id ever pushed.

The pure-Python reference with identical semantics is ``heap_ref.RefDueHeap``.
"""

from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.math cimport isnan
from libc.stdint cimport int32_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy

# Host ids are handed out densely by the frontier and stored as int32.
cdef enum:
    _MAX_HOST = 2147483647


cdef struct Entry:
    double due
    int32_t host


cdef inline bint _before(Entry a, Entry b) noexcept nogil:
    # Total order: due time, then host id, so equal due times pop deterministically.
    return a.due < b.due or (a.due == b.due and a.host < b.host)


cdef inline int32_t _host_of(object host_id) except -1:
    """Validate a host id: an int in [0, 2**31 - 1]; ValueError otherwise."""
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(host_id, &overflow)
    if overflow != 0 or v < 0 or v > _MAX_HOST:
        raise ValueError(f"host id out of range [0, 2**31): {host_id!r}")
    return <int32_t>v


cdef inline int _check_due(double due) except -1:
    if isnan(due):
        raise ValueError("due time is NaN")
    return 0


cdef class DueHeap:
    """Min-heap of (due, host_id) with O(log n) update-key and remove.

    Key: host id (each host at most once). Order: (due, host_id) ascending.
    Invariant: ``pos[heap[i].host] == i + 1`` for every slot ``i < n``, every
    other ``pos`` entry is 0, and no entry sorts before its parent.
    """

    cdef Entry* _heap
    cdef Py_ssize_t _n
    cdef Py_ssize_t _cap
    cdef int32_t* _pos
    cdef Py_ssize_t _pos_cap

    def __cinit__(self, Py_ssize_t capacity=1024):
        if capacity < 1:
            capacity = 1
        self._heap = <Entry*>malloc(capacity * sizeof(Entry))
        if self._heap == NULL:
            raise MemoryError()
        self._cap = capacity
        self._n = 0
        self._pos = NULL
        self._pos_cap = 0

    def __init__(self, Py_ssize_t capacity=1024):
        pass

    def __dealloc__(self):
        free(self._heap)
        free(self._pos)

    # -- internal -----------------------------------------------------------

    cdef int _grow_heap(self) except -1:
        cdef Py_ssize_t cap = self._cap * 2
        cdef Entry* p = <Entry*>realloc(self._heap, cap * sizeof(Entry))
        if p == NULL:
            raise MemoryError()
        self._heap = p
        self._cap = cap
        return 0

    cdef int _grow_pos(self, int32_t host) except -1:
        cdef Py_ssize_t cap = self._pos_cap * 2
        if cap <= host:
            cap = <Py_ssize_t>host + 1
        if cap < 1024:
            cap = 1024
        if cap > <Py_ssize_t>_MAX_HOST + 1:
            cap = <Py_ssize_t>_MAX_HOST + 1
        # calloc, not realloc: fresh zero pages ("absent") are only touched when used.
        cdef int32_t* p = <int32_t*>calloc(cap, sizeof(int32_t))
        if p == NULL:
            raise MemoryError()
        if self._pos != NULL:
            memcpy(p, self._pos, self._pos_cap * sizeof(int32_t))
            free(self._pos)
        self._pos = p
        self._pos_cap = cap
        return 0

    cdef inline Py_ssize_t _slot(self, int32_t host) noexcept:
        if host >= self._pos_cap:
            return -1
        return self._pos[host] - 1

    cdef void _sift_up(self, Py_ssize_t i) noexcept:
        cdef Entry e = self._heap[i]
        cdef Py_ssize_t parent
        while i > 0:
            parent = (i - 1) >> 2
            if not _before(e, self._heap[parent]):
                break
            self._heap[i] = self._heap[parent]
            self._pos[self._heap[i].host] = <int32_t>(i + 1)
            i = parent
        self._heap[i] = e
        self._pos[e.host] = <int32_t>(i + 1)

    cdef void _sift_down(self, Py_ssize_t i) noexcept:
        cdef Entry e = self._heap[i]
        cdef Py_ssize_t n = self._n
        cdef Py_ssize_t first, last, best, c
        while True:
            first = 4 * i + 1
            if first >= n:
                break
            last = first + 4
            if last > n:
                last = n
            best = first
            c = first + 1
            while c < last:
                if _before(self._heap[c], self._heap[best]):
                    best = c
                c += 1
            if not _before(self._heap[best], e):
                break
            self._heap[i] = self._heap[best]
            self._pos[self._heap[i].host] = <int32_t>(i + 1)
            i = best
        self._heap[i] = e
        self._pos[e.host] = <int32_t>(i + 1)

    cdef int _insert(self, int32_t host, double due) except -1:
        if self._n == self._cap:
            self._grow_heap()
        cdef Py_ssize_t i = self._n
        self._heap[i].due = due
        self._heap[i].host = host
        self._n += 1
        self._sift_up(i)
        return 0

    cdef void _set_due(self, Py_ssize_t i, double due) noexcept:
        cdef double old = self._heap[i].due
        self._heap[i].due = due
        if due < old:
            self._sift_up(i)
        elif due > old:
            self._sift_down(i)

    cdef void _delete_slot(self, Py_ssize_t i) noexcept:
        """Remove the entry at slot i, keeping the heap and position invariants."""
        cdef int32_t host = self._heap[i].host
        cdef Entry moved
        self._pos[host] = 0
        self._n -= 1
        if i == self._n:
            return
        moved = self._heap[self._n]
        self._heap[i] = moved
        self._pos[moved.host] = <int32_t>(i + 1)
        if i > 0 and _before(moved, self._heap[(i - 1) >> 2]):
            self._sift_up(i)
        else:
            self._sift_down(i)

    # -- public API ---------------------------------------------------------

    def push(self, host_id, double due):
        """Add a host with its due time; ValueError if it is already present."""
        cdef int32_t host = _host_of(host_id)
        _check_due(due)
        if host >= self._pos_cap:
            self._grow_pos(host)
        elif self._pos[host] != 0:
            raise ValueError(f"host {host} already in heap")
        self._insert(host, due)

    def update(self, host_id, double due):
        """Move a present host to a new due time (earlier or later); KeyError if absent."""
        cdef int32_t host = _host_of(host_id)
        _check_due(due)
        cdef Py_ssize_t i = self._slot(host)
        if i < 0:
            raise KeyError(host)
        self._set_due(i, due)

    def push_or_update(self, host_id, double due):
        """Set a host's due time whether or not it is present."""
        cdef int32_t host = _host_of(host_id)
        _check_due(due)
        if host >= self._pos_cap:
            self._grow_pos(host)
        cdef Py_ssize_t i = self._pos[host] - 1
        if i < 0:
            self._insert(host, due)
        else:
            self._set_due(i, due)

    def remove(self, host_id):
        """Drop a host; True if it was present."""
        cdef int overflow = 0
        cdef long long v = PyLong_AsLongLongAndOverflow(host_id, &overflow)
        if overflow != 0 or v < 0 or v >= self._pos_cap:
            return False
        cdef Py_ssize_t i = self._pos[v] - 1
        if i < 0:
            return False
        self._delete_slot(i)
        return True

    def pop(self):
        """Remove and return the earliest (host_id, due); IndexError if empty."""
        if self._n == 0:
            raise IndexError("pop from empty DueHeap")
        cdef Entry top = self._heap[0]
        self._delete_slot(0)
        return (top.host, top.due)

    def peek(self):
        """The earliest (host_id, due) without removing it, or None if empty."""
        if self._n == 0:
            return None
        return (self._heap[0].host, self._heap[0].due)

    def pop_due(self, double now, Py_ssize_t limit):
        """Pop up to ``limit`` hosts whose due time is <= now, earliest first."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        cdef list out = []
        cdef Py_ssize_t taken = 0
        while taken < limit and self._n > 0 and self._heap[0].due <= now:
            out.append(self._heap[0].host)
            self._delete_slot(0)
            taken += 1
        return out

    def due_of(self, host_id):
        """The due time of a present host, else None."""
        cdef int overflow = 0
        cdef long long v = PyLong_AsLongLongAndOverflow(host_id, &overflow)
        if overflow != 0 or v < 0 or v >= self._pos_cap:
            return None
        cdef Py_ssize_t i = self._pos[v] - 1
        if i < 0:
            return None
        return self._heap[i].due

    def __contains__(self, host_id):
        cdef int overflow = 0
        cdef long long v = PyLong_AsLongLongAndOverflow(host_id, &overflow)
        if overflow != 0 or v < 0 or v >= self._pos_cap:
            return False
        return self._pos[v] != 0

    def __len__(self):
        return self._n

    def clear(self):
        """Remove every host (keeps the allocated arrays)."""
        cdef Py_ssize_t i
        for i in range(self._n):
            self._pos[self._heap[i].host] = 0
        self._n = 0

    def check_invariant(self):
        """Verify the heap order and the position index (for tests); AssertionError if broken."""
        cdef Py_ssize_t i, present = 0
        for i in range(self._n):
            if self._pos[self._heap[i].host] != i + 1:
                raise AssertionError(f"pos[{self._heap[i].host}] != {i} + 1")
            if i > 0 and _before(self._heap[i], self._heap[(i - 1) >> 2]):
                raise AssertionError(f"slot {i} sorts before its parent")
        for i in range(self._pos_cap):
            if self._pos[i] != 0:
                present += 1
        if present != self._n:
            raise AssertionError(f"{present} hosts indexed, {self._n} in heap")
