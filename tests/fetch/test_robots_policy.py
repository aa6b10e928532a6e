"""robots_decision (RFC 9309 §2.3.1, §2.4) on an injected clock, and the RobotsCache invariants."""

import pytest

from crawlerd.bytecache import ENTRY_OVERHEAD
from crawlerd.fetch.robots import (
    RobotsCache,
    RobotsEntry,
    RobotsFollow,
    RobotsRules,
    RobotsState,
    entry_bytes,
    robots_decision,
)

TTL = 86400.0
RETRY = 600.0
BODY = b"User-agent: *\nDisallow: /private\nCrawl-delay: 3\n"


def decide(**kw):
    args = dict(status=200, outcome_ok=True, body=BODY, location=None, hops=0, previous=None,
                now=1000.0, agent_token="crawlerd", cache_ttl_s=TTL, error_retry_s=RETRY,
                max_bytes=512 * 1024)
    args.update(kw)
    return robots_decision(**args)


def test_2xx_parses():
    e = decide(status=200)
    assert isinstance(e, RobotsEntry)
    assert e.ok and e.outcome_name == RobotsState.PARSED
    assert e.fetched_at == 1000.0 and e.expires_at == 1000.0 + TTL
    assert not e.rules.allowed("/private/x") and e.rules.allowed("/public")
    assert e.rules.crawl_delay == 3.0


def test_2xx_respects_max_bytes():
    body = b"User-agent: *\n" + b"#" * 1000 + b"\nDisallow: /\n"
    assert decide(body=body, max_bytes=100).rules.allowed("/x")
    assert not decide(body=body).rules.allowed("/x")


@pytest.mark.parametrize("hops", [0, 4])
def test_3xx_follows_below_the_limit(hops):
    d = decide(status=301, location="https://other.example/robots.txt", hops=hops)
    assert d == RobotsFollow("https://other.example/robots.txt")


def test_3xx_past_the_limit_is_unavailable_allow_all():
    # RFC 9309 §2.3.1.2: more than five consecutive redirects -> MAY assume unavailable (4xx)
    e = decide(status=302, location="/robots.txt", hops=5)
    assert isinstance(e, RobotsEntry)
    assert e.ok and e.outcome_name == RobotsState.REDIRECT_LIMIT
    assert e.rules.allowed("/anything") and e.expires_at == 1000.0 + TTL
    assert isinstance(decide(status=302, location="/r", hops=2, max_hops=2), RobotsEntry)


def test_3xx_without_location_is_unavailable():
    e = decide(status=302, location=None)
    assert e.ok and e.rules.allowed("/x") and e.outcome_name == RobotsState.REDIRECT_LIMIT


def test_304_renews_previous_copy():
    prev = decide(status=200, now=0.0)
    e = decide(status=304, previous=prev, now=TTL)
    assert e.rules is prev.rules and e.fetched_at == TTL and e.expires_at == 2 * TTL


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 451])
def test_4xx_allows_all(status):
    e = decide(status=status, body=b"User-agent: *\nDisallow: /\n")
    assert e.ok and e.outcome_name == RobotsState.UNAVAILABLE
    assert e.rules.allowed("/x") and e.expires_at == 1000.0 + TTL


@pytest.mark.parametrize("kw", [dict(status=500), dict(status=503), dict(status=429),
                                dict(status=0, outcome_ok=False), dict(status=200, outcome_ok=False),
                                dict(status=102), dict(status=600)])
def test_unreachable_disallows_all_and_retries(kw):
    e = decide(**kw)
    assert not e.ok and e.outcome_name == RobotsState.UNREACHABLE
    assert not e.rules.allowed("/x") and e.rules.allowed("/robots.txt")
    assert e.expires_at == 1000.0 + RETRY and e.failures == 1


def test_unreachable_backs_off_exponentially_up_to_ttl():
    prev, waits = None, []
    now = 0.0
    for _ in range(12):
        prev = decide(status=503, previous=prev, now=now)
        waits.append(prev.expires_at - now)
        now = prev.expires_at
    assert waits[:4] == [RETRY, 2 * RETRY, 4 * RETRY, 8 * RETRY]
    assert max(waits) == TTL and prev.failures == 12


def test_unreachable_keeps_good_previous_copy():
    # RFC 9309 §2.4: a cached copy may be used past 24 h while the file is unreachable
    prev = decide(status=200, now=0.0)
    e = decide(status=503, previous=prev, now=TTL + 5)
    assert e.ok and e.outcome_name == RobotsState.STALE
    assert e.rules is prev.rules and e.fetched_at == 0.0
    assert e.expires_at == TTL + 5 + RETRY
    # still unreachable: keep it again, the copy's age still counts from its fetch
    e2 = decide(status=0, outcome_ok=False, previous=e, now=e.expires_at)
    assert e2.rules is prev.rules and e2.fetched_at == 0.0 and e2.failures == 2
    # a 4xx answer is a good copy too (allow all)
    gone = decide(status=404, now=0.0)
    assert decide(status=500, previous=gone, now=10.0).rules.allowed("/x")


def test_stale_copy_has_a_limit():
    prev = decide(status=200, now=0.0)
    e = decide(status=503, previous=prev, now=31 * 86400.0)
    assert not e.ok and not e.rules.allowed("/public")
    e = decide(status=503, previous=prev, now=100.0, stale_max_s=50.0)
    assert not e.ok


def test_unreachable_previous_is_not_kept():
    bad = decide(status=503, now=0.0)
    e = decide(status=503, previous=bad, now=RETRY)
    assert not e.ok and e.failures == 2


def test_recovery_after_failures():
    bad = decide(status=503, now=0.0)
    e = decide(status=200, previous=bad, now=RETRY)
    assert e.ok and e.failures == 0 and not e.rules.allowed("/private")


# ------------------------------------------------------------------ cache


def entry(expires_at: float, name: str = RobotsState.PARSED) -> RobotsEntry:
    return RobotsEntry(RobotsRules.allow_all(), 0.0, expires_at, 200, name, "")


def test_cache_get_expiry_and_stale():
    c = RobotsCache()
    assert c.get("https://a", 0.0) is None and c.stale("https://a") is None
    e = entry(100.0)
    c.put("https://a", e)
    assert c.get("https://a", 99.9) is e
    assert c.get("https://a", 100.0) is None           # expired
    assert c.stale("https://a") is e                   # but still there
    assert "https://a" in c and len(c) == 1
    c.discard("https://a")
    assert c.stale("https://a") is None


def test_cache_keys_are_host_keys():
    c = RobotsCache()
    c.put("http://a", entry(10.0))
    assert c.get("https://a", 0.0) is None and c.get("http://a:8080", 0.0) is None


def test_cache_is_bounded_lru_in_bytes():
    one = entry_bytes("h00", entry(1e9)) + ENTRY_OVERHEAD
    c = RobotsCache(cap_bytes=3 * one)
    for k in "abc":
        c.put(k, entry(1e9))
    assert c.get("a", 0.0) is not None                 # a is now most recent
    c.put("d", entry(1e9))                             # evicts b, the least recently used
    assert c.stale("b") is None and c.stale("a") is not None
    for i in range(100):
        c.put(f"h{i}", entry(1e9))
        assert len(c) <= 3 and c.memory()["bytes"] <= 3 * one
    assert {k for k in ("h97", "h98", "h99") if k in c} == {"h97", "h98", "h99"}


def test_cache_charges_large_rules_more():
    big = RobotsRules.parse(b"User-agent: *\n" + b"".join(b"Disallow: /p%d/x\n" % i for i in range(2000)), "bot")
    small = RobotsRules.parse(b"User-agent: *\nDisallow: /private\n", "bot")
    assert big.nbytes() > 2000 * 100 > small.nbytes()
    c = RobotsCache(cap_bytes=big.nbytes() * 3 // 2)
    c.put("https://big", RobotsEntry(big, 0.0, 1e9, 200, RobotsState.PARSED, ""))
    for i in range(1000):
        c.put(f"https://s{i}", RobotsEntry(small, 0.0, 1e9, 200, RobotsState.PARSED, ""))
    assert c.stale("https://big") is None          # pushed out by the bytes of the later ones
    assert c.memory()["bytes"] <= c.memory()["cap_bytes"]


def test_cache_rejects_empty_bound():
    with pytest.raises(ValueError):
        RobotsCache(cap_bytes=0)
