"""The overlay reads exactly what a write transaction of the loop's own would hold, whenever its
layers land, and the table ends as the loop wrote it."""

import asyncio
import functools
import random

import lmdb
import pytest

from crawlerd.store.lmdb_reserve import WriteBudget
from crawlerd.store.overlay import Overlay
from crawlerd.store.writer import WriteThread


def _scan(ov, db, start):
    cur = ov.cursor(db=db)
    if not cur.set_range(start):
        return []
    return list(cur.iternext())


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("budgeted", [False, True], ids=["plain", "budget"])
@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "read-cache"])
def test_reads_match_a_model_through_random_writes_landings_and_cursor_deletes(tmp_path, seed, budgeted, cached):
    rng = random.Random(seed)
    env = lmdb.open(str(tmp_path / "e"), map_size=1 << 28, max_dbs=4, sync=False, metasync=False)
    dbs = [env.open_db(b"a"), env.open_db(b"b")]
    budget = None
    if budgeted:
        budget = WriteBudget(env, 64 << 10, dbs)       # 16 pages: groups split into many transactions
    model = [dict(), dict()]
    with env.begin(write=True) as txn:                  # a committed start the view has to merge with
        for i, db in enumerate(dbs):
            for _ in range(300):
                k, v = rng.randbytes(3), rng.randbytes(rng.randrange(1, 40))
                txn.put(k, v, db=db)
                model[i][k] = v
    if budget is not None:
        budget.committed()

    def expect(i, start):
        return sorted((k, v) for k, v in model[i].items() if k >= start)

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        # a small read cache on the first table: evictions, and landings that refresh what it holds
        ov = Overlay(env, w, budget, read_cache={dbs[0]: 2048} if cached else None)
        held = False
        for _ in range(3000):
            i = rng.randrange(2)
            db = dbs[i]
            r = rng.random()
            if r < 0.35:
                # a key written before, half the time: it may be pending, landed, or both
                k = rng.choice(list(model[i])) if model[i] and rng.random() < 0.5 else rng.randbytes(3)
                v = rng.randbytes(rng.randrange(1, 40))
                ov.put(k, v, db=db)
                model[i][k] = v
            elif r < 0.5:
                k = rng.choice(list(model[i])) if model[i] and rng.random() < 0.8 else rng.randbytes(3)
                ov.delete(k, db=db)
                model[i].pop(k, None)
            elif r < 0.6:                               # delete a run through a cursor, keys only
                start = rng.randbytes(3)
                cur = ov.cursor(db=db)
                n = rng.randrange(1, 6)
                if cur.set_range(start):
                    while n and cur.key():
                        model[i].pop(cur.key(), None)
                        n -= 1
                        if not cur.delete():
                            break
            elif r < 0.7:
                start = rng.randbytes(3)
                assert _scan(ov, db, start) == expect(i, start)
                # the cursor's sorted keys are the view's, each once (none left behind by a landing)
                assert ov.sorted_keys(db) == sorted(ov.view(db))
            elif r < 0.8:
                k = rng.choice(list(model[i])) if model[i] and rng.random() < 0.7 else rng.randbytes(3)
                assert ov.get(k, db=db) == model[i].get(k)
            elif r < 0.9:
                ov.commit()
            elif r < 0.93:
                if held:
                    w.release()
                else:
                    w.hold()
                held = not held
            elif r < 0.935:
                ov.drop(db)
                model[i].clear()
            else:
                await asyncio.sleep(0)                  # landings run between the loop's callbacks
                await asyncio.sleep(rng.choice([0, 0, 0.001]))
        if held:
            w.release()
        ov.commit()
        done = asyncio.get_running_loop().create_future()
        ov.barrier(lambda: done.set_result(None))
        await done
        for i, db in enumerate(dbs):
            assert _scan(ov, db, b"") == expect(i, b"")
        w.close()
        ov.close()

    asyncio.run(go())
    with env.begin() as txn:
        for i, db in enumerate(dbs):
            assert list(txn.cursor(db=db)) == expect(i, b"")
    env.close()


def test_a_sorted_key_list_no_cursor_reads_stays_bounded_while_layers_land(tmp_path):
    """Landings leave the landed keys in a table's sorted list for the next cursor to prune; with no
    cursor for long, a landing prunes it, so it holds about the view's keys, not every key written."""
    env = lmdb.open(str(tmp_path / "e"), map_size=1 << 28, max_dbs=2, sync=False, metasync=False)
    db = env.open_db(b"a")

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        ov = Overlay(env, w)
        ov.put(b"\0", b"x", db=db)
        assert _scan(ov, db, b"") == [(b"\0", b"x")]       # a cursor made the table's sorted list
        n = 0
        for _ in range(400):
            for _ in range(50):
                ov.put(b"k%08d" % n, b"v", db=db)
                n += 1
            landed = asyncio.get_running_loop().create_future()
            ov.commit(functools.partial(landed.set_result, None))
            ov.put(b"k%08d" % n, b"v", db=db)          # the open layer writes the table as it lands
            n += 1
            await landed
        held = ov.stats()
        assert held["view_keys"] <= 2
        assert held["sorted_keys"] < 6000, held          # 20,000 keys landed
        assert ov.sorted_keys(db) == sorted(ov.view(db))
        ov.commit()
        done = asyncio.get_running_loop().create_future()
        ov.barrier(lambda: done.set_result(None))
        await done
        assert len(_scan(ov, db, b"")) == n + 1
        w.close()
        ov.close()

    asyncio.run(go())
    env.close()


def _write_bytes(key, value):
    """The overlay's documented estimate of one write a layer holds (module docstring, "Unlanded
    bytes"), its key's slot in the view aside."""
    from crawlerd.store import overlay
    if value is None:
        return overlay._DELETE_SLOT_BYTES + 33 + len(key)
    return overlay._PUT_SLOT_BYTES + 33 + len(key) + (33 + len(value) if value else 0)


def _view_slot_bytes():
    from crawlerd.store import overlay
    return overlay._VIEW_SLOT_BYTES


@pytest.mark.parametrize("seed", [1, 2])
def test_unlanded_bytes_count_the_layers_not_landed_and_return_to_zero(tmp_path, seed):
    """The count follows a model of the open layer and each layer handed over (taken out when its
    ``then`` runs), through rewrites in one layer, deletes, drops and a writer held and released; a
    key costs its view slot once while the view holds it (from the layer that brought it in)."""
    rng = random.Random(seed)
    env = lmdb.open(str(tmp_path / "e"), map_size=1 << 28, max_dbs=4, sync=False, metasync=False)
    dbs = [env.open_db(b"a"), env.open_db(b"b")]

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        ov = Overlay(env, w)
        open_layer: dict = {}               # (table, key) -> value
        pending: dict[int, int] = {}        # layer number -> its bytes
        view: dict = {}                     # (table, key) -> the layer number of its newest write
        viewed: dict[int, int] = {}         # table -> keys the open layer brought into the view
        n, held, most = 0, False, 0

        def write(i, k, v):
            open_layer[i, k] = v
            if (i, k) not in view:
                viewed[i] = viewed.get(i, 0) + 1
            view[i, k] = n

        def open_bytes():
            return (sum(_write_bytes(k, v) for (_, k), v in open_layer.items())
                    + sum(viewed.values()) * _view_slot_bytes())

        def landed(m):
            pending.pop(m)
            for ik in [ik for ik, lid in view.items() if lid == m]:
                del view[ik]

        for _ in range(4000):
            i = rng.randrange(2)
            r = rng.random()
            if r < 0.5:
                k, v = rng.randbytes(rng.randrange(1, 4)), rng.randbytes(rng.randrange(0, 60))
                ov.put(k, v, db=dbs[i])
                write(i, k, v)
            elif r < 0.6:
                k = rng.randbytes(rng.randrange(1, 4))
                ov.delete(k, db=dbs[i])
                write(i, k, None)
            elif r < 0.65:
                items = sorted({rng.randbytes(2): rng.randbytes(rng.randrange(0, 30)) for _ in range(20)}.items())
                ov.cursor(db=dbs[i]).putmulti(items)
                for k, v in items:
                    write(i, k, v)
            elif r < 0.66:
                ov.drop(dbs[i])
                open_layer = {ik: v for ik, v in open_layer.items() if ik[0] != i}
                viewed.pop(i, None)
                view = {ik: lid for ik, lid in view.items() if ik[0] != i}
            elif r < 0.8:
                pending[n] = open_bytes()
                ov.commit(functools.partial(landed, n))
                open_layer, viewed, n = {}, {}, n + 1
            elif r < 0.83:
                (w.release if held else w.hold)()
                held = not held
            else:
                await asyncio.sleep(0)
            expect = open_bytes() + sum(pending.values())
            assert ov.unlanded_bytes == expect
            most = max(most, expect)
        if held:
            w.release()
        pending[n] = open_bytes()
        ov.commit(functools.partial(landed, n))
        done = asyncio.get_running_loop().create_future()
        ov.barrier(lambda: done.set_result(None))
        await done
        mem = ov.memory()
        assert ov.unlanded_bytes == 0 and not pending
        assert mem["bytes"] == 0 and mem["entries"] == 0 and mem["layers"] == 0
        assert mem["high_water_bytes"] >= most > 0
        w.close()
        ov.close()

    asyncio.run(go())
    env.close()


def test_the_high_water_mark_keeps_a_peak_that_a_drop_or_a_shorter_rewrite_ends(tmp_path):
    """The most the open layer held is kept even when it shrinks before anything lands or reads
    it: a table dropped, a value rewritten shorter."""
    env = lmdb.open(str(tmp_path / "e"), map_size=1 << 24, max_dbs=2, sync=False, metasync=False)
    db = env.open_db(b"a")

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        ov = Overlay(env, w)
        ov.put(b"k", b"x" * 5000, db=db)
        big = ov.unlanded_bytes
        ov.put(b"k", b"y", db=db)                # rewritten shorter: nothing landed or read between
        assert ov.memory()["high_water_bytes"] >= big
        ov.put(b"j", b"z" * 9000, db=db)
        bigger = ov.unlanded_bytes
        ov.drop(db)                               # the open layer's writes to it are moot
        assert ov.unlanded_bytes == 0
        assert ov.memory()["high_water_bytes"] >= bigger > big
        ov.commit(None)
        done = asyncio.get_running_loop().create_future()
        ov.barrier(lambda: done.set_result(None))
        await done
        w.close()
        ov.close()

    asyncio.run(go())
    env.close()


def test_the_unlanded_estimate_is_near_what_a_held_writer_keeps_alive(tmp_path):
    """Writes shaped like BEAST's deferred entries, handed over to a held writer: the estimate is
    within a quarter of the Python memory they hold (tracemalloc), and all of it lands."""
    import tracemalloc

    env = lmdb.open(str(tmp_path / "e"), map_size=1 << 28, max_dbs=2, sync=False, metasync=False)
    db = env.open_db(b"deferred")

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        ov = Overlay(env, w)
        w.hold()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for layer in range(20):
                for i in range(1000):
                    n = layer * 1000 + i
                    key = b"d%05d.example\0" % (n % 3000) + n.to_bytes(16, "big")
                    ov.put(key, n.to_bytes(8, "big") + b"1 2 3 http://h%d.d%05d.example/p/%d" % (n % 7, n % 3000, n),
                           db=db)
                    if i % 10 == 0:
                        ov.delete(key[:-16] + (n + 500).to_bytes(16, "big"), db=db)
                ov.commit()
            traced = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        est = ov.unlanded_bytes
        w.release()
        done = asyncio.get_running_loop().create_future()
        ov.barrier(lambda: done.set_result(None))
        await done
        w.close()
        ov.close()
        return est, traced, ov.unlanded_bytes

    est, traced, after = asyncio.run(go())
    env.close()
    print("estimate", est, "traced", traced, round(est / traced, 2))
    assert 0.75 * traced <= est <= 1.25 * traced, (est, traced)
    assert after == 0
