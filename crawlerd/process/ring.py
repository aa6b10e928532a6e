"""A shared-memory ring that carries response bodies from the crawl process to one worker.

The crawl process copies a body into the ring once (``put``) and sends the worker only its
offset and length; the worker maps the same memfd read-only and slices the body out. No pickle
of the body, no copy through the socket buffers. A region stays untouched until the worker has
answered for its job (``release``): a worker answers its jobs in the order they were sent, so
regions are freed oldest first and the free space is always one contiguous run (or two, split
at the end of the ring).

A body that does not fit (bigger than the free space, or than the ring) goes inline in the
job's frame instead: nothing waits for ring space.
"""

from __future__ import annotations

import mmap
import os
from collections import deque


class BodyRing:
    """Writer side. Key: job id -> its region ``[start, end)``; ``regions`` holds them in send order.

    Invariant: regions never overlap; ``head`` is the end of the newest region (0 when empty);
    a region's bytes are not overwritten before ``release`` passed its job.
    """

    def __init__(self, size_bytes: int, name: str = "crawlerd-ring") -> None:
        if size_bytes < 4096:
            raise ValueError("ring of at least 4096 bytes")
        self.size = size_bytes
        self.fd = os.memfd_create(name)
        try:
            os.ftruncate(self.fd, size_bytes)
            self.map = mmap.mmap(self.fd, size_bytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.head = 0
        self.regions: deque[tuple[int, int, int]] = deque()     # (job id, start, end)
        self._in_ring: set[int] = set()
        self.inline = 0                                          # bodies that did not fit

    def put(self, job_id: int, data: bytes) -> int:
        """Copy ``data`` into the ring for ``job_id``; its offset, or -1 (send it inline)."""
        n = len(data)
        if n == 0:
            return -1
        regions = self.regions
        if not regions:
            start = 0 if n <= self.size else -1
        else:
            tail, head = regions[0][1], self.head
            if head > tail:                     # used: [tail, head); free: [head, size) + [0, tail)
                start = head if self.size - head >= n else (0 if tail > n else -1)
            else:                               # wrapped: used [tail, size) + [0, head); free [head, tail)
                start = head if tail - head > n else -1
        if start < 0:
            self.inline += 1
            return -1
        self.map[start:start + n] = data
        self.head = start + n
        regions.append((job_id, start, start + n))
        self._in_ring.add(job_id)
        return start

    def release(self, job_id: int) -> None:
        """The worker answered ``job_id``: free its region and every older one."""
        if job_id not in self._in_ring:
            return
        regions = self.regions
        while regions:
            jid, _, _ = regions.popleft()
            self._in_ring.discard(jid)
            if jid == job_id:
                break
        if not regions:
            self.head = 0

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


class RingReader:
    """Reader side (the worker): the same memfd mapped read-only."""

    def __init__(self, fd: int, size_bytes: int) -> None:
        self.map = mmap.mmap(fd, size_bytes, prot=mmap.PROT_READ)

    def get(self, offset: int, length: int) -> bytes:
        return self.map[offset:offset + length]

    def close(self) -> None:
        self.map.close()
