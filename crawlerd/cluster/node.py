"""The family supervisor's side of a cluster node: N agreed with the cluster, seeds handed over.

A node's family (``crawlerd run --cluster ... --own ...``) runs only the shards it owns; before
any of them starts it checks the crawl's shard count against the cluster (``ClusterMeta``: the
first node records N, a node started with another N is refused, naming both) and makes sure
the hand-off stream exists. Seeds (the seeds file, ``seed add``, the hosts of configured
sitemaps) go to their owner shards wherever they run: a JetStream outbox with source N
(the supervisor), whose local spool is ``<data_dir>/outbox/`` (published by the next start if
this one ends first). Its batches' de-duplication id carries the node name, since every
node's supervisor is source N.
"""

from __future__ import annotations

from crawlerd import layout
from crawlerd.cluster.engine import ClusterError, Link, Names
from crawlerd.cluster.lease import ClusterMeta, node_name
from crawlerd.config import Config
from crawlerd.handoff.jetstream import JetStreamOutbox


def node_of(cfg: Config) -> str:
    return cfg.cluster.node or node_name()


async def check_cluster(cfg: Config, *, timeout_s: float = 30.0) -> None:
    """Refuse (ClusterError, one line) a node whose crawl.shards differs from the cluster's."""
    c = cfg.cluster
    link = await Link(c.servers, Names(c.crawl), name=f"crawlerd-{node_of(cfg)}-check").open(timeout_s)
    try:
        await (await ClusterMeta(link, replicas=c.replicas).open()).check_shards(cfg.crawl.shards)
        await link.ensure_stream(replicas=c.replicas, max_batches_per_shard=c.max_backlog_batches,
                                 dedup_window_s=c.dedup_window_s)
    finally:
        await link.close()


class SeedSender:
    """The family's outbox to every shard of the crawl over JetStream (see module doc)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.link: Link | None = None
        self.outbox: JetStreamOutbox | None = None

    async def open(self) -> SeedSender:
        c, h, n = self.cfg.cluster, self.cfg.handoff, self.cfg.crawl.shards
        node = node_of(self.cfg)
        self.link = await Link(c.servers, Names(c.crawl), name=f"crawlerd-{node}-seeds").open()
        self.outbox = JetStreamOutbox(self.link, layout.outbox_dir(self.cfg.crawl.data_dir), n, range(n),
                                      max_pending=h.max_pending_batches, batch_records=h.batch_records,
                                      flush_interval_s=h.flush_interval_s, fsync=h.fsync, id_prefix=f"{node}/")
        self.outbox.start()
        return self

    @property
    def records_sent(self) -> int:
        """Seed records JetStream holds (published) so far."""
        return self.outbox.records_sent if self.outbox is not None else 0

    def stage(self, dest: int, records: list[tuple[int, bytes]]) -> None:
        self.outbox.stage(dest, records)

    async def flush(self) -> None:
        """Staged seeds are in the local outbox (durable); the relay publishes them."""
        await self.outbox.flush()

    async def close(self, timeout_s: float = 10.0) -> None:
        if self.outbox is not None:
            await self.outbox.close(timeout_s)
        if self.link is not None:
            await self.link.close()


__all__ = ["ClusterError", "SeedSender", "check_cluster", "node_of"]
