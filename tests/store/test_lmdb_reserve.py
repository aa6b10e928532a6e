"""Dirty-page buffers reserved at open: later transactions that change fewer pages take no new C heap,
and the reservation leaves the store as it was."""

import asyncio
import ctypes
import functools
import random

import lmdb
import pytest

from crawlerd.store.lmdb_reserve import WriteBudget, reserve_write_buffers
from crawlerd.store.overlay import Overlay
from crawlerd.store.writer import WriteThread


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use():
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        pytest.skip("needs glibc 2.33+ (mallinfo2)")
    fn.restype = _MallInfo2
    return lambda: fn().uordblks


def _open(path):
    return lmdb.open(str(path), map_size=1 << 30, max_dbs=2, sync=False, metasync=False, meminit=False)


def _budgeted(path, nbytes=1 << 20):
    """A store with one table ``t`` and a WriteBudget of ``nbytes`` reserved."""
    env = _open(path)
    budget = WriteBudget(env, nbytes)
    db = env.open_db(b"t")
    budget.dbs = (db,)
    return env, budget, db


def _grow(env, db, rng, txns=60, puts=400):
    """Random puts into a growing B-tree: each transaction changes more distinct pages than the last."""
    for _ in range(txns):
        with env.begin(write=True) as txn:
            for _ in range(puts):
                txn.put(rng.randbytes(16), rng.randbytes(90), db=db)


@pytest.mark.parametrize("reserve", [0, 4 << 20])
def test_reserved_buffers_absorb_the_climb(tmp_path, reserve):
    used = _heap_in_use()
    env = _open(tmp_path / "e")
    before = used()
    pages = reserve_write_buffers(env, reserve)
    assert pages == reserve // env.stat()["psize"]
    assert used() - before >= reserve * 0.9          # the buffers are held, not given back
    db = env.open_db(b"t")
    start = used()
    _grow(env, db, random.Random(7))
    climb = used() - start
    if reserve:
        assert climb < 256 << 10, climb               # every transaction fit in the reserved buffers
    else:
        assert climb > 1 << 20, climb                 # without them the buffers climb with the tree
    env.close()


def test_reservation_writes_nothing(tmp_path):
    env = _open(tmp_path / "e")
    db = env.open_db(b"t")
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v", db=db)
    info = env.info()
    reserve_write_buffers(env, 1 << 20)
    assert env.info()["last_txnid"] == info["last_txnid"]      # aborted: no commit
    with env.begin() as txn:
        assert [k for k, _ in txn.cursor()] == [b"t"]           # the main DB holds only the named DB
        assert txn.get(b"k", db=db) == b"v"
    env.close()
    env = _open(tmp_path / "e")
    with env.begin() as txn:
        assert [k for k, _ in txn.cursor()] == [b"t"]
    env.close()


def test_nothing_to_reserve(tmp_path):
    env = _open(tmp_path / "e")
    assert reserve_write_buffers(env, 0) == 0
    assert reserve_write_buffers(env, 100) == 0
    env.close()


@pytest.mark.parametrize("bounded", [True, False])
def test_write_budget_keeps_transactions_within_the_reservation(tmp_path, bounded):
    # the same random puts, committed every 1,500 puts (a busy store's commit interval), or also
    # whenever the budget is full: only the latter keeps LMDB's buffers to the reserved pages
    used = _heap_in_use()
    env, budget, db = _budgeted(tmp_path / "e")
    assert budget.pages == 256 and budget.limit == 224 and not budget.full
    rng = random.Random(3)
    start, n, commits = used(), 0, 0
    txn = env.begin(write=True)
    for i in range(60_000):
        txn.put(rng.randbytes(16), rng.randbytes(90), db=db)
        budget.spend(1)
        n += 1
        if (i + 1) % 1500 == 0 or (bounded and budget.full):
            txn.commit()
            budget.committed()
            commits += 1
            txn = env.begin(write=True)
    txn.commit()
    climb = used() - start
    with env.begin() as t:
        assert t.stat(db)["entries"] == n
        assert t.stat(db)["depth"] >= 3
    if bounded:
        assert budget.per_write >= 4                  # charged by the tree's depth (3 or more) + 1
        assert climb < 256 << 10, climb               # no buffer beyond the reserved ones
        assert commits > 60_000 // 1500
    else:
        assert climb > 1 << 20, climb                 # larger transactions take more buffers
    env.close()


def test_nothing_reserved_is_no_bound(tmp_path):
    env = _open(tmp_path / "e")
    budget = WriteBudget(env, 0)
    budget.spend(1 << 30)
    assert not budget.full
    budget.committed()
    env.close()


def _fill(env, db, rng) -> None:
    """A tree of depth 3 (random puts land on many leaves), in sorted batches: each changes a few
    pages only."""
    for _ in range(50):
        with env.begin(write=True) as txn:
            txn.cursor(db=db).putmulti(sorted((rng.randbytes(16), rng.randbytes(90)) for _ in range(2000)))


async def _land_held_layers(w, ov, db, rng, keys, per_layer, used):
    """60 layers of ``per_layer`` random puts (their keys appended to ``keys``) committed while the
    writer is held, then released and landed as one group: (the layers in landing order, the heap
    in use when the writer was released)."""
    landed = []
    w.hold()
    for layer in range(60):
        for _ in range(per_layer):
            k = rng.randbytes(16)
            keys.append(k)
            ov.put(k, rng.randbytes(90), db=db)
        ov.commit(lambda i=layer: landed.append(i))
    start = used()
    done = asyncio.get_running_loop().create_future()
    w.release()
    ov.barrier(lambda: done.set_result(None))
    await done
    return landed, start


@pytest.mark.parametrize("bounded", [True, False])
def test_a_writer_group_of_layers_commits_within_the_reservation(tmp_path, bounded):
    # layers handed over while the writer thread is held land as one group: with the store's budget
    # the writer commits them in as many transactions as the reserved pages allow, in order, each
    # a whole layer; without it, in one transaction whose buffers outgrow the reservation
    used = _heap_in_use()
    env, budget, db = _budgeted(tmp_path / "e")
    rng = random.Random(5)
    _fill(env, db, rng)
    budget.committed()
    keys = []

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer")
        ov = Overlay(env, w, budget if bounded else None)
        landed, start = await _land_held_layers(w, ov, db, rng, keys, 50, used)
        w.close()
        return landed, ov.stats()["txns"], used() - start

    landed, txns, climb = asyncio.run(go())
    assert landed == list(range(60))
    with env.begin() as t:
        assert all(t.get(k, db=db) is not None for k in keys)
    if bounded:
        assert txns >= 60 * 50 * 4 // budget.limit      # charged depth + 1 per put, within 7/8 of the pages
        assert climb < 256 << 10, climb
    else:
        assert txns == 1
        assert climb > 1 << 20, climb
    env.close()


@pytest.mark.parametrize("bounded", [True, False], ids=["budget", "none"])
def test_a_writer_group_of_digests_commits_within_the_reservation(tmp_path, bounded):
    # the digest set's writer-thread groups (every digest handed over while the writer was busy)
    # are split into transactions within its reserved page buffers: a group of 2,000 random
    # digests (most on a leaf of their own) adds no buffers; without a reservation it is one
    # transaction whose ~1,500 page buffers LMDB keeps until the set closes
    from crawlerd.store.digest_set import DigestSet
    used = _heap_in_use()
    rng = random.Random(9)
    ds = DigestSet(tmp_path / "d", map_size_bytes=1 << 30, write_buffer_bytes=(1 << 20) if bounded else 0)
    for _ in range(1000):           # ~2,500 leaves, in transactions of 100 digests (~100 pages each)
        ds.add_many([(rng.randbytes(20), "http://a.example/", "2026-01-01T00:00:00Z") for _ in range(100)])
    digests = [rng.randbytes(20) for _ in range(2000)]

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer")
        ds.attach_writer(w)
        w.hold()
        assert all(ds.add_many([(d, f"http://b.example/{i}", "2026-01-01T00:00:00Z") for i, d in enumerate(digests)]))
        start = used()
        w.release()
        w.close()                   # writes the group, then stops
        ds.attach_writer(None)
        return used() - start

    climb = asyncio.run(go())
    assert all(ds.get(d) is not None for d in digests)
    ds.close()
    if bounded:
        assert climb < 256 << 10, climb
    else:
        assert climb > 4 << 20, climb



def test_while_an_overlay_writes_the_store_its_budget_takes_the_depth_the_writer_read(tmp_path):
    # the loop's budget reads no table stats while an overlay is attached: its charge follows the
    # writer's reading, which sees the tree deepen; detached, the budget reads it again itself
    env, budget, db = _budgeted(tmp_path / "e", nbytes=4 << 20)
    budget.committed()
    assert budget.per_write == 2                        # an empty table: depth 1
    rng = random.Random(11)

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer")
        ov = Overlay(env, w, budget)
        assert budget.source is ov
        budget.env = None                               # any read of its own would fail
        seen = []
        for _ in range(40):
            for _ in range(500):
                ov.put(rng.randbytes(16), rng.randbytes(90), db=db)
            done = asyncio.get_running_loop().create_future()
            ov.commit(functools.partial(done.set_result, None))
            budget.committed()
            await done
            seen.append(budget.per_write)
        w.close()
        ov.close()
        budget.env = env
        return seen

    seen = asyncio.run(go())
    with env.begin() as t:
        depth = t.stat(db)["depth"]
    assert depth >= 3
    assert seen == sorted(seen) and seen[-1] >= depth    # the writer's figure, one commit behind at most
    assert budget.source is None
    budget.committed()
    assert budget.per_write == depth + 1
    env.close()


def test_a_writer_group_on_a_deep_table_shares_its_branch_pages_and_stays_within_the_reservation(tmp_path):
    # layers of random puts into a tree of depth 3: charged depth + 1 a put, two layers would fill
    # a transaction; charged a leaf and a split page a put plus the table's branch pages once, about
    # twice as many fit, and the buffers still stay within the reserved pages; the budget's loop
    # side takes the depth the writer read while the overlay is attached, and reads it again after
    used = _heap_in_use()
    env, budget, db = _budgeted(tmp_path / "e")
    rng = random.Random(11)
    _fill(env, db, rng)
    budget.committed()
    with env.begin() as t:
        st = t.stat(db)
    assert st["depth"] == 3 and st["branch_pages"] < 60 and budget.per_write == 4
    per_layer = 20
    depth_charged = budget.limit // (per_layer * budget.per_write)     # layers a transaction held before
    keys = []

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer")
        ov = Overlay(env, w, budget)
        assert budget.source is ov
        landed, start = await _land_held_layers(w, ov, db, rng, keys, per_layer, used)
        budget.committed()
        per_write = budget.per_write
        w.close()
        ov.close()
        return landed, ov.stats()["txns"], used() - start, per_write

    landed, txns, climb, per_write = asyncio.run(go())
    assert landed == list(range(60))
    with env.begin() as t:
        assert all(t.get(k, db=db) is not None for k in keys)
    assert per_write == 4
    assert txns <= 60 // (2 * depth_charged) + 1, (txns, depth_charged)
    assert climb < 256 << 10, climb
    assert budget.source is None
    budget.committed()
    assert budget.per_write == 4
    env.close()
