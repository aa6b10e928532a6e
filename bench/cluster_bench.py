"""Hand-off cost across machines: the spool (one box) vs NATS JetStream (1 server R1, 3 servers R3).

``python bench/cluster_bench.py [--urls-per-shard 60000] [--rate 5000] [--runs 3]`` re-enters a
private network namespace (only loopback), then per transport and run: starts the NATS servers
(temp store dirs), starts 3 "node" processes owning 2 shards each of N = 6, and has every shard
hand ``--urls-per-shard`` URL records to the other five at ``--rate`` records/s (a crawl shard
at ~100 pages/s with ~50 foreign links a page), in 10 ms ticks, through the real outbox/inbox
(receiver: acknowledge after receive, as a seen-set journal would). Measured:

- CPU µs per handed-off URL of the node processes (sender + receiver side, user + sys);
- messages and bytes per URL (batches published, bytes on the wire);
- hand-off latency, batch file written → batch received by its shard: p50 / p99;
- the NATS servers' CPU (s) and peak RSS (MiB) per 1,000 handed-off URLs.

Medians of the runs; the box is small and shared, so compare transports by ratio within a run.
Results go to stdout as a Markdown table (bench/RESULTS.md keeps them with this command).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from crawlerd.simweb.netns import in_private_netns  # noqa: E402

N = 6
NODES = 3
TICK_S = 0.01


def record(src: int, j: int) -> tuple[int, bytes]:
    url = f"http://www.host{(src * 7919 + j) % 100000}.example/section/{j % 97}/page-{j}.html"
    return ((src << 48) | j, f"3 1 2 {url}".encode())


def dest_of(src: int, j: int) -> int:
    return (src + 1 + j % (N - 1)) % N


# -- one node process ---------------------------------------------------------------------------
async def node_main(a) -> dict:
    from crawlerd.handoff.spool import SpoolInbox, SpoolOutbox
    shards = [a.node * 2, a.node * 2 + 1]
    link = None
    if a.mode == "spool":
        outs = {s: SpoolOutbox(os.path.join(a.root, "spool"), s, [d for d in range(N) if d != s],
                               flush_interval_s=0.1) for s in shards}
        ins = {s: SpoolInbox(os.path.join(a.root, "spool"), s) for s in shards}
    else:
        from crawlerd.cluster.engine import Link, Names
        from crawlerd.handoff.jetstream import JetStreamInbox, JetStreamOutbox
        link = await Link(a.servers.split(","), Names("bench")).open()
        await link.ensure_stream(replicas=a.replicas, max_batches_per_shard=100000, dedup_window_s=120.0)
        outs = {s: JetStreamOutbox(link, os.path.join(a.root, f"out-{s}"), s, [d for d in range(N) if d != s],
                                   flush_interval_s=0.1) for s in shards}
        ins = {s: await JetStreamInbox(link, s).open() for s in shards}
    for o in outs.values():
        o.start()
    for i in ins.values():
        if hasattr(i, "start"):
            i.start()
    per_tick = max(1, int(a.rate * TICK_S))
    expect = {s: a.urls for s in shards}           # by symmetry each shard receives what it sends
    got = {s: 0 for s in shards}
    lat: list[float] = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    sent = 0
    while sent < a.urls or any(got[s] < expect[s] for s in shards):
        tick = time.monotonic()
        if sent < a.urls:
            k = min(per_tick, a.urls - sent)
            for s in shards:
                by: dict[int, list] = {}
                for j in range(sent, sent + k):
                    by.setdefault(dest_of(s, j), []).append(record(s, j))
                for d, recs in by.items():
                    outs[s].stage(d, recs)
            sent += k
        for s in shards:
            for b in ins[s].receive():
                got[s] += len(b.records)
                if a.mode == "spool":
                    try:
                        lat.append(time.time() - os.stat(b.ref).st_mtime)
                    except OSError:
                        pass
                ins[s].ack(b)
        if time.monotonic() - t0 > a.timeout:
            break
        await asyncio.sleep(max(0.0, TICK_S - (time.monotonic() - tick)))
    wall = time.monotonic() - t0
    for o in outs.values():
        await o.close()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    msgs = sum(getattr(o, "published", None) or o.batches_sent for o in outs.values())
    nbytes = sum(o.bytes_sent for o in outs.values())
    if a.mode != "spool":
        for i in ins.values():
            lat.extend(i.latency_s)
            await i.close()
        await link.close()
    return {"node": a.node, "received": sum(got.values()), "expected": sum(expect.values()), "wall_s": wall,
            "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), "messages": msgs,
            "bytes": nbytes, "latency_s": lat}


# -- the parent ----------------------------------------------------------------------------------
def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def one_run(mode: str, a) -> dict:
    from crawlerd.cluster.localnats import LocalNats
    tmp = tempfile.mkdtemp(prefix="crawlerd-cbench-")
    nats = None
    servers, replicas = "", 1
    if mode != "spool":
        nodes = 1 if mode == "js-r1" else 3
        replicas = 1 if mode == "js-r1" else 3
        nats = LocalNats(os.path.join(tmp, "nats"), nodes=nodes)
        nats.start()
        servers = ",".join(nats.servers)
        cpu0 = {n: proc_cpu_s(nats.pid(n)) for n in nats.names}
    procs = []
    for k in range(NODES):
        out = os.path.join(tmp, f"node{k}.json")
        cmd = [sys.executable, __file__, "--node", str(k), "--mode", mode, "--servers", servers,
               "--replicas", str(replicas), "--root", tmp, "--urls-per-shard", str(a.urls_per_shard),
               "--rate", str(a.rate), "--out", out]
        procs.append((subprocess.Popen(cmd), out))
    nodes_res = []
    for p, out in procs:
        p.wait(a.timeout + 120)
        with open(out) as f:
            nodes_res.append(json.load(f))
    res: dict = {"mode": mode}
    if nats is not None:
        res["engine_cpu_s"] = sum(proc_cpu_s(nats.pid(n)) - cpu0[n] for n in nats.names)
        res["engine_hwm_mib"] = sum(proc_hwm_mib(nats.pid(n)) for n in nats.names)
        nats.stop()
    urls = sum(r["received"] for r in nodes_res)
    lat = [x for r in nodes_res for x in r["latency_s"]]
    res.update(urls=urls, lost=sum(r["expected"] for r in nodes_res) - urls,
               cpu_us_per_url=1e6 * sum(r["cpu_s"] for r in nodes_res) / max(1, urls),
               msgs_per_kurl=1000 * sum(r["messages"] for r in nodes_res) / max(1, urls),
               bytes_per_url=sum(r["bytes"] for r in nodes_res) / max(1, urls),
               p50_ms=1000 * pct(lat, 0.5), p99_ms=1000 * pct(lat, 0.99),
               wall_s=max(r["wall_s"] for r in nodes_res))
    if nats is not None:
        res["engine_cpu_ms_per_kurl"] = 1e6 * res["engine_cpu_s"] / max(1, urls)
        res["engine_rss_mib"] = res["engine_hwm_mib"]
    return res


def ip_overlap(hosts: int, shards: int = N, nodes: int = NODES) -> dict:
    """How often per-IP politeness across machines matters on simweb: IPs whose hosts' shards
    (``url.hosts.shard_of``) live on more than one node (node = shard // (shards / nodes))."""
    from crawlerd.simweb.site import Site
    from crawlerd.url.hosts import shard_of
    site = Site(n_hosts=hosts)
    per_node = shards // nodes
    by_ip: dict[str, list] = {}
    for h in site.hosts:
        by_ip.setdefault(h.ip, []).append(h)
    shared = [ip for ip, hs in by_ip.items() if len(hs) > 1]
    spread = {ip: {shard_of(h.name, shards) // per_node for h in by_ip[ip]} for ip in shared}
    multi = [ip for ip in shared if len(spread[ip]) > 1]
    pages = sum(h.pages for h in site.hosts)
    return {"hosts": hosts, "ips": len(by_ip), "shared_ips": len(shared),
            "shared_ips_on_several_nodes": len(multi),
            "hosts_on_those_ips": sum(len(by_ip[ip]) for ip in multi),
            "pages_on_those_ips_pct": 100 * sum(h.pages for ip in multi for h in by_ip[ip]) / pages,
            "max_nodes_per_ip": max((len(v) for v in spread.values()), default=1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--urls-per-shard", type=int, default=60000)
    ap.add_argument("--rate", type=int, default=5000, help="records per second per shard")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="spool,js-r1,js-r3")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--ip-overlap", type=int, metavar="HOSTS",
                    help="only count simweb IPs shared by hosts of shards on different nodes")
    ap.add_argument("--node", type=int)
    ap.add_argument("--mode")
    ap.add_argument("--servers", default="")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--root")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.ip_overlap:
        print(json.dumps(ip_overlap(a.ip_overlap), indent=1))
        return
    if a.node is not None:
        a.urls = a.urls_per_shard
        import uvloop
        res = uvloop.run(node_main(a))
        with open(a.out, "w") as f:
            json.dump(res, f)
        return
    if not in_private_netns():
        os.execvp("unshare", ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                              sys.executable, *sys.argv])
    rows = {m: [] for m in a.modes.split(",")}
    for _ in range(a.runs):
        for m in rows:                              # interleaved: every run sees the same box
            rows[m].append(one_run(m, a))
            print(json.dumps(rows[m][-1]), file=sys.stderr)
    keys = ["cpu_us_per_url", "msgs_per_kurl", "bytes_per_url", "p50_ms", "p99_ms", "engine_cpu_ms_per_kurl",
            "engine_rss_mib"]
    print(f"\n{NODES} node processes x 2 shards (N = {N}), {a.urls_per_shard} URLs handed off per shard at "
          f"{a.rate}/s per shard; medians of {a.runs} runs\n")
    print("| transport | URLs | lost | CPU µs/URL (nodes) | batches/1k URLs | bytes/URL | latency p50 ms | "
          "p99 ms | engine CPU ms/1k URLs | engine peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) if k in rs[0] else None for k in keys}
        cells = [f"{med[k]:.1f}" if med[k] is not None else "-" for k in keys]
        print(f"| {m} | {rs[0]['urls']} | {max(r['lost'] for r in rs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
