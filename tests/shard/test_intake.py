"""Intake: filter with counted reasons, seen-set, frontier; acknowledged only after the frontier commit."""

import asyncio

from crawlerd.shard.intake import SEEN_SLICE
from crawlerd.url.filter import PATH_TOO_DEEP
from tests.shard.parts import Parts, run


def test_filtered_and_bad_urls_are_counted_the_rest_reach_the_frontier_once(tmp_path):
    async def go():
        p = Parts(str(tmp_path))
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        try:
            n = p.intake.submit_urls(["http://a.test/", "http://a.test/x", "http://a.test/1/2/3/4/5/6",
                                      "http://[bad", "http://b.test/y"], depth=0)
            assert n == 3
            await p.seen.flush()
            assert p.frontier.queued() == 3
            assert p.woken >= 1
            # the same URLs again (one as a relative link): duplicates, counted, not queued twice
            assert p.intake.submit_urls(["/x", "http://b.test/y"], depth=1, base="http://a.test/") == 2
            await p.seen.flush()
            assert p.frontier.queued() == 3
            return dict(p.metrics.dropped), dict(p.metrics.counters)
        finally:
            await p.close()

    dropped, counters = run(go())
    assert dropped == {"bad_url": 1, PATH_TOO_DEEP: 1}
    assert counters["seen_duplicate"] == 2


def test_priority_falls_one_level_every_three_hops(tmp_path):
    async def go():
        p = Parts(str(tmp_path), "frontier.priority_levels=3")
        try:
            return [p.intake.priority_for_depth(d) for d in range(9)]
        finally:
            await p.close()

    assert run(go()) == [0, 1, 1, 1, 2, 2, 2, 2, 2]


def test_a_large_delivery_is_admitted_in_slices_and_acknowledged_after_the_last(tmp_path):
    async def go():
        p = Parts(str(tmp_path))
        sizes, acks_before_done = [], []
        real_add, real_ack = p.frontier.add, p.seen.ack

        def add(items, **kw):
            items = list(items)
            sizes.append(len(items))
            return real_add(items, **kw)

        def ack():
            acks_before_done.append(p.frontier.queued())
            real_ack()

        p.frontier.add, p.seen.ack = add, ack
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        try:
            n = 3 * SEEN_SLICE + 7
            assert p.intake.submit_urls([f"http://h{i % 50}.test/p{i}" for i in range(n)], depth=0) == n
            await p.seen.flush()
            return n, sizes, acks_before_done, p.frontier.queued()
        finally:
            await p.close()

    n, sizes, acks, queued = run(go())
    assert queued == n and sum(sizes) == n
    assert max(sizes) <= SEEN_SLICE and len(sizes) >= 4
    assert acks and all(q == n for q in acks[-1:])     # the ack came once every slice was in


def test_answers_delivered_again_after_a_crash_are_not_added_twice(tmp_path):
    """DRUM delivers at least once; the frontier commits the position after each delivery with its adds."""
    from crawlerd.frontier import Frontier
    from crawlerd.seen.drum_answers import DrumResult, Op
    from crawlerd.shard.intake import encode_aux

    def answers(first):
        return [DrumResult(key=i + 1, op=Op.CHECK_UPDATE, unique=True, value=None,
                           aux=encode_aux(0, 0, 0, f"http://a.test/p{i}"), seq=first + i) for i in range(3)]

    async def go():
        p = Parts(str(tmp_path))
        try:
            p.intake.on_seen_results(answers(0))
            assert p.frontier.queued() == 3
            p.frontier.close()                  # as after a crash: the delivery was never acknowledged
            p.frontier = p.intake.frontier = Frontier(p.cfg.path("frontier"), map_size_bytes=1 << 26)
            p.intake.on_seen_results(answers(0))                 # delivered again
            p.intake.on_seen_results(answers(3)[:1])             # and one new answer
            return p.frontier.queued(), p.frontier.stats()["added"], dict(p.metrics.counters)
        finally:
            await p.close()

    queued, added, counters = run(go())
    assert queued == 3 + 1 and added == 4
    assert counters["seen_redelivered"] == 3
