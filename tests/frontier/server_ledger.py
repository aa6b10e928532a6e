"""What simulated servers see of a crawler on a virtual clock: the ledger the frontier simulations
(``tests/frontier/sim.py``, ``tests/handoff/shard_sim.py``) judge politeness by, kept apart from
the frontier's own bookkeeping (ARCHITECTURE.md invariant 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

EPS = 1e-9


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class ServerLedger:
    """Per host and per IP: requests in flight and the earliest next start politeness allows.

    Key: host key, IP. Invariant checked at every start: at most one request in flight per host,
    at most ``ip_limit`` per IP, no start inside the host's gap or the IP's gap; each break is
    one line in ``violations``.
    """

    ip_limit: int = 1
    ip_delay_s: float = 0.0
    violations: list[str] = field(default_factory=list)
    host_inflight: dict[str, int] = field(default_factory=dict)
    host_not_before: dict[str, float] = field(default_factory=dict)
    ip_inflight: dict[str, int] = field(default_factory=dict)
    ip_not_before: dict[str, float] = field(default_factory=dict)
    requests: int = 0

    def started(self, hk: str, ip: str, t: float) -> None:
        self.requests += 1
        if self.host_inflight.get(hk, 0):
            self.violations.append(f"{t}: {hk}: second request in flight")
        if t < self.host_not_before.get(hk, 0.0) - EPS:
            self.violations.append(f"{t}: {hk}: gap violated, allowed from {self.host_not_before[hk]}")
        if self.ip_inflight.get(ip, 0) >= self.ip_limit:
            self.violations.append(f"{t}: IP {ip} over its concurrency")
        if t < self.ip_not_before.get(ip, 0.0) - EPS:
            self.violations.append(f"{t}: IP {ip}: ip gap violated, allowed from {self.ip_not_before[ip]}")
        self.host_inflight[hk] = self.host_inflight.get(hk, 0) + 1
        self.ip_inflight[ip] = self.ip_inflight.get(ip, 0) + 1
        self.ip_not_before[ip] = t + self.ip_delay_s

    def ended(self, hk: str, ip: str, t: float) -> None:
        """A request ended at ``t``: the IP's gap starts (the host's: ``gap``)."""
        self.host_inflight[hk] -= 1
        self.ip_inflight[ip] -= 1
        self.ip_not_before[ip] = max(self.ip_not_before.get(ip, 0.0), t + self.ip_delay_s)

    def gap(self, hk: str, not_before: float) -> None:
        """The host may not be asked again before ``not_before``."""
        self.host_not_before[hk] = max(self.host_not_before.get(hk, 0.0), not_before)
