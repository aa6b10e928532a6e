"""Storage health: a full disk, a read-only or failing file system pauses fetching, then resumes.

Two ways in. Before anything fails: the data dir's free space is read once a second
(``statvfs``), and below ``storage.min_free_bytes`` fetching pauses, so the work in flight still
has room to be archived. After a write failed (ENOSPC, EROFS, EIO, ...) anywhere a component
writes (WARC segments in the workers, fetch events, robots files): the component reports it
here and keeps what it could not write (a URL not archived goes back to its queue). While
paused, a test write (create, write, fsync, remove) is tried in every directory that failed
each ``storage.probe_interval_s``, or at once on ``crawlerd resume``; when it and the free-space
check pass, fetching resumes. One error line is logged per fault, one info line at its end.

Failures of the LMDB stores or the seen-set cannot be retried in place (a failed commit
discards its transaction), so they end the crawl in order (``fatal``), with the same one-line
reason; the next start recovers from the last commit and the in-flight journal.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from crawlerd.outcome import storage_error

log = logging.getLogger("crawlerd.storage")

PROBE_NAME = ".crawlerd-write-probe"
FREE_CHECK_S = 1.0


class StorageFailure(Exception):
    """A write failed because of the storage (``reason`` is e.g. "disk full: /data/warc")."""

    def __init__(self, reason: str, path: str):
        super().__init__(reason)
        self.reason = reason
        self.path = path


def describe(err: BaseException, path: str) -> str:
    """One line for a storage error: ``"<kind>: <path>"``."""
    return storage_error(err, path)


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def free_space_problem(path: str, min_free_bytes: int) -> str | None:
    """Why a crawl cannot start on this file system (less free space than storage.min_free_bytes), or None."""
    try:
        free = free_bytes(path)
    except OSError as e:
        return f"cannot read the free space of {path}: {e.strerror}"
    if free < min_free_bytes:
        return (f"disk full: {path} has {free} bytes free, storage.min_free_bytes is {min_free_bytes}; "
                "free some space (or lower storage.min_free_bytes) and start again")
    return None


def data_dir_problem(path: str) -> str | None:
    """Why the data dir cannot be used, or None."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return f"cannot create data dir {path}: {e.strerror}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"data dir {path} is not writable"
    return None


class StorageHealth:
    """Whether the crawl may fetch, as far as storage goes. Key of ``_failed``: directory that
    failed a write. Invariant: ``reason`` is None exactly when nothing failed and the free space
    was at least ``min_free_bytes`` at the last check."""

    def __init__(self, data_dir: str, *, min_free_bytes: int, probe_interval_s: float,
                 clock: Callable[[], float], on_change: Callable[[], None] = lambda: None):
        self.data_dir = data_dir
        self.min_free_bytes = min_free_bytes
        self.probe_interval_s = probe_interval_s
        self.clock = clock
        self.on_change = on_change
        self.reason: str | None = None
        self.fatal_reason: str | None = None
        self.faults = 0                      # fault episodes so far
        self._failed: dict[str, str] = {}    # directory -> reason
        self._low_space = False
        self._since = 0.0
        self._next_free_check = 0.0
        self._next_probe = 0.0

    @property
    def paused(self) -> bool:
        return self.reason is not None

    def failed(self, err: BaseException | str, path: str) -> None:
        """A write under ``path`` failed (``err``: the OSError, or its description)."""
        reason = err if isinstance(err, str) else describe(err, path)
        directory = path if os.path.isdir(path) else os.path.dirname(path) or "."
        self._failed.setdefault(directory, reason)
        self._next_probe = self.clock() + self.probe_interval_s
        self._update(reason)

    def fatal(self, err: BaseException, what: str) -> None:
        """A store that cannot retry failed (see the module docstring): the crawl must stop."""
        if self.fatal_reason is None:
            self.fatal_reason = f"{describe(err, self.data_dir)} ({what}: {err})"
            log.error("storage failure, stopping the crawl: %s", self.fatal_reason)

    def step(self, now: float) -> None:
        """Free-space check (once a second) and, while paused, the periodic probe."""
        if now >= self._next_free_check:
            self._next_free_check = now + FREE_CHECK_S
            self._check_free()
        if self._failed and now >= self._next_probe:
            self._next_probe = now + self.probe_interval_s
            self._probe()

    def retry_now(self) -> bool:
        """``crawlerd resume``: probe at once; True if storage is usable again."""
        self._check_free()
        if self._failed:
            self._probe()
        return not self.paused

    def _check_free(self) -> None:
        try:
            low = self.min_free_bytes > 0 and free_bytes(self.data_dir) < self.min_free_bytes
        except OSError as e:
            self.failed(e, self.data_dir)
            return
        if low != self._low_space:
            self._low_space = low
            self._update(f"disk full: {self.data_dir}" if low else None)

    def _probe(self) -> None:
        for directory in list(self._failed):
            path = os.path.join(directory, PROBE_NAME)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    os.write(fd, b"\0" * 4096)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.remove(path)
            except OSError:
                continue
            del self._failed[directory]
        self._update(None)

    def _update(self, reason: str | None) -> None:
        if reason is None:
            reason = next(iter(self._failed.values()), None)
            if reason is None and self._low_space:
                reason = f"disk full: {self.data_dir}"
        was = self.reason
        if reason == was:
            return
        self.reason = reason
        now = self.clock()
        if was is None:
            self.faults += 1
            self._since = now
            log.error("storage fault, fetching paused: %s", reason)
        elif reason is None:
            log.info("storage writable again, fetching resumed after %.0fs", now - self._since)
        self.on_change()
