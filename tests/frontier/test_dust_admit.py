"""The DUST learner's native admission pass (``DustLearner.admit_batch`` over ``_native.dustkeys``
and ``ClassTable.admit``) against its plain-Python reference (``admit_batch_reference``, the pass
as it was): the same keys for every URL shape, the same decisions and the same learner state
on a stream that learns rules of every kind, and a named outcome for hostile input."""

import random
import types
from array import array

import pytest

from crawlerd._native import dustkeys, dustkeys_ref
from crawlerd.frontier import dust_rules as R
from crawlerd.frontier.dust import DEFER, NORMAL, PROBE, SAMPLE, SKIP
from crawlerd.frontier.dust_hosts import HostInfo
from crawlerd.url.canonical import fingerprint
from tests.frontier.dust_site import Site

HOSTILE = [
    "http://h0.example/" + "a/" * 40_000 + "x.html",                  # a very long path
    "http://h0.example/m/" + "b" * 100_000 + "/c?" + "sid=1&" * 5_000,
    "http://h0.example/m/x/y?a=1&&b=&=z&",                             # empty items, names, values
    "http://h0.example/\x00/\x7f/%00?\x01=\x02",                       # odd bytes
    "http://bücher.example/m/straße/x.html?ü=1",                       # not ASCII (not normalised)
    "http://h0.example/m/a\udcff/b",                                    # a lone surrogate
    "http://h0.example", "http://h0.example?x=1", "http://h?x/m/a/b", "h0.example/m/a/b", "", "/", "?",
    "http://h0.example/;jsessionid=1/m/a;x=1/b?y=2",
    "http://h0.example/m/a/b?",                                         # "?" with no items
]


def _url(rng: random.Random, hosts: int) -> str:
    h = rng.randrange(hosts)
    first = rng.choice(["m", "amp", "print", "p", "catalog", "", "x"])
    segs = [first] + [rng.choice(["a", "b", "item", "sort"]) for _ in range(rng.randrange(0, 3))]
    url = f"http://h{h}.example/" + "/".join(segs) + f"/{rng.randrange(20)}.html"
    if rng.random() < 0.2:
        url = url.replace(".html", f".html;jsessionid={rng.getrandbits(40):x}", 1)
    if rng.random() < 0.6:
        items = [rng.choice([f"sid={rng.getrandbits(48):012x}", "utm_source=mail", f"sort={rng.randrange(3)}",
                             "view=print", "page=1", "a", "", "b=", "=z"]) for _ in range(rng.randrange(0, 4))]
        url += "?" + "&".join(items)
    return url


def _info(trusted: bool, relevant: frozenset) -> HostInfo:
    rules = ((R.parse_rule("?sid=<hex>"), 0),) if trusted else ()
    return HostInfo(rules, 0, relevant, {}, frozenset(), frozenset(), {})


def _run(scan, urls, hosts, info, lookup, marks, defer, depths, hops):
    """``scan`` to the end of the batch, the reference's ``keys`` at each stop: (stops, outputs)."""
    n = len(urls)
    fps = [fingerprint(u) for u in urls]
    k0, k1, idx, forced = array("Q", [0]) * n, array("Q", [0]) * n, array("q", [0]) * n, bytearray(n)
    stops, i, m = [], 0, 0
    while True:
        i, m = scan(urls, fps, depths, hops, hosts, i, info, lookup, marks, defer, k0, k1, forced, idx, m)
        if i >= n:
            break
        stops.append(i)
        hi = info.get(hosts[i]) if lookup else None
        if defer and not (hi is not None and hi.trusted) and not any(mk in urls[i] for mk in marks):
            k0[m], k1[m] = dustkeys_ref.keys(urls[i], fps[i], hi.relevant if hi is not None else frozenset())
            forced[m], idx[m] = depths[i] == 0 or hops[i] > 0, i
            m += 1
        i += 1
    return stops, (list(k0[:m]), list(k1[:m]), bytes(forced[:m]), list(idx[:m]))


@pytest.mark.parametrize("seed", range(4))
def test_native_keys_and_stops_are_the_references_for_every_shape_and_host_info(seed):
    rng = random.Random(seed)
    urls = [_url(rng, 12) for _ in range(3000)] + HOSTILE
    rng.shuffle(urls)
    hosts = [u[:u.find("/", 8)] for u in urls]
    names = [frozenset(), frozenset({"m"}), frozenset({"sort", "a"}), frozenset({"", "sid", "print", "x"}),
             frozenset({"catalog", "utm_source", "b", "page"})]
    info = {f"http://h{h}.example": _info(h % 5 == 4, names[h % 5]) for h in range(10)}   # h10, h11: none
    depths = [rng.choice((0, 1, 2)) for _ in urls]
    hops = [rng.choice((0, 0, 0, 1)) for _ in urls]
    for lookup, marks, defer in [(False, (), True), (True, (), True), (True, ("utm_source", ";jsessionid"), True),
                                 (True, ("/amp/",), False)]:
        native = _run(dustkeys.scan, urls, hosts, info, lookup, marks, defer, depths, hops)
        ref = _run(dustkeys_ref.scan, urls, hosts, info, lookup, marks, defer, depths, hops)
        assert native[1] == ref[1], (lookup, marks, defer)
        # the native pass stops where the reference does (rules), and also at the shapes it leaves
        assert set(ref[0]) <= set(native[0])
        assert all(urls[i] in HOSTILE or ";" in urls[i] for i in set(native[0]) - set(ref[0]))
    for u in urls:
        for rel in names:
            assert dustkeys.keys(u, fingerprint(u), rel) == dustkeys_ref.keys(u, fingerprint(u), rel), (u[:80], rel)


def test_hostile_urls_get_keys_or_a_stop_not_an_error():
    """Each hostile URL is either keyed natively or stops the pass (the reference keys it), and a
    learner admits them all with a decision."""
    fps = [fingerprint(u) for u in HOSTILE]
    n = len(HOSTILE)
    hosts = ["http://h0.example"] * n
    k0, k1, idx, forced = array("Q", [0]) * n, array("Q", [0]) * n, array("q", [0]) * n, bytearray(n)
    outcomes = []
    for j, u in enumerate(HOSTILE):
        i, m = dustkeys.scan([u], fps[j:j + 1], [1], [0], hosts[:1], 0, {}, False, (), True, k0, k1, forced, idx, 0)
        outcomes.append("keyed" if (i, m) == (1, 1) else "stop" if (i, m) == (0, 0) else (i, m))
    assert set(outcomes) == {"keyed", "stop"}
    assert [o for u, o in zip(HOSTILE, outcomes, strict=True) if "ü" in u or "\udcff" in u or ";" in u] == ["stop"] * 3


def test_a_learner_admits_hostile_urls(tmp_path):
    site = Site(str(tmp_path / "d"), lambda url: "same")
    site.fetch("http://h0.example/m/a/b")
    d = site.learner.admit_batch(HOSTILE, [fingerprint(u) for u in HOSTILE], [1] * len(HOSTILE), [0] * len(HOSTILE))
    assert len(d) == len(HOSTILE) and {x.action for x in d} <= {NORMAL, DEFER, PROBE}


def _content(changed: set):
    """The oracle: tracking and session parameters, ``view=print``, ``;jsessionid`` and a first
    ``/m/`` or ``/amp/`` never change a page; ``sort`` does on hosts 0-5; a URL in ``changed``
    is a page of its own (a rule it contradicts is retired)."""
    def content(url: str) -> str:
        if url in changed:
            return url
        p = R.parse(url)
        host = int(p.origin.split("//h")[1].split(".")[0])
        keep = [i for i, (n, v) in enumerate(p.query) if n not in ("sid", "utm_source", "ref") and
                not (n == "view" and v == "print") and not (n == "sort" and host > 5)]
        segs = tuple(s.split(";jsessionid")[0] for s in p.segs)
        if len(segs) > 3 and segs[1] in ("m", "amp"):
            segs = segs[:1] + segs[2:]
        return R.unparse(R.Parts(p.origin, segs, tuple(p.query[i] for i in keep), tuple(p.raw[i] for i in keep)))
    return content


def _variant(rng: random.Random, page: str) -> str:
    base, _, q = page.partition("?")
    r = rng.random()
    if r < 0.2:
        base = base.replace("/p/", rng.choice(["/m/p/", "/amp/p/"]), 1)
    elif r < 0.35:
        base += f";jsessionid={rng.getrandbits(40):x}"
    items = [x for x in q.split("&") if x]
    if rng.random() < 0.6:
        items.append(rng.choice([f"sid={rng.getrandbits(48):012x}", f"utm_source=s{rng.randrange(9)}",
                                 "view=print", f"ref=r{rng.randrange(3)}", f"sort={rng.randrange(3)}"]))
    return base + ("?" + "&".join(items) if items else "")


@pytest.mark.parametrize("seed", range(3))
def test_native_admission_decides_as_the_python_pass_on_a_learning_stream(tmp_path, monkeypatch, seed):
    """One stream of pages archived, batches admitted (seeds, redirects, repeats inside a batch,
    hostile URLs, with and without host keys), skips logged, commits, through two learners: one
    admits with ``admit_batch``, the other with the Python pass. The same decisions at every step,
    the same suspect table, probe budget, pending probes and samples, rules and statistics."""
    from crawlerd.frontier import dust_evidence

    monkeypatch.setattr(dust_evidence, "time", types.SimpleNamespace(time=lambda: 1.7e9))
    changed: set[str] = set()
    kw = dict(confirmations=2, sample_share=0.2, prior_sample_share=0.2, window=10, class_entries=1 << 12,
              initial_probes=64, probe_share=0.05, clock=lambda: 1.7e9)
    native, ref = Site(str(tmp_path / "n"), _content(changed), **kw), Site(str(tmp_path / "r"), _content(changed), **kw)
    rng = random.Random(seed)
    hosts = [f"http://h{i}.example" for i in range(24)]
    pages = [f"{h}/p/{rng.choice(['a', 'bb', 'catalog'])}/{k}.html" + (f"?id={k}" if k % 3 == 0 else "")
             for h in hosts for k in range(12)]
    seen = {a: 0 for a in (NORMAL, DEFER, PROBE, SAMPLE, SKIP)}
    for step in range(1500):
        op = rng.random()
        if op < 0.45:
            url = rng.choice(pages) if rng.random() < 0.4 else _variant(rng, rng.choice(pages))
            if rng.random() < 0.01:
                changed.add(url)
            assert native.fetch(url) == ref.fetch(url), step
        elif op < 0.97:
            urls = [rng.choice(pages) if rng.random() < 0.2 else _variant(rng, rng.choice(pages))
                    for _ in range(rng.choice((1, 3, 20, 60)))]
            if rng.random() < 0.3:
                urls += urls[: rng.randrange(len(urls) + 1)]          # repeats inside the batch
            if rng.random() < 0.05:
                urls.append(rng.choice(HOSTILE[2:]))
            fps = [fingerprint(u) for u in urls]
            depths = [rng.choice((0, 1, 1, 1, 2)) for _ in urls]
            hops = [rng.choice((0, 0, 0, 0, 1)) for _ in urls]
            keys = [u[:u.find("/", 8)] for u in urls] if rng.random() < 0.8 else None
            dn = native.learner.admit_batch(urls, fps, depths, hops, keys)
            dr = ref.learner.admit_batch_reference(urls, fps, depths, hops, keys)
            assert dn == dr, step
            for u, d in zip(urls, dn, strict=True):
                seen[d.action] += 1
                if d.action == SKIP:
                    for s in (native, ref):
                        s.learner.skipped(u[:u.find("/", 8)], d, f"rec-{step}".encode())
        else:
            for s in (native, ref):
                s.learner.commit()
        a, b = native.learner, ref.learner
        assert (a.tokens, a._pending, a._host_probes, a._learning) == (b.tokens, b._pending, b._host_probes,
                                                                        b._learning), step
        if step % 50 == 0:
            assert a._classes.dump() == b._classes.dump(), step
            assert a.stats() == b.stats(), step
    a, b = native.learner, ref.learner
    assert a._classes.dump() == b._classes.dump() and a.stats() == b.stats()
    assert {h: i for h, i in a.hosts.info.items()} == {h: i for h, i in b.hosts.info.items()}
    # the stream went through every case: each decision, rules of each kind, priors, relevant names
    assert all(seen.values()), seen
    kinds = {r.kind for i in a.hosts.info.values() for r, _ in i.trusted}
    assert kinds == {"?", ";", "/"}, kinds
    assert a.stats()["priors_active"] > 0 and any(i.relevant for i in a.hosts.info.values())


def test_an_archived_page_records_its_skeleton_under_its_hosts_relevant_names(tmp_path):
    """``observe`` records a page with parameters under its skeleton's fingerprint too (SKEL), the
    skeleton made with the names its host knows to change content, and nothing more for a URL
    that is its own skeleton."""
    from crawlerd.frontier.dust_store import SKEL

    site = Site(str(tmp_path / "d"), lambda url: url if "sort" in url else "page")
    h = "http://h0.example"
    site.fetch(f"{h}/p/1.html?sort=1")
    site.fetch(f"{h}/p/1.html?sort=2")                 # another page: "sort" changes content here
    assert site.learner.hosts.info[h].relevant == frozenset({"sort"})
    store = site.learner.store
    for url in [f"{h}/p/2.html?sort=3&utm_source=x", f"{h}/a/b/c.html;jsessionid=1?x=1", f"{h}/p/3.html?sort=4",
                f"{h}/p/4.html", f"{h}/p/5.html?"]:
        before = set(store._pending[store.meta["gen"]])
        site.fetch(url)
        main = R.skeleton(url, frozenset({"sort"}))[0] if "?" in url or ";" in url else url
        added = set(store._pending[store.meta["gen"]]) - before
        assert added == {fingerprint(url)} | ({fingerprint(main)} if main != url else set()), url
        if main != url:
            assert store.archived(fingerprint(main)).kind == SKEL
