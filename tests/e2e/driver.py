"""End-to-end crawl driver, run inside a private network namespace by tests/e2e/test_crawl.py.

Starts simweb bound to 0.0.0.0 (one 127.x.y.z per host), runs `crawlerd run` for a while as a
subprocess, asks `crawlerd status --json` during the crawl, runs a second crawl on the same data
dir, and writes everything the test judges (server ledgers, site, statuses, exit codes) as JSON.
"""

import json
import os
import subprocess
import sys
import time

from crawlerd.simweb import SimWebProcess


def crawlerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crawlerd", *args]


def kill_a_worker(data_dir: str) -> int | None:
    """SIGKILL one processing worker of the running daemon (the pool must replace it, losing nothing)."""
    import signal
    r = subprocess.run(crawlerd("stats", "--json", "--data-dir", data_dir), capture_output=True, text=True)
    if r.returncode != 0:
        return None
    pids = [int(k.split("-", 1)[1]) for k in json.loads(r.stdout)["cpu_by_process_s"] if k.startswith("worker-")]
    if not pids:
        return None
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


def run_crawl(sim, data_dir: str, seeds: str, seconds: float, extra: list[str], kill_worker: bool = False) -> dict:
    table = ", ".join(f'"{h}" = "{ip}"' for h, ip in sim.static_hosts.items())
    sets = ["-s", "crawl.user_agent=crawlerd-test/0.1 (+e2e; operator: test@localhost)",
            "-s", 'network.allow=["127.0.0.0/8"]', "-s", f"dns.static_hosts={{{table}}}",
            "-s", "fetch.shutdown_grace_s=2.0", *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(crawlerd("run", "--seeds", seeds, "--data-dir", data_dir, "--duration", str(seconds),
                                     *sets), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status = None
    deadline = t0 + seconds
    while status is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1.0)
        r = subprocess.run(crawlerd("status", "--json", "--data-dir", data_dir), capture_output=True, text=True)
        if r.returncode == 0:
            status = json.loads(r.stdout)
    killed = None
    if kill_worker and status is not None:
        time.sleep(min(3.0, max(0.0, deadline - time.monotonic() - 5)))
        killed = kill_a_worker(data_dir)
    try:
        out, err = proc.communicate(timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    with open(os.path.join(data_dir, "last-run.json")) as f:
        last = json.load(f)
    return {"rc": proc.returncode, "status_during": status, "stderr": err[-4000:], "last_run": last,
            "wall_s": time.monotonic() - t0, "killed_worker": killed}


def main() -> int:
    out_path, data_dir, hosts, seconds, seconds2 = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        float(sys.argv[4]), float(sys.argv[5])
    extra = sys.argv[6:]
    with SimWebProcess(hosts=hosts, seed=7, bind="0.0.0.0") as sim:
        seeds = os.path.join(os.path.dirname(data_dir), "seeds.txt")
        with open(seeds, "w") as f:
            f.write("\n".join(sim.seeds) + "\nnot a url\nftp://x.sim/\n")
        first = run_crawl(sim, data_dir, seeds, seconds, extra, kill_worker=True)
        ledger1 = [e.to_dict() for e in sim.ledger()]
        sim.reset_ledger()
        second = run_crawl(sim, data_dir, seeds, seconds2, extra)
        ledger2 = [e.to_dict() for e in sim.ledger()]
        report = {"port": sim.port, "site": sim.site(), "first": first, "second": second,
                  "ledger1": ledger1, "ledger2": ledger2}
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
