"""The queue heads a lease pops from (``frontier/heads.py``): with a writer attached, ``pop_head``
answers from the first entries cached per (host, level) queue, and every write to the queues
table keeps them exact, so the store answers exactly as one that reads its own LMDB cursor."""

import asyncio
import random

import pytest

from crawlerd.frontier.heads import QueueHeads
from crawlerd.frontier.items import hprefix, qkey, qprefix
from crawlerd.frontier.queues import FrontierStore
from crawlerd.store.writer import WriteThread

HIDS = range(1, 7)
LEVELS = 3


def store(path) -> FrontierStore:
    return FrontierStore(str(path), map_size_bytes=1 << 26, sync=False)


def queued(st: FrontierStore) -> list[tuple[bytes, bytes]]:
    """Every queue entry as the store's loop reads it."""
    cur = st.qcursor()
    return list(cur) if cur.first() else []


async def run(tmp_path, seed: int, heads: QueueHeads, steps: int) -> QueueHeads:
    """The same random operations on a store with its own transaction (the plain cursor) and on one
    written on a held-back-at-random writer thread (the heads): the same answers at every step and
    the same queues throughout."""
    rng = random.Random(seed)
    plain, threaded = store(tmp_path / "plain"), store(tmp_path / "threaded")
    writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.0005)
    threaded.attach_writer(writer)
    threaded.heads = heads
    both = (plain, threaded)
    seq = 0
    popped: list[tuple[bytes, bytes]] = []
    held = False
    for i in range(steps):
        op = rng.random()
        if op < 0.25:                            # an add: new keys, after every key queued so far
            items = []
            for _ in range(rng.randrange(1, 12)):
                seq += 1
                items.append((qkey(rng.choice(HIDS), rng.randrange(LEVELS), seq), b"u%d" % seq))
            for st in both:
                st.put_sorted(list(items))
        elif op < 0.6:
            p = qprefix(rng.choice(HIDS), rng.randrange(LEVELS))
            got = [st.pop_head(p) for st in both]
            assert got[0] == got[1], (i, p)
            if got[0] is not None and rng.random() < 0.5:
                popped.append(got[0][:2])
        elif op < 0.7 and popped:                # a URL back in its queue (before its head), or retried
            key, value = popped.pop(rng.randrange(len(popped)))
            value = value + b"!" if rng.random() < 0.5 else value
            for st in both:
                st.put_queued(key, value)
        elif op < 0.75:                          # a key moved out (present or not)
            key = qkey(rng.choice(HIDS), rng.randrange(LEVELS), rng.randrange(seq + 2))
            for st in both:
                st.delete_queued(key)
        elif op < 0.78:                          # a host's queue taken (a drop)
            h, limit = rng.choice(HIDS), rng.randrange(1, 20)
            got = [st.take_host(hprefix(h), limit) for st in both]
            assert got[0] == got[1], i
        elif op < 0.81:
            h = rng.choice(HIDS)
            assert len({st.level_mask(hprefix(h), LEVELS) for st in both}) == 1, i
        elif op < 0.9:
            for st in both:
                st.commit()
        elif op < 0.95:                          # the writer held back: the loop reads from the overlay
            held = not held
            writer.hold() if held else writer.release()
        else:
            await asyncio.sleep(0.002 * rng.random())      # landings run meanwhile, or not
        if i % 97 == 0:
            assert queued(plain) == queued(threaded), i
            heads.check_invariants()
    writer.release()
    plain.commit()
    done = asyncio.get_running_loop().create_future()
    threaded.commit(lambda: done.set_result(None))
    await done
    assert queued(plain) == queued(threaded)
    threaded.attach_writer(None)
    writer.close()
    with plain.env.begin() as a, threaded.env.begin() as b:
        assert list(a.cursor(db=plain.queues)) == list(b.cursor(db=threaded.queues))
    plain.close()
    threaded.close()
    return heads


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pops_from_the_cached_heads_answer_as_the_plain_cursor_over_random_operations(tmp_path, seed):
    """Adds, pops, put-backs, deletes, takes and commits landing at random moments (the writer held
    back for stretches): the same heads, level masks and queues as a store reading its own cursor,
    with the heads shallow and few (evicted, refilled) and at the defaults."""
    small = asyncio.run(run(tmp_path / "small", seed, QueueHeads(depth=2, cap_bytes=1500), 3000))
    assert small.hits > 100 and small.fills > 100
    full = asyncio.run(run(tmp_path / "full", seed, QueueHeads(), 3000))
    assert full.hits > small.hits


def queue_cost(h: int, n: int, size: int) -> int:
    """The bytes one queue of ``n`` entries of ``size``-byte records is charged."""
    heads = QueueHeads(depth=n)
    heads.fill(qprefix(h, 0), [(qkey(h, 0, s), b"x" * size) for s in range(1, n + 1)], False)
    return heads.memory()["bytes"]


def test_the_heads_hold_at_most_their_byte_cap_and_depth_and_count_what_they_hold():
    heads = QueueHeads(depth=3, cap_bytes=2 * queue_cost(1, 3, 50) + 10)
    for h in (1, 2, 3):
        heads.fill(qprefix(h, 0), [(qkey(h, 0, s), b"x" * 50) for s in (1, 2, 3)], False)
        assert heads.memory()["bytes"] <= heads.cap_bytes
    m = heads.memory()
    assert m["queues"] == 2 and m["entries"] == 6 and 0 < m["bytes"] <= m["cap_bytes"] == heads.cap_bytes
    assert heads.pop(qprefix(1, 0)) is False            # the oldest filled was forgotten
    heads.put(qkey(2, 0, 1), b"y")                      # the same key: replaced, not added
    heads.put(qkey(3, 0, 0), b"z")                      # before the head: in, the last one out
    assert heads.memory()["entries"] == 6
    assert heads.pop(qprefix(3, 0)) == (qkey(3, 0, 0), b"z", True)
    assert heads.pop(qprefix(2, 0)) == (qkey(2, 0, 1), b"y", True)
    heads.clear()
    assert heads.memory()["bytes"] == 0


def test_a_write_that_takes_the_heads_over_their_cap_forgets_the_oldest_filled_queue():
    """The cap holds after every write, not only after a fill: a put or a new URL that grows a
    cached queue past it forgets the queues filled longest ago."""
    heads = QueueHeads(depth=4, cap_bytes=2 * queue_cost(1, 2, 50) + 100)
    heads.fill(qprefix(1, 0), [(qkey(1, 0, s), b"x" * 50) for s in (1, 2)], True)
    heads.fill(qprefix(2, 0), [(qkey(2, 0, s), b"x" * 50) for s in (1, 2)], True)
    assert heads.memory()["queues"] == 2
    heads.put_new([(qkey(2, 0, 3), b"n" * 200)])        # extends queue 2 (known whole) past the cap
    m = heads.memory()
    assert m["bytes"] <= m["cap_bytes"] and m["queues"] == 1
    assert heads.pop(qprefix(1, 0)) is False            # queue 1, filled first, was forgotten
    assert heads.pop(qprefix(2, 0)) == (qkey(2, 0, 1), b"x" * 50, True)
    heads.put(qkey(2, 0, 0), b"p" * 400)                # a put back that alone is over the cap
    assert heads.memory()["bytes"] <= heads.cap_bytes
    assert heads.pop(qprefix(2, 0)) is False            # the only queue forgotten too: read from the store


def test_the_heads_refuse_a_cap_or_depth_below_one():
    with pytest.raises(ValueError):
        QueueHeads(cap_bytes=0)
    with pytest.raises(ValueError):
        QueueHeads(depth=0)


@pytest.mark.parametrize("queues", [3, 600])      # fewer cached queues than level bytes, and more
def test_forgetting_a_host_drops_each_of_its_levels_and_no_other_hosts_queue(queues):
    heads = QueueHeads(depth=2, cap_bytes=1 << 30)
    for h in range(queues):
        for level in (0, 1, 255):
            heads.fill(qprefix(h, level), [(qkey(h, level, 1), b"x")], True)
    before = heads.memory()
    heads.forget(hprefix(1))
    after = heads.memory()
    assert after["queues"] == before["queues"] - 3
    assert before["bytes"] - after["bytes"] == 3 * queue_cost(1, 1, 1)
    for level in (0, 1, 255):
        assert heads.pop(qprefix(1, level)) is False                    # not cached: read from the store
        assert heads.pop(qprefix(2, level)) == (qkey(2, level, 1), b"x", False)


def test_a_put_back_into_a_full_queue_known_whole_pushes_its_last_entry_out_and_it_is_not_whole_any_more():
    """The pushed-out entry is still queued in the store: once the cached ones are popped the
    queue must be read again (False), not reported empty (None)."""
    heads = QueueHeads(depth=2)
    p = qprefix(7, 0)
    heads.fill(p, [(qkey(7, 0, 2), b"b"), (qkey(7, 0, 3), b"c")], True)
    heads.put(qkey(7, 0, 1), b"a")                  # put back before them: (3, c) falls out
    assert [heads.pop(p)[:2] for _ in range(2)] == [(qkey(7, 0, 1), b"a"), (qkey(7, 0, 2), b"b")]
    assert heads.pop(p) is False
    heads.check_invariants()
    small = QueueHeads(depth=3)                     # with room, it stays whole
    small.fill(p, [(qkey(7, 0, 2), b"b")], True)
    small.put(qkey(7, 0, 1), b"a")
    assert [small.pop(p)[:2] for _ in range(2)] == [(qkey(7, 0, 1), b"a"), (qkey(7, 0, 2), b"b")]
    assert small.pop(p) is None
    small.check_invariants()
