"""Two shard processes crawl simweb (hosts of both partitions share IPs); one is killed -9 and restarted.

Judged from the server's ledger (politeness across the shards, per IP and per host), the WARC
files (every answer archived once; only answers in flight at the kill may lack their capture),
each shard's frontier after the run (its accounting adds up: nothing lost), ``status --json``
and the logs. Work in flight is as in test_crash_crawl.py: an answer of the killed shard that
ended less than ``IN_FLIGHT_S`` before the kill may be lost with it (and fetched again).
"""

import gzip
import json
import os
from collections import Counter, defaultdict

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawlerd.simweb.ledger import crawl_delays, entries_from_json, politeness_violations, robots_violations
from crawlerd.url.canonical import normalize
from crawlerd.url.hosts import host_of, shard_of
from tests.e2e.netns import NETNS_MARKS, run_driver

HOSTS, SECONDS = 120, 50.0
IN_FLIGHT_S = 3.0
RATE_WINDOW_S = 6.0

pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    data_dir, out = str(base / "data"), str(base / "report.json")
    driver = os.path.join(os.path.dirname(__file__), "shards_driver.py")
    report = run_driver(driver, out, data_dir, str(HOSTS), str(SECONDS), timeout=420)
    report["data_dir"] = data_dir
    return report


def owner(host: str) -> int:
    return shard_of(host, 2)


def test_exits_cleanly(crawl):
    assert crawl["rc"] == 0, crawl["stderr"][-3000:]
    assert "Traceback" not in crawl["stderr"], crawl["stderr"][-3000:]


def test_status_lists_both_shards_and_one_on_its_own(crawl):
    st = crawl["before"]
    assert st is not None, "status --json never showed two running shards"
    assert [s["shard"] for s in st["shards"]] == ["0", "1"]
    assert all(s["pid"] and s["state"] == "running" for s in st["shards"])
    # each shard process runs its own loop: its lag histogram and its transfer/lease split are listed
    assert all(s["loop_lag"]["count"] > 0 and "leases" in s and "processing" in s for s in st["shards"])
    assert st["pages"] == sum(s["pages"] for s in st["shards"]) or st["pages"] >= max(s["pages"] for s in st["shards"])
    one = crawl["one"]
    assert one is not None and one["shard"] == 1 and one["pid"] == st["shards"][1]["pid"]


def test_killed_shard_was_restarted_alone(crawl):
    after = crawl["after"]
    assert after is not None, "shard 1 was not restarted within 40 s"
    assert after["shards"][1]["pid"] != crawl["victim"] and after["shards"][1]["restarts"] == 1
    assert after["shards"][0]["pid"] == crawl["before"]["shards"][0]["pid"]
    assert after["shards"][0]["restarts"] == 0
    assert "shard 1 died" in crawl["stderr"]
    final = crawl["last_run"]["shards"]
    assert final[1]["restarts"] == 1 and final[0]["restarts"] == 0
    # the restarted shard crawled again: its partition resumed from its own state
    led = [e for e in crawl["ledger"] if e["status"] and owner(e["host"]) == 1]
    assert any(e["t_start"] > crawl["t_restarted"] for e in led)


def test_the_other_shards_rate_did_not_drop(crawl):
    t = crawl["t_kill"]
    led = [e for e in crawl["ledger"] if e["status"] and owner(e["host"]) == 0]
    before = sum(1 for e in led if t - RATE_WINDOW_S <= e["t_end"] < t)
    after = sum(1 for e in led if t <= e["t_end"] < t + RATE_WINDOW_S)
    assert before > 10
    assert after >= 0.7 * before, (before, after)


def test_zero_politeness_violations_across_shards(crawl):
    entries = entries_from_json(crawl["ledger"])
    v = politeness_violations(entries, min_gap_s=1.0, per_ip_concurrency=1,
                              host_min_gap_s=crawl_delays(crawl["site"]))
    assert v == [], "\n".join(map(str, v[:20]))


def test_ip_delay_held_across_shards(crawl):
    by_ip = defaultdict(list)
    for e in crawl["ledger"]:
        by_ip[e["ip"]].append(e)
    short = []
    for ip, lst in by_ip.items():
        lst.sort(key=lambda e: e["t_start"])
        for a, b in zip(lst, lst[1:], strict=False):
            if b["t_start"] - a["t_end"] < crawl["ip_delay_s"] - 0.01:
                short.append((ip, a["host"], b["host"], round(b["t_start"] - a["t_end"], 3)))
    assert short == [], short[:10]


def test_shared_ips_were_crawled_by_both_shards(crawl):
    hosts_by_ip = defaultdict(set)
    for e in crawl["ledger"]:
        if e["status"]:
            hosts_by_ip[e["ip"]].add(e["host"])
    across = [ip for ip, hosts in hosts_by_ip.items() if len({owner(h) for h in hosts}) == 2]
    assert across, "no IP was shared by hosts of both shards"


def test_each_host_fetched_by_its_owner_only(crawl):
    # one User-Agent for both shards: ownership shows in which shard's events name the host
    by_shard = defaultdict(set)
    ev_dir = os.path.join(crawl["data_dir"], "events")
    import json
    for name in os.listdir(ev_dir):
        shard = int(name.split("-", 1)[0].removeprefix("events_s")) if name.startswith("events_s") else 0
        with open(os.path.join(ev_dir, name)) as f:
            for line in f:
                ev = json.loads(line)
                if ev.get("url", "").startswith("http"):
                    by_shard[shard].add(host_of(ev["url"]))
    assert by_shard[0] and by_shard[1]
    for shard, hosts in by_shard.items():
        assert all(owner(h) == shard for h in hosts), [h for h in hosts if owner(h) != shard][:5]


def test_robots_first_in_both_shards(crawl):
    v = robots_violations(entries_from_json(crawl["ledger"]), crawl["site"], agent="crawlerd")
    assert v == [], "\n".join(map(str, v[:20]))


def _captures(data_dir) -> Counter:
    warc_dir = os.path.join(data_dir, "warc")
    names = sorted(os.listdir(warc_dir))
    assert names and not any(n.endswith(".open") for n in names), names
    assert any("-0_w" in n for n in names) and any("-1_w" in n for n in names)
    out = Counter()
    for name in names:
        with open(os.path.join(warc_dir, name), "rb") as f:
            for rec in ArchiveIterator(f):
                if rec.rec_type in ("response", "revisit"):
                    out[rec.rec_headers.get_header("WARC-Target-URI")] += 1
                rec.content_stream().read()
        with gzip.open(os.path.join(warc_dir, name)) as g:
            assert g.read(8) == b"WARC/1.1"
    return out


def test_warc_holds_every_answer_once(crawl):
    captures = _captures(crawl["data_dir"])
    port, t = crawl["port"], crawl["t_kill"]
    answers = [e for e in crawl["ledger"] if e["status"]]
    answered = Counter(f"http://{e['host']}:{port}{e['target']}" for e in answers)
    assert not captures - answered, captures - answered      # nothing archived that was not answered
    lost = answered - captures
    settled = []
    for u, n in lost.items():
        host = host_of(u)
        in_flight = [e for e in answers if f"http://{e['host']}:{port}{e['target']}" == u and owner(host) == 1
                     and t - IN_FLIGHT_S <= e["t_end"] <= t + 1.0]
        if len(in_flight) < n:
            settled.append(u)
    assert settled == [], settled[:20]


def test_nothing_lost_in_either_frontier(crawl):
    for i, fc in enumerate(crawl["frontiers"]):
        assert fc["ok"], (i, fc)
        assert fc["stats"]["added"] > 50


def test_handoff_carried_urls_both_ways(crawl):
    final = crawl["last_run"]["shards"]
    sent = [s["handoff"].get("records_sent", 0) for s in final]
    assert all(n > 0 for n in sent), final


def test_sighup_reached_every_shard(crawl):
    err = crawl["stderr"]
    assert "reload passed to 2 shards" in err
    for i in (0, 1):
        assert any(f"shard={i}" in ln and "config reloaded" in ln for ln in err.splitlines()), i


def test_a_shard_that_cannot_start_stops_the_daemon(crawl):
    loop = crawl["crash_loop"]
    assert loop["rc"] == 2, loop["stderr"][-2000:]
    assert "shard 1 died 3 times within 30 s of starting" in loop["stderr"]
    assert "already run by another process" in loop["stderr"]
    assert loop["wall_s"] < 90


def test_sd_notify_speaks_for_the_whole_family(crawl):
    notes = crawl["notify"]
    assert any("READY=1" in m for _t, m in notes)
    statuses = [(t, m) for t, m in notes if m.startswith("STATUS=") and "shards up" in m]
    assert any("2/2 shards up" in m for _t, m in statuses)
    t = crawl["t_kill"]
    assert any("1/2 shards up" in m for tt, m in statuses if tt > t), "the restart never showed in STATUS"
    assert any("2/2 shards up" in m for tt, m in statuses if tt > crawl["t_restarted"])
    pings = [tt for tt, m in notes if "WATCHDOG=1" in m]
    # fed all along, through the restart of one shard (the family was never unhealthy)
    assert pings and max(b - a for a, b in zip(pings, pings[1:], strict=False)) < 5.0
    assert any(t < p < crawl["t_restarted"] for p in pings) or crawl["t_restarted"] - t < 2.0


def test_prometheus_exposition_adds_up_and_labels_each_shard(crawl):
    prom = crawl["prometheus"]
    assert prom["rc"] == 0, prom["stderr"]
    text = prom["text"]
    assert 'crawlerd_queued_urls{shard="0"}' in text and 'crawlerd_queued_urls{shard="1"}' in text
    assert "crawlerd_pages_total" in text


def test_seed_add_hands_seeds_to_their_owners(crawl):
    r = crawl["seed_add"]
    assert r["rc"] == 0, r["err"]
    assert "submitted 2 seeds" in r["out"]


def test_url_why_is_answered_by_the_urls_owner(crawl):
    why = crawl["why"]
    assert why["rc"] == 0, why["err"]
    dec, text, replies = json.JSONDecoder(), why["out"].strip(), []
    while text:
        obj, end = dec.raw_decode(text)
        replies.append(obj)
        text = text[end:].strip()
    assert [r["shard"] for r in replies] == [0, 1]
    assert all(r["ok"] and r["url"] == normalize(u) for r, u in zip(replies, why["urls"], strict=True))
