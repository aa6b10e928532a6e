"""The writer merges a transaction's layers per table (last write wins): the tables end byte for byte
as writing each layer in turn leaves them, every commit on disk is the state after a whole layer,
and layers that rewrite the same keys fit in fewer transactions."""

import asyncio
import random

import lmdb
import pytest

from crawlerd.store.lmdb_reserve import WriteBudget
from crawlerd.store.overlay import Overlay
from crawlerd.store.writer import WriteThread


def _open(path):
    env = lmdb.open(str(path), map_size=1 << 28, max_dbs=4, sync=False, metasync=False)
    return env, [env.open_db(b"a"), env.open_db(b"b")]


def _tables(env, dbs):
    with env.begin() as txn:
        return [list(txn.cursor(db=db)) for db in dbs]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("reserve", [0, 192 << 10], ids=["unbounded", "budget"])
def test_merged_groups_leave_the_tables_as_layer_by_layer_writes_and_commit_whole_layers(tmp_path, seed, reserve):
    rng = random.Random(seed)
    env, dbs = _open(tmp_path / "merged")
    ref, rdbs = _open(tmp_path / "ref")
    budget = WriteBudget(env, reserve, dbs) if reserve else None
    keys = [bytes([i]) + b"k" for i in range(60)]      # few keys: layers of one group rewrite them
    layers = []         # per layer: [(table, None) for a drop | (table, key, value or None)]
    states = []         # the tables after each layer (a dict per table)
    model = [{}, {}]
    for _ in range(400):
        ops = []
        for _ in range(rng.randrange(1, 40)):
            i = rng.randrange(2)
            r = rng.random()
            if r < 0.01:
                ops.append((i, None))
                model[i] = {}
            elif r < 0.35:
                k = rng.choice(keys)
                ops.append((i, k, None))
                model[i].pop(k, None)
            else:
                k, v = rng.choice(keys), rng.randbytes(rng.randrange(1, 300))
                ops.append((i, k, v))
                model[i][k] = v
        layers.append(ops)
        states.append([dict(m) for m in model])

    seen_on_landing = []
    groups = []

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        ov = Overlay(env, w, budget)
        n = 0
        while n < len(layers):
            groups.append(n)
            w.hold()                    # a group of several layers (one to eight)
            for _ in range(rng.randrange(1, 9)):
                if n == len(layers):
                    break
                for op in layers[n]:
                    if op[1] is None and len(op) == 2:
                        ov.drop(dbs[op[0]])
                    elif op[2] is None:
                        ov.delete(op[1], db=dbs[op[0]])
                    else:
                        ov.put(op[1], op[2], db=dbs[op[0]])
                ov.commit(lambda n=n: seen_on_landing.append((n, _tables(env, dbs))))
                n += 1
            w.release()
            await asyncio.sleep(rng.choice([0, 0.001, 0.005]))
        done = asyncio.Event()
        ov.barrier(done.set)
        await done.wait()
        w.close()
        await asyncio.sleep(0)
        ov.close()
        return ov

    ov = asyncio.run(go())
    for ops in layers:                  # the reference: one transaction per layer, its writes in turn
        with ref.begin(write=True) as txn:
            for op in ops:
                if len(op) == 2:
                    txn.drop(rdbs[op[0]], delete=False)
                elif op[2] is None:
                    txn.delete(op[1], db=rdbs[op[0]])
                else:
                    txn.put(op[1], op[2], db=rdbs[op[0]])
    assert _tables(env, dbs) == _tables(ref, rdbs)
    assert _tables(env, dbs) == [sorted(m.items()) for m in states[-1]]
    # when layer n has landed, the tables hold the state after a whole layer, n or a later one
    whole = [[sorted(m.items()) for m in s] for s in states]
    assert len(seen_on_landing) == len(layers)
    for n, tables in seen_on_landing:
        assert tables in whole[n:], n
    assert ov.stats()["merged_writes"] > 0
    if reserve:
        assert ov.txns > len(groups)        # and the budget split groups (a group may be one writer group or more)


def test_layers_rewriting_the_same_keys_fit_in_one_transaction(tmp_path):
    # ten layers of one group each rewriting the same twelve records of one table
    env, dbs = _open(tmp_path / "e")
    budget = WriteBudget(env, 160 << 10, dbs)         # 40 pages: limit 35
    keys = [i.to_bytes(2, "big") for i in range(12)]

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        ov = Overlay(env, w, budget)
        w.hold()
        for layer in range(10):
            for k in keys:
                ov.put(k, layer.to_bytes(4, "big"), db=dbs[0])
            ov.commit()
        w.release()
        done = asyncio.Event()
        ov.barrier(done.set)
        await done.wait()
        w.close()
        await asyncio.sleep(0)
        ov.close()
        return ov

    ov = asyncio.run(go())
    assert _tables(env, dbs)[0] == [(k, (9).to_bytes(4, "big")) for k in keys]
    # unmerged, each layer's 12 writes are charged 24 pages: two layers (48) pass the limit of 35,
    # so ten layers took ten transactions; merged, the ten layers are 12 writes, one transaction
    assert ov.txns == 1
    assert ov.stats()["merged_writes"] == 9 * len(keys)
