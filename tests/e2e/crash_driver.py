"""Crash-and-restart crawl driver, run inside a private network namespace by tests/e2e/test_crash_crawl.py.

Starts simweb bound to 0.0.0.0 (one 127.x.y.z per host), then runs `crawlerd run` on one data
dir several times, each run ended a different way (ARCHITECTURE.md invariant 3: `kill -9` at any moment loses at
most the work in flight; restart resumes):

1. ``orphans``: SIGKILL to the crawl process only, ``KILL_1_S`` after it answered `status`; its
   processing workers are orphaned and must exit by themselves (their socket closes).
2. ``all``: SIGKILL to the crawl process and its workers at the same moment, ``KILL_2_S`` in.
3. ``drain``: SIGTERM, then SIGKILL to all ``DRAIN_KILL_S`` later, in the middle of the ordered
   drain (in-flight fetches get ``fetch.shutdown_grace_s``). A drain with nothing slow in flight
   can end within the first delay; it is then run again with a shorter one (a clean stop in
   between harms nothing), and the run the kill caught is the one judged.
4. ``startup``: SIGKILL as soon as it holds the data-dir lock, while it recovers and opens.
5. the final run, stopped cleanly by ``--duration``.

Before each kill the driver records what it needs to judge the kill (server clock, worker PIDs,
requests in flight); after it, the data-dir state a restart has to cope with (stale control socket,
``.open`` WARC segments and event logs, whether the data-dir lock is free). Everything the test
judges is written as one JSON report; the WARC and event files stay in the data dir.
"""

from __future__ import annotations

import contextlib
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

KILL_1_S, KILL_2_S = 7.0, 9.0          # after `status` first answered
DRAIN_TERM_S = 7.0                      # SIGTERM after status answered
DRAIN_KILL_S = (0.1, 0.03, 0.0)         # SIGKILL after SIGTERM: sooner each time a drain ended first
READY_TIMEOUT_S = 30.0
ORPHAN_EXIT_TIMEOUT_S = 10.0
SAFETY_DURATION_S = 90.0        # a killed run would stop by itself after this long
GRACE_S = 2.0


def crawlerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crawlerd", *args]


def ask_json(verb: str, data_dir: str) -> dict | None:
    r = subprocess.run(crawlerd(verb, "--json", "--data-dir", data_dir), capture_output=True, text=True,
                       timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else None


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc, so it works while the control socket does not)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_if_there(pid: int) -> None:
    """SIGKILL ``pid``; one that ended meanwhile (it saw its parent die) is what was wanted."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def lock_is_free(data_dir: str) -> bool:
    fd = os.open(os.path.join(data_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)        # closing the fd releases the lock
    return True


def listing(data_dir: str, sub: str) -> list[str]:
    try:
        return sorted(os.listdir(os.path.join(data_dir, sub)))
    except OSError:
        return []


class Run:
    """One `crawlerd run` subprocess, its stderr kept in a file next to the data dir."""

    started: list[Run] = []

    def __init__(self, sim, data_dir: str, seeds: str, name: str, duration_s: float):
        table = ", ".join(f'"{h}" = "{ip}"' for h, ip in sim.static_hosts.items())
        sets = ["-s", "crawl.user_agent=crawlerd-test/0.1 (+e2e; operator: test@localhost)",
                "-s", 'network.allow=["127.0.0.0/8"]', "-s", f"dns.static_hosts={{{table}}}",
                "-s", f"fetch.shutdown_grace_s={GRACE_S}"]     # politeness as shipped: restarts must not stall
        self.data_dir = data_dir
        self.name = name
        self.err_path = os.path.join(os.path.dirname(data_dir), f"stderr-{name}.txt")
        self.err = open(self.err_path, "w")
        self.report: dict = {"name": name}
        # sd_notify as systemd would receive it: READY=1 marks when the daemon is up, measured
        # here at once (a `crawlerd status` poll is a whole Python start on a busy machine)
        notify = os.path.join(os.path.dirname(data_dir), f"notify-{name}.sock")
        with contextlib.suppress(FileNotFoundError):
            os.remove(notify)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(notify)
        threading.Thread(target=self._listen, daemon=True).start()
        self.t_launch = time.monotonic()
        self.proc = subprocess.Popen(crawlerd("run", "--seeds", seeds, "--data-dir", data_dir,
                                              "--duration", str(duration_s), *sets),
                                     stdout=subprocess.DEVNULL, stderr=self.err, text=True,
                                     env=dict(os.environ, NOTIFY_SOCKET=notify))
        self.report.update(t_launch=self.t_launch, pid=self.proc.pid)
        Run.started.append(self)

    def _listen(self) -> None:
        while True:
            try:
                data = self.notify.recv(4096)
            except OSError:
                return
            if b"READY=1" in data.split(b"\n") and "t_notify_ready" not in self.report:
                self.report["t_notify_ready"] = time.monotonic()

    def wait_ready(self) -> dict | None:
        """Poll `crawlerd status` until it answers; record when (None if the run died first)."""
        deadline = self.t_launch + READY_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            st = ask_json("status", self.data_dir)
            if st is not None:
                self.report["t_ready"] = time.monotonic()
                self.report["status_ready"] = st
                return st
            time.sleep(0.2)
        return None

    def wait_locked(self) -> bool:
        """Poll /proc until the process holds the data-dir lock open (start-up has begun)."""
        lock = os.path.realpath(os.path.join(self.data_dir, "lock"))
        deadline = self.t_launch + READY_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                fds = os.listdir(f"/proc/{self.proc.pid}/fd")
            except OSError:
                return False
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{self.proc.pid}/fd/{fd}") == lock:
                        self.report["t_locked"] = time.monotonic()
                        return True
                except OSError:
                    pass
            time.sleep(0.005)
        return False

    def sleep_until(self, t: float) -> None:
        while self.proc.poll() is None and time.monotonic() < t:
            time.sleep(min(0.2, max(0.0, t - time.monotonic())))

    def workers(self, ask: bool) -> list[int]:
        """Worker PIDs from /proc (and `crawlerd stats` if ``ask``), each checked to be our child."""
        pids = set(children(self.proc.pid))
        st = ask_json("stats", self.data_dir) if ask else None
        if st is not None:
            self.report["stats_before_kill"] = {k: st[k] for k in ("pages", "in_flight", "queued",
                                                                    "cpu_by_process_s", "worker_restarts")}
            pids |= {int(k.split("-", 1)[1]) for k in st["cpu_by_process_s"] if k.startswith("worker-")}
        mine = set(children(self.proc.pid))
        return sorted(p for p in pids if p in mine)

    def kill(self, *, workers_too: bool, ask: bool = True, known: list[int] = ()) -> None:
        """SIGKILL the crawl process (and its workers); wait for it; record the aftermath."""
        workers = sorted(set(self.workers(ask)) | {p for p in known if alive(p)})
        self.report["worker_pids"] = workers
        self.report["t_kill"] = time.monotonic()
        if self.proc.poll() is not None:        # ended before the kill (the test reports it)
            self.report["exited_before_kill"] = True
            workers = [p for p in workers if alive(p)]
        else:
            os.kill(self.proc.pid, signal.SIGKILL)
        if workers_too:
            for pid in workers:
                kill_if_there(pid)      # a worker may have seen its parent die and ended first
        self.report["rc"] = self.proc.wait(timeout=30)
        self.report["orphans_left"] = self.wait_orphans(workers)
        self.after_kill()

    def wait_orphans(self, workers: list[int]) -> list[int]:
        """Workers still running ORPHAN_EXIT_TIMEOUT_S after the parent died (then killed by us)."""
        deadline = time.monotonic() + ORPHAN_EXIT_TIMEOUT_S
        left = [p for p in workers if alive(p)]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [p for p in left if alive(p)]
        self.report["t_orphans_gone"] = time.monotonic()
        for pid in left:
            kill_if_there(pid)
        return left

    def wait_notify_ready(self, timeout_s: float = 60.0) -> float | None:
        """Wait for READY=1 (None if the run died or did not get there in time)."""
        deadline = time.monotonic() + timeout_s
        while "t_notify_ready" not in self.report and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.report.get("t_notify_ready")

    def after_kill(self) -> None:
        self.err.close()
        self.notify.close()
        d = self.data_dir
        self.report.update(
            socket_left=os.path.exists(os.path.join(d, "control.sock")),
            lock_free=lock_is_free(d),
            warc_after=listing(d, "warc"), events_after=listing(d, "events"),
            stderr=open(self.err_path).read()[-4000:])

    def finish(self, timeout_s: float) -> None:
        try:
            self.report["rc"] = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.report["rc"] = self.proc.wait()
            self.report["timed_out"] = True
        self.report["t_exit"] = time.monotonic()
        self.after_kill()
        with open(os.path.join(self.data_dir, "last-run.json")) as f:
            self.report["last_run"] = json.load(f)


def main() -> int:
    try:
        return drive(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    finally:
        for run in Run.started:       # a driver failure must not leave a daemon crawling
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait()


def drive(out_path: str, data_dir: str, hosts: int, final_s: float) -> int:
    runs = []
    with SimWebProcess(hosts=hosts, seed=11, bind="0.0.0.0") as sim:
        seeds = os.path.join(os.path.dirname(data_dir), "seeds.txt")
        with open(seeds, "w") as f:
            f.write("\n".join(sim.seeds) + "\n")

        r = Run(sim, data_dir, seeds, "orphans", SAFETY_DURATION_S)
        if r.wait_ready():
            r.sleep_until(r.report["t_ready"] + KILL_1_S)
        r.kill(workers_too=False)
        runs.append(r.report)

        r = Run(sim, data_dir, seeds, "all", SAFETY_DURATION_S)
        if r.wait_ready():
            r.sleep_until(r.report["t_ready"] + KILL_2_S)
        r.kill(workers_too=True)
        runs.append(r.report)

        # A drain that ends before its kill (nothing slow in flight at SIGTERM) is run again with
        # a kill sooner after SIGTERM; only the run the kill caught is judged as "drain".
        finished_first = []
        for attempt, kill_s in enumerate(DRAIN_KILL_S):
            r = Run(sim, data_dir, seeds, f"drain-{attempt}", SAFETY_DURATION_S)
            workers: list[int] = []
            if r.wait_ready():
                r.sleep_until(r.report["t_ready"] + DRAIN_TERM_S)
                workers = r.workers(True)
                r.report["t_term"] = time.monotonic()
                r.proc.send_signal(signal.SIGTERM)
                r.sleep_until(r.report["t_term"] + kill_s)
            r.kill(workers_too=True, ask=False, known=workers)
            r.report.update(name="drain", drain_kill_s=kill_s)
            # the drain ended first: the daemon exited, or it was tearing down after the shard's drain
            # (it logged its stop, or it had closed its control socket, which follows the drain)
            ended = (r.report.get("exited_before_kill") or "stopped pages=" in r.report["stderr"]
                     or not r.report.get("socket_left", True))
            if not ended or attempt == len(DRAIN_KILL_S) - 1:
                break
            finished_first.append(r.report)
        r.report["drains_finished_before_kill"] = finished_first
        runs.append(r.report)

        r = Run(sim, data_dir, seeds, "startup", SAFETY_DURATION_S)
        r.wait_locked()
        r.kill(workers_too=True, ask=False)
        runs.append(r.report)

        r = Run(sim, data_dir, seeds, "final", final_s)
        r.wait_ready()
        r.finish(final_s + 60)
        runs.append(r.report)

        report = {"port": sim.port, "site": sim.site(), "runs": runs,
                  "ledger": [e.to_dict() for e in sim.ledger()]}
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
