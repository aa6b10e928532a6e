"""A shard's numbers for the operator's view: `crawlerd top`, the Prometheus endpoint, `crawlerd stats`.

Everything here is read on the shard's loop from the components' public
accessors, so it needs no locks; it costs one pass over the active hosts
(for the most backed-off ones), like the frontier's own stats.
"""

from __future__ import annotations

import os

from crawlerd.metrics import process_usage


def dir_bytes(path: str) -> int:
    """Bytes in the regular files directly under ``path`` (0 if it is missing)."""
    total = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
    except OSError:
        return 0
    return total


def operator_view(shard, *, shard_id: str = "0", closed: bool = False, detail: bool = True) -> dict:
    """The shard's extra status: loop lag, backed-off hosts, DRUM/dedup/fetcher gauges, processes.

    ``closed``: the stores were closed at shutdown; only numbers that outlive them are read.
    ``detail`` False: the cheap part only (the once-a-second status tick needs no host scan)."""
    m = shard.metrics
    head = {"shard": shard_id, "pid": os.getpid(), "pages": m.pages, "bytes": m.bytes,
            "pages_per_s_10s": round(m.rate(10), 2), "loop_lag": shard.loop_lag.snapshot()}
    if not detail:
        return head
    worker_cpu = shard.pool.cpu_s()
    live = set(shard.pool.pids())
    procs = [process_usage("shard", os.getpid(), shard_id)]
    procs += [process_usage("worker", pid, shard_id, cpu_s=cpu) for pid, cpu in sorted(worker_cpu.items())
              if pid in live]
    seen = shard.seen.stats()
    seen["disk_bytes"] = dir_bytes(os.path.join(shard.state_dir, "drum"))
    dedup = {"near": shard.near.stats()}
    if not closed:
        dedup["digests"] = len(shard.digests)
    # the writer-thread stores' writes not landed yet, each overlay alone (bytes now, the most of the
    # last 2-4 s; their bounds: memory.budget_unlanded, frontier_unlanded with recrawl's, dust_unlanded)
    unlanded = {}
    if not closed:
        unlanded["recrawl"] = shard.recrawl.unlanded()
        unlanded["frontier"] = shard.frontier.overlay.memory() if shard.frontier.overlay is not None else {}
        if shard.dust is not None:
            unlanded["dust"] = shard.dust.learner.store.unlanded()
    return {
        **head,
        "unlanded": unlanded,
        "hosts_backed_off": [] if closed else shard.frontier.backed_off(shard.clock(), 10),
        "seen": seen,
        "dedup": dedup,
        "fetcher": shard.fetcher.stats() if shard.fetcher is not None else {},
        "processes": procs,
    }
