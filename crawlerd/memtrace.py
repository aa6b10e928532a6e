"""A debug switch that finds what grows: the crawl process's Python allocations, snapshotted.

With ``CRAWLERD_TRACEMALLOC_S=N`` in its environment the crawl process starts ``tracemalloc`` (one
frame per allocation) and every ``N`` seconds writes a snapshot to
``<shard state>/tracemalloc/<seconds since start>.snap``; off (unset or 0) it costs nothing.
Tracing slows the loop several-fold, so it is for diagnosis only, never for a measured run.
Compare two snapshots (what grew between them, by source line)::

    python -m crawlerd.memtrace OLD.snap NEW.snap [TOP]

Only Python's allocator is traced: C allocations (LMDB, libcurl, the native kernels' ``malloc``)
show in ``crawlerd stats`` ``malloc`` (glibc's heap numbers) instead.
"""

from __future__ import annotations

import os
import sys
import time
import tracemalloc

ENV = "CRAWLERD_TRACEMALLOC_S"


class MemTrace:
    """Snapshots to ``directory`` every ``interval_s``; invariant: snapshot files are named by the
    whole seconds since the tracer started, so their names sort in time order."""

    def __init__(self, directory: str, interval_s: float, clock=time.monotonic) -> None:
        self.directory = directory
        self.interval_s = interval_s
        self.clock = clock
        os.makedirs(directory, exist_ok=True)
        self.t0 = clock()
        self.last = self.t0
        if not tracemalloc.is_tracing():
            tracemalloc.start(1)

    @classmethod
    def from_env(cls, directory: str, clock=time.monotonic) -> MemTrace | None:
        """A tracer if ``CRAWLERD_TRACEMALLOC_S`` is a positive number of seconds, else None."""
        try:
            interval_s = float(os.environ.get(ENV, "0") or 0)
        except ValueError:
            return None
        return cls(directory, interval_s, clock) if interval_s > 0 else None

    def maybe_dump(self, now: float | None = None) -> str | None:
        """Write a snapshot if the interval passed; its path, or None."""
        now = self.clock() if now is None else now
        if now - self.last < self.interval_s:
            return None
        self.last = now
        path = os.path.join(self.directory, f"{int(now - self.t0):07d}.snap")
        tracemalloc.take_snapshot().dump(path)
        return path


def grown(old: str, new: str, top: int = 30) -> list[str]:
    """The source lines whose live Python allocations grew most from snapshot ``old`` to ``new``."""
    a, b = tracemalloc.Snapshot.load(old), tracemalloc.Snapshot.load(new)
    total = sum(s.size for s in b.statistics("filename")) - sum(s.size for s in a.statistics("filename"))
    lines = [f"total {total / 1024:+.1f} KiB"]
    lines += [str(d) for d in b.compare_to(a, "lineno")[:top]]
    return lines


if __name__ == "__main__":
    print("\n".join(grown(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 30)))
