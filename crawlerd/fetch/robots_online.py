"""`crawlerd robots check --robots-url`: fetch robots.txt through the crawler's own fetch path.

The same resolver, address guard, curl fetcher, decoder and RFC 9309 status
rules as the crawl (config and ``-s`` apply), so an operator sees exactly what
the daemon would decide: 2xx parse, 3xx follow (at most 5 hops, each through the
guard), 4xx allow all, 5xx or network failure disallow all.
"""

from __future__ import annotations

import time

from crawlerd.config import Config
from crawlerd.fetch.codec import DecodeError, decode_body
from crawlerd.fetch.curl import Fetcher
from crawlerd.fetch.dns import Resolver
from crawlerd.fetch.guard import AddressGuard
from crawlerd.fetch.robots import RobotsFollow, robots_decision
from crawlerd.outcome import Outcome
from crawlerd.records import FetchRequest, FetchResult
from crawlerd.url.canonical import normalize
from crawlerd.url.hosts import host_of, port_of


class RobotsCheckError(ValueError):
    pass


async def fetch_robots(cfg: Config, robots_url: str, agent: str):
    """Returns (RobotsEntry, list of "note" lines describing each hop)."""
    import asyncio
    loop = asyncio.get_running_loop()
    f, dn = cfg.fetch, cfg.dns
    guard = AddressGuard(list(cfg.network.allow))
    resolver = Resolver(loop, nameservers=list(dn.nameservers), timeout_s=dn.timeout_s, tries=dn.tries,
                        min_ttl_s=dn.min_ttl_s, max_ttl_s=dn.max_ttl_s, negative_ttl_s=dn.negative_ttl_s,
                        max_in_flight=dn.max_in_flight, static_hosts=dict(dn.static_hosts),
                        ipv6=cfg.network.ipv6)
    fetcher = Fetcher(loop, user_agent=cfg.crawl.user_agent, guard=guard, connect_timeout_s=f.connect_timeout_s,
                      timeout_s=f.timeout_s, low_speed_bytes_per_s=f.low_speed_bytes_per_s,
                      low_speed_time_s=f.low_speed_time_s, max_body_bytes=f.max_body_bytes,
                      max_header_bytes=f.max_header_bytes, max_connections=8, verify_tls=f.verify_tls,
                      ca_file=f.ca_file)
    notes: list[str] = []
    url = robots_url
    try:
        for hops in range(cfg.fetch.max_redirects + 2):
            res = await _fetch(resolver, guard, fetcher, url)
            notes.append(f"# {url}: {res.outcome.value} {res.status or ''}".rstrip())
            body = b""
            if res.outcome is Outcome.OK and 200 <= res.status < 300:
                try:
                    body = decode_body(res.content(), chunked=res.chunked,
                                       content_encoding=res.header("content-encoding"),
                                       max_bytes=cfg.robots.max_bytes)
                except DecodeError as e:
                    notes.append(f"# body could not be decoded: {e}")
            decision = robots_decision(
                status=res.status, outcome_ok=res.outcome is Outcome.OK, body=body,
                location=res.header("location"), hops=hops, previous=None, now=time.monotonic(),
                agent_token=agent, cache_ttl_s=cfg.robots.cache_ttl_s, error_retry_s=cfg.robots.error_retry_s,
                max_bytes=cfg.robots.max_bytes)
            if isinstance(decision, RobotsFollow):
                nxt = normalize(decision.url, url)
                if nxt is None:
                    raise RobotsCheckError(f"robots.txt redirect to an unusable URL: {decision.url!r}")
                url = nxt
                continue
            return decision, notes
        raise RobotsCheckError("robots.txt redirect chain did not end")
    finally:
        await fetcher.close(1.0)
        await resolver.close()


async def _fetch(resolver: Resolver, guard: AddressGuard, fetcher: Fetcher, url: str) -> FetchResult:
    res = await resolver.resolve(host_of(url))
    if res.outcome is not Outcome.OK:
        return FetchResult(url=url, outcome=res.outcome)
    ip = next((a for a in res.ips if guard.allowed(a)), None)
    if ip is None:
        return FetchResult(url=url, outcome=Outcome.BLOCKED_ADDRESS)
    return await fetcher.fetch(FetchRequest(url=url, ip=ip, port=port_of(url)))


def check_online(cfg: Config, robots_url: str, agent: str, urls: list[str]) -> list[str]:
    import asyncio
    if normalize(robots_url) is None:
        raise RobotsCheckError(f"not an http(s) URL: {robots_url!r}")
    entry, notes = asyncio.run(fetch_robots(cfg, robots_url, agent))
    out = list(notes)
    for u in urls:
        out.append(("allow " if entry.rules.allowed(u) else "disallow ") + u)
    return out
