"""Scheduling and politeness of the Frontier, one behaviour per test, on a fake clock."""

import pytest

from crawlerd.frontier import KIND_ROBOTS, KIND_URL
from crawlerd.outcome import Outcome

from .conftest import Harness

A, B, C = "http://a.test", "http://b.test", "http://c.test"


def test_heap_holds_exactly_hosts_with_work_and_no_lease(h):
    h.ready(A, 2)
    h.ready(B, 1)
    h.f.check_invariants(deep=True)
    assert h.f.stats()["hosts_ready"] == 2
    la, lb = sorted(h.lease(), key=lambda lease: lease.host_key)
    assert h.f.stats()["hosts_ready"] == 0           # leased hosts leave the heap
    h.f.check_invariants()
    h.done(la)
    assert h.f.stats()["hosts_ready"] == 1           # A still has work: back in
    h.done(lb)
    st = h.f.stats()
    assert st["hosts_ready"] == 1 and st["hosts_active"] == 1   # B ran dry: out of RAM
    h.f.check_invariants(deep=True)


def test_no_lease_before_ip_is_known_and_dns_asked_once(h):
    h.add(A, 3)
    h.robots_known(A)
    assert h.lease() == []
    assert h.f.hosts_needing_dns() == [A]
    assert h.f.hosts_needing_dns() == []
    h.f.set_host_ip(A, "127.0.0.9")
    (lease,) = h.lease()
    assert lease.ip == "127.0.0.9" and lease.kind == KIND_URL


def test_expired_ip_is_resolved_again(h):
    h.add(A, 2)
    h.resolve()
    h.robots_known(A)
    h.f.set_host_ip(A, "127.0.0.2", expires_at=h.clock.t + 10)
    h.done(h.lease()[0])
    h.clock.t += 20
    assert h.lease() == []
    assert h.f.hosts_needing_dns() == [A]


def test_robots_lease_comes_first_and_again_until_known(h):
    h.add(A, 2)
    h.resolve()
    (r1,) = h.lease()
    assert (r1.kind, r1.url, r1.item) == (KIND_ROBOTS, A + "/robots.txt", None)
    assert h.f.needs_robots(A)
    h.done(r1, status=503)                          # robots 5xx: still unknown
    h.clock.t = h.f.next_due()
    (r2,) = h.lease()
    assert r2.kind == KIND_ROBOTS
    h.robots_known(A)
    h.done(r2)
    assert not h.f.needs_robots(A)
    h.clock.t = h.f.next_due()
    (u,) = h.lease()
    assert u.kind == KIND_URL and u.url == A + "/p0"


@pytest.mark.parametrize("rt, gap", [(0.0, 1.0), (0.05, 1.0), (0.5, 5.0), (30.0, 60.0)])
def test_gap_is_clamped_delay_factor_times_response_time(h, rt, gap):
    h.ready(A, 2)
    (lease,) = h.lease()
    h.clock.t += rt
    end = h.clock.t
    h.done(lease, response_time_s=rt)
    assert h.f.next_due() == pytest.approx(end + gap)
    h.clock.t = end + gap - 1e-6
    assert h.lease() == []
    h.clock.t = end + gap
    assert len(h.lease()) == 1


@pytest.mark.parametrize("crawl_delay, gap", [(5.0, 5.0), (600.0, 60.0), (0.2, 1.0)])
def test_crawl_delay_raises_the_gap_up_to_its_cap(h, crawl_delay, gap):
    h.add(A, 2)
    h.resolve()
    h.robots_known(A, crawl_delay_s=crawl_delay)
    h.done(h.lease()[0], response_time_s=0.01)
    assert h.f.next_due() == pytest.approx(h.clock.t + gap)


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured_capped_and_url_retried(tmp_path, status):
    h = Harness(str(tmp_path / "f"), retry_after_cap_s=100.0)
    h.ready(A, 1)
    (lease,) = h.lease()
    h.done(lease, status=status, retry_after_s=40.0)
    assert h.f.next_due() == pytest.approx(h.clock.t + 40.0)
    h.clock.t += 40.0
    (again,) = h.lease()
    assert again.url == lease.url and again.attempt == 2
    h.done(again, status=status, retry_after_s=5000.0)
    assert h.f.next_due() == pytest.approx(h.clock.t + 100.0)


def test_backoff_doubles_with_jitter_is_capped_and_decays(tmp_path):
    h = Harness(str(tmp_path / "f"), backoff_base_s=10.0, backoff_max_s=45.0, max_attempts=100,
                park_after_failures=50)
    h.ready(A, 20)
    waits = []
    for _ in range(4):
        (lease,) = h.lease()
        h.done(lease, outcome=Outcome.CONNECTION_RESET, status=0)
        waits.append(h.f.next_due() - h.clock.t)
        h.clock.t = h.f.next_due()
    for i, w in enumerate(waits):
        base = min(10.0 * 2**i, 45.0)
        assert base <= w <= min(1.5 * base, 45.0) + 1e-9, (i, waits)
    assert len(set(waits[:2])) == 2
    for _ in range(3):                               # three successes: exponent 4 -> 0
        h.done(h.lease()[0])
        h.clock.t = h.f.next_due()
    h.done(h.lease()[0], status=500)                  # a 5xx answer backs off, from the base again
    assert 10.0 <= h.f.next_due() - h.clock.t <= 15.0


def test_failing_host_is_parked(tmp_path):
    h = Harness(str(tmp_path / "f"), backoff_base_s=1.0, backoff_max_s=2.0, park_after_failures=3,
                park_s=5000.0, max_attempts=100)
    h.ready(A, 10)
    for _ in range(3):
        h.done(h.lease()[0], outcome=Outcome.TIMEOUT, status=0)
        wait = h.f.next_due() - h.clock.t
        h.clock.t = h.f.next_due()
    assert wait == pytest.approx(5000.0)
    assert h.f.stats()["parked"] == 1


def test_dead_letter_after_max_attempts(h):
    h.ready(A, 1)
    for attempt in (1, 2, 3):
        (lease,) = h.lease()
        assert lease.attempt == attempt
        h.done(lease, outcome=Outcome.TIMEOUT, status=0)
        h.clock.t = h.f.next_due() or h.clock.t
    st = h.f.stats()
    assert st["dead_letter"] == 1 and st["queued"] == 0 and st["hosts_active"] == 0
    ((item, tag),) = h.f.dead_letters()
    assert item.url == A + "/p0" and tag == "timeout"
    assert [(i.url, r) for i, r in h.f.drain_dropped()] == [(A + "/p0", "dead_letter:timeout")]
    assert h.f.drain_dropped() == []
    h.f.check_invariants(deep=True)


def test_other_5xx_answers_complete_the_url(h):
    h.ready(A, 1)
    h.done(h.lease()[0], status=500)
    assert h.f.stats()["completed"] == 1 and h.f.queued() == 0


def test_requeue_returns_to_front_without_an_attempt(h):
    h.ready(A, 3)
    (first,) = h.lease()
    assert first.url == A + "/p0"
    h.done(first, outcome=Outcome.ABORTED, status=0, requeue=True)
    h.clock.t = h.f.next_due()
    (again,) = h.lease()
    assert again.url == first.url and again.attempt == 1
    assert h.f.stats()["requeued"] == 1


def test_complete_is_idempotent(h):
    h.ready(A, 2)
    (lease,) = h.lease()
    assert h.done(lease) is True
    assert h.done(lease) is False
    assert h.f.complete(987654, outcome=Outcome.OK) is False
    assert h.f.stats()["completed"] == 1


def test_expired_lease_comes_back_and_late_completion_is_refused(tmp_path):
    h = Harness(str(tmp_path / "f"), lease_timeout_s=50.0, max_attempts=2)
    h.ready(A, 1)
    (lease,) = h.lease()
    assert h.f.expire_leases(h.clock.t + 49) == 0
    h.clock.t += 50
    assert h.f.expire_leases() == 1
    assert h.done(lease) is False
    h.clock.t = h.f.next_due()
    (again,) = h.lease()
    assert again.url == lease.url and again.attempt == 2
    h.clock.t += 50
    h.f.expire_leases()
    assert h.f.stats()["dead_letter"] == 1
    h.f.check_invariants(deep=True)


def test_per_ip_concurrency_and_wakeup(tmp_path):
    h = Harness(str(tmp_path / "f"), per_ip_concurrency=1)
    for host in (A, B, C):
        h.ready(host, 2, ip="127.0.0.7")
    (first,) = h.lease()
    assert h.f.stats()["hosts_ip_wait"] == 2
    h.f.check_invariants()
    h.clock.t += 0.1
    h.done(first, response_time_s=0.01)
    (second,) = h.lease()                             # the IP freed: a waiting host goes at once
    assert second.host_key != first.host_key
    h.f.check_invariants()


def test_per_ip_concurrency_two(tmp_path):
    h = Harness(str(tmp_path / "f"), per_ip_concurrency=2)
    for host in (A, B, C):
        h.ready(host, 1, ip="127.0.0.7")
    assert len(h.lease()) == 2


def test_ip_delay_spaces_requests_to_one_address(tmp_path):
    h = Harness(str(tmp_path / "f"), ip_delay_s=3.0)
    h.ready(A, 1, ip="127.0.0.7")
    h.ready(B, 1, ip="127.0.0.7")
    (first,) = h.lease()
    h.clock.t += 0.5
    end = h.clock.t
    h.done(first)
    assert h.lease() == []
    assert h.f.next_due() == pytest.approx(end + 3.0)


def test_dns_failures(h):
    h.add(A, 3)
    h.add(B, 2)
    h.f.hosts_needing_dns()
    h.f.set_host_ip(A, None, outcome=Outcome.DNS_NXDOMAIN)
    st = h.f.stats()
    assert st["dropped"] == {"dns_nxdomain": 3} and st["queued"] == 2 and st["hosts_active"] == 1
    h.f.set_host_ip(B, None, outcome=Outcome.DNS_SERVFAIL)
    assert h.f.hosts_needing_dns() == []
    assert h.lease() == []
    assert h.f.next_due() >= h.clock.t + 30.0         # backoff_base_s
    h.clock.t = h.f.next_due()
    assert h.lease() == []
    assert h.f.hosts_needing_dns() == [B]
    h.f.check_invariants(deep=True)


def test_big_host_does_not_hold_up_others(h):
    h.add(A, 5000)
    for i in range(20):
        h.add(f"http://small{i}.test", 1)
    h.resolve()
    h.serve_robots()
    h.clock.t += 1.0
    assert len({lease.host_key for lease in h.lease(limit=100)}) == 21


def test_priority_levels_follow_the_ruler_sequence(tmp_path):
    h = Harness(str(tmp_path / "f"), min_delay_s=0.0, delay_factor=0.0)
    for level in range(4):
        h.add(A, 20, priority=level, start=100 * level)
    h.resolve()
    h.robots_known(A)
    levels = []
    for _ in range(16):
        (lease,) = h.lease()
        levels.append(lease.item.priority)
        h.done(lease)
    assert levels == [0, 1, 0, 2, 0, 1, 0, 3] * 2


def test_empty_level_falls_back_to_nearest(tmp_path):
    h = Harness(str(tmp_path / "f"), min_delay_s=0.0, delay_factor=0.0)
    h.add(A, 10, priority=3)
    h.resolve()
    h.robots_known(A)
    (lease,) = h.lease()
    assert lease.item.priority == 3


def test_host_concurrency_allows_more_leases(tmp_path):
    h = Harness(str(tmp_path / "f"), host_concurrency={A: 2}, per_ip_concurrency=4)
    h.ready(A, 5)
    h.ready(B, 5)
    got = [lease.host_key for lease in h.lease()]
    assert sorted(got) == [A, A, B]
    h.f.check_invariants()


def test_demoted_host_queues_lower_and_waits_longer(h):
    h.f.demote_host(A, 2)
    h.ready(A, 2, priority=0)
    (lease,) = h.lease()
    assert lease.item.priority == 2
    h.done(lease, response_time_s=0.5)
    assert h.f.next_due() == pytest.approx(h.clock.t + 5.0 * 3)


def test_waiting_hosts_get_slots_weighted_by_level(tmp_path):
    h = Harness(str(tmp_path / "f"), max_active_hosts=2)
    hosts = [f"http://w{i}.test" for i in range(8)]
    for i, host in enumerate(hosts):
        h.add(host, 1, priority=3 if i < 4 else 0)
    st = h.f.stats()
    assert st["hosts_active"] == 2 and st["hosts_waiting"] == 6
    order = []
    while h.f.queued():
        h.resolve()
        for lease in h.lease():
            if lease.kind == KIND_ROBOTS:
                h.robots_known(lease.host_key)
            else:
                order.append(lease.host_key)
            h.done(lease)
        h.f.check_invariants()
        h.clock.t = h.f.next_due() or h.clock.t
    assert sorted(order) == sorted(hosts)
    later = order[2:]                                 # after the two first-come slots
    # Level 3 is not starved behind level 0: one comes through before level 0 is exhausted.
    level0_left = [hk for hk in later if hk in hosts[4:]]
    assert any(later.index(hk) < later.index(level0_left[-1]) for hk in later if hk in hosts[:4])


def test_backed_off_lists_failing_hosts_worst_first_with_their_wait(tmp_path):
    h = Harness(str(tmp_path / "f"), backoff_base_s=10.0, backoff_max_s=1000.0, park_after_failures=2,
                park_s=5000.0, max_attempts=100)
    h.ready(A, 5)
    h.ready(B, 5)
    h.ready(C, 5)
    assert h.f.backed_off(h.clock.t) == []
    leases = {lease.host_key: lease for lease in h.lease()}
    h.done(leases[A], outcome=Outcome.TIMEOUT, status=0)
    h.done(leases[B], status=503)
    h.done(leases[C])                                     # a success: not backed off
    h.clock.t += 20.0                                     # past both backoffs (10 s + jitter)
    leases = {lease.host_key: lease for lease in h.lease()}
    assert set(leases) == {A, B, C}
    h.done(leases[A], outcome=Outcome.TIMEOUT, status=0)  # A: 2 failures in a row -> parked
    h.done(leases[B], outcome=Outcome.ABORTED, requeue=True)   # handed back: B's count stays 1
    h.done(leases[C])
    rows = h.f.backed_off(h.clock.t)
    assert [r["host"] for r in rows] == [A, B]
    assert rows[0]["failures"] == 2 and rows[0]["parked"] and rows[0]["wait_s"] == pytest.approx(5000.0)
    assert rows[1]["failures"] == 1 and not rows[1]["parked"]
    assert h.f.backed_off(h.clock.t, n=1) == rows[:1]


def test_unfetched_release_does_not_push_the_shared_ip_slot(tmp_path):
    """Across shards (the shared per-IP slot table): a lease released unfetched (nothing sent)
    frees its cell and leaves the IP's due time where its start put it; a fetched one pushes it
    by ip_delay_s from its end."""
    from crawlerd._native import ipslots
    from crawlerd._native.ipslots import IPSlots
    from crawlerd.frontier.leasing import ip_key
    path = str(tmp_path / "ipslots")
    ipslots.create(path, 2, 1, 64)
    slots = IPSlots(path)
    slots.attach(0)
    h = Harness(str(tmp_path / "f"), ip_delay_s=3.0, shared_ips=slots)
    key = ip_key("127.0.0.7")
    h.ready(A, 2, ip="127.0.0.7")
    (first,) = h.lease()
    start = h.clock.t
    assert slots.held(0) == 1 and slots.due(key) == pytest.approx(start + 3.0)
    h.clock.t += 1.0
    assert h.done(first, unfetched=True)
    assert slots.held(0) == 0 and slots.due(key) == pytest.approx(start + 3.0)
    h.clock.t = start + 3.0
    (second,) = h.lease()
    h.clock.t += 0.5
    end = h.clock.t
    h.done(second)
    assert slots.held(0) == 0 and slots.due(key) == pytest.approx(end + 3.0)
    h.f.close()
    slots.close()
