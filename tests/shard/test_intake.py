"""Intake: filter with counted reasons, seen-set, frontier; acknowledged only after the frontier commit."""

import asyncio
import os
import textwrap

import pytest

from crawlerd.fetch.robots import RobotsCache
from crawlerd.fetch.robots.policy import RobotsEntry, RobotsState
from crawlerd.fetch.robots.rules import RobotsRules
from crawlerd.seen.drum_answers import DrumResult, Op
from crawlerd.shard.intake import SEEN_SLICE, Intake, encode_aux
from crawlerd.url.filter import PATH_TOO_DEEP
from tests.kill9 import first_line_then_kill_9
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


def test_a_large_delivery_is_judged_in_slices_committed_once_and_acknowledged_after_the_commit(tmp_path):
    async def go():
        p = Parts(str(tmp_path))
        judged, adds, acks = [], [], []
        real_add, real_ack = p.frontier.add, p.seen.ack

        def admission(fresh):               # the DUST hook sees each slice as it is judged
            judged.append((len(fresh), len(adds)))
            return fresh

        def add(items, **kw):
            items = list(items)
            adds.append((len(items), kw.get("seen_mark")))
            return real_add(items, **kw)

        def ack(*upto):
            acks.append((p.frontier.queued(), p.frontier.seen_mark, len(adds)))
            real_ack(*upto)

        p.intake.admission = admission
        p.frontier.add, p.seen.ack = add, ack
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        try:
            n = 3 * SEEN_SLICE + 7
            assert p.intake.submit_urls([f"http://h{i % 50}.test/p{i}" for i in range(n)], depth=0) == n
            await p.seen.flush()
            return n, judged, adds, acks, p.frontier.queued()
        finally:
            await p.close()

    n, judged, adds, acks, queued = run(go())
    assert queued == n
    # judged a slice per loop iteration, none of them committed on its own
    assert len(judged) >= 4 and max(size for size, _ in judged) <= SEEN_SLICE and sum(s for s, _ in judged) == n
    assert all(before == 0 for _, before in judged)
    # one frontier commit for the whole delivery, with the position after its last answer
    assert adds == [(n, n)]
    # acknowledged once, after that commit
    assert acks == [(n, n, 1)]


def test_a_delivery_longer_than_a_commit_group_commits_each_group_with_its_mark_and_acks_after_the_last(
        tmp_path, monkeypatch):
    import crawlerd.shard.intake as intake_module

    monkeypatch.setattr(intake_module, "COMMIT_ANSWERS", 2 * SEEN_SLICE)

    async def go():
        p = Parts(str(tmp_path))
        events = []
        real_add, real_ack = p.frontier.add, p.seen.ack

        def add(items, **kw):
            items = list(items)
            events.append(("add", len(items), kw.get("seen_mark")))
            return real_add(items, **kw)

        def ack(*upto):
            events.append(("ack", p.frontier.queued(), p.frontier.seen_mark))
            real_ack(*upto)

        p.frontier.add, p.seen.ack = add, ack
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        try:
            n = 5 * SEEN_SLICE + 7
            assert p.intake.submit_urls([f"http://h{i % 50}.test/p{i}" for i in range(n)], depth=0) == n
            await p.seen.flush()
            return n, events
        finally:
            await p.close()

    n, events = run(go())
    g = 2 * SEEN_SLICE
    assert events == [("add", g, g), ("add", g, 2 * g), ("add", n - 2 * g, n), ("ack", n, n)]


def test_a_delivery_commits_its_budget_deferrals_before_the_frontier_and_acks_after_both(tmp_path):
    from crawlerd.frontier.budgets import Budgets

    async def go():
        p = Parts(str(tmp_path))
        b = Budgets(str(tmp_path / "budgets"), base_budget=2, per_inlink=2, max_budget=100, map_size_bytes=1 << 24,
                    edge_buckets=2, edge_merge_bytes=1 << 20, edge_cache_entries=1 << 10, sync=False)
        p.intake.budgets = b
        order, ticks, iterations = [], [0], {}
        real_commit, real_add, real_ack = b.commit, p.frontier.add, p.seen.ack
        loop = asyncio.get_running_loop()

        def tick():                         # runs once per loop iteration
            ticks[0] += 1
            loop.call_soon(tick)
        tick()

        def commit(then=None):
            order.append(("budgets", b.beast.waiting))
            iterations["budgets"] = ticks[0]
            real_commit(then)           # the frontier's commit waits for ``then``

        def add(items, **kw):
            order.append(("frontier", kw.get("seen_mark")))
            iterations["frontier"] = ticks[0]
            return real_add(items, **kw)

        def ack(*upto):
            order.append(("ack", None))
            real_ack(*upto)

        b.commit, p.frontier.add, p.seen.ack = commit, add, ack
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        try:
            n = 2 * SEEN_SLICE + 5
            assert p.intake.submit_urls([f"http://h{i % 40}.test/p{i}" for i in range(n)], depth=1) == n
            await p.seen.flush()
            return n, order, p.frontier.queued(), b.beast.waiting, dict(p.metrics.counters), iterations
        finally:
            await p.close()
            b.store.close()

    n, order, queued, waiting, counters, iterations = run(go())
    assert queued == 40 * 2 and waiting == n - 80 == counters["budget_deferred"]   # 2 per domain pass, the rest wait
    assert order == [("budgets", n - 80), ("frontier", n), ("ack", None)]
    assert iterations["frontier"] > iterations["budgets"]       # the two commits are not one long iteration


@pytest.mark.parametrize("reserved", [64 << 10, 0])
def test_a_delivery_commits_early_once_its_budget_writes_could_fill_the_reserved_page_buffers(tmp_path, reserved):
    # the budget store reserves 16 pages (charged depth + 1 per write): a slice of deferrals fills
    # them, so the delivery commits budgets then frontier after each such slice, each with its mark;
    # nothing reserved: one commit for the delivery. Either way every URL is queued or waiting once.
    from crawlerd.frontier.budgets import Budgets

    async def go():
        p = Parts(str(tmp_path))
        b = Budgets(str(tmp_path / "budgets"), base_budget=2, per_inlink=2, max_budget=100, map_size_bytes=1 << 24,
                    edge_buckets=2, edge_merge_bytes=1 << 20, edge_cache_entries=1 << 10, sync=False,
                    write_buffer_bytes=reserved)
        p.intake.budgets = b
        order = []
        real_commit, real_add = b.commit, p.frontier.add

        def commit(then=None):
            order.append("budgets")
            real_commit(then)

        def add(items, **kw):
            order.append(("frontier", kw.get("seen_mark")))
            return real_add(items, **kw)

        b.commit, p.frontier.add = commit, add
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        try:
            n = 3 * SEEN_SLICE + 5
            assert p.intake.submit_urls([f"http://h{i % 40}.test/p{i}" for i in range(n)], depth=1) == n
            await p.seen.flush()
            return n, order, p.frontier.queued(), b.beast.waiting
        finally:
            await p.close()
            b.store.close()

    n, order, queued, waiting = run(go())
    assert queued + waiting == n and queued == 40 * 2
    if reserved:
        marks = [("frontier", m) for m in (SEEN_SLICE, 2 * SEEN_SLICE, 3 * SEEN_SLICE, n)]
        assert order == [x for m in marks for x in ("budgets", m)]
    else:
        assert order == ["budgets", ("frontier", n)]


KILLED_CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from crawlerd.frontier.budgets import Budgets
    from tests.shard.parts import Parts

    async def main():
        p = Parts({data!r})
        p.intake.budgets = Budgets({budgets!r}, base_budget=2, per_inlink=2, max_budget=100,
                                   map_size_bytes=1 << 24, edge_buckets=2, edge_merge_bytes=1 << 20,
                                   edge_cache_entries=1 << 10, sync=False)
        slices = []

        def admission(fresh):
            slices.append(len(fresh))
            if len(slices) == 2:                    # the delivery is half judged: be killed here
                print("judging", flush=True)
                sys.stdin.read()
            return fresh

        p.intake.admission = admission
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        p.intake.submit_urls([f"http://h{{i % 40}}.test/p{{i}}" for i in range({n})], depth=1)
        await p.seen.flush()

    asyncio.run(main())
""")


def test_kill_9_in_the_middle_of_a_delivery_loses_no_url_and_adds_none_twice(tmp_path):
    """The slices judged before the kill were not committed: the whole delivery comes again."""
    from crawlerd.frontier.budgets import Budgets

    n = 3 * SEEN_SLICE
    data, budgets = str(tmp_path / "data"), str(tmp_path / "data" / "budgets")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = KILLED_CHILD.format(root=root, data=data, budgets=budgets, n=n)
    assert first_line_then_kill_9(code) == b"judging\n"

    async def go():
        p = Parts(data)
        b = Budgets(budgets, base_budget=2, per_inlink=2, max_budget=100, map_size_bytes=1 << 24, edge_buckets=2,
                    edge_merge_bytes=1 << 20, edge_cache_entries=1 << 10, sync=False)
        p.intake.budgets = b
        try:
            before = (p.frontier.queued(), b.beast.waiting)
            p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
            await p.seen.flush()
            return before, p.frontier.queued(), b.beast.waiting
        finally:
            await p.close()
            b.store.close()

    before, queued, waiting = run(go())
    assert before == (0, 0)                     # nothing of the half-judged delivery was committed
    assert queued == 40 * 2 and queued + waiting == n       # all of it after the restart, once


def test_answers_delivered_again_after_a_crash_are_not_added_twice(tmp_path):
    """DRUM delivers at least once; the frontier commits the position after each delivery with its adds."""
    from crawlerd.frontier import Frontier

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


def _robots(ruled: str, robots_txt: bytes, *, failed: str | None = None) -> RobotsCache:
    """A robots cache holding ``ruled``'s parsed ``robots_txt`` and, for ``failed``, a robots.txt
    that answered 503 (disallow-all, decided at lease); other hosts are unknown."""
    robots = RobotsCache()
    rules = RobotsRules.parse(robots_txt, "crawlerd", 1 << 16)
    robots.put(ruled, RobotsEntry(rules, 0.0, 1e9, 200, RobotsState.PARSED.value, ""))
    if failed is not None:
        robots.put(failed, RobotsEntry(RobotsRules.disallow_all(), 0.0, 1e9, 503, RobotsState.UNREACHABLE.value, ""))
    return robots


def _answers(rows: list[tuple[str, bool]]) -> list[DrumResult]:
    """DRUM's answers for ``(url, unique)`` rows, in order (depth 1, hops 0, priority 1)."""
    return [DrumResult(key=i + 1, op=Op.CHECK_UPDATE, unique=u, value=None, aux=encode_aux(1, 0, 1, url), seq=i)
            for i, (url, u) in enumerate(rows)]


def _robots_intake(p: Parts, robots: RobotsCache, dropped: list | None = None) -> Intake:
    """An intake over ``p`` that judges robots rules at admission from ``robots``; the URLs it drops
    are appended to ``dropped``."""
    on_dropped = None if dropped is None else (lambda url, reason: dropped.append(url))
    return Intake(p.cfg, frontier=p.frontier, seen=p.seen, url_filter=p.url_filter, recrawl=p.recrawl,
                  metrics=p.metrics, wake=lambda: None, wall=lambda: 0.0, robots=robots, clock=lambda: 10.0,
                  on_dropped=on_dropped)


def test_robots_rules_at_admission_are_each_hosts_own_when_hosts_interleave(tmp_path):
    """URLs of a host with rules, of one without and of one whose robots.txt failed, interleaved in one
    delivery: each is judged by its own host's rules (the intake reuses a host's rules along a run
    of its URLs)."""

    ruled, free, failed = "http://ruled.test", "http://free.test", "http://failed.test"
    robots = _robots(ruled, b"User-agent: *\nDisallow: /private/\n", failed=failed)
    urls = [f"{host}/private/{i}.html" for i in range(3) for host in (ruled, ruled, free, failed, ruled)]
    urls += [f"{ruled}/p/{i}.html" for i in range(2)]
    results = _answers([(u, True) for u in urls])

    async def go():
        p = Parts(str(tmp_path))
        intake = _robots_intake(p, robots)
        try:
            intake.on_seen_results(results)
            return p.frontier.queued(), p.metrics.dropped["robots_denied"]
        finally:
            await p.close()

    queued, denied = run(go())
    assert denied == 3 * 3                      # ruled.test's private URLs, nothing else
    assert queued == len(urls) - denied        # free.test's, failed.test's (decided at lease) and ruled.test's /p/


def test_robots_rules_at_admission_judge_each_url_as_its_whole_url_is_judged(tmp_path):
    """The intake matches rules against a URL's path cut at its host key: the verdicts are those of
    the rules on the whole URL (a path that starts with "//", globs, "$", a query), and a host whose
    key merely starts with a ruled host's (another host, another port) is not judged by its rules."""

    ruled = "http://ruled.test"
    robots_txt = (b"User-agent: *\nDisallow: /private/\nAllow: /private/open/\nDisallow: /*.json$\n"
                  b"Disallow: /a//b\nDisallow: /q?x=\n")
    robots = _robots(ruled, robots_txt)
    rules = RobotsRules.parse(robots_txt, "crawlerd", 1 << 16)
    paths = ["/private/1", "//private/2", "//x/private/9", "/private/open/3", "/x.json", "/x.json?v=1", "/p?private/", "/a//b",
             "/a/b", "/", "/q?x=1", "/q", "/robots.txt", "/%2Aprivate/4", "/private"]
    urls = [ruled + path for path in paths]
    urls += ["http://ruled.test.other/private/5", "http://ruled.test:8080/private/6", "http://ruled.tes/private/7"]
    urls += [ruled + path for path in paths[:3]]      # the ruled host again, after others
    results = _answers([(u, True) for u in urls])
    dropped = []

    async def go():
        p = Parts(str(tmp_path))
        intake = _robots_intake(p, robots, dropped)
        try:
            intake.on_seen_results(results)
            return p.frontier.queued()
        finally:
            await p.close()

    queued = run(go())
    want = [u for u in urls if u.startswith(ruled + "/") and not rules.allowed(u)]
    assert dropped == want and len(want) == 5
    assert queued == len(urls) - len(want)


def test_an_empty_delivery_is_acknowledged(tmp_path):
    async def go():
        p = Parts(str(tmp_path))
        acks = []
        p.seen.ack = lambda: acks.append(1)
        try:
            p.intake.on_seen_results([])
            return acks, p.frontier.queued()
        finally:
            await p.close()

    assert run(go()) == ([1], 0)


def _budgets(path: str):
    from crawlerd.frontier.budgets import Budgets
    return Budgets(path, base_budget=2, per_inlink=2, max_budget=100, map_size_bytes=1 << 24, edge_buckets=2,
                   edge_merge_bytes=1 << 20, edge_cache_entries=1 << 10, sync=False)


def test_a_large_readmission_is_queued_in_slices_each_committed_in_one_iteration(tmp_path):
    """budgets.readmit_batch deferred URLs pass READMIT_SLICE per loop iteration: each slice is read,
    queued and committed (frontier, then budgets) in one callback, a step meanwhile starts no
    second readmission, and every URL passed is queued once."""
    from crawlerd.shard.intake import READMIT_SLICE

    batch = 4 * READMIT_SLICE + 50

    async def go():
        p = Parts(str(tmp_path), f"budgets.readmit_batch={batch}")
        b = _budgets(str(tmp_path / "budgets"))
        p.intake.budgets = b
        loop = asyncio.get_running_loop()
        p.seen.start(loop, p.intake.on_seen_results)
        try:
            n = 3000
            p.intake.submit_urls([f"http://h{i % 40}.test/p{i}" for i in range(n)], depth=1)
            await p.seen.flush()
            before = (p.frontier.queued(), b.beast.waiting)
            ticks, events = [0], []

            def tick():                         # runs once per loop iteration
                ticks[0] += 1
                loop.call_soon(tick)
            tick()
            real_add, real_commit = p.frontier.add, b.commit

            def add(items, **kw):
                events.append(("add", len(items), ticks[0]))
                return real_add(items, **kw)

            def commit(then=None):
                events.append(("commit", 0, ticks[0]))
                real_commit(then)

            p.frontier.add, b.commit = add, commit
            p.intake.free_slots = lambda: 100       # the fetcher would idle: the reader moves on
            now = p.clock() + 10.0
            p.intake.step_budgets(now)
            await asyncio.sleep(0)
            p.intake.step_budgets(now + 1.0)        # a step while the readmission is under way
            for _ in range(20):
                await asyncio.sleep(0)
            return n, before, events, p.frontier.queued(), b.beast.waiting, dict(p.metrics.counters)
        finally:
            await p.close()
            b.store.close()

    n, before, events, queued, waiting, counters = run(go())
    assert before == (80, n - 80)
    slices = [(events[i], events[i + 1]) for i in range(0, len(events), 2)]
    assert [e[0] for pair in slices for e in pair] == ["add", "commit"] * len(slices)
    sizes = [a[1] for a, _ in slices]
    assert sizes == [READMIT_SLICE] * 4 + [50]
    assert all(a[2] == c[2] for a, c in slices)                 # queued and committed in one callback
    assert len({a[2] for a, _ in slices}) == len(slices)        # each slice in an iteration of its own
    assert counters["budget_readmitted"] == batch
    assert queued == 80 + batch and waiting == n - 80 - batch   # nothing lost, nothing twice


READMIT_KILLED_CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from tests.shard.parts import Parts
    from tests.shard.test_intake import _budgets

    async def main():
        p = Parts({data!r}, "budgets.readmit_batch={batch}")
        b = _budgets({budgets!r})
        p.intake.budgets = b
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        p.intake.submit_urls([f"http://h{{i % 40}}.test/p{{i}}" for i in range({n})], depth=1)
        await p.seen.flush()
        real_commit, commits = b.commit, []

        def commit(then=None):
            commits.append(1)
            if len(commits) == 2:               # the second slice is queued, its pass not committed
                print("readmitting", flush=True)
                sys.stdin.read()
            real_commit(then)

        b.commit = commit
        p.intake.free_slots = lambda: 100
        p.intake.step_budgets(p.clock() + 10.0)
        for _ in range(100):
            await asyncio.sleep(0.01)
        print("readmitted", flush=True)         # no second slice came

    asyncio.run(main())
""")


def test_kill_9_in_the_middle_of_a_sliced_readmission_loses_no_url(tmp_path):
    """Killed between a slice's frontier commit and its budget commit: the slices before stay
    readmitted once, the interrupted one is queued and still waits (readmitted twice, never lost)."""
    from crawlerd.shard.intake import READMIT_SLICE

    n, batch = 3000, 4 * READMIT_SLICE
    data, budgets = str(tmp_path / "data"), str(tmp_path / "data" / "budgets")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = READMIT_KILLED_CHILD.format(root=root, data=data, budgets=budgets, n=n, batch=batch)
    assert first_line_then_kill_9(code) == b"readmitting\n"

    async def go():
        p = Parts(data, f"budgets.readmit_batch={batch}")
        b = _budgets(budgets)
        p.intake.budgets = b
        try:
            before = (p.frontier.queued(), b.beast.waiting)
            p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
            await p.seen.flush()
            p.intake.free_slots = lambda: 100
            p.intake.step_budgets(p.clock() + 10.0)
            for _ in range(20):
                await asyncio.sleep(0)
            return before, p.frontier.queued(), b.beast.waiting
        finally:
            await p.close()
            b.store.close()

    before, queued, waiting = run(go())
    # the first slice once, the second queued and still waiting; nothing else moved
    assert before == (80 + 2 * READMIT_SLICE, n - 80 - READMIT_SLICE)
    # the restarted readmission passes the interrupted slice again: n URLs and that slice twice
    assert queued + waiting == n + READMIT_SLICE
    assert queued == 80 + 2 * READMIT_SLICE + batch


def test_robots_at_admission_across_host_runs_broken_by_duplicates_and_redeliveries(tmp_path):
    """A ruled host's URLs come in runs that duplicates and answers already added (before the seen
    mark) of other hosts split or join: every unique URL is judged by its own host's rules, in
    order (the denials' events in answer order), and the rest are queued once."""

    ruled, free = "http://ruled.test", "http://free.test"
    robots = _robots(ruled, b"User-agent: *\nDisallow: /private/\n")
    rows = []       # (url, unique)
    for i in range(40):
        host = (ruled, free, ruled, ruled)[i % 4]
        rows.append((f"{host}/{'private' if i % 3 else 'p'}/{i}.html", i % 5 != 2))
        if i % 7 == 0:
            rows.append((f"{free}/private/dup{i}.html", False))       # a duplicate between runs
    results = _answers(rows)
    dropped = []

    async def go():
        p = Parts(str(tmp_path))
        intake = _robots_intake(p, robots, dropped)
        try:
            intake.on_seen_results(results)
            intake.on_seen_results(results[: len(results) // 2])          # delivered again: all before the mark
            return p.frontier.queued(), dict(p.metrics.counters)
        finally:
            await p.close()

    queued, counters = run(go())
    unique = [url for url, u in rows if u]
    want = [url for url in unique if url.startswith(ruled + "/private/")]
    assert dropped == want and want
    assert queued == len(unique) - len(want)
    assert counters["seen_duplicate"] == len(rows) - len(unique)
    assert counters["seen_redelivered"] == len(results) // 2
