"""Per-IP request slots shared by the shard processes of one machine (a file they all map).

Hosts of different registered domains share addresses (virtual hosting), so two shards may
hold hosts on one IP. Each shard's frontier enforces ``politeness.per_ip_concurrency`` and
``ip_delay_s`` for its own leases; this table makes them hold across shards: a shard takes a
cell of the IP's entry before a request starts and frees it when the request ends.

Layout (little-endian, every word 8-byte aligned)::

    header   64 bytes: magic u64, version u32, cells u32, entries u64, shards u32
    gens     shards x u64, padded to 64 bytes: the current generation of each shard
    entries  entries x (1 + cells) u64: due (the float64's bits), then the holder cells

Key: an entry is ``key & (entries - 1)`` for a 64-bit hash of the IP, so two IPs may share an
entry: that only serialises them further, never less. A holder cell is 0 when free, else
``generation << 16 | (shard + 1)``. Invariants: at most ``cells`` requests hold an entry; with
``delay_s > 0`` a request starts only once ``due <= now``, and every start and end pushes
``due`` to at least ``now + delay_s``. Every change is one atomic (GCC ``__atomic``, sequentially
consistent) store or compare-and-swap, so a process killed at any instruction leaves either its
cell or none; ``attach`` starts a shard's new generation and frees the cells its earlier (dead)
generations held.

The pure-Python reference with identical semantics (serialised by ``fcntl`` locks instead) is
``ipslots_ref.RefIPSlots``. Times are seconds of CLOCK_MONOTONIC (one clock for every process
of the machine), or of any clock all users share; they must be positive.
"""

from libc.stdint cimport uint64_t
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, PROT_WRITE, mmap, munmap

import os

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    static inline uint64_t ips_load(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline void ips_store(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static inline int ips_cas(uint64_t *p, uint64_t expected, uint64_t desired) {
        return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    static inline uint64_t ips_add(uint64_t *p, uint64_t v) { return __atomic_add_fetch(p, v, __ATOMIC_SEQ_CST); }
    static inline double ips_d(uint64_t bits) { double d; memcpy(&d, &bits, 8); return d; }
    static inline uint64_t ips_u(double d) { uint64_t b; memcpy(&b, &d, 8); return b; }
    """
    uint64_t ips_load(uint64_t *p) nogil
    void ips_store(uint64_t *p, uint64_t v) nogil
    int ips_cas(uint64_t *p, uint64_t expected, uint64_t desired) nogil
    uint64_t ips_add(uint64_t *p, uint64_t v) nogil
    double ips_d(uint64_t bits) nogil
    uint64_t ips_u(double d) nogil

cdef enum:
    _HEADER = 64

MAGIC = 0x31544C5350494352      # "RCIPSLT1"
VERSION = 1
HEADER_BYTES = _HEADER
MAX_SHARDS = 0xFFFF
GEN_MASK = (1 << 48) - 1


def table_bytes(int shards, int cells, uint64_t entries):
    """File size of a table: header, generations, entries."""
    return HEADER_BYTES + _gens_bytes(shards) + entries * 8 * (1 + cells)


cdef inline uint64_t _gens_bytes(int shards):
    return ((shards * 8 + 63) // 64) * 64


def _check_shape(int shards, int cells, uint64_t entries):
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards = {shards}: expected 1..{MAX_SHARDS}")
    if not 1 <= cells <= 255:
        raise ValueError(f"cells = {cells}: expected 1..255")
    if entries < 1 or entries & (entries - 1):
        raise ValueError(f"entries = {entries}: expected a power of two")


def create(path, int shards, int cells, uint64_t entries=1 << 20):
    """Write a fresh table at ``path`` (temp name, then rename): every cell free, every due 0."""
    _check_shape(shards, cells, entries)
    import struct
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, table_bytes(shards, cells, entries))     # sparse: zero pages cost nothing
        os.pwrite(fd, struct.pack("<QIIQI", MAGIC, VERSION, cells, entries, shards), 0)
    finally:
        os.close(fd)
    os.replace(tmp, path)


cdef class IPSlots:
    """The mapped table; one object per process (see the module docstring for the layout)."""

    cdef unsigned char *base
    cdef size_t size
    cdef uint64_t *gens
    cdef uint64_t *entries_at
    cdef readonly uint64_t entries
    cdef readonly int cells
    cdef readonly int shards
    cdef readonly int shard
    cdef readonly uint64_t generation
    cdef uint64_t tag
    cdef uint64_t mask
    cdef int stride

    def __cinit__(self):
        self.base = NULL
        self.shard = -1

    def __init__(self, path):
        import struct
        cdef void *p
        cdef int shards, cells
        cdef uint64_t entries
        fd = os.open(path, os.O_RDWR)
        try:
            head = os.pread(fd, HEADER_BYTES, 0)
            if len(head) < 32:
                raise ValueError(f"{path}: not an IP slot table (too short)")
            magic, version, cells, entries, shards = struct.unpack_from("<QIIQI", head)
            if magic != MAGIC or version != VERSION:
                raise ValueError(f"{path}: not an IP slot table (magic {magic:#x}, version {version})")
            _check_shape(shards, cells, entries)
            self.size = table_bytes(shards, cells, entries)
            if os.fstat(fd).st_size < self.size:
                raise ValueError(f"{path}: truncated IP slot table")
            p = mmap(NULL, self.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
            if p == MAP_FAILED:
                raise OSError(f"{path}: mmap failed")
        finally:
            os.close(fd)
        self.base = <unsigned char *>p
        self.cells, self.entries, self.shards = cells, entries, shards
        self.gens = <uint64_t *>(self.base + _HEADER)
        self.entries_at = <uint64_t *>(self.base + _HEADER + _gens_bytes(shards))
        self.mask = entries - 1
        self.stride = 1 + cells

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, self.size)
            self.base = NULL

    def close(self):
        if self.base != NULL:
            munmap(self.base, self.size)
            self.base = NULL

    cdef inline int _open_check(self) except -1:
        if self.base == NULL:
            raise ValueError("IP slot table is closed")
        return 0

    def attach(self, int shard, double now=0.0, double delay_s=0.0):
        """Start a new generation of ``shard`` in this process; frees the cells of its earlier ones.

        Call only once the shard's previous process is gone. A freed cell was a request cut off
        by that death: its entry's due time is pushed to ``now + delay_s``, as if it ended now.
        Returns the new generation."""
        self._open_check()
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} outside 0..{self.shards - 1}")
        gen = ips_add(&self.gens[shard], 1) & GEN_MASK
        self.shard, self.generation = shard, gen
        self.tag = (gen << 16) | <uint64_t>(shard + 1)
        self._free_cells(shard, gen, True, now + delay_s if delay_s > 0 else 0.0)
        return gen

    def reclaim(self, int shard, double now=0.0, double delay_s=0.0):
        """Free every cell ``shard`` holds, whatever its generation (the supervisor, after its
        death); each freed entry's due time is pushed to ``now + delay_s``. Returns cells freed."""
        self._open_check()
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} outside 0..{self.shards - 1}")
        return self._free_cells(shard, 0, False, now + delay_s if delay_s > 0 else 0.0)

    cdef uint64_t _free_cells(self, int shard, uint64_t keep_gen, bint keep, double due_at) noexcept:
        cdef uint64_t i, v, old, n = 0, total = self.entries * self.stride
        cdef uint64_t who = <uint64_t>(shard + 1)
        cdef uint64_t *e
        for i in range(total):
            if i % self.stride == 0:
                continue                # the entry's due word
            v = ips_load(&self.entries_at[i])
            if v != 0 and (v & 0xFFFF) == who and not (keep and (v >> 16) == keep_gen):
                e = self.entries_at + (i - i % self.stride)
                if due_at > 0:          # before the cell is free: nobody starts inside the gap
                    while True:
                        old = ips_load(&e[0])
                        if ips_d(old) >= due_at or ips_cas(&e[0], old, ips_u(due_at)):
                            break
                if ips_cas(&self.entries_at[i], v, 0):
                    n += 1
        return n

    def try_acquire(self, uint64_t key, double now, double delay_s):
        """Take a cell of ``key``'s entry: 0.0 when taken, else the time to try again.

        With ``delay_s > 0`` the request may start only once the entry's due time has passed,
        and taking the cell pushes it to ``now + delay_s``. A full entry returns ``now``."""
        self._open_check()
        if self.shard < 0:
            raise ValueError("attach(shard) first")
        if not now > 0:
            raise ValueError(f"now = {now!r}: times must be positive")
        return self._acquire(key, now, delay_s)

    cdef double _acquire(self, uint64_t key, double now, double delay_s) noexcept:
        cdef uint64_t *e = self.entries_at + (key & self.mask) * self.stride
        cdef uint64_t old
        cdef double due, want
        cdef int c, got = -1
        if delay_s > 0:
            due = ips_d(ips_load(&e[0]))
            if due > now:
                return due
        for c in range(1, self.stride):
            if ips_cas(&e[c], 0, self.tag):
                got = c
                break
        if got < 0:
            return now
        if delay_s > 0:
            want = now + delay_s
            while True:
                old = ips_load(&e[0])
                due = ips_d(old)
                if due > now:           # another shard started in between: give the cell back
                    ips_store(&e[got], 0)
                    return due
                if ips_cas(&e[0], old, ips_u(want if want > due else due)):
                    break
        return 0.0

    def release(self, uint64_t key, double now, double delay_s):
        """A request holding a cell of ``key``'s entry ended at ``now``: push due, free the cell.

        Returns False when this shard held no cell there (already reclaimed)."""
        self._open_check()
        if self.shard < 0:
            raise ValueError("attach(shard) first")
        cdef uint64_t *e = self.entries_at + (key & self.mask) * self.stride
        cdef uint64_t old
        cdef double due, want
        cdef int c
        if delay_s > 0:
            want = now + delay_s
            while True:
                old = ips_load(&e[0])
                due = ips_d(old)
                if due >= want or ips_cas(&e[0], old, ips_u(want)):
                    break
        for c in range(1, self.stride):
            if ips_load(&e[c]) == self.tag and ips_cas(&e[c], self.tag, 0):
                return True
        return False

    def held(self, int shard=-1):
        """Cells held by ``shard`` (-1: by anyone)."""
        self._open_check()
        cdef uint64_t i, v, n = 0, total = self.entries * self.stride
        for i in range(total):
            if i % self.stride == 0:
                continue
            v = ips_load(&self.entries_at[i])
            if v != 0 and (shard < 0 or (v & 0xFFFF) == <uint64_t>(shard + 1)):
                n += 1
        return n

    def due(self, uint64_t key):
        """The due time of ``key``'s entry (0.0: never used)."""
        self._open_check()
        return ips_d(ips_load(&self.entries_at[(key & self.mask) * self.stride]))
