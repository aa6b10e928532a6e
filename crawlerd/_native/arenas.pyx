"""Python's small-object arenas mapped resident (``MAP_POPULATE``), so their private memory is the
arenas' count times their size from the moment each is made.

CPython's allocator (pymalloc) takes 1 MiB arenas from ``mmap`` and carves them into 16 KiB pools
one at a time, as objects need them; a pool's pages come in when it is first carved, and an arena
goes back only when every pool in it is empty. In a long-lived process whose objects churn (the
byte caches evict and refill, the answer batches come and go) the pools of the arenas it already
holds are carved over hours: private memory creeps up to the arenas' size without one more arena,
and reads as growth per page crawled. :func:`populate_arenas` installs an arena allocator that maps
each arena with its pages present: the same total, taken when the arena is made. Arenas mapped
before the call are freed the same way (``munmap``)."""

cdef extern from "Python.h":
    ctypedef struct PyObjectArenaAllocator:
        void *ctx
        void *(*alloc)(void *ctx, size_t size) noexcept
        void (*free)(void *ctx, void *ptr, size_t size) noexcept
    void PyObject_GetArenaAllocator(PyObjectArenaAllocator *allocator)
    void PyObject_SetArenaAllocator(PyObjectArenaAllocator *allocator)

cdef extern from "sys/mman.h":
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset) nogil
    int munmap(void *addr, size_t length) nogil
    void *MAP_FAILED
    int PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS, MAP_POPULATE


cdef void *_alloc(void *ctx, size_t size) noexcept nogil:
    cdef void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0)
    if p == MAP_FAILED:
        return NULL
    return p


cdef void _free(void *ctx, void *ptr, size_t size) noexcept nogil:
    munmap(ptr, size)


cdef bint _installed = False


def populate_arenas():
    """Map Python's arenas resident from now on (idempotent). Returns True once installed."""
    global _installed
    cdef PyObjectArenaAllocator a
    if not _installed:
        a.ctx = NULL
        a.alloc = _alloc
        a.free = _free
        PyObject_SetArenaAllocator(&a)
        _installed = True
    return _installed
