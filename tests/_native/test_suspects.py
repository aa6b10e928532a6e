"""The DUST suspect table: the native kernel answers exactly as the numpy reference on random key
streams that overflow it (rows full, round-robin replacement, duplicates inside a batch)."""

import random
from array import array

import numpy as np
import pytest

from crawlerd._native.suspects import ClassTable
from crawlerd._native.suspects_ref import RefClassTable

TAG = 0x5851F42D4C957F2D
IMPLS = [ClassTable, RefClassTable]


def _stream(rng: random.Random, batches: int, pool: list[int]):
    """Batches of keys drawn from ``pool`` (repeats across and inside batches) and fresh ones."""
    for _ in range(batches):
        n = rng.choice((0, 1, 3, 17, 250, 900))
        yield [rng.choice(pool) if rng.random() < 0.5 else rng.getrandbits(64) for _ in range(n)]


@pytest.mark.parametrize("entries", [16, 1024, 5000])
@pytest.mark.parametrize("seed", range(4))
def test_native_answers_as_reference_on_random_streams_with_eviction(entries, seed):
    rng = random.Random(seed)
    # a pool of keys, some in one row (r << 8 with k >> 29 == 0: row 0 of 256), and 0 (stored as 1)
    pool = [rng.getrandbits(64) for _ in range(300)] + list(range(40)) + [r << 8 for r in range(1, 12)] + [1 << 40]
    native, ref = ClassTable(entries), RefClassTable(entries)
    assert (native.capacity, native.nbytes) == (ref.capacity, ref.nbytes)
    for batch in _stream(rng, 120, pool):
        probe = batch + [rng.choice(pool) for _ in range(50)]
        assert native.has_many(probe).tolist() == ref.has_many(probe).tolist()
        k1 = [rng.choice(pool) if rng.random() < 0.5 else 0 for _ in probe]
        assert native.hits(probe, k1, TAG) == ref.hits(probe, k1, TAG)
        feed = array("Q", batch) if rng.random() < 0.3 else batch
        native.add_many(feed)
        ref.add_many(np.asarray(batch, dtype=np.uint64))
        assert native.dump() == ref.dump()


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__name__)
class TestClassTable:
    def test_a_full_row_replaces_its_oldest_key(self, impl):
        t = impl(16)                        # 256 rows of 4
        row = [r * 256 for r in range(1, 7)]            # k >> 29 == 0: all in row 0
        t.add_many(row[:4])
        assert t.has_many(row[:4]).all()
        t.add_many(row[4:5])                            # the first added goes
        assert t.has_many(row).tolist() == [False, True, True, True, True, False]

    def test_at_most_ways_keys_of_one_row_per_batch_and_no_double_add(self, impl):
        t = impl(16)
        row = [r * 256 for r in range(1, 7)]
        t.add_many(row)                                 # the fifth and sixth of the batch are dropped
        assert t.has_many(row).tolist() == [True, True, True, True, False, False]
        t.add_many(row[:2])                             # there already: the cursor does not move
        t.add_many(row[4:5])
        assert t.has_many(row).tolist() == [False, True, True, True, True, False]

    def test_zero_is_a_key(self, impl):
        t = impl(16)
        assert not t.has_many([0]).any()
        t.add_many([0])
        assert t.has_many([0, 1]).tolist() == [True, True]     # 0 is stored as 1
        assert t.hits([5, 7], [0, 0], TAG) == b"\0\0"
        assert t.hits([0], [0], TAG) == b"\1"

    def test_hits_any_of_the_three_keys(self, impl):
        t = impl(1024)
        t.add_many([11, 22 ^ TAG, 33])
        assert t.hits([11, 22, 44, 44, 55], [0, 0, 33, 0, 66], TAG) == b"\1\1\1\0\0"
        with pytest.raises(ValueError):
            t.hits([1, 2], [1], TAG)


@pytest.mark.parametrize("entries", [16, 5000])
@pytest.mark.parametrize("seed", range(3))
def test_admit_is_hits_the_batchs_own_keys_and_add_many_in_one_pass(entries, seed):
    """``ClassTable.admit`` (the learner's suspect pass in C) answers and fills the table as the
    pass written with ``hits``, a Python set and ``add_many`` (``suspects_ref.ref_admit``), on
    batches with repeats, keys that are another's ``^ tag``, 0 keys and forced entries."""
    from crawlerd._native.suspects_ref import ref_admit

    rng = random.Random(seed)
    pool = [rng.getrandbits(64) for _ in range(200)] + [0, 1, TAG] + [r << 8 for r in range(1, 6)]
    pool += [k ^ TAG for k in pool[:40]]
    native, by_calls, ref = ClassTable(entries), ClassTable(entries), RefClassTable(entries)
    for batch in _stream(rng, 80, pool):
        n = len(batch)
        k1 = [rng.choice(pool) if rng.random() < 0.5 else 0 for _ in batch]
        forced = bytes(rng.random() < 0.1 for _ in batch)
        pad = rng.randrange(3)                      # the learner's arrays may be longer than n
        k0a, k1a = array("Q", batch + [7] * pad), array("Q", k1 + [7] * pad)
        got = native.admit(k0a, k1a, bytearray(forced + b"\1" * pad), n, TAG)
        assert got == ref_admit(by_calls, batch, k1, forced, n, TAG) == ref.admit(batch, k1, forced, n, TAG)
        assert native.dump() == by_calls.dump() == ref.dump()
    with pytest.raises(ValueError):
        native.admit(array("Q", [1]), array("Q", [1]), b"\0", 2, TAG)
