"""Event-loop stall monitor: how late a periodic callback runs is how long the loop was blocked.

A callback is scheduled every ``interval_s``; when it runs, its lateness (actual minus scheduled
time) is the longest stretch in that interval during which the loop could not run ready work:
a blocking call, a long Python step, or the process waiting for a CPU. Latenesses go into a
fixed histogram (bucket edges in ms below), so percentiles cost nothing per sample and two
snapshots can be subtracted to get the percentiles of a time window (``window_percentile``).
"""

from __future__ import annotations

import asyncio
import bisect

# Upper bucket edges, milliseconds; the last bucket is everything above the last edge.
EDGES_MS = (0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000)


def percentile(counts: list[int], q: float) -> float | None:
    """Upper edge (ms) of the bucket holding quantile ``q`` of a histogram; inf past the last edge."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            return EDGES_MS[i] if i < len(EDGES_MS) else float("inf")
    return float("inf")


def window_percentile(before: list[int], after: list[int], q: float) -> float | None:
    """Quantile ``q`` of the samples taken between two ``snapshot()['hist']`` lists."""
    return percentile([a - b for a, b in zip(after, before, strict=True)], q)


class LoopStallMonitor:
    """Histogram of loop lateness. Key: bucket index (``EDGES_MS``); invariant: ``sum(counts) == samples``,
    ``max_ms`` is the largest lateness seen."""

    def __init__(self, interval_s: float = 0.01) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self.counts = [0] * (len(EDGES_MS) + 1)
        self.samples = 0
        self.max_ms = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due = loop.time() + self.interval_s
        self._handle = loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        loop = self._loop
        now = loop.time()
        self.record((now - self._due) * 1000.0)
        self._due = now + self.interval_s
        self._handle = loop.call_at(self._due, self._tick)

    def record(self, late_ms: float) -> None:
        late_ms = max(0.0, late_ms)
        self.counts[bisect.bisect_left(EDGES_MS, late_ms)] += 1
        self.samples += 1
        if late_ms > self.max_ms:
            self.max_ms = late_ms

    def snapshot(self) -> dict:
        """Percentiles since start (ms, bucket upper edges), the max, and the raw histogram."""
        return {"interval_ms": self.interval_s * 1000, "samples": self.samples,
                "p50_ms": percentile(self.counts, 0.5), "p99_ms": percentile(self.counts, 0.99),
                "p999_ms": percentile(self.counts, 0.999), "max_ms": round(self.max_ms, 2),
                "edges_ms": list(EDGES_MS), "hist": list(self.counts)}
