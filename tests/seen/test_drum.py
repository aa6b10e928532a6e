"""DRUM seen-set: answers against a dict model, kernels against their reference, triggers, invariants."""

from __future__ import annotations

import os
import random
import struct
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawlerd._native import drum as native
from crawlerd._native import drum_ref as ref
from crawlerd.seen.drum import Drum
from crawlerd.seen.drum_answers import Op, answer_runs
from crawlerd.seen.drum_files import HEADER_BYTES, DrumError

KERNELS = [pytest.param(native, id="native"), pytest.param(ref, id="ref")]


class Model:
    """The specification: a dict, operations applied in submission order."""

    def __init__(self):
        self.d: dict[int, bytes] = {}
        self.seq = 0
        self.expected: list[tuple] = []

    def apply(self, op: Op, keys, values, aux, V: int):
        for i, k in enumerate(keys):
            present = k in self.d
            old = self.d.get(k) if V else None
            self.expected.append((k, op, not present, old if present else None,
                                  aux[i] if aux is not None else None, self.seq))
            self.seq += 1
            v = values[i] if values is not None else bytes(V)
            if op == Op.UPDATE or (op == Op.CHECK_UPDATE and not present):
                self.d[k] = v


def _tuples(results):
    return [(r.key, r.op, r.unique, r.value, r.aux, r.seq) for r in results]


def _read_delivery(dv, rng) -> list[tuple]:
    # A Delivery read as its consumers do (slices, the first and last by index, iteration), and
    # checked against itself: every read gives the same answers
    n = len(dv)
    whole = _tuples(dv[:])
    assert _tuples(dv) == whole and len(whole) == n and bool(dv) == (n > 0)
    assert [_tuples([dv[i]])[0] for i in range(-n, n)] == whole + whole
    with pytest.raises(IndexError):
        dv[n]
    out, i = [], 0
    while i < n:
        j = i + rng.randint(1, 4)
        out += _tuples(dv[i:j])
        i = j
    assert out == whole and _tuples(dv[::2]) == whole[::2]
    return whole


def _key_file(path: str, V: int) -> list[tuple[int, bytes]]:
    names = [n for n in os.listdir(path) if n.startswith("keys.") and not n.endswith(".tmp")]
    if not names:
        return []
    assert len(names) == 1
    data = open(os.path.join(path, names[0]), "rb").read()[HEADER_BYTES:]
    R = 8 + V
    return [(int.from_bytes(data[i:i + 8], "little"), data[i + 8:i + R]) for i in range(0, len(data), R)]


call = st.tuples(
    st.sampled_from([Op.CHECK, Op.UPDATE, Op.CHECK_UPDATE, Op.CHECK_UPDATE]),
    st.lists(st.integers(0, 40), max_size=12),
    st.booleans(),                       # with aux
    st.booleans(),                       # with values
)
action = st.one_of(
    call.map(lambda c: ("call", c)),
    st.just(("flush", None)),
    st.just(("poll", None)),
    st.integers(1, 9).map(lambda n: ("results", n)),
    st.integers(1, 9).map(lambda n: ("arrays", n)),
    st.integers(1, 30).map(lambda n: ("delivery", n)),
    st.just(("reopen", None)),
)


@pytest.mark.parametrize("kern", KERNELS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(action, max_size=40), V=st.sampled_from([0, 3]), buckets=st.integers(1, 5),
       cache=st.sampled_from([0, 8, 64]), seed=st.integers(0, 2**32))
def test_random_streams_match_dict(kern, actions, V, buckets, cache, seed):
    # Tiny buffers so spills and merges happen every few calls.
    rng = random.Random(seed)
    space = [rng.getrandbits(64) for _ in range(41)]
    space[0] = 0                           # key 0 is never cached; it must still work
    model = Model()
    got: list[tuple] = []
    clock = [0.0]
    with tempfile.TemporaryDirectory() as d:
        kw = dict(buckets=buckets, bucket_buffer_bytes=48, merge_bytes=buckets * 160, max_age_s=5.0,
                  cache_entries=cache, value_size=V, clock=lambda: clock[0], _kernels=kern)
        dr = Drum(d, **kw)
        try:
            for kind, arg in actions:
                clock[0] += 1.0
                if kind == "call":
                    op, idx, with_aux, with_vals = arg
                    keys = [space[i] for i in idx]
                    aux = [b"u%d/%d" % (i, rng.randrange(3)) for i in idx] if with_aux else None
                    vals = [bytes(rng.randrange(256) for _ in range(V)) for _ in idx] if with_vals else None
                    if op == Op.CHECK:
                        dr.check(keys, aux=aux)
                        vals = None
                    elif op == Op.UPDATE:
                        dr.update(keys, values=vals, aux=aux)
                    else:
                        dr.check_update(keys, aux=aux, values=vals)
                    model.apply(op, keys, vals if V else None, aux, V)
                elif kind == "flush":
                    dr.flush()
                elif kind == "poll":
                    dr.poll()
                elif kind == "results":
                    got += _tuples(dr.results(arg))
                elif kind == "delivery":
                    got += _read_delivery(dr.delivery(arg), rng)
                elif kind == "arrays":
                    first, ks, un, vs = dr.results_arrays(arg)
                    for j in range(len(ks)):
                        m = model.expected[first + j]
                        got.append((int(ks[j]), m[1], bool(un[j]),
                                    vs[j].tobytes() if V and not un[j] else None, m[4], first + j))
                else:
                    dr.close()
                    dr = Drum(d, **kw)
                assert dr.pending == model.seq - len(got)
            dr.flush()
            while True:
                r = dr.results(7)
                if not r:
                    break
                got += _tuples(r)
            assert got == model.expected
            assert dr.pending == 0
            assert len(dr) == len(model.d)
            # Invariant of the key file: strictly sorted, exactly the model's keys and values.
            assert _key_file(d, V) == sorted(model.d.items())
        finally:
            dr.close()


@pytest.mark.parametrize("kern", KERNELS)
def test_many_merges_aux_intact_and_in_order(kern, tmp_path):
    rng = random.Random(7)
    pool = [rng.getrandbits(64) for _ in range(3000)]
    seen: set[int] = set()
    expected, got = [], []
    with Drum(str(tmp_path), buckets=8, bucket_buffer_bytes=256, merge_bytes=8 * 1024,
              cache_entries=256, _kernels=kern) as dr:
        merges = 0
        for _ in range(300):
            keys = [rng.choice(pool) for _ in range(rng.randint(1, 30))]
            aux = [b"https://h%d.example/%x" % (k % 97, k) for k in keys]
            gen = dr._gen
            dr.check_update(keys, aux=aux)
            merges += dr._gen != gen
            for k, a in zip(keys, aux, strict=True):
                expected.append((k, k not in seen, a))
                seen.add(k)
            got += [(r.key, r.unique, r.aux) for r in dr.results()]
        dr.flush()
        got += [(r.key, r.unique, r.aux) for r in dr.results(1 << 20)]
        assert merges >= 5
        assert dr.cache_hits > 0
        assert got == expected
        assert len(dr) == len(seen)


def test_native_and_reference_write_identical_files(tmp_path):
    rng = random.Random(3)
    calls = []
    for _ in range(60):
        keys = [rng.getrandbits(64) if rng.random() < 0.6 else rng.choice([1, 2, 3, 2**63, 2**64 - 1])
                for _ in range(rng.randint(1, 9))]
        calls.append((rng.choice([0, 1, 2]), keys, [b"a" * rng.randint(0, 5) for _ in keys],
                      bytes(rng.randrange(256) for _ in range(4 * len(keys)))))
    dirs = {}
    for kern in (native, ref):
        d = tmp_path / kern.__name__.rsplit(".", 1)[1]
        dr = Drum(str(d), buckets=3, bucket_buffer_bytes=100, merge_bytes=1 << 20, cache_entries=16,
                  value_size=4, _kernels=kern)
        for i, (op, keys, aux, vals) in enumerate(calls):
            [dr.check, dr.update, dr.check_update][op](keys, aux=aux) if op == 0 else \
                [dr.check, dr.update, dr.check_update][op](keys, values=vals, aux=aux)
            if i % 20 == 19:
                dr.flush()
        dirs[kern] = (d, dr)
    d1, d2 = dirs[native][0], dirs[ref][0]
    names = sorted(n for n in os.listdir(d1) if n not in ("LOCK",))
    assert names == sorted(n for n in os.listdir(d2) if n not in ("LOCK",))
    assert any(n.startswith("keys.") for n in names) and any(n.startswith("journal.") for n in names)
    for n in names:
        assert (d1 / n).read_bytes() == (d2 / n).read_bytes(), n
    for _, dr in dirs.values():
        dr.close()


@given(data=st.binary(max_size=200), word0=st.integers(0, 2**40))
def test_hash_words_matches_reference(data, word0):
    assert native.hash_words(data, word0) == ref.hash_words(data, word0)


@given(keys=st.lists(st.integers(0, 2**64 - 1) | st.sampled_from([0, 5, 2**64 - 1]), max_size=300))
def test_radix_sort_is_stable_and_matches_reference(keys):
    arr = np.array(keys, dtype=np.uint64)
    assert native.sort_keys(arr) == ref.sort_keys(arr)


@given(auxs=st.lists(st.binary(max_size=12), max_size=40), with_aux=st.booleans(), V=st.sampled_from([0, 2]),
       cut=st.tuples(st.integers(0, 40), st.integers(0, 40)), seq=st.integers(0, 2**40), data=st.data())
def test_a_run_of_answers_is_made_as_the_reference_makes_it(auxs, with_aux, V, cut, seq, data):
    """``make_results`` (every answer read from a delivery): native and reference give equal answers
    for any part of a run, with and without aux (empty aux included) and values."""
    n = len(auxs)
    keys = np.array(data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)), dtype=np.uint64)
    unique = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=np.uint8)
    values = np.frombuffer(data.draw(st.binary(min_size=n * V, max_size=n * V)), np.uint8) if V else None
    aux = b"".join(auxs) if with_aux else None
    ends = np.cumsum([len(a) for a in auxs], dtype=np.int64) if with_aux else None
    i0, i1 = min(cut[0], n), min(max(cut), n)
    got = [kern.make_results(keys, unique, Op.CHECK_UPDATE, seq, i0, i1, aux, ends, values, V) for kern in (native, ref)]
    assert _tuples(got[0]) == _tuples(got[1])
    assert [r.seq for r in got[0]] == list(range(seq + i0, seq + i1))
    assert [r.aux for r in got[0]] == (auxs[i0:i1] if with_aux else [None] * (i1 - i0))
    assert all(type(r) is native.Result for r in got[0]) and all(type(r) is ref.Result for r in got[1])


@given(key=st.integers(0, 2**64 - 1), other=st.integers(0, 2**64 - 1), k=st.integers(1, 4096))
def test_buckets_are_key_ranges(key, other, k):
    b = native.bucket_of(key, k)
    assert b == ref.bucket_of(key, k) and 0 <= b < k
    # Monotone in the key: bucket order is key order, so merging buckets in order writes a sorted file.
    if key <= other:
        assert b <= native.bucket_of(other, k)


@pytest.mark.parametrize("kern", KERNELS)
def test_cache_answers_repeats_and_is_bounded(kern, tmp_path):
    with Drum(str(tmp_path), buckets=2, cache_entries=100, _kernels=kern) as dr:
        assert dr._core.cache_capacity == 64          # power-of-two sets of 8, never above the request
        dr.check_update([11, 12, 13])
        dr.check_update([11, 12, 13, 14])             # 11..13 answered at submission, 14 goes to a bucket
        assert dr.cache_hits == 3
        assert dr._core.ordinals == 4
        dr.flush()
        assert [r.unique for r in dr.results()] == [True, True, True, False, False, False, True]
        dr.check_update(list(range(1000, 2000)))
        assert sum(dr._core.cache_lookup(k)[0] for k in range(1000, 2000)) <= 64


@pytest.mark.parametrize("kern", KERNELS)
def test_cached_value_is_the_current_value(kern, tmp_path):
    with Drum(str(tmp_path), buckets=2, cache_entries=64, value_size=2, _kernels=kern) as dr:
        dr.check_update([5], values=[b"aa"])
        dr.flush()
        dr.check_update([5], values=[b"bb"])      # duplicate: the value stays aa (admitted by the merge)
        dr.update([5], values=[b"cc"])             # overwrites
        dr.check([5])
        dr.flush()
        assert [(r.unique, r.value) for r in dr.results()] == [(True, None), (False, b"aa"), (False, b"aa"),
                                                                (False, b"cc")]


@pytest.mark.parametrize("kern", KERNELS)
def test_age_trigger_and_explicit_flush(kern, tmp_path):
    now = [100.0]
    with Drum(str(tmp_path), max_age_s=30.0, clock=lambda: now[0], _kernels=kern) as dr:
        assert not dr.poll()                       # nothing pending
        dr.check_update([1, 2, 3])
        now[0] = 129.0
        assert not dr.poll()
        assert dr.results() == [] and dr.pending == 3
        assert dr.poll(now=130.0)                  # the oldest submission is 30 s old
        assert [r.unique for r in dr.results()] == [True] * 3
        dr.check_update([3, 4])
        assert not dr.poll(now=131.0)
        dr.flush()                                 # the frontier is running dry
        assert [r.unique for r in dr.results()] == [False, True]
        assert dr.pending == 0


@pytest.mark.parametrize("kern", KERNELS)
def test_full_bucket_merges_inline(kern, tmp_path):
    with Drum(str(tmp_path), buckets=4, bucket_buffer_bytes=64, merge_bytes=4 * 256, cache_entries=0,
              _kernels=kern) as dr:
        keys = list(range(1, 2**64, 2**64 // 200))
        dr.check_update(keys[:10])
        assert dr.results() == []
        dr.check_update(keys[10:])                 # a bucket reaches 256 bytes: merge in this call
        assert len(dr) > 0
        out = dr.results(1000)
        assert out and all(r.unique for r in out)


def test_fast_path_arrays(tmp_path):
    keys = np.arange(1, 1001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    with Drum(str(tmp_path), buckets=4, merge_bytes=1 << 20) as dr:
        for i in range(0, 1000, 50):
            dr.check_update(keys[i:i + 50])
        dr.check_update(keys[:100])
        dr.flush()
        first, ks, un, vs = dr.results_arrays(10**6)
        assert first == 0 and np.array_equal(ks, np.concatenate([keys, keys[:100]]))
        assert un.dtype == bool and un[:1000].all() and not un[1000:].any()
        assert vs.shape == (1100, 0)


@pytest.mark.parametrize("kern", KERNELS)
def test_bad_arguments(kern, tmp_path):
    with Drum(str(tmp_path), value_size=2, _kernels=kern) as dr:
        with pytest.raises(ValueError):
            dr.check_update([1, 2], values=[b"aa"])
        with pytest.raises(ValueError):
            dr.check_update([1, 2], aux=[b"x"])
        with pytest.raises((ValueError, OverflowError)):
            dr.check_update([-1])
        with pytest.raises(DrumError):
            Drum(str(tmp_path))                    # the directory is locked by the open DRUM
        dr.check_update([])                        # nothing to do
        assert dr.pending == 0
    with pytest.raises(DrumError):
        dr.check([1])                              # closed
    with pytest.raises(DrumError, match="value_size"):
        Drum(str(tmp_path), value_size=3).close()


def test_key_file_header_is_checked(tmp_path):
    with Drum(str(tmp_path)) as dr:
        dr.check_update([1, 2, 3])
        dr.flush()
    name = next(n for n in os.listdir(tmp_path) if n.startswith("keys."))
    head = (tmp_path / name).read_bytes()[:HEADER_BYTES]
    assert head.startswith(b"DRUMKEY1") and struct.unpack_from("<Q", head, 16)[0] == 3


@pytest.mark.parametrize("kern", KERNELS)
def test_answers_are_the_kernels_result_and_the_native_one_is_not_tracked_by_the_collector(kern, tmp_path):
    import gc
    import pickle

    with Drum(str(tmp_path), buckets=2, value_size=2, _kernels=kern) as dr:
        dr.check_update([7, 8, 7], values=[b"aa", b"bb", b"cc"], aux=[b"x", b"y", b"z"])
        dr.flush()
        got = dr.results()
    assert all(type(r) is kern.Result for r in got)
    assert [(r.key, r.op, r.unique, r.value, r.aux, r.seq) for r in got] == [
        (7, Op.CHECK_UPDATE, True, None, b"x", 0), (8, Op.CHECK_UPDATE, True, None, b"y", 1),
        (7, Op.CHECK_UPDATE, False, b"aa", b"z", 2)]
    assert [gc.is_tracked(r) for r in got] == [kern is ref] * 3   # untracked: no collector pass walks it
    twin = [kern.Result(key=r.key, op=r.op, unique=r.unique, value=r.value, aux=r.aux, seq=r.seq) for r in got]
    assert twin == got and pickle.loads(pickle.dumps(got)) == got and got[0] != got[2]


_BUCKET_PAGES = """
import json, sys
import numpy as np
from crawlerd.seen.drum import Drum

def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no RssAnon in /proc/self/status")

buckets, buf = 16, 1 << 20
rng = np.random.default_rng(7)
with Drum(sys.argv[1], buckets=buckets, bucket_buffer_bytes=buf, merge_bytes=1 << 30, max_age_s=1e9,
          cache_entries=0) as dr:
    keys = rng.integers(1, 2**64, size=12 * buf // 16, dtype=np.uint64)    # ~75 % of each bucket
    base = rss_anon()
    for i in range(0, len(keys), 8192):
        dr.check_update(keys[i:i + 8192])
    assert dr.pending == len(keys)          # all still in the RAM buckets: none spilled
    filled = rss_anon() - base
    dr.flush()
    merged = rss_anon() - base
    dr.check_update(rng.integers(1, 2**64, size=buf // 16, dtype=np.uint64))     # a small epoch
    small = rss_anon() - base
print(json.dumps({"filled": filled, "merged": merged, "small": small}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_a_merge_gives_the_bucket_pages_back(tmp_path):
    # The RAM buckets' pages come in as an epoch fills them; kept after the merge, the process
    # would hold the deepest fill any epoch reached (a high-water mark that rare bursts raise:
    # private memory creeping up with the pages crawled). After a merge it holds only what the
    # next epoch fills. Measured in a process of its own: threads other tests left in this one
    # allocate while it runs.
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-c", _BUCKET_PAGES, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    assert m["filled"] > 10 << 20, m
    assert m["merged"] < 3 << 20 and m["small"] < 4 << 20, m


@pytest.mark.parametrize("kern", KERNELS)
def test_a_delivery_holds_its_answers_as_arrays_until_a_slice_is_read(kern, tmp_path):
    # A delivery of 8,192 answers is a few arrays, not 8,192 objects (with their keys, seqs and
    # aux bytes: ~3 Python objects each); a slice read from it is made of objects.
    rng = random.Random(3)
    keys = [rng.getrandbits(64) for _ in range(8192)]
    aux = [b"https://h%d.example/%x" % (k % 97, k) for k in keys]
    with Drum(str(tmp_path), buckets=4, merge_bytes=64 << 20, _kernels=kern) as dr:
        for i in range(0, len(keys), 1000):
            dr.check_update(keys[i:i + 1000], aux=aux[i:i + 1000])
        dr.flush()
        before = sys.getallocatedblocks()
        dv = dr.delivery(8192)
        held = sys.getallocatedblocks() - before
        assert len(dv) == 8192
        assert held < 1000, held
        part = dv[100:612]
        assert [(r.key, r.aux, r.seq, r.unique) for r in part] == [
            (k, a, 100 + j, True) for j, (k, a) in enumerate(zip(keys[100:612], aux[100:612], strict=True))]
        assert sys.getallocatedblocks() - before > held + 512     # the slice's answers are objects


@pytest.mark.parametrize("kern", KERNELS)
def test_merged_answers_waiting_for_the_consumer_stay_on_disk(kern, tmp_path):
    # A consumer slower than the merges leaves merged epochs waiting to be handed out. Their answers
    # are in their results files; only the epoch being handed out holds its answers in RAM, so a
    # backlog of merged keys does not grow private memory with its length. Nothing is lost or
    # reordered: every answer comes out once, in submission order, against a set.
    rng = random.Random(5)
    pool = [rng.getrandbits(64) for _ in range(20_000)]
    seen: set[int] = set()
    expected = []
    with Drum(str(tmp_path), buckets=8, merge_bytes=64 << 20, cache_entries=0, max_results=1000,
              auto_ack=False, _kernels=kern) as dr:
        epochs = []
        for _ in range(10):                         # ten merged epochs, none handed out yet
            keys = [rng.choice(pool) for _ in range(3000)]
            aux = [b"%x" % k for k in keys]
            dr.check_update(keys, aux=aux)
            dr.flush()
            epochs.append(len(keys))
            for k in keys:
                expected.append((k, k not in seen))
                seen.add(k)
        assert dr.ready == sum(epochs)
        assert dr.unmerged == 0
        assert dr.answers_ram_bytes == epochs[0]    # the head epoch's unique flags, 1 B a key
        got = []
        while True:
            dv = dr.delivery()
            if not len(dv):
                break
            got += [(r.key, r.unique) for r in dv]
            assert dr.answers_ram_bytes <= max(epochs)
            dr.ack()
        assert got == expected
        assert dr.answers_ram_bytes == 0 and dr.pending == 0
        dr.check_update([1, 2, 3])
        assert dr.unmerged == 3 and dr.pending == 3


@pytest.mark.parametrize("kern", KERNELS)
def test_a_deliverys_runs_are_its_answers_as_arrays(kern, tmp_path):
    # ``answer_runs`` hands a consumer (the intake's native pass) a slice's arrays, no answer objects:
    # read back, the runs hold the same keys, unique flags, seqs and aux as the slice's objects.
    rng = random.Random(5)
    keys = [rng.getrandbits(64) for _ in range(3000)]
    keys[2000:2100] = keys[:100]                    # duplicates among them
    aux = [b"1 0 1 https://h%d.example/%x" % (k % 13, k) for k in keys]
    with Drum(str(tmp_path), buckets=4, merge_bytes=64 << 20, _kernels=kern) as dr:
        for i in range(0, len(keys), 700):          # several journal blocks: runs of a delivery
            dr.check_update(keys[i:i + 700], aux=aux[i:i + 700])
        dr.flush()
        dv = dr.delivery(3000)
        for start, stop in [(0, 3000), (650, 1450), (2999, 3000), (10, 10)]:
            runs = answer_runs(dv, start, stop)
            got = []
            for ks, un, seq, i0, i1, ax, ends in runs:
                for j in range(i0, i1):
                    a0 = int(ends[j - 1]) if j else 0
                    got.append((int(ks[j]), bytes(ax[a0:int(ends[j])]), seq + j, bool(un[j])))
            assert got == [(r.key, r.aux, r.seq, r.unique) for r in dv[start:stop]]
            assert len(runs) >= (2 if stop - start > 700 else 0)
