"""SimhashIndex against brute force: every pair within k found, nothing beyond k reported."""

import random

import numpy as np
import pytest

from crawlerd._native.blocktables import BlockTables, merge_tables
from crawlerd.dedup.simhash_index import SimhashIndex


def flip(rng: random.Random, fp: int, bits: int) -> int:
    for b in rng.sample(range(64), bits):
        fp ^= 1 << b
    return fp


def brute(pairs: list[tuple[int, int]], q: int, k: int) -> list[tuple[int, int, int]]:
    out = [(doc, fp, (fp ^ q).bit_count()) for fp, doc in pairs if (fp ^ q).bit_count() <= k]
    return sorted(out, key=lambda m: (m[2], m[0], m[1]))


def build(rng: random.Random, n: int, tail_capacity: int = 64):
    """Random fingerprints plus clusters of near variants and exact duplicates."""
    index = SimhashIndex(tail_capacity=tail_capacity, merge_factor=4)
    pairs = []
    bases = [rng.getrandbits(64) for _ in range(n // 10)]
    for doc in range(n):
        r = rng.random()
        if r < 0.5:
            fp = rng.getrandbits(64)
        elif r < 0.9:
            fp = flip(rng, rng.choice(bases), rng.randrange(0, 6))
        else:
            fp = rng.choice(pairs)[0] if pairs else rng.getrandbits(64)  # exact duplicate, other doc
        index.add(fp, doc)
        pairs.append((fp, doc))
    return index, pairs, bases


def test_matches_brute_force():
    rng = random.Random(42)
    index, pairs, bases = build(rng, 3000)
    index.check_invariant()
    assert len(index) == 3000 and len(index.run_sizes) > 1  # several runs plus a tail
    queries = [flip(rng, rng.choice(bases), rng.randrange(0, 5)) for _ in range(300)]
    queries += [flip(rng, rng.choice(pairs)[0], rng.randrange(0, 5)) for _ in range(300)]
    queries += [rng.getrandbits(64) for _ in range(50)] + [0, 2**64 - 1]
    hits = 0
    for q in queries:
        for k in range(4):
            got = index.query(q, k)
            assert got == brute(pairs, q, k), (q, k)
            hits += len(got)
    assert hits > 1000  # the clusters make the test meaningful


def test_every_flip_pattern_up_to_three_bits_found():
    # Flips spread over blocks exercise every table; flips inside one block leave three exact blocks.
    rng = random.Random(7)
    base = rng.getrandbits(64)
    index = SimhashIndex(tail_capacity=16)
    variants = {}
    for doc in range(400):
        fp = flip(rng, base, rng.randrange(0, 7))
        variants[doc] = fp
        index.add(fp, doc)
    for _ in range(200):
        index.add(rng.getrandbits(64), 10_000 + _)
    pairs = [(fp, doc) for doc, fp in variants.items()]
    for d in range(4):
        for bits in ([0, 16, 32][:d], [63, 47, 31][:d], [0, 1, 2][:d], [5, 40, 50][:d]):
            q = base
            for b in bits:
                q ^= 1 << b
            want = brute(pairs, q, 3)
            assert [m for m in index.query(q, 3) if m[0] < 10_000] == want


def test_add_and_query_finds_earlier_only():
    index = SimhashIndex(tail_capacity=4)
    assert index.add_and_query(0b1111, 1) == []
    assert index.add_and_query(0b0111, 2) == [(1, 0b1111, 1)]
    assert index.add_and_query(0b0111, 3, k=0) == [(2, 0b0111, 0)]
    assert index.query(0b0000, k=3) == [(2, 0b0111, 3), (3, 0b0111, 3)]
    with pytest.raises(ValueError):
        index.query(1, k=4)
    with pytest.raises(ValueError):
        index.add(-1, 1)
    with pytest.raises(ValueError):
        index.add(2**64, 1)


def test_bulk_runs_with_bucket_offsets_and_merge():
    rng = np.random.default_rng(3)
    fps = rng.integers(0, 2**64, size=140_000, dtype=np.uint64)
    docs = np.arange(fps.shape[0], dtype=np.int64)
    index = SimhashIndex(tail_capacity=256)
    index.add_many(fps[:130_000], docs[:130_000])
    index.add_many(fps[130_000:], docs[130_000:])
    for i in range(1000):
        index.add(int(fps[i]) ^ 1, 1_000_000 + i)
    index.compact()
    assert index.run_sizes == [141_000]
    run = index._runs[0]
    assert run.offsets is not None  # large run: bucket directory
    run.check_invariant()
    pairs = list(zip(fps.tolist(), docs.tolist(), strict=True))
    pairs += [(int(fps[i]) ^ 1, 1_000_000 + i) for i in range(1000)]
    for i in range(0, 140_000, 997):
        q = int(fps[i]) ^ (1 << 20) ^ (1 << 40)
        assert index.query(q, 3) == brute(pairs, q, 3)


def test_merge_tables_keeps_all_pairs():
    rng = np.random.default_rng(1)
    a = BlockTables.build(rng.integers(0, 2**64, 500, dtype=np.uint64), np.arange(500))
    b = BlockTables.build(rng.integers(0, 2**64, 300, dtype=np.uint64), np.arange(500, 800))
    m = merge_tables(a, b)
    m.check_invariant()
    assert sorted(m.doc_ids.tolist()) == list(range(800))
    bad = BlockTables(m.fps, m.doc_ids, m.rot2, m.rot1, m.rot3)
    with pytest.raises(AssertionError):
        bad.check_invariant()


def test_save_load_round_trip(tmp_path):
    rng = random.Random(11)
    index, pairs, bases = build(rng, 1500, tail_capacity=100)
    path = tmp_path / "simhash.idx"
    index.save(path)
    loaded = SimhashIndex.load(path)
    assert len(loaded) == len(index) and loaded.run_sizes == index.run_sizes
    loaded.check_invariant()
    for _ in range(100):
        q = flip(rng, rng.choice(bases), rng.randrange(0, 4))
        assert loaded.query(q) == index.query(q) == brute(pairs, q, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["simhash.idx"]  # no temp file left


def test_load_rejects_damage(tmp_path):
    index = SimhashIndex(tail_capacity=8)
    for i in range(20):
        index.add(i * 0x9E3779B97F4A7C15 % 2**64, i)
    path = tmp_path / "simhash.idx"
    index.save(path)
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF  # inside the last array's payload
    bad = tmp_path / "bad.idx"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        SimhashIndex.load(bad)
    bad.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ValueError):
        SimhashIndex.load(bad)
    bad.write_bytes(b"not an index at all")
    with pytest.raises(ValueError):
        SimhashIndex.load(bad)
