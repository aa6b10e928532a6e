"""What a shard of several needs besides its own stores: ownership, hand-off, shared IP slots.

With ``crawl.shards`` = N > 1 each shard is its own process (``crawlerd run --member i``,
started by the family supervisor). Before it opens its stores it takes its ownership lease
(``shards/<i>/lock``: no two processes ever run one shard), then opens its hand-off channels
(an outbox to every other shard, its inbox) and attaches to the machine's per-IP slot table,
which frees the cells an earlier, dead process of this shard still held.

In a cluster (``cluster.servers`` set) the local lock still keeps a second process of this
machine off the shard, but the hand-off and the lease that fences fetching come from the
cluster (``crawlerd.cluster.member``, opened on the shard's loop): ``open_member(...,
spool=False)`` leaves ``outbox`` and ``inbox`` to it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from crawlerd import layout
from crawlerd.config import Config
from crawlerd.handoff import SpoolInbox, SpoolOutbox
from crawlerd.handoff.ownership import LocalShardLease


class MemberError(Exception):
    """This shard cannot start (already running, no slot table); one line."""


@dataclass
class MemberParts:
    ownership: LocalShardLease
    outbox: SpoolOutbox | None
    inbox: SpoolInbox | None
    ip_slots: object

    def kwargs(self) -> dict:
        """The Shard's keyword arguments."""
        return {"ownership": self.ownership, "outbox": self.outbox, "inbox": self.inbox, "ip_slots": self.ip_slots}

    def close(self) -> None:
        self.ip_slots.close()
        self.ownership.release()


def outbox_for(cfg: Config, source: int, dests) -> SpoolOutbox:
    h = cfg.handoff
    return SpoolOutbox(layout.handoff_dir(cfg.crawl.data_dir), source, dests, max_pending=h.max_pending_batches,
                       batch_records=h.batch_records, flush_interval_s=h.flush_interval_s, fsync=h.fsync)


def open_member(cfg: Config, index: int, *, spool: bool = True) -> MemberParts:
    """The local lock, the per-IP slot table and (``spool``) the spool hand-off of shard ``index``."""
    from crawlerd._native.ipslots import IPSlots
    n = cfg.crawl.shards
    d = cfg.crawl.data_dir
    os.makedirs(layout.shard_dir(d, index), exist_ok=True)
    lease = LocalShardLease(os.path.join(layout.shard_dir(d, index), "lock"))
    if not lease.acquire():
        raise MemberError(f"shard {index} of {d} is already run by another process")
    try:
        slots = IPSlots(layout.ipslots_path(d))
    except (OSError, ValueError) as e:
        lease.release()
        raise MemberError(f"cannot open the per-IP slot table: {e}") from None
    slots.attach(index, time.monotonic(), cfg.politeness.ip_delay_s)
    if not spool:
        return MemberParts(lease, None, None, slots)
    outbox = outbox_for(cfg, index, [j for j in range(n) if j != index])
    inbox = SpoolInbox(layout.handoff_dir(d), index)
    return MemberParts(lease, outbox, inbox, slots)
