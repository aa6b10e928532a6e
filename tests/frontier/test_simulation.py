"""The real Frontier on a virtual clock against a simulated web (see sim.py), audited server-side."""

from collections import Counter

import pytest

from .sim import Simulation


def audit(sim: Simulation) -> dict:
    f = sim.f
    L = sim.ledger
    assert L.violations == [], L.violations[:10]
    assert sim.starvation == [], sim.starvation[:10]
    f.check_invariants(deep=True)
    st = f.stats()
    assert st["queued"] == 0 and st["leased"] == 0, st
    fates = Counter(rec[0] for rec in sim.url.values())
    assert set(fates) <= {"done", "dead", "dropped"}, fates
    assert st["completed"] == fates["done"]
    assert st["dead_letter"] == fates["dead"]
    assert st["dropped_total"] == fates["dropped"]
    assert st["added"] == len(sim.url)
    # Exactly once: every completed URL has one durable completion, none has two.
    assert all(sim.done_durable.get(u) == 1 for u, r in sim.url.items() if r[0] == "done")
    assert sum(sim.done_durable.values()) == fates["done"]
    # Every dropped or dead URL is reported once, with its reason.
    reported: dict[str, str] = {}
    while True:
        batch = f.drain_dropped(limit=5000)
        if not batch:
            break
        for item, reason in batch:
            assert item.url not in reported, f"{item.url} reported twice"
            reported[item.url] = reason
    for u, rec in sim.url.items():
        if rec[0] == "dropped":
            assert reported.get(u) in ("blocked", "dns_nxdomain"), (u, reported.get(u))
        elif rec[0] == "dead":
            assert reported.get(u, "").startswith("dead_letter:"), (u, reported.get(u))
        else:
            assert u not in reported
    return {"fates": fates, "stats": st, "reasons": Counter(r.split(":")[0] for r in reported.values())}


def exercised(sim: Simulation, result: dict) -> None:
    """The scenario really hit every path it claims to test."""
    L = sim.ledger
    assert L.retry_after_windows > 0
    assert sim.crashes == 1 and sim.journaled_completions > 0
    assert sim.redone == sim.journaled_completions     # every completion since the last commit was kept
    # The restart resumes at once: only hosts with a request cut off wait (ARCHITECTURE.md invariant 1)
    assert sim.restart_delay is not None and sim.restart_delay < 1.0, sim.restart_delay
    assert sim.expired_complete_refused > 0
    assert result["stats"]["expired"] == sim.expired_complete_refused
    assert result["reasons"]["blocked"] > 0 and result["reasons"]["dns_nxdomain"] > 0
    assert result["reasons"]["dead_letter"] > 0
    assert result["stats"]["requeued"] > 0 and result["stats"]["retried"] > 0
    # Low levels were served, in the ruler's proportions (1/2, 1/4, 1/8, 1/8 when all are busy).
    assert all(n > 0 for n in sim.level_leases)
    if sim.params["max_active_hosts"] < len(sim.hosts):
        assert sim.waiting_peak > 0       # hosts queued in the front queues for a slot, and all got one


def test_simulation_small(tmp_path):
    sim = Simulation(str(tmp_path / "f"), hosts=500, urls=20000, seed=7, max_active_hosts=150)
    sim.run()
    result = audit(sim)
    exercised(sim, result)


def test_simulation_shared_ips_two_per_ip(tmp_path):
    sim = Simulation(str(tmp_path / "f"), hosts=300, urls=8000, seed=11, ip_group=12, per_ip_concurrency=2,
                     ip_delay_s=0.0, fetch_slots=40)
    sim.run(crash_at=0.6, block_at=0.4)
    exercised(sim, audit(sim))


def test_simulation_no_crash_matches_counts(tmp_path):
    sim = Simulation(str(tmp_path / "f"), hosts=200, urls=5000, seed=3)
    sim.run(crash_at=None)
    result = audit(sim)
    assert sim.crashes == 0 and sim.journaled_completions == 0
    assert result["fates"]["done"] > 0


@pytest.mark.long
def test_simulation_million(tmp_path):
    sim = Simulation(str(tmp_path / "f"), hosts=10000, urls=1_000_000, seed=5, fetch_slots=1000,
                     max_active_hosts=4000, check_every=20000)
    sim.run()
    exercised(sim, audit(sim))
