"""robots.txt: any body parses, any URL matches, any fetch result maps to an entry or a redirect."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crawlerd.fetch.robots import RobotsEntry, RobotsFollow, RobotsRules, robots_decision
from tests.fuzz.conftest import budget

_DIRECTIVE = st.sampled_from(["User-agent", "user-agent", "useragent", "Allow", "Disallow", "disalow",
                              "Crawl-delay", "Sitemap", "#", "", "Host", "Disallow ", " allow"])
_VALUE = st.one_of(
    st.sampled_from(["*", "crawlerd", "CrawlerD/1.0", "/", "/a*b$", "/*", "$", "/%2A", "/%24", "/%", "/%e2%82",
                     "/ü", "nan", "inf", "-1", "1e308", "10", "*.php$", "/a/index.html", "http://s/sm.xml"]),
    st.text(max_size=20))
_LINE = st.builds(lambda d, colon, v, eol: f"{d}{colon}{v}{eol}", _DIRECTIVE,
                  st.sampled_from([":", ": ", " ", ":\t", ""]), _VALUE, st.sampled_from(["\n", "\r\n", "\r", ""]))
_BODY = st.one_of(st.lists(_LINE, max_size=30).map(lambda ls: "".join(ls).encode("utf-8", "surrogatepass")),
                  st.binary(max_size=400))
_PATH = st.one_of(st.text(max_size=30).map(lambda s: "/" + s),
                  st.sampled_from(["/", "/robots.txt", "/a*b", "/a$", "/%2a", "/%zz", "//x", "?q", "x.com/a"]))


@budget()
@given(_BODY, st.sampled_from(["crawlerd", "CRAWLERD", "other", "bad token", ""]), st.lists(_PATH, max_size=8),
       st.integers(1, 1 << 20))
def test_parse_and_match_never_raise(body, agent, paths, max_bytes):
    rules = RobotsRules.parse(body, agent, max_bytes)
    assert rules.crawl_delay is None or rules.crawl_delay >= 0
    for p in paths:
        assert rules.allowed(p) in (True, False)
        assert rules.allowed("https://h.example" + p) in (True, False)
    assert rules.allowed("/robots.txt")


@budget()
@given(st.integers(0, 999), st.booleans(), _BODY, st.one_of(st.none(), st.text(max_size=20)), st.integers(0, 9),
       st.booleans(), st.floats(0, 1e10))
def test_decision_is_an_entry_or_a_redirect(status, ok, body, location, hops, with_previous, now):
    previous = None
    if with_previous:
        previous = robots_decision(status=200, outcome_ok=True, body=body, location=None, hops=0, previous=None,
                                   now=now / 2, agent_token="crawlerd", cache_ttl_s=86400.0,
                                   error_retry_s=600.0, max_bytes=1 << 19)
    d = robots_decision(status=status, outcome_ok=ok, body=body, location=location, hops=hops, previous=previous,
                        now=now, agent_token="crawlerd", cache_ttl_s=86400.0, error_retry_s=600.0,
                        max_bytes=1 << 19)
    if isinstance(d, RobotsFollow):
        assert ok and 300 <= status < 400 and location and hops < 5
    else:
        assert isinstance(d, RobotsEntry) and d.expires_at > now
