"""Cross-host DUST priors (crawlerd.frontier.dust_priors through DustLearner) and rules confirmed by
pairs that differ in several parameters at once."""

import hashlib
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawlerd.frontier import dust_rules as R
from crawlerd.frontier.dust import SAMPLE, SKIP, DustLearner
from crawlerd.frontier.dust_priors import PriorTable
from crawlerd.url.canonical import fingerprint


def digest(content: str) -> bytes:
    return hashlib.sha1(content.encode()).digest()


def host_of(url: str) -> str:
    return url.split("/", 3)[0] + "//" + url.split("/", 3)[2]


def without(url: str, names: set[str]) -> str:
    p = R.parse(url)
    keep = [i for i, (n, _v) in enumerate(p.query) if n not in names]
    return R.unparse(R.Parts(p.origin, p.segs, tuple(p.query[i] for i in keep), tuple(p.raw[i] for i in keep)))


class Web:
    """One learner over many synthetic hosts; ``content(url)`` is the oracle."""

    def __init__(self, path, content, **kw):
        kw.setdefault("confirmations", 2)
        kw.setdefault("sync", False)
        self.path, self.content, self.kw = path, content, kw
        self.learner = DustLearner(path, **kw)
        self.requeued: list[bytes] = []

    def reopen(self):
        self.learner.close()
        self.learner = DustLearner(self.path, **self.kw)

    def fetch(self, url: str):
        ch = self.learner.observe(url, fingerprint(url), host_of(url), digest(self.content(url)), 0, "")
        self.requeued += ch.requeue
        return ch

    def admit(self, url: str):
        d = self.learner.admit(url, fingerprint(url), 1)
        if d.action == SKIP:
            self.learner.skipped(host_of(url), d, url.encode())
        return d

    def teach(self, host: str, name: str = "ref", pages: int = 3):
        """A host proves ``?name`` on its own evidence."""
        for k in range(pages):
            self.fetch(f"{host}/p/{k}.html")
            self.fetch(f"{host}/p/{k}.html?{name}=v{k}")


def ignores(names: set[str], hosts: set[str] | None = None):
    """Content oracle: ``names`` change nothing (on ``hosts``, or everywhere)."""
    def content(url: str) -> str:
        if hosts is None or host_of(url) in hosts:
            return without(url, names)
        return url
    return content


def test_table_activates_at_min_hosts_and_drops_after_counter_hosts():
    t = PriorTable(None, min_hosts=3, max_counter_hosts=2)
    assert not t.supported("?ref", [1, 2]) and not t.supported("?ref", [1])
    assert t.supported("?ref", [2]) and [r.text for r in t.active] == ["?ref"]
    assert not t.contradicted("?ref") and t.is_active("?ref")
    assert t.contradicted("?ref") and t.active == ()
    again = PriorTable(t.to_record(), min_hosts=3, max_counter_hosts=2)
    assert again.table == t.table and again.active == ()


def test_a_rule_over_many_values_needs_two_distinct_values_pooled_over_its_hosts():
    """?lang=en may be every host's default page: three hosts removing only "en" make the literal
    a prior, never the rule over all values; an id-like class pools one value a host."""
    t = PriorTable(None, min_hosts=3, max_counter_hosts=2)
    for _ in range(5):
        t.supported("?lang=en")
        t.supported("?lang", [7])
    assert [r.text for r in t.active] == ["?lang=en"]
    assert not t.supported("?sid=<hex>", [1]) and not t.supported("?sid=<hex>", [1])
    assert t.supported("?sid=<hex>", [2]) and t.is_active("?sid=<hex>")
    again = PriorTable(t.to_record(), min_hosts=3, max_counter_hosts=2)
    assert again.is_active("?sid=<hex>") and not again.is_active("?lang")


def test_an_id_like_value_vouches_with_one_value_a_host(tmp_path):
    """Each host shows one session id on a page and the page itself: three hosts make ?sid=<hex> a
    prior (three distinct values over them), which then skips on a fourth host."""
    sid = ("3f2a9c1b7d", "a91b0c3e5f", "77c1d2e3f4", "0b9e8d7c6a")
    w = Web(str(tmp_path / "d"), ignores({"sid"}), prior_hosts=3, sample_share=0.0, prior_sample_share=0.0)
    for i in range(3):
        w.fetch(f"http://h{i}.example/p/1.html")
        w.fetch(f"http://h{i}.example/p/1.html?sid={sid[i]}")
    assert w.learner.priors.is_active("?sid=<hex>") and not w.learner.priors.is_active("?sid")
    w.fetch("http://new.example/p/1.html")
    d = w.admit(f"http://new.example/p/1.html?sid={sid[3]}")
    assert d.action == SKIP and d.canonical == "http://new.example/p/1.html"


def test_a_rule_trusted_on_enough_hosts_is_applied_on_a_new_host_without_its_confirmations(tmp_path):
    w = Web(str(tmp_path / "d"), ignores({"ref"}), prior_hosts=3, prior_sample_share=0.0)
    for i in range(2):
        w.teach(f"http://h{i}.example")
    new = "http://fresh.example"
    w.fetch(f"{new}/p/7.html")
    assert w.admit(f"{new}/p/7.html?ref=nav").action != SKIP        # two hosts: no prior yet
    w.teach("http://h2.example")
    assert "?ref" in [r.text for r in w.learner.priors.active]
    d = w.admit(f"{new}/p/7.html?ref=side")
    assert d == (SKIP, "?ref", f"{new}/p/7.html")
    rules = w.learner.rules_of(new)
    assert rules[0]["rule"] == "?ref" and rules[0]["prior"] and rules[0]["skips"] == 1
    assert w.admit(f"{new}/p/8.html?ref=side").action != SKIP       # its page is not archived
    # survives a restart: the table and the adoption
    w.reopen()
    assert w.admit(f"{new}/p/7.html?ref=top").action == SKIP
    assert w.admit("http://other.example/p/1.html?ref=x").action != SKIP


def test_the_variant_archived_first_makes_its_rewrite_archived(tmp_path):
    w = Web(str(tmp_path / "d"), ignores({"ref"}), prior_hosts=3, prior_sample_share=0.0)
    for i in range(3):
        w.teach(f"http://h{i}.example")
    new = "http://fresh.example"
    w.fetch(f"{new}/p/1.html?ref=mail")
    d = w.admit(f"{new}/p/1.html")
    assert d.action == SKIP and d.rule == "?ref"


def test_a_prior_is_sampled_more_and_retired_per_host_by_one_contradiction(tmp_path):
    liars = {"http://liar.example", "http://liar2.example"}
    w = Web(str(tmp_path / "d"), ignores({"ref"}, {f"http://h{i}.example" for i in range(3)}),
            prior_hosts=3, prior_counter_hosts=2, sample_share=0.0, prior_sample_share=1.0)
    for i in range(3):
        w.teach(f"http://h{i}.example")
    for n, liar in enumerate(sorted(liars)):
        w.fetch(f"{liar}/p/1.html")
        d = w.admit(f"{liar}/p/1.html?ref=a")
        assert d.action == SAMPLE and d.rule == "?ref"              # every use re-validated here
        ch = w.fetch(f"{liar}/p/1.html?ref=a")                      # another page: contradiction
        assert ch.retired == ["?ref"]
        assert w.admit(f"{liar}/p/1.html?ref=b").action != SKIP     # retired on this host for good
        assert w.learner.priors.is_active("?ref") == (n == 0)
    w.fetch("http://late.example/p/1.html")
    assert w.admit("http://late.example/p/1.html?ref=c").action != SKIP   # the prior is gone


def test_skips_by_a_prior_come_back_when_the_host_contradicts_it(tmp_path):
    honest = {f"http://h{i}.example" for i in range(3)}
    w = Web(str(tmp_path / "d"), ignores({"ref"}, honest), prior_hosts=3, sample_share=0.0, prior_sample_share=0.0)
    for h in sorted(honest):
        w.teach(h)
    site = "http://means.example"                   # here ref picks another page
    w.fetch(f"{site}/p/1.html")
    w.fetch(f"{site}/p/2.html")
    assert w.admit(f"{site}/p/1.html?ref=x").action == SKIP
    assert w.requeued == []
    w.fetch(f"{site}/p/2.html?ref=y")               # its own pair disagrees
    assert w.requeued == [f"{site}/p/1.html?ref=x".encode()]


def test_a_host_that_knows_the_name_matters_does_not_adopt_it(tmp_path):
    honest = {f"http://h{i}.example" for i in range(3)}
    w = Web(str(tmp_path / "d"), ignores({"ref"}, honest), prior_hosts=3)
    site = "http://means.example"
    w.fetch(f"{site}/p/1.html")
    w.fetch(f"{site}/p/1.html?ref=y")               # ref changes the page here: a relevant name
    for h in sorted(honest):
        w.teach(h)
    assert "?ref" in [r.text for r in w.learner.priors.active]
    w.fetch(f"{site}/p/3.html")
    assert w.admit(f"{site}/p/3.html?ref=z").action != SKIP


def test_pairs_that_differ_in_several_parameters_confirm_each_rule():
    """utm_source, utm_medium, utm_campaign always come together: no pair isolates one."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        w = Web(d + "/d", ignores({"utm_source", "utm_medium", "utm_campaign"}), confirmations=2)
        H = "http://shop.example"
        trusted = set()
        for k in range(4):
            w.fetch(f"{H}/p/{k}.html")
            trusted |= set(w.fetch(f"{H}/p/{k}.html?utm_source=s{k}&utm_medium=m{k}&utm_campaign=c{k}").trusted)
        assert {"?utm_source", "?utm_medium", "?utm_campaign"} <= trusted
        d2 = w.admit(f"{H}/p/2.html?utm_source=a&utm_medium=b&utm_campaign=c")
        assert d2.action in (SKIP, SAMPLE) and d2.canonical == f"{H}/p/2.html"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_priors_never_lose_a_page_that_a_host_gives_meaning(tmp_path_factory, seed):
    """Randomised webs: each parameter is ignored by some hosts and picks the page on others.
    Priors learned on the first may skip on the second; every such wrong skip is given back
    (requeued) once the host's own evidence contradicts the rule, and no host trusts a rule on
    its own evidence that drops a parameter that changes its content."""
    rng = random.Random(seed)
    names = ["ref", "sort", "p"]
    hosts = [f"http://h{i}.example" for i in range(6)]
    matters = {h: {n for n in names if rng.random() < 0.5} for h in hosts}

    def content(url: str) -> str:
        h = host_of(url)
        return without(url, set(names) - matters[h])

    w = Web(str(tmp_path_factory.mktemp("dust")), content, confirmations=2, prior_hosts=2,
            sample_share=0.0, prior_sample_share=rng.choice((0.0, 0.3)))
    wrong: set[bytes] = set()
    for _ in range(300):
        h = rng.choice(hosts)
        params = [(n, f"v{rng.randint(0, 3)}") for n in names if rng.random() < 0.4]
        url = f"{h}/p/{rng.randint(0, 5)}.html" + ("?" + "&".join(f"{n}={v}" for n, v in params) if params else "")
        if rng.random() < 0.6:
            w.fetch(url)
        else:
            d = w.admit(url)
            if d.action == SKIP and content(d.canonical) != content(url):
                wrong.add(url.encode())
    # each host then fetches its pages with each parameter once more: its own evidence speaks
    for h in hosts:
        for k in range(6):
            w.fetch(f"{h}/p/{k}.html")
            for n in names:
                w.fetch(f"{h}/p/{k}.html?{n}=w{k}")
    assert wrong <= set(w.requeued)
    for h in hosts:
        for r in w.learner.hosts.state(h).trusted():
            if not r.prior:
                assert r.rule.name not in matters[h], (h, r.rule.text)


def test_samples_that_agree_with_a_prior_on_any_host_make_it_sampled_less(tmp_path):
    w = Web(str(tmp_path / "d"), ignores({"ref"}), prior_hosts=3, sample_share=0.0, prior_sample_share=1.0,
            sample_halving=2, min_sample_share=0.25)
    for i in range(3):
        w.teach(f"http://h{i}.example")

    def share(host: str, n: int = 2000) -> float:
        w.fetch(f"{host}/p/1.html")
        acts = [w.admit(f"{host}/p/1.html?ref=s{k}").action for k in range(n)]
        assert set(acts) <= {SAMPLE, SKIP}
        return acts.count(SAMPLE) / n

    assert share("http://f0.example", 50) == 1.0
    for i in range(2):                             # two samples, on two other hosts, agree
        host = f"http://g{i}.example"
        w.fetch(f"{host}/p/1.html")
        assert w.admit(f"{host}/p/1.html?ref=z").action == SAMPLE
        w.fetch(f"{host}/p/1.html?ref=z")
    assert w.learner.priors.agreed("?ref") >= 2
    assert 0.4 <= share("http://f1.example") <= 0.6
    w.reopen()                                     # the count is kept with the prior table
    assert 0.4 <= share("http://f2.example") <= 0.6


def test_a_deferred_page_whose_variant_was_archived_before_the_prior_is_skipped_at_lease(tmp_path):
    """The variant came first (an inbound link with ?ref), then the page itself waited as a
    suspect; the prior for ?ref formed meanwhile. At lease the host's evidence adopts it: the page
    is the rewrite of an archived variant, not fetched again. Not for a URL of a normal level."""
    w = Web(str(tmp_path / "d"), ignores({"ref"}), prior_hosts=3, sample_share=0.0, prior_sample_share=0.0)
    w.fetch("http://a.example/p/1.html?ref=news")
    for i in range(3):
        w.teach(f"http://h{i}.example")
    assert w.learner.priors.is_active("?ref")
    url = "http://a.example/p/1.html"
    assert w.learner.check_lease(url, fingerprint(url), "http://a.example") is None
    d = w.learner.check_lease(url, fingerprint(url), "http://a.example", suspect=True)
    assert d is not None and d.action == SKIP and d.rule == "?ref"
    other = "http://a.example/p/2.html"          # no archived variant of it: fetched
    assert w.learner.check_lease(other, fingerprint(other), "http://a.example", suspect=True) is None
