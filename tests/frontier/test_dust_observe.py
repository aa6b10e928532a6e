"""The DUST learner's native observation (``DustLearner.observe`` over ``_native.dustobs``) against
its plain-Python reference (``dustobs_ref``, a learner built with ``native=False``): the same
window pairs for every URL shape, the same archived-set answers, and on a long learning stream the
same changes, rules, tables and store bytes."""

import gc
import random
import types

import pytest

from crawlerd._native import dustobs, dustobs_ref
from crawlerd.frontier import dust_rules as R
from crawlerd.frontier.dust import DEFER, NORMAL, PROBE, SAMPLE, SKIP
from crawlerd.url.canonical import fingerprint
from tests.frontier.dust_site import Site, digest
from tests.frontier.test_dust_admit import HOSTILE, _content, _variant

SHAPES = ["http://h.example/a/b.html", "http://h.example/a/b.html?x=1", "http://h.example/a/c.html?x=1",
          "http://h.example/z/b.html?x=1", "http://h.example/a/b.html?x=2", "http://h.example/a/b.html?",
          "http://h.example/a/b.html?x=1&y=2", "http://h.example/a;s=1/b.html", "http://h.example/",
          "http://h.example", "http://h.example?x=1", "http://h.example/a/b?x=/c", "http://h.example/a//b",
          "http://h.example/ä/b.html?ü=1", "http://h.example/a\udcff/b?q", "", "?", "/", ";", "http://h.example/a/b/",
          "http://h.example/q/b.html?x=1", "http://h.example/a/b.htm?x=1"] + HOSTILE[2:]


def test_scan_lists_the_pairs_the_reference_does_for_every_shape():
    """Every window of shapes (with equal, near and far digests and simhashes) against every page:
    the native scan gives the reference's pairs and flags, the same window without refetches."""
    rng = random.Random(7)
    for _ in range(3000):
        window = [(rng.choice(SHAPES), rng.randrange(3), rng.choice((0, 0xFF, 0xFF ^ 0x7, 0xFF ^ 0xF0F0, 1 << 63)),
                   rng.choice(("", "http://h.example/a/b.html"))) for _ in range(rng.randrange(0, 30))]
        page = (rng.choice(SHAPES), rng.randrange(3), rng.choice((0, 0xFF, 0xFF ^ 0x3)), "")
        near = rng.choice((0, 3, 64))
        wn, wr = dustobs.from_lists(window), dustobs_ref.from_lists(window)
        on, pn = dustobs.scan(wn, dustobs.Evidence(*page), near)
        orf, pr = dustobs_ref.scan(wr, dustobs_ref.Evidence(*page), near)
        assert pn == pr, (window, page, near)
        assert dustobs.to_lists(on) == dustobs_ref.to_lists(orf)
        assert dustobs.to_lists(wn) == dustobs_ref.to_lists(wr) == [list(x) for x in window]


def test_the_archived_sets_probe_and_put_answer_as_the_reference():
    """Random fingerprints put into and probed from two generations (with and without filters):
    the same answers and the same filter bits and pending entries."""
    rng = random.Random(3)
    for filtered in (True, False):
        mask = (1 << 12) - 1
        sides = []
        for _ in range(2):
            sides.append(([{}, {}], [bytearray(512), bytearray(512)] if filtered else None))
        fps = [rng.getrandbits(64) for _ in range(3000)]
        for i, fp in enumerate(fps):
            g = rng.randrange(2)
            q = rng.choice(fps[: i + 1])
            answers = [mod.probe(p, f, mask, g, q) for mod, (p, f) in zip((dustobs, dustobs_ref), sides, strict=True)]
            assert answers[0] == answers[1], i
            v = fp.to_bytes(8, "big") + bytes(10)
            for mod, (p, f) in zip((dustobs, dustobs_ref), sides, strict=True):
                mod.put(p[g], f[g] if f else None, mask, fp, v)
        assert sides[0] == sides[1]


def test_evidence_records_are_not_tracked_by_the_collector():
    """The window's records hold no container that could lead back to them: the cyclic collector
    does not walk them (a host state's window was a third of generation 1)."""
    e = dustobs.Evidence("http://h.example/a?b=1", 1 << 63, 5, "http://h.example/a")
    assert e.parts == R.parse(e.url)
    assert not gc.is_tracked(e)
    assert all(not gc.is_tracked(x) for x in dustobs.from_lists([e.to_list()] * 3))


def _dump(store) -> dict:
    """Every table of a DUST store, as committed (the durable bytes)."""
    out = {}
    with store.env.begin() as txn:
        for name in (b"hosts", b"lru", b"arch0", b"arch1", b"skips", b"meta"):
            db = store.env.open_db(name, txn=txn)
            out[name] = list(txn.cursor(db=db))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_native_observation_learns_as_the_reference_on_a_learning_stream(tmp_path, monkeypatch, seed):
    """One stream (2,000 steps, 24 hosts, session ids, tracking parameters, print views, mobile
    paths, path parameters, sort orders that matter on some hosts, pages that change, declared
    canonicals, near simhashes) archived and admitted through two learners: one observes natively,
    the other on the reference. The same changes at every page, the same decisions, rules, host
    infos and statistics, and after every commit the same bytes in every table of the store."""
    from crawlerd.frontier import dust_evidence

    monkeypatch.setattr(dust_evidence, "time", types.SimpleNamespace(time=lambda: 1.7e9))
    changed: set[str] = set()
    content = _content(changed)
    kw = dict(confirmations=2, sample_share=0.2, prior_sample_share=0.2, window=10, class_entries=1 << 12,
              initial_probes=64, probe_share=0.05, clock=lambda: 1.7e9, cache_hosts=8, max_bytes=256 << 10,
              max_host_bytes=2048)
    native = Site(str(tmp_path / "n"), content, **kw)
    ref = Site(str(tmp_path / "r"), content, native=False, **kw)
    assert ref.learner.hosts.State is not native.learner.hosts.State
    rng = random.Random(seed)
    hosts = [f"http://h{i}.example" for i in range(24)]
    pages = [f"{h}/p/{rng.choice(['a', 'bb', 'catalog'])}/{k}.html" + (f"?id={k}" if k % 3 == 0 else "")
             for h in hosts for k in range(12)]
    seen = {a: 0 for a in (NORMAL, DEFER, PROBE, SAMPLE, SKIP)}
    observed = commits = 0
    for step in range(2000):
        op = rng.random()
        if op < 0.5:
            url = rng.choice(pages) if rng.random() < 0.4 else _variant(rng, rng.choice(pages))
            if rng.random() < 0.04:
                changed.add(url)
            text = content(url)
            simhash = (fingerprint(text) ^ (1 << rng.randrange(64) if rng.random() < 0.3 else 0)) \
                if rng.random() < 0.9 else 0
            canonical = text if rng.random() < 0.15 else ""
            host = url[:url.find("/", 8)]
            args = (url, fingerprint(url), host, digest(text), simhash, canonical)
            assert native.learner.observe(*args) == ref.learner.observe(*args), step
            observed += 1
        elif op < 0.95:
            urls = [rng.choice(pages) if rng.random() < 0.2 else _variant(rng, rng.choice(pages))
                    for _ in range(rng.choice((1, 3, 20)))]
            fps = [fingerprint(u) for u in urls]
            depths = [rng.choice((0, 1, 1, 1, 2)) for _ in urls]
            hops = [0] * len(urls)
            dn = native.learner.admit_batch(urls, fps, depths, hops)
            assert dn == ref.learner.admit_batch(urls, fps, depths, hops), step
            for u, d in zip(urls, dn, strict=True):
                seen[d.action] += 1
                if d.action == SKIP:
                    for s in (native, ref):
                        s.learner.skipped(u[:u.find("/", 8)], d, f"rec-{step}".encode())
        else:
            for s in (native, ref):
                s.learner.commit()
            commits += 1
            assert _dump(native.learner.store) == _dump(ref.learner.store), step
        a, b = native.learner, ref.learner
        assert (a.tokens, a._pending, a._host_probes, a._learning) == (b.tokens, b._pending, b._host_probes,
                                                                        b._learning), step
        if step % 50 == 0:
            assert a.stats() == b.stats(), step
            assert a.store.memory() == b.store.memory(), step
            # the state cache's charge counts the same window characters and parsed URLs on both
            assert a.hosts.memory() == b.hosts.memory(), step
    a, b = native.learner, ref.learner
    for s in (native, ref):
        s.learner.commit()
    assert _dump(a.store) == _dump(b.store)
    assert a.stats() == b.stats() and a.hosts.info == b.hosts.info
    assert {h: a.rules_of(h) for h in a.hosts.info} == {h: b.rules_of(h) for h in b.hosts.info}
    counts = [[x.hosts.state(h).window_counts() for h in sorted(a.hosts.info)] for x in (a, b)]
    assert counts[0] == counts[1]
    # the stream went through every case: each decision, rules of each kind, retirements, the
    # archived set's generations turned over
    assert observed >= 900 and commits >= 20, (observed, commits)
    assert all(seen.values()), seen
    kinds = {r.kind for i in a.hosts.info.values() for r, _ in i.trusted}
    assert kinds == {"?", ";", "/"}, kinds
    assert a.stats()["rules_retired_total"] > 0 and any(i.relevant for i in a.hosts.info.values())
    assert a.store.archived_reads > 0 and a.store.archived_skipped > 0 and min(a.store.meta["gen_count"]) > 0


def test_the_reference_learner_really_runs_the_reference(tmp_path):
    """``native=False`` puts the host states, their records and the archived set on ``dustobs_ref``."""
    site = Site(str(tmp_path / "r"), lambda u: u, native=False)
    site.fetch("http://h.example/a?sid=1")
    st = site.learner.hosts.state("http://h.example")
    assert all(type(e) is dustobs_ref.Evidence for e in st.evidence) and st.evidence
    assert site.learner.store._probe is dustobs_ref.probe
