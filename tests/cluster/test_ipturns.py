"""The owner's per-IP turn table (crawlerd.cluster.ipturns): one node at a time per IP, the IP's
gap carried across a hand-over, a dead holder's grant freed after expiry + drain, no starvation."""

import random

import pytest

from crawlerd.cluster.ipturns import CONTENDED_GRANT_S, CONTENDED_S, IpTurns

K = 12345


def table(now=100.0, **kw):
    return IpTurns(grant_s=kw.pop("grant_s", 5.0), drain_s=kw.pop("drain_s", 3.0), now=now, **kw)


def test_one_node_at_a_time_its_shards_share_the_turn():
    t = table()
    assert t.want(K, "a", 0, 100.0) == 5.0
    assert t.want(K, "a", 1, 100.1) == 5.0           # same node: shares (its slot table bounds it)
    assert t.want(K, "b", 2, 100.2) < 0              # another node waits
    assert t.turns[K].node == "a" and set(t.turns[K].grants) == {0, 1}


def test_a_waiting_node_stops_renewals_and_gets_the_next_turn_after_the_gap():
    t = table()
    t.want(K, "a", 0, 100.0)
    w = t.want(K, "b", 2, 101.0)
    assert -w == pytest.approx(4.0)                  # until a's grant expires
    assert t.want(K, "a", 0, 102.0) < 0              # no renewal while b waits
    assert t.want(K, "a", 1, 102.0) < 0              # no newcomer of a either
    t.want(K, "b", 2, 103.0)                          # b asks again meanwhile (askers do)
    t.want(K, "b", 2, 104.5)
    t.done(K, "a", 0, 0.7, 105.0)                    # a's gap here ends 0.7 s later
    assert t.want(K, "a", 0, 105.1) < 0              # b waited longer: the next turn is b's
    assert -t.want(K, "b", 2, 105.2) == pytest.approx(0.5)   # not before a's gap ended
    assert t.want(K, "b", 2, 105.7) == CONTENDED_GRANT_S     # contended: turns of about a request
    assert t.turns[K].node == "b"


def test_contended_ips_get_short_grants_until_the_contention_is_old():
    t = table()
    assert t.want(K, "a", 0, 100.0) == 5.0
    t.want(K, "b", 1, 100.5)
    t.done(K, "a", 0, 0.0, 101.0)
    assert t.want(K, "b", 1, 101.1) == CONTENDED_GRANT_S
    t.done(K, "b", 1, 0.0, 101.6)
    assert t.want(K, "b", 1, 100.5 + CONTENDED_S + 0.1) == 5.0


def test_a_reservation_is_forgotten_when_its_node_stops_asking():
    t = table()
    t.want(K, "a", 0, 100.0)
    t.want(K, "b", 2, 101.0)                          # b waits once, then goes away
    t.done(K, "a", 0, 0.0, 102.0)
    assert t.want(K, "a", 0, 103.5) > 0               # b's reservation lapsed: a may go on


def test_a_holder_that_never_says_done_frees_the_ip_drain_s_after_expiry():
    t = table()
    t.want(K, "a", 0, 100.0)                          # then node a dies
    assert t.want(K, "b", 1, 104.0) < 0
    assert t.want(K, "b", 1, 107.9) < 0               # expiry 105 + drain 3
    assert t.want(K, "b", 1, 108.0) > 0
    assert t.expired == 1


def test_a_late_or_repeated_done_changes_nothing():
    t = table()
    t.want(K, "a", 0, 100.0)
    t.done(K, "a", 0, 0.0, 101.0)
    t.want(K, "b", 1, 101.0)
    t.done(K, "a", 0, 0.0, 101.5)                     # a repeat after b got the turn
    assert t.turns[K].node == "b" and set(t.turns[K].grants) == {1}


def test_quiet_start_grants_nothing_until_an_earlier_processs_grants_ran_out():
    t = table(now=100.0, quiet_s=8.0)
    assert -t.want(K, "a", 0, 100.0) == pytest.approx(8.0)
    assert t.want(K, "a", 0, 108.0) == 5.0


def test_sweep_forgets_idle_ips_only():
    t = table()
    t.want(1, "a", 0, 100.0)
    t.want(2, "a", 0, 100.0)
    t.done(2, "a", 0, 1.0, 100.5)
    assert t.sweep(120.0) == 2                          # 1: expired + drained; 2: done, gap over
    t.want(3, "a", 0, 121.0)
    assert t.sweep(140.0) == 1 and t.held() == 0


def test_random_questions_never_give_one_ip_to_two_nodes():
    """Three nodes of two shards ask, renew, give back or die at random; at every moment the
    shards believing they hold a grant (counted from their question's sending) are of one node."""
    rng = random.Random(7)
    t = table(grant_s=1.0, drain_s=0.5)
    shards = {s: "abc"[s // 2] for s in range(6)}
    local_exp = {}                                       # shard -> its own idea of its grant's end
    dead = set()
    now = 100.0
    for _ in range(20000):
        now += rng.random() * 0.05
        s = rng.randrange(6)
        if s in dead:
            continue
        exp = local_exp.get(s)
        if exp is not None and exp <= now:
            del local_exp[s]                             # lapsed: give it back, or die holding it
            if rng.random() < 0.01:
                dead.add(s)
            else:
                t.done(K, shards[s], s, rng.random() * 0.2, now)
            continue
        r = t.want(K, shards[s], s, now)
        if r > 0:
            local_exp[s] = now + r
        holders = {shards[x] for x, e in local_exp.items() if e > now}
        assert len(holders) <= 1, (now, local_exp)
    assert t.granted > 100 and len({shards[s] for s in range(6) if s not in dead}) >= 1


def test_own_ips_in_process_a_lapsed_grant_with_a_request_out_waits_its_turn(tmp_path):
    """ClusterIpSlots over a real slot table, N = 1 (every IP this shard's own): a grant that
    expired while a request is out is neither used nor given back; another node's turn comes
    only after that request ended."""
    from crawlerd._native.ipslots_ref import RefIPSlots, create
    from crawlerd.cluster.ipgrants import ClusterIpSlots
    path = str(tmp_path / "slots")
    create(path, 1, 1, 1024)
    local = RefIPSlots(path)
    local.attach(0, 100.0, 0.0)
    turns = table(now=100.0)
    ips = ClusterIpSlots(local, shard=0, shards=1, node="a", grant_s=5.0, own=turns)
    assert ips.try_acquire(K, 100.0, 0.0) == 0.0            # granted in process, cell taken
    for t in (101.0, 102.5, 104.0, 105.5):
        assert turns.want(K, "b", 1, t) < 0                  # another node waits (and keeps asking)
    w = ips.try_acquire(K, 106.0, 0.0)                       # grant lapsed, the request still out
    assert w > 106.0 and ips.inflight[K] == 1
    assert turns.want(K, "b", 1, 106.1) < 0                  # not given back while it is out
    ips.release(K, 107.0, 0.0)                               # the request ended: given back
    assert turns.turns[K].node is None and K not in ips.grants
    assert turns.want(K, "b", 1, 107.1) > 0
    assert ips.try_acquire(K, 107.2, 0.0) > 107.2            # now b's turn
    local.close()
