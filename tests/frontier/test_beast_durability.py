"""BEAST across crashes and reopens: kill -9 (with and without the writer thread), a plain model through
reopens, and the host-turn read cache on a writer store."""

import collections
import os
import random
import textwrap
import threading

import pytest

from tests.frontier.budget_parts import Landing, Parts, drain
from tests.kill9 import first_line_then_kill_9

# -- crash safety ----------------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    from frontier.budget_parts import Parts
    p = Parts({path!r})
    for d in range(10):
        p.offer(f"d{{d}}.com", [f"d{{d}}/{{i}}".encode() for i in range(30)])
    p.store.commit()
    with open({queued!r}, "ab") as q:
        for commit in (True, False):
            got = p.beast.readmit(6, advance=True)
            q.write(b"".join(r + b"\\n" for r in got))
            q.flush()
            os.fsync(q.fileno())
            if commit:
                p.store.commit()
    for d in range(5):
        p.edges.add(f"late{{d}}.org", ["d9.com"])        # returned: in the DRUM journal
    p.graph.add_root("late0.org")
    print("ready", flush=True)
    sys.stdin.read()
""")


def test_kill_9_loses_no_deferred_record(tmp_path):
    path, queued = str(tmp_path / "b"), str(tmp_path / "queued")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = CHILD.format(tests=tests, path=path, queued=queued)
    assert first_line_then_kill_9(code) == b"ready\n"
    offered = {f"d{d}/{i}".encode() for d in range(10) for i in range(30)}
    admitted = {f"d{d}/{i}".encode() for d in range(10) for i in range(2)}
    with open(queued, "rb") as f:
        queued_recs = f.read().split(b"\n")[:-1]
    assert len(queued_recs) == 12
    p = Parts(path)
    p.check()
    rest = drain(p.beast)
    assert admitted | set(queued_recs) | set(rest) == offered
    assert len(rest) == len(offered - admitted) - 6          # the 6 committed ones are gone, the rest came back
    assert len(set(queued_recs) & set(rest)) == 6            # the 6 uncommitted ones come twice
    p.graph.add_root("late0.org")
    p.edges.flush()
    assert p.graph.indegree("d9.com") == 1                   # the root's link counts; the others cannot vouch
    p.close()


CHILD_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from frontier.budget_parts import Landing, Parts
    landing = Landing()
    p = Parts({path!r}, landing=landing)
    for d in range(10):
        p.offer(f"d{{d}}.com", [f"d{{d}}/{{i}}".encode() for i in range(30)])
    p.store.commit()
    landing.land(p.store)                   # landed: what a then would acknowledge
    landing.writer.hold()                   # the next commit is handed over and never written
    got = p.beast.readmit(6, advance=True)
    p.store.commit()
    print("ready", len(got), flush=True)
    sys.stdin.read()
""")


def test_kill_9_with_a_writer_keeps_what_landed_and_returns_what_did_not(tmp_path):
    """A commit handed to the writer is promised once it landed: kill -9 keeps every deferral that
    landed, and readmissions whose commit had not landed are handed out again (twice, never lost)."""
    path = str(tmp_path / "b")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert first_line_then_kill_9(CHILD_WRITER.format(tests=tests, path=path)) == b"ready 6\n"
    p = Parts(path)
    p.check()
    rest = drain(p.beast)
    offered = {f"d{d}/{i}".encode() for d in range(10) for i in range(30)}
    admitted = {f"d{d}/{i}".encode() for d in range(10) for i in range(2)}
    assert len(rest) == len(offered - admitted) and set(rest) == offered - admitted
    p.close()


# -- against a plain model -------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("writer", [False, True])
def test_matches_a_plain_model_through_reopens(tmp_path, seed, writer):
    """With ``writer`` the store commits on a writer thread whose commits land at random moments:
    the loop reads its own writes through the overlay until they do, and begins no write transaction."""
    rng = random.Random(seed)
    path = tmp_path / "b"
    landing = Landing() if writer else None
    lands = random.Random(seed)             # when commits land: the same operations with or without

    def reopen():
        return Parts(path, mode="all", cache=5, queues=3, max_spread=1, landing=landing)

    p = reopen()      # max_spread 1: a pass every queue
    writers: set[int] = set()
    doms = [f"d{i}.com" for i in range(12)]
    inlinks = collections.defaultdict(set)
    spent = collections.Counter()
    deferred = collections.defaultdict(collections.deque)
    pending = []
    serial = 0

    def budget(d):
        return min(50, 2 + 3 * len(inlinks[d]))

    for step in range(600):
        op = rng.random()
        if op < 0.5:
            d = rng.choice(doms)
            serial += 1
            rec = f"{d}#{serial}".encode()
            ok = not deferred[d] and spent[d] < budget(d)
            assert p.beast.offer(d, rec) == ok, (step, d)
            if ok:
                spent[d] += 1
            else:
                deferred[d].append(rec)
        elif op < 0.65:
            src = f"s{rng.randrange(20)}.org"
            tgts = rng.sample(doms, 3)
            p.edges.add(src, tgts)
            pending.extend((src, t) for t in tgts)
        elif op < 0.7:
            p.edges.flush()                        # edges count once the DRUM has answered them
            for src, t in pending:
                inlinks[t].add(src)
            pending.clear()
        elif op < 0.85:
            advance = rng.random() < 0.5
            got = p.beast.readmit(10_000, advance=advance)
            if advance and any(deferred.values()):
                spent.clear()                      # the reader moved to the next queue
            want = []
            for d in doms:
                n = min(budget(d) - spent[d], len(deferred[d]))
                if n > 0:
                    spent[d] += n
                    want.extend(deferred[d].popleft() for _ in range(n))
            assert sorted(got) == sorted(want), step
            p.store.commit()
            if landing is not None and lands.random() < 0.3:
                landing.land(p.store)              # else the commits pile up in the overlay
        elif op < 0.9:
            if landing is not None:
                writers |= p.env.write_threads
            p.close()
            p = reopen()
        else:
            p.check()
    p.edges.flush()
    for src, t in pending:
        inlinks[t].add(src)
    p.check()
    for d in doms:
        assert p.beast.domain(d)["deferred"] == len(deferred[d])
        assert p.graph.indegree(d) == len(inlinks[d])
    if landing is not None:
        p.close()
        writers |= p.env.write_threads
        landing.close()
        assert writers and threading.get_ident() not in writers     # only the writer thread wrote
        return
    p.close()


# -- the host-turn read cache ----------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_with_a_read_cache_on_a_writer_beast_hands_out_exactly_what_a_plain_one_does(tmp_path, seed):
    """The same offers over many hosts of a few domains on a plain store and on one whose commits land
    on a writer at random moments, reading host turns through a read cache of a few hundred bytes
    (it evicts): the same decisions, the same readmissions in the same order (host turns decide it),
    through reopens; the cache stays within its bytes and answers reads."""
    rng = random.Random(seed)
    landing = Landing()
    lands = random.Random(seed + 100)

    def both():
        return (Parts(tmp_path / "plain", queues=3, max_spread=4),
                Parts(tmp_path / "cached", queues=3, max_spread=4, landing=landing, read_cache_bytes=700))

    plain, cached = both()
    doms = [f"d{i}.com" for i in range(4)]
    hits = evictions = 0
    for step in range(1500):
        op = rng.random()
        if op < 0.6:
            d = rng.choice(doms)
            host = f"h{rng.randrange(6)}.{d}"
            rec = f"{host}/{step}".encode()
            assert plain.beast.offer(d, rec, step, host) == cached.beast.offer(d, rec, step, host), step
        elif op < 0.8:
            advance = rng.random() < 0.5
            assert plain.beast.readmit(7, advance=advance) == cached.beast.readmit(7, advance=advance), step
            plain.store.commit()
            cached.store.commit()
        elif op < 0.95:
            plain.store.commit()
            cached.store.commit()
            if lands.random() < 0.5:
                landing.land(cached.store)
        else:
            mem = cached.store.overlay.cache_memory()
            assert mem["bytes"] <= mem["cap_bytes"] == 700
            hits += cached.store.overlay.cache_hits
            evictions += mem["evictions"]
            plain.close()
            cached.close()
            plain, cached = both()
    mem = cached.store.overlay.cache_memory()
    assert mem["bytes"] <= mem["cap_bytes"] == 700
    hits += cached.store.overlay.cache_hits
    assert hits > 0 and evictions + mem["evictions"] > 0
    assert drain(plain.beast) == drain(cached.beast)
    plain.check()
    cached.check()
    plain.close()
    cached.close()
    plain, cached = both()                  # reopened: the same state on disk
    assert drain(plain.beast) == drain(cached.beast) == []
    plain.close()
    cached.close()
    landing.close()
