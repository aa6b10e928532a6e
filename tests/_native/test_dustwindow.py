"""The DUST window walk's first step (``_native.dustwindow.pairs``) against its plain-Python
reference on random windows: the same entries kept, the same marks (a URL that is not ASCII may
be marked 2 where the reference says 0: the learner checks it again in Python)."""

import random

import pytest
from xxhash import xxh64_intdigest

from crawlerd._native import dustwindow, dustwindow_ref
from crawlerd.frontier import dust_evidence
from crawlerd.frontier.dust_evidence import Evidence, HostState


def _url(rng: random.Random) -> str:
    path = rng.choice(["/p/1.html", "/p/2.html", "/q/1.html", "/p/1.html;s=1", "/", "/p/", "/ü/1.html", "/p/1.html\udcff"])
    query = rng.choice(["", "?", "?a=1", "?a=2", "?a=1&b=2", "?b=2", "?a=1;x"])
    return "http://h.example" + path + query


def _evidence(rng: random.Random) -> Evidence:
    sim = rng.choice([0, 0b1111, 0b1110, 0b1, 1 << 63, 2 ** 64 - 1])
    return Evidence(_url(rng), rng.choice([1, 2, 2 ** 64 - 1]), sim, "")


@pytest.mark.parametrize("seed", range(5))
def test_native_pairs_are_the_references(seed):
    rng = random.Random(seed)
    for _ in range(3000):
        window = [_evidence(rng) for _ in range(rng.randrange(0, 30))]
        ev = _evidence(rng) if rng.random() < 0.7 else rng.choice(window or [_evidence(rng)])
        near = rng.choice((0, 1, 3))
        old, marks = dustwindow.pairs(window, ev.url, ev.digest, ev.simhash, near)
        r_old, r_marks = dustwindow_ref.pairs(window, ev.url, ev.digest, ev.simhash, near)
        assert old == r_old and len(marks) == len(old)
        for e, m, r in zip(old, marks, r_marks, strict=True):
            if ev.url.isascii() and e.url.isascii():
                assert m == r, (ev.url, e.url)
            else:
                assert m == r or (m, r) == (2, 0), (ev.url, e.url)


def test_unreadable_simhashes_are_left_to_compare():
    e = Evidence("http://h.example/a", 1, 1 << 70, "")
    assert dustwindow.pairs([e], "http://h.example/b", 2, 5, 3) == ([e], b"\x01")
    e = Evidence("http://h.example/a", 1, None, "")
    assert dustwindow.pairs([e], "http://h.example/b", 2, 5, 3) == ([e], b"\x01")


def test_learning_with_the_native_walk_is_learning_with_the_reference(monkeypatch):
    """One stream of pages through two host states, one per walk: the same rules, relevant names
    and windows after every page."""
    rng = random.Random(7)
    states = [HostState(), HostState()]
    seen: tuple = ()
    for step in range(1500):
        path = rng.choice(["/p/1.html", "/p/2.html", "/m/p/1.html", "/p/1.html;jsessionid=ab12"])
        query = rng.choice(["", "?utm_source=x", "?utm_source=y", "?sort=1", "?sort=2"])
        url = "http://h.example" + path + query
        page = path.replace("/m/", "/").split(";")[0] + ("?" + query[1:] if "sort" in query else "")
        digest = xxh64_intdigest(page.encode()) if rng.random() > 0.01 else 99
        ev = [Evidence(url, digest, 0, ""), Evidence(url, digest, 0, "")]
        got = []
        for st, impl in zip(states, (dustwindow.pairs, dustwindow_ref.pairs), strict=True):
            monkeypatch.setattr(dust_evidence, "window_pairs", impl)
            learned = st.learn(ev[len(got)], k=2, near_bits=3, window=12, now=1.7e9)
            got.append((learned.agreed, [r.rule.text for r in learned.trusted], [r.rule.text for r in learned.retired],
                        learned.relevant, st.to_record()))
        assert got[0] == got[1], step
        seen += (bool(states[0].rules), bool(states[0].retired), bool(states[0].relevant))
    assert seen.count(True) > 0 and {i % 3 for i, x in enumerate(seen) if x} == {0, 1, 2}
