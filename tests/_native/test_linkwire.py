"""The links' wire record (crawlerd._native.linkwire): native and reference write the same bytes
and read back the same links as the pickle of ``(url, fp, host_key, nofollow)`` tuples the wire
carried before (random and hostile links: empty, non-ASCII, lone surrogates, very long URLs, 5,000
links), and refuse a record they cannot read whole with ValueError."""

import gc
import pickle
import random
import struct
from itertools import starmap

import pytest

from crawlerd._native import linkwire as native
from crawlerd._native import linkwire_ref as ref
from crawlerd._native.linkrec_ref import Link as RefLink
from crawlerd.records import Link

IMPLS = [native, ref]
CHARS = "abcXYZ019/?&=#%:.-_~ é߿ü€𝄞\x00\n\t\ud800\udfff"


def old_path(links: list) -> list[Link]:
    """What the wire gave before: the tuples pickled, then a ``Link`` from each."""
    return list(starmap(Link, pickle.loads(pickle.dumps([(ln.url, ln.fp, ln.host_key, ln.nofollow)
                                                          for ln in links], protocol=pickle.HIGHEST_PROTOCOL))))


def gen_links(rng: random.Random, n: int, hosts: int = 7) -> list[Link]:
    keys = [f"http://h{i}.test" for i in range(hosts - 2)] + ["https://ü.test:8443", ""]
    out = []
    for _ in range(n):
        key = rng.choice(keys)
        size = rng.choice([0, 1, 5, 30, 80, 300])
        url = key + "".join(rng.choice(CHARS) for _ in range(size))
        fp = rng.choice([0, 1, (1 << 64) - 1, 1 << 63, rng.getrandbits(64), rng.getrandbits(20)])
        out.append(Link(url, fp, "".join([key]), rng.random() < 0.2))     # a new key object per link
    return out


def hostile() -> list[list[Link]]:
    return [[], [Link("", 0, "", False)], [Link("http://l.test/" + "x" * 1_000_000, 5, "http://l.test", True)],
            [Link("http://é.test/ü/\ud800", (1 << 64) - 1, "http://é.test", False)] * 3,
            gen_links(random.Random(5), 5000, hosts=400)]


@pytest.mark.parametrize("seed", range(20))
def test_random_links_round_trip_as_the_old_path_gave_them(seed):
    rng = random.Random(seed)
    links = gen_links(rng, rng.choice([0, 1, 20, 60, 200]))
    hosts: dict = {}
    rec = native.pack(links, hosts)
    ref_hosts: dict = {}
    assert ref.pack(links, ref_hosts) == rec and ref_hosts == hosts
    for impl in IMPLS:
        got = impl.unpack(rec, list(hosts))
        assert got == old_path(links) == links
        assert all(type(ln) is Link for ln in got)


def test_hostile_links_round_trip():
    for links in hostile():
        hosts: dict = {}
        rec = native.pack(links, hosts)
        assert rec == ref.pack(links, {})
        for impl in IMPLS:
            assert impl.unpack(rec, list(hosts)) == old_path(links)


def test_a_frame_shares_its_host_list_and_the_decoded_keys():
    rng = random.Random(1)
    pages = [gen_links(rng, 40) for _ in range(18)]
    hosts: dict = {}
    recs = [native.pack(links, hosts) for links in pages]
    assert list(hosts.values()) == list(range(len(hosts)))    # first seen, first index
    wire = pickle.loads(pickle.dumps((recs, list(hosts))))
    seen: dict = {}
    for rec, links in zip(wire[0], pages, strict=True):
        got = native.unpack(rec, wire[1])
        assert got == links
        for ln in got:          # across the frame: one object per distinct key
            assert seen.setdefault(ln.host_key, ln.host_key) is ln.host_key


def test_other_records_pack_as_the_native_one():
    links = gen_links(random.Random(2), 50)
    refs = [RefLink(ln.url, ln.fp, ln.host_key, ln.nofollow) for ln in links]
    assert native.pack(refs, {}) == native.pack(links, {}) == ref.pack(refs, {})
    gone = Link("http://a.test/", 1, "http://a.test")
    del gone.host_key
    for impl in IMPLS:
        with pytest.raises(AttributeError):
            impl.pack([gone], {})


@pytest.mark.parametrize("impl", IMPLS)
def test_a_fingerprint_past_64_bits_is_refused_when_packing(impl):
    for fp in (-1, 1 << 64):
        with pytest.raises(OverflowError):
            impl.pack([Link("http://a.test/", fp, "http://a.test")], {})


def test_unpacked_links_leave_nothing_for_the_collector():
    rec = native.pack(gen_links(random.Random(3), 60), hosts := {})
    got = native.unpack(rec, list(hosts))
    assert not any(gc.is_tracked(ln) for ln in got)


def _malformed() -> list[tuple[object, list]]:
    links = [Link("http://a.test/é", 7, "http://a.test", True), Link("http://b.test/x", 8, "http://b.test")]
    hosts: dict = {}
    rec = native.pack(links, hosts)
    keys = list(hosts)
    n, blob = struct.unpack_from("<II", rec)
    ends_at, hix_at, body_at = 8 + 8 * n, 8 + 12 * n, 8 + 17 * n
    bad = [(rec[:cut], keys) for cut in range(len(rec))]            # every truncation
    bad += [(rec + b"x", keys), (rec, keys[:1]), (rec, []), ("text", keys), (None, keys),
            (bytearray(rec), keys), (memoryview(rec), keys), (b"", keys)]
    swapped = bytearray(rec)            # ends out of order
    struct.pack_into("<II", swapped, ends_at, blob, 3)
    past = bytearray(rec)               # an end past the blob
    struct.pack_into("<I", past, ends_at + 4, blob + 1)
    host = bytearray(rec)               # a host index past the list
    struct.pack_into("<I", host, hix_at, 2)
    utf8 = bytearray(rec)               # a URL cut inside a two-byte character
    struct.pack_into("<I", utf8, ends_at, len("http://a.test/") + 1)
    assert bytes(rec[body_at:body_at + 16]).startswith(b"http://a.test/\xc3")
    huge = bytearray(rec)               # a count that would overflow the length arithmetic
    struct.pack_into("<I", huge, 0, (1 << 32) - 1)
    bad += [(bytes(b), keys) for b in (swapped, past, host, utf8, huge)]
    return bad


@pytest.mark.parametrize("impl", IMPLS)
def test_a_record_that_does_not_read_whole_is_a_value_error(impl):
    for rec, keys in _malformed():
        with pytest.raises(ValueError):
            impl.unpack(rec, keys)
