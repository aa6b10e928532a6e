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
