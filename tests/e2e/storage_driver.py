"""Storage-fault crawl driver, run by tests/e2e/test_storage_faults.py inside private network *and*
mount namespaces (`unshare -m -n`): the data dir lives on a small tmpfs this namespace mounts.

1. ``full``: crawl; fill the tmpfs until less than ``storage.min_free_bytes`` is left; the
   daemon must say ``paused (disk full: ...)`` and stop fetching; delete the filler: it must
   resume by itself; SIGTERM.
2. ``start-full``: fill the tmpfs to the last byte; `crawlerd run` must refuse with one line.
3. ``readonly``: the warc dir bind-mounted read-only; start; the first archive fails: ``paused
   (read-only: .../warc)``; remove the read-only mount: it must resume and archive; SIGTERM.

Everything the test judges goes into one JSON report (status samples, stderr, exit codes,
ledger); the WARC files stay in the data dir.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from crawlerd.simweb import SimWebProcess

TMPFS_BYTES = 48 << 20
MIN_FREE = 8 << 20
PROBE_S = 1.0
WAIT_S = 30.0


def crawlerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crawlerd", *args]


def status(data_dir: str) -> dict | None:
    r = subprocess.run(crawlerd("status", "--json", "--data-dir", data_dir), capture_output=True, text=True,
                       timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else None


def wait_for(data_dir: str, pred, timeout_s: float = WAIT_S) -> tuple[dict | None, float]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        st = status(data_dir)
        if st is not None and pred(st):
            return st, time.monotonic() - t0
        time.sleep(0.2)
    return status(data_dir), -1.0


def fill(path: str, leave_bytes: int) -> None:
    """Write ``path`` until the file system has at most ``leave_bytes`` free (0: until ENOSPC)."""
    chunk = b"\0" * (1 << 20)
    with open(path, "ab") as f:
        while True:
            st = os.statvfs(os.path.dirname(path))
            free = st.f_bavail * st.f_frsize
            if free <= leave_bytes:
                return
            try:
                f.write(chunk[:max(4096, min(len(chunk), free - leave_bytes))])
                f.flush()
            except OSError:
                return


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


class Daemon:
    def __init__(self, sim, data_dir: str, seeds: str, name: str, base: str):
        table = ", ".join(f'"{h}" = "{ip}"' for h, ip in sim.static_hosts.items())
        self.name = name
        self.err_path = os.path.join(base, f"stderr-{name}.txt")
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen(
            crawlerd("run", "--seeds", seeds, "--data-dir", data_dir, "--duration", "120",
                     "-s", "crawl.user_agent=crawlerd-test/0.1 (+e2e storage; operator: test@localhost)",
                     "-s", 'network.allow=["127.0.0.0/8"]', "-s", f"dns.static_hosts={{{table}}}",
                     "-s", f"storage.min_free_bytes={MIN_FREE}", "-s", f"storage.probe_interval_s={PROBE_S}",
                     "-s", "fetch.shutdown_grace_s=2.0", "-s", "process.workers=1"),
            stdout=subprocess.DEVNULL, stderr=self.err)

    def stop(self) -> dict:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.err.close()
        return {"rc": rc, "stderr": open(self.err_path).read()[-6000:]}


def main() -> int:
    out, base = sys.argv[1], sys.argv[2]
    disk = os.path.join(base, "disk")
    os.makedirs(disk, exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", disk)
    data_dir = os.path.join(disk, "data")
    filler = os.path.join(disk, "filler")
    report: dict = {"data_dir": data_dir}
    with SimWebProcess(hosts=30, seed=5, bind="0.0.0.0") as sim:
        seeds = os.path.join(base, "seeds.txt")
        with open(seeds, "w") as f:
            f.write("\n".join(sim.seeds) + "\n")

        # 1. the disk fills up while crawling, then space comes back
        d = Daemon(sim, data_dir, seeds, "full", base)
        st, _ = wait_for(data_dir, lambda s: s["pages"] >= 20)
        report["full_before"] = st
        t_fill = time.monotonic()
        fill(filler, MIN_FREE // 2)
        report["fill_done_wall"] = time.time()
        paused, t_paused = wait_for(data_dir, lambda s: s["state"].startswith("paused (disk full"))
        report["full_paused"], report["full_pause_s"] = paused, t_paused
        time.sleep(4.0)
        report["full_paused_later"] = status(data_dir)
        report["fill_to_pause_s"] = time.monotonic() - t_fill
        os.remove(filler)
        resumed, t_resumed = wait_for(data_dir, lambda s: s["state"] == "running"
                                      and s["pages"] > report["full_paused_later"]["pages"] + 5)
        report["full_resumed"], report["full_resume_s"] = resumed, t_resumed
        report["full_run"] = d.stop()
        with open(os.path.join(data_dir, "last-run.json")) as f:
            report["full_last_run"] = json.load(f)

        # 2. a start on a full disk is refused with one line
        fill(filler, 0)
        r = subprocess.run(crawlerd("run", "--seeds", seeds, "--data-dir", data_dir, "--duration", "5",
                                    "-s", "crawl.user_agent=crawlerd-test/0.1 (operator: test@localhost)",
                                    "-s", f"storage.min_free_bytes={MIN_FREE}"),
                           capture_output=True, text=True, timeout=120)
        report["start_full"] = {"rc": r.returncode, "stderr": r.stderr[-4000:]}
        os.remove(filler)

        # 3. a read-only warc dir: paused at the first archive, resumed once it is writable
        warc = os.path.join(data_dir, "warc")
        sh("mount", "--bind", warc, warc)
        sh("mount", "-o", "remount,bind,ro", warc)
        d = Daemon(sim, data_dir, seeds, "readonly", base)
        paused, t_paused = wait_for(data_dir, lambda s: s["state"].startswith("paused (read-only"))
        report["ro_paused"], report["ro_pause_s"] = paused, t_paused
        time.sleep(3.0)
        report["ro_paused_later"] = status(data_dir)
        sh("umount", warc)
        resumed, t_resumed = wait_for(data_dir, lambda s: s["state"] == "running"
                                      and s["pages"] > (report["ro_paused_later"] or {}).get("pages", 0) + 5)
        report["ro_resumed"], report["ro_resume_s"] = resumed, t_resumed
        time.sleep(3.0)
        report["ro_run"] = d.stop()
        with open(os.path.join(data_dir, "last-run.json")) as f:
            report["ro_last_run"] = json.load(f)
        report["port"] = sim.port
        report["ledger"] = [e.to_dict() for e in sim.ledger()]
    report["warc_files"] = sorted(os.listdir(os.path.join(data_dir, "warc")))
    # the data stays for the test: copy it off the tmpfs that dies with this namespace
    keep = os.path.join(base, "data")
    subprocess.run(["cp", "-a", data_dir, keep], check=True)
    report["data_dir"] = keep
    with open(out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
