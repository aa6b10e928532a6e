"""``python -m crawlerd.simweb``: run the synthetic web until SIGTERM.

Prints exactly one JSON line on stdout once listening (port, control_port, hosts, seeds,
static_hosts, and dns_port when --dns-port is given); logs go to stderr. SIGTERM or SIGINT
writes the ledger to --ledger-out (JSON lines) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from crawlerd.simweb.farm import FarmShape
from crawlerd.simweb.netns import check_bind
from crawlerd.simweb.server import SimServer, log
from crawlerd.simweb.site import PROFILE_UNIFORM, PROFILES, Site


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crawlerd.simweb", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hosts", type=int, default=200, help="number of hosts h0.sim … h{N-1}.sim")
    p.add_argument("--seed", type=int, default=1, help="the whole site is a function of this seed")
    p.add_argument("--bind", default="127.0.0.1",
                   help="listen address: a loopback address, or 0.0.0.0 inside a private network namespace")
    p.add_argument("--port", type=int, default=0, help="HTTP port shared by all hosts (0: any free port)")
    p.add_argument("--control-port", type=int, default=0, help="control port on 127.0.0.1 (0: any free port)")
    p.add_argument("--min-pages", type=int, default=20, help="fewest /p/ pages per host")
    p.add_argument("--max-pages", type=int, default=500, help="most /p/ pages per host")
    p.add_argument("--cache-mb", type=int, default=64, help="rendered-body cache size, MiB")
    p.add_argument("--ledger-out", default="", help="on SIGTERM, write the ledger here (JSON lines)")
    p.add_argument("--ledger-max", type=int, default=0,
                   help="keep at most this many most recent ledger entries (0: all; long benchmarks)")
    p.add_argument("--profile", choices=PROFILES, default=PROFILE_UNIFORM,
                   help="page shapes: uniform (5-30 KB, 10-60 links) or web (log-normal sizes and link "
                        "counts, a robots.txt on every ordinary host)")
    p.add_argument("--tls", action="store_true",
                   help="serve every host over HTTPS with certificates from a throwaway test CA made at "
                        "start (its certificate is announced as ca_file); needs the cryptography package")
    p.add_argument("--variants", type=float, default=0.0, metavar="SHARE",
                   help="share of ordinary hosts serving URL variants of their pages (simweb.variants)")
    p.add_argument("--farm-domains", type=int, default=0,
                   help="add a link farm of this many registered domains with endless pages (farm.py)")
    p.add_argument("--farm-hosts", type=int, default=3, help="hosts per farm domain")
    p.add_argument("--farm-in-rate", type=float, default=0.002,
                   help="probability that an ordinary page links into the farm")
    p.add_argument("--giants", type=int, default=0,
                   help="add this many big legitimate domains that ordinary pages link to often")
    p.add_argument("--giant-hosts", type=int, default=20, help="hosts per big legitimate domain")
    p.add_argument("--one-domain", default="",
                   help="name the ordinary hosts h{i}.DOMAIN: every host under one registered domain")
    p.add_argument("--dns-port", type=int, default=None,
                   help="also answer DNS (UDP, 127.0.0.1) for every host on this port (0: any free port)")
    return p


async def _run(args: argparse.Namespace) -> int:
    shape = FarmShape(domains=args.farm_domains, hosts_per_domain=args.farm_hosts, in_rate=args.farm_in_rate,
                      giants=args.giants, giant_hosts=args.giant_hosts, one_domain=args.one_domain)
    site = Site(args.hosts, args.seed, args.min_pages, args.max_pages, profile=args.profile, shape=shape,
                variant_share=args.variants)
    tls = None
    if args.tls:
        try:
            from crawlerd.simweb.tls import TestCA
            tls = TestCA([h.name for h in site.hosts])
        except ImportError as e:        # the throwaway CA is made with the cryptography package
            raise SystemExit(f"simweb --tls needs the Python package 'cryptography' ({e.msg}): "
                             "pip install 'crawlerd[bench]' (or pip install cryptography)") from None
    server = SimServer(site, cache_bytes=args.cache_mb << 20, ledger_max_entries=args.ledger_max, tls=tls)
    await server.start(args.bind, args.port, args.control_port)
    announcement = server.announcement()
    dns = None
    if args.dns_port is not None:
        from crawlerd.simweb.dns import DnsServer
        dns = DnsServer(records={name: ([ip], 300) for name, ip in server.static_hosts().items()})
        _, dns_port = await dns.start("127.0.0.1", args.dns_port)
        announcement["dns_port"] = dns_port
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write(json.dumps(announcement, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    log(f"{args.hosts} hosts on {args.bind}:{server.port}, control 127.0.0.1:{server.control_port}")
    await stop.wait()
    await server.close()
    if dns is not None:
        dns.close()
    if tls is not None:
        tls.close()
    if args.ledger_out:
        server.ledger.write_jsonl(args.ledger_out)
        log(f"ledger: {len(server.ledger.entries)} entries -> {args.ledger_out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.hosts < 1:
        print("simweb: --hosts must be >= 1", file=sys.stderr)
        return 2
    if not 0.0 <= args.variants <= 1.0:
        print("simweb: --variants must be in [0, 1]", file=sys.stderr)
        return 2
    if not 1 <= args.min_pages <= args.max_pages:
        print("simweb: need 1 <= --min-pages <= --max-pages", file=sys.stderr)
        return 2
    try:
        FarmShape(domains=args.farm_domains, hosts_per_domain=args.farm_hosts, in_rate=args.farm_in_rate,
                  giants=args.giants, giant_hosts=args.giant_hosts, one_domain=args.one_domain)
    except ValueError as e:
        print(f"simweb: {e}", file=sys.stderr)
        return 2
    problem = check_bind(args.bind)
    if problem:
        print(f"simweb: {problem}", file=sys.stderr)
        return 2
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        return runner(_run(args))
    except OSError as e:
        print(f"simweb: cannot listen: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
