"""The frontier's working set (crawlerd.frontier.working): members come back every gap, sessions end,
every ready host gets its turn, politeness holds, and with it off hosts go in due-time order."""

from itertools import pairwise

import pytest

from crawlerd.frontier.working import WorkingSet

from .conftest import Harness

KEEP_ALIVE_S = 5.0


def host(i: int) -> str:
    return f"http://h{i:04d}.test"


def crawl(h: Harness, hosts: int, urls: int, slots: int, seconds: float, fetch_s: float = 0.05,
          step_s: float = 0.01, arrivals=None):
    """A crawl bound by its ``slots`` (not by politeness) on the harness's fake clock: every lease
    takes ``fetch_s``, then completes. Returns per host the (start, end) of each request, and
    checks the frontier's invariants and the 1 s host gap on the way. ``arrivals(t)``: hosts
    to queue at time t (new hosts found while crawling)."""
    for i in range(hosts):
        h.ready(host(i), urls)
    out: list[tuple[float, object]] = []
    seen: dict[str, list[tuple[float, float]]] = {}
    end = h.clock.t + seconds
    n = 0
    while h.clock.t < end:
        now = h.clock.t
        while out and out[0][0] <= now:
            _, lease = out.pop(0)
            h.robots_known(lease.host_key)
            h.done(lease)
            s, _ = seen[lease.host_key][-1]
            seen[lease.host_key][-1] = (s, now)
        if arrivals is not None:
            for hk in arrivals(now):
                h.ready(hk, urls)
        for lease in h.lease(slots - len(out)):
            runs = seen.setdefault(lease.host_key, [])
            assert not runs or now >= runs[-1][1] + 1.0 - 1e-9, f"{lease.host_key}: gap under 1 s"
            runs.append((now, now))
            out.append((now + fetch_s, lease))
        out.sort(key=lambda x: x[0])
        n += 1
        if n % 200 == 0:
            h.f.check_invariants()
        h.clock.t = now + step_s
    h.f.check_invariants(deep=True)
    return seen


def reuse_share(seen) -> float:
    """Requests that follow their host's previous one within the keep-alive time (a kept connection)."""
    close = total = 0
    for runs in seen.values():
        for (_, e0), (s1, _) in pairwise(runs):
            close += s1 - e0 <= KEEP_ALIVE_S
            total += 1
        total += 1          # the host's first request opens a connection
    return close / total


@pytest.mark.parametrize("cap", [4096, 0])
def test_rate_bound_crawl_takes_turns_within_the_keep_alive_only_with_the_working_set(tmp_path, cap):
    h = Harness(str(tmp_path / "f"), working_set_max=cap, session_fetches=20, session_s=30.0)
    seen = crawl(h, hosts=2000, urls=30, slots=8, seconds=60.0)
    share = reuse_share(seen)
    st = h.f.stats()
    if cap:
        # 160 requests/s (8 slots / 0.05 s) x 1.05 s per turn (fetch, gap): ~170 members, each back
        # every gap
        assert 150 <= st["working_set_hosts"] <= 200, st
        assert share > 0.8, share
        assert len(seen) < 1000
    else:
        assert st["working_set_hosts"] == 0 and st["sessions_started"] == 0
        assert share < 0.2, share           # a round-robin over 2,000 hosts: every turn ~12 s apart
        assert len(seen) == 2000


def test_sessions_end_and_every_ready_host_gets_one(tmp_path):
    """Starvation-free: with hosts that never run dry and new hosts arriving all the time, every
    host that was ready at the start gets a session, and no session exceeds its budget."""
    h = Harness(str(tmp_path / "f"), working_set_max=4096, session_fetches=5, session_s=30.0)
    fresh = iter(range(1000, 100000))

    def arrivals(t):        # two new hosts a second, each due at once (its record is new)
        return [host(next(fresh)) for _ in range(2)] if round(t * 100) % 50 == 0 else []

    seen = crawl(h, hosts=120, urls=500, slots=4, seconds=240.0, arrivals=arrivals)
    assert all(host(i) in seen for i in range(120)), [i for i in range(120) if host(i) not in seen]
    st = h.f.stats()
    assert st["sessions_spent"] > 0
    # a session is at most 5 leases back to back (a robots lease counts): longer runs of turns a
    # gap apart would mean a host kept its place past its budget
    for hk, runs in seen.items():
        streak = 1
        for (_, e0), (s1, _) in pairwise(runs):
            streak = streak + 1 if s1 - e0 < 1.5 else 1
            assert streak <= 5, f"{hk}: {streak} turns in a row"


def test_member_with_nothing_queued_leaves_and_the_next_ready_host_enters(h):
    h.ready(host(1), 1)
    h.ready(host(2), 1)
    (a,) = h.lease(1)                       # one slot: one member
    assert h.f.stats()["working_set_hosts"] == 1
    h.done(a)                               # its queue ran dry
    assert h.f.stats()["working_set_hosts"] == 0
    (b,) = h.lease(1)
    assert b.host_key != a.host_key
    h.f.check_invariants(deep=True)


def test_turn_sharers_says_when_a_connection_is_worth_keeping(tmp_path):
    h = Harness(str(tmp_path / "f"), working_set_max=1, session_fetches=2, session_s=30.0)
    h.ready(host(1), 5)
    h.ready(host(2), 5)
    assert h.f.turn_sharers(host(1)) is None            # not a member yet: its turn is not near
    (a,) = h.lease()                                    # room for one member
    assert a.host_key == host(1) and h.f.turn_sharers(host(1)) == 1    # a lease left this session
    h.done(a)
    h.clock.t = h.f.next_due()
    (b,) = h.lease()
    assert b.host_key == host(1)
    assert h.f.turn_sharers(host(1)) is None            # its session's last lease while h2 waits: close
    h.done(b)
    assert h.f.stats()["working_set_hosts"] == 0 and h.f.stats()["sessions_spent"] == 1
    (c,) = h.lease()                                    # the idle host ready first: h2, waiting since the start
    assert c.host_key == host(2) and h.f.stats()["sessions_started"] == 2
    off = Harness(str(tmp_path / "off"), working_set_max=0)
    off.ready(host(1), 3)
    off.ready(host(2), 3)
    assert off.f.turn_sharers(host(1)) == 2             # off: every scheduled host takes turns


def test_a_lone_host_keeps_its_place_and_its_connection(tmp_path):
    """With no host waiting idle a used-up session starts again: a one-domain crawl never closes
    its connection for the working set's sake, nor waits for it."""
    h = Harness(str(tmp_path / "f"), working_set_max=4096, session_fetches=2, session_s=30.0)
    h.ready(host(1), 7)
    starts = []
    for _ in range(6):
        (lease,) = h.lease()
        starts.append(h.clock.t)
        assert h.f.turn_sharers(host(1)) == 1
        h.done(lease)
        assert h.f.stats()["working_set_hosts"] == 1
        h.clock.t = h.f.next_due()
    assert [b - a for a, b in pairwise(starts)] == [pytest.approx(1.0)] * 5
    assert h.f.stats()["sessions_started"] == 4      # one, then one more after every second lease


def test_cap_bounds_the_members_and_next_due_waits_for_room(tmp_path):
    h = Harness(str(tmp_path / "f"), working_set_max=2)
    for i in range(5):
        h.ready(host(i), 3)
    leases = h.lease()
    assert len(leases) == 2 and h.f.stats()["working_set_hosts"] == 2
    assert h.f.next_due() is None           # due idle hosts, but no room: nothing to wake for
    for lease in leases:
        h.done(lease)
    assert h.f.next_due() == pytest.approx(h.clock.t + 1.0)
    h.f.check_invariants(deep=True)


def test_idle_hosts_queue_in_the_order_they_became_ready():
    ws = WorkingSet(cap=10)
    ws.pop_due(100.0, 0)                    # the latest lease call: t = 100
    ws.push(1, 50.0)                        # ready long ago, pushed now: queued as of t = 100
    ws.push(2, 100.5)
    ws.push(3, 10.0)                        # pushed after 1: after it, however old its due
    assert ws.pop_due(101.0, 10) == [1, 3, 2]
    assert sorted(ws.session) == [1, 2, 3]
    ws.push(1, 102.0)
    ws.push(4, 90.0)                        # idle, keyed at t = 101
    assert ws.pop_due(102.0, 1) == [1]      # one slot, a due member: no idle host enters
    assert ws.pop_due(102.0, 1) == [4]      # no member due: the idle host enters
    ws.check_invariant()


def test_working_set_refuses_bad_settings():
    with pytest.raises(ValueError, match="session_fetches"):
        WorkingSet(cap=10, session_fetches=0)
    with pytest.raises(ValueError, match="cap"):
        WorkingSet(cap=-1)
