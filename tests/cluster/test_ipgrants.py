"""Per-IP turns across machines (crawlerd.cluster.ipgrants) over a real 3-node NATS cluster in a
private netns. The driver (tests/cluster/ipgrants_driver.py) plays the scenarios."""

import os

import pytest

from tests.e2e.netns import NETNS_MARKS, run_driver

pytestmark = NETNS_MARKS
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ipgrants") / "ipgrants.json")
    return run_driver(os.path.join(HERE, "ipgrants_driver.py"), out, timeout=180)


def scenario(res, name):
    r = res[name]
    assert "error" not in r, r["error"]
    return r


def test_an_ip_is_never_held_by_two_machines_at_once(res):
    r = scenario(res, "exclusive")
    assert r["leases"] > 100 and r["overlaps"] == 0, r
    assert all(m == ["A", "B"] for m in r["machines_per_ip"].values()), r["machines_per_ip"]
    assert r["handovers"] >= 6 and all(n > 0 for n in r["by_shard"].values()), r
    # questions cross machines, and each shard answers for its own IPs in process
    assert all(s["asks"] > 0 and s["grants"] > 0 for s in r["stats"]), r["stats"]


def test_a_dead_holders_ip_comes_back_after_expiry_and_drain(res):
    r = scenario(res, "dead_holder")
    assert r["expired"] == 1
    assert r["b_grant_s"] + r["drain_s"] - 0.05 <= r["a_after_b_grant_s"] <= r["b_grant_s"] + r["drain_s"] + 1.5


def test_no_grant_without_an_owner(res):
    r = scenario(res, "no_owner")
    assert not r["granted"] and r["no_answer"] >= 1
