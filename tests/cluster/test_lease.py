"""Shard leases in a JetStream KV bucket, against a real 3-node NATS cluster in a private netns.

The driver (tests/cluster/lease_driver.py) plays the scenarios; each test judges one.
"""

import os

import pytest

from tests.e2e.netns import NETNS_MARKS, run_driver

pytestmark = NETNS_MARKS
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lease") / "lease.json")
    return run_driver(os.path.join(HERE, "lease_driver.py"), out, timeout=600)   # 9 scenarios of ≤ 60 s


def scenario(res, name):
    r = res[name]
    assert "error" not in r, r["error"]
    return r


def test_held_lease_is_exclusive_and_renewed_by_compare_and_set(res):
    r = scenario(res, "exclusive")
    assert r["a"] and not r["b"] and r["holder"] == "A"
    assert r["renewals"] >= 2 and r["revision_advanced"] and r["a_held"] and not r["b_held"]


def test_released_lease_is_taken_at_once(res):
    r = scenario(res, "release")
    assert r["b_after_release"] and not r["a_held"] and r["took_s"] < 1.0


def test_stopped_holder_is_fenced_before_the_standby_takes_over(res):
    r = scenario(res, "fencing")
    assert not r["early"] and r["took_over"] and r["standby_held"]
    # the standby waited for the TTL (3 s) after the holder's last renewal
    assert r["takeover_after_stop_s"] >= 2.5
    # the old holder never believed it held the lease after the takeover, and learnt it lost it
    assert r["samples"] > 10 and r["held_after_takeover"] == 0
    assert r["lost"] and "standby" in r["lost_reason"] and r["rc"] == 0


def test_lease_survives_a_killed_bucket_leader(res):
    r = scenario(res, "leader_kill")
    assert r["killed"] and not r["lost"] and not r["stolen"] and r["held_end"]


def test_shard_count_is_fixed_for_the_crawl(res):
    r = scenario(res, "shards")
    assert r["first"] == 6 and r["same"] == 6 and r["stored"] == 6
    assert "crawl.shards = 6" in r["refused"] and "started with 4" in r["refused"]


def test_cluster_status_lists_every_shard_owner_and_backlog(res):
    r = scenario(res, "status")
    v = r["view"]
    assert v["crawl"] == "stat" and v["shards"] == 3 and v["nodes"] == {"alpha": [0], "beta": [1]}
    rows = {row["shard"]: row for row in v["shard_list"]}
    assert rows[0]["owner"] == "alpha" and rows[1]["owner"] == "beta" and rows[2]["owner"] is None
    assert rows[0]["pages"] == 42 and rows[0]["pages_per_s"] == 3.5 and rows[0]["lease_age_s"] >= 0
    assert rows[2]["pending"] == 1 and rows[2]["ack_pending"] == 0
    assert v["stream"]["messages"] == 1 and len(v["stream"]["replicas"]) == 2
    assert "alpha" in r["text"] and "3 shards" in r["text"]


def test_member_parts_from_config_hand_off_and_refuse_a_second_owner(res):
    r = scenario(res, "member")
    assert r["got"] == [[[5, "0 0 0 http://a.test/"]]] and r["held"] == [True, True]
    held_elsewhere, other_n = r["refusals"]
    assert "held by node 'alpha'" in held_elsewhere
    assert "crawl.shards = 2" in other_n and "started with 3" in other_n


def test_one_digest_owner_across_machines_over_nats(res):
    r = scenario(res, "dedup")
    assert r["first"] is None and r["second"] == ["http://a.test/x", 10.0]
    assert r["owner_kept"] == ["http://a.test/x", "10.0", "urn:uuid:1"]
    assert r["released_first"] is None and r["after_release"] is None and r["answered_for_a"] >= 2
    # the owner gone: no answer, so the copy is archived in full (never a revisit of nothing)
    assert r["gone"] is None and r["unanswered"] == 1


def test_a_restarted_process_of_the_same_node_takes_its_lease_over_at_once(res):
    r = scenario(res, "heir")
    assert r["dead"] and not r["other_node"] and r["heir"] and r["inherited"]
    assert r["took_s"] < 2.0                   # not the 3 s TTL
    assert r["dead_lost"] and r["holder_pid_is_heir"]
