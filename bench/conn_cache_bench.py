"""What one idle connection in curl's connection cache costs in RAM, over HTTP and HTTPS.

The fetcher keeps a connection alive across its host's politeness gap (``FetchRequest.keep_alive``);
curl's multi handle holds such idle connections in its cache, at most ``CURLMOPT_MAXCONNECTS`` of
them, which `fetch.connection_cache_bytes` sets from the HTTPS cost measured here
(`crawlerd.fetch.curl.CONNECTION_BYTES`). A simweb (all hosts on one
address) is asked once per host with keep-alive, so that N idle connections (one per host name)
stay in the cache; the C heap in use (glibc ``mallinfo2().uordblks``, all arenas) and the private
memory (RssAnon) are read before and after, and the difference is divided by N. A second round
over the same hosts must reuse every connection (nothing new opened, nothing more allocated).

    nice -n 10 unshare -n sh -c 'ip link set lo up; exec .venv/bin/python bench/conn_cache_bench.py --hosts 2000'

Outside a network namespace whose only interface is ``lo`` the script refuses to run.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import socket
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_in_use() -> int:
    """Bytes malloc has handed out and not had back, every arena (glibc mallinfo2, 2.33+)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    mi = libc.mallinfo2()
    return mi.uordblks + mi.hblkhd


def sockets_open() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def rss_anon() -> int:
    from crawlerd.metrics import proc_status_bytes
    return (proc_status_bytes(os.getpid(), ("RssAnon",)) or {}).get("RssAnon", 0)


async def measure(sim, hosts: int, tls: bool) -> dict:
    from crawlerd.fetch.curl import Fetcher
    from crawlerd.fetch.guard import AddressGuard
    from crawlerd.outcome import Outcome
    from crawlerd.records import FetchRequest

    loop = asyncio.get_running_loop()
    f = Fetcher(loop, user_agent="crawlerd-bench/0.1 (+bench; operator: test@localhost)",
                guard=AddressGuard(["127.0.0.0/8"]), connect_timeout_s=10.0, timeout_s=30.0,
                low_speed_bytes_per_s=1, low_speed_time_s=30, max_body_bytes=1 << 20, max_header_bytes=64 << 10,
                max_connections=hosts + 16, verify_tls=tls, ca_file=sim.ca_file or "", max_transfers=64)
    names = sorted(sim.static_hosts)[:hosts]
    scheme = "https" if tls else "http"

    async def one(name: str) -> Outcome:
        r = await f.fetch(FetchRequest(url=f"{scheme}://{name}:{sim.port}/robots.txt", ip="127.0.0.1",
                                       port=sim.port, keep_alive=True))
        return r.outcome

    try:
        # warm: the transfer pool (64 handles), TLS library state, code paths; then closed again
        warm = await asyncio.gather(*(one(n) for n in names[:64]))
        gc.collect()
        base_heap, base_anon, base_socks = heap_in_use(), rss_anon(), sockets_open()
        base_new = f.connections_new
        first = await asyncio.gather(*(one(n) for n in names[64:]))
        gc.collect()
        heap, anon, socks = heap_in_use(), rss_anon(), sockets_open()
        opened = f.connections_new - base_new
        again_new = f.connections_new
        second = await asyncio.gather(*(one(n) for n in names[64:]))
        gc.collect()
        heap2 = heap_in_use()
        n = len(names) - 64
        ok = sum(o is Outcome.OK for o in (*warm, *first, *second))
        return {"scheme": scheme, "idle_connections": socks - base_socks, "opened": opened,
                "reopened_on_second_round": f.connections_new - again_new, "ok": ok, "asked": 2 * n + 64,
                "heap_bytes_per_connection": (heap - base_heap) / n, "rss_anon_bytes_per_connection": (anon - base_anon) / n,
                "heap_growth_second_round_bytes": heap2 - heap}
    finally:
        await f.close(0)


def in_private_netns() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--hosts", type=int, default=2000, help="idle connections to hold (one per simweb host)")
    p.add_argument("--json", default="", help="also write the results here")
    args = p.parse_args(argv)
    if not 100 <= args.hosts <= 20000:
        p.error("100 <= --hosts <= 20000")
    if not in_private_netns():
        print("conn_cache_bench: run inside a private network namespace (unshare -n, see the docstring)",
              file=sys.stderr)
        return 2
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * args.hosts + 256)), hard))
    import uvloop

    from crawlerd.simweb import SimWebProcess
    out = []
    for tls in (False, True):
        with SimWebProcess(hosts=args.hosts + 64, seed=5, bind="127.0.0.1", min_pages=10, max_pages=20,
                           tls=tls) as sim:
            r = uvloop.run(measure(sim, args.hosts + 64, tls))
        out.append(r)
        print(f"{r['scheme']:5s}: {r['idle_connections']} idle connections ({r['opened']} opened, "
              f"{r['reopened_on_second_round']} reopened on the second round, {r['ok']}/{r['asked']} ok): "
              f"C heap {r['heap_bytes_per_connection']:.0f} B per connection, RssAnon "
              f"{r['rss_anon_bytes_per_connection']:.0f} B; second round {r['heap_growth_second_round_bytes']:+d} B",
              flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
