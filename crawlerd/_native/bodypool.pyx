"""A fixed pool of response-body blocks in one shared memory region, outside malloc.

The crawl process maps a memfd read-write and carves it into ``block_bytes`` blocks after a
header of one ``int32`` link per block. A free block's link names the next free block (the free
list, O(1) take and give); a body's blocks are a chain through the same links, ended by -1. A
processing worker maps the memfd read-only and follows a body's chain from its first block
(:func:`read_chain`), so a job frame names only (first block, size), and a job sent again to a
respawned worker finds its body where it was.

:class:`BodyWriter` is curl's write callback: it copies each chunk straight into the transfer's
blocks (no chunk list, no join). When no block is free it moves what it wrote so far to the heap
and keeps the rest there (a *fallback*, counted): nothing waits and nothing is lost.
:class:`PooledBody` owns a body's blocks; they go back to the free list when it is released or
collected, whichever comes first (so a body nobody holds any more never keeps its blocks).

Everything here runs with the GIL held and calls no Python code between reading and writing the
free list, so the list is never seen half-changed. ``crawlerd/_native/bodypool_ref.py`` is the
pure-Python reference of the block logic.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t
from libc.string cimport memcpy
from posix.unistd cimport close as c_close

import os

cdef extern from "sys/mman.h":
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset) nogil
    int munmap(void *addr, size_t length) nogil
    void *MAP_FAILED
    int PROT_READ, PROT_WRITE, MAP_SHARED

DEF_BLOCK_BYTES = 8192


def layout(Py_ssize_t size_bytes, Py_ssize_t block_bytes):
    """(blocks, header bytes) of a region of ``size_bytes``: one int32 link per block, the header
    rounded up to a page, then the blocks."""
    if block_bytes < 64 or block_bytes % 64:
        raise ValueError("block_bytes must be a positive multiple of 64")
    cdef Py_ssize_t n = size_bytes // (block_bytes + 4)
    cdef Py_ssize_t header = (n * 4 + 4095) // 4096 * 4096
    while n > 0 and header + n * block_bytes > size_bytes:
        n -= 1
    if n < 1 or n >= (1 << 31) - 1:
        raise ValueError(f"a body pool of {size_bytes} bytes holds no {block_bytes}-byte block")
    return n, header


cdef class BodyPool:
    """The writer side: the region, its free list and its counters.

    Invariant: every block is either on the free list or in exactly one live body's chain
    (a :class:`PooledBody`, or a :class:`BodyWriter`'s body being written); ``used`` counts
    the latter, ``high_water`` is the largest ``used`` ever was (``used <= high_water <= blocks``).
    """

    cdef readonly int fd
    cdef readonly Py_ssize_t size          # bytes mapped
    cdef readonly Py_ssize_t block_bytes
    cdef readonly Py_ssize_t blocks        # blocks in all
    cdef readonly Py_ssize_t header        # bytes before the first block
    cdef readonly Py_ssize_t used          # blocks taken
    cdef readonly Py_ssize_t high_water    # the most blocks ever taken at once (sizes the pool)
    cdef readonly Py_ssize_t bodies        # bodies holding blocks (finished and being written)
    cdef readonly Py_ssize_t fallbacks     # bodies that did not fit and went to the heap
    cdef readonly Py_ssize_t pooled        # bodies kept in the pool so far
    cdef unsigned char *base
    cdef int32_t *links
    cdef int32_t free_head
    cdef bint closed

    def __cinit__(self, Py_ssize_t size_bytes, Py_ssize_t block_bytes=DEF_BLOCK_BYTES, name="crawlerd-bodies"):
        cdef void *p = NULL
        cdef Py_ssize_t i, n, header
        self.fd = -1
        self.base = NULL
        self.closed = True
        n, header = layout(size_bytes, block_bytes)
        self.blocks, self.header, self.block_bytes = n, header, block_bytes
        self.size = header + n * block_bytes
        fd = os.memfd_create(name)
        try:
            os.ftruncate(fd, self.size)
            p = mmap(NULL, self.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
            if p == MAP_FAILED:
                raise OSError("cannot map the body pool")
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.base = <unsigned char *>p
        self.links = <int32_t *>p
        # the free list in block order; freed blocks go to its head, so the blocks in use stay
        # among those touched before (the region's pages come in only as far as it was ever full)
        for i in range(n - 1):
            self.links[i] = <int32_t>(i + 1)
        self.links[n - 1] = -1
        self.free_head = 0
        self.closed = False

    cdef void _unmap(self) noexcept:
        """Unmap the region and close the fd, once (``close`` and ``__dealloc__`` both end here).
        The plain C calls run in ``__dealloc__`` too, where Python code is best not called."""
        self.closed = True
        if self.base != NULL:
            munmap(self.base, self.size)
            self.base = NULL
        if self.fd >= 0:
            c_close(self.fd)
            self.fd = -1

    def __dealloc__(self):
        self._unmap()

    def close(self):
        """Unmap the region and close its fd. Bodies still held read as an error from now on."""
        self._unmap()

    @property
    def used_bytes(self):
        return self.used * self.block_bytes

    @property
    def cap_bytes(self):
        return self.blocks * self.block_bytes

    @property
    def high_water_bytes(self):
        """The most bytes of blocks ever in use at once: what ``fetch.body_pool_bytes`` needed."""
        return self.high_water * self.block_bytes

    cdef inline int32_t take(self):
        """A free block, or -1."""
        cdef int32_t b = self.free_head
        if b >= 0:
            self.free_head = self.links[b]
            self.links[b] = -1
            self.used += 1
            if self.used > self.high_water:
                self.high_water = self.used
        return b

    cdef void give_chain(self, int32_t first):
        """The chain from ``first`` back onto the free list."""
        if first < 0 or self.closed:
            return
        cdef int32_t b = first
        cdef Py_ssize_t n = 1
        while self.links[b] >= 0:
            b = self.links[b]
            n += 1
        self.links[b] = self.free_head
        self.free_head = first
        self.used -= n

    cdef bytes chain_bytes(self, int32_t first, Py_ssize_t size):
        if self.closed:
            raise ValueError("body pool closed")
        return _gather(self.base + self.header, self.links, self.block_bytes, first, size)

    def put(self, data):
        """``data`` (bytes) copied into the pool: a :class:`PooledBody`, or None when it does not fit
        (an empty body is never pooled)."""
        cdef bytes b = bytes(data)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(b)
        if n == 0 or self.closed:
            return None
        cdef Py_ssize_t need = (n + self.block_bytes - 1) // self.block_bytes
        if need > self.blocks - self.used:
            return None
        w = BodyWriter(self)
        w.write(PyBytes_AS_STRING(b), n)
        return w.finish()

    def free_blocks(self):
        """Blocks on the free list, counted by walking it (a check for tests)."""
        cdef Py_ssize_t n = 0
        cdef int32_t b = self.free_head
        while b >= 0:
            n += 1
            b = self.links[b]
        return n


cdef bytes _gather(const unsigned char *data, const int32_t *links, Py_ssize_t block_bytes, int32_t first,
                   Py_ssize_t size):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef char *dst = PyBytes_AS_STRING(out)
    cdef Py_ssize_t done = 0, n
    cdef int32_t b = first
    while done < size:
        if b < 0:
            raise ValueError("body chain shorter than its size")
        n = min(block_bytes, size - done)
        memcpy(dst + done, data + <Py_ssize_t>b * block_bytes, n)
        done += n
        b = links[b]
    return out


def read_chain(const unsigned char[::1] region not None, Py_ssize_t blocks, Py_ssize_t header,
               Py_ssize_t block_bytes, int first, Py_ssize_t size):
    """The reader side (a worker, the region mapped read-only): the ``size`` bytes of the body
    whose chain starts at block ``first``."""
    if size < 0 or first < 0 or first >= blocks or header + blocks * block_bytes > region.shape[0]:
        raise ValueError("body outside the pool")
    if size > blocks * block_bytes:
        raise ValueError("body larger than the pool")
    cdef const int32_t *links = <const int32_t *>&region[0]
    # a chain names blocks < blocks; a torn or foreign link must not read past the region
    cdef Py_ssize_t need = (size + block_bytes - 1) // block_bytes, k = 0
    cdef int32_t b = first
    while k < need:
        if b < 0 or b >= blocks:
            raise ValueError("body chain leaves the pool")
        k += 1
        if k < need:
            b = links[b]
    return _gather(&region[0] + header, links, block_bytes, first, size)


cdef class PooledBody:
    """One body's blocks in the pool: ``size`` bytes from block ``first`` along the chain.

    Its blocks go back to the free list at ``release()`` or when it is collected (whichever comes
    first); reading a released body raises ValueError."""

    cdef readonly BodyPool pool
    cdef readonly int first
    cdef readonly Py_ssize_t size

    def __len__(self):
        return self.size

    @property
    def released(self):
        return self.first < 0

    def read(self):
        """The body as bytes (a copy on the heap: for what the crawl loop itself parses, e.g. robots.txt)."""
        if self.first < 0:
            raise ValueError("body released")
        return self.pool.chain_bytes(self.first, self.size)

    def release(self):
        """Give the blocks back now (idempotent)."""
        if self.first >= 0:
            self.pool.give_chain(self.first)
            self.pool.bodies -= 1
            self.first = -1

    def __dealloc__(self):
        if self.pool is not None and self.first >= 0:
            self.pool.give_chain(self.first)
            self.pool.bodies -= 1
            self.first = -1

    def __repr__(self):
        return f"PooledBody(first={self.first}, size={self.size})"


cdef class BodyWriter:
    """curl's write callback for one transfer: ``writer(chunk)`` appends the chunk to the body.

    The body is in the pool (a chain from ``first``, ``fill`` bytes used in its ``last`` block) until
    a block is not to be had; from then on it is a list of heap chunks (``spill``). ``finish()``
    hands the body over (a :class:`PooledBody`, heap bytes, or ``b""``) and leaves the writer empty
    for the next transfer."""

    cdef BodyPool pool
    cdef int32_t first, last
    cdef Py_ssize_t fill, size
    cdef list spill

    def __cinit__(self, BodyPool pool not None):
        self.pool = pool
        self.first = self.last = -1
        self.fill = self.size = 0
        self.spill = None

    def __call__(self, bytes chunk not None):
        self.write(PyBytes_AS_STRING(chunk), PyBytes_GET_SIZE(chunk))

    def __len__(self):
        return self.size

    def __bool__(self):
        return self.size > 0

    cdef int write(self, const char *src, Py_ssize_t n) except -1:
        cdef BodyPool pool = self.pool
        cdef Py_ssize_t room, k
        cdef int32_t b
        if self.spill is not None or pool.closed:
            self._spill(src, n)
            return 0
        while n > 0:
            room = pool.block_bytes - self.fill if self.last >= 0 else 0
            if room == 0:
                b = pool.take()
                if b < 0:
                    self._to_heap()
                    self._spill(src, n)
                    return 0
                if self.last < 0:
                    self.first = b
                    pool.bodies += 1
                else:
                    pool.links[self.last] = b
                self.last = b
                self.fill = 0
                room = pool.block_bytes
            k = min(room, n)
            memcpy(pool.base + pool.header + <Py_ssize_t>self.last * pool.block_bytes + self.fill, src, k)
            self.fill += k
            self.size += k
            src += k
            n -= k
        return 0

    cdef void _spill(self, const char *src, Py_ssize_t n):
        if self.spill is None:
            self.spill = []
        self.spill.append(PyBytes_FromStringAndSize(src, n))
        self.size += n

    cdef int _to_heap(self) except -1:
        """The pool is full: what was written moves to the heap, its blocks go back."""
        self.spill = []
        if self.first >= 0:
            self.spill.append(self.pool.chain_bytes(self.first, self.size))
            self.pool.give_chain(self.first)
            self.pool.bodies -= 1
        self.first = self.last = -1
        self.fill = 0
        return 0

    def finish(self):
        """The body written since the last ``finish``/``clear``: a :class:`PooledBody`, heap bytes
        (it did not fit: counted in ``pool.fallbacks``) or ``b""``; the writer is empty after."""
        cdef PooledBody body
        if self.spill is not None:
            out = b"".join(self.spill)
            self.spill = None
            self.size = 0
            self.pool.fallbacks += 1
            return out
        if self.first < 0:
            return b""
        body = PooledBody.__new__(PooledBody)
        body.pool = self.pool
        body.first = self.first
        body.size = self.size
        self.pool.pooled += 1
        self.first = self.last = -1
        self.fill = self.size = 0
        return body

    def clear(self):
        """Drop the body written so far (its blocks go back)."""
        if self.first >= 0:
            self.pool.give_chain(self.first)
            self.pool.bodies -= 1
        self.first = self.last = -1
        self.fill = self.size = 0
        self.spill = None

    def __dealloc__(self):
        if self.pool is not None and self.first >= 0:
            self.pool.give_chain(self.first)
            self.pool.bodies -= 1
            self.first = -1
