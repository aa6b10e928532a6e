"""Intake of a shard of several: links for another shard's domains, and STAR vouches for them, go to
the outbox; the owner takes both (URLs into its seen-set, vouches into its edge DRUM)."""

import asyncio

from crawlerd.frontier.budgets import Budgets
from crawlerd.handoff import SpoolInbox, SpoolOutbox
from crawlerd.shard.intake import Intake
from crawlerd.url.hosts import shard_of
from tests.shard.parts import Parts, run


def two_domains(n=2):
    """A host of shard 0 and one of shard 1."""
    hosts = [f"d{i}.test" for i in range(100)]
    return next(h for h in hosts if shard_of(h, n) == 0), next(h for h in hosts if shard_of(h, n) == 1)


def budgets(path):
    return Budgets(path, base_budget=10, per_inlink=10, max_budget=1000, map_size_bytes=1 << 24, edge_buckets=2,
                   edge_merge_bytes=1 << 20, edge_cache_entries=1 << 10, sync=False)


def test_foreign_links_and_vouches_are_handed_over_and_taken_by_their_owner(tmp_path):
    mine, theirs = two_domains()

    async def go():
        loop = asyncio.get_running_loop()
        p = Parts(str(tmp_path / "s0"))
        b0 = budgets(str(tmp_path / "s0" / "budgets"))
        outbox = SpoolOutbox(str(tmp_path / "handoff"), 0, [1])
        intake = Intake(p.cfg, frontier=p.frontier, seen=p.seen, url_filter=p.url_filter, recrawl=p.recrawl,
                        metrics=p.metrics, wake=lambda: None, budgets=b0, wall=lambda: 0.0, shard=0, shards=2,
                        outbox=outbox)
        p.seen.start(loop, intake.on_seen_results)
        b0.start(loop)
        q = Parts(str(tmp_path / "s1"))
        b1 = budgets(str(tmp_path / "s1" / "budgets"))
        other = Intake(q.cfg, frontier=q.frontier, seen=q.seen, url_filter=q.url_filter, recrawl=q.recrawl,
                       metrics=q.metrics, wake=lambda: None, budgets=b1, wall=lambda: 0.0, shard=1, shards=2,
                       outbox=SpoolOutbox(str(tmp_path / "handoff"), 1, [0]))
        q.seen.start(loop, other.on_seen_results)
        b1.start(loop)
        try:
            n = intake.submit_urls([f"http://{mine}/a", f"http://{theirs}/b", f"http://{theirs}/c/1/2/3/4/5/6"],
                                   depth=1)
            assert n == 1                                   # only its own URL went to its seen-set
            b0.add_root(f"http://{mine}/")                  # a seed's domain vouches for every domain
            b0.record_links(f"http://{mine}/a", {f"http://{theirs}", f"http://{mine}"})
            await b0.edges.flush()                          # the edge is decided where its source lives
            assert intake.links_barrier() is not None
            await outbox.flush()
            kept = intake.links_barrier()
            if kept is not None:
                await kept
            assert intake.links_barrier() is None
            await p.seen.flush()
            assert p.frontier.queued() == 1
            inbox = SpoolInbox(str(tmp_path / "handoff"), 1)
            batches = inbox.receive()
            assert sum(len(b.records) for b in batches) == 3        # two URLs and one vouch
            edge_writer = b1.edges.intake_writer
            edge_writer.hold()                              # the vouch not yet in the edge DRUM's log
            assert other.take_handoff(batches, inbox.ack) == 3
            logged = q.seen.logged()                        # acknowledged once the intake logs hold them
            if logged is not None:
                await logged
            for _ in range(20):
                await asyncio.sleep(0)
            assert inbox.backlog() == 1                     # the URLs are logged, the vouch is not
            edge_writer.release()
            vouched = b1.edges_logged()
            assert vouched is not None
            await vouched
            assert inbox.backlog() == 0
            await q.seen.flush()
            await b1.edges.flush()
            # the receiver filters what it owns: the too-deep URL is dropped there, with its reason;
            # the vouch counts where the linked domain's budget lives, not where it was found
            b0.graph.check_invariants()
            b1.graph.check_invariants()
            return (q.frontier.queued(), dict(q.metrics.dropped), b1.graph.indegree(theirs),
                    b0.graph.indegree(theirs))
        finally:
            await p.close()
            await q.close()
            await b0.close()
            await b1.close()

    queued, dropped, owner_in, finder_in = run(go())
    assert queued == 1 and dropped.get("path_too_deep") == 1
    assert (owner_in, finder_in) == (1, 0)
