"""Prometheus exposition of the daemon's stats: one function from the `stats` dict to metric families.

The same families serve the metrics endpoint (``metrics.listen``) and
``crawlerd stats --prometheus``, so a textfile collector and a scrape see the
same names. Rendering is prometheus_client's (text format, or OpenMetrics when
the scraper asks for it). Names follow the Prometheus conventions: base units
(seconds, bytes), ``_total`` for counters; per-shard series carry a ``shard``
label, per-process series ``role``/``pid``/``shard``. Host names are never
labels (unbounded cardinality); `crawlerd top` shows them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, generate_latest

from crawlerd import __version__

STATES = ("starting", "running", "paused", "stopping", "stopped")


class _Families:
    """The families of one stats snapshot, for prometheus_client's encoders (a registry-like collector)."""

    def __init__(self, stats: dict):
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        return iter(families(self.stats))


def render(stats: dict, accept: str = "") -> tuple[bytes, str]:
    """(body, content type) for a scrape; ``accept`` is the scraper's Accept header."""
    encoder, content_type = choose_encoder(accept)
    return encoder(_Families(stats)), content_type


def render_text(stats: dict) -> str:
    """The text exposition (for ``crawlerd stats --prometheus`` and a node-exporter textfile)."""
    return generate_latest(_Families(stats)).decode()


def _counter(name: str, doc: str, value: float | None = None, labels: Iterable[str] | None = None):
    return CounterMetricFamily(name, doc, value=value, labels=list(labels) if labels else None)


def _gauge(name: str, doc: str, value: float | None = None, labels: Iterable[str] | None = None):
    return GaugeMetricFamily(name, doc, value=value, labels=list(labels) if labels else None)


def _labelled(fam, items: Iterable[tuple[Iterable[str], float]]):
    for labels, v in items:
        fam.add_metric([str(x) for x in labels], float(v))
    return fam


def _num(d: dict, key: str) -> float:
    v = d.get(key, 0)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def families(s: dict) -> list[Metric]:
    """Every metric family of a `stats` snapshot (see :meth:`crawlerd.supervisor.Supervisor.stats`)."""
    shards = s.get("shards", [])
    out: list[Metric] = [
        _labelled(_gauge("crawlerd_build_info", "Version of the running crawlerd (always 1).", labels=["version"]),
                  [((__version__,), 1)]),
        _labelled(_gauge("crawlerd_state", "1 for the daemon's current state, 0 for the others.", labels=["state"]),
                  [((st,), 1 if s.get("state") == st else 0) for st in STATES]),
        _gauge("crawlerd_uptime_seconds", "Seconds since the daemon started.", _num(s, "uptime_s")),
        _counter("crawlerd_pages_total", "Responses received and kept, any HTTP status.", _num(s, "pages")),
        _counter("crawlerd_bytes_total", "Raw response body bytes received.", _num(s, "bytes")),
        _labelled(_counter("crawlerd_requests_total",
                           "HTTP requests the fetcher finished (pages, robots.txt, sitemaps), by shard.",
                           labels=["shard"]),
                  [((sh["shard"],), sum(sh.get("fetcher", {}).get("outcomes", {}).values())) for sh in shards]),
        _labelled(_counter("crawlerd_fetch_outcomes_total", "URLs finished, by outcome (ok, timeout, ...).",
                           labels=["outcome"]), sorted(((k,), v) for k, v in s.get("outcomes", {}).items())),
        _labelled(_counter("crawlerd_http_status_total", "Responses by HTTP status code.", labels=["status"]),
                  sorted(((k,), v) for k, v in s.get("statuses", {}).items())),
        _labelled(_counter("crawlerd_dropped_total", "URLs not queued or removed from the frontier, by reason.",
                           labels=["reason"]), sorted(((k,), v) for k, v in s.get("dropped", {}).items())),
        _labelled(_counter("crawlerd_crawl_events_total",
                           "Other crawl events (robots refetches, DNS outcomes, duplicates, budget deferrals...).",
                           labels=["event"]), sorted(((k,), v) for k, v in s.get("counters", {}).items())),
        _counter("crawlerd_worker_restarts_total", "Processing workers replaced after dying.",
                 _num(s, "worker_restarts")),
    ]
    out += _shard_families(shards)
    out += _budget_families(s.get("budgets") or {})
    rc = s.get("recrawl") or {}
    if rc.get("enabled"):
        out.append(_gauge("crawlerd_recrawl_tracked_urls", "URLs with a revisit schedule.", _num(rc, "tracked")))
    out += _process_families(s.get("processes", []))
    return out


def _at(d: dict, path: tuple[str, ...]) -> float:
    """The number at ``d[path[0]][path[1]]...`` (0 when missing)."""
    for key in path[:-1]:
        d = d.get(key) or {}
    return _num(d, path[-1])


# per-shard series: (name, help, path into the shard's dict, family kind)
_SHARD_SERIES = (
    ("crawlerd_in_flight", "Fetches in flight.", ("in_flight",), _gauge),
    ("crawlerd_queued_urls", "URLs queued in the frontier.", ("queued",), _gauge),
    ("crawlerd_hosts_active", "Hosts with queued URLs or leases (politeness state in RAM).", ("hosts_active",),
     _gauge),
    ("crawlerd_frontier_hosts_known", "Hosts with a record in the frontier store.", ("frontier", "hosts_total"),
     _gauge),
    ("crawlerd_frontier_working_set_hosts", "Hosts the frontier leases from now (its working set).",
     ("frontier", "working_set_hosts"), _gauge),
    ("crawlerd_frontier_sessions_total", "Working-set sessions started (a host joining the set).",
     ("frontier", "sessions_started"), _counter),
    ("crawlerd_frontier_ips_active", "IP addresses with politeness state in RAM.", ("frontier", "ips_active"),
     _gauge),
    ("crawlerd_frontier_dead_letter_total", "URLs given up after frontier.max_attempts.",
     ("frontier", "dead_letter"), _counter),
    ("crawlerd_seen_pending_keys", "URL fingerprints submitted to DRUM and not answered yet.",
     ("seen", "pending"), _gauge),
    ("crawlerd_seen_backpressure", "1 while DRUM's intake is full and leasing waits.", ("seen", "backpressure"),
     _gauge),
    ("crawlerd_seen_last_merge_seconds", "Duration of DRUM's last merge.", ("seen", "last_flush_s"), _gauge),
    ("crawlerd_seen_busy_seconds_total", "Seconds the DRUM thread spent working.", ("seen", "busy_s"), _counter),
    ("crawlerd_seen_jobs_total", "Batches the DRUM thread ran.", ("seen", "jobs"), _counter),
    ("crawlerd_seen_disk_bytes", "Bytes of DRUM's files on disk.", ("seen", "disk_bytes"), _gauge),
    ("crawlerd_dedup_digests", "Payload digests stored (first captures: the exact-duplicate index).",
     ("dedup", "digests"), _gauge),
    ("crawlerd_dedup_simhashes", "Simhashes stored (the near-duplicate index).", ("dedup", "near", "stored"),
     _gauge),
    ("crawlerd_dedup_near_duplicates_total", "Pages found near-duplicates of an earlier page.",
     ("dedup", "near", "near_duplicates"), _counter),
)

_HOST_STATES = (("ready", "hosts_ready"), ("waiting", "hosts_waiting"), ("dns", "hosts_dns"),
                ("ip_wait", "hosts_ip_wait"), ("parked", "parked"))


def _shard_families(shards: list[dict]) -> list[Metric]:
    out: list[Metric] = [
        _labelled(kind(name, doc, labels=["shard"]), [((sh["shard"],), _at(sh, path)) for sh in shards])
        for name, doc, path, kind in _SHARD_SERIES]
    hosts = _gauge("crawlerd_frontier_hosts", "Active hosts by scheduling state.", labels=["shard", "state"])
    lag = HistogramMetricFamily("crawlerd_loop_lag_seconds",
                                "How late a 100 ms timer fires on the shard's event loop (loop stalls).",
                                labels=["shard"])
    own = HistogramMetricFamily("crawlerd_loop_own_lag_seconds",
                                "The loop lag less the time the loop thread waited, runnable, for a CPU "
                                "(the stalls the process caused itself).", labels=["shard"])
    for sh in shards:
        for state, key in _HOST_STATES:
            hosts.add_metric([sh["shard"], state], _at(sh, ("frontier", key)))
        ll = sh.get("loop_lag") or {}
        buckets = [(repr(float(b)), float(c)) for b, c in zip(ll.get("buckets_s", []), ll.get("cumulative", []),
                                                                strict=True)]
        buckets.append(("+Inf", float(ll.get("count", 0))))
        lag.add_metric([sh["shard"]], buckets, float(ll.get("sum_s", 0.0)))
        if "own_cumulative" in ll:
            buckets = [(repr(float(b)), float(c)) for b, c in zip(ll["buckets_s"], ll["own_cumulative"], strict=True)]
            buckets.append(("+Inf", float(ll.get("count", 0))))
            own.add_metric([sh["shard"]], buckets, float(ll.get("own_sum_s", 0.0)))
    return [*out, hosts, lag, own]


def _budget_families(b: dict) -> list[Metric]:
    if not b:
        return []
    return [
        _counter("crawlerd_budget_admitted_total", "URLs admitted within their domain's budget (STAR).",
                 _num(b, "admitted")),
        _counter("crawlerd_budget_deferred_total", "URLs deferred for over-budget domains (BEAST).",
                 _num(b, "deferred_total")),
        _counter("crawlerd_budget_readmitted_total", "Deferred URLs moved back to the frontier.",
                 _num(b, "readmitted")),
        _gauge("crawlerd_budget_deferred_urls", "URLs deferred now.", _num(b, "deferred_now")),
        _gauge("crawlerd_budget_domains_backlogged", "Registered domains with deferred URLs.",
               _num(b, "domains_backlogged")),
    ]


def _process_families(procs: list[dict]) -> list[Metric]:
    L = ["role", "pid", "shard"]
    cpu = _counter("crawlerd_process_cpu_seconds_total", "User+system CPU seconds per process.", labels=L)
    rss = _gauge("crawlerd_process_resident_memory_bytes", "Resident set size per process.", labels=L)
    for p in procs:
        labels = [p["role"], str(p["pid"]), p.get("shard", "")]
        cpu.add_metric(labels, float(p.get("cpu_s") or 0.0))
        if p.get("rss_bytes") is not None:
            rss.add_metric(labels, float(p["rss_bytes"]))
    return [cpu, rss]
