"""The frontier's deferred level: served only when its host has nothing else; promote_deferred."""

from crawlerd.frontier import QueuedURL
from crawlerd.frontier.items import PRIORITY_DEFERRED

from .conftest import Harness

HOST = "http://a.example"


def _drain(h: Harness) -> list[str]:
    """Lease and complete every URL of the one host, advancing the clock past each gap."""
    out = []
    for _ in range(1000):
        leases = h.lease()
        if not leases:
            if h.f.queued() == 0:
                return out
            h.clock.t += 100.0
            continue
        for lease in leases:
            out.append(lease.url)
            h.done(lease)
    raise AssertionError("frontier never drained")


def test_deferred_urls_come_after_every_other_level(tmp_path):
    h = Harness(str(tmp_path / "f"), deferred_level=True, priority_levels=4)
    h.f.add([QueuedURL(f"{HOST}/d{i}", HOST, priority=PRIORITY_DEFERRED, fp=100 + i) for i in range(3)])
    h.f.add([QueuedURL(f"{HOST}/n{i}", HOST, priority=i % 4, fp=i) for i in range(8)])
    h.resolve()
    h.robots_known(HOST)
    order = _drain(h)
    assert len(order) == 11
    assert [u.rsplit("/", 1)[1] for u in order[-3:]] == ["d0", "d1", "d2"]
    h.f.check_invariants(deep=True)


def test_demotion_never_pushes_ordinary_urls_into_the_deferred_level(tmp_path):
    h = Harness(str(tmp_path / "f"), deferred_level=True, priority_levels=2)
    h.f.demote_host(HOST, levels=5)
    h.f.add([QueuedURL(f"{HOST}/n{i}", HOST, priority=1, fp=i) for i in range(3)])
    assert h.f.deferred_count(HOST) == 0
    h.f.add([QueuedURL(f"{HOST}/d", HOST, priority=PRIORITY_DEFERRED, fp=9)])
    assert h.f.deferred_count(HOST) == 1


def test_promote_moves_chosen_urls_and_keeps_the_rest(tmp_path):
    h = Harness(str(tmp_path / "f"), deferred_level=True)
    h.f.add([QueuedURL(f"{HOST}/d{i}", HOST, priority=PRIORITY_DEFERRED, fp=100 + i, depth=2) for i in range(6)])
    h.f.add([QueuedURL(f"{HOST}/n{i}", HOST, priority=1, fp=i) for i in range(20)])
    moved = h.f.promote_deferred(HOST, lambda it: 0 if it.url.endswith(("d1", "d4")) else None)
    assert moved == 2 and h.f.deferred_count(HOST) == 4
    assert h.f.promote_deferred(HOST, lambda it: 0, limit=1) == 1
    assert h.f.deferred_count(HOST) == 3
    h.f.check_invariants(deep=True)
    h.resolve()
    h.robots_known(HOST)
    order = [u.rsplit("/", 1)[1] for u in _drain(h)]
    assert set(order[:6]) >= {"d1", "d4", "d0"}      # promoted to the top level: early
    assert order[-3:] == ["d2", "d3", "d5"]
    assert h.f.queued() == 0
    h.f.check_invariants(deep=True)


def test_promote_on_an_inactive_host_and_across_reopen(tmp_path):
    h = Harness(str(tmp_path / "f"), deferred_level=True, max_active_hosts=1)
    other = "http://b.example"
    h.f.add([QueuedURL(f"{other}/x", other, priority=1, fp=1)])          # takes the only slot
    h.f.add([QueuedURL(f"{HOST}/d{i}", HOST, priority=PRIORITY_DEFERRED, fp=10 + i) for i in range(2)])
    assert h.f.promote_deferred(HOST, lambda it: 1) == 2
    assert h.f.deferred_count(HOST) == 0
    h.f.commit()
    h.f.close()
    f = h.reopen()
    f.check_invariants(deep=True)
    assert f.queued() == 3
