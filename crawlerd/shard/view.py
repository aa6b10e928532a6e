"""A shard's numbers for the operator's view: `crawlerd top`, the Prometheus endpoint, `crawlerd stats`.

``shard_status`` is ``Shard.status`` (the operations' counts, this view, the stores' and threads'
numbers), ``shard_memory`` is ``Shard.memory`` (each bounded RAM component against its cap).
Everything here is read on the shard's loop from the components' public
accessors, so it needs no locks; it costs one pass over the active hosts
(for the most backed-off ones), like the frontier's own stats.
"""

from __future__ import annotations

import os

from crawlerd.fetch.curl import CONNECTION_BYTES, connection_slots
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


def shard_status(shard, detail: bool = True) -> dict:
    """The shard's numbers; ``detail`` adds the operator's view and the DUST rules."""
    st = shard.ops.status(paused=shard.paused)
    # in_flight: transfers on the wire; leases also counts those being processed or between fetches
    st["leases"] = st["in_flight"]
    st["in_flight"] = shard.fetcher.in_flight if shard.fetcher is not None else 0
    st["processing"] = shard.pool.calls
    # jobs / frames: the workers' mean batch (a lone job runs on cold caches, bench/RESULTS.md)
    st["worker_batches"] = {"frames": shard.pool.answer_frames, "jobs": shard.pool.answers_framed}
    # bodies that found no free block in the pool: kept on the heap (fetcher), or sent inline (pool)
    st["body_pool_fallbacks"] = {"fetched": shard.bodies.fallbacks, "inline": shard.pool.inline,
                                 "pooled": shard.bodies.pooled}
    st = {**st, **operator_view(shard, shard_id=str(shard.index), closed="frontier" in shard.ops.final, detail=detail),
          **({"dust": dust_stats(shard)} if detail else {})}
    st["shared_ip_waits"] = shard.frontier.shared_ip_waits
    if shard.writer is not None:
        st["writer"] = shard.writer.stats()
    st["memory"] = shard_memory(shard)
    st["malloc"] = shard.trimmer.stats()
    st["near_index"] = shard.near.index_stats()
    if shard.owners is not None:
        st["digest_owners"] = shard.owners.stats()
    if shard.outbox is not None and shard.inbox is not None:
        ob, ib = shard.outbox, shard.inbox
        st["handoff"] = {"out": {str(d): v for d, v in ob.backlog().items()}, "in_batches": ib.backlog(),
                         "batches_sent": ob.batches_sent, "records_sent": ob.records_sent,
                         "bytes_sent": ob.bytes_sent, "batches_received": ib.batches_received,
                         "records_received": ib.records_received, "blocked": sorted(ob.blocked)}
        for side, part in (("engine_out", ob), ("engine_in", ib)):
            if hasattr(part, "stats"):      # a network transport's own numbers (retries, redeliveries)
                st["handoff"][side] = part.stats()
    return st


def shard_memory(shard) -> dict[str, dict[str, int]]:
    """Each bounded RAM component's estimated bytes against its cap (`crawlerd stats`)."""
    cfg, dust = shard.cfg, shard.dust
    out = {"robots_cache": shard.robots.memory(), "url_filter": shard.url_filter.memory(), **shard.near.memory(),
           # bodies fetched and not archived yet: leasing keeps them and the transfers' expected
           # bodies within the cap (LeaseWindow.free); bodies larger than the mean can pass it
           "fetched_bodies": {"bytes": shard.pool.body_bytes, "cap_bytes": cfg.process.queue_bytes,
                              "entries": shard.pool.calls},
           # the same bodies' blocks in the body pool (shared memory, a fixed cap: not the heap);
           # its high-water mark says how much of fetch.body_pool_bytes a crawl like this one needs
           "body_pool": {"bytes": shard.bodies.used_bytes, "cap_bytes": shard.bodies.cap_bytes,
                         "entries": shard.bodies.bodies, "high_water_bytes": shard.bodies.high_water_bytes}}
    if shard.resolver is not None:
        out["dns_cache"] = shard.resolver.memory()
    if heads := shard.frontier.memory():
        out["frontier_heads"] = heads
    if dust is not None:
        out["dust_hosts"] = dust.memory()
        out["dust_archived_filter"] = dust.learner.store.memory()
        out["dust_reads"] = dust.learner.store.read_cache_memory()
        out["dust_unlanded"] = dust.unlanded_memory()
    if shard.recrawl.enabled:
        out["recrawl_reads"] = shard.recrawl.memory()
    if shard.budgets is not None:
        out["budget_turns"] = shard.budgets.memory()
        out["budget_unlanded"] = shard.budgets.unlanded_memory()
    out["frontier_unlanded"] = shard.intake.frontier_gate.memory()
    out["seen_pending"] = shard.seen.memory()
    if shard.fetcher is not None:      # estimated at the HTTPS cost of a connection (fetch/curl.py)
        slots = connection_slots(cfg.fetch.connection_cache_bytes)
        open_ = shard.fetcher.connections_open
        out["curl_connections"] = {"bytes": min(open_, slots) * CONNECTION_BYTES,
                                   "cap_bytes": slots * CONNECTION_BYTES, "entries": open_}
    return out


def dust_stats(shard) -> dict:
    """The DUST rules part of ``crawlerd stats``."""
    return shard.dust.stats() if shard.dust is not None else {"enabled": False}
