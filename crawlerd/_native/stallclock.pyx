# cython: language_level=3, boundscheck=False, wraparound=False
"""The loop's next due time, which the stall watch reads and waits on without the GIL.

``metrics.StallWatch`` looks every 10 ms whether the loop's lag timer is overdue. Done in Python,
each look took the GIL: a hundred times a second the watch thread asked the loop thread to let it
go (a forced switch on each side) only to find, nearly every time, that nothing was late. Here
the loop writes its due time into a C double (``due``, with the GIL), and ``wait_overdue`` sleeps
and compares with the GIL released: it comes back, and takes the GIL, only when the loop is late
or the clock is stopped.

The due time is ``time.monotonic()``'s clock (CLOCK_MONOTONIC on Linux). An aligned double is
read and written whole on the platforms crawlerd builds for; a read that races a write sees the
old due time or the new one, and either is a due time the loop set.
"""

from posix.time cimport CLOCK_MONOTONIC, clock_gettime, nanosleep, timespec


cdef inline double _monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef inline void _sleep(double seconds) noexcept nogil:
    cdef timespec ts
    ts.tv_sec = <long>seconds
    ts.tv_nsec = <long>((seconds - <double>ts.tv_sec) * 1e9)
    nanosleep(&ts, NULL)


cdef class DueClock:
    """A due time (``due``: monotonic seconds; 0: none yet) and a stop flag.

    Invariant: once ``stop()`` was called, every ``wait_overdue`` returns None within one poll
    until ``reset()``."""

    cdef double _due
    cdef int _stopped

    def __cinit__(self):
        self._due = 0.0
        self._stopped = 0

    @property
    def due(self) -> float:
        return self._due

    @due.setter
    def due(self, double value):
        self._due = value

    def stop(self) -> None:
        self._stopped = 1

    def reset(self) -> None:
        """Ready to wait again after ``stop()`` (the due time is kept)."""
        self._stopped = 0

    def wait_overdue(self, double threshold_s, double poll_s):
        """Every ``poll_s`` (the GIL released), look whether the due time is more than
        ``threshold_s`` past: ``(due, late_s)`` once it is, None once the clock is stopped."""
        if poll_s <= 0 or threshold_s < 0:
            raise ValueError(f"poll_s must be > 0 and threshold_s >= 0, got {poll_s}, {threshold_s}")
        cdef double due = 0.0
        cdef double late = 0.0
        cdef bint found = False
        with nogil:
            while True:
                _sleep(poll_s)
                if self._stopped:
                    break
                due = self._due
                if due > 0.0:
                    late = _monotonic() - due
                    if late >= threshold_s:
                        found = True
                        break
        if not found:
            return None
        return (due, late)
