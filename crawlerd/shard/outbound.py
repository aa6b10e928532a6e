"""Where the shard's requests go: every request is built here, and the address guard has the last word.

A lease carries the address its host was resolved to; ``request`` checks it against the
guard again (``network.allow`` may have narrowed since the lookup, on SIGHUP) and returns
None when it may no longer be used. ``lookup`` resolves a host and picks its first address
the guard allows. ``request_elsewhere`` is for a URL of a host that is not the lease's own
(a robots.txt redirect): it honours the operator blocklist and waits (bounded) until the
other host has no lease of its own, so two requests to one host never overlap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from crawlerd.fetch.dns import Resolution
from crawlerd.fetch.guard import AddressGuard
from crawlerd.frontier import Frontier
from crawlerd.records import FetchRequest
from crawlerd.url.hosts import host_key, host_of, port_of

OTHER_HOST_WAIT_ROUNDS = 100        # x OTHER_HOST_WAIT_S: how long a redirect waits for a busy host
OTHER_HOST_WAIT_S = 0.2


class Outbound:
    """Builds guard-checked requests; resolves hosts to a guard-allowed address."""

    def __init__(self, *, guard: AddressGuard, frontier: Frontier,
                 resolve: Callable[[str], Awaitable[Resolution]] | None,
                 host_busy: Callable[[str], bool]):
        self.guard = guard
        self.frontier = frontier
        self.resolve = resolve
        self.host_busy = host_busy

    def request(self, url: str, ip: str, headers=None, *, keep_alive: bool = True) -> FetchRequest | None:
        """A request for ``url`` to ``ip``, or None if the guard no longer allows the address.
        ``keep_alive``: keep the connection for the host's next request (it has more queued);
        otherwise it is closed after the answer rather than left idle in curl's cache."""
        if not ip or not self.guard.allowed(ip):     # network.allow may have narrowed since DNS (SIGHUP)
            return None
        return FetchRequest(url=url, ip=ip, port=port_of(url), headers=list(headers or ()),
                            keep_alive=keep_alive)

    async def lookup(self, host: str) -> tuple[Resolution, str | None]:
        """The resolution of ``host`` and its first address the guard allows (None: none is)."""
        if self.resolve is None:
            raise RuntimeError("Outbound.lookup needs a resolver")
        res = await self.resolve(host)
        return res, next((a for a in res.ips if self.guard.allowed(a)), None)

    async def request_elsewhere(self, url: str) -> FetchRequest | None:
        """A request to a host that is not this lease's (robots redirect): blocklist, politeness, guard.

        The target host may have leases of its own: wait (bounded) until it has none, so two
        requests never overlap. (Its gap after its own last request is not known here.)"""
        hk = host_key(url)
        if self.frontier.is_blocked(host_of(url)):
            return None
        for _ in range(OTHER_HOST_WAIT_ROUNDS):
            if not self.host_busy(hk):
                break
            await asyncio.sleep(OTHER_HOST_WAIT_S)
        else:
            return None
        _res, ip = await self.lookup(host_of(url))
        return None if ip is None else self.request(url, ip)
