"""Hand-off: URLs found by one shard for a host another shard owns, carried in batches.

A crawl of N shards partitions hosts by registered domain (``url.hosts.shard_of``). A shard that
finds a URL (outlink, redirect target, sitemap entry) for a host of shard *j* stages it in its
**outbox**; ``seed add`` and the seeds file go through an outbox too (source N: the supervisor).
Shard *j* takes batches from its **inbox**, runs them through its intake (URL filter, DRUM) and
acknowledges each batch only once DRUM's intake log holds it; until then the sender's copy
stands. Duplicates (a batch delivered twice after a crash) are absorbed by the receiver's DRUM.

The interfaces, so that another transport (a network engine) can stand in for the spool:

``Outbox`` (one per sending process; ``source`` = its shard, or N for the supervisor)
    ``stage(dest, records)``: queue records for ``dest`` (no I/O). ``barrier()``: ``None`` if
    everything staged is durable already, else an awaitable that resolves once it is (the
    flusher writes staged records as batches). ``flush()`` (async): write everything staged
    now. ``send(dest, records)`` (async): stage + wait until durable. The channel to each
    destination is bounded: when ``max_pending`` batches are unconsumed, the flusher waits,
    so ``barrier()`` waits, so the sender's leases wait (backpressure, nothing dropped).
    ``backlog()``: per destination, batches unconsumed and records staged. ``close()``.
``Inbox`` (one per shard)
    ``receive(max_records)`` → ``Batch`` list, per source in sequence order, each delivered
    again after a restart until acknowledged (at least once). ``ack(batch)``: only after its
    records are in the receiver's seen-set journal; the sender may then forget it.
    ``backlog()``: batches waiting.

A record is ``(fp, aux)``: the URL's 64-bit fingerprint and its intake record (depth, hops,
priority, URL; ``shard.intake.encode_aux``). A batch is named by ``(source, seq)``; seq grows
across restarts of the source (it starts above the wall clock in microseconds), so the pair is
also a de-duplication id for a transport that has one.

Transports: ``spool`` (one machine: a directory per destination, one file per batch).
"""

from crawlerd.handoff.batch import Batch, decode_batch, encode_batch
from crawlerd.handoff.spool import SpoolInbox, SpoolOutbox

__all__ = ["Batch", "SpoolInbox", "SpoolOutbox", "decode_batch", "encode_batch"]
