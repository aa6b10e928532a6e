"""NearIndex (runs on disk, bounded delta in RAM) against a brute-force model of the reference."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd._native.simhash_ref import hamming
from crawlerd.dedup.near_index import MIN_BUDGET_BYTES, NearIndex


def brute(pairs, q, k):
    return sorted(((d, f, hamming(f, q)) for f, d in pairs if hamming(f, q) <= k), key=lambda m: (m[2], m[0], m[1]))


def clustered(rng: random.Random, n: int):
    bases = [rng.getrandbits(64) for _ in range(max(1, n // 50))]
    out = []
    for doc in range(n):
        if rng.random() < 0.5:
            fp = rng.getrandbits(64)
        else:
            fp = rng.choice(bases)
            for b in rng.sample(range(64), rng.randrange(0, 6)):
                fp ^= 1 << b
        out.append((fp, doc))
    return out, bases


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(0, 3000), tail=st.sampled_from([1, 7, 64]),
       k=st.integers(0, 3))
def test_every_match_within_k_and_none_beyond(tmp_path_factory, seed, n, tail, k):
    rng = random.Random(seed)
    pairs, bases = clustered(rng, n)
    idx = NearIndex(tmp_path_factory.mktemp("ni"), ram_budget_bytes=MIN_BUDGET_BYTES, tail_capacity=tail)
    try:
        for i, (fp, doc) in enumerate(pairs):
            idx.add(fp, doc)
            if i % 500 == 0:
                q = rng.choice(bases) ^ (1 << rng.randrange(64))
                assert idx.query(q, k) == brute(pairs[: i + 1], q, k)
        if rng.random() < 0.5:
            idx.flush()                 # everything on disk
        qs = [rng.choice(bases) ^ (1 << rng.randrange(64)) if rng.random() < 0.8 else rng.getrandbits(64)
              for _ in range(10)]
        for q in qs:
            assert idx.query(q, k) == brute(pairs, q, k)
        qs += qs[:3]                    # a batch may ask one fingerprint twice
        assert idx.query_batch(np.array(qs, dtype=np.uint64), k) == [brute(pairs, q, k) for q in qs]
        idx.check_invariant()
    finally:
        idx.close(flush=False)


def test_ram_stays_within_budget_while_runs_go_to_disk(tmp_path):
    budget = MIN_BUDGET_BYTES
    idx = NearIndex(tmp_path, ram_budget_bytes=budget, tail_capacity=1024)
    rng = np.random.default_rng(1)
    fps = rng.integers(0, 2**64 - 1, size=600_000, dtype=np.uint64, endpoint=True)
    peak = 0
    for i in range(0, fps.shape[0], 10_000):
        idx.add_many(fps[i:i + 10_000], np.arange(i, i + 10_000, dtype=np.int64))
        peak = max(peak, idx.memory()["bytes"])
    idx.wait_idle()
    st_ = idx.stats()
    assert peak <= budget, (peak, budget)
    assert st_["pairs"] == 600_000 and st_["pairs_on_disk"] >= 600_000 - budget // 40
    assert st_["disk_runs"] >= 1 and st_["disk_bytes"] >= 40 * st_["pairs_on_disk"]
    for j in (0, 123_456, 599_999):
        q = int(fps[j]) ^ 0b110
        assert (j, int(fps[j]), 2) in idx.query(q, 3)
    qs = fps[[599_999, 0, 123_456, 7]] ^ np.uint64(0b1)
    assert idx.query_batch(qs, 3) == [idx.query(int(q), 3) for q in qs]
    assert idx.query_batch(np.array([], dtype=np.uint64), 3) == []
    idx.check_invariant()
    idx.close()


def test_reopen_keeps_disk_runs_and_marks_what_to_replay(tmp_path):
    rng = random.Random(7)
    pairs, bases = clustered(rng, 5000)
    idx = NearIndex(tmp_path, ram_budget_bytes=MIN_BUDGET_BYTES, tail_capacity=100)
    for fp, doc in pairs[:3000]:
        idx.add(fp, doc)
    idx.flush()
    for fp, doc in pairs[3000:]:
        idx.add(fp, doc)
    idx.close(flush=False)                  # as a crash: the RAM part is lost
    idx = NearIndex(tmp_path, ram_budget_bytes=MIN_BUDGET_BYTES, tail_capacity=100)
    assert idx.docs_below == 3000 and len(idx) == 3000
    for fp, doc in pairs[idx.docs_below:]:   # the owner replays its docs from the mark
        idx.add(fp, doc)
    for _ in range(20):
        q = rng.choice(bases) ^ (1 << rng.randrange(64))
        assert idx.query(q, 3) == brute(pairs, q, 3)
    idx.close()
    idx = NearIndex(tmp_path, ram_budget_bytes=MIN_BUDGET_BYTES)
    assert idx.docs_below == 5000 and len(idx) == 5000
    idx.close(flush=False)


def test_damaged_manifest_discards_the_disk_part(tmp_path):
    idx = NearIndex(tmp_path, ram_budget_bytes=MIN_BUDGET_BYTES, tail_capacity=10)
    for doc in range(100):
        idx.add(doc * 7919, doc)
    idx.close()
    (tmp_path / "manifest.json").write_text("{not json")
    idx = NearIndex(tmp_path, ram_budget_bytes=MIN_BUDGET_BYTES)
    assert idx.docs_below == 0 and len(idx) == 0
    assert not list(tmp_path.glob("near-run-*"))
    idx.close()


def test_bad_parameters(tmp_path):
    with pytest.raises(ValueError, match="ram_budget_bytes"):
        NearIndex(tmp_path, ram_budget_bytes=1 << 20)
    with pytest.raises(ValueError, match="tail_capacity"):
        NearIndex(tmp_path, tail_capacity=0)
    idx = NearIndex(tmp_path)
    with pytest.raises(ValueError, match="fingerprint"):
        idx.add(2**64, 1)
    with pytest.raises(ValueError, match="k must be"):
        idx.query(1, 4)
    idx.close()


def test_disk_full_merge_is_a_storage_fault_retried_not_a_crash(tmp_path, monkeypatch):
    # the run file is allocated before it is mapped: ENOSPC is an OSError there, never a SIGBUS
    import errno
    import time

    from crawlerd.dedup import near_index

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(near_index.os, "posix_fallocate", full)
    rng = random.Random(4)
    pairs = [(rng.getrandbits(64), d) for d in range(60_000)]      # > a third of the budget
    idx = NearIndex(tmp_path, ram_budget_bytes=MIN_BUDGET_BYTES, tail_capacity=1024, retry_s=0.2)
    try:
        for fp, doc in pairs:
            idx.add(fp, doc)                   # never waits for a merge that cannot write
        with pytest.raises(OSError):
            idx.wait_idle()
        assert idx.storage_fault is not None and idx.storage_fault.errno == errno.ENOSPC
        assert idx.stats()["disk_runs"] == 0
        # a retry may be writing its temp file at any moment; a leaked one would stay for good
        deadline = time.monotonic() + 5
        while [p for p in tmp_path.iterdir() if p.name.startswith(".")]:
            assert time.monotonic() < deadline, "temp file left behind"
            time.sleep(0.005)
        for fp, doc in pairs[::997]:
            assert (doc, fp, 0) in idx.query(fp, 0)
        monkeypatch.undo()                     # space again: the thread's next retry goes through
        deadline = time.monotonic() + 30
        while True:
            try:
                idx.wait_idle()
                break
            except OSError:
                assert time.monotonic() < deadline, "the merge was never retried"
                time.sleep(0.01)           # the thread retries every retry_s
        assert idx.storage_fault is None and idx.stats()["disk_runs"] >= 1
        idx.check_invariant()
        for fp, doc in pairs[::997]:
            assert (doc, fp, 0) in idx.query(fp, 0)
    finally:
        idx.close()
