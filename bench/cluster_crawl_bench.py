"""Whole daemons on one, two or three "machines": the same simweb crawled by N shards on 1 machine vs several.

    nice -n 10 .venv/bin/python bench/cluster_crawl_bench.py [--hosts 20000] [--seconds 90] [--runs 2]
        [--shapes "1 machine,1 machine JS,2 machines"]

Inside a private network namespace with only ``lo`` (re-executes itself under ``unshare -n``).
Every crawl gets a fresh simweb with the same seed (all hosts are seeds; names from simweb's DNS
server on loopback), fresh data dirs, and N = 2 shards, run three ways:

- ``1 machine``: ``crawlerd run --shards 2`` (the spool hand-off, no NATS);
- ``1 machine JS``: the same machine as a cluster node (``--cluster ... --own 0-1``) with 3 NATS
  servers (R3): what the engine costs when nothing crosses a machine;
- ``2 machines``: nodes ``alpha`` (``--own 0``) and ``beta`` (``--own 1``), own data dirs, each
  talking to its own NATS server of the 3 (R3): every hand-off crosses machines.

and with N = 6 (the layout of 3 nodes x 2 shards):

- ``1 machine N6``: ``crawlerd run --shards 6`` (spool hand-off, the machine's per-IP slot table);
- ``3 machines``: nodes ``alpha``/``beta``/``gamma`` owning 0-1, 2-3, 4-5, each talking to its
  own NATS server, per-IP turns across machines on (``cluster.ip_turns``);
- ``3 machines per-machine IPs``: the same with ``cluster.ip_turns=false`` (per-IP politeness
  per machine only: the documented k x bound), to price the turns.

Each crawl runs ``--seconds`` (``--duration``); runs rotate the order of the three. Per crawl,
from the server's ledger: pages (non-robots answers) and pages/s after ``--warmup``; CPU per page
of every crawlerd process (the family and everything it reaped: shard processes, workers;
``wait4`` rusage) and of the NATS servers (``/proc`` before they stop) with their peak RSS; the
hand-off (records, batches and bytes per page, from each shard's own last-run.json); politeness
per host (must be 0) and per IP (``per_ip_concurrency`` 1: an IP whose hosts are on both
machines' shards may be asked by each machine, the documented bound; counted, not hidden).

Medians of the runs. The box is small (2 cores) and shared: the three crawls contend for the
same cores (two machines on one box are two families on 2 cores), so read ratios within a run,
not absolute speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from crawlerd.cluster.localnats import LocalNats  # noqa: E402
from crawlerd.simweb import SimWebProcess  # noqa: E402
from crawlerd.simweb.ledger import (  # noqa: E402
    HOST_GAP,
    HOST_OVERLAP,
    IP_CONCURRENCY,
    crawl_delays,
    politeness_violations,
)
from crawlerd.simweb.netns import in_private_netns  # noqa: E402

UA = "crawlerd-bench/0.1 (+synthetic web on loopback; operator: bench@localhost)"
SHAPES = ("1 machine", "1 machine JS", "2 machines", "1 machine N6", "3 machines", "3 machines per-machine IPs")
SHARDS = {"1 machine N6": 6, "3 machines": 6, "3 machines per-machine IPs": 6}
STOP_GRACE_S = 120.0


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def config(work: str, sim: SimWebProcess, name: str, shards: int) -> tuple[str, list[str]]:
    data = os.path.join(work, name)
    path = os.path.join(work, f"{name}.toml")
    with open(path, "w") as f:
        f.write("")
    sets = [f"crawl.data_dir={json.dumps(data)}", f"crawl.user_agent={json.dumps(UA)}",
            'network.allow=["127.0.0.0/8"]', 'log.level="warning"', f'dns.nameservers=["127.0.0.1:{sim.dns_port}"]',
            "politeness.min_delay_s=1.0", "politeness.per_ip_concurrency=1", f"crawl.shards={shards}",
            "cluster.crawl=bench", f"cluster.node={name}"]
    return path, sets


def launch(work: str, sim: SimWebProcess, name: str, seeds: str, seconds: float, extra: list[str], shards: int):
    path, sets = config(work, sim, name, shards)
    cmd = [sys.executable, "-P", "-m", "crawlerd", "run", "--config", path, "--seeds", seeds,
           "--duration", str(seconds), *extra]
    for s in sets:
        cmd += ["-s", s]
    err = open(os.path.join(work, f"{name}.stderr"), "w")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=work), err


def handoff_of(data_dir: str, shards: int) -> dict:
    """Hand-off and per-IP turn numbers of a machine's shards (their own last-run.json)."""
    out = {"records": 0, "batches": 0, "bytes": 0, "ip_asks": 0, "ip_ask_bytes": 0, "ip_grants": 0,
           "ip_put_off": 0}
    for i in range(shards):
        path = os.path.join(data_dir, "shards", str(i), "last-run.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            own = json.load(f)
        h = own["shards"][0].get("handoff", {})
        t = own.get("ip_turns", {})
        out["ip_asks"] += t.get("asks", 0)
        out["ip_ask_bytes"] += t.get("ask_bytes", 0) + t.get("answer_bytes", 0)
        out["ip_grants"] += t.get("grants", 0)
        out["ip_put_off"] += t.get("put_off", 0)
        out["records"] += h.get("records_sent", 0)
        out["batches"] += h.get("batches_sent", 0)
        out["bytes"] += h.get("bytes_sent", 0)
    return out


def one(args, root: str, run: int, shape: str) -> dict:
    work = os.path.join(root, f"run{run}-{shape.replace(' ', '_')}")
    os.makedirs(work)
    nats = None
    with SimWebProcess(hosts=args.hosts, seed=args.seed, bind="0.0.0.0", dns_port=0) as sim:
        seeds = os.path.join(work, "seeds.txt")
        with open(seeds, "w") as f:
            f.write("\n".join(sim.seeds) + "\n")
        n = SHARDS.get(shape, 2)
        nodes: dict[str, list[str]] = {"solo": []}
        if shape not in ("1 machine", "1 machine N6"):
            nats = LocalNats(os.path.join(work, "nats"), nodes=3)
            nats.start()
            if shape == "1 machine JS":
                nodes = {"solo": ["--cluster", ",".join(nats.servers), "--own", "0-1"]}
            elif shape == "2 machines":
                nodes = {"alpha": ["--cluster", nats.url("n0"), "--own", "0"],
                         "beta": ["--cluster", nats.url("n1"), "--own", "1"]}
            else:
                turns = ["-s", "cluster.ip_turns=false"] if shape == "3 machines per-machine IPs" else []
                nodes = {name: ["--cluster", nats.url(f"n{j}"), "--own", f"{2 * j}-{2 * j + 1}", *turns]
                         for j, name in enumerate(("alpha", "beta", "gamma"))}
        t_launch = time.time()
        procs = {name: launch(work, sim, name, seeds, args.seconds, extra, n) for name, extra in nodes.items()}
        cpu = {}
        rcs = {}
        deadline = time.monotonic() + args.seconds + STOP_GRACE_S
        for name, (p, err) in procs.items():
            # wait4 itself (not poll, which reaps without the rusage): CPU of the family and its reaped tree
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    p.terminate()
                    deadline += 30.0
                time.sleep(0.2)
            p.returncode = rcs[name] = os.waitstatus_to_exitcode(status)
            cpu[name] = ru.ru_utime + ru.ru_stime
            err.close()
        deaths = 0                  # shard processes the families restarted (a crash, not a ratio)
        for name in nodes:
            with open(os.path.join(work, f"{name}.stderr"), errors="replace") as f:
                deaths += sum(1 for line in f if " died: " in line)
        nats_cpu = nats_rss = 0.0
        if nats is not None:
            nats_cpu = sum(proc_cpu_s(nats.pid(x)) for x in nats.names)
            nats_rss = max(hwm_mib(nats.pid(x)) for x in nats.names)
            nats.stop()
        entries, site = sim.ledger(), sim.site()
    robots = {h: set(spec["robots"]["paths"]) for h, spec in site["hosts"].items()}
    pages = [e for e in entries if e.status and e.path not in robots.get(e.host, ())]
    t0 = t_launch + args.warmup
    steady = [e for e in pages if t0 <= e.t_start_wall < t_launch + args.seconds]
    pol = politeness_violations(entries, 1.0, 1, host_min_gap_s=crawl_delays(site, "crawlerd"))
    kinds = {k: sum(1 for v in pol if v.kind == k) for k in (HOST_OVERLAP, HOST_GAP, IP_CONCURRENCY)}
    ho: dict[str, int] = {}
    for name in nodes:
        for k, v in handoff_of(os.path.join(work, name), n).items():
            ho[k] = ho.get(k, 0) + v
    by_ip: dict[str, set] = {}
    for e in pages:
        by_ip.setdefault(e.ip, set()).add(e.host)
    shared = {ip for ip, hs in by_ip.items() if len(hs) > 1}
    npages = max(1, len(pages))
    crawl_cpu = sum(cpu.values())
    return {"shape": shape, "run": run, "rc": rcs, "shard_deaths": deaths, "pages": len(pages), "requests": len(entries),
            "steady_pages_per_s": len(steady) / max(1e-9, args.seconds - args.warmup),
            "crawlerd_cpu_s": round(crawl_cpu, 2), "cpu_ms_per_page": 1000 * crawl_cpu / npages,
            "nats_cpu_s": round(nats_cpu, 2), "nats_cpu_ms_per_page": 1000 * nats_cpu / npages,
            "nats_peak_rss_mib": round(nats_rss, 1),
            "handoff_records_per_page": ho["records"] / npages, "handoff_batches_per_page": ho["batches"] / npages,
            "handoff_bytes_per_page": ho["bytes"] / npages,
            "nats_cpu_ms_per_1000_urls": 1000 * nats_cpu / max(1, ho["records"]) * 1000,
            "ip_asks_per_page": ho["ip_asks"] / npages, "ip_bytes_per_page": ho["ip_ask_bytes"] / npages,
            "ip_grants_per_page": ho["ip_grants"] / npages, "ip_put_off_per_page": ho["ip_put_off"] / npages,
            "shared_ip_pages": sum(1 for e in pages if e.ip in shared),
            "politeness": kinds}


def table(results: list[dict]) -> str:
    shapes = list(dict.fromkeys(r["shape"] for r in sorted(results, key=lambda r: r["run"])))
    by = {s: [r for r in results if r["shape"] == s] for s in shapes}
    med = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], (int, float))}
           for s, rs in by.items() if rs}
    base = next(iter(med.values()), {})        # ratios against the first shape asked for
    lines = ["| shape | pages | steady pages/s (ratio) | crawlerd CPU ms/page (ratio) | NATS CPU ms/page | "
             "NATS peak RSS MiB | hand-off URLs / batches / bytes per page | NATS CPU ms per 1,000 URLs | "
             "IP turn asks / bytes per page | pages on shared IPs | host / IP violations |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s, m in med.items():
        pol = [r["politeness"] for r in by[s]]
        host = max(p[HOST_OVERLAP] + p[HOST_GAP] for p in pol)
        ip = max(p[IP_CONCURRENCY] for p in pol)
        lines.append(
            f"| {s} | {m['pages']:.0f} | {m['steady_pages_per_s']:.1f} "
            f"({m['steady_pages_per_s'] / max(1e-9, base.get('steady_pages_per_s', 0) or 1e-9):.2f}) | "
            f"{m['cpu_ms_per_page']:.2f} ({m['cpu_ms_per_page'] / max(1e-9, base.get('cpu_ms_per_page', 1e-9)):.2f}) | "
            f"{m['nats_cpu_ms_per_page']:.2f} | {m['nats_peak_rss_mib']:.0f} | "
            f"{m['handoff_records_per_page']:.1f} / {m['handoff_batches_per_page']:.2f} / "
            f"{m['handoff_bytes_per_page']:.0f} | {m['nats_cpu_ms_per_1000_urls']:.0f} | "
            f"{m['ip_asks_per_page']:.2f} / {m['ip_bytes_per_page']:.0f} | {m['shared_ip_pages']:.0f} | {host} / {ip} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=20000)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", metavar="FILE", help="also write every crawl's numbers here")
    ap.add_argument("--shapes", default="1 machine,1 machine JS,2 machines",
                    help=f"comma-separated, of: {', '.join(SHAPES)} (ratios against the first)")
    args = ap.parse_args()
    args.shapes = [x.strip() for x in args.shapes.split(",") if x.strip()]
    bad = [x for x in args.shapes if x not in SHAPES]
    if bad:
        ap.error(f"--shapes: unknown {bad}; choose from {list(SHAPES)}")
    if not in_private_netns():
        os.execvp("unshare", ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                              sys.executable, *sys.argv])
    results = []
    with tempfile.TemporaryDirectory(prefix="cluster-crawl-bench-") as root:
        for run in range(args.runs):
            k = run % len(args.shapes)
            order = args.shapes[k:] + args.shapes[:k]
            for shape in order:
                r = one(args, root, run, shape)
                print(json.dumps(r), flush=True)
                results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
