"""``crawlerd cluster status``: every shard of a crawl as the cluster sees it, from any node.

Read from the cluster only (no daemon asked): N from the meta bucket, each shard's lease (owner
node and pid, lease age, age of its last renewal, the numbers the owner writes into it: pages,
pages/s, outbox backlog), each shard's consumer (hand-off backlog: ``pending`` not yet delivered,
``ack_pending`` delivered and not yet acknowledged, ``redelivered``), and the stream (messages,
bytes, leader, replicas). Every node answers the same, because every node reads the same keys.
"""

from __future__ import annotations

import json
import time

import nats.js.errors

from crawlerd.cluster.engine import Link
from crawlerd.cluster.lease import lease_key


async def gather(link: Link, *, shards: int | None = None, wall=time.time) -> dict:
    """The cluster's view of the crawl (see module doc); ``shards`` when the meta bucket has none."""
    js, names = link.js, link.names
    n = shards
    try:
        meta = await js.key_value(names.meta)
        n = int((await meta.get("shards")).value)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
        pass
    out: dict = {"crawl": names.crawl, "shards": n, "stream": None, "shard_list": [], "nodes": {}}
    try:
        si = await js.stream_info(names.stream)
        out["stream"] = {"name": names.stream, "messages": si.state.messages, "bytes": si.state.bytes,
                         "leader": si.cluster.leader if si.cluster else None,
                         "replicas": [p.name for p in (si.cluster.replicas or [])] if si.cluster else []}
    except nats.js.errors.NotFoundError:
        pass
    try:
        leases = await js.key_value(names.leases)
    except nats.js.errors.BucketNotFoundError:
        leases = None
    now = wall()
    for i in range(n or 0):
        row: dict = {"shard": i, "owner": None, "pid": None, "lease_age_s": None, "renewed_age_s": None,
                     "pages": None, "pages_per_s": None, "pending": None, "ack_pending": None,
                     "redelivered": None, "outbox_batches": None}
        if leases is not None:
            try:
                e = await leases.get(lease_key(i))
                v = json.loads(e.value)
                row.update(owner=v.get("node"), pid=v.get("pid"),
                           lease_age_s=round(now - v["since"], 1) if v.get("since") else None,
                           renewed_age_s=round(now - v["renewed"], 1) if v.get("renewed") else None,
                           pages=v.get("pages"), pages_per_s=v.get("pages_per_s"),
                           outbox_batches=v.get("outbox_batches"))
            except (nats.js.errors.KeyNotFoundError, ValueError):
                pass
        try:
            ci = await js.consumer_info(names.stream, names.consumer(i))
            row.update(pending=ci.num_pending, ack_pending=ci.num_ack_pending, redelivered=ci.num_redelivered)
        except nats.js.errors.NotFoundError:
            pass
        out["shard_list"].append(row)
        if row["owner"]:
            out["nodes"].setdefault(row["owner"], []).append(i)
    return out


def _cell(v, fmt="{}") -> str:
    return "-" if v is None else fmt.format(v)


def render(view: dict) -> str:
    """The view as a few lines of text."""
    s = view["stream"]
    lines = [f"crawl {view['crawl']}: {_cell(view['shards'])} shards, "
             f"{len(view['nodes'])} nodes owning {sum(len(v) for v in view['nodes'].values())}"]
    if s:
        lines.append(f"stream {s['name']}: {s['messages']} batches, {s['bytes']} bytes, leader {s['leader']}, "
                     f"replicas {', '.join(s['replicas']) or '-'}")
    else:
        lines.append("stream: not created yet")
    lines.append(f"{'shard':>5}  {'owner':<16} {'pid':>7} {'lease age':>9} {'renewed':>7} {'pages':>9} "
                 f"{'pages/s':>7} {'pending':>7} {'ack-pend':>8} {'outbox':>6}")
    for r in view["shard_list"]:
        lines.append(f"{r['shard']:>5}  {_cell(r['owner']):<16} {_cell(r['pid']):>7} "
                     f"{_cell(r['lease_age_s'], '{:.0f}s'):>9} {_cell(r['renewed_age_s'], '{:.1f}s'):>7} "
                     f"{_cell(r['pages']):>9} {_cell(r['pages_per_s'], '{:.1f}'):>7} {_cell(r['pending']):>7} "
                     f"{_cell(r['ack_pending']):>8} {_cell(r['outbox_batches']):>6}")
    return "\n".join(lines)
