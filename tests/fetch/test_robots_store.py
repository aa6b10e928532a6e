"""RobotsCache on disk: a restart reuses every fresh robots.txt copy, torn writes are cut, size is bounded."""

import os

from crawlerd.fetch.robots import RobotsCache, RobotsState, robots_decision
from crawlerd.fetch.robots.store import FILE_NAME

BODY = b"User-agent: *\nDisallow: /private\nCrawl-delay: 2\n"
TTL = 86400.0


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def decide(status, now, previous=None, body=BODY, ok=True):
    return robots_decision(status=status, outcome_ok=ok, body=body, location=None, hops=0, previous=previous,
                           now=now, agent_token="crawlerd", cache_ttl_s=TTL, error_retry_s=600.0,
                           max_bytes=512 * 1024)


def cache(d, mono, wall, **kw):
    return RobotsCache(directory=str(d), agent_token="crawlerd", clock=mono, wall=wall, **kw)


def test_entries_survive_a_restart_with_their_expiry(tmp_path):
    mono, wall = Clock(100.0), Clock(1_700_000_000.0)
    c = cache(tmp_path, mono, wall)
    c.put("http://a.test", decide(200, mono.t), BODY)
    c.put("http://b.test", decide(404, mono.t), b"")
    c.put("http://c.test", decide(503, mono.t), b"")
    c.close()
    mono2, wall2 = Clock(5.0), Clock(wall.t + 3600.0)     # a reboot, one hour later
    c2 = cache(tmp_path, mono2, wall2)
    a = c2.get("http://a.test", mono2.t)
    assert a is not None and a.outcome_name == RobotsState.PARSED
    assert not a.rules.allowed("/private/x") and a.rules.allowed("/x") and a.rules.crawl_delay == 2.0
    assert a.expires_at == TTL - 3600.0 + 5.0              # 23 h of its 24 h left, on the new clock
    b = c2.get("http://b.test", mono2.t)
    assert b is not None and b.rules.allowed("/private/x")
    assert c2.get("http://c.test", mono2.t) is None          # its 10 minute retry has passed...
    stale = c2.stale("http://c.test")
    assert stale is not None and not stale.ok and not stale.rules.allowed("/x")   # ...but it is still known


def test_304_and_stale_copies_keep_the_rules_of_the_copy(tmp_path):
    mono, wall = Clock(0.0), Clock(1_000_000.0)
    c = cache(tmp_path, mono, wall)
    first = decide(200, 0.0)
    c.put("http://a.test", first, BODY)
    again = decide(304, 10.0, previous=first, body=b"")
    c.put("http://a.test", again, None)
    kept = decide(500, 20.0, previous=again, body=b"")
    assert kept.outcome_name == RobotsState.STALE
    c.put("http://a.test", kept, None)
    c.close()
    c2 = cache(tmp_path, Clock(0.0), Clock(1_000_030.0))
    e = c2.stale("http://a.test")
    assert e.outcome_name == RobotsState.STALE and not e.rules.allowed("/private") and e.rules.allowed("/p")


def test_torn_last_record_is_cut(tmp_path):
    mono, wall = Clock(0.0), Clock(2_000_000.0)
    c = cache(tmp_path, mono, wall)
    c.put("http://a.test", decide(200, 0.0), BODY)
    c.put("http://b.test", decide(200, 0.0), BODY)
    c.close()
    path = tmp_path / FILE_NAME
    size = os.path.getsize(path)
    os.truncate(path, size - 5)                 # kill -9 in the middle of the second write
    c2 = cache(tmp_path, mono, wall)
    assert c2.get("http://a.test", 1.0) is not None and c2.get("http://b.test", 1.0) is None
    c2.put("http://c.test", decide(200, 1.0), BODY)
    c2.close()
    c3 = cache(tmp_path, mono, wall)
    assert c3.get("http://c.test", 2.0) is not None and c3.stored() == 2


def test_bounded_on_disk(tmp_path):
    mono, wall = Clock(0.0), Clock(3_000_000.0)
    c = cache(tmp_path, mono, wall, max_entries=50)
    big = BODY + b"# " + b"x" * 20_000 + b"\n"
    for round_ in range(8):
        for i in range(100):
            c.put(f"http://h{i}.test", decide(200, float(round_), body=big), big)
    assert c.stored() == 50
    assert os.path.getsize(tmp_path / FILE_NAME) <= 2 * 50 * (len(big) + 200) + (1 << 20)
    c.close()
    c2 = cache(tmp_path, mono, wall, max_entries=50)
    assert c2.stored() == 50 and c2.get("http://h99.test", 10.0) is not None
    assert c2.get("http://h0.test", 10.0) is None         # the oldest went out first


def test_very_old_copies_are_forgotten(tmp_path):
    mono, wall = Clock(0.0), Clock(4_000_000.0)
    c = cache(tmp_path, mono, wall)
    c.put("http://a.test", decide(200, 0.0), BODY)
    c.close()
    c2 = cache(tmp_path, Clock(0.0), Clock(4_000_000.0 + 31 * 86400.0))
    assert c2.stale("http://a.test") is None and c2.stored() == 0
