"""Intake of a shard of several: links and STAR edges for another shard's domains go to the outbox."""

import asyncio

from crawlerd import url as urlmod
from crawlerd.frontier.budgets import DomainGraph
from crawlerd.handoff import SpoolInbox, SpoolOutbox
from crawlerd.shard.intake import Intake
from tests.shard.parts import Parts, run


def two_domains(n=2):
    """A host of shard 0 and one of shard 1."""
    hosts = [f"d{i}.test" for i in range(100)]
    return next(h for h in hosts if urlmod.shard_of(h, n) == 0), next(h for h in hosts if urlmod.shard_of(h, n) == 1)


def test_foreign_links_and_edges_are_handed_over_and_taken_by_their_owner(tmp_path):
    mine, theirs = two_domains()

    async def go():
        p = Parts(str(tmp_path / "s0"))
        graph = DomainGraph(str(tmp_path / "s0" / "budgets"), map_size_bytes=1 << 24)
        outbox = SpoolOutbox(str(tmp_path / "handoff"), 0, [1])
        intake = Intake(p.cfg, frontier=p.frontier, seen=p.seen, url_filter=p.url_filter, recrawl=p.recrawl,
                        metrics=p.metrics, wake=lambda: None, graph=graph, wall=lambda: 0.0, shard=0, shards=2,
                        outbox=outbox)
        p.seen.start(asyncio.get_running_loop(), intake.on_seen_results)
        q = Parts(str(tmp_path / "s1"))
        graph1 = DomainGraph(str(tmp_path / "s1" / "budgets"), map_size_bytes=1 << 24)
        other = Intake(q.cfg, frontier=q.frontier, seen=q.seen, url_filter=q.url_filter, recrawl=q.recrawl,
                       metrics=q.metrics, wake=lambda: None, graph=graph1, wall=lambda: 0.0, shard=1, shards=2,
                       outbox=SpoolOutbox(str(tmp_path / "handoff"), 1, [0]))
        q.seen.start(asyncio.get_running_loop(), other.on_seen_results)
        try:
            n = intake.submit_urls([f"http://{mine}/a", f"http://{theirs}/b", f"http://{theirs}/c/1/2/3/4/5/6"],
                                   depth=1)
            assert n == 1                                   # only its own URL went to its seen-set
            intake.add_domain_edges(mine, {theirs, mine})
            intake.add_domain_edges(mine, {theirs})         # remembered: not handed over twice
            assert intake.handoff_barrier() is not None
            await outbox.flush()
            assert intake.handoff_barrier() is None
            await p.seen.flush()
            assert p.frontier.queued() == 1
            inbox = SpoolInbox(str(tmp_path / "handoff"), 1)
            batches = inbox.receive()
            assert sum(len(b.records) for b in batches) == 3        # two URLs and one edge
            assert other.take_handoff(batches, inbox.ack) == 3
            assert inbox.backlog() == 0
            await q.seen.flush()
            graph1.flush()
            graph.flush()
            # the receiver filters what it owns: the too-deep URL is dropped there, with its reason;
            # the in-link counts where the linked domain's budget lives, not where it was found
            return q.frontier.queued(), dict(q.metrics.dropped), graph1.indegree(theirs), graph.indegree(theirs)
        finally:
            await p.close()
            await q.close()
            graph.close()
            graph1.close()

    queued, dropped, owner_in, finder_in = run(go())
    assert queued == 1 and dropped.get("path_too_deep") == 1
    assert (owner_in, finder_in) == (1, 0)
