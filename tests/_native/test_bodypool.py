"""The body pool: native and reference run the same operations; bodies read back exactly, by the
writer's side and through a read-only mapping (a worker's view); a full pool falls back to the heap."""

from __future__ import annotations

import mmap
import os
import random

import pytest

from crawlerd._native.bodypool import BodyPool, BodyWriter, layout, read_chain
from crawlerd._native.bodypool_ref import RefBodyPool, RefBodyWriter
from crawlerd._native.bodypool_ref import layout as ref_layout

IMPLS = [(BodyPool, BodyWriter), (RefBodyPool, RefBodyWriter)]
BLOCK = 1024


def write(writer, data: bytes, chunk: int):
    for i in range(0, len(data), chunk):
        writer(data[i:i + chunk])
    return writer.finish()


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c[0].__name__)
class TestBodyPool:
    def test_a_body_spanning_blocks_reads_back_exactly_and_its_blocks_come_back(self, impl):
        pool_cls, writer_cls = impl
        pool = pool_cls(64 * BLOCK, BLOCK)
        w = writer_cls(pool)
        rng = random.Random(1)
        for size, chunk in [(1, 1), (BLOCK, BLOCK), (BLOCK + 1, 7), (5 * BLOCK - 3, 1000), (20_000, 16_384)]:
            data = rng.randbytes(size)
            body = write(w, data, chunk)
            assert not isinstance(body, bytes) and body.size == len(body) == size
            assert pool.used == -(-size // BLOCK) and pool.bodies == 1
            assert body.read() == data
            body.release()
            assert body.released and pool.used == 0 and pool.bodies == 0
            with pytest.raises(ValueError):
                body.read()
            body.release()                                  # idempotent
            assert pool.free_blocks() == pool.blocks
        assert w.finish() == b""                            # an empty body is not pooled
        pool.close()

    def test_a_body_nobody_holds_gives_its_blocks_back(self, impl):
        pool_cls, writer_cls = impl
        pool = pool_cls(16 * BLOCK, BLOCK)
        body = write(writer_cls(pool), b"x" * (3 * BLOCK), 500)
        assert pool.used == 3
        del body
        assert pool.used == 0 and pool.free_blocks() == pool.blocks
        pool.close()

    def test_a_full_pool_falls_back_to_the_heap_and_loses_nothing(self, impl):
        pool_cls, writer_cls = impl
        pool = pool_cls(8 * BLOCK, BLOCK)
        n = pool.blocks
        held = write(writer_cls(pool), b"a" * ((n - 2) * BLOCK), 3000)      # two blocks left
        data = random.Random(2).randbytes(5 * BLOCK + 17)
        out = write(writer_cls(pool), data, 700)            # starts in the pool, runs out of blocks
        assert isinstance(out, bytes) and out == data
        assert pool.fallbacks == 1 and pool.used == n - 2 and pool.bodies == 1   # its blocks came back
        assert pool.put(data) is None                       # does not fit: the caller sends it inline
        small = pool.put(b"b" * BLOCK)
        assert small is not None and small.read() == b"b" * BLOCK and pool.used == n - 1
        held.release()
        small.release()
        assert pool.used == 0 and pool.free_blocks() == n
        pool.close()

    def test_the_high_water_mark_is_the_most_blocks_ever_in_use_at_once(self, impl):
        pool_cls, writer_cls = impl
        pool = pool_cls(16 * BLOCK, BLOCK)
        assert pool.high_water == 0 and pool.high_water_bytes == 0
        a = write(writer_cls(pool), b"a" * (3 * BLOCK), 1000)
        b = pool.put(b"b" * (2 * BLOCK + 1))
        assert pool.used == pool.high_water == 6
        a.release()
        b.release()
        c = pool.put(b"c" * BLOCK)                      # fewer at once than before: the mark stays
        assert pool.used == 1 and pool.high_water == 6 and pool.high_water_bytes == 6 * BLOCK
        w = writer_cls(pool)
        w(b"d" * (pool.blocks * BLOCK))                 # fills the pool, then falls back to the heap
        assert isinstance(w.finish(), bytes) and pool.high_water == pool.blocks and pool.used == 1
        c.release()
        pool.close()

    def test_clear_drops_the_body_being_written(self, impl):
        pool_cls, writer_cls = impl
        pool = pool_cls(8 * BLOCK, BLOCK)
        w = writer_cls(pool)
        w(b"z" * (2 * BLOCK + 5))
        assert pool.used == 3 and len(w) == 2 * BLOCK + 5
        w.clear()
        assert pool.used == 0 and pool.bodies == 0 and w.finish() == b""
        pool.close()


def test_native_and_reference_agree_on_random_operations():
    """The same writes, releases and puts on both: the same blocks, counts and bytes every step."""
    rng = random.Random(7)
    pools = [BodyPool(40 * BLOCK, BLOCK), RefBodyPool(40 * BLOCK, BLOCK)]
    assert (pools[0].blocks, pools[0].header) == (pools[1].blocks, pools[1].header)
    held: list[list] = [[], []]
    for step in range(600):
        op = rng.random()
        if op < 0.5:
            data = rng.randbytes(rng.choice([1, 100, BLOCK - 1, BLOCK, 3 * BLOCK + 5, 9 * BLOCK]))
            chunk = rng.choice([1, 333, BLOCK, 4096])
            outs = [write(w(p), data, chunk) for p, w in zip(pools, (BodyWriter, RefBodyWriter), strict=True)]
        elif op < 0.6:
            data = rng.randbytes(rng.randrange(1, 6 * BLOCK))
            outs = [p.put(data) for p in pools]
        else:
            if held[0]:
                i = rng.randrange(len(held[0]))
                for h in held:
                    h.pop(i).release()
            outs = None
        if outs is not None:
            a, b = outs
            assert type(a) is type(b) or (a is not None and b is not None and not isinstance(a, bytes)
                                          and not isinstance(b, bytes)), step
            if a is not None and not isinstance(a, bytes):
                assert (a.first, a.size) == (b.first, b.size) and a.read() == b.read() == data
                held[0].append(a)
                held[1].append(b)
            elif a is not None:
                assert a == b == data
        assert [(p.used, p.high_water, p.bodies, p.fallbacks, p.pooled) for p in pools][0] == \
            [(p.used, p.high_water, p.bodies, p.fallbacks, p.pooled) for p in pools][1], step
        assert pools[0].used <= pools[0].high_water <= pools[0].blocks
    assert pools[0].fallbacks > 0 and pools[0].pooled > 0         # the sequence did reach a full pool
    for h in held:
        for body in h:
            body.release()
    assert pools[0].free_blocks() == pools[0].blocks
    pools[0].close()


def test_a_worker_reads_bodies_through_a_read_only_mapping_of_the_fd():
    pool = BodyPool(32 * BLOCK, BLOCK)
    rng = random.Random(3)
    bodies = [(d, pool.put(d)) for d in (rng.randbytes(n) for n in (10, BLOCK, 4 * BLOCK + 1, 7000))]
    bodies[1][1].release()                  # freed blocks are reused by the next body: chains interleave
    late = rng.randbytes(3 * BLOCK)
    bodies.append((late, pool.put(late)))
    m = mmap.mmap(pool.fd, pool.size, prot=mmap.PROT_READ)
    try:
        for data, body in bodies:
            if not body.released:
                assert read_chain(m, pool.blocks, pool.header, pool.block_bytes, body.first, body.size) == data
        with pytest.raises(ValueError):
            read_chain(m, pool.blocks, pool.header, pool.block_bytes, pool.blocks, 10)      # no such block
        with pytest.raises(ValueError):         # longer than its chain: never reads past the region
            read_chain(m, pool.blocks, pool.header, pool.block_bytes, bodies[0][1].first, pool.blocks * BLOCK)
    finally:
        m.close()
        pool.close()


def test_layout_and_bad_sizes():
    assert layout(64 << 20, 8192) == ref_layout(64 << 20, 8192)
    blocks, header = layout(64 << 20, 8192)
    assert header % 4096 == 0 and header >= 4 * blocks and header + blocks * 8192 <= 64 << 20
    for size, block in [(100, 1024), (1 << 20, 100), (1 << 20, 0)]:
        with pytest.raises(ValueError):
            BodyPool(size, block)
    pool = BodyPool(1 << 20)
    assert pool.cap_bytes == pool.blocks * pool.block_bytes and pool.used_bytes == 0
    assert os.fstat(pool.fd).st_size == pool.size
    pool.close()


def _memfd_refs(name: str) -> tuple[int, int]:
    """(open fds, mappings) of this process that name the memfd ``name``."""
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{name} ")
        except OSError:
            pass
    with open("/proc/self/maps") as f:
        maps = sum(f"/memfd:{name} " in line for line in f)
    return fds, maps


@pytest.mark.parametrize("how", ["close", "collect", "close-then-collect"])
def test_a_pool_gives_back_its_fd_and_mapping_once_closed_or_collected(how):
    name = f"crawlerd-test-bodies-{how}"
    pool = BodyPool(16 * BLOCK, BLOCK, name=name)
    body = pool.put(b"q" * (2 * BLOCK))
    assert _memfd_refs(name) == (1, 1)
    if how.startswith("close"):
        pool.close()
        pool.close()                                    # idempotent
        assert _memfd_refs(name) == (0, 0) and pool.fd == -1
        with pytest.raises(ValueError):
            body.read()                                 # a body held past close reads as an error
        assert pool.put(b"late") is None
    body = None
    del pool
    import gc
    gc.collect()
    assert _memfd_refs(name) == (0, 0)
