"""The DUST learner on synthetic hosts: rules, trust after k confirmations, retirement, suspects,
persistence and bounds (crawlerd.frontier.dust, dust_evidence, dust_rules, dust_store)."""

import hashlib
import random
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawlerd.frontier import dust_rules as R
from crawlerd.frontier.dust import DEFER, NORMAL, PROBE, SAMPLE, SKIP, DustLearner
from crawlerd.frontier.dust_evidence import TRUSTED
from crawlerd.frontier.dust_suspects import ClassTable
from crawlerd.url.canonical import fingerprint, normalize
from crawlerd.url.hosts import host_key as host_key_of

H = "http://shop.example"


def digest(content: str) -> bytes:
    return hashlib.sha1(content.encode()).digest()


class Site:
    """A learner and the pages of one or more synthetic hosts; ``content(url)`` is the oracle."""

    def __init__(self, path, content, **kw):
        self.path, self.content, self.kw = path, content, dict(kw)
        self.kw.setdefault("confirmations", 3)
        self.kw.setdefault("sync", False)
        self.learner = DustLearner(path, **self.kw)

    def reopen(self):
        self.learner.close()
        self.learner = DustLearner(self.path, **self.kw)
        return self.learner

    def fetch(self, url: str, canonical: str = "", simhash: int = 0):
        """The crawler archived ``url``: tell the learner."""
        host = url.split("/", 3)[0] + "//" + url.split("/", 3)[2]
        return self.learner.observe(url, fingerprint(url), host, digest(self.content(url)), simhash, canonical)

    def admit(self, url: str, depth: int = 1):
        return self.learner.admit(url, fingerprint(url), depth)


def tracking_content(url: str) -> str:
    """utm_source never matters; everything else is part of the page."""
    p = R.parse(url)
    return R.unparse(R.Parts(p.origin, p.segs, tuple(x for x in p.query if x[0] != "utm_source"),
                             tuple(r for r in p.raw if not r.startswith("utm_source="))))


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


# -- persistence and bounds -------------------------------------------------------------------------

def test_rules_evidence_and_archived_set_survive_reopen(tmp_path):
    s = Site(str(tmp_path / "d"), tracking_content, confirmations=2)
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        s.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
    s.fetch(f"{H}/q/0.html")
    L = s.reopen()
    assert L.stats()["rules_trusted"] == 1
    assert s.admit(f"{H}/q/0.html?utm_source=after").action in (SKIP, SAMPLE)
    assert len(L.hosts.state(H).evidence) == 7
    s.learner.close()


def test_host_records_stay_within_their_bytes(tmp_path):
    s = Site(str(tmp_path / "d"), lambda u: u, max_host_bytes=4096, max_bytes=64 << 10, window=200,
             cache_hosts=16)
    for k in range(300):
        s.fetch(f"{H}/p/{k}-{'x' * 40}.html")
    for i in range(400):                       # many hosts: the oldest records are evicted
        s.fetch(f"http://h{i}.example/p/0.html")
    s.learner.commit()
    store = s.learner.store
    assert store.get_host(H) is None or store.encoded_size(store.get_host(H)) <= 4096
    assert store.meta["host_bytes"] <= store.max_hosts_bytes
    assert store.meta["evicted_hosts"] > 0
    sizes = [store.encoded_size(rec) for _, rec in store.hosts()]
    assert max(sizes) <= 4096 and sum(sizes) == store.meta["host_bytes"]


def test_trusted_rules_reach_admission_only_for_their_host(tmp_path):
    s = Site(str(tmp_path / "d"), tracking_content, confirmations=2)
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        s.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
    other = "http://other.example"
    s.fetch(f"{other}/p/1.html")
    assert s.admit(f"{other}/p/1.html?utm_source=x").action != SKIP
    rules = s.learner.hosts.state(H).trusted()
    assert [r.rule.text for r in rules] == ["?utm_source"] and rules[0].state == TRUSTED


def test_a_sample_is_checked_against_the_archived_set_when_its_page_left_the_window(tmp_path):
    changed = set()

    def content(url):
        return url if url in changed else tracking_content(url)
    s = Site(str(tmp_path / "d"), content, confirmations=2, sample_share=1.0, window=4)
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        s.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
    for k in range(10):                               # /p/0.html leaves the evidence window
        s.fetch(f"{H}/other/{k}.html")
    agreeing = f"{H}/p/0.html?utm_source=ok"
    assert s.admit(agreeing).action == SAMPLE
    assert s.fetch(agreeing).retired == []
    bad = f"{H}/p/1.html?utm_source=bad"
    changed.add(bad)
    assert s.admit(bad).action == SAMPLE
    assert s.fetch(bad).retired == ["?utm_source"]
    assert s.learner.stats()["sample_mismatches_total"] == 1


def test_without_admission_probes_a_suspect_waits_and_a_probe_is_taken_from_the_deferred_level(tmp_path):
    """Under BEAST budgets an admitted URL may wait before the frontier: no probe is spent on
    it at admission; once deferred in the frontier, a new host's suspect may be taken as a probe."""
    s = Site(str(tmp_path / "d"), lambda u: u, confirmations=2, probe_share=0.0, admission_probes=False)
    s.fetch(f"{H}/a")
    s.admit(f"{H}/a")
    L = s.learner
    L.tokens = 2.0
    assert s.admit(f"{H}/a?x=1").action == DEFER and L.counters["probes"] == 0
    assert L.wants_probe(H)
    assert L.take_probe(f"{H}/a?x=1", fingerprint(f"{H}/a?x=1"), H)
    assert L.tokens == 1.0 and not L.wants_probe(H)          # a new host needs 2 to start
    assert not L.take_probe(f"{H}/b?x=1", fingerprint(f"{H}/b?x=1"), H)


def test_cached_host_states_stay_within_cache_bytes_and_lose_no_evidence(tmp_path):
    def crawl(path, cache_bytes):
        s = Site(path, lambda u: u, window=24, cache_hosts=2048, cache_bytes=cache_bytes)
        peak = 0
        for k in range(24):                     # round robin over 200 hosts, as a crawl visits them
            for i in range(200):
                s.fetch(f"http://h{i}.example/p/{k}-{'x' * 30}.html")
                if (k * 200 + i) % 100 == 99:   # the shard commits every couple of seconds
                    s.learner.commit()
                    peak = max(peak, s.learner.hosts.memory()["bytes"])
        s.learner.commit()
        kept = {i: [e.url for e in s.learner.hosts.state(f"http://h{i}.example").evidence] for i in range(200)}
        return peak, s.learner.hosts.memory(), kept

    peak, mem, kept = crawl(str(tmp_path / "small"), 64 << 10)
    assert peak <= 64 << 10 and mem["bytes"] <= mem["cap_bytes"] == 64 << 10
    assert 1 < mem["entries"] < 200                           # the bound, not the entry count, evicted
    free_peak, _, reference = crawl(str(tmp_path / "free"), 1 << 30)
    assert free_peak > 4 * (64 << 10)                         # unbounded, the same crawl holds more
    assert kept == reference                                  # evicted states were written back whole
    assert all(len(urls) == 24 for urls in kept.values())


def test_the_store_commits_early_to_stay_within_its_reserved_page_buffers(tmp_path):
    # 64 pages reserved: 400 archived fingerprints without a commit from the learner take several
    # early commits (each a state a later commit would have made durable), and none is lost
    from crawlerd.frontier.dust_store import DustStore
    s = DustStore(str(tmp_path / "d"), max_bytes=64 << 20, max_host_bytes=16 << 10, sync=False,
                  write_buffer_bytes=64 * 4096)
    start = s.env.info()["last_txnid"]
    for fp in range(1, 401):
        s.add_archived(fp * 0x9E3779B97F4A7C15 & (2**64 - 1), 1)
    assert s.env.info()["last_txnid"] - start >= 400 // 28
    s.close()
    s = DustStore(str(tmp_path / "d"), max_bytes=64 << 20, max_host_bytes=16 << 10, sync=False)
    assert all(s.archived(fp * 0x9E3779B97F4A7C15 & (2**64 - 1)) is not None for fp in range(1, 401))
    s.close()


class ArchivedModel:
    """The archived set as specified (two generations, the older dropped once half of ``max_archived``
    fingerprints new to both were added to the current one; a weaker kind never overwrites a
    stronger one): fp -> value tuple."""

    def __init__(self, half):
        self.half, self.gens, self.gen, self.count = half, [{}, {}], 0, 0
        self.turns = 0                      # turn-overs since the last copy

    def get(self, fp):
        g = self.gen
        return self.gens[g].get(fp) or self.gens[1 - g].get(fp)

    def add(self, fp, value):
        prev = self.get(fp)
        if prev is not None and prev[0] < value[0]:
            return
        self.gens[self.gen][fp] = value
        self.count += prev is None
        if self.count >= self.half:
            self.gen, self.count = 1 - self.gen, 0
            self.gens[self.gen] = {}
            self.turns += 1

    def copy(self):
        m = ArchivedModel(self.half)
        m.gens, m.gen, m.count = [dict(self.gens[0]), dict(self.gens[1])], self.gen, self.count
        return m


@pytest.mark.parametrize("filter_bytes", [0, 64, 1 << 14])
def test_archived_set_answers_as_specified_through_commits_crashes_and_reopens(tmp_path, filter_bytes):
    """Random additions and look-ups (fingerprints drawn so that many repeat, kinds that compete)
    against the model, with the Bloom filters off, tiny (nearly every look-up reads) and sized: the
    same answers; a crash (no commit) reopens to the last commit's answers; the filters stay within
    their bytes, and a sized one spares most reads of fingerprints never archived."""
    import gc

    from crawlerd.frontier.dust_store import DustStore

    def open_store():
        return DustStore(str(tmp_path / "d"), max_bytes=128 << 10, max_host_bytes=16 << 10, sync=False,
                         filter_bytes=filter_bytes)

    rng = random.Random(filter_bytes)
    s = open_store()
    model = ArchivedModel(s.max_archived // 2)
    committed = model.copy()
    assert s.max_archived == 1024
    pool = [rng.getrandbits(64) for _ in range(1500)]
    turned = 0
    skipped = 0
    for step in range(12_000):
        op = rng.random()
        fp = rng.choice(pool) if rng.random() < 0.7 else rng.getrandbits(64)
        if op < 0.45:
            v = (rng.choice((1, 2, 3)), rng.randrange(4), rng.randrange(9), rng.getrandbits(32), rng.getrandbits(64))
            s.add_archived(fp, *v)
            model.add(fp, v)
        elif op < 0.9:
            got = s.archived(fp)
            assert (None if got is None else tuple(got)) == model.get(fp), step
        elif op < 0.97:
            s.commit()
            committed = model.copy()
            turned += model.turns
            model.turns = 0
        elif op < 0.985:
            skipped += s.memory()["reads_skipped"]
            s = None                      # kill -9: the open transaction and what waits for it are lost
            gc.collect()
            s = open_store()
            model = committed.copy()
        else:
            skipped += s.memory()["reads_skipped"]
            s.close()
            s = open_store()
            committed = model.copy()
        mem = s.memory()
        assert mem["bytes"] <= mem["cap_bytes"] <= filter_bytes
    assert turned >= 3                              # committed turn-overs of the generations
    for fp in pool:
        got = s.archived(fp)
        assert (None if got is None else tuple(got)) == model.get(fp)
    skipped += s.memory()["reads_skipped"]
    if filter_bytes >= 1 << 14:
        assert skipped > 2000
    elif filter_bytes == 0:
        assert skipped == 0
    s.close()


def check_host_tables(store):
    """The host records, their write sequences and the byte count agree (what put_host keeps)."""
    txn = store.txn()
    hosts = dict(txn.cursor(db=store._hosts))
    lru = dict(txn.cursor(db=store._lru))
    seqs = {k[4:]: v for k, v in txn.cursor(db=store._meta) if k.startswith(b"seq:")}
    assert store.meta["host_bytes"] == sum(len(v) for v in hosts.values())
    assert set(seqs) == set(hosts) and len(lru) == len(hosts)
    assert all(lru[seq] == hk for hk, seq in seqs.items())
    for host, (size, seq) in store._held.items():        # what it notes of the hosts held cached
        hk = host.encode()
        assert size == len(hosts.get(hk, b"")) and seq in (None, seqs.get(hk, b""))


def test_host_records_written_back_from_the_cache_keep_the_tables_exact_through_evictions_and_a_crash(tmp_path):
    """Many hosts round robin through a small host cache (states dropped and loaded again) and a store
    bound that evicts host records: written back without reading their sizes and sequences, the
    tables and byte count stay exact, after commits, a crash (no commit) and a reopen."""
    import gc
    path = str(tmp_path / "d")
    kw = dict(window=24, cache_hosts=2048, cache_bytes=96 << 10, max_bytes=96 << 10)
    s = Site(path, lambda u: u, **kw)
    for k in range(12):
        for i in range(150):
            s.fetch(f"http://h{i}.example/p/{k}-{'x' * 30}.html")
            if i % 50 == 49:
                s.learner.commit()
                check_host_tables(s.learner.store)
        if k == 5:
            s.learner = None                    # kill -9: the open transaction is lost
            gc.collect()
            s.learner = DustLearner(path, confirmations=3, sync=False, **kw)
            check_host_tables(s.learner.store)
    s.learner.commit()
    check_host_tables(s.learner.store)
    assert s.learner.store.meta["evicted_hosts"] > 0 and len(s.learner.store._held) > 0
    s.reopen()
    check_host_tables(s.learner.store)
    s.learner.close()


# -- on the writer thread ---------------------------------------------------------------------------

def dump_store(store):
    """Every table of a DUST store (committed state), for comparing two stores."""
    out = {}
    with store.env.begin() as txn:
        for name, db in [("hosts", store._hosts), ("lru", store._lru), ("arch0", store._arch[0]),
                         ("arch1", store._arch[1]), ("skips", store._skips), ("meta", store._meta)]:
            out[name] = dict(txn.cursor(db=db))
    return out


@pytest.mark.parametrize("filter_bytes", [0, 4 << 20])
def test_on_a_writer_thread_the_store_answers_as_with_its_own_transaction_and_the_loop_writes_nothing(
        tmp_path, monkeypatch, filter_bytes):
    """The same pages, admissions, skips and commits on a learner with its own write transaction and
    on one whose store commits on a writer thread, landing at random moments (read through the
    overlay meanwhile): the same decisions and changes throughout (rules trusted and retired, skips
    requeued, host records evicted, archived generations dropped), the same tables once the last
    commit landed, and every write transaction begun on the writer thread, none on the loop's.
    Without the archived set's filters every look-up reads the table (a dropped generation's
    entries must not answer before the drop landed)."""
    import asyncio
    import types

    from crawlerd.frontier import dust_evidence
    from crawlerd.store.writer import WriteThread
    from tests.frontier.test_budgets import RecordingEnv

    # one time for both learners (evidence carries it into the host records, and so their sizes)
    monkeypatch.setattr(dust_evidence, "time", types.SimpleNamespace(time=lambda: 1.7e9))
    changed = set()

    def content(url):
        return url if url in changed else tracking_content(url)

    # small bounds: host records evicted, the archived set's generations turned over (max_archived 1024)
    kw = dict(confirmations=2, sample_share=0.05, window=8, max_bytes=128 << 10, max_host_bytes=4 << 10,
              cache_hosts=16, cache_bytes=48 << 10, write_buffer_bytes=16 * 4096, clock=lambda: 1.7e9,
              archived_filter_bytes=filter_bytes)

    async def go():
        plain = Site(str(tmp_path / "a"), content, **kw)
        threaded = Site(str(tmp_path / "b"), content, **kw)
        store = threaded.learner.store
        env = store.env = RecordingEnv(store.env)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        store.attach_writer(writer)
        ov, drops = store.overlay, []
        ov.drop = lambda db, delete=False, drop=ov.drop: (drops.append(db), drop(db, delete))
        env.recording = True
        both = (plain, threaded)
        rng = random.Random(7)
        hosts = [f"http://h{i}.example" for i in range(400)]
        landed = []
        for step in range(4000):
            op = rng.random()
            h = rng.choice(hosts[:20] if rng.random() < 0.6 else hosts)     # a few busy hosts learn rules
            page = f"{h}/p/{rng.randrange(30)}.html"
            if op < 0.55:
                url = page if rng.random() < 0.5 else f"{page}?utm_source=s{step}"
                if rng.random() < 0.01:
                    changed.add(url)                # the site answers differently: a rule retired
                simhash = rng.getrandbits(64)
                got = [s.fetch(url, simhash=simhash) for s in both]
                assert got[0] == got[1], step
            elif op < 0.85:
                url = f"{page}?utm_source=a{step}"
                d = [s.admit(url) for s in both]
                assert d[0] == d[1], step
                if d[0].action == SKIP:
                    for s in both:
                        s.learner.skipped(h, d[0], f"rec-{step}".encode())
            elif op < 0.93:
                plain.learner.commit()
                threaded.learner.commit(then=lambda step=step: landed.append(step))
            else:
                await asyncio.sleep(0.003 * rng.random())   # commits land meanwhile, or not
            if step % 50 == 0:
                assert plain.learner.stats() == threaded.learner.stats(), step
        done = asyncio.get_running_loop().create_future()
        plain.learner.commit()
        threaded.learner.commit(then=lambda: done.set_result(None))
        await done
        env.recording = False
        assert landed == sorted(landed) and len(landed) > 50        # landed, in commit order
        # the archived set turned over twice at least: a generation holding entries was dropped
        assert len(drops) >= 2
        assert plain.learner.store.meta["gen_count"] == store.meta["gen_count"]
        assert plain.learner.store.meta["evicted_hosts"] > 0 and plain.learner.stats()["rules_learned_total"] > 0
        assert dump_store(plain.learner.store) == dump_store(store)
        store.attach_writer(None)
        writer.close()
        assert env.write_threads and threading.get_ident() not in env.write_threads
        assert store.overlay is None
        for s in both:
            s.reopen()
        assert dump_store(plain.learner.store) == dump_store(threaded.learner.store)
        assert plain.learner.stats() == threaded.learner.stats()
        for s in both:
            s.learner.close()

    import threading
    asyncio.run(go())


CHILD_DUST = textwrap.dedent("""
    import asyncio, sys
    from crawlerd.frontier.dust_store import DustStore, URL
    from crawlerd.store.writer import WriteThread

    async def main():
        s = DustStore({path!r}, max_bytes=64 << 20, max_host_bytes=16 << 10)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        s.attach_writer(writer)
        s.put_host("a", {{"rules": ["landed"]}})
        s.log_skip("a", "?x", b"skip-a", 0)
        for fp in range(1, 200):
            s.add_archived(fp, URL)
        done = asyncio.get_running_loop().create_future()
        s.commit(then=lambda: done.set_result(None))
        await done                              # landed: what a then would acknowledge
        writer.hold()                           # the next commit is handed over and never written
        s.put_host("b", {{"rules": ["not landed"]}})
        s.put_host("a", {{"rules": ["changed, not landed"]}})
        s.pop_skips("a", "?x")
        for fp in range(200, 400):
            s.add_archived(fp, URL)
        s.commit()
        await asyncio.sleep(0.05)
        print("ready", s.overlay.pending, flush=True)
        sys.stdin.read()

    asyncio.run(main())
""")


def test_kill_9_with_a_writer_keeps_the_dust_commits_that_landed(tmp_path):
    """A DUST commit handed to the writer is promised once it landed: kill -9 keeps it whole (host
    record, skip log, archived set), and a commit handed over and not written is lost whole."""
    import os
    import signal
    import subprocess
    import sys

    from crawlerd.frontier.dust_store import DustStore
    path = str(tmp_path / "d")
    child = subprocess.Popen([sys.executable, "-c", CHILD_DUST.format(path=path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = child.stdout.readline()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert line == b"ready 1\n"
    s = DustStore(path, max_bytes=64 << 20, max_host_bytes=16 << 10)
    assert s.get_host("a") == {"rules": ["landed"]} and s.get_host("b") is None
    assert s.pop_skips("a", "?x") == [b"skip-a"]
    assert all(s.archived(fp) is not None for fp in range(1, 200))
    assert all(s.archived(fp) is None for fp in range(200, 400))
    check_host_tables(s)
    s.close()

def test_admission_decides_the_same_with_or_without_the_callers_host_keys(tmp_path):
    """The intake hands admit_batch the host keys it has; the decisions are those the learner
    makes when it takes each host from the URL (a trusted rule's host, another host, suspects)."""
    other = "http://other.example"
    sites = []
    for name in ("d", "e"):
        site = Site(str(tmp_path / name), tracking_content, confirmations=2)
        for k in range(3):
            site.fetch(f"{H}/p/{k}.html")
            site.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
        site.fetch(f"{other}/p/1.html")          # archived there, but no rule of its own
        sites.append(site)
    s, twin = sites
    urls = [f"{H}/p/1.html?utm_source=feed", f"{H}/p/9.html?utm_source=feed", f"{other}/p/1.html?utm_source=x",
            f"{H}/p/2.html?utm_source=z", f"{other}/a/b/c.html", f"{other}/m/b/c.html", f"{H}/p/7.html"]
    fps, depths, hops = [fingerprint(u) for u in urls], [2] * len(urls), [0] * len(urls)
    plain = twin.learner.admit_batch(urls, fps, depths, hops)
    given = s.learner.admit_batch(tuple(urls), tuple(fps), tuple(depths), tuple(hops),
                                  tuple(host_key_of(u) for u in urls))
    assert given == plain
    assert {d.action for d in plain} >= {SKIP, NORMAL} or {d.action for d in plain} >= {SAMPLE, NORMAL}
