"""The ledger checks on hand-made ledgers: each violation kind is found, clean ledgers pass."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd.simweb import ledger as L
from crawlerd.simweb.site import Site


def E(seq, host, t0, t1, target="/p/1.html", ip="127.0.0.2", status=200, retry_after_s=None):
    return L.LedgerEntry(seq=seq, conn=seq, host=host, ip=ip, method="GET", target=target,
                         t_start=t0, t_end=t1, status=status, retry_after_s=retry_after_s)


def kinds(vs):
    return sorted(v.kind for v in vs)


# --- politeness ---

def test_clean_sequence_passes():
    entries = [E(0, "a.sim", 0.0, 0.1), E(1, "a.sim", 1.2, 1.3), E(2, "b.sim", 0.0, 0.2, ip="127.0.0.3"),
               E(3, "b.sim", 1.2, 1.25, ip="127.0.0.3")]
    assert L.politeness_violations(entries, min_gap_s=1.0) == []


def test_overlap_on_one_host_detected():
    entries = [E(0, "a.sim", 0.0, 1.0), E(1, "a.sim", 0.5, 1.5, ip="127.0.0.9")]
    vs = L.politeness_violations(entries, min_gap_s=0.0, per_ip_concurrency=4)
    assert kinds(vs) == [L.HOST_OVERLAP]
    assert (vs[0].seq, vs[0].other_seq, vs[0].key) == (1, 0, "a.sim")


def test_short_gap_detected_and_tolerance_forgives_small_shortfall():
    entries = [E(0, "a.sim", 0.0, 0.1), E(1, "a.sim", 1.05, 1.2)]
    vs = L.politeness_violations(entries, min_gap_s=1.0, tolerance_s=0.0)
    assert kinds(vs) == [L.HOST_GAP]
    assert L.politeness_violations(entries, min_gap_s=1.0, tolerance_s=0.06) == []


def test_gap_is_measured_from_latest_end_not_previous_start():
    # seq 0 is long; seq 1 (other IP, same host) overlaps it; seq 2 follows seq 0's end too closely
    entries = [E(0, "a.sim", 0.0, 5.0), E(1, "a.sim", 1.0, 1.1, ip="127.0.0.3"), E(2, "a.sim", 5.5, 5.6)]
    vs = L.politeness_violations(entries, min_gap_s=1.0, per_ip_concurrency=2)
    assert [(v.kind, v.seq, v.other_seq) for v in vs] == [(L.HOST_OVERLAP, 1, 0), (L.HOST_GAP, 2, 0)]


def test_per_host_minimum_from_crawl_delay():
    entries = [E(0, "slow.sim", 0.0, 0.1), E(1, "slow.sim", 1.5, 1.6)]
    assert L.politeness_violations(entries, min_gap_s=1.0) == []
    vs = L.politeness_violations(entries, min_gap_s=1.0, host_min_gap_s={"slow.sim": 2.0})
    assert kinds(vs) == [L.HOST_GAP]


def test_ip_concurrency_detected_across_hosts():
    entries = [E(0, "a.sim", 0.0, 1.0), E(1, "b.sim", 0.5, 1.5), E(2, "c.sim", 0.6, 0.7)]
    vs = L.politeness_violations(entries, min_gap_s=0.0, per_ip_concurrency=1)
    assert [(v.kind, v.seq) for v in vs] == [(L.IP_CONCURRENCY, 1), (L.IP_CONCURRENCY, 2)]
    vs2 = L.politeness_violations(entries, min_gap_s=0.0, per_ip_concurrency=2)
    assert [(v.kind, v.seq) for v in vs2] == [(L.IP_CONCURRENCY, 2)]
    assert L.politeness_violations(entries, min_gap_s=0.0, per_ip_concurrency=3) == []


def test_ip_gap_across_hosts_from_the_latest_end_before_the_start():
    entries = [E(0, "a.sim", 0.0, 1.0), E(1, "b.sim", 1.5, 1.6), E(2, "c.sim", 1.9, 2.0),
               E(3, "a.sim", 2.6, 2.7, ip="127.0.0.9")]
    vs = L.ip_gap_violations(entries, ip_delay_s=0.5)
    # 1 starts 0.5 s after 0's end (exactly the gap); 2 starts 0.3 s after 1's end
    assert [(v.kind, v.seq, v.other_seq) for v in vs] == [(L.IP_GAP, 2, 1)]
    assert L.ip_gap_violations(entries, ip_delay_s=0.3) == []


def test_short_requests_do_not_stay_in_flight():
    # a request shorter than the tolerance must still leave the in-flight set
    entries = [E(0, "a.sim", 0.0, 0.001), E(1, "b.sim", 0.5, 0.501), E(2, "c.sim", 1.0, 1.001)]
    assert L.politeness_violations(entries, min_gap_s=0.0, tolerance_s=0.01) == []


def test_short_request_inside_long_one_is_concurrency():
    entries = [E(0, "a.sim", 0.0, 10.0), E(1, "b.sim", 5.0, 5.001)]
    vs = L.politeness_violations(entries, min_gap_s=0.0, tolerance_s=0.01)
    assert [(v.kind, v.seq, v.other_seq) for v in vs] == [(L.IP_CONCURRENCY, 1, 0)]


def test_back_to_back_on_one_ip_is_not_concurrency():
    entries = [E(0, "a.sim", 0.0, 1.0), E(1, "b.sim", 1.0, 2.0), E(2, "c.sim", 2.0, 3.0)]
    assert L.politeness_violations(entries, min_gap_s=0.0, tolerance_s=0.0) == []


# --- robots ---

SITE = {"hosts": {
    "ok.sim": {"robots": {"variant": "disallow_private", "paths": ["/robots.txt"], "unavailable": False,
                          "groups": [{"agents": ["*"], "rules": [["disallow", "/private/"]],
                                      "crawl_delay_s": None}]}},
    "ag.sim": {"robots": {"variant": "agent_groups", "paths": ["/robots.txt"], "unavailable": False,
                          "groups": [
        {"agents": ["otherbot"], "rules": [["disallow", "/"]], "crawl_delay_s": None},
        {"agents": ["CrawlerD", "somebot"], "rules": [["disallow", "/private/"], ["allow", "/private/open/"],
                                                    ["disallow", "/*.json$"]], "crawl_delay_s": 2.0},
        {"agents": ["*"], "rules": [["disallow", "/"]], "crawl_delay_s": None}]}},
    "down.sim": {"robots": {"variant": "status_503", "paths": ["/robots.txt"], "unavailable": True,
                            "groups": []}},
    "hop.sim": {"robots": {"variant": "redirect_chain", "unavailable": False,
                           "paths": ["/robots.txt", "/moved/robots-hop.txt", "/moved/robots-final.txt"],
                           "groups": [{"agents": ["*"], "rules": [["disallow", "/private/"]],
                                       "crawl_delay_s": None}]}},
}}


def robots_first(host, seq=0):
    return E(seq, host, 0.0, 0.1, target="/robots.txt")


def test_robots_clean_crawl_passes():
    entries = [robots_first("ok.sim"), E(1, "ok.sim", 1.0, 1.1, "/p/3.html"),
               robots_first("ag.sim", 2), E(3, "ag.sim", 1.0, 1.1, "/private/open/1.html"),
               E(4, "ag.sim", 2.0, 2.1, "/data/1.json?x=1"),
               E(5, "hop.sim", 0.0, 0.1, "/robots.txt"), E(6, "hop.sim", 0.2, 0.3, "/moved/robots-hop.txt"),
               E(7, "hop.sim", 0.4, 0.5, "/moved/robots-final.txt"), E(8, "hop.sim", 1.5, 1.6, "/p/1.html"),
               robots_first("down.sim", 9), E(10, "down.sim", 700, 701, "/robots.txt"),
               E(11, "unknown.sim", 0, 1, "/anything")]
    assert L.robots_violations(entries, SITE, agent="crawlerd") == []


def test_disallowed_path_detected():
    entries = [robots_first("ok.sim"), E(1, "ok.sim", 1.0, 1.1, "/private/2.html")]
    vs = L.robots_violations(entries, SITE)
    assert [(v.kind, v.seq) for v in vs] == [(L.ROBOTS_DISALLOWED, 1)]


def test_agent_groups_select_by_token_case_insensitively():
    entries = [robots_first("ag.sim"), E(1, "ag.sim", 1, 1.1, "/private/2.html"),
               E(2, "ag.sim", 2, 2.1, "/data/1.json"), E(3, "ag.sim", 3, 3.1, "/p/1.html")]
    assert [v.seq for v in L.robots_violations(entries, SITE, agent="crawlerd")] == [1, 2]
    # an agent with no group of its own falls back to "*", which disallows everything
    assert [v.seq for v in L.robots_violations(entries, SITE, agent="mybot")] == [1, 2, 3]


def test_robots_matcher_rules():
    groups = SITE["hosts"]["ag.sim"]["robots"]["groups"]
    assert L.robots_allows(groups, "CRAWLERD", "/private/open/x.html")       # longer allow wins
    assert not L.robots_allows(groups, "crawlerd", "/private/x.html")
    assert not L.robots_allows(groups, "crawlerd", "/a/b.json")              # "*" and "$"
    assert L.robots_allows(groups, "crawlerd", "/a/b.json?x")                # "$" anchors the end
    assert L.robots_allows([], "crawlerd", "/anything")                      # no robots: allow all
    tie = [{"agents": ["*"], "rules": [["disallow", "/x"], ["allow", "/x"]]}]
    assert L.robots_allows(tie, "a", "/x/1")                                 # tie: allow wins
    empty = [{"agents": ["*"], "rules": [["disallow", ""]]}]
    assert L.robots_allows(empty, "a", "/x")


def test_unavailable_robots_forbids_every_page():
    entries = [robots_first("down.sim"), E(1, "down.sim", 5, 5.1, "/p/1.html"), E(2, "down.sim", 9, 9.1, "/")]
    vs = L.robots_violations(entries, SITE)
    assert [(v.kind, v.seq) for v in vs] == [(L.ROBOTS_UNAVAILABLE, 1), (L.ROBOTS_UNAVAILABLE, 2)]


def test_page_before_robots_detected():
    entries = [E(0, "ok.sim", 0.0, 0.1, "/p/1.html"), E(1, "ok.sim", 1.0, 1.1, "/robots.txt")]
    vs = L.robots_violations(entries, SITE)
    assert [(v.kind, v.seq) for v in vs] == [(L.ROBOTS_NOT_FIRST, 0)]
    # never asked for robots.txt at all
    vs2 = L.robots_violations([E(0, "ok.sim", 0.0, 0.1, "/p/1.html")], SITE)
    assert kinds(vs2) == [L.ROBOTS_NOT_FIRST]


def test_page_between_robots_redirect_hops_detected():
    entries = [E(0, "hop.sim", 0.0, 0.1, "/robots.txt"), E(1, "hop.sim", 0.5, 0.6, "/p/1.html"),
               E(2, "hop.sim", 1.0, 1.1, "/moved/robots-hop.txt"),
               E(3, "hop.sim", 1.5, 1.6, "/moved/robots-final.txt")]
    assert [(v.kind, v.seq) for v in L.robots_violations(entries, SITE)] == [(L.ROBOTS_NOT_FIRST, 1)]


def test_page_started_while_robots_in_flight_detected():
    entries = [E(0, "ok.sim", 0.0, 2.0, "/robots.txt"), E(1, "ok.sim", 1.0, 1.1, "/p/1.html")]
    assert kinds(L.robots_violations(entries, SITE)) == [L.ROBOTS_NOT_FIRST]


def test_crawl_delays_from_site_description():
    assert L.crawl_delays(SITE, "crawlerd") == {"ag.sim": 2.0}
    assert L.crawl_delays(SITE, "otherbot") == {}
    site = Site(40, seed=2).describe(8080)
    delays = L.crawl_delays(site, "crawlerd")
    assert delays and set(delays.values()) == {2.0}
    for name in delays:
        assert site["hosts"][name]["robots"]["variant"] == "crawl_delay"


# --- Retry-After ---

def test_retry_after_window_respected_passes():
    entries = [E(0, "rl.sim", 0.0, 0.1, status=429, retry_after_s=3.0), E(1, "rl.sim", 3.2, 3.3)]
    assert L.retry_after_violations(entries) == []


def test_request_inside_retry_after_window_detected():
    entries = [E(0, "rl.sim", 0.0, 0.1, status=429, retry_after_s=3.0), E(1, "rl.sim", 2.0, 2.1),
               E(2, "other.sim", 1.0, 1.1)]
    vs = L.retry_after_violations(entries)
    assert [(v.kind, v.key, v.seq, v.other_seq) for v in vs] == [(L.RETRY_AFTER, "rl.sim", 1, 0)]


# --- store and serialisation ---

def test_ledger_store_since_and_reset_keep_seq_monotonic(tmp_path):
    led = L.Ledger()
    for i in range(5):
        led.open(conn=1, host="a.sim", ip="127.0.0.2", method="GET", target=f"/p/{i}.html")
    assert [e.seq for e in led.since(3)] == [3, 4]
    assert led.reset() == 5
    e = led.open(conn=2, host="a.sim", ip="127.0.0.2", method="GET", target="/")
    assert e.seq == 5 and led.since(0) == [e]
    path = tmp_path / "ledger.jsonl"
    led.write_jsonl(str(path))
    back = L.read_jsonl(str(path))
    assert back == [e]
    assert L.entries_from_json([json.loads(json.dumps(e.to_dict()))]) == [e]


def test_summary_counts():
    s = L.summary([E(0, "a.sim", 0, 1), E(1, "a.sim", 2, 3, status=404), E(2, "b.sim", 0, 1)])
    assert s == {"requests": 3, "by_status": {200: 2, 404: 1}, "by_host": {"a.sim": 2, "b.sim": 1}}


# --- the sweep against a brute-force definition ---

_interval = st.tuples(st.integers(0, 50), st.integers(0, 20)).map(lambda t: (t[0] / 10, (t[0] + t[1]) / 10))


@settings(max_examples=200, deadline=None)
@given(st.lists(_interval, max_size=12), st.integers(1, 3))
def test_ip_concurrency_matches_brute_force(intervals, limit):
    tol = 0.05
    entries = [E(i, f"h{i}.sim", a, b) for i, (a, b) in enumerate(intervals)]
    order = sorted(entries, key=lambda e: (e.t_start, e.seq))
    expected = set()
    for i, e in enumerate(order):
        in_flight = [o for o in order[:i] if o.t_end - tol > e.t_start]
        if len(in_flight) >= limit:
            expected.add(e.seq)
    got = {v.seq for v in L.politeness_violations(entries, 0.0, limit, tolerance_s=tol)
           if v.kind == L.IP_CONCURRENCY}
    assert got == expected


def test_ledger_limit_keeps_most_recent_and_counts_dropped():
    led = L.Ledger(max_entries=8)
    for i in range(30):
        led.open(conn=1, host="a.sim", ip="127.0.0.2", method="GET", target=f"/p/{i}.html")
        assert len(led.entries) <= 8
    assert led.entries[-1].seq == 29 and led.dropped + len(led.entries) == 30
    assert [e.seq for e in led.entries] == list(range(30 - len(led.entries), 30))
