"""Two-shard crawl driver, run inside a private network namespace by tests/e2e/test_shards_crawl.py.

Starts simweb (one 127.x.y.z per host; some hosts share one), runs ``crawlerd run -s
crawl.shards=2`` as a subprocess, asks ``status --json`` (and ``--shard 1``) while it crawls,
sends SIGHUP, kills one shard process with SIGKILL mid-crawl and waits for the family to restart
it, lets the crawl end by ``--duration``, and writes what the test judges as JSON: the server's
ledger, the site, statuses before and after the kill, the stderr, each shard's frontier checked
after the run. Then a crash-loop drill: a second data dir whose shard 1 cannot start (another
process holds its ownership lock) must stop the daemon with a clear error.
"""

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from crawlerd.simweb import SimWebProcess

IP_DELAY_S = 0.3


def owner_of(url: str) -> int:
    from crawlerd.url.hosts import shard_of_url
    return shard_of_url(url, 2)


def crawlerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crawlerd", *args]


def status(data_dir: str, *extra: str) -> dict | None:
    r = subprocess.run(crawlerd("status", "--json", "--data-dir", data_dir, *extra), capture_output=True,
                       text=True, timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else None


def sets(sim) -> list[str]:
    table = ", ".join(f'"{h}" = "{ip}"' for h, ip in sim.static_hosts.items())
    return ["-s", "crawl.user_agent=crawlerd-test/0.1 (+e2e; operator: test@localhost)",
            "-s", 'network.allow=["127.0.0.0/8"]', "-s", f"dns.static_hosts={{{table}}}",
            "-s", "fetch.shutdown_grace_s=2.0", "-s", "crawl.shards=2", "-s", f"politeness.ip_delay_s={IP_DELAY_S}",
            # a killed shard's hosts wait out the longest gap before their next request: keep it short
            "-s", "politeness.max_delay_s=5.0", "-s", "robots.crawl_delay_cap_s=5.0"]


class Notifications:
    """sd_notify datagrams as systemd would receive them, with the time each arrived."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.got: list[tuple[float, str]] = []
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                return
            self.got.append((time.monotonic(), data.decode(errors="replace")))


def frontier_check(data_dir: str, index: int) -> dict:
    from crawlerd.frontier import Frontier
    fr = Frontier(os.path.join(data_dir, "shards", str(index), "frontier"), deferred_level=True)   # as the Shard opens it
    try:
        fr.check_invariants(deep=True)
        return {"ok": True, "stats": fr.stats()}
    except AssertionError as e:
        return {"ok": False, "error": str(e)}
    finally:
        fr.close()


def crash_loop(base: str, sim) -> dict:
    """Shard 1 of this data dir is held by another process: the family must give up, not loop."""
    data_dir = os.path.join(base, "loop")
    os.makedirs(os.path.join(data_dir, "shards", "1"))
    fd = os.open(os.path.join(data_dir, "shards", "1", "lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    t0 = time.monotonic()
    try:
        r = subprocess.run(crawlerd("run", "--data-dir", data_dir, "--duration", "120", *sets(sim)),
                           capture_output=True, text=True, timeout=180)
    finally:
        os.close(fd)
    return {"rc": r.returncode, "stderr": r.stderr[-4000:], "wall_s": time.monotonic() - t0}


def main() -> int:
    out_path, data_dir, hosts, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    base = os.path.dirname(data_dir)
    with SimWebProcess(hosts=hosts, seed=7, bind="0.0.0.0") as sim:
        seeds = os.path.join(base, "seeds.txt")
        with open(seeds, "w") as f:
            f.write("\n".join(sim.seeds) + "\n")
        notes = Notifications(os.path.join(base, "notify.sock"))
        t0 = time.monotonic()
        env = dict(os.environ, NOTIFY_SOCKET=notes.path, WATCHDOG_USEC="3000000")    # a ping every second
        env.pop("WATCHDOG_PID", None)
        proc = subprocess.Popen(crawlerd("run", "--seeds", seeds, "--data-dir", data_dir, "--duration", str(seconds),
                                         *sets(sim)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        before = one = None
        while time.monotonic() - t0 < seconds / 2:
            time.sleep(1.0)
            st = status(data_dir)
            if st and len(st.get("shards", [])) == 2 and all(s["state"] == "running" and s["pages"] > 5
                                                             for s in st["shards"]):
                before = st
                break
        one = status(data_dir, "--shard", "1")
        # a URL of each shard: the family asks the URL's owner
        why_urls = [next(u for u in sim.seeds if owner_of(u) == i) for i in range(2)]
        why = subprocess.run(crawlerd("url", "why", "--json", "--data-dir", data_dir, *why_urls), capture_output=True,
                             text=True, timeout=30)
        added = subprocess.run(crawlerd("seed", "add", "--data-dir", data_dir, *sim.seeds[:2]), capture_output=True,
                               text=True, timeout=30)
        prom = subprocess.run(crawlerd("stats", "--prometheus", "--data-dir", data_dir), capture_output=True,
                              text=True, timeout=30)
        os.kill(proc.pid, signal.SIGHUP)
        time.sleep(2.0)             # every shard re-reads its config before one of them is killed
        victim = before["shards"][1]["pid"] if before else None
        t_kill_wall = time.time()
        t_kill = time.monotonic()
        if victim:
            os.kill(victim, signal.SIGKILL)
        after = None
        while time.monotonic() - t_kill < 40:
            time.sleep(0.5)
            st = status(data_dir)
            if st and st["shards"][1]["restarts"] >= 1 and st["shards"][1]["state"] == "running":
                after = st
                break
        t_restarted = time.monotonic()
        try:
            _out, err = proc.communicate(timeout=seconds + 90)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
        with open(os.path.join(data_dir, "last-run.json")) as f:
            last = json.load(f)
        report = {"port": sim.port, "site": sim.site(), "ledger": [e.to_dict() for e in sim.ledger()],
                  "rc": proc.returncode, "stderr": err[-20000:], "before": before, "after": after, "one": one,
                  "victim": victim, "t_kill": t_kill, "t_kill_wall": t_kill_wall, "t_restarted": t_restarted,
                  "last_run": last, "frontiers": [frontier_check(data_dir, i) for i in range(2)],
                  "spool": {i: sorted(os.listdir(os.path.join(data_dir, "handoff", str(i))))
                            for i in range(2) if os.path.isdir(os.path.join(data_dir, "handoff", str(i)))},
                  "ip_delay_s": IP_DELAY_S, "notify": notes.got,
                  "why": {"rc": why.returncode, "out": why.stdout, "err": why.stderr[-2000:], "urls": why_urls},
                  "seed_add": {"rc": added.returncode, "out": added.stdout, "err": added.stderr[-2000:]},
                  "prometheus": {"rc": prom.returncode, "text": prom.stdout, "stderr": prom.stderr[-2000:]}}
        report["crash_loop"] = crash_loop(base, sim)
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
