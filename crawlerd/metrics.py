"""Counters and rates for `crawlerd status` / `crawlerd stats`, the event-loop stall gauge, process usage.

Counters are plain dicts of named integers (outcomes, HTTP statuses, drop
reasons): cheap to bump on the hot path. Rates come from a ring of one-second
samples of the page counter, so "pages/s over the last 10 s / 60 s" costs
nothing per page. The clock is injected. The Prometheus text exposition of
these numbers lives in :mod:`crawlerd.exposition`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from bisect import bisect_left
from collections import Counter, deque

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_cpu_s(pid: int) -> float | None:
    """User+system CPU seconds of a live process (from /proc), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK     # utime, stime (proc(5) fields 14, 15)


def proc_rss_bytes(pid: int) -> int | None:
    """Resident set size of a live process in bytes (from /proc/PID/statm), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def proc_status_bytes(pid: int, names: tuple[str, ...]) -> dict[str, int] | None:
    """The kB fields ``names`` of /proc/<pid>/status (proc(5)), in bytes; None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in names:
            out[name] = int(rest.split()[0]) * 1024      # the kernel reports kB
    return out


def proc_rss_kinds(pid: int) -> dict[str, int] | None:
    """Resident memory of a live process by kind, bytes: anonymous (private heap: what grows if
    something leaks), file-backed (mapped files: LMDB, index runs, libraries; the kernel can drop
    these) and shared memory; None if it is gone (/proc/<pid>/status, proc(5))."""
    out = proc_status_bytes(pid, ("RssAnon", "RssFile", "RssShmem"))
    if out is None:
        return None
    return {"anon": out.get("RssAnon", 0), "file": out.get("RssFile", 0), "shmem": out.get("RssShmem", 0)}


def process_usage(role: str, pid: int, shard: str = "", cpu_s: float | None = None) -> dict:
    """One process's line for the operator's view: role, pid, CPU seconds, RSS and RSS by kind
    (anonymous / file-backed / shared, bytes; None when gone)."""
    kinds = proc_rss_kinds(pid) or {}
    return {"role": role, "pid": pid, "shard": shard,
            "cpu_s": round(proc_cpu_s(pid) if cpu_s is None else cpu_s, 3),
            "rss_bytes": proc_rss_bytes(pid), "rss_anon_bytes": kinds.get("anon"),
            "rss_file_bytes": kinds.get("file"), "rss_shmem_bytes": kinds.get("shmem")}


# upper bounds of the loop-lag histogram, seconds (Prometheus `le` labels; +Inf is implied)
LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def lag_quantile_s(cumulative: list[int], count: int, q: float) -> float | None:
    """Quantile ``q`` of a loop-lag histogram (``LoopLag.snapshot()``'s ``cumulative`` and ``count``,
    or the difference of two snapshots for a time window) as the upper bound of its bucket,
    seconds; inf above the last bound; None without samples."""
    if count <= 0:
        return None
    rank = q * count
    for bound, cum in zip(LAG_BUCKETS_S, cumulative, strict=True):
        if cum >= rank:
            return bound
    return float("inf")


class LoopLag:
    """How late a periodic callback runs on an event loop: the loop's stalls, as a histogram.

    Every ``interval_s`` a timer fires; its lag is how long after its due time it ran
    (a callback that blocked the loop, a long GC pass, a slow synchronous write).
    Key: ``counts[i]`` = samples with lag <= ``LAG_BUCKETS_S[i]`` and above the bound
    before it, the last slot for lags above every bound. Invariants: ``sum(counts) ==
    count``; ``sum_s`` is the total lag; while started exactly one timer is armed.
    """

    def __init__(self, interval_s: float = 0.1, recent_s: int = 10, watch_s: float | None = None):
        self.interval_s = interval_s
        # a thread that names where the loop is when a stall passes watch_s (None: no thread)
        self.watch = StallWatch(self, watch_s) if watch_s else None
        self.counts = [0] * (len(LAG_BUCKETS_S) + 1)
        self.count = 0
        self.sum_s = 0.0
        self.max_s = 0.0
        self._recent: deque[tuple[int, float]] = deque(maxlen=recent_s)   # (second, worst lag in it)
        self._loop = None
        self._timer = None
        self._due = 0.0

    def start(self, loop) -> None:
        self._loop = loop
        self._arm()
        if self.watch is not None:
            self.watch.start()

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self._due = self._loop.time() + self.interval_s
        self.due_mono = time.monotonic() + self.interval_s     # the same due time, for the watch thread
        self._timer = self._loop.call_at(self._due, self._fire)

    def _fire(self) -> None:
        self.record(max(0.0, self._loop.time() - self._due))
        self._arm()

    def record(self, lag_s: float) -> None:
        self.counts[bisect_left(LAG_BUCKETS_S, lag_s)] += 1     # first bound >= lag (Prometheus `le`)
        self.count += 1
        self.sum_s += lag_s
        if lag_s > self.max_s:
            self.max_s = lag_s
        sec = int(time.monotonic())
        if self._recent and self._recent[-1][0] == sec:
            if lag_s > self._recent[-1][1]:
                self._recent[-1] = (sec, lag_s)
        else:
            self._recent.append((sec, lag_s))

    def snapshot(self) -> dict:
        """Cumulative bucket counts (Prometheus histogram shape) plus the worst lag lately and ever."""
        cum, total = [], 0
        for c in self.counts[:-1]:
            total += c
            cum.append(total)
        horizon = int(time.monotonic()) - self._recent.maxlen
        recent = max((v for s, v in self._recent if s > horizon), default=0.0)
        out = {"buckets_s": list(LAG_BUCKETS_S), "cumulative": cum, "count": self.count,
               "sum_s": round(self.sum_s, 6), "max_s": round(self.max_s, 6), "recent_max_s": round(recent, 6)}
        if self.watch is not None:
            out["stall_sites"] = self.watch.sites()
        return out


STALL_SITES = 32            # distinct places kept (the most frequent)
STALL_FRAMES = 4            # innermost crawlerd frames that name a place


class StallWatch:
    """Where the event loop was when it stalled: a daemon thread looks every ``threshold_s / 2``
    whether the loop's lag timer is overdue by more than ``threshold_s`` and, once per stall,
    records the loop thread's innermost crawlerd frames (``sys._current_frames``).

    Key: ``counts[place]`` = stalls seen there, ``worst_s[place]`` = the longest overdue time
    observed there (a lower bound of the stall). Invariant: at most ``STALL_SITES`` places, the
    least frequent dropped first. Costs the loop nothing; the thread wakes ``2 / threshold_s``
    times a second and takes the GIL only to look."""

    def __init__(self, lag: LoopLag, threshold_s: float):
        self.lag = lag
        self.threshold_s = threshold_s
        self.counts: Counter[str] = Counter()
        self.worst_s: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop_thread = 0

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def _watch(self) -> None:
        seen_due = None
        while not self._stop.wait(self.threshold_s / 2):
            due = getattr(self.lag, "due_mono", None)
            if due is None:
                continue
            late = time.monotonic() - due
            if late < self.threshold_s:
                continue
            frame = sys._current_frames().get(self._loop_thread)     # noqa: SLF001 (documented in sys)
            place = where(frame) if frame is not None else "?"
            if due != seen_due:
                seen_due = due
                self.counts[place] += 1
                if len(self.counts) > STALL_SITES:
                    del self.counts[min(self.counts, key=self.counts.__getitem__)]
            if late > self.worst_s.get(place, 0.0):
                self.worst_s[place] = late

    def sites(self) -> list[dict]:
        """The places, most frequent first: ``{"where", "stalls", "worst_s"}``."""
        return [{"where": k, "stalls": n, "worst_s": round(self.worst_s.get(k, 0.0), 3)}
                for k, n in self.counts.most_common()]


def where(frame) -> str:
    """The innermost ``STALL_FRAMES`` frames of crawlerd code under ``frame`` (innermost first),
    plus the innermost frame of any code when it is not crawlerd's (a library call)."""
    parts, inner = [], None
    while frame is not None and len(parts) < STALL_FRAMES:
        code = frame.f_code
        if inner is None:
            inner = f"{os.path.basename(code.co_filename)}:{code.co_name}"
        if "crawlerd" in code.co_filename:
            parts.append(f"{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    if inner and (not parts or not inner.endswith(parts[0].split(":")[0])):
        parts.insert(0, inner)
    return " < ".join(parts)


class Metrics:
    """Key: counter name -> int. Invariant: counters only grow (a restart starts a new process's view)."""

    RING_S = 61

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self.started = clock()
        self.pages = 0                     # responses received and kept (any HTTP status)
        self.bytes = 0                     # raw body bytes received
        self.outcomes: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.dropped: Counter[str] = Counter()    # URLs not queued or removed, by reason
        self.hosts: Counter[str] = Counter()      # pages per host (top hosts); bounded by trim_hosts()
        self.counters: Counter[str] = Counter()   # anything else (robots fetches, dns, dedup, ...)
        self._ring: deque[tuple[float, int]] = deque(maxlen=self.RING_S)
        self._ring.append((self.started, 0))

    # hot path ------------------------------------------------------------
    def fetched(self, host_key: str, outcome: str, status: int, nbytes: int) -> None:
        self.outcomes[outcome] += 1
        if status:
            self.statuses[status] += 1
            self.pages += 1
            self.hosts[host_key] += 1
        self.bytes += nbytes

    def tick(self) -> None:
        """Record a rate sample; call about once a second."""
        now = self._clock()
        if not self._ring or now - self._ring[-1][0] >= 0.5:
            self._ring.append((now, self.pages))

    # reading ---------------------------------------------------------------
    def rate(self, window_s: float) -> float:
        """Pages/s over the last ``window_s`` seconds (or since start if younger)."""
        now = self._clock()
        ref_t, ref_p = self._ring[0]
        for t, p in self._ring:
            if now - t <= window_s:
                ref_t, ref_p = t, p
                break
        dt = now - ref_t
        return (self.pages - ref_p) / dt if dt > 0 else 0.0

    def uptime(self) -> float:
        return self._clock() - self.started

    def trim_hosts(self, keep: int = 1000) -> None:
        if len(self.hosts) > 2 * keep:
            self.hosts = Counter(dict(self.hosts.most_common(keep)))

    def snapshot(self, top: int = 10) -> dict:
        return {
            "uptime_s": round(self.uptime(), 3),
            "pages": self.pages,
            "bytes": self.bytes,
            "pages_per_s_10s": round(self.rate(10), 2),
            "pages_per_s_60s": round(self.rate(60), 2),
            "outcomes": dict(self.outcomes),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "dropped": dict(self.dropped),
            "counters": dict(self.counters),
            "top_hosts": self.hosts.most_common(top),
        }

