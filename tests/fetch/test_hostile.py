"""Hostile hosts: every misbehaviour ends in its named outcome, nothing crashes, memory stays bounded.

Most cases use one server on 127.0.0.1. The cases that need several loopback
addresses (a name that resolves to a forbidden address, keep-alive per IP)
run in a private network namespace (``unshare -n``) where only ``lo`` exists.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
from urllib.parse import urljoin, urlsplit

import pytest
import uvloop

from crawlerd.fetch.codec import DecodeError, decode_body
from crawlerd.fetch.curl import Fetcher
from crawlerd.fetch.dns import Resolver
from crawlerd.fetch.guard import AddressGuard
from crawlerd.outcome import Outcome
from crawlerd.records import FetchRequest
from crawlerd.simweb.dns import DnsServer
from crawlerd.simweb.hostile import HostileServer

MAX_BODY = 1 << 20
MAX_DECODED = 4 << 20


def make_fetcher(guard: AddressGuard, **kw) -> Fetcher:
    params = dict(user_agent="crawlerd-test/0.1", guard=guard, connect_timeout_s=2.0, timeout_s=20.0,
                  low_speed_bytes_per_s=100, low_speed_time_s=1, max_body_bytes=MAX_BODY,
                  max_header_bytes=64 << 10, max_connections=100, verify_tls=False)
    params.update(kw)
    return Fetcher(asyncio.get_running_loop(), **params)


def make_resolver(dns: DnsServer) -> Resolver:
    return Resolver(asyncio.get_running_loop(), nameservers=[dns.nameserver], timeout_s=0.5, tries=1,
                    min_ttl_s=0.0, max_ttl_s=60.0, negative_ttl_s=60.0, max_in_flight=10, static_hosts={},
                    ipv6=False)


async def crawl(fetcher: Fetcher, resolver: Resolver, guard: AddressGuard, url: str, max_redirects: int = 5):
    """What the shard does for one URL: resolve, check, fetch, follow 3xx hops. Returns (outcome, hops)."""
    for hop in range(max_redirects + 1):
        parts = urlsplit(url)
        res = await resolver.resolve(parts.hostname)
        if res.outcome is not Outcome.OK:
            return res.outcome, hop
        ip = res.ips[0]
        if not guard.allowed(ip):
            return Outcome.BLOCKED_ADDRESS, hop
        r = await fetcher.fetch(FetchRequest(url=url, ip=ip, port=parts.port or 80))
        location = r.header("location")
        if r.outcome is Outcome.OK and 300 <= r.status < 400 and location:
            url = urljoin(url, location)
            continue
        return r.outcome, hop
    return Outcome.TOO_MANY_REDIRECTS, max_redirects


def decoded_outcome(r) -> Outcome:
    """The outcome after processing decodes the body with its cap."""
    if r.outcome is not Outcome.OK:
        return r.outcome
    try:
        decode_body(r.body, chunked=(r.header("transfer-encoding") or "").lower() == "chunked",
                    content_encoding=r.header("content-encoding"), max_bytes=MAX_DECODED)
    except DecodeError as e:
        return e.outcome
    return Outcome.OK


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


CASES = {
    "/drip": Outcome.TOO_SLOW,
    "/drip-headers": Outcome.TOO_SLOW,
    "/gzip-bomb": Outcome.TOO_LARGE,          # fetched fine (small), decoding hits the cap
    "/br-bomb": Outcome.TOO_LARGE,
    "/endless-chunked": Outcome.TOO_LARGE,
    "/huge-headers": Outcome.HEADERS_TOO_LARGE,
    "/bad-chunked": Outcome.BAD_RESPONSE,
    "/garbage": Outcome.BAD_RESPONSE,
    "/empty": Outcome.CONNECTION_RESET,
    "/close-early": Outcome.CONNECTION_RESET,
    "/reset": Outcome.CONNECTION_RESET,
    "/ok": Outcome.OK,
}


def test_every_hostile_case_ends_in_its_outcome_with_bounded_memory():
    async def main():
        server = HostileServer(bomb_bytes=256 << 20)
        _, port = await server.start()
        _ = server.gzip_bomb, server.br_bomb      # build the fixtures before measuring
        guard = AddressGuard(["127.0.0.0/8"])
        f = make_fetcher(guard)
        base_rss = _rss_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as cr:
                cr.write("5")                     # reset the peak-RSS mark (Linux >= 4.0)
        except OSError:
            pass
        try:
            # all at once, each from its own host, as the shard would run them
            results = await asyncio.gather(*(
                f.fetch(FetchRequest(url=f"http://h{i}.test:{port}{path}", ip="127.0.0.1", port=port))
                for i, path in enumerate(CASES)))
            outcomes = {path: decoded_outcome(r) for path, r in zip(CASES, results, strict=True)}
            after = await f.fetch(FetchRequest(url=f"http://late.test:{port}/ok", ip="127.0.0.1", port=port))
            peak_growth = _rss_kib("VmHWM") - base_rss
            return outcomes, after, peak_growth, f.stats()
        finally:
            await f.close(0)
            server.close()
    outcomes, after, peak_growth_kib, stats = uvloop.run(main())
    assert outcomes == CASES
    assert after.outcome is Outcome.OK            # the fetcher is still healthy afterwards
    assert stats["in_flight"] == 0
    # 256 MiB bombs, 1 MiB raw cap, 4 MiB decoded cap: growth stays near the caps, not the bombs
    assert peak_growth_kib < 64 * 1024, f"peak RSS grew {peak_growth_kib} KiB"


def test_redirect_loop_ends_in_too_many_redirects():
    async def main():
        server = HostileServer()
        _, port = await server.start()
        dns = DnsServer({"loop.test": (["127.0.0.1"], 60)})
        await dns.start()
        guard = AddressGuard(["127.0.0.1/32"])
        f = make_fetcher(guard)
        r = make_resolver(dns)
        try:
            return await crawl(f, r, guard, f"http://loop.test:{port}/redirect-loop", max_redirects=5), \
                len(server.log)
        finally:
            await f.close(0)
            await r.close()
            dns.close()
            server.close()
    (outcome, hops), requests = uvloop.run(main())
    assert outcome is Outcome.TOO_MANY_REDIRECTS
    assert requests == 6                          # the first request and 5 hops, then stop


# -- cases needing several loopback addresses: private network namespace ---------------

async def _netns_scenario() -> dict:
    server = HostileServer()
    _, port = await server.start("0.0.0.0")        # answers on every 127.x.y.z inside the namespace
    dns = DnsServer({"good.test": (["127.0.0.2"], 60), "other.test": (["127.0.1.5"], 60),
                     "forbidden.test": (["127.200.0.1"], 60)})
    await dns.start()
    guard = AddressGuard(["127.0.0.0/16"])         # 127.200.0.1 is outside: forbidden
    f = make_fetcher(guard)
    r = make_resolver(dns)
    out: dict = {}
    try:
        out["redirect"], out["redirect_hops"] = await crawl(
            f, r, guard, f"http://good.test:{port}/redirect?to=http://forbidden.test:{port}/ok")
        # a shard that forgot to check: the fetcher refuses on its own
        direct = await f.fetch(FetchRequest(url=f"http://forbidden.test:{port}/ok", ip="127.200.0.1", port=port))
        out["direct"] = direct.outcome
        out["forbidden_requests"] = sum(1 for e in server.log if e[1] == "127.200.0.1" or "forbidden" in e[2])
        # keep-alive is per host and pinned address: two hosts on two IPs, two requests each
        conns_before = server.connections
        for _ in range(2):
            for host in ("good.test", "other.test"):
                out.setdefault("kept", []).append((await crawl(f, r, guard, f"http://{host}:{port}/ok"))[0])
        out["new_connections"] = server.connections - conns_before
        out["local_ips"] = sorted({e[1] for e in server.log})
    finally:
        await f.close(0)
        await r.close()
        dns.close()
        server.close()
    return {k: (v.value if isinstance(v, Outcome) else [x.value for x in v] if k == "kept" else v)
            for k, v in out.items()}


def _netns_available() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.netns
@pytest.mark.skipif(not _netns_available(), reason="needs root and unshare -n")
def test_forbidden_redirect_target_and_keepalive_per_ip_in_private_netns():
    here = os.path.abspath(__file__)
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", f'ip link set lo up && exec "{sys.executable}" "{here}" --netns'],
        capture_output=True, text=True, timeout=60, cwd=root)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["redirect"] == "blocked_address"
    assert out["redirect_hops"] == 1               # the 302 was fetched, its target refused
    assert out["direct"] == "blocked_address"
    assert out["forbidden_requests"] == 0           # nothing ever reached 127.200.0.1
    assert out["kept"] == ["ok"] * 4
    assert out["new_connections"] == 1              # good.test reused its connection; other.test opened one
    assert out["local_ips"] == ["127.0.0.2", "127.0.1.5"]


if __name__ == "__main__" and "--netns" in sys.argv:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    print(json.dumps(uvloop.run(_netns_scenario())))
