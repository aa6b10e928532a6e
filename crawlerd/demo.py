"""`crawlerd demo`: crawl the bundled synthetic web on loopback, with live progress.

When run as root with ``unshare`` available, the demo re-executes itself in a
private network namespace that has only ``lo``: the synthetic web then binds
0.0.0.0 and answers on one 127.x.y.z address per host, and nothing the crawler
does can leave the machine. Otherwise it binds 127.0.0.1 only and maps every
synthetic host name there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from crawlerd import config as configmod

DEMO_UA = "crawlerd-demo/0.1 (+synthetic web on loopback; operator: demo@localhost)"


def in_private_netns() -> bool:
    """True when the only network interface is loopback."""
    import socket
    try:
        return [name for _i, name in socket.if_nameindex()] == ["lo"]
    except OSError:
        return False


def _reexec_in_netns(argv: list[str]) -> int | None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return None
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
           sys.executable, "-m", "crawlerd", *argv, "--inside-netns"]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


def demo_overrides(data_dir: str, sim, netns: bool) -> list[str]:
    import json
    ov = [f"crawl.data_dir={json.dumps(data_dir)}", f"crawl.user_agent={json.dumps(DEMO_UA)}",
          'network.allow=["127.0.0.0/8"]', "log.level=\"warning\""]
    if not netns:
        # every synthetic host is on 127.0.0.1 here: the per-IP limit would serialise the whole web
        ov.append("politeness.per_ip_concurrency=64")
    if getattr(sim, "dns_port", None):
        ov.append(f'dns.nameservers=["127.0.0.1:{sim.dns_port}"]')
    else:
        table = ", ".join(f"{json.dumps(h)} = {json.dumps(ip)}" for h, ip in sim.static_hosts.items())
        ov.append(f"dns.static_hosts={{{table}}}")
    return ov


class Progress:
    def __init__(self, stream=sys.stdout):
        self.stream = stream
        self.tty = stream.isatty()
        self.last = 0.0

    def __call__(self, sup, s: dict) -> None:
        now = time.monotonic()
        if not self.tty and now - self.last < 5:
            return
        self.last = now
        errors = s["errors"]
        line = (f"[{s['uptime_s']:5.0f}s] pages {s['pages']:7d}  {s['pages_per_s_10s']:7.1f}/s  "
                f"queued {s['queued']:7d}  hosts {s['hosts_active']:5d}  in flight {s['in_flight']:4d}  "
                f"errors {errors}")
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def run_demo(args) -> int:
    argv = ["demo", "--seconds", str(args.seconds), "--hosts", str(args.hosts)]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    if args.config:
        argv += ["--config", args.config]
    for s in args.set or []:
        argv += ["-s", s]
    if not args.inside_netns and not args.no_netns and not in_private_netns():
        rc = _reexec_in_netns(argv)
        if rc is not None:
            return rc
        print("crawlerd demo: no private network namespace available; binding 127.0.0.1 only", file=sys.stderr)
    return _demo(args)


def _demo(args) -> int:
    from crawlerd.simweb import SimWebProcess
    from crawlerd.supervisor import Supervisor, setup_logging

    netns = in_private_netns()
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="crawlerd-demo-")
    print(f"crawlerd demo: synthetic web of {args.hosts} hosts on loopback"
          f"{' (private network namespace)' if netns else ''}; data in {data_dir}")
    with SimWebProcess(hosts=args.hosts, seed=1, bind="0.0.0.0" if netns else "127.0.0.1") as sim:
        seeds_path = os.path.join(data_dir, "seeds.txt")
        os.makedirs(data_dir, exist_ok=True)
        with open(seeds_path, "w") as f:
            f.write("\n".join(sim.seeds) + "\n")
        cfg = configmod.load(args.config, demo_overrides(data_dir, sim, netns) + list(args.set or []))
        setup_logging(cfg.log.level)
        t0, cpu0 = time.monotonic(), os.times()
        sup = Supervisor(cfg, seeds_files=[seeds_path], duration_s=args.seconds, on_tick=Progress())
        try:
            sup.run()
        finally:
            sup.close()
        wall = time.monotonic() - t0
        cpu1 = os.times()
        cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system) + sum(sup.shard.pool.final_cpu_s.values())
        ledger = sim.ledger()
    print()
    _summary(sup, cfg, wall, cpu, ledger, args.seconds)
    from crawlerd.report import write_report
    path = write_report(data_dir, os.path.join(data_dir, "report.html"), min_delay_s=cfg.politeness.min_delay_s)
    print(f"report             {path}")
    return 0


def _summary(sup, cfg, wall: float, cpu: float, ledger, duration_s: float) -> None:
    from crawlerd.simweb.ledger import politeness_violations
    m = sup.metrics
    pages = m.pages
    print("=== crawlerd demo summary ===")
    print(f"pages fetched      {pages}")
    window = min(wall, duration_s)
    print(f"wall time          {wall:.1f} s ({window:.0f} s crawling, {max(0.0, wall - window):.1f} s ordered stop)")
    print(f"pages/s            {pages / window:.1f}" if window > 0 else "pages/s            -")
    print(f"crawler CPU        {cpu:.2f} s ({1000 * cpu / pages:.2f} ms/page)" if pages else
          f"crawler CPU        {cpu:.2f} s")
    print("outcomes           " + ", ".join(f"{k} {v}" for k, v in sorted(m.outcomes.items())))
    print("HTTP statuses      " + ", ".join(f"{k} {v}" for k, v in sorted(m.statuses.items())))
    dropped = {k: v for k, v in m.dropped.items() if v}
    if dropped:
        print("dropped            " + ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())))
    gap = cfg.politeness.min_delay_s
    entries = ledger if isinstance(ledger, list) else ledger.get("entries", [])
    viol = politeness_violations(entries, gap, cfg.politeness.per_ip_concurrency)
    print(f"server-side ledger {len(entries)} requests, {len(viol)} politeness violations")
    for v in viol[:10]:
        print(f"  {v}")
    warc_dir = cfg.path("warc")
    files = sorted(f for f in os.listdir(warc_dir) if ".warc" in f) if os.path.isdir(warc_dir) else []
    print(f"WARC files         {len(files)} in {warc_dir}")
    for f in files:
        print(f"  {f}  {os.path.getsize(os.path.join(warc_dir, f))} bytes")
