"""Three crawlerd machines (own data dirs, shards 0-1, 2-3 and 4-5 of 6) and a 3-node NATS
JetStream cluster crawl simweb together, their hosts on a few shared IPs; the stream leader is
killed with SIGKILL mid-crawl.

Judged from the server's ledger (per-host and per-IP politeness across machines: concurrency
and ``ip_delay_s``), the WARC files of both machines (every answer archived once, by the host's
owner), the hand-off accounting (every record published is taken by its shard or still in the
stream when the crawl ends: nothing lost), ``cluster status`` from either side, and the refusal
of a node started with another shard count. Driver: tests/e2e/cluster_driver.py.
"""

import gzip
import os
from collections import Counter, defaultdict

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawlerd.config import parse_shard_set
from crawlerd.simweb.ledger import (
    IP_CONCURRENCY,
    crawl_delays,
    entries_from_json,
    ip_gap_violations,
    politeness_violations,
    robots_violations,
)
from crawlerd.url.hosts import host_of, shard_of
from tests.e2e.netns import NETNS_MARKS, run_driver

HOSTS, SECONDS = 100, 50.0

pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    driver = os.path.join(os.path.dirname(__file__), "cluster_driver.py")
    return run_driver(driver, str(base / "report.json"), str(base), str(HOSTS), str(SECONDS), timeout=400)


def machine_of(crawl, host: str) -> str:
    shard = shard_of(host, crawl["shards"])
    return next(n for n, own in crawl["nodes"].items() if shard in parse_shard_set(own))


def test_every_machine_exits_cleanly(crawl):
    for n in crawl["nodes"]:
        assert crawl[f"rc_{n}"] == 0, crawl[f"stderr_{n}"][-3000:]
        assert "Traceback" not in crawl[f"stderr_{n}"], crawl[f"stderr_{n}"][-3000:]


def test_cluster_status_is_the_same_from_every_side(crawl):
    a, b, c = crawl["cluster_alpha"], crawl["cluster_beta"], crawl["cluster_gamma"]
    assert a["shards"] == 6 and a["nodes"] == {"alpha": [0, 1], "beta": [2, 3], "gamma": [4, 5]}, a
    assert b["nodes"] == a["nodes"] == c["nodes"] and len(b["shard_list"]) == len(c["shard_list"]) == 6
    assert all(r["lease_age_s"] is not None and r["pending"] is not None for r in a["shard_list"])
    assert len(a["stream"]["replicas"]) == 2            # R3: a leader and two followers


def test_a_node_with_another_shard_count_is_refused_naming_it(crawl):
    m = crawl["mismatch"]
    assert m["rc"] == 2, m["stderr"]
    assert "crawl.shards = 6" in m["stderr"] and "started with 3" in m["stderr"]


def test_stream_leader_killed_and_the_crawl_went_on(crawl):
    leader = crawl["killed_leader"]
    assert leader, crawl["cluster_alpha"]
    after = crawl["after_kill"]
    assert after["stream"]["leader"] and after["stream"]["leader"] != leader
    t = crawl["t_kill"] + 10.0          # an election, then both machines fetch again
    later = {machine_of(crawl, e["host"]) for e in crawl["ledger"] if e["status"] and e["t_start_wall"] > t}
    assert later == set(crawl["nodes"])
    # the leases outlived the election: no shard stopped for want of its lease
    for n in crawl["nodes"]:
        assert "lease lost" not in crawl[f"stderr_{n}"]


def test_zero_per_host_politeness_violations_across_machines(crawl):
    entries = entries_from_json(crawl["ledger"])
    v = politeness_violations(entries, min_gap_s=1.0, per_ip_concurrency=1,
                              host_min_gap_s=crawl_delays(crawl["site"]))
    assert [x for x in v if x.kind != IP_CONCURRENCY] == [], "\n".join(map(str, v[:20]))


def test_zero_per_ip_violations_across_machines_on_shared_ips(crawl):
    """Every IP carries hosts of all three machines' shards; per_ip_concurrency 1 and ip_delay_s
    hold over the whole cluster, as the server saw the requests."""
    entries = entries_from_json(crawl["ledger"])
    spans = defaultdict(set)                    # IP -> machines whose hosts were fetched on it
    for e in entries:
        if e.host and e.status:
            spans[e.ip].add(machine_of(crawl, e.host))
    shared = [ip for ip, ms in spans.items() if len(ms) == 3]
    assert len(shared) >= 6, spans
    busy = Counter(e.ip for e in entries if e.ip in shared)
    assert min(busy.values()) >= 10, busy
    v = politeness_violations(entries, min_gap_s=0.0, per_ip_concurrency=1)
    v += ip_gap_violations(entries, crawl["ip_delay_s"])
    assert v == [], "\n".join(map(str, v[:20]))
    # the turns were asked for across machines, and handed over between them
    turns = [t for n in crawl["nodes"] for t in crawl[f"ip_turns_{n}"].values()]
    assert len(turns) == 6 and sum(t["asks"] for t in turns) > 0
    assert sum(t["owner_waited"] for t in turns) > 0 and sum(t["dones"] for t in turns) > 0


def test_robots_first_on_every_machine(crawl):
    v = robots_violations(entries_from_json(crawl["ledger"]), crawl["site"], agent="crawlerd")
    assert v == [], "\n".join(map(str, v[:20]))


def _captures(data_dir) -> dict[str, Counter]:
    warc_dir = os.path.join(data_dir, "warc")
    names = sorted(os.listdir(warc_dir))
    assert names and not any(n.endswith(".open") for n in names), names
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


def test_warc_of_all_machines_hold_every_answer_once_by_its_owner(crawl):
    per = {n: _captures(d) for n, d in crawl["dirs"].items()}
    for n, caps in per.items():
        assert caps, n
        wrong = [u for u in caps if machine_of(crawl, host_of(u)) != n]
        assert wrong == [], (n, wrong[:5])
    captures = sum(per.values(), Counter())
    port = crawl["port"]
    answered = Counter(f"http://{e['host']}:{port}{e['target']}" for e in crawl["ledger"] if e["status"])
    assert captures == answered, (captures - answered, answered - captures)


def test_handoff_lost_nothing_and_applied_nothing_twice(crawl):
    sent = received = 0
    per_machine_sent = {}
    for n in crawl["nodes"]:
        finals = crawl[f"handoff_{n}"]          # each shard's numbers after its own drain
        assert sorted(int(i) for i in finals) == parse_shard_set(crawl["nodes"][n])
        s = sum(h["records_sent"] for h in finals.values()) + crawl[f"last_run_{n}"]["cluster"]["seeds_sent"]
        per_machine_sent[n] = s
        sent += s
        received += sum(h["records_received"] for h in finals.values())
        assert all(h["engine_in"]["applied_twice"] == 0 for h in finals.values()), finals
        assert all(h["engine_out"]["unpublished"] == 0 for h in finals.values()), finals
        assert crawl["outbox_files"][n] == [], crawl["outbox_files"][n][:5]   # every batch published
    assert all(v > 0 for v in per_machine_sent.values()), per_machine_sent
    # every record published was taken by its shard or waits in the stream (delivered and not
    # acknowledged when its shard stopped: it comes again at the shard's next start)
    left = sum(crawl["leftovers"]["records"].values())
    assert received <= sent <= received + left, (received, left, sent)
    keys = [tuple(k) for k in crawl["leftovers"]["keys"]]
    assert len(keys) == len(set(keys))                  # no batch stored twice


def test_urls_crossed_between_machines_every_way(crawl):
    by_machine = defaultdict(set)
    for e in crawl["ledger"]:
        if e["status"]:
            by_machine[machine_of(crawl, e["host"])].add(e["host"])
    assert all(len(by_machine[n]) > 5 for n in crawl["nodes"]), {n: len(h) for n, h in by_machine.items()}


def test_each_machines_frontiers_add_up(crawl):
    for n, fronts in crawl["frontiers"].items():
        own = parse_shard_set(crawl["nodes"][n])
        checked = {int(i): fc for i, fc in fronts.items() if int(i) in own}
        assert sorted(checked) == own, (n, sorted(fronts))
        for i, fc in checked.items():
            assert fc["ok"], (n, i, fc)
