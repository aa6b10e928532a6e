"""What bench/e2e_bench.py watches in a running crawl: a process family's CPU and memory from /proc,
crawlerd's ``status`` over its control socket (in flight, loop stalls), and py-spy recordings."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

SAMPLE_INTERVAL_S = 0.5
STATUS_INTERVAL_S = 1.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- /proc -------------------------------------------------------------------------------------

def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of one live process, seconds (proc(5) stat fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields_ = data[data.rindex(b")") + 2:].split()
    return (int(fields_[11]) + int(fields_[12])) / CLK_TCK


def proc_threads(pid: int) -> dict[int, tuple[float, int]]:
    """Each live thread of ``pid``: tid -> (utime + stime seconds, bytes it passed to write calls:
    ``wchar`` of /proc/<pid>/task/<tid>/io; -1 if unreadable)."""
    out: dict[int, tuple[float, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for name in tids:
        base = f"/proc/{pid}/task/{name}"
        try:
            with open(base + "/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields_ = data[data.rindex(b")") + 2:].split()
        wchar = -1
        try:
            with open(base + "/io", "rb") as f:
                for line in f:
                    if line.startswith(b"wchar:"):
                        wchar = int(line.split()[1])
        except OSError:
            pass
        out[int(name)] = ((int(fields_[11]) + int(fields_[12])) / CLK_TCK, wchar)
    return out


def proc_ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[1])


def proc_status_kib(pid: int, key: str) -> int | None:
    """A ``kB`` line of /proc/<pid>/status (VmRSS, VmHWM), KiB."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def process_family(root: int) -> list[int]:
    """``root`` and all its live descendants (one pass over /proc; no children file needed)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            pp = proc_ppid(int(name))
            if pp is not None:
                parent[int(name)] = pp
    family, frontier = [root], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        family += kids
        frontier += kids
    return family


class FamilySampler(threading.Thread):
    """Samples a process family's memory every ``interval_s`` until stopped.

    State: ``peak_rss_kib`` is the largest sum of VmRSS over the family seen in one sample;
    ``hwm_kib[pid]`` the last VmHWM (the kernel's own peak, monotonic) seen per process;
    ``cpu_s[pid]`` the last utime+stime seen per process (a process's CPU just before it exits);
    ``threads`` the root's threads at each sample (``proc_threads``), for ``threads_between``.
    """

    def __init__(self, root: int, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.interval_s = interval_s
        self.peak_rss_kib = 0
        self.hwm_kib: dict[int, int] = {}
        self.cpu_s: dict[int, float] = {}
        self.samples = 0
        self.series: list[tuple[float, dict[int, float]]] = []    # (monotonic t, pid -> CPU s)
        self.extra_pids: list[int] = []                           # sampled too (simweb), not in RSS
        self.threads: list[tuple[float, dict[int, tuple[float, int]]]] = []   # (t, the root's proc_threads)
        self._stop_evt = threading.Event()

    def sample(self) -> None:
        total = 0
        t = time.monotonic()
        cpus: dict[int, float] = {}
        for pid in self.extra_pids:
            cpu = proc_cpu_s(pid)
            if cpu is not None:
                cpus[pid] = cpu
        for pid in process_family(self.root):
            rss = proc_status_kib(pid, "VmRSS")
            hwm = proc_status_kib(pid, "VmHWM")
            cpu = proc_cpu_s(pid)
            if rss is None or hwm is None or cpu is None:
                continue
            total += rss
            self.hwm_kib[pid] = max(self.hwm_kib.get(pid, 0), hwm)
            self.cpu_s[pid] = cpu
            cpus[pid] = cpu
        self.peak_rss_kib = max(self.peak_rss_kib, total)
        self.series.append((t, cpus))
        self.threads.append((t, proc_threads(self.root)))
        self.samples += 1

    def cpu_between(self, t0: float, t1: float) -> tuple[float, dict[int, float]]:
        """(seconds actually covered, pid -> CPU seconds used) between the samples nearest t0 and t1."""
        inside = [(t, c) for t, c in self.series if t0 - self.interval_s <= t <= t1 + self.interval_s]
        if len(inside) < 2:
            return 0.0, {}
        (ta, a), (tb, b) = inside[0], inside[-1]
        return tb - ta, {pid: b[pid] - a.get(pid, 0.0) for pid in b if pid in a}

    def threads_between(self, t0: float, t1: float) -> tuple[float, dict[int, tuple[float, int]]]:
        """(seconds covered, tid -> (CPU seconds, bytes written)) of the root's threads between the
        samples nearest t0 and t1 (threads alive at both)."""
        inside = [(t, c) for t, c in self.threads if t0 - self.interval_s <= t <= t1 + self.interval_s]
        if len(inside) < 2:
            return 0.0, {}
        (ta, a), (tb, b) = inside[0], inside[-1]
        return tb - ta, {tid: (b[tid][0] - a[tid][0], b[tid][1] - a[tid][1]) for tid in b if tid in a}

    def run(self) -> None:
        while not self._stop_evt.is_set():
            self.sample()
            self._stop_evt.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join()


class StatusPoller(threading.Thread):
    """Asks crawlerd's control socket for ``status`` every ``interval_s``: (t, in_flight, pages,
    loop stall histogram) per answer; a daemon that does not answer yet is simply skipped."""

    def __init__(self, socket_path: str, interval_s: float = STATUS_INTERVAL_S) -> None:
        super().__init__(daemon=True)
        self.socket_path = socket_path
        self.interval_s = interval_s
        self.series: list[dict] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        from crawlerd import control
        while not self._stop_evt.wait(self.interval_s):
            try:
                st = control.request(self.socket_path, "status", timeout_s=5.0)
            except (control.ControlError, OSError):
                continue
            if st.get("ok"):
                shards = st.get("shards") or [{}]
                ll = shards[0].get("loop_lag") or {}      # the crawl loop's lag histogram (LoopLag)
                self.series.append({"t": time.monotonic(), "in_flight": st.get("in_flight", 0),
                                    "pages": st.get("pages", 0), "queued": st.get("queued", 0),
                                    "stall_hist": ll.get("cumulative"), "stall_count": ll.get("count", 0),
                                    "own_hist": ll.get("own_cumulative"), "stall_split": ll.get("stalls"),
                                    "gc": ll.get("gc"), "stall_buckets": ll.get("buckets_s"),
                                    "stall_max_ms": round(ll["max_s"] * 1000, 1) if "max_s" in ll else None,
                                    "stall_sites": ll.get("stall_sites")})

    def stop(self) -> None:
        self._stop_evt.set()
        self.join()

    def steady(self, t0: float, t1: float) -> dict:
        """In-flight transfers (min/median/max) and the loop stall p99/p99.9 between t0 and t1."""
        from crawlerd.metrics import LAG_BUCKETS_S, lag_quantile_s
        inside = [s for s in self.series if t0 <= s["t"] <= t1]
        out: dict = {"status_samples": len(inside)}
        if inside:
            fl = [s["in_flight"] for s in inside]
            out["in_flight"] = {"min": min(fl), "median": statistics.median(fl), "max": max(fl)}
            out["in_flight_series"] = [(round(s["t"] - inside[0]["t"], 1), s["in_flight"]) for s in inside]
        hists = [s for s in inside if s["stall_hist"]]
        if len(hists) >= 2:
            a, b = hists[0], hists[-1]
            n = b["stall_count"] - a["stall_count"]
            # the daemon's own bounds: a base built from another version may have other buckets
            buckets = b.get("stall_buckets") or list(LAG_BUCKETS_S)
            out["stall_buckets_ms"] = [round(x * 1000, 1) for x in buckets]
            minutes = (b["t"] - a["t"]) / 60
            # "stall": the timer's lateness (wall clock); "own stall": the same less the time the loop
            # thread waited, runnable, for a CPU (LoopLag.own_counts; the process's own doing)
            for hist, prefix in (("stall_hist", "stall"), ("own_hist", "own_stall")):
                if not (a.get(hist) and b.get(hist)):
                    continue
                cum = [y - x for x, y in zip(a[hist], b[hist], strict=True)]
                for q, key in ((0.99, "p99_ms"), (0.999, "p999_ms")):
                    v = lag_quantile_s(cum, n, q, buckets)
                    out[f"{prefix}_{key}"] = None if v is None else v * 1000
                for bound in (0.02, 0.05, 0.1):         # samples later than bound, per minute
                    above = n - cum[buckets.index(bound)]
                    out[f"{prefix}_over_{bound * 1000:g}ms_per_min"] = round(above / minutes, 2) if minutes else None
            out["stall_samples"] = n
            if a.get("stall_split") and b.get("stall_split"):   # where the time of samples > 20 ms went
                out["stall_split"] = {k: round(b["stall_split"][k] - a["stall_split"][k], 3)
                                      for k in ("count", "lag_s", "cpu_s", "runq_s", "gc_s")}
            if a.get("gc") and b.get("gc"):
                out["gc"] = {g: {"collections": b["gc"][g]["collections"] - a["gc"][g]["collections"],
                                 "total_ms": round(1000 * (b["gc"][g]["total_s"] - a["gc"][g]["total_s"]), 1),
                                 "max_ms_whole_run": round(1000 * b["gc"][g]["max_s"], 1),
                                 # passes over 20 ms (a daemon from before this count: None)
                                 "over_20ms": (b["gc"][g]["over_stall"] - a["gc"][g]["over_stall"]
                                               if "over_stall" in b["gc"][g] else None)} for g in b["gc"]}
        if self.series:
            out["stall_max_ms_whole_run"] = self.series[-1]["stall_max_ms"]
            out["stall_sites"] = (self.series[-1].get("stall_sites") or [])[:24]    # where stalls over the watch threshold (20 ms) were
        return out


class PySpy:
    """py-spy records (native frames, 25 Hz; each sample briefly stops the process) of pids for ``seconds``
    (started after warm-up); no-op when py-spy is missing."""

    def __init__(self, out_dir: str | None) -> None:
        self.out_dir = out_dir
        self.procs: list[subprocess.Popen] = []
        self.exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")

    def start(self, pids: dict[str, int], seconds: float, tag: str) -> None:
        if not self.out_dir or not os.path.exists(self.exe):
            return
        os.makedirs(self.out_dir, exist_ok=True)
        for label, pid in pids.items():
            out = os.path.join(self.out_dir, f"{tag}-{label}.txt")     # collapsed stacks (bench/pyspy_top.py)
            self.procs.append(subprocess.Popen(
                [self.exe, "record", "--native", "--rate", "25", "--format", "raw",
                 "--duration", str(int(seconds)), "--pid", str(pid), "--output", out],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def wait(self) -> None:
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
