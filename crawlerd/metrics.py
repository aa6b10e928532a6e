"""Counters and rates for `crawlerd status` / `crawlerd stats`, and Prometheus exposition.

Counters are plain dicts of named integers (outcomes, HTTP statuses, drop
reasons): cheap to bump on the hot path. Rates come from a ring of one-second
samples of the page counter, so "pages/s over the last 10 s / 60 s" costs
nothing per page. The clock is injected.
"""

from __future__ import annotations

import os
import time
from collections import Counter, deque

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float | None:
    """User+system CPU seconds of a live process (from /proc), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK     # utime, stime (proc(5) fields 14, 15)


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


def prometheus(snapshot: dict, extra: dict | None = None) -> str:
    """Prometheus text exposition of a snapshot (plus flat numeric ``extra`` gauges)."""
    lines = [
        "# TYPE crawlerd_pages_total counter", f"crawlerd_pages_total {snapshot['pages']}",
        "# TYPE crawlerd_bytes_total counter", f"crawlerd_bytes_total {snapshot['bytes']}",
        "# TYPE crawlerd_uptime_seconds gauge", f"crawlerd_uptime_seconds {snapshot['uptime_s']}",
        "# TYPE crawlerd_fetch_outcomes_total counter",
    ]
    lines += [f'crawlerd_fetch_outcomes_total{{outcome="{k}"}} {v}' for k, v in sorted(snapshot["outcomes"].items())]
    lines.append("# TYPE crawlerd_http_status_total counter")
    lines += [f'crawlerd_http_status_total{{status="{k}"}} {v}' for k, v in snapshot["statuses"].items()]
    lines.append("# TYPE crawlerd_dropped_total counter")
    lines += [f'crawlerd_dropped_total{{reason="{k}"}} {v}' for k, v in sorted(snapshot["dropped"].items())]
    for k, v in sorted((extra or {}).items()):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            lines.append(f"crawlerd_{k} {v}")
    return "\n".join(lines) + "\n"
