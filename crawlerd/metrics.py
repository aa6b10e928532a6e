"""Counters and rates for `crawlerd status` / `crawlerd stats`, the event-loop stall gauge, process usage.

Counters are plain dicts of named integers (outcomes, HTTP statuses, drop
reasons): cheap to bump on the hot path. Rates come from a ring of one-second
samples of the page counter, so "pages/s over the last 10 s / 60 s" costs
nothing per page. The clock is injected. The Prometheus text exposition of
these numbers lives in :mod:`crawlerd.exposition`.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from bisect import bisect_left
from collections import Counter, deque

from crawlerd._native.schedstat import read_schedstat
from crawlerd._native.stallclock import DueClock
from crawlerd.sched import background_thread

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
# 15 and 30 ms beside 20: a p99.9 near the 20 ms bound reads as 15 / 20 / 30 ms, not "50 ms"
LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def lag_quantile_s(cumulative: list[int], count: int, q: float,
                   buckets: list[float] | tuple[float, ...] = LAG_BUCKETS_S) -> float | None:
    """Quantile ``q`` of a loop-lag histogram (``LoopLag.snapshot()``'s ``cumulative`` and ``count``,
    or the difference of two snapshots for a time window) as the upper bound of its bucket,
    seconds; inf above the last bound; None without samples. ``buckets``: the snapshot's
    ``buckets_s`` when it may come from another version of crawlerd."""
    if count <= 0:
        return None
    rank = q * count
    for bound, cum in zip(buckets, cumulative, strict=True):
        if cum >= rank:
            return bound
    return float("inf")


# a lag sample above this is split into where its time went (`LoopLag.stalls`): the bound
STALL_SPLIT_S = 0.02


class ThreadTimes:
    """The calling thread's CPU time and the time it waited, runnable, for a CPU (seconds), from
    ``/proc/thread-self/schedstat`` (Linux sched_info: on-CPU ns, run-queue wait ns, slices). Made
    on the thread it measures; the file stays open and one ``pread`` reads both (~1 us), in C
    holding the GIL (``_native/schedstat.pyx``: a read that lets the GIL go makes the loop take it
    back from whichever thread took it). Without the file the CPU time is ``time.thread_time()``
    and the wait is None (unknown)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            self.read()
        except (OSError, ValueError):
            self._fd = None

    def read(self) -> tuple[float, float | None]:
        if self._fd is None:
            return time.thread_time(), None
        cpu_ns, wait_ns = read_schedstat(self._fd)
        return cpu_ns / 1e9, wait_ns / 1e9

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


GC_GENERATIONS = 3


class GcTimes:
    """Time the interpreter spends in its cyclic garbage collector, per generation (``gc.callbacks``;
    a collection holds the GIL, so it stalls the loop whichever thread triggered it).

    Key: generation -> ``[collections, total_s, max_s, passes over STALL_SPLIT_S]``; ``total_s``
    over all. Invariant: ``total_s`` == the sum of the generations' totals; installed at most
    once per instance."""

    def __init__(self) -> None:
        self.gens = [[0, 0.0, 0.0, 0] for _ in range(GC_GENERATIONS)]
        self.total_s = 0.0
        self._t0 = 0.0
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        d = time.perf_counter() - self._t0
        g = self.gens[min(info.get("generation", 0), GC_GENERATIONS - 1)]
        g[0] += 1
        g[1] += d
        if d > g[2]:
            g[2] = d
        if d > STALL_SPLIT_S:
            g[3] += 1
        self.total_s += d

    def snapshot(self) -> dict:
        return {f"gen{i}": {"collections": n, "total_s": round(t, 6), "max_s": round(m, 6), "over_stall": o}
                for i, (n, t, m, o) in enumerate(self.gens)}


class LoopLag:
    """How late a periodic callback runs on an event loop: the loop's stalls, as a histogram.

    Every ``interval_s`` a timer fires; its lag is how long after its due time it ran
    (a callback that blocked the loop, a long GC pass, a slow synchronous write, or the process
    not scheduled: on a box with more runnable threads than cores the loop waits for a CPU).
    Key: ``counts[i]`` = samples with lag <= ``LAG_BUCKETS_S[i]`` and above the bound
    before it, the last slot for lags above every bound. ``own_counts`` is the same histogram of
    each lag less the time the loop thread waited, runnable, for a CPU in that sample's window
    (``ThreadTimes``): the lateness the process itself caused (its callbacks, GC, blocking calls,
    the GIL held by its other threads). Samples above ``STALL_SPLIT_S`` add their lag, the loop
    thread's CPU, its run-queue wait and the GC time of their window to ``stalls``.
    Invariants: ``sum(counts) == sum(own_counts) == count``; ``sum_s`` is the total lag; while
    started exactly one timer is armed.
    """

    def __init__(self, interval_s: float = 0.1, recent_s: int = 10, watch_s: float | None = None):
        self.interval_s = interval_s
        self.due = DueClock()       # the timer's due time on time.monotonic()'s clock, for the watch thread
        # a thread that names where the loop is when a stall passes watch_s (None: no thread)
        self.watch = StallWatch(self, watch_s) if watch_s else None
        self.counts = [0] * (len(LAG_BUCKETS_S) + 1)
        self.own_counts = [0] * (len(LAG_BUCKETS_S) + 1)
        self.count = 0
        self.sum_s = 0.0
        self.max_s = 0.0
        self.own_max_s = 0.0
        self.own_sum_s = 0.0
        # samples above STALL_SPLIT_S: count and summed lag, loop-thread CPU, run-queue wait, GC time
        self.stalls = {"count": 0, "lag_s": 0.0, "cpu_s": 0.0, "runq_s": 0.0, "gc_s": 0.0}
        self.gc = GcTimes()
        self._recent: deque[tuple[int, float]] = deque(maxlen=recent_s)   # (second, worst lag in it)
        self._loop = None
        self._timer = None
        self._due = 0.0
        self._times: ThreadTimes | None = None
        self._last = (0.0, None, 0.0)       # thread CPU, run-queue wait, GC total at the last firing

    def start(self, loop) -> None:
        """Start sampling ``loop``; called on the loop's own thread (``ThreadTimes`` measures the caller)."""
        self._loop = loop
        self._times = ThreadTimes()
        self.gc.install()
        self._last = (*self._times.read(), self.gc.total_s)
        self._arm()
        if self.watch is not None:
            self.watch.start()

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.gc.uninstall()
        if self._times is not None:
            self._times.close()

    def _arm(self) -> None:
        self._due = self._loop.time() + self.interval_s
        self.due.due = time.monotonic() + self.interval_s     # the same due time, for the watch thread
        self._timer = self._loop.call_at(self._due, self._fire)

    def _fire(self) -> None:
        lag = max(0.0, self._loop.time() - self._due)
        cpu, runq = self._times.read()
        gc_s = self.gc.total_s
        cpu0, runq0, gc0 = self._last
        self._last = (cpu, runq, gc_s)
        waited = runq - runq0 if runq is not None and runq0 is not None else 0.0
        self.record(lag, own_s=max(0.0, lag - waited))
        if lag > STALL_SPLIT_S:
            st = self.stalls
            st["count"] += 1
            st["lag_s"] += lag
            st["cpu_s"] += cpu - cpu0
            st["runq_s"] += waited
            st["gc_s"] += gc_s - gc0
            if self.watch is not None:
                self.watch.settle(self.due.due, waited, gc_s - gc0)
        self._arm()

    def record(self, lag_s: float, own_s: float | None = None) -> None:
        """One sample: ``lag_s`` late, ``own_s`` of it not spent waiting for a CPU (default: all)."""
        own_s = lag_s if own_s is None else own_s
        self.counts[bisect_left(LAG_BUCKETS_S, lag_s)] += 1     # first bound >= lag (Prometheus `le`)
        self.own_counts[bisect_left(LAG_BUCKETS_S, own_s)] += 1
        self.count += 1
        self.sum_s += lag_s
        self.own_sum_s += own_s
        if lag_s > self.max_s:
            self.max_s = lag_s
        if own_s > self.own_max_s:
            self.own_max_s = own_s
        sec = int(time.monotonic())
        if self._recent and self._recent[-1][0] == sec:
            if lag_s > self._recent[-1][1]:
                self._recent[-1] = (sec, lag_s)
        else:
            self._recent.append((sec, lag_s))

    def snapshot(self) -> dict:
        """Cumulative bucket counts (Prometheus histogram shape) of the lag and of the loop's own
        lag, the worst lag lately and ever, the split of stalls above ``STALL_SPLIT_S``, GC times."""
        horizon = int(time.monotonic()) - self._recent.maxlen
        recent = max((v for s, v in self._recent if s > horizon), default=0.0)
        out = {"buckets_s": list(LAG_BUCKETS_S), "cumulative": _cumulative(self.counts), "count": self.count,
               "sum_s": round(self.sum_s, 6), "max_s": round(self.max_s, 6), "recent_max_s": round(recent, 6),
               "own_cumulative": _cumulative(self.own_counts), "own_max_s": round(self.own_max_s, 6),
               "own_sum_s": round(self.own_sum_s, 6),
               "stalls": {"over_s": STALL_SPLIT_S} | {k: round(v, 6) for k, v in self.stalls.items()},
               "gc": self.gc.snapshot()}
        if self.watch is not None:
            out["stall_sites"] = self.watch.sites()
        return out


def _cumulative(counts: list[int]) -> list[int]:
    cum, total = [], 0
    for c in counts[:-1]:
        total += c
        cum.append(total)
    return cum


STALL_SITES = 32            # distinct places kept (the most frequent)
STALL_FRAMES = 4            # innermost crawlerd frames that name a place


class StallWatch:
    """Where the event loop was when it stalled: a daemon thread looks every ``threshold_s / 2``
    whether the loop's lag timer is overdue by more than ``threshold_s`` and, once per stall,
    records the loop thread's innermost crawlerd frames (``sys._current_frames``).

    Key: ``counts[place]`` = stalls seen there, ``worst_s[place]`` = the longest overdue time
    observed there (a lower bound of the stall), ``split[place]`` = ``[run-queue wait, GC time]``
    summed over those stalls (``settle``, from the loop once the stall ended): a place whose
    stalls were mostly waiting for a CPU or a collection is where the loop happened to be, not
    what held it. Invariant: at most ``STALL_SITES`` places, the least frequent dropped first.
    The thread looks every ``threshold_s / 2`` with the GIL released (``LoopLag.due``, a
    :class:`~crawlerd._native.stallclock.DueClock`) and takes the GIL only when the loop is late,
    to read where it is: looking costs the loop nothing (a collection holds the GIL, so the place
    seen is where it was triggered)."""

    def __init__(self, lag: LoopLag, threshold_s: float):
        self.lag = lag
        self.threshold_s = threshold_s
        self.counts: Counter[str] = Counter()
        self.worst_s: dict[str, float] = {}
        self.split: dict[str, list[float]] = {}
        self._placed: tuple[float, str] | None = None     # (due time, place) of the last stall seen
        self._thread: threading.Thread | None = None
        self._loop_thread = 0

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self.lag.due.reset()
        self._thread = background_thread(self._watch, "stall-watch")
        self._thread.start()

    def stop(self) -> None:
        self.lag.due.stop()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def _watch(self) -> None:
        seen_due = None
        wait = self.lag.due.wait_overdue
        while (overdue := wait(self.threshold_s, self.threshold_s / 2)) is not None:
            due, late = overdue
            frame = sys._current_frames().get(self._loop_thread)     # noqa: SLF001 (documented in sys)
            place = where(frame) if frame is not None else "?"
            if due != seen_due:
                seen_due = due
                self._placed = (due, place)
                self.counts[place] += 1
                if len(self.counts) > STALL_SITES:
                    gone = min(self.counts, key=self.counts.__getitem__)
                    del self.counts[gone]
                    self.split.pop(gone, None)
            if late > self.worst_s.get(place, 0.0):
                self.worst_s[place] = late

    def settle(self, due: float, runq_s: float, gc_s: float) -> None:
        """The stall due at ``due`` ended: it waited ``runq_s`` for a CPU and spent ``gc_s`` collecting."""
        placed = self._placed
        if placed is not None and placed[0] == due and placed[1] in self.counts:
            sp = self.split.setdefault(placed[1], [0.0, 0.0])
            sp[0] += runq_s
            sp[1] += gc_s

    def sites(self) -> list[dict]:
        """The places, most frequent first: ``{"where", "stalls", "worst_s", "runq_s", "gc_s"}``."""
        out = []
        for k, n in self.counts.most_common():
            rq, g = self.split.get(k, (0.0, 0.0))
            out.append({"where": k, "stalls": n, "worst_s": round(self.worst_s.get(k, 0.0), 3),
                        "runq_s": round(rq, 3), "gc_s": round(g, 3)})
        return out


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

