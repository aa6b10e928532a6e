"""The family's view: one ``status``/``stats`` dict made of every shard's own.

A shard process answers ``status`` and ``stats`` in the shape a one-shard daemon does. The
family adds them up: numbers are summed (counts, rates, bytes, caps, queue lengths, CPU seconds),
tables are summed key by key, lists are joined; a few fields are the family's own (state, pid,
uptime) or merged by their meaning (top hosts, recent errors, per-process CPU). A number that is
a maximum of its own (``MAXIMA``: a high-water mark, a longest stall or wait) is the largest of
the shards'; a setting every shard states alike (``SETTINGS``) is stated once, not multiplied;
``next_due_at`` is the earliest. Each shard's own figures stay under ``shards``. Counters of a
shard's earlier lives (before a restart) are kept in a ``Retired`` total, so the family's
counters only grow.
"""

from __future__ import annotations

from collections import Counter

# fields that are not additive: the family states them itself
OWN = frozenset({"state", "pid", "data_dir", "uptime_s", "shard", "shards", "metrics_url"})
# the counters that survive a shard's restart in the family's totals (each only grows)
LIFETIME = ("pages", "bytes", "outcomes", "statuses", "dropped", "counters", "errors")
# leaves (by name, at any depth) that are a maximum over time of one shard: the family's is the
# largest; the latest event's duration (last_*_s) and a reader's position in its queues likewise
MAXIMA = frozenset({"high_water_bytes", "peak_bytes", "largest_step_bytes", "max_s", "own_max_s", "recent_max_s",
                    "lag_max_s", "max_job_s", "max_merge_s", "max_write_ms", "trim_ms_max", "oldest_waiting_s",
                    "last_merge_s", "last_flush_s", "lag_last_s", "reader_queue", "window_end"})
# leaves (by path) that are the same setting in every shard: the first shard's
SETTINGS = frozenset({"budgets.base_budget", "budgets.per_inlink", "budgets.max_budget", "budgets.max_spread",
                      "budgets.queues", "budgets.window", "budgets.graph.vouch_ratio", "budgets.graph.max_age_s",
                      "malloc.trim_interval_s"})
MINIMA = frozenset({"next_due_at"})         # a time the first shard reaches (None: none due)


def merge(views: list[dict]) -> dict:
    """Sum numbers, merge tables, join lists; the first value of anything else wins."""
    out: dict = {}
    for v in views:
        for k, x in v.items():
            if k in OWN:
                continue
            if k not in out:
                out[k] = _copy(x)
            else:
                out[k] = _add(out[k], x, k)
    return out


def _copy(x):
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return list(x)
    return x


def _add(a, b, path: str = ""):
    """``a`` and ``b`` combined as what ``path`` (dotted keys from the view's top) names."""
    leaf = path.rpartition(".")[2]
    if leaf in MINIMA:
        return b if a is None or (b is not None and b < a) else a
    if isinstance(a, bool) or isinstance(b, bool):
        return a or b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if path in SETTINGS:
            return a
        return max(a, b) if leaf in MAXIMA else a + b
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _add(out[k], v, f"{path}.{k}" if path else k) if k in out else _copy(v)
        return out
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    return a


class Retired:
    """Lifetime counters of shard processes that ended (a restart starts a new process's count)."""

    def __init__(self) -> None:
        self.total: dict = {}

    def add(self, view: dict) -> None:
        part = {k: view[k] for k in LIFETIME if k in view}
        self.total = merge([self.total, part]) if self.total else _copy(part)

    def apply(self, merged: dict) -> dict:
        if self.total:
            for k, v in self.total.items():
                merged[k] = _add(merged[k], v, k) if k in merged else _copy(v)
        return merged


def top_hosts(views: list[dict], n: int = 20) -> list[list]:
    c: Counter = Counter()
    for v in views:
        for host, count in v.get("top_hosts", []):
            c[host] += count
    return [[h, k] for h, k in c.most_common(n)]


def family_view(views: list[dict | None], *, kind: str, state: str, pid: int, data_dir: str, uptime_s: float,
                summaries: list[dict], retired: Retired, own_cpu_s: float) -> dict:
    """``status`` or ``stats`` (``kind``) of the family from its shards' answers (None: no answer)."""
    live = [v for v in views if v]
    merged = retired.apply(merge(live))
    merged.update(state=state, pid=pid, data_dir=data_dir, uptime_s=round(uptime_s, 3), shard=None,
                  shards=summaries)
    for key in ("pages_per_s_10s", "pages_per_s_60s"):
        merged[key] = round(merged.get(key, 0.0), 2)
    if kind == "stats":
        # each shard's whole view (the operator's per-shard series), with the family's line on it
        full = [(v.get("shards") or [{}])[0] if v else {} for v in views]
        merged["shards"] = [{**f, **s} for f, s in zip(full, summaries, strict=False)]
        merged["top_hosts"] = top_hosts(live)
        merged["recent_errors"] = merged.get("recent_errors", [])[-10:]
        cpu = {"crawl": round(own_cpu_s, 3)}
        for v in live:
            for name, secs in v.get("cpu_by_process_s", {}).items():
                cpu[f"shard-{v.get('shard')}" if name == "crawl" else name] = secs
        merged["cpu_by_process_s"] = cpu
        merged["cpu_s"] = round(sum(cpu.values()), 3)
    return merged
