"""BEAST's reader (crawlerd.frontier.budgets.reader): passes per queue in order, geometric spreading,
the domains due now merged into the reader's queue (across a close, forgotten by a crash), refunds."""

import shutil

import pytest

from tests.frontier.budget_parts import Landing, Parts, drain

# -- the reader's walk -----------------------------------------------------------------------------

def test_a_domain_passes_its_budget_per_queue_and_the_rest_waits_in_order(parts):
    b = parts.beast
    recs = [f"r{i}".encode() for i in range(9)]
    assert parts.offer("x.com", recs) == recs[:2]
    assert b.readmit(100) == []                          # the reader stays: nothing more this queue
    assert b.readmit(100, advance=True) == recs[2:]      # queues 1, 2, 3, 4 ...: two each, in order
    assert b.reader > 0
    parts.check()


def test_new_urls_wait_behind_deferred_ones_and_a_new_queue_takes_them_first(parts):
    b = parts.beast
    parts.offer("x.com", [b"a0", b"a1", b"a2"])
    assert not b.offer("x.com", b"new")                  # FIFO: behind a2
    assert b.readmit(2, advance=True) == [b"a2", b"new"]


def test_spam_is_spread_geometrically_never_dropped(tmp_path):
    p = Parts(tmp_path / "b", queues=4, max_spread=1 << 20)
    b = p.beast
    p.offer("spam.com", [f"s{i}".encode() for i in range(2000)])
    passes = []                                          # queue of each pass of spam.com
    while True:
        got = b.readmit(2, advance=True)                 # one pass per call: its budget is 2
        if not got:
            break
        passes.append((b.reader, len(got)))
    gaps = [q2 - q1 for (q1, _), (q2, _) in zip(passes, passes[1:], strict=False)]
    assert sum(n for _, n in passes) == 2000 - 2         # every URL passed, two per queue
    assert all(n == 2 for _, n in passes)
    assert gaps[:3] == [1, 1, 1] and max(gaps) >= 256     # one queue apart at first, then further and further
    assert gaps == sorted(gaps)
    p.check()
    p.close()


def test_a_fresh_domain_passes_every_queue_while_spam_waits_longer(tmp_path):
    p = Parts(tmp_path / "b", queues=2)
    b = p.beast
    p.offer("spam.com", [f"s{i}".encode() for i in range(5000)])
    for _ in range(200):                                 # long enough for several wrap-arounds
        b.readmit(2, advance=True)
    p.offer("fresh.org", [f"f{i}".encode() for i in range(40)])
    got = []
    for _ in range(20):
        got += b.readmit(2, advance=True)
    spam = sum(r.startswith(b"s") for r in got)
    assert sum(r.startswith(b"f") for r in got) >= 10 * max(spam, 1)
    p.close()


# -- due now: a rise in in-degree, a refund --------------------------------------------------------

def test_a_rising_in_degree_lets_a_waiting_domain_pass_at_once(parts):
    b = parts.beast
    parts.offer("x.com", [f"r{i}".encode() for i in range(20)])
    parts.edges.add("a.org", ["x.com"])
    parts.edges.flush()                                  # budget 2 + 3 = 5: three more in this queue
    assert b.readmit(100) == [b"r2", b"r3", b"r4"]
    assert b.domain("x.com")["spent"] == 5
    parts.check()


def test_domains_due_now_pass_merged_with_the_readers_queue_in_domain_order(parts):
    """Domains whose in-degree rose while listed in a later queue are due now (in RAM, their queue
    entry kept): the reader's queue hands out its listed domains and the due ones merged in domain
    key order, as one table would, across calls that stop mid-domain; passing them writes no
    queue entry beyond moving those listed in the reader's queue."""
    b = parts.beast
    for d in "abcdef":
        parts.offer(f"{d}.com", [f"{d}{i}".encode() for i in range(10)])
    assert b.readmit(2, advance=True) == [b"a2", b"a3"]      # the reader on queue 1; a.com now listed in 2
    for d in ("bb", "zz"):                                   # new while the reader stands on 1: listed in 2
        assert parts.offer(f"{d}.com", [f"{d}{i}".encode() for i in range(10)]) == [f"{d}0".encode(), f"{d}1".encode()]
    parts.edges.add("s.org", ["a.com", "bb.com", "zz.com"])
    parts.edges.flush()                                      # budget 5: three more each in queue 1
    assert b.domain("bb.com")["queue"] == b.reader == 1
    got = []
    for _ in range(100):
        got += b.readmit(1)
    assert got == [b"a4", b"a5", b"a6", b"b2", b"b3", b"bb2", b"bb3", b"bb4", b"c2", b"c3", b"d2", b"d3",
                   b"e2", b"e3", b"f2", b"f3", b"zz2", b"zz3", b"zz4"]
    assert all(b.domain(f"{d}.com")["queue"] == 2 for d in ("a", "b", "bb", "c", "zz"))
    parts.check()


@pytest.mark.parametrize("writer", [False, True])
def test_one_long_walk_passes_what_one_walk_per_domain_does(tmp_path, writer):
    """A readmission that walks a long queue (its entries read a batch at a time) with due domains
    merged in hands out the URLs, in the same order, that walks stopped after every URL do (each
    starts from the table again), on a plain store and on one whose commits wait on a writer."""
    landings = [Landing() if writer else None for _ in range(2)]
    one, many = (Parts(tmp_path / name, mode="all", landing=la) for name, la in zip(("one", "many"), landings, strict=True))
    for q in (one, many):
        for i in range(60):
            q.offer(f"d{i:02}.com", [f"d{i:02}/{k}".encode() for k in range(12)])
        assert len(q.beast.readmit(5, advance=True)) == 5     # the reader on queue 1, d02.com half passed
        for name in ("d15b", "e1", "e0"):                      # new while it stands there: listed in 2
            q.offer(f"{name}.com", [f"{name}/{k}".encode() for k in range(12)])
        q.edges.add("s.org", ["d00.com", "d01.com", "d15b.com", "d40.com", "e0.com", "e1.com"])
        q.edges.flush()                                       # those listed in 2 are due now; d40 has more room
    got = one.beast.readmit(10_000)
    want = []
    while part := many.beast.readmit(1):
        want += part
    assert got == want
    assert len(got) > 120 and got.index(b"d15b/2") == got.index(b"d15/3") + 1 and got[-1] == b"e1/4"
    assert drain(one.beast) == drain(many.beast)
    for q in (one, many):
        q.check()
        q.close()
    for la in landings:
        if la is not None:
            la.close()


def test_a_due_domain_is_kept_across_a_close(tmp_path):
    p = Parts(tmp_path / "b", mode="all")
    p.offer("x.com", [f"r{i}".encode() for i in range(20)])
    p.edges.add("a.org", ["x.com"])
    p.edges.flush()                                          # due now: three more in this queue
    p.close()
    p = Parts(tmp_path / "b", mode="all")
    assert p.beast.readmit(100) == [b"r2", b"r3", b"r4"]
    p.check()
    p.close()


def test_a_crash_forgets_a_due_domain_which_passes_in_its_own_queue(tmp_path):
    """The state a kill -9 leaves (the last commit, copied aside while the store is open): a domain
    due now is forgotten as such, so it passes in the queue it is listed in, not at once; every
    deferred URL comes back and the tables agree."""
    p = Parts(tmp_path / "b", mode="all")
    p.offer("x.com", [f"r{i}".encode() for i in range(20)])
    p.edges.add("a.org", ["x.com"])
    p.edges.flush()
    p.store.commit()
    assert p.beast.domain("x.com")["queue"] == 0
    shutil.copytree(tmp_path / "b", tmp_path / "crashed")    # what a kill -9 here leaves
    p.close()
    c = Parts(tmp_path / "crashed", mode="all")
    c.check()
    assert c.beast.domain("x.com")["queue"] == 1 and c.beast.readmit(100) == []
    assert c.beast.readmit(5, advance=True) == [f"r{i}".encode() for i in range(2, 7)]   # budget 5, in queue 1
    assert c.beast.reader == 1
    assert sorted(drain(c.beast)) == sorted(f"r{i}".encode() for i in range(7, 20))
    c.check()
    c.close()


def test_a_refund_lets_the_domain_pass_another_url_in_this_queue(parts):
    b = parts.beast
    parts.offer("x.com", [b"a", b"b", b"c", b"d"])
    assert b.refund("x.com") == 1
    assert b.readmit(100) == [b"c"]
    b.readmit(100, advance=True)
    assert b.refund("other.com") == 0
    parts.check()


def test_a_close_changes_nothing_the_reader_does(tmp_path):
    """Two stores fed the same offers and passes, one closed and reopened past a few wrap-arounds:
    the reader's place, its window and moves, and every later pass are the same."""
    twin, p = (Parts(tmp_path / name, mode="all", queues=2) for name in ("twin", "reopened"))
    for q in (twin, p):
        q.offer("x.com", [f"x{i}".encode() for i in range(60)])
        q.offer("y.com", [f"y{i}".encode() for i in range(9)])
        for _ in range(8):
            q.beast.readmit(2, advance=True)
    p.close()
    p = Parts(tmp_path / "reopened", mode="all", queues=2)
    keys = ("reader_queue", "window_end", "window", "wraps", "advances", "passes", "readmitted")
    assert {k: p.beast.stats()[k] for k in keys} == {k: twin.beast.stats()[k] for k in keys}
    assert twin.beast.stats()["wraps"] >= 2
    assert [p.beast.readmit(2, advance=True) for _ in range(40)] == \
        [twin.beast.readmit(2, advance=True) for _ in range(40)]
    p.check()
    twin.check()
    p.close()
    twin.close()
