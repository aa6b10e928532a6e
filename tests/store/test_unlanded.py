"""UnlandedGate: a step waits while the gated overlays' writes not landed pass half the bound, runs
at the landing that leaves room, and a wait always ends once the writer runs."""

import asyncio

import lmdb

from crawlerd.store.overlay import Overlay
from crawlerd.store.unlanded import UnlandedGate
from crawlerd.store.writer import WriteThread

CAP = 64 << 10


def _write(ov: Overlay, db, n: int, tag: bytes) -> None:
    for i in range(n):
        ov.put(tag + i.to_bytes(4, "big"), b"v" * 100, db=db)


def test_steps_wait_at_half_the_bound_until_a_landing_and_a_wait_hands_the_open_layers_over(tmp_path):
    env = lmdb.open(str(tmp_path / "e"), map_size=1 << 26, max_dbs=2, sync=False, metasync=False)
    db = env.open_db(b"t")

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        ovs = [Overlay(env, w), Overlay(env, w)]
        commits = []

        def commit():
            commits.append(1)
            for ov in ovs:
                ov.commit()

        gate = UnlandedGate(CAP, commit)
        for ov in ovs:
            gate.attach(ov)
        ran, woken = [], []
        try:
            w.hold()
            assert not gate.crowded()
            _write(ovs[0], db, 60, b"a")            # ~22 KB: under half
            _write(ovs[1], db, 60, b"b")            # together past half (32 KiB)
            assert gate.crowded() and gate.largest_step > 0
            assert gate.crowded_wake(lambda: woken.append(1))
            gate.when_room(lambda: ran.append(1))
            def wake():
                woken.append(2)

            assert gate.crowded_wake(wake) and gate.crowded_wake(wake)   # registered once
            assert commits == [1] and gate.waiting == 3                  # nothing pending: handed over
            for _ in range(50):
                await asyncio.sleep(0)
            assert ran == [] and gate.held_bytes() > CAP // 2            # held: nothing lands, nothing runs
            w.release()
            for _ in range(500):
                await asyncio.sleep(0.002)
                if ran:
                    break
            assert ran == [1] and len(woken) == 2 and gate.waiting == 0
            assert not gate.crowded() and gate.held_bytes() == 0
            m = gate.memory()
            assert m["waits"] == 3 and m["cap_bytes"] == CAP and m["bytes"] == 0
            _write(ovs[0], db, 200, b"c")
            w.hold()
            gate.when_room(lambda: ran.append(2))
            gate.close()                            # closing: the waiting step is dropped
            w.release()
            for _ in range(50):
                await asyncio.sleep(0.002)
            assert ran == [1] and not gate.crowded()
        finally:
            w.close()
            await asyncio.sleep(0)
            for ov in ovs:
                gate.detach(ov)
                ov.close()

    asyncio.run(go())
    env.close()


def test_no_bound_never_waits(tmp_path):
    env = lmdb.open(str(tmp_path / "e"), map_size=1 << 26, max_dbs=2, sync=False, metasync=False)
    db = env.open_db(b"t")

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        ov = Overlay(env, w)
        gate = UnlandedGate(0, ov.commit)
        gate.attach(ov)
        _write(ov, db, 2000, b"a")
        assert not gate.crowded() and gate.held_bytes() > CAP
        ov.commit()
        await asyncio.sleep(0.05)
        w.close()
        await asyncio.sleep(0)
        ov.close()

    asyncio.run(go())
    env.close()


def test_a_store_dropped_without_close_is_freed_at_once_not_by_the_cyclic_collector(tmp_path):
    """The gate holds its store's callbacks and its overlays' landing hook weakly: a store (and its
    LMDB environment) dropped without ``close`` goes with its last reference, as one without a gate
    does, never at a later collection in the middle of another store's LMDB work."""
    import gc
    import weakref

    from crawlerd.frontier.dust_store import DustStore

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.0)
        s = DustStore(str(tmp_path / "d"), max_bytes=8 << 20, max_host_bytes=16 << 10, sync=False,
                      unlanded_bytes=1 << 20)
        s.attach_writer(w)
        ref = weakref.ref(s)
        gc.disable()
        try:
            del s
            assert ref() is None
        finally:
            gc.enable()
        w.close()

    asyncio.run(go())
