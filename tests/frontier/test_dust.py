"""The DUST learner on synthetic hosts: rules, trust after k confirmations, retirement, suspects
(crawlerd.frontier.dust, dust_evidence, dust_rules); its store's persistence and bounds are in
test_dust_store.py."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawlerd.frontier import dust_rules as R
from crawlerd.frontier.dust import DEFER, NORMAL, PROBE, SAMPLE, SKIP
from crawlerd.frontier.dust_suspects import ClassTable
from crawlerd.url.canonical import normalize
from tests.frontier.dust_site import H, Site, tracking_content

# -- the rule grammar ------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["?utm_source", "?sid=<hex>", "?sid=<token>", "?n=<num>", "?view=print",
                                  "?page=1", ";jsessionid", ";jsessionid=<hex>", "/m/ -> /", "/amp/ -> /full/"])
def test_rule_text_round_trips(text):
    assert R.parse_rule(text).text == text


@pytest.mark.parametrize("bad", ["", "?", "utm", "/m/", "/m/ -> ", "?a=<nope>"])
def test_bad_rule_text_is_refused(bad):
    with pytest.raises(ValueError):
        R.parse_rule(bad)


@pytest.mark.parametrize("rule,url,out", [
    ("?utm_source", H + "/a?x=1&utm_source=n&y=2&utm_source=m", H + "/a?x=1&y=2"),
    ("?utm_source", H + "/a?utm_source=n", H + "/a"),
    ("?sid=<hex>", H + "/a?sid=1f3e5a7b9c&id=3", H + "/a?id=3"),
    ("?sid=<hex>", H + "/a?sid=12345678", None),                  # digits only: num, not hex
    ("?view=print", H + "/a?view=print", H + "/a"),
    ("?view=print", H + "/a?view=full", None),
    (";jsessionid", H + "/a/b.html;jsessionid=ABC123", H + "/a/b.html"),
    ("/m/ -> /", H + "/m/p/3.html?q=1", H + "/p/3.html?q=1"),
    ("/m/ -> /", H + "/p/m", None),                               # never the resource name
    ("/amp/ -> /full/", H + "/amp/x.html", H + "/full/x.html"),
])
def test_rule_apply(rule, url, out):
    got = R.parse_rule(rule).apply(R.parse(url))
    assert (R.unparse(got) if got is not None else None) == out
    if out is not None:
        assert normalize(out) == out          # rewrites keep URLs normalised


def test_derive_explains_pairs_by_one_kind_of_difference():
    texts = lambda a, b, **kw: {r.text for r in R.derive(a, b, **kw)}   # noqa: E731
    assert texts(H + "/p?utm_source=a&utm_medium=b", H + "/p") >= {"?utm_source", "?utm_medium"}
    assert texts(H + "/p?sort=asc", H + "/p?sort=desc") == {"?sort"}
    assert texts(H + "/m/p/3.html", H + "/p/3.html") == {"/m/ -> /"}
    assert texts(H + "/p?page=1", H + "/p", relevant=frozenset({"page"})) == {"?page=1"}
    assert texts(H + "/p?page=2", H + "/p?page=3", relevant=frozenset({"page"})) == set()
    assert texts(H + "/p/3.html", H + "/p/4.html") == set()       # another resource: no rule
    assert texts(H + "/a?x=1", "http://other.example/a") == set()


def test_skeleton_drops_what_is_not_known_to_matter():
    main, dropped, alt = R.skeleton(H + "/m/p/3.html?id=3&utm_source=x", frozenset({"id"}))
    assert (main, dropped, alt) == (H + "/m/p/3.html?id=3", ("utm_source",), H + "/p/3.html?id=3")
    assert R.skeleton(H + "/a/", frozenset())[2] == ""          # /a/ minus a would be the root


def test_class_table_keeps_keys_and_stays_bounded():
    t = ClassTable(1024)
    keys = [random.Random(1).getrandbits(64) for _ in range(1)] + list(range(1, 600))
    t.add_many(keys)
    assert t.has_many(keys).sum() >= 550            # a few lost to full buckets: fetched, never skipped
    assert not t.has_many([10 ** 12 + 7, 10 ** 12 + 9]).any()
    t.add_many(list(range(10 ** 6, 10 ** 6 + 100000)))
    assert t.capacity == 1024


# -- learning ------------------------------------------------------------------------------------

def test_tracking_parameter_learned_after_k_confirmations_then_skipped(tmp_path):
    s = Site(str(tmp_path / "d"), tracking_content, confirmations=3)
    trusted_at = None
    for k in range(6):
        s.fetch(f"{H}/p/{k}.html")
        ch = s.fetch(f"{H}/p/{k}.html?utm_source=mail{k}")
        if "?utm_source" in ch.trusted:
            trusted_at = k
    assert trusted_at == 2                          # the third independent pair, not before
    d = s.admit(f"{H}/p/4.html?utm_source=feed")
    assert d.action in (SKIP, SAMPLE) and d.rule == "?utm_source" and d.canonical == f"{H}/p/4.html"
    assert s.admit(f"{H}/p/99.html?utm_source=feed").action != SKIP    # its page is not archived
    assert s.admit(f"{H}/p/4.html?id=7&utm_source=feed").action != SKIP  # another page


def test_two_variants_of_one_page_are_not_independent(tmp_path):
    s = Site(str(tmp_path / "d"), tracking_content, confirmations=2)
    s.fetch(f"{H}/p/1.html")
    for v in range(5):
        assert s.fetch(f"{H}/p/1.html?utm_source=v{v}").trusted == []


def test_a_parameter_seen_with_one_value_gives_only_its_literal_rule(tmp_path):
    """page=1 is the page itself, page=2 is not: ?page=1 may be learned, ?page never."""
    def content(url):
        return url.replace("?page=1", "") if "page=1" in url else url
    s = Site(str(tmp_path / "d"), content, confirmations=2)
    learned = []
    for k in range(4):
        s.fetch(f"{H}/l/{k}")
        learned += s.fetch(f"{H}/l/{k}?page=1").trusted
    assert learned == ["?page=1"]
    assert s.admit(f"{H}/l/2?page=2").action != SKIP


def test_rule_retired_by_one_contradicting_sample_and_its_skips_requeued(tmp_path):
    changed = set()

    def content(url):
        return url if url in changed else tracking_content(url)
    s = Site(str(tmp_path / "d"), content, confirmations=2, sample_share=0.0)
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        s.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
    skipped = f"{H}/p/1.html?utm_source=late"
    d = s.admit(skipped)
    assert d.action == SKIP
    s.learner.skipped(H, d, b"record-of-the-skip")
    stats = s.learner.stats()
    assert stats["rules_trusted"] == 1 and stats["top"][0]["rules"][0]["skips"] == 1
    bad = f"{H}/p/2.html?utm_source=odd"            # the site starts to answer differently
    changed.add(bad)
    ch = s.fetch(bad)
    assert ch.retired == ["?utm_source"] and ch.requeue == [b"record-of-the-skip"] and ch.promote
    stats = s.learner.stats()
    assert stats["rules_trusted"] == 0 and stats["sample_mismatches_total"] == 1
    assert s.admit(f"{H}/p/1.html?utm_source=again").action != SKIP
    # retired for good: more agreeing pairs do not bring it back
    for k in range(3, 8):
        s.fetch(f"{H}/p/{k}.html")
        assert "?utm_source" not in s.fetch(f"{H}/p/{k}.html?utm_source=x{k}").trusted


def test_samples_are_fetched_and_counted(tmp_path):
    s = Site(str(tmp_path / "d"), tracking_content, confirmations=2, sample_share=1.0)
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        s.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
    url = f"{H}/p/1.html?utm_source=sampled"
    assert s.admit(url).action == SAMPLE
    s.fetch(url)
    rules = s.learner.stats()["top"][0]["rules"]
    assert rules[0]["rule"] == "?utm_source" and rules[0]["samples"] == 1


def test_a_rule_proven_by_samples_is_sampled_less_down_to_the_floor(tmp_path):
    s = Site(str(tmp_path / "d"), tracking_content, confirmations=2, sample_share=1.0, sample_halving=2,
             min_sample_share=0.25)
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        s.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
    serial = iter(range(1_000_000))

    def sampled_share(n=2000):
        acts = [s.admit(f"{H}/p/1.html?utm_source=v{next(serial)}").action for _ in range(n)]
        assert set(acts) <= {SAMPLE, SKIP}
        return acts.count(SAMPLE) / n

    def agree(times):                     # samples fetched: each agrees with the rule
        for _ in range(times):
            url = f"{H}/p/2.html?utm_source=a{next(serial)}"
            assert s.admit(url).action == SAMPLE
            s.fetch(url)

    assert sampled_share() == 1.0
    agree(2)
    assert 0.45 <= sampled_share() <= 0.55            # halved after 2 agreeing samples
    s.reopen()                                        # the count is the rule's, kept on disk
    assert 0.45 <= sampled_share() <= 0.55
    for _ in range(40):                               # more samples: a quarter is the floor
        url = f"{H}/p/2.html?utm_source=a{next(serial)}"
        if s.admit(url).action == SAMPLE:
            s.fetch(url)
    assert 0.22 <= sampled_share() <= 0.28
    bad = f"{H}/p/0.html?utm_source=b{next(serial)}"  # and one contradiction still retires it
    while s.admit(bad).action != SAMPLE:
        bad = f"{H}/p/0.html?utm_source=b{next(serial)}"
    changed = s.content
    s.content = lambda u: u if u == bad else changed(u)
    assert s.fetch(bad).retired == ["?utm_source"]


def test_print_view_learned_from_near_duplicates_that_name_their_canonical(tmp_path):
    texts = {}

    def content(url):       # the print view differs in markup (digest), not in text (simhash)
        return texts.setdefault(url, url)
    s = Site(str(tmp_path / "d"), content, confirmations=2)
    learned = []
    for k in range(3):
        canon = f"{H}/a/{k}.html"
        s.fetch(canon, canonical=canon, simhash=0xF0F0 + k * 0x10000)
        learned += s.fetch(f"{canon}?view=print", canonical=canon, simhash=0xF0F1 + k * 0x10000).trusted
    assert learned == ["?view=print"]          # one value seen: the literal, not "?view"
    # near but naming no canonical: says nothing, neither confirms nor retires
    s2 = Site(str(tmp_path / "e"), content, confirmations=2)
    for k in range(3):
        s2.fetch(f"{H}/a/{k}.html", simhash=0xF0F0 + k * 0x10000)
        assert s2.fetch(f"{H}/a/{k}.html?view=print", simhash=0xF0F1 + k * 0x10000).trusted == []


def test_mobile_directory_learned(tmp_path):
    s = Site(str(tmp_path / "d"), lambda u: u.replace("/m/", "/"), confirmations=2)
    learned = []
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        learned += s.fetch(f"{H}/m/p/{k}.html").trusted
    assert learned == ["/m/ -> /"]
    assert s.admit(f"{H}/m/p/1.html").action in (SKIP, SAMPLE)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_no_parameter_that_changes_content_is_ever_dropped(tmp_path_factory, seed):
    """Randomised sites where half the parameters matter (some have a default value that equals
    the page without them): no rule that drops a mattering parameter for a value that matters is
    ever trusted, and no admitted URL is skipped onto a page with other content."""
    rng = random.Random(seed)
    names = [f"p{i}" for i in range(6)]
    rng.shuffle(names)
    matters = set(names[:3])
    default = {n: str(rng.randint(0, 3)) for n in names if rng.random() < 0.5}   # value == absent
    values = {n: [str(v) for v in range(4)] + [f"{rng.getrandbits(40):x}a"] for n in names}

    def content(url: str) -> str:
        p = R.parse(url)
        kept = sorted((n, v) for n, v in p.query if n in matters and default.get(n) != v)
        return "/".join(p.segs) + "?" + "&".join(f"{n}={v}" for n, v in kept)

    def random_url() -> str:
        params = [(n, rng.choice(values[n])) for n in names if rng.random() < 0.35]
        q = "&".join(f"{n}={v}" for n, v in params)
        return f"{H}/i/{rng.randint(0, 9)}" + (f"?{q}" if q else "")

    s = Site(str(tmp_path_factory.mktemp("dust")), content, confirmations=rng.choice((2, 3)), sample_share=0.0)
    for _ in range(300):
        url = random_url()
        if rng.random() < 0.6:
            s.fetch(url)
        else:
            d = s.admit(url)
            if d.action == SKIP:
                assert content(d.canonical) == content(url), (url, d)
    for r in s.learner.hosts.state(H).trusted():     # the learner's own record of what it trusts
        if r.rule.name in matters:
            assert r.rule.vclass.startswith("=") and default.get(r.rule.name) == r.rule.vclass[1:], r.rule.text


# -- suspects ----------------------------------------------------------------------------------

def test_a_variant_of_an_admitted_url_is_a_suspect_until_its_parameter_is_known(tmp_path):
    s = Site(str(tmp_path / "d"), lambda u: u, confirmations=2)
    L = s.learner
    L.tokens = 0.0                                   # no probes: every suspect is deferred
    assert s.admit(f"{H}/list") .action == NORMAL
    assert s.admit(f"{H}/list?page=2").action == DEFER
    assert s.admit(f"{H}/list?page=3", depth=0).action == NORMAL     # a seed is never deferred
    assert s.admit(f"{H}/docs/list").action == NORMAL
    assert s.admit(f"{H}/m/docs/list").action == DEFER                # a view token
    assert s.admit(f"{H}/item?id=1").action == NORMAL
    assert s.admit(f"{H}/item").action == DEFER                       # the bare form of an admitted one
    # the site shows page=2 differs from page=3: "page" matters, page URLs are not suspects now
    s.fetch(f"{H}/list?page=2")
    s.fetch(f"{H}/list?page=3")
    assert not L.still_suspect(f"{H}/list?page=2", H)
    assert s.admit(f"{H}/list?page=4").action == NORMAL
    assert L.still_suspect(f"{H}/m/docs/list", H)


def test_probes_are_budgeted(tmp_path):
    s = Site(str(tmp_path / "d"), lambda u: u, confirmations=2, probe_share=0.0)
    s.fetch(f"{H}/a")
    s.admit(f"{H}/a")
    L = s.learner
    L.tokens = 2.5                         # a fresh host needs 2 tokens to start (enough to vouch)
    assert s.admit(f"{H}/a?x=1").action == PROBE
    assert s.admit(f"{H}/a?x=2").action == DEFER
    assert L.counters["probes"] == 1 and L.counters["deferred"] == 1
    # without cross-host priors it must see k confirmations through: k + 1 tokens
    alone = Site(str(tmp_path / "e"), lambda u: u, confirmations=2, probe_share=0.0, prior_hosts=0)
    alone.fetch(f"{H}/a")
    alone.admit(f"{H}/a")
    alone.learner.tokens = 2.5
    assert alone.admit(f"{H}/a?x=1").action == DEFER
    alone.learner.tokens = 3.0
    assert alone.admit(f"{H}/a?x=1").action == PROBE


def test_the_cold_start_probe_budget_is_initial_probes(tmp_path):
    assert Site(str(tmp_path / "d"), lambda u: u, initial_probes=5).learner.tokens == 5.0
    assert Site(str(tmp_path / "e"), lambda u: u, initial_probes=0).learner.tokens == 0.0
