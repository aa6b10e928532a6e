"""Failure drills of a two-machine crawl (driver of tests/e2e/test_cluster_drills.py, in a netns).

Three NATS nodes; ``alpha`` owns shards 0-1 of 4, ``beta`` 2-3; each node sends its own
User-Agent, so the server's ledger says which machine sent every request.

- ``restart``: every process of beta is killed with SIGKILL mid-crawl (a machine lost), then beta
  is started again on its data dir: its shards take their leases over at once (the same node,
  holding its machine's locks), resume, and drain what was handed to them meanwhile (their
  consumers' pending and ack-pending reach 0 while alpha has stopped); alpha crawls on.
- ``standby``: every process of beta is stopped (SIGSTOP) past its lease TTL; a standby node
  ``gamma`` (its own data dir) waits for shards 2-3 and takes them over once the leases expire;
  then beta is continued (SIGCONT): it must not send one request after that, and its shards
  find their leases lost and wait as standbys.
"""

import json
import os
import signal
import subprocess
import sys
import time

from crawlerd.cluster.localnats import LocalNats
from crawlerd.simweb import SimWebProcess
from tests.e2e.cluster_driver import crawlerd, frontier_check, status

SHARDS = 4
# the standby drill waits out a short TTL; the restart drill's is long, so that a restart in
# place that resumes well within it proves the take-over (not an expiry)
TTL = {"standby": ["-s", "cluster.lease_ttl_s=6", "-s", "cluster.lease_fence_s=4"],
       "restart": ["-s", "cluster.lease_ttl_s=40", "-s", "cluster.lease_fence_s=30"]}


def sets(sim, crawl: str, node: str) -> list[str]:
    table = ", ".join(f'"{h}" = "{ip}"' for h, ip in sim.static_hosts.items())
    return ["-s", f"crawl.user_agent=crawlerd-test/0.1 (+e2e {node}; operator: test@localhost)",
            "-s", 'network.allow=["127.0.0.0/8"]', "-s", f"dns.static_hosts={{{table}}}",
            "-s", "fetch.shutdown_grace_s=2.0", "-s", "politeness.max_delay_s=5.0",
            "-s", "robots.crawl_delay_cap_s=5.0", "-s", f"cluster.crawl={crawl}", "-s", f"cluster.node={node}",
            "-s", "cluster.ack_wait_s=5.0", "-s", "cluster.lease_renew_interval_s=1", *TTL[crawl]]


def start(nats, sim, base, crawl, node, own, seeds, seconds, *extra) -> subprocess.Popen:
    args = ["run", "--cluster", ",".join(nats.servers), "--shards", str(SHARDS), "--own", own,
            "--data-dir", os.path.join(base, crawl, node), "--duration", str(seconds), *sets(sim, crawl, node), *extra]
    if seeds:
        args += ["--seeds", seeds]
    err = open(os.path.join(base, f"{crawl}-{node}-{time.monotonic_ns()}.stderr"), "w")
    p = subprocess.Popen(crawlerd(*args), stdout=subprocess.DEVNULL, stderr=err)
    p.err_path = err.name
    err.close()
    return p


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def wait_running(data_dir: str, timeout_s: float, shards: int = 2) -> dict | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = status(data_dir)
        if st and st["state"] == "running" and sum(1 for s in st["shards"] if s["state"] == "running") == shards \
                and all(s["pages"] > 3 for s in st["shards"]):
            return st
        time.sleep(0.5)
    return None


def finish(p: subprocess.Popen, timeout_s: float) -> dict:
    try:
        p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    with open(p.err_path, errors="replace") as f:
        return {"rc": p.returncode, "stderr": f.read()[-20000:]}


def restart_drill(nats, sim, base, seeds) -> dict:
    crawl, seconds = "restart", 60
    a = start(nats, sim, base, crawl, "alpha", "0-1", seeds, seconds)
    b = start(nats, sim, base, crawl, "beta", "2-3", seeds, seconds)
    res: dict = {"before": wait_running(os.path.join(base, crawl, "beta"), 40)}
    victims = tree(b.pid)
    res["t_kill"] = time.time()
    signal_all(victims, signal.SIGKILL)
    b.wait()
    res["killed"] = len(victims)
    res["t_restart"] = time.time()
    b2 = start(nats, sim, base, crawl, "beta", "2-3", None, seconds + 60)   # it outlives alpha
    res["after"] = wait_running(os.path.join(base, crawl, "beta"), 40)
    res["t_resumed"] = time.time()
    res["alpha"] = finish(a, seconds + 60)
    # alpha stopped: nothing more is handed to beta's shards; beta takes what waits for them
    deadline = time.monotonic() + 30
    drained = None
    while time.monotonic() < deadline:
        cs = cluster_status_of(nats, crawl)
        rows = {r["shard"]: r for r in cs.get("shard_list", [])}
        if rows and all(rows[i]["pending"] == 0 and rows[i]["ack_pending"] == 0 for i in (2, 3)):
            drained = {i: [rows[i]["pending"], rows[i]["ack_pending"]] for i in rows}
            break
        time.sleep(1.0)
    res["drained"] = drained
    res["last_rows"] = cs.get("shard_list")
    b2.send_signal(signal.SIGTERM)
    res["beta"] = finish(b2, 90)
    res["frontiers"] = {i: frontier_check(os.path.join(base, crawl, "beta"), i) for i in (2, 3)}
    return res


def standby_drill(nats, sim, base, seeds) -> dict:
    crawl, seconds = "standby", 75
    a = start(nats, sim, base, crawl, "alpha", "0-1", seeds, seconds)
    b = start(nats, sim, base, crawl, "beta", "2-3", seeds, seconds)
    res: dict = {"before": wait_running(os.path.join(base, crawl, "beta"), 40)}
    frozen = tree(b.pid)
    res["t_stop"] = time.time()
    signal_all(frozen, signal.SIGSTOP)
    g = start(nats, sim, base, crawl, "gamma", "2-3", None, seconds, "-s", "cluster.standby_wait_s=60")
    res["gamma_running"] = wait_running(os.path.join(base, crawl, "gamma"), 60)
    res["t_takeover"] = time.time()
    res["owners"] = cluster_status_of(nats, crawl)
    time.sleep(2.0)             # gamma fetching for a while before beta wakes up
    res["t_cont"] = time.time()
    signal_all(frozen, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = status(os.path.join(base, crawl, "beta"))
        if st and st.get("cluster", {}).get("standby") == [2, 3]:
            res["beta_standby"] = st["cluster"]["standby"]
            break
        time.sleep(0.5)
    res["t_end_watch"] = time.time()
    for name, p in (("alpha", a), ("gamma", g)):
        res[name] = finish(p, seconds + 60)
    b.send_signal(signal.SIGTERM)
    res["beta"] = finish(b, 90)
    return res


def cluster_status_of(nats, crawl: str) -> dict:
    r = subprocess.run(crawlerd("cluster", "status", "--json", "--cluster", ",".join(nats.servers),
                                "-s", f"cluster.crawl={crawl}"), capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else {"stderr": r.stderr}


def main() -> int:
    out_path, base, hosts = sys.argv[1], sys.argv[2], int(sys.argv[3])
    nats = LocalNats(os.path.join(base, "nats"), nodes=3)
    nats.start()
    report: dict = {"shards": SHARDS}
    try:
        with SimWebProcess(hosts=hosts, seed=13, bind="0.0.0.0") as sim:
            seeds = os.path.join(base, "seeds.txt")
            with open(seeds, "w") as f:
                f.write("\n".join(sim.seeds) + "\n")
            report["restart"] = restart_drill(nats, sim, base, seeds)
            report["restart_ledger"] = [e.to_dict() for e in sim.ledger()]
            sim.reset_ledger()
            report["standby"] = standby_drill(nats, sim, base, seeds)
            report["standby_ledger"] = [e.to_dict() for e in sim.ledger()]
            report["site"] = sim.site()
    finally:
        nats.stop()
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
