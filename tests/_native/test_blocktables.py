"""Block tables of the near-duplicate index: native and reference give the same answers, in the same order."""

import numpy as np
import pytest

from crawlerd._native import blocktables as native
from crawlerd._native import blocktables_ref as ref

IMPLS = [native, ref]


def brute(fps, docs, q: int, k: int) -> list[tuple[int, int, int]]:
    return sorted((d, f, (f ^ q).bit_count()) for f, d in zip(fps, docs, strict=True) if (f ^ q).bit_count() <= k)


def near_fps(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random fingerprints, a third of them a few bits away from another, some exact repeats."""
    fps = rng.integers(0, 2**64, n, dtype=np.uint64)
    for i in range(n // 3, n):
        j = int(rng.integers(0, n // 3))
        flips = rng.choice(64, size=int(rng.integers(0, 5)), replace=False)
        fps[i] = fps[j] ^ np.uint64(sum(1 << int(b) for b in flips))
    return fps


@pytest.mark.parametrize("impl", IMPLS, ids=["native", "ref"])
class TestBlockTables:
    def test_query_finds_exactly_the_pairs_within_k(self, impl):
        rng = np.random.default_rng(5)
        fps = near_fps(rng, 600)
        docs = np.arange(600, dtype=np.int64)
        run = impl.BlockTables.build(fps, docs)
        run.check_invariant()
        assert len(run) == 600
        fl, dl = fps.tolist(), docs.tolist()
        for q in fl[::7] + [0, 2**64 - 1]:
            for k in range(4):
                out: list = []
                assert run.query_into(q, k, out) == len(out)
                assert sorted(out) == brute(fl, dl, q, k)
        with pytest.raises(ValueError):
            run.query_into(1, 4, [])

    def test_scan_into_and_its_bounds(self, impl):
        fps = np.array([0b1111, 0b0111, 2**63, 0], dtype=np.uint64)
        docs = np.arange(4, dtype=np.int64)
        out: list = []
        assert impl.scan_into(fps, docs, 3, 0b0011, 2, out) == 2
        assert out == [(0, 0b1111, 2), (1, 0b0111, 1)]
        with pytest.raises(ValueError):
            impl.scan_into(fps, docs, 5, 0, 1, [])
        with pytest.raises(ValueError):
            impl.scan_into(fps, docs, 2, 0, 4, [])

    def test_many_queries_answer_as_one_by_one(self, impl):
        rng = np.random.default_rng(9)
        fps = near_fps(rng, 3000)
        fps[100:110] = fps[50]                       # repeats: every pair of an equal fingerprint
        docs = np.arange(3000, dtype=np.int64)
        run = impl.BlockTables.build(fps, docs)
        qs = np.concatenate([fps[::97], fps[:40] ^ np.uint64(0b101), np.array([0, 2**64 - 1], dtype=np.uint64)])
        for k in range(4):
            outs: list = [[] for _ in qs]
            assert run.query_many_into(qs, k, outs) == sum(map(len, outs))
            one: list = [[] for _ in qs]
            for q, out in zip(qs.tolist(), one, strict=True):
                run.query_into(q, k, out)
            assert outs == one
            assert any(outs)
            outs = [[] for _ in qs]
            assert impl.scan_many_into(fps, docs, 2500, qs, k, outs) == sum(map(len, outs))
            one = [[] for _ in qs]
            for q, out in zip(qs.tolist(), one, strict=True):
                impl.scan_into(fps, docs, 2500, q, k, out)
            assert outs == one
        with pytest.raises(ValueError):
            run.query_many_into(qs, 1, [[]])
        with pytest.raises(ValueError):
            impl.scan_many_into(fps, docs, 10, qs[:1], 4, [[]])
        with pytest.raises(ValueError):
            impl.scan_many_into(fps, docs, 3001, qs[:1], 1, [[]])

    def test_tail_finds_exactly_the_pairs_within_k_until_cleared(self, impl):
        rng = np.random.default_rng(13)
        fps = near_fps(rng, 700)
        fps[200:205] = fps[10]                       # repeats: each pair of an equal fingerprint
        fps[300] = fps[11] ^ np.uint64(0x0001_0001_0001_0001)     # 4 bits away, one in each block
        docs = np.arange(700, dtype=np.int64) + 1000
        for cap in (1, 5, 64, 700):
            tail = impl.BlockTail(cap)
            assert tail.add_many(fps[:3], docs[:3]) == min(3, cap)
            assert tail.add_many(fps[3:], docs[3:]) == cap - min(3, cap)
            assert len(tail) == cap and tail.nbytes >= 16 * cap
            with pytest.raises(ValueError):
                tail.add(1, 1)
            fl, dl = fps[:cap].tolist(), docs[:cap].tolist()
            qs = np.concatenate([fps[:cap:3], fps[:40] ^ np.uint64(0b1001), np.array([0], dtype=np.uint64)])
            for k in range(4):
                outs: list = [[] for _ in qs]
                assert tail.query_many_into(qs, k, outs) == sum(map(len, outs))
                for q, out in zip(qs.tolist(), outs, strict=True):
                    one: list = []
                    assert tail.query_into(q, k, one) == len(one)
                    assert sorted(one) == sorted(out) == brute(fl, dl, q, k)
            tail.clear()
            assert len(tail) == 0 and tail.query_into(int(fps[0]), 3, []) == 0
            assert not tail.add(int(fps[0]) ^ 1, 7) or cap == 1
            out = []
            tail.query_into(int(fps[0]), 3, out)
            assert out == [(7, int(fps[0]) ^ 1, 1)]
        with pytest.raises(ValueError):
            impl.BlockTail(0)
        with pytest.raises(ValueError):
            impl.BlockTail(4).query_into(1, 4, [])

    def test_merge_keeps_all_pairs_older_first(self, impl):
        rng = np.random.default_rng(1)
        a = impl.BlockTables.build(rng.integers(0, 2**64, 500, dtype=np.uint64), np.arange(500))
        b = impl.BlockTables.build(np.concatenate([a.fps[:10], rng.integers(0, 2**64, 290, dtype=np.uint64)]),
                                   np.arange(500, 800))
        m = impl.merge_tables(a, b)
        m.check_invariant()
        assert sorted(m.doc_ids.tolist()) == list(range(800))
        fp = int(a.fps[3])
        out: list = []
        m.query_into(fp, 0, out)
        assert [d for d, _, _ in out] == [int(a.doc_ids[3]), 503]      # a's pair before b's equal one
        assert impl.merge_tables(a, impl.BlockTables.build(np.empty(0, np.uint64), np.empty(0, np.int64))) is a
        bad = impl.BlockTables(m.fps, m.doc_ids, m.rot2, m.rot1, m.rot3)
        with pytest.raises(AssertionError):
            bad.check_invariant()

    def test_merge_into_many_runs_into_given_buffers(self, impl):
        rng = np.random.default_rng(3)
        fps = near_fps(rng, 900)
        runs = [impl.BlockTables.build(fps[i:i + 300], np.arange(i, i + 300)) for i in range(0, 900, 300)]
        outs = [np.empty(900, np.uint64), np.empty(900, np.int64)] + [np.empty(900, np.uint64) for _ in range(3)]
        assert impl.merge_into(runs, *outs) == 900
        merged = impl.BlockTables(*outs)
        merged.check_invariant()
        for q in fps[::37].tolist():
            got: list = []
            merged.query_into(int(q) ^ 1, 3, got)
            assert sorted(got) == brute(fps.tolist(), list(range(900)), int(q) ^ 1, 3)
        dup = int(fps[0])                       # equal fingerprints: older runs' docs first
        same = [d for f, d in zip(merged.fps.tolist(), merged.doc_ids.tolist(), strict=True) if f == dup]
        assert same == sorted(same)
        assert impl.bucket_offsets(merged.rot1).shape == (65537,)
        with pytest.raises(ValueError):
            impl.merge_into(runs, *[o[:10] for o in outs])
        with pytest.raises(ValueError):
            impl.merge_into([], *[o[:0] for o in outs])

    def test_large_run_has_bucket_offsets(self, impl):
        rng = np.random.default_rng(9)
        fps = rng.integers(0, 2**64, impl.OFFSETS_MIN, dtype=np.uint64)
        run = impl.BlockTables.build(fps, np.arange(fps.shape[0]))
        assert run.offsets is not None and run.offsets.shape == (4, 65537)
        run.check_invariant()
        q = int(fps[12345]) ^ (1 << 20) ^ (1 << 40)
        out: list = []
        run.query_into(q, 3, out)
        assert (12345, int(fps[12345]), 2) in out

    def test_rotl_array(self, impl):
        a = np.array([1, 2**63], dtype=np.uint64)
        assert impl.rotl_array(a, 0).tolist() == [1, 2**63]
        assert impl.rotl_array(a, 1).tolist() == [2, 1]


def test_native_and_reference_answer_in_the_same_order():
    rng = np.random.default_rng(17)
    fps = near_fps(rng, 2000)
    docs = rng.permutation(2000).astype(np.int64)
    runs = [impl.BlockTables.build(fps, docs) for impl in IMPLS]
    for i in range(0, 2000, 13):
        q = int(fps[i]) ^ (1 << int(rng.integers(0, 64)))
        outs = [[], []]
        for run, out in zip(runs, outs, strict=True):
            run.query_into(q, 3, out)
        assert outs[0] == outs[1]
