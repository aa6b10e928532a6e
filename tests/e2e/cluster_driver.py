"""Three crawlerd "machines" and a 3-node NATS JetStream cluster crawl simweb together; driver
of tests/e2e/test_cluster_crawl.py, run inside a private network namespace.

Three nats-server nodes, each on its own loopback address (127.0.3.1-3) as a machine of its own,
and three ``crawlerd run --cluster ... --shards 6`` nodes with their own data dirs: ``alpha`` owns
shards 0-1, ``beta`` 2-3, ``gamma`` 4-5, each talking to two of the NATS nodes. All get the seeds
file. The crawlers' DNS puts the hosts on ``SHARED_IPS`` addresses (several hosts of every
node's shards on each), with ``politeness.ip_delay_s`` = ``IP_DELAY_S``: the per-IP bounds must
hold across the machines. While they crawl: ``cluster status --json`` from either node's side; a
third node asking for another shard count (refused); the hand-off stream's leader is killed with
SIGKILL mid-crawl (and started again later). Both end by ``--duration``. Then the stream is
read as it is left (batches not yet taken by a stopped shard) and everything is written as JSON
for the test: the server's ledger, the site, statuses, logs, each shard's frontier check.
"""

import asyncio
import json
import os
import subprocess
import sys
import time

from crawlerd.cluster.localnats import LocalNats
from crawlerd.simweb import SimWebProcess

SHARDS = 6
NODES = {"alpha": "0-1", "beta": "2-3", "gamma": "4-5"}
SHARED_IPS = 12
IP_DELAY_S = 0.2
NATS_HOSTS = ["127.0.3.1", "127.0.3.2", "127.0.3.3"]
CRAWL = "e2e"


def crawlerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crawlerd", *args]


def shared_ips(sim) -> dict[str, str]:
    """Every host on one of SHARED_IPS addresses (simweb answers on all of 127/8)."""
    return {h: f"127.0.9.{1 + i % SHARED_IPS}" for i, h in enumerate(sorted(sim.static_hosts))}


def sets(sim, node: str) -> list[str]:
    table = ", ".join(f'"{h}" = "{ip}"' for h, ip in shared_ips(sim).items())
    return ["-s", "crawl.user_agent=crawlerd-test/0.1 (+e2e; operator: test@localhost)",
            "-s", 'network.allow=["127.0.0.0/8"]', "-s", f"dns.static_hosts={{{table}}}",
            "-s", "fetch.shutdown_grace_s=2.0", "-s", "politeness.max_delay_s=5.0",
            "-s", "robots.crawl_delay_cap_s=5.0", "-s", f"politeness.ip_delay_s={IP_DELAY_S}",
            "-s", f"cluster.crawl={CRAWL}", "-s", f"cluster.node={node}",
            # a delivery lost with a killed consumer leader comes again within the test
            "-s", "cluster.ack_wait_s=5.0"]


def cluster_status(servers: list[str]) -> dict | None:
    r = subprocess.run(crawlerd("cluster", "status", "--json", "--cluster", ",".join(servers),
                                "-s", f"cluster.crawl={CRAWL}", "--timeout", "10"),
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else {"rc": r.returncode, "stderr": r.stderr[-2000:]}


def status(data_dir: str) -> dict | None:
    r = subprocess.run(crawlerd("status", "--json", "--data-dir", data_dir), capture_output=True, text=True,
                       timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else None


async def stream_leftovers(servers: list[str]) -> dict:
    """The batches still in the hand-off stream (not taken by a stopped shard): records per shard."""
    from crawlerd.cluster.engine import Link, Names
    from crawlerd.handoff.batch import decode_batch
    link = await Link(servers, Names(CRAWL), name="driver").open()
    try:
        si = await link.js.stream_info(link.names.stream)
        per: dict[str, int] = {}
        keys = []
        for seq in range(si.state.first_seq, si.state.last_seq + 1) if si.state.messages else ():
            try:
                m = await link.js.get_msg(link.names.stream, seq)
            except Exception:           # removed: acknowledged (work-queue retention)
                continue
            b = decode_batch(m.data)
            shard = m.subject.rsplit(".", 1)[1]
            per[shard] = per.get(shard, 0) + len(b.records)
            keys.append([b.source, b.seq])
        return {"messages": si.state.messages, "records": per, "keys": keys}
    finally:
        await link.close()


def frontier_check(data_dir: str, index: int) -> dict:
    from crawlerd.frontier import Frontier
    fr = Frontier(os.path.join(data_dir, "shards", str(index), "frontier"), deferred_level=True)
    try:
        fr.check_invariants(deep=True)
        return {"ok": True, "stats": fr.stats()}
    except AssertionError as e:
        return {"ok": False, "error": str(e)}
    finally:
        fr.close()


def main() -> int:
    out_path, base, hosts, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    nats = LocalNats(os.path.join(base, "nats"), nodes=3, hosts=NATS_HOSTS)
    nats.start()
    report: dict = {"shards": SHARDS, "nodes": NODES}
    try:
        with SimWebProcess(hosts=hosts, seed=11, bind="0.0.0.0") as sim:
            seeds = os.path.join(base, "seeds.txt")
            with open(seeds, "w") as f:
                f.write("\n".join(sim.seeds) + "\n")
            servers = {"alpha": [nats.url("n0"), nats.url("n1")], "beta": [nats.url("n1"), nats.url("n2")],
                       "gamma": [nats.url("n2"), nats.url("n0")]}
            dirs = {n: os.path.join(base, n) for n in NODES}
            t0 = time.monotonic()
            procs = {n: subprocess.Popen(crawlerd("run", "--cluster", ",".join(servers[n]), "--shards", str(SHARDS),
                                                  "--own", own, "--seeds", seeds, "--data-dir", dirs[n],
                                                  "--duration", str(seconds), *sets(sim, n)),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for n, own in NODES.items()}
            during = None
            while time.monotonic() - t0 < seconds * 0.3:     # the leader kill needs time left after it
                time.sleep(1.0)
                sts = {n: status(d) for n, d in dirs.items()}
                if all(s and s["state"] == "running" and s["pages"] > 5 for s in sts.values()):
                    during = sts
                    break
            report["during"] = during
            for n in NODES:
                report[f"cluster_{n}"] = cluster_status(servers[n])
            # SIGKILL the hand-off stream's leader while URLs flow between the machines (first: the
            # crawl must have time left after the election)
            leader = (report["cluster_alpha"].get("stream") or {}).get("leader")
            report["killed_leader"] = leader
            report["t_kill"] = time.time()
            if leader in nats.names:
                nats.kill(leader)
            # the survivors elect a new leader: wait for it (bounded; a loaded box elects slower)
            survivors = [nats.url(n) for n in nats.names if n != leader]
            time.sleep(min(10.0, seconds / 5))
            deadline = time.monotonic() + 30.0
            while True:
                report["after_kill"] = cluster_status(survivors)
                new = (report["after_kill"].get("stream") or {}).get("leader")
                if (new and new != leader) or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            if leader in nats.names:
                nats.start(leader)          # back on its store: the stream has its three replicas again
            report["t_restart_leader"] = time.time()
            # a node that asks for another shard count is refused, naming the cluster's
            r = subprocess.run(crawlerd("run", "--cluster", nats.url("n2"), "--shards", "3", "--own", "0",
                                        "--data-dir", os.path.join(base, "delta"), "--duration", "30",
                                        *sets(sim, "delta")), capture_output=True, text=True, timeout=90)
            report["mismatch"] = {"rc": r.returncode, "stderr": r.stderr[-3000:]}
            for n, p in procs.items():
                try:
                    _o, err = p.communicate(timeout=seconds + 120)
                except subprocess.TimeoutExpired:
                    p.kill()
                    _o, err = p.communicate()
                report[f"rc_{n}"] = p.returncode
                report[f"stderr_{n}"] = err[-30000:]
                with open(os.path.join(dirs[n], "last-run.json")) as f:
                    report[f"last_run_{n}"] = json.load(f)
                finals, turns = {}, {}      # each shard's own final numbers (after its drain)
                for i in range(SHARDS):
                    path = os.path.join(dirs[n], "shards", str(i), "last-run.json")
                    if os.path.exists(path):
                        with open(path) as f:
                            own = json.load(f)
                        finals[i] = own["shards"][0]["handoff"]
                        turns[i] = own.get("ip_turns", {})
                report[f"handoff_{n}"] = finals
                report[f"ip_turns_{n}"] = turns
            report["wall_s"] = time.monotonic() - t0
            report["final"] = cluster_status(nats.servers)
            report["leftovers"] = asyncio.run(stream_leftovers(nats.servers))
            report["frontiers"] = {n: {i: frontier_check(dirs[n], i) for i in range(SHARDS)
                                       if os.path.isdir(os.path.join(dirs[n], "shards", str(i), "frontier"))}
                                   for n in NODES}
            report["outbox_files"] = {n: [os.path.join(r, f) for r, _d, fs in os.walk(dirs[n]) for f in fs
                                          if f.endswith(".hb")] for n in NODES}
            report.update(port=sim.port, site=sim.site(), ledger=[e.to_dict() for e in sim.ledger()],
                          dirs=dirs, ip_delay_s=IP_DELAY_S, ips=shared_ips(sim))
    finally:
        nats.stop()
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
