"""The key filter: never "absent" for a key added (one by one or packed at build), mostly "absent"
for keys never added while it is sparse, "maybe" for all once saturated; and Recrawl on it: the
same answers, no store read for a URL it never tracked, rebuilt from the store at open."""

import random
import struct

from hypothesis import given, settings
from hypothesis import strategies as hst

from crawlerd.frontier.key_filter import KeyFilter, packed_chunks
from tests.frontier.recrawl_parts import T0, crash, open_rc, rec

U64 = hst.integers(0, (1 << 64) - 1)


def _packed(keys):
    return packed_chunks([struct.pack(">Q", k) for k in keys], chunk=7)


@settings(max_examples=60, deadline=None)
@given(keys=hst.lists(U64, max_size=300), size=hst.sampled_from([1, 128, 4096, 1 << 16]))
def test_every_key_added_reads_maybe_and_the_build_sets_the_same_bits(keys, size):
    one, packed = KeyFilter(size), KeyFilter(size)
    for k in keys:
        one.add(k)
    packed.add_packed(_packed(keys))
    assert all(one.maybe(k) and packed.maybe(k) for k in keys)
    if not one.saturated:
        assert bytes(one._bits) == bytes(packed._bits)


def test_keys_never_added_read_absent_while_sparse_and_maybe_once_saturated():
    rng = random.Random(7)
    kf = KeyFilter(1 << 16)                     # 2**19 bits
    added = [rng.getrandbits(64) for _ in range(20_000)]
    for k in added:
        kf.add(k)
    others = [rng.getrandbits(64) for _ in range(20_000)]
    maybes = sum(kf.maybe(k) for k in others)
    assert maybes < 0.01 * len(others)          # (1 - e^-(2 x 20,000 / 2**19))^2 ~ 0.5 %
    assert kf.size_bytes == 1 << 16 and not kf.saturated
    full = KeyFilter(128)                       # 1,024 bits: saturated at 512 keys
    full.add_packed(_packed(added[:600]))
    assert full.saturated and all(full.maybe(k) for k in others)


def test_size_rounds_down_to_a_power_of_two_and_odd_packed_keys_give_no_filter():
    assert KeyFilter(3000).size_bytes == 2048
    assert KeyFilter(0).size_bytes == 128       # the floor: 1,024 bits
    kf = KeyFilter(1024)
    kf.add_packed([b"\x00" * 12])
    assert kf.saturated and kf.maybe(12345)


class _CountingReads:
    """A recrawl transaction (or overlay) whose ``urls`` gets are counted."""

    def __init__(self, txn, db, counter):
        self._txn, self._db, self._counter = txn, db, counter

    def get(self, key, db=None, **kw):
        if db is self._db:
            self._counter.append(key)
        return self._txn.get(key, db=db, **kw)

    def __getattr__(self, name):
        return getattr(self._txn, name)


def _count_reads(rc):
    reads = []
    w = rc._w
    rc._w = lambda: _CountingReads(w(), rc._urls, reads)
    return reads


def test_recrawl_reads_no_state_for_a_url_it_never_tracked(tmp_path):
    rc = open_rc(tmp_path / "r", key_filter_bytes=4096)
    try:
        reads = _count_reads(rc)
        fp = 0x9E3779B97F4A7C15
        assert rc.validators(fp) == (None, None)          # a fresh link's lease
        assert rc.record("http://a.test/x", fp, "http://a.test", fetched_at=T0, status=200, etag='"e"',
                         last_modified=None, digest="d", changed=None)      # its answer: a first visit
        assert reads == []
        assert rc.validators(fp) == ('"e"', None)          # tracked now: read, and found
        assert len(reads) == 1 and rc.reads_skipped == 2
        assert rc.stats()["key_filter"] == {"bytes": 4096, "keys": 1, "saturated": False, "reads_skipped": 2}
    finally:
        rc.close()


def test_recrawl_builds_its_filter_from_the_store_at_open(tmp_path):
    path = tmp_path / "r"
    rc = open_rc(path)                                     # written without a filter
    rng = random.Random(3)
    fps = [rng.getrandbits(64) for _ in range(600)]
    for i, fp in enumerate(fps):
        rc.record(f"http://a.test/{i}", fp, "http://a.test", fetched_at=T0, status=200, etag=f'"{i}"',
                  last_modified=None, digest="d", changed=None)
    rc.commit()
    rc.record("http://a.test/lost", 77, "http://a.test", fetched_at=T0, status=200, etag='"l"',
              last_modified=None, digest="d", changed=None)
    rc = None
    crash()                                                # the last record is lost with its transaction
    rc = open_rc(path, key_filter_bytes=4096)
    try:
        assert [rc.validators(fp)[0] for fp in fps] == [f'"{i}"' for i in range(len(fps))]
        assert rc.state(77) is None and rc.stats()["key_filter"]["keys"] == len(fps)
        rc.check_invariants()
    finally:
        rc.close()
    rc = open_rc(path, key_filter_bytes=128)               # more URLs than 1,024 bits hold usefully
    try:
        assert rc.stats()["key_filter"]["saturated"]
        reads = _count_reads(rc)
        assert rc.validators(5) == (None, None) and len(reads) == 1     # it reads, as with no filter
        assert rec(rc, 5, T0) and rc.state(5) is not None
    finally:
        rc.close()
