"""The shard intake's native passes: native and reference give the same records, answers, drops and
calls (to the filter, to ``host_key``) on generated streams, and the same as the per-URL loops the
intake ran before them (the filter's ``check`` on every link; one answer object per answer)."""

import random

import numpy as np
import pytest

from crawlerd._native import intake as native
from crawlerd._native import intake_ref as ref
from crawlerd._native.linkrec_ref import Link as RefLink
from crawlerd.records import Link
from crawlerd.seen import DrumResult, answer_runs
from crawlerd.seen.drum_answers import Op
from crawlerd.url.filter import UrlFilter
from crawlerd.url.hosts import host_key

IMPLS = [native, ref]
HOSTS = ["http://a.example", "http://b.example:8080", "https://c.example", "http://d.example", "http://é.example"]
PATHS = ["/", "/x", "/a/b/c", "/a/b/a/b/a/b/", "/p?id=1", "/p?id=2&s=3", "/" + "d/" * 40, "/q?" + "&".join(
    f"k{i}=v" for i in range(25)), "/ü/ß", "/long" + "z" * 3000, "/cal?day=", "/s/%20x"]


def gen_links(rng: random.Random, n: int) -> list[Link]:
    out, h = [], HOSTS[0]
    for _ in range(n):
        if rng.random() < 0.3:
            h = rng.choice(HOSTS)
        p = rng.choice(PATHS)
        if p.endswith("="):
            p += str(rng.randrange(50))
        url = h + p
        out.append(Link(url, rng.getrandbits(64), host_key(url)))
    return out


def counted(check):
    calls = []

    def call(url, key):
        calls.append((url, key))
        return check(url, key)
    return calls, call


def small_filter() -> UrlFilter:
    return UrlFilter(max_url_length=200, max_path_depth=6, max_repeated_segments=2, max_query_params=20,
                     max_param_values=10)


@pytest.mark.parametrize("impl", IMPLS, ids=["native", "ref"])
class TestLinks:
    def test_records_drops_and_filter_state_match_check_on_every_link(self, impl):
        rng = random.Random(7)
        links = gen_links(rng, 3000)
        mine, theirs = small_filter(), small_filter()
        reasons = []
        keys, aux, lens = impl.links(links, b"3 0 1 ", mine.max_url_length, mine.quick_slashes, mine.check, reasons)
        want_keys, want_aux, want_reasons = [], [], []
        for ln in links:                            # the loop Intake.submit_links ran
            reason = theirs.check(ln.url, ln.host_key)
            if reason:
                want_reasons.append(reason)
            else:
                want_keys.append(ln.fp)
                want_aux.append(f"3 0 1 {ln.url}".encode())
        assert keys.dtype == np.uint64 and keys.tolist() == want_keys
        assert aux == want_aux
        assert lens.dtype == np.dtype("<u4") and lens.tolist() == [len(a) for a in want_aux]
        assert reasons == want_reasons and len(set(reasons)) == 5     # every drop reason met
        assert mine.drops == theirs.drops and mine.memory() == theirs.memory()

    def test_quick_test_keeps_stateful_urls_for_check_in_order(self, impl):
        f = small_filter()
        calls, check = counted(f.check)
        links = gen_links(random.Random(3), 500)
        impl.links(links, b"1 0 0 ", f.max_url_length, f.quick_slashes, check, [])
        queried = [ln.url for ln in links if "?" in ln.url]
        assert [u for u, _ in calls if "?" in u] == queried         # every query URL, in order
        if impl is native:      # the kernel's own quick test passes the plain short URLs
            assert all("?" in u or len(u) > f.max_url_length or u.count("/", len(k)) > f.quick_slashes
                       for u, k in calls)

    def test_any_string_width_and_either_link_record(self, impl):
        """The quick test reads one-byte strings in place and wider ones by character: the same
        records as the filter on every link, for native and reference ``Link``s alike."""
        urls = ["http://a.example/x/y", "http://a.example/\u65e5\u672c/a/b/c/d/e/f/g", "http://a.example/\u65e5?q=1",
                "http://\u00e9.example/\u00fc", "http://a.example/\U0001f600/x", "http://a.example/?\U0001f600",
                "http://a.example/" + "\u0100/" * 9]
        links = [cls(u, i + 1, host_key(u)) for i, u in enumerate(urls) for cls in (Link, RefLink)]
        mine, theirs = small_filter(), small_filter()
        keys, aux, _ = impl.links(links, b"1 0 0 ", mine.max_url_length, mine.quick_slashes, mine.check, [])
        kept = [ln for ln in links if not theirs.check(ln.url, ln.host_key)]
        assert 0 < len(kept) < len(links)
        assert keys.tolist() == [ln.fp for ln in kept]
        assert aux == [f"1 0 0 {ln.url}".encode() for ln in kept]

    def test_a_link_missing_a_field_raises(self, impl):
        ln = Link("http://a.example/x", 1, "http://a.example")
        del ln.host_key
        with pytest.raises(AttributeError):
            impl.links([ln], b"0 0 0 ", 100, 5, lambda u, k: None, [])

    def test_empty_and_all_dropped(self, impl):
        keys, aux, lens = impl.links([], b"0 0 0 ", 10, 2, lambda u, k: None, [])
        assert len(keys) == 0 and aux == [] and len(lens) == 0
        reasons = []
        keys, aux, _ = impl.links(gen_links(random.Random(1), 5), b"0 0 0 ", 5, 2, lambda u, k: "url_too_long", reasons)
        assert len(keys) == 0 and aux == [] and reasons == ["url_too_long"] * 5


def gen_answers(rng: random.Random, n: int, seq0: int = 100) -> list[DrumResult]:
    out, h = [], HOSTS[0]
    heads = [b"1 0 1 ", b"2 0 1 ", b"2 1 255 ", b"0 0 0 ", b"12 3 4 "]
    head = heads[0]
    for i in range(n):
        if rng.random() < 0.25:
            h = rng.choice(HOSTS)
        if rng.random() < 0.1:
            head = rng.choice(heads)
        url = h + rng.choice(PATHS[:6] + ["/é", "/a b"])
        out.append(DrumResult(rng.getrandbits(64), Op.CHECK_UPDATE, rng.random() < 0.6, None,
                              head + url.encode(), seq0 + i))
    return out


def admitted_before(results, mark):
    """The loop ``Intake._admit`` ran over answer objects, up to robots.txt."""
    fresh, hosts, dup, again, hk, prefix = [], [], 0, 0, "", "\0"
    for r in results:
        if r.seq < mark:
            again += 1
            continue
        if not r.unique:
            dup += 1
            continue
        d, h, p, u = r.aux.split(b" ", 3)
        url = u.decode()
        if not url.startswith(prefix):
            key = host_key(url)
            if key != hk:
                hk, prefix = key, key + "/"
                hosts.append((len(fresh), hk))
        fresh.append((r.key, r.aux, int(d), int(h), int(p), url, hk))
    return fresh, hosts, dup, again


@pytest.mark.parametrize("impl", IMPLS, ids=["native", "ref"])
class TestAnswers:
    def test_same_as_the_answer_loop_across_runs_and_a_mark(self, impl):
        rng = random.Random(11)
        results = gen_answers(rng, 1200)
        results = results[:500] + gen_answers(rng, 700, seq0=5000)      # two runs of consecutive seqs
        for mark, start, stop in [(0, 0, 1200), (400, 0, 1200), (5300, 250, 1100), (10**9, 0, 1200)]:
            runs = answer_runs(results, start, stop)
            assert len(runs) == (2 if start < 500 < stop else 1)
            calls = []
            got = impl.answers(runs, mark, lambda u, calls=calls: calls.append(u) or host_key(u))
            assert got == admitted_before(results[start:stop], mark)
            assert len(calls) <= len(got[0])

    def test_host_key_once_per_run_of_one_host(self, impl):
        results = [DrumResult(i, Op.CHECK_UPDATE, True, None, f"1 0 1 {h}/p{i}".encode(), i)
                   for i, h in enumerate(["http://a.example"] * 5 + ["http://b.example"] * 3 + ["http://a.example"])]
        calls = []
        fresh, hosts, dup, again = impl.answers(answer_runs(results, 0, 9), 0, lambda u: calls.append(u) or host_key(u))
        assert len(calls) == 3 and [at for at, _ in hosts] == [0, 5, 8]
        assert fresh[0][6] is fresh[4][6]           # one host key object for the run
        assert (dup, again) == (0, 0)

    def test_bad_record_raises(self, impl):
        bad = [DrumResult(1, Op.CHECK_UPDATE, True, None, b"1 0 http://a.example/", 0)]
        with pytest.raises(ValueError):
            impl.answers(answer_runs(bad, 0, 1), 0, host_key)
        with pytest.raises(ValueError):
            impl.answers(answer_runs(bad, 0, 1), 0, host_key)
        dup_only = [DrumResult(1, Op.CHECK_UPDATE, False, None, b"junk", 0)]
        assert impl.answers(answer_runs(dup_only, 0, 1), 0, host_key) == ([], [], 1, 0)
