"""Fetch-layer benchmark: keep-alive 20 KB pages from many hosts, and DNS lookups, on loopback.

Workload. ``--hosts`` hosts (default 1,000), each on its own loopback address
127.1.x.y, all served by one HTTP server process bound to 0.0.0.0 inside a
private network namespace (the script re-runs itself under ``unshare -n``).
Every host has one fetch in flight at a time (the politeness invariant), so
1,000 hosts means 1,000 concurrent transfers. Round 0 opens the connections;
rounds 1.. reuse them (keep-alive) and are what is timed. The server (and the
DNS responder) run in a separate process: the CPU figure is the crawler
process's own time (``time.process_time``) divided by transfers.

Peer, measured in the same run on the same workload: a minimal uvloop
protocol client (Content-Length framing only, no limits, no raw-byte capture,
no guard). It is the floor a Python crawler on this loop could reach; the
ratio says what curl-multi plus our bookkeeping costs over it.

DNS: ``--dns-names`` distinct names resolved through the local UDP responder
with ``crawlerd.fetch.dns.Resolver`` (cache cold, every name new), against raw
aiodns queries from 500 worker coroutines (the same bound, no cache, no
coalescing, no outcome mapping).

GC: like the daemon (crawlerd/supervisor.py), the bench freezes the objects
alive at start-up and raises the collection thresholds (``--default-gc``
keeps Python's defaults).

Run:  nice .venv/bin/python bench/fetch_bench.py [--hosts 1000] [--rounds 6] [--runs 5] [--dns-names 20000]
      [--compare OLD_CURL_PY]   run another copy of curl.py in alternation with this one (before/after)
      [--hosts-per-ip N]        N virtual hosts per address (curl's connection cache scans per address)
      [--profile OUT.prof]      one cProfile pass over the timed rounds
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib.util
import multiprocessing
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import uvloop  # noqa: E402

from crawlerd.fetch.curl import Fetcher  # noqa: E402
from crawlerd.fetch.dns import Resolver  # noqa: E402
from crawlerd.fetch.guard import AddressGuard  # noqa: E402
from crawlerd.outcome import Outcome  # noqa: E402
from crawlerd.records import FetchRequest  # noqa: E402

PAGE_BYTES = 20_000
SERVER_LIFETIME_S = 900.0      # the server process exits on its own after this, whatever happens


def host_ip(i: int, multi_ip: bool) -> str:
    return f"127.{1 + (i >> 16)}.{(i >> 8) & 255}.{(i & 255) or 1}" if multi_ip else "127.0.0.1"


# -- server process -----------------------------------------------------------------

class _PageServer(asyncio.Protocol):
    """Answers every request on the connection with the same keep-alive 20 KB page."""

    response = b""

    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""

    def data_received(self, data):
        buf = self.buf + data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            buf = buf[end + 4:]
            out.append(self.response)
        self.buf = buf
        if out:
            self.transport.write(b"".join(out))


def server_main(q, page_bytes: int, bind: str, multi_ip: bool) -> None:
    from crawlerd.simweb.dns import DnsServer

    async def main():
        _PageServer.response = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n"
                                % page_bytes) + b"p" * page_bytes
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(_PageServer, bind, 0, backlog=4096)
        http_port = srv.sockets[0].getsockname()[1]

        def lookup(name: str):
            if name.startswith("h") and name.endswith(".bench"):
                try:
                    return [host_ip(int(name[1:-6]), multi_ip)], 300
                except ValueError:
                    return None
            return None
        dns = DnsServer(lookup=lookup)
        _, dns_port = await dns.start("127.0.0.1", 0)
        q.put((http_port, dns_port))
        await asyncio.sleep(SERVER_LIFETIME_S)

    uvloop.run(main())


# -- crawler side -------------------------------------------------------------------

async def curl_rounds(hosts: int, rounds: int, port: int, multi_ip: bool, fetcher_cls=Fetcher,
                      profile: str = "", hosts_per_ip: int = 1) -> dict:
    loop = asyncio.get_running_loop()
    f = fetcher_cls(loop, user_agent="crawlerd-bench/0.1", guard=AddressGuard(["127.0.0.0/8"]),
                connect_timeout_s=10.0, timeout_s=60.0, low_speed_bytes_per_s=1, low_speed_time_s=60,
                max_body_bytes=1 << 20, max_header_bytes=64 << 10, max_connections=hosts * 2, verify_tls=False)
    bad = 0

    async def one_host(i: int, rnds: range) -> None:
        nonlocal bad
        ip = host_ip(i // hosts_per_ip, multi_ip)
        for r in rnds:
            res = await f.fetch(FetchRequest(url=f"http://h{i}.bench:{port}/p{r}", ip=ip, port=port))
            if res.outcome is not Outcome.OK or len(res.body) != PAGE_BYTES:
                bad += 1

    await asyncio.gather(*(one_host(i, range(0, 1)) for i in range(hosts)))     # connect round
    opened = f.stats()["sockets_opened"]
    prof = cProfile.Profile() if profile else None
    if prof is not None:
        prof.enable()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one_host(i, range(1, rounds)) for i in range(hosts)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    reopened = f.stats()["sockets_opened"] - opened
    await f.close(1.0)
    n = hosts * (rounds - 1)
    return {"transfers": n, "wall_s": wall, "cpu_us": cpu / n * 1e6, "per_s": n / wall, "bad": bad,
            "reconnects": reopened}


class _PeerConn(asyncio.Protocol):
    """Minimal keep-alive HTTP/1.1 client: one request at a time, Content-Length framing."""

    def __init__(self):
        self.buf = bytearray()
        self.want = -1
        self.body_at = 0
        self.fut: asyncio.Future | None = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.buf += data
        if self.want < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end + 2]).lower()
            i = head.index(b"content-length:") + 15
            self.body_at = end + 4
            self.want = self.body_at + int(head[i:head.index(b"\r\n", i)])
        if len(self.buf) >= self.want:
            body = bytes(self.buf[self.body_at:self.want])
            del self.buf[:self.want]
            self.want = -1
            self.fut.set_result(body)

    def connection_lost(self, exc):
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError("closed"))

    async def get(self, host: str, path: str) -> bytes:
        self.fut = asyncio.get_running_loop().create_future()
        self.transport.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: peer\r\n\r\n".encode())
        return await self.fut


async def peer_rounds(hosts: int, rounds: int, port: int, multi_ip: bool, hosts_per_ip: int = 1) -> dict:
    loop = asyncio.get_running_loop()
    conns: dict[int, _PeerConn] = {}
    bad = 0

    async def one_host(i: int, rnds: range) -> None:
        nonlocal bad
        if i not in conns:
            _, conns[i] = await loop.create_connection(_PeerConn, host_ip(i // hosts_per_ip, multi_ip), port)
        for r in rnds:
            body = await conns[i].get(f"h{i}.bench:{port}", f"/p{r}")
            if len(body) != PAGE_BYTES:
                bad += 1

    await asyncio.gather(*(one_host(i, range(0, 1)) for i in range(hosts)))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one_host(i, range(1, rounds)) for i in range(hosts)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    for c in conns.values():
        c.transport.close()
    n = hosts * (rounds - 1)
    return {"transfers": n, "wall_s": wall, "cpu_us": cpu / n * 1e6, "per_s": n / wall, "bad": bad}


async def dns_resolver_run(names: int, dns_port: int, offset: int) -> dict:
    loop = asyncio.get_running_loop()
    r = Resolver(loop, nameservers=[f"127.0.0.1:{dns_port}"], timeout_s=2.0, tries=3, min_ttl_s=300.0,
                 max_ttl_s=86400.0, negative_ttl_s=600.0, max_in_flight=500, static_hosts={}, ipv6=False)
    todo = iter(range(names))
    bad = 0

    async def worker() -> None:            # the same 500 workers as the peer: per-lookup overhead
        nonlocal bad
        for i in todo:
            if (await r.resolve(f"h{offset + i}.bench")).outcome is not Outcome.OK:
                bad += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(500)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await r.close()
    return {"lookups": names, "per_s": names / wall, "cpu_us": cpu / names * 1e6, "bad": bad}


async def dns_raw_run(names: int, dns_port: int, offset: int) -> dict:
    import aiodns

    loop = asyncio.get_running_loop()
    res = aiodns.DNSResolver([f"127.0.0.1:{dns_port}"], loop, timeout=2.0, tries=3)
    todo = iter(range(names))
    bad = 0

    async def worker() -> None:            # 500 workers: the same bound, with no semaphore cost at all
        nonlocal bad
        for i in todo:
            try:
                await res.query_dns(f"h{offset + i}.bench", "A")
            except aiodns.error.DNSError:
                bad += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(500)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await res.close()
    return {"lookups": names, "per_s": names / wall, "cpu_us": cpu / names * 1e6, "bad": bad}


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _load_fetcher(path: str):
    """The Fetcher class of another copy of curl.py (an older version to measure against); the modules
    it imports (crawlerd.fetch.transfer, crawlerd.fetch.http_head) come from this tree."""
    spec = importlib.util.spec_from_file_location("fetch_bench_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Fetcher


def _gc_like_the_daemon() -> None:
    # crawlerd/supervisor.py does this at start-up; measure what the daemon runs.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def bench(args, multi_ip: bool) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    bind = "0.0.0.0" if multi_ip else "127.0.0.1"
    server = ctx.Process(target=server_main, args=(q, PAGE_BYTES, bind, multi_ip), daemon=True)
    server.start()
    base_cls = _load_fetcher(args.compare) if args.compare else None
    if not args.default_gc:
        _gc_like_the_daemon()
    try:
        http_port, dns_port = q.get(timeout=30)
        if args.profile:
            uvloop.run(curl_rounds(args.hosts, args.rounds, http_port, multi_ip, profile=args.profile,
                                   hosts_per_ip=args.hosts_per_ip))
            pstats.Stats(args.profile).sort_stats("tottime").print_stats(30)
            return
        curl, base, peer, dns_ours, dns_raw = [], [], [], [], []
        for run in range(args.runs):
            peer.append(uvloop.run(peer_rounds(args.hosts, args.rounds, http_port, multi_ip, args.hosts_per_ip)))
            # alternate which fetcher goes first, so neither always meets the warmer (or busier) machine
            order = [("curl", Fetcher), ("base", base_cls)] if base_cls else [("curl", Fetcher)]
            if run % 2:
                order.reverse()
            got = {}
            for name, cls in order:
                got[name] = uvloop.run(curl_rounds(args.hosts, args.rounds, http_port, multi_ip, cls,
                                                   hosts_per_ip=args.hosts_per_ip))
            curl.append(got["curl"])
            line = f"run {run + 1}: " + _fmt("curl", curl[-1])
            if base_cls:
                base.append(got["base"])
                line += " | " + _fmt("baseline", base[-1])
            p = peer[-1]
            line += f" | peer {p['per_s']:.0f}/s {p['cpu_us']:.1f} us"
            if args.dns_names:
                offset = (2 * run) * args.dns_names      # fresh names every run: a cold cache, no c-ares hits
                dns_raw.append(uvloop.run(dns_raw_run(args.dns_names, dns_port, offset)))
                dns_ours.append(uvloop.run(dns_resolver_run(args.dns_names, dns_port, offset + args.dns_names)))
                line += (f" | dns {dns_ours[-1]['per_s']:.0f}/s {dns_ours[-1]['cpu_us']:.1f} us "
                         f"(raw aiodns {dns_raw[-1]['per_s']:.0f}/s {dns_raw[-1]['cpu_us']:.1f} us; "
                         f"failed lookups ours/raw {dns_ours[-1]['bad']}/{dns_raw[-1]['bad']})")
            print(line, flush=True)
    finally:
        server.terminate()
        server.join(5)
    n = args.hosts * (args.rounds - 1)
    gc_note = "default GC" if args.default_gc else "GC frozen + thresholds as the daemon"
    ips = "one IP" if not multi_ip else "one IP each" if args.hosts_per_ip == 1 else f"{args.hosts_per_ip} per IP"
    print(f"\nkeep-alive {PAGE_BYTES} B pages, {args.hosts} hosts ({ips}), "
          f"{n} timed transfers per run, {gc_note}, median of {args.runs} runs:")
    print(f"  {'':28}{'transfers/s':>14}{'crawler CPU us/transfer':>26}")
    pm, pc = _median(peer, "per_s"), _median(peer, "cpu_us")
    cm, cc = _median(curl, "per_s"), _median(curl, "cpu_us")
    print(f"  {'crawlerd Fetcher (curl)':28}{cm:>14.0f}{cc:>26.1f}")
    if base:
        bm, bc = _median(base, "per_s"), _median(base, "cpu_us")
        print(f"  {'baseline: ' + os.path.basename(args.compare):28}{bm:>14.0f}{bc:>26.1f}")
        ratios = statistics.median(c["cpu_us"] / b["cpu_us"] for c, b in zip(curl, base, strict=True))
        print(f"  {'ratio fetcher/baseline':28}{cm / bm:>14.2f}{cc / bc:>26.2f}"
              f"   (median of per-run CPU ratios {ratios:.3f})")
    print(f"  {'peer: bare uvloop client':28}{pm:>14.0f}{pc:>26.1f}")
    print(f"  {'ratio fetcher/peer':28}{cm / pm:>14.2f}{cc / pc:>26.2f}")
    if args.dns_names:
        print(f"DNS, {args.dns_names} distinct names, 500 in flight, median of {args.runs} runs:")
        dm, rm = _median(dns_ours, "per_s"), _median(dns_raw, "per_s")
        dc, rc = _median(dns_ours, "cpu_us"), _median(dns_raw, "cpu_us")
        print(f"  {'':28}{'lookups/s':>14}{'crawler CPU us/lookup':>26}")
        print(f"  {'crawlerd Resolver':28}{dm:>14.0f}{dc:>26.1f}")
        print(f"  {'peer: raw aiodns':28}{rm:>14.0f}{rc:>26.1f}")
        print(f"  {'ratio resolver/peer':28}{dm / rm:>14.2f}{dc / rc:>26.2f}")
    bad = sum(r["bad"] for r in curl + base + peer + dns_ours + dns_raw)
    if bad:
        print(f"WARNING: {bad} failed transfers or lookups")
    reconnects = sum(r["reconnects"] for r in curl + base)
    if reconnects:
        print(f"WARNING: {reconnects} reconnects in timed rounds (keep-alive broken)")


def _fmt(name: str, r: dict) -> str:
    return (f"{name} {r['per_s']:.0f}/s {r['cpu_us']:.1f} us/transfer "
            f"(bad {r['bad']}, reconnects {r['reconnects']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=6, help="fetches per host per run (the first opens)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dns-names", type=int, default=20000, help="0 skips the DNS part")
    ap.add_argument("--hosts-per-ip", type=int, default=1,
                    help="virtual hosts sharing one address (curl's connection cache groups by address)")
    ap.add_argument("--compare", metavar="CURL_PY", default="",
                    help="another copy of crawlerd/fetch/curl.py to run in alternation as a baseline")
    ap.add_argument("--profile", metavar="FILE", default="",
                    help="run the timed fetcher rounds once under cProfile, write FILE, print the top functions")
    ap.add_argument("--default-gc", action="store_true",
                    help="keep Python's default GC settings (the daemon freezes and raises thresholds)")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hosts > 60000 or args.rounds < 2:
        ap.error("--hosts must be <= 60000 and --rounds >= 2")
    if not args.in_netns and shutil.which("unshare") and \
            subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        cmd = " ".join(f'"{a}"' for a in [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--in-netns"])
        return subprocess.call(["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {cmd}"])
    if not args.in_netns:
        print("note: no private network namespace (needs root + unshare): every host uses 127.0.0.1")
    bench(args, multi_ip=args.in_netns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
