import random

import pytest

from crawlerd.frontier import KIND_ROBOTS, Frontier, QueuedURL
from crawlerd.outcome import Outcome
from tests.frontier import dust_site  # the module the tests import (its OPEN list)

from .server_ledger import FakeClock


@pytest.fixture(autouse=True)
def _close_dust_sites():
    """The DUST learners a test's sites opened are closed after it (``dust_site.close_all``)."""
    yield
    dust_site.close_all()


class Harness:
    """A Frontier on a fake clock plus shortcuts for the usual DNS/robots answers."""

    def __init__(self, path: str, **kw):
        self.path = path
        self.clock = FakeClock(1000.0)
        self.kw = dict(clock=self.clock, wall=self.clock, rng=random.Random(5), map_size_bytes=1 << 28, sync=False)
        self.kw.update(kw)
        self.f = Frontier(path, **self.kw)

    def reopen(self, **kw) -> Frontier:
        self.kw.update(kw)
        self.f = Frontier(self.path, **self.kw)
        return self.f

    def add(self, host: str, n: int = 1, priority: int = 0, start: int = 0) -> int:
        return self.f.add([QueuedURL(f"{host}/p{start + i}", host, priority=priority, fp=start + i)
                           for i in range(n)])

    def ip_of(self, host: str) -> str:
        """A distinct loopback label per host (nothing is ever connected to it)."""
        ips = self.__dict__.setdefault("_ips", {})
        return ips.setdefault(host, f"127.0.{len(ips) // 250}.{len(ips) % 250 + 1}")

    def resolve(self, ip: str | None = None) -> list[str]:
        asked = self.f.hosts_needing_dns()
        for hk in asked:
            self.f.set_host_ip(hk, ip or self.ip_of(hk))
        return asked

    def robots_known(self, *hosts: str, crawl_delay_s: float | None = None) -> None:
        for hk in hosts:
            self.f.set_robots(hk, expires_at=self.clock.t + 86400.0, crawl_delay_s=crawl_delay_s)

    def lease(self, limit: int = 100):
        return self.f.lease(self.clock.t, limit)

    def done(self, lease, **kw) -> bool:
        kw.setdefault("outcome", Outcome.OK)
        kw.setdefault("status", 200)
        return self.f.complete(lease.lease_id, **kw)

    def serve_robots(self) -> int:
        """Lease and answer every due robots.txt lease (no Crawl-delay); returns how many."""
        n = 0
        for lease in self.lease():
            assert lease.kind == KIND_ROBOTS, lease
            self.robots_known(lease.host_key)
            self.done(lease)
            n += 1
        return n

    def ready(self, host: str, n: int = 1, ip: str | None = None, priority: int = 0) -> None:
        """Queue n URLs on a host whose IP and robots are known, due now."""
        self.add(host, n, priority)
        self.resolve(ip)
        self.robots_known(host)


@pytest.fixture
def h(tmp_path):
    harness = Harness(str(tmp_path / "frontier"))
    yield harness


@pytest.fixture
def parts(tmp_path):
    """Budget parts (tests/frontier/budget_parts.py) counting every linking domain (mode "all")."""
    from .budget_parts import Parts
    p = Parts(tmp_path / "b", mode="all")
    yield p
    p.close()
