"""What a shard process of a cluster opens before it crawls: link, N check, lease, hand-off.

``open_cluster_parts(cfg, index, outbox_root=..., outbox_kw=...)`` runs on the shard's own event
loop (the connection belongs to it): connect to ``cluster.servers``, make sure the hand-off
stream exists, check N against the cluster (``ClusterMeta``), take the shard's lease (``heir``:
the caller holds this machine's lock on the shard, so a lease under this node's name is a dead
process's, taken over at once; or wait as a standby for up to ``standby_wait_s``; ``MemberRefused`` names the holder otherwise), then
open the outbox to every other shard (its local spool under ``outbox_root``) and the inbox.
The result carries what a ``Shard`` takes (``ownership``, ``outbox``, ``inbox``) and the gate
for its fetcher (``lease.held``). ``serve_digests`` puts the payload-digest owners of shards on
other machines behind NATS request/reply (``cluster.dedup``) and answers for this one.
``share_ips`` wraps the machine's per-IP slot table in ``ClusterIpSlots`` (``cluster.ipgrants``:
per-IP turns from each IP's owner shard) and answers for the IPs this shard owns.
``close()`` stops the hand-off, the IP turns and the digest service, releases the lease, closes
the link, in that order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from crawlerd.cluster.dedup import OwnerPeer, OwnerService
from crawlerd.cluster.engine import ClusterError, Link, Names
from crawlerd.cluster.ipgrants import ClusterIpSlots, IpTurnService
from crawlerd.cluster.ipturns import IpTurns
from crawlerd.cluster.lease import ClusterMeta, KvShardLease, node_name
from crawlerd.config import Config
from crawlerd.handoff.jetstream import JetStreamInbox, JetStreamOutbox


class MemberRefused(ClusterError):
    """This node may not run the shard now (held elsewhere, N differs); one line."""


@dataclass
class ClusterParts:
    link: Link
    lease: KvShardLease
    outbox: JetStreamOutbox
    inbox: JetStreamInbox
    digests: OwnerService | None = None
    ips: ClusterIpSlots | None = None
    ip_service: IpTurnService | None = None

    def kwargs(self) -> dict:
        """The Shard's keyword arguments for its ownership and hand-off."""
        return {"ownership": self.lease, "outbox": self.outbox, "inbox": self.inbox}

    def start(self) -> None:
        """Start renewing the lease and pulling the inbox (the outbox starts with the shard)."""
        self.lease.start()
        self.inbox.start()
        if self.ips is not None:
            self.ips.start()

    async def share_ips(self, local, *, shards: int, node: str, grant_s: float, drain_s: float,
                        quiet_s: float) -> ClusterIpSlots:
        """The frontier's per-IP table for a cluster: ``local`` (this machine's, attached) asked
        only under a grant of the IP's owner; this shard answers for the IPs it owns
        (``quiet_s``: grants nothing that long, for an earlier process's grants to run out)."""
        now = time.monotonic()
        turns = IpTurns(grant_s=grant_s, drain_s=drain_s, now=now, quiet_s=quiet_s)
        self.ips = ClusterIpSlots(local, shard=self.lease.shard, shards=shards, node=node, grant_s=grant_s,
                                  link=self.link, own=turns)
        self.ip_service = IpTurnService(self.link, self.lease.shard, turns)
        await self.ip_service.start()
        return self.ips

    async def serve_digests(self, owners, handle: Callable[[bytes], bytes | None], local: list[int]) -> None:
        """``owners`` (a ``DigestOwners``) asks the shards not in ``local`` over NATS; this
        shard's claims from other machines are answered by ``handle``."""
        for j in list(owners.peers):
            if j not in local:
                owners.use_peer(j, OwnerPeer(self.link, j))
        self.digests = OwnerService(self.link, self.lease.shard, handle)
        await self.digests.start()

    async def close(self, timeout_s: float = 5.0) -> None:
        if self.ips is not None:        # gives its grants back first: their owners may answer still
            await self.ips.stop(timeout_s=1.0)
        if self.ip_service is not None:
            await self.ip_service.close()
        if self.digests is not None:
            await self.digests.close()
        await self.inbox.close(timeout_s)
        await self.lease.release()
        await self.link.close()


async def open_cluster_parts(cfg: Config, index: int, *, outbox_root: str, outbox_kw: dict | None = None,
                             shards: int | None = None, standby_wait_s: float = 0.0, heir: bool = False,
                             on_lost: Callable[[str], None] | None = None) -> ClusterParts:
    c = cfg.cluster
    n = shards or cfg.crawl.shards
    if not 0 <= index < n:
        raise MemberRefused(f"shard {index} is not one of crawl.shards = {n}")
    node = c.node or node_name()
    link = await Link(c.servers, Names(c.crawl), name=f"crawlerd-{node}-shard-{index}").open()
    try:
        await (await ClusterMeta(link, replicas=c.replicas).open()).check_shards(n)
        await link.ensure_stream(replicas=c.replicas, max_batches_per_shard=c.max_backlog_batches,
                                 dedup_window_s=c.dedup_window_s)
        lease = await KvShardLease(link, index, node=node, ttl_s=c.lease_ttl_s, fence_s=c.lease_fence_s,
                                   renew_interval_s=c.lease_renew_interval_s, replicas=c.replicas,
                                   on_lost=on_lost, heir=heir).open()
        got = await (lease.acquire_wait(standby_wait_s) if standby_wait_s > 0 else lease.acquire())
        if not got:
            h = lease.holder or {}
            raise MemberRefused(f"shard {index} of crawl {c.crawl!r} is held by node {h.get('node')!r} "
                                f"(pid {h.get('pid')}); it may be taken once that lease expires "
                                f"({c.lease_ttl_s:g} s after its last renewal)")
        outbox = JetStreamOutbox(link, outbox_root, index, [j for j in range(n) if j != index], **(outbox_kw or {}))
        inbox = await JetStreamInbox(link, index, ack_wait_s=c.ack_wait_s).open()
    except BaseException:
        await link.close()
        raise
    return ClusterParts(link, lease, outbox, inbox)
