"""One streaming pass over the fetch-event logs into bounded aggregates for the crawl report.

A crawl of a billion pages has a billion event lines, so nothing here grows
with the number of events: counts over time live in at most ``MAX_BUCKETS``
time buckets (their width doubles when the crawl outgrows them), per-host
politeness state is kept for at most ``max_hosts`` hosts (least recently
fetched dropped first), and the "top" tables are heavy-hitter counters trimmed
to a fixed size.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import random
from array import array
from bisect import bisect_right
from collections import Counter, OrderedDict
from collections.abc import Iterable

from crawlerd.url.hosts import host_key, host_of, registered_domain

MAX_BUCKETS = 360
# gap histogram bin edges, seconds: 0, then 16 per decade from 1 ms to ~1 h (politeness gaps span that)
GAP_EDGES_S = (0.0, *(round(10 ** (e / 16), 6) for e in range(-48, 57)))
FETCH_EDGES_MS = tuple(round(10 ** (e / 4), 3) for e in range(0, 20))       # 1 ms .. ~56 s
NETWORK_KINDS = frozenset({"page", "robots", "sitemap"})


def event_files(events_dir: str) -> list[str]:
    """Event files in time order (names carry a UTC stamp); the open file of a running crawl last."""
    try:
        names = [n for n in os.listdir(events_dir) if n.endswith((".jsonl", ".jsonl.open"))]
    except FileNotFoundError:
        return []
    return [os.path.join(events_dir, n) for n in sorted(names, key=lambda n: n.split("-", 1)[-1])]


class TopCounter:
    """Approximate heavy hitters. Key: item -> count. Invariant: at most ``2 * keep`` items; when it
    reaches that, only the ``keep`` largest survive (an item's count is exact while it stays)."""

    def __init__(self, keep: int = 5000):
        self.keep = keep
        self.counts: Counter[str] = Counter()
        self.trimmed = False

    def add(self, item: str, n: int = 1) -> None:
        self.counts[item] += n
        if len(self.counts) >= 2 * self.keep:
            self.counts = Counter(dict(self.counts.most_common(self.keep)))
            self.trimmed = True

    def top(self, n: int) -> list[tuple[str, int]]:
        return self.counts.most_common(n)


class TimeBuckets:
    """Counts per time interval. Key: bucket index ``floor(t / width_s)`` -> Counter of series names.

    Invariant: the indices span fewer than ``max_buckets`` slots; when a time would break that,
    ``width_s`` doubles and neighbouring buckets merge (index // 2 on the same absolute grid)."""

    def __init__(self, width_s: float = 1.0, max_buckets: int = MAX_BUCKETS):
        self.width_s = width_s
        self.max_buckets = max_buckets
        self.buckets: dict[int, Counter[str]] = {}
        self.lo: int | None = None
        self.hi: int | None = None

    def add(self, t: float, series: Iterable[tuple[str, float]]) -> None:
        i = math.floor(t / self.width_s)
        while self.lo is not None and max(self.hi, i) - min(self.lo, i) >= self.max_buckets:
            self._coarsen()
            i = math.floor(t / self.width_s)
        b = self.buckets.get(i)
        if b is None:
            b = self.buckets[i] = Counter()
        for name, v in series:
            b[name] += v
        self.lo = i if self.lo is None else min(self.lo, i)
        self.hi = i if self.hi is None else max(self.hi, i)

    def _coarsen(self) -> None:
        merged: dict[int, Counter[str]] = {}
        for i, b in self.buckets.items():
            merged.setdefault(i // 2, Counter()).update(b)
        self.buckets = merged
        self.width_s *= 2
        self.lo //= 2
        self.hi //= 2

    def series(self) -> tuple[list[float], dict[str, list[float]]]:
        """(bucket start times, name -> per-second rate in each bucket), empty buckets included."""
        if self.lo is None:
            return [], {}
        names = sorted({n for b in self.buckets.values() for n in b})
        idx = range(self.lo, self.hi + 1)
        times = [i * self.width_s for i in idx]
        empty: Counter[str] = Counter()
        return times, {n: [self.buckets.get(i, empty)[n] / self.width_s for i in idx] for n in names}


def histogram_bin(edges: tuple[float, ...], v: float) -> int:
    """Index of the bin ``[edges[i], edges[i+1])`` holding ``v``; the last bin is open-ended, the first
    takes everything below ``edges[1]``."""
    return max(0, bisect_right(edges, v) - 1)


class HostGaps:
    """One host's last request and its gaps: exact count/min/max, and a uniform reservoir sample of
    ``SAMPLE`` gaps (Vitter's algorithm R) for its quantiles."""

    __slots__ = ("last_start", "last_end", "requests", "ngaps", "min_gap", "max_gap", "sample")
    SAMPLE = 64

    def __init__(self):
        self.last_start = 0.0
        self.last_end = 0.0
        self.requests = 0
        self.ngaps = 0
        self.min_gap = math.inf
        self.max_gap = -math.inf
        self.sample = array("d")

    def add_gap(self, gap: float, rng: random.Random) -> None:
        self.ngaps += 1
        self.min_gap = min(self.min_gap, gap)
        self.max_gap = max(self.max_gap, gap)
        if len(self.sample) < self.SAMPLE:
            self.sample.append(gap)
        else:
            j = rng.randrange(self.ngaps)
            if j < self.SAMPLE:
                self.sample[j] = gap

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the sampled gaps (exact while the host has at most SAMPLE gaps)."""
        if not self.sample:
            return 0.0
        ranked = sorted(self.sample)
        return ranked[min(len(ranked) - 1, int(q * len(ranked)))]


class PolitenessAudit:
    """Gaps between consecutive requests to one host: next start minus previous end (fetched_at + fetch_ms).

    Key: host key -> its last request and gap histogram, for at most ``max_hosts`` hosts (LRU: a host
    fetched again after eviction starts over, its first gap unmeasured and counted in ``unmeasured``).
    A negative gap is an overlap: two requests in flight to one host at once. ``smallest`` keeps the
    ``keep_smallest`` smallest gaps seen (host, gap, at)."""

    def __init__(self, max_hosts: int = 20000, keep_smallest: int = 25):
        self.max_hosts = max_hosts
        self.keep_smallest = keep_smallest
        self.hosts: OrderedDict[str, HostGaps] = OrderedDict()
        self.all_gaps = [0] * len(GAP_EDGES_S)
        self.overlaps = 0
        self.gaps = 0
        self.unmeasured = 0
        self.evicted = 0
        self._smallest: list[tuple[float, float, str]] = []     # max-heap by gap: (-gap, at, host)
        self._rng = random.Random(0)      # reservoir sampling; seeded: one event log, one report

    def add(self, host: str, start: float, duration_s: float) -> None:
        h = self.hosts.get(host)
        if h is None:
            if len(self.hosts) >= self.max_hosts:
                self.hosts.popitem(last=False)
                self.evicted += 1
            h = self.hosts[host] = HostGaps()
            self.unmeasured += 1
        else:
            self.hosts.move_to_end(host)
            gap = start - h.last_end
            self.gaps += 1
            if gap < 0:
                self.overlaps += 1
            self.all_gaps[histogram_bin(GAP_EDGES_S, max(gap, 0.0))] += 1
            h.add_gap(gap, self._rng)
            item = (-gap, start, host)
            if len(self._smallest) < self.keep_smallest:
                heapq.heappush(self._smallest, item)
            elif gap < -self._smallest[0][0]:
                heapq.heapreplace(self._smallest, item)
        h.requests += 1
        end = start + duration_s
        if start >= h.last_start:
            h.last_start, h.last_end = start, max(end, h.last_end)

    def smallest(self) -> list[tuple[str, float, float]]:
        """(host, gap seconds, at) smallest first."""
        return [(host, -g, at) for g, at, host in sorted(self._smallest, reverse=True)]

    def busiest(self, n: int) -> list[tuple[str, HostGaps]]:
        return heapq.nlargest(n, self.hosts.items(), key=lambda kv: kv[1].requests)


class CrawlAggregate:
    """Everything the report shows, filled by :meth:`add` one event at a time (bounded memory)."""

    def __init__(self, *, max_hosts: int = 20000, top_keep: int = 5000):
        self.events = 0
        self.bad_lines = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.kinds: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.robots: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.content_types = TopCounter(200)
        self.domains = TopCounter(top_keep)
        self.pages = 0
        self.bytes = 0
        self.dup_exact = 0
        self.dup_near = 0
        self.unique_200 = 0
        self.fetch_ms = [0] * len(FETCH_EDGES_MS)
        self.time = TimeBuckets()
        self.audit = PolitenessAudit(max_hosts=max_hosts)

    def add_files(self, paths: Iterable[str]) -> None:
        for path in paths:
            try:
                f = open(path, "rb")
            except FileNotFoundError:       # rotated away while a running crawl was read
                continue
            with f:
                for line in f:
                    if not line.endswith(b"\n"):
                        break               # the torn tail of a crashed or running crawl
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        ev = None
                    if isinstance(ev, dict):
                        self.add(ev)
                    else:                   # a damaged line: counted, the rest of the report stands
                        self.bad_lines += 1

    def add(self, ev: dict) -> None:
        self.events += 1
        kind = ev.get("kind", "page")
        self.kinds[kind] += 1
        at = float(ev.get("fetched_at") or 0.0)
        status = int(ev.get("status") or 0)
        outcome = str(ev.get("outcome", ""))
        if kind == "dropped":
            self.dropped[outcome] += 1
            return
        fetch_ms = float(ev.get("fetch_ms") or 0.0)
        url = str(ev.get("url", ""))
        if kind in NETWORK_KINDS and at > 0 and (status or fetch_ms):
            self.audit.add(host_key(url) if "://" in url else url, at, fetch_ms / 1000.0)
            self.fetch_ms[histogram_bin(FETCH_EDGES_MS, fetch_ms)] += 1
        if kind == "robots":
            self.robots[_robots_class(status, outcome)] += 1
        nbytes = int(ev.get("bytes") or (ev.get("warc") or {}).get("length") or 0)
        series: list[tuple[str, float]] = []
        if kind == "page":
            self.outcomes[outcome] += 1
            series.append(("outcome:" + outcome, 1))
            if status:
                self.pages += 1
                self.statuses[status] += 1
                self.bytes += nbytes
                series += (("pages", 1), ("bytes", nbytes), (f"status:{status // 100}xx", 1))
                self.domains.add(registered_domain(host_of(url)) if "://" in url else url)
                if ev.get("content_type"):
                    self.content_types.add(str(ev["content_type"]).split(";")[0].strip().lower())
            if status == 200:
                if ev.get("duplicate_of"):
                    self.dup_exact += 1
                elif ev.get("near_duplicate_of"):
                    self.dup_near += 1
                else:
                    self.unique_200 += 1
        if at > 0:
            series.append(("requests", 1) if (status or fetch_ms) else ("unfetched", 1))
            self.time.add(at, series)
            self.first_at = at if self.first_at is None else min(self.first_at, at)
            self.last_at = at if self.last_at is None else max(self.last_at, at)


def _robots_class(status: int, outcome: str) -> str:
    """What a robots.txt answer meant for its host (RFC 9309 §2.3.1)."""
    if not status:
        return f"unreachable: {outcome} (disallow all)"
    if 200 <= status < 300:
        return "2xx: rules read"
    if 300 <= status < 400:
        return "3xx: redirect followed"
    if 400 <= status < 500:
        return "4xx: none (allow all)" if status not in (429,) else "429: unavailable (disallow all)"
    return "5xx: unavailable (disallow all)"
