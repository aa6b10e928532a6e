"""DUST rules: what the learner's shortcuts must not change. ``relation`` with a memo (one
observation's pairs) and ``derive`` on parts the caller parsed answer exactly as without them, and a
host's state learns the same from the same pages either way."""

import random

import pytest

from crawlerd.frontier import dust_evidence as E
from crawlerd.frontier import dust_rules as R

H = "http://h.example"


def _url(rng: random.Random) -> str:
    path = rng.choice(["/p/1.html", "/p/2.html", "/m/p/1.html", "/print/p/2.html", "/a;jsessionid=x1/p.html",
                       "/p/3.html"])
    q = [f"{n}={rng.choice(['1', '2', 'ab12cd34ef', 'x'])}" for n in rng.sample(["sid", "utm_source", "page", "sort"],
                                                                                 rng.randrange(3))]
    return H + path + ("?" + "&".join(q) if q else "")


def _rules(rng: random.Random) -> list[R.Rule]:
    out = []
    for _ in range(8):
        a, b = _url(rng), _url(rng)
        out += R.derive(a, b, frozenset(), rng.choice(["", a, b]))
    return out or [R.parse_rule("?sid")]


@pytest.mark.parametrize("seed", range(6))
def test_relation_with_a_memo_and_derive_on_parts_answer_as_without(seed):
    rng = random.Random(seed)
    urls = [_url(rng) for _ in range(30)]
    parts = {u: R.parse(u) for u in urls}
    rules = _rules(rng)
    # as in one observation: one memo, each rule with one ``also``, asked with it and without
    also = {id(r): tuple(rng.sample(rules, min(len(rules), rng.randrange(3)))) for r in rules}
    memo: dict = {}
    for _ in range(400):
        rule, a, b = rng.choice(rules), rng.choice(urls), rng.choice(urls)
        for x in (also[id(rule)], ()):
            assert R.relation(rule, parts[a], parts[b], x, memo=memo) == R.relation(rule, parts[a], parts[b], x)
        assert R.derive(a, b, frozenset({"page"}), b, (parts[a], parts[b])) == R.derive(a, b, frozenset({"page"}), b)


def _summary(x: E.Learned) -> tuple:
    return (x.agreed, x.relevant, *([r.rule.text for r in rs] for rs in (x.trusted, x.retired, x.related, x.vouched)))


@pytest.mark.parametrize("seed", range(4))
def test_a_host_learns_the_same_with_and_without_the_memo(seed, monkeypatch):
    rng = random.Random(seed)
    pages = [(_url(rng), rng.randrange(4)) for _ in range(160)]     # 4 contents: many agreeing pairs
    plain = E.HostState()
    fast = E.HostState()
    real = R.relation
    for i, (url, content) in enumerate(pages):
        ev = [E.Evidence(url, content, 0x0F0F << content, "") for _ in range(2)]
        monkeypatch.setattr(E, "relation", lambda *a, memo=None, **k: real(*a, **k))
        lp = plain.learn(ev[0], k=2, near_bits=3, window=12, now=float(i))
        monkeypatch.setattr(E, "relation", real)
        lf = fast.learn(ev[1], k=2, near_bits=3, window=12, now=float(i))
        assert plain.to_record() == fast.to_record()
        assert _summary(lp) == _summary(lf)
    assert fast.rules or fast.retired                                 # the stream did teach it something


def test_parsed_rules_are_kept_and_bad_texts_refused_every_time():
    """A host record's rules are parsed at each load: a text parsed before gives the same
    (immutable) rule object, its text round-trips, and a bad text raises each time."""
    from crawlerd.frontier.dust_rules import parse_rule

    for text in ("?sid=<hex>", "?utm_source", "?view=print", ";jsessionid", "/m/ -> /", "/a/ -> /b/"):
        assert parse_rule(text) is parse_rule(text) and parse_rule(text).text == text
    for _ in range(2):
        with pytest.raises(ValueError):
            parse_rule("?a=<nope>")
