"""The domain-edge DRUM's schedule (when to merge, how far in-degrees lag) and its one-thread driver.

STAR needs in-degrees that are current, but a DRUM merge rewrites the whole sorted key file, so
it merges on its own schedule, not per page: once the oldest unmerged edge is ``max_age_s`` old
or ``max_pending`` edges wait, and never more often than every ten merge durations (merging stays
under ~10% of the time however large the file grows). The shard runs that DRUM on its own thread
(``crawlerd.seen.AsyncSeenSet``); :class:`EdgeDrum` drives one on the caller's thread (tests,
benchmarks, the virtual-clock simulation).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

from crawlerd.frontier.budgets.graph import DomainGraph
from crawlerd.seen.drum import Drum


class EdgeClock:
    """Merge triggers and in-degree lag of one edge DRUM.

    Key: submission marks ``(first seq, time)``, one per submission at most every ``mark_s``.
    Invariant: marks are in seq order and cover every submitted edge not yet delivered, so the
    oldest mark is the age of the oldest edge still waiting (to within ``mark_s``).
    """

    def __init__(self, *, max_age_s: float, max_pending: int, mark_s: float = 0.25):
        if max_age_s < 0 or max_pending < 1:
            raise ValueError("need max_age_s >= 0 and max_pending >= 1")
        self.max_age_s = max_age_s
        self.max_pending = max_pending
        self.mark_s = mark_s
        self._marks: deque[tuple[int, float]] = deque()
        self._next_seq = 0
        self.last_merge_s = 0.0              # duration of the last merge
        self._last_merge_at = -1e18
        self.lag_last_s = 0.0                # age of the oldest edge of the last delivery
        self.lag_max_s = 0.0

    def submitted(self, first_seq: int, n: int, now: float) -> None:
        if n <= 0:
            return
        if not self._marks or now - self._marks[-1][1] >= self.mark_s:
            self._marks.append((first_seq, now))
        self._next_seq = first_seq + n

    def oldest_age(self, now: float) -> float:
        return now - self._marks[0][1] if self._marks else 0.0

    def should_merge(self, now: float, pending: int) -> bool:
        """A merge is due: the oldest waiting edge is old enough, or enough edges wait."""
        if pending <= 0 or now - self._last_merge_at < 10 * self.last_merge_s:
            return False
        return pending >= self.max_pending or self.oldest_age(now) >= self.max_age_s

    def merged(self, started: float, duration_s: float) -> None:
        self._last_merge_at = started
        self.last_merge_s = duration_s

    def delivered(self, end_seq: int, now: float) -> None:
        """Answers below ``end_seq`` were applied at ``now``: record the lag of the oldest."""
        marks = self._marks
        if not marks or marks[0][0] >= end_seq:
            return
        oldest = marks[0][1]
        while marks:
            nxt = marks[1][0] if len(marks) > 1 else self._next_seq
            if nxt <= end_seq:
                marks.popleft()
            else:
                if marks[0][0] < end_seq:        # partly delivered: the rest keeps its (older) time
                    marks[0] = (end_seq, marks[0][1])
                break
        self.lag_last_s = now - oldest
        self.lag_max_s = max(self.lag_max_s, self.lag_last_s)

    def stats(self, now: float) -> dict:
        return {"lag_last_s": round(self.lag_last_s, 3), "lag_max_s": round(self.lag_max_s, 3),
                "oldest_waiting_s": round(self.oldest_age(now), 3), "last_merge_s": round(self.last_merge_s, 3),
                "max_age_s": self.max_age_s, "max_pending": self.max_pending}


class EdgeDrum:
    """The domain-edge DRUM driven on the caller's thread, applying its answers to a graph.

    Single-threaded; the graph's store is committed before the DRUM is acknowledged, so answers
    a crash cuts off are delivered again and recognised by the graph (``applied_seq``).
    """

    def __init__(self, path: str, graph: DomainGraph, *, max_age_s: float = 5.0, max_pending: int = 200_000,
                 buckets: int = 8, bucket_buffer_bytes: int = 64 << 10, merge_bytes: int = 64 << 20,
                 cache_entries: int = 1 << 16, clock: Callable[[], float] = time.monotonic):
        self.graph = graph
        self.clock = clock
        self.timing = EdgeClock(max_age_s=max_age_s, max_pending=max_pending)
        self._drum = Drum(path, buckets=buckets, bucket_buffer_bytes=bucket_buffer_bytes,
                          merge_bytes=merge_bytes, max_age_s=1e18, cache_entries=cache_entries, clock=clock,
                          auto_ack=False)

    def add(self, src_pld: str, targets: Iterable[str]) -> int:
        """Record the links of one page of ``src_pld``; returns edges submitted."""
        keys, aux = self.graph.edge_keys(src_pld, targets)
        if keys:
            self.timing.submitted(self._drum.next_seq, len(keys), self.clock())
            self._drum.check_update(keys, aux=aux)
        return len(keys)

    def add_vouches(self, pairs: Iterable[tuple[bytes, bytes]]) -> int:
        """Vouches another shard cast for this one's domains (``DomainGraph.vouch_keys``)."""
        keys, aux = self.graph.vouch_keys(pairs)
        if keys:
            self.timing.submitted(self._drum.next_seq, len(keys), self.clock())
            self._drum.check_update(keys, aux=aux)
        return len(keys)

    @property
    def pending(self) -> int:
        return self._drum.pending

    def poll(self, now: float | None = None) -> int:
        """Merge if due (age, pending edges, or a full bucket) and apply; returns unique edges applied."""
        now = self.clock() if now is None else now
        if self._drum.ready or self.timing.should_merge(now, self._drum.pending):
            return self.flush(now)
        return 0

    def flush(self, now: float | None = None) -> int:
        """Merge every waiting edge now and apply the answers; returns unique edges applied."""
        now = self.clock() if now is None else now
        t0 = time.perf_counter()
        self._drum.flush()
        self.timing.merged(now, time.perf_counter() - t0)
        unique = 0
        for results in iter(self._drum.results, []):
            unique += self.graph.apply(results)
        self.graph.store.commit()
        self._drum.ack()
        self.timing.delivered(self.graph.applied_seq, self.clock())
        return unique

    def close(self) -> None:
        """Edges not merged stay in the DRUM journal and are applied after reopening."""
        self._drum.close()
