"""The JetStream hand-off against a real 3-node NATS cluster in a private network namespace.

One driver run (tests/cluster/js_driver.py) starts the servers and plays every scenario; each
test below judges one scenario from what the driver counted (see its docstring).
"""

import os

import pytest

from tests.e2e.netns import NETNS_MARKS, run_driver

pytestmark = NETNS_MARKS
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("js") / "js.json")
    return run_driver(os.path.join(HERE, "js_driver.py"), out, timeout=240)


def scenario(res, name):
    r = res[name]
    assert "error" not in r, r["error"]
    return r


def test_every_batch_arrives_once_and_backlog_drains(res):
    r = scenario(res, "basic")
    assert r["drained"] and r["batches"] == {"1": 24, "2": 24} and r["records"] == {"1": 1200, "2": 1200}
    assert r["twice"] == 0 and r["unpublished"] == 0 and r["stream_msgs"] == 0
    assert all(v == {"pending": 0, "ack_pending": 0} for v in r["consumers"].values())


def test_a_republished_batch_is_stored_once(res):
    r = scenario(res, "dedup")
    assert r["first"] == 1 and r["second"] == 1 and r["duplicates"] == 1
    assert r["stream_msgs"] == 1 and r["left"] == 0


def test_unacknowledged_batch_is_delivered_again_and_acked_one_is_not(res):
    r = scenario(res, "redelivery")
    assert r["first_taken"] == 1 and r["again"] and r["same"] and r["redelivered_flag"] == 1
    assert r["after_ack"] == {"1": {"pending": 0, "ack_pending": 0}}
    assert r["third"] == 0


def test_full_destination_holds_batches_on_the_senders_disk(res):
    r = scenario(res, "backpressure")
    assert r["held"]["published"] == 4 and r["held"]["stream_msgs"] == 4 and r["held"]["refused"] >= 1
    assert r["held"]["on_disk"] == 8
    assert r["drained"] and r["batches"] == 12 and r["twice"] == 0 and r["unpublished"] == 0


def test_sender_killed_mid_stream_loses_nothing(res):
    r = scenario(res, "sender_crash")
    assert 0 < r["written_at_kill"] < r["count"]
    assert r["drained"] and r["missing"] == 0 and r["twice"] == 0 and r["restart_rc"] == 0
    assert r["consumers"] == {"1": {"pending": 0, "ack_pending": 0}}


def test_stream_leader_killed_nothing_lost_nothing_twice(res):
    r = scenario(res, "leader_kill")
    assert r["killed"] and r["new_leader"] and r["new_leader"] != r["killed"]
    assert r["drained"] and r["batches"] == r["sent"] and r["twice"] == 0
    assert all(v == {"pending": 0, "ack_pending": 0} for v in r["consumers"].values())
