"""BEAST's run packing: native and reference give the same bytes, stops and sizes, and the bytes read
back as the FIFO's entries (``fifo.entries``) in order."""

import random
import struct

import pytest

from crawlerd._native import fiforuns as native
from crawlerd._native import fiforuns_ref as ref
from crawlerd.frontier.budgets import fifo

IMPLS = [native, ref]


def stream(rng: random.Random, n: int):
    hosts, fps, recs = [], [], []
    h = "http://a.example"
    for _ in range(n):
        if rng.random() < 0.2:
            h = rng.choice(["http://a.example", "http://b.example", "http://c.example:8080"])
            h = "".join(h)                      # equal hosts are not always the same object
        hosts.append(h)
        fps.append(rng.getrandbits(64))
        recs.append(bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 39, 120, 700]))))
    return hosts, fps, recs


@pytest.mark.parametrize("impl", IMPLS, ids=["native", "ref"])
class TestPackBlock:
    def test_one_hosts_block_reads_back_as_its_entries(self, impl):
        hosts, fps, recs = ["h"] * 5 + ["g"], [1, 2, 3, 2**64 - 1, 0, 9], [b"r0", b"", b"r2", b"x" * 50, b"r4", b"g"]
        chunk, end, used = impl.pack_block(hosts, 1, 6, 7, fps, recs, 0, 1536)
        assert end == 5                                         # stops at the other host
        assert used == sum(12 + 8 + len(r) for r in recs[1:5])
        key = b"d\0" + struct.pack(">QQ", 40, 7) + fifo.RUN
        got = fifo.entries(key, chunk, 2)
        assert [v for _, v in got] == [struct.pack("<Q", f) + r for f, r in zip(fps[1:5], recs[1:5], strict=True)]
        assert [struct.unpack(">QQ", t) for t, _ in got] == [(40 + k, 7 + k) for k in range(4)]

    def test_a_run_closes_before_its_bytes_pass_the_cap_and_its_first_entry_always_fits(self, impl):
        recs = [b"x" * 100] * 6
        hosts, fps = ["h"] * 6, list(range(6))
        assert impl.pack_block(hosts, 0, 6, 0, fps, recs, 0, 0)[1:] == (1, 120)       # cap 0: one per run
        assert impl.pack_block(hosts, 0, 6, 0, fps, recs, 0, 347)[1:] == (2, 240)     # 240 + 108 > 347
        assert impl.pack_block(hosts, 0, 6, 0, fps, recs, 0, 348)[1:] == (3, 360)     # the cap is inclusive
        assert impl.pack_block(hosts, 2, 6, 0, fps, recs, 250, 300) == (b"", 2, 250)   # an open run: full

    def test_bad_input_is_refused(self, impl):
        with pytest.raises(IndexError):
            impl.pack_block(["h"], 0, 2, 0, [1], [b""], 0, 10)
        with pytest.raises(TypeError):
            impl.pack_block(["h"], 0, 1, 0, [1], [memoryview(b"r")], 0, 10)
        with pytest.raises(OverflowError):
            impl.pack_block(["h"], 0, 1, 0, [2**64], [b"r"], 0, 10)


@pytest.mark.parametrize("seed", range(5))
def test_native_and_reference_agree_on_random_blocks(seed):
    rng = random.Random(seed)
    hosts, fps, recs = stream(rng, 400)
    for _ in range(300):
        i = rng.randrange(len(hosts))
        j = rng.randrange(i + 1, len(hosts) + 1)
        seq, used, cap = rng.getrandbits(40), rng.choice([0, 0, 100, 1400]), rng.choice([0, 200, 1536, 5000])
        args = (hosts, i, j, seq, fps, recs, used, cap)
        assert native.pack_block(*args) == ref.pack_block(*args)
        targs = (tuple(hosts), i, j, seq, tuple(fps), tuple(recs), used, cap)
        assert native.pack_block(*targs) == ref.pack_block(*args)       # tuples read in place


@pytest.mark.parametrize("impl", IMPLS, ids=["native", "ref"])
def test_block_ends_split_consecutive_equal_items(impl):
    assert impl.block_ends([]) == []
    assert impl.block_ends(["a"]) == [1]
    assert impl.block_ends(["a", "a", "b", "a", "".join("a"), "c", "c"]) == [2, 3, 5, 7]
    assert impl.block_ends((b"x", b"y", b"y")) == [1, 3]
