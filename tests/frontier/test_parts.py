"""The frontier's small parts: key index, record layouts, blocklist matching, the gap rule."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd.frontier.blocklist import Blocklist, hostname_of
from crawlerd.frontier.hosts import HostRecord
from crawlerd.frontier.items import (
    QueuedURL,
    decode_tagged,
    decode_url,
    encode_tagged,
    encode_url,
    qkey,
    qkey_level,
    qprefix,
    with_attempts,
)
from crawlerd.frontier.keyindex import KeyIndex
from crawlerd.frontier.politeness import Politeness, is_failure, is_retryable
from crawlerd.outcome import Outcome


class IndexedKeys:
    """KeyIndex used the way HostTable uses it: a key list with a free list."""

    def __init__(self):
        self.keys: list = []
        self.free: list[int] = []
        self.index = KeyIndex(self.keys)

    def add(self, key):
        if self.free:
            s = self.free.pop()
            self.keys[s] = key
        else:
            s = len(self.keys)
            self.keys.append(key)
        self.index.put(key, s)
        return s

    def remove(self, key):
        s = self.index.get(key)
        assert self.index.delete(key)
        self.keys[s] = None
        self.free.append(s)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 60)), max_size=400))
def test_key_index_matches_a_dict(ops):
    ix, ref = IndexedKeys(), {}
    for add, k in ops:
        key = f"http://h{k}.test"
        if add and key not in ref:
            ref[key] = ix.add(key)
        elif not add and key in ref:
            ix.remove(key)
            del ref[key]
        assert len(ix.index) == len(ref)
    for k in range(61):
        key = f"http://h{k}.test"
        assert ix.index.get(key) == ref.get(key)
        assert (key in ix.index) == (key in ref)
    assert sorted(ix.index.items()) == sorted(ref.items())
    assert ix.index.delete("http://absent.test") is False


def test_key_index_survives_heavy_churn_with_collisions():
    ix, ref = IndexedKeys(), {}
    rng = random.Random(4)
    for _ in range(20000):
        key = f"k{rng.randrange(3000)}"
        if key in ref and rng.random() < 0.5:
            ix.remove(key)
            del ref[key]
        elif key not in ref:
            ref[key] = ix.add(key)
    assert all(ix.index.get(k) == s for k, s in ref.items())
    assert len(ix.index) == len(ref) and ix.index.mask + 1 >= 2 * len(ref)


@given(st.text(min_size=1, max_size=300), st.integers(0, 2**64 - 1), st.integers(0, 70000),
       st.integers(0, 70000), st.integers(0, 300))
def test_url_record_round_trip(url, fp, depth, hops, attempts):
    item = QueuedURL(url, "http://h.test", 2, depth, hops, fp, attempts)
    back = decode_url(encode_url(item), "http://h.test", 2)
    assert back == QueuedURL(url, "http://h.test", 2, min(depth, 65535), min(hops, 65535), fp, min(attempts, 255))
    assert decode_url(with_attempts(encode_url(item), 7), "h", 2).attempts == 7


def test_queue_keys_sort_as_queues():
    keys = [qkey(2, 0, 10), qkey(1, 3, 1), qkey(1, 0, 5), qkey(1, 0, 300), qkey(300, 0, 1)]
    assert sorted(keys) == [qkey(1, 0, 5), qkey(1, 0, 300), qkey(1, 3, 1), qkey(2, 0, 10), qkey(300, 0, 1)]
    assert qkey(7, 3, 9).startswith(qprefix(7, 3)) and qkey_level(qkey(7, 3, 9)) == 3


def test_tagged_record_round_trip():
    raw = encode_tagged("dead_letter:timeout", "http://ü.test", qkey(1, 2, 3), b"\x00rec")
    assert decode_tagged(raw) == ("dead_letter:timeout", "http://ü.test", qkey(1, 2, 3), b"\x00rec")


def test_host_record_round_trip():
    rec = HostRecord(9, 0b101, 77, 3, 1, 1, 4, 10.5, 20.25, 30.0, 5.0, 40.0, "127.0.0.1")
    assert HostRecord.decode(rec.encode()) == rec


@pytest.mark.parametrize("text, name", [
    ("https://WWW.Example.com:8443", "www.example.com"),
    ("example.com.", "example.com"),
    ("http://[::1]:8080", "::1"),
    ("http://user@host.test/path", "host.test"),
])
def test_hostname_of(text, name):
    assert hostname_of(text) == name


def test_blocklist_matches_labels_not_substrings():
    bl = Blocklist(["Example.COM."])
    assert bl.matches("example.com") and bl.matches("http://a.b.example.com:81")
    assert not bl.matches("badexample.com") and not bl.matches("example.com.au")
    assert Blocklist.covers("example.com", "https://x.example.com")
    with pytest.raises(ValueError):
        Blocklist(["http://"])


def test_gap_rule_and_failures():
    p = Politeness(delay_factor=10.0, min_delay_s=1.0, max_delay_s=60.0, crawl_delay_cap_s=30.0,
                   backoff_base_s=10.0, backoff_max_s=100.0, park_after_failures=5, park_s=1000.0)
    assert p.gap_s(0.01, 0.0, 0) == 1.0 and p.gap_s(2.0, 0.0, 0) == 20.0 and p.gap_s(99, 0.0, 0) == 60.0
    assert p.gap_s(0.01, 7.0, 0) == 7.0 and p.gap_s(0.5, 0.0, 2) == 15.0
    assert p.crawl_delay(45.0) == 30.0 and p.crawl_delay(None) == 0.0 and p.crawl_delay(float("nan")) == 0.0
    rng = random.Random(1)
    assert p.failure_wait_s(1, 12.0, rng) == 12.0
    assert 40.0 <= p.failure_wait_s(3, None, rng) <= 60.0
    assert p.failure_wait_s(9, None, rng) == 1000.0 and p.failure_wait_s(5, 3.0, rng) == 1000.0
    assert is_failure(Outcome.OK, 503) and is_failure(Outcome.TIMEOUT, 0) and not is_failure(Outcome.OK, 404)
    assert is_retryable(Outcome.OK, 429) and not is_retryable(Outcome.OK, 500)
    assert not is_retryable(Outcome.TOO_LARGE, 0)
