# cython: language_level=3, boundscheck=False, wraparound=False
"""A thread's ``/proc/<tid>/schedstat`` (Linux sched_info), read and parsed holding the GIL.

``LoopLag`` reads the loop thread's file at each of its 100 samples a second. ``os.pread`` releases
the GIL around the read (~1 us), which lets a thread waiting for the GIL (the writer, DRUM, the
workers' hand-off) take it and the loop wait to get it back: a futex wake and often a context
switch on each side, for a read that cannot block. Here the read and the parse are one C call
that keeps the GIL.
"""

from libc.errno cimport errno
from posix.unistd cimport pread


def read_schedstat(int fd):
    """(on-CPU ns, run-queue wait ns): the first two fields of the schedstat file open on ``fd``."""
    cdef char buf[96]
    cdef Py_ssize_t n = pread(fd, buf, 95, 0)
    if n < 0:
        raise OSError(errno, "pread of schedstat failed")
    cdef unsigned long long v[2]
    cdef Py_ssize_t i = 0
    cdef int k
    cdef bint digits
    for k in range(2):
        v[k] = 0
        while i < n and buf[i] == b' ':
            i += 1
        digits = False
        while i < n and b'0' <= buf[i] <= b'9':
            v[k] = v[k] * 10 + <unsigned long long> (buf[i] - 48)
            i += 1
            digits = True
        if not digits:
            raise ValueError("schedstat: expected two numbers")
    return v[0], v[1]
