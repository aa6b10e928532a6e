"""Who may run a shard: the ownership lease a shard holds while it crawls its partition.

Interface (what a shard process needs; a networked engine can stand behind it):

``acquire()``
    take the lease or return False (someone else runs this shard);
``held(now)``
    the fencing check, asked before every leasing step: False once the lease may have passed
    to another owner, so the shard stops starting requests before a new owner can start any;
``renew(now)``
    extend it (a no-op where the lease cannot expire); ``release()``.

On one machine the lease is an exclusive ``flock`` on ``shards/<i>/lock``: the kernel drops it
when the process dies (``kill -9`` included), it never expires while the process lives, and a
second process for the same shard cannot take it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os


class LocalShardLease:
    """An exclusive lock on ``path`` for the life of this process. Key: the lock file."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def held(self, now: float = 0.0) -> bool:
        return self._fd is not None

    def renew(self, now: float = 0.0) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
